"""vLLM's Marlin GEMMs (V4 / V4.1's quantised linears and experts on 8.x) timed as SM80 code.

On capability 8.x vLLM's own selectors send every quantised GEMM of DeepSeek-V4 / V4.1 to
Marlin (no patch of ours).

Built from the applied tree for compute_80 and registered as vLLM's ops
(``tests/vllm_marlin_check.py``: ``install_ops``), run through vLLM's own Python: the FP8-block
and MXFP8 linear kernel classes (``process_weights_after_loading``, ``apply_weights``) and
``fused_marlin_moe`` with V4's swiglu clamp over ``prepare_*_layer_for_marlin`` experts. The
host code is told the A100's limits (108 SMs, 163 KB) and, as a second row, this GPU's own.

What each row is judged against, measured in the same run:
- the device-to-device copy bandwidth: decode-sized calls stream the quantised weights, so
  ``floor_us`` (the bytes the call must move at that bandwidth) and ``pct_copy`` say how close
  to the memory floor a call runs;
- linears: torch's bf16 matmul on the same weights dequantised to bf16 (twice the weight bytes;
  on this GPU cuBLAS runs its own SM90 kernels, so it is context, not an SM80 baseline).

Bytes: the prepared weight and scale tensors the kernel reads (for the experts: those of the
experts the call's routing touches), plus activations in and out. FLOPs: 2 x rows x N x K per
GEMM. Times: CUDA-graph replay, median per call, input sets (weights and routing) rotated past
twice the L2. Each shape is checked against a dequantised fp32 reference first (rel. error
<= 1e-2).

    python bench/marlin_vllm.py [--quick] [--no-doc]   (needs the GPU bundle's vLLM tree and deps)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import _paths  # noqa: E402

_paths.add_tests()
HERE = Path(__file__).resolve().parent

import common  # noqa: E402
import vllm_c_marlin  # noqa: E402
import vllm_cpu_harness as harness  # noqa: E402

SWIGLU_LIMIT = 10.0
#: where inputs and routings are made (a CPU test of the script's flow sets "cpu")
DEVICE = "cuda"
#: (name, format, N, K): V4-Flash sizes at TP 1. 1536 x 4096: the Q low-rank projection;
#: 4096 x 4096: the shared expert's gate+up (2 x 2048) from the hidden size; 32768 x 1536: Q's
#: up-projection for 64 heads of 512; the MXFP8 row is V4.1's form of the same 4096 x 4096.
LINEARS = [("q_a fp8-block", "block", 1536, 4096), ("shared w13 fp8-block", "block", 4096, 4096),
           ("q_b fp8-block", "block", 32768, 1536), ("shared w13 mxfp8", "mx", 4096, 4096)]
TOKENS = (1, 16, 64, 256, 2048)
#: (name, weights, experts, top-k, hidden K, intermediate N): V4-Flash's routed experts.
EXPERTS = [("routed mxfp4", "mxfp4", 256, 6, 4096, 2048),
           ("routed fp8-block", "fp8", 256, 6, 4096, 2048)]
MOE_TOKENS = (1, 16, 128, 1024, 4096)
QUICK = {"linears": LINEARS[:1], "tokens": (1, 64), "experts": EXPERTS[:1],
         "moe_tokens": (1, 128)}


def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def random_e4m3(g, shape):
    """Random e4m3 codes (uint8) without the NaN codes, on ``g``'s device."""
    c = torch.randint(0, 256, shape, dtype=torch.uint8, device=g.device, generator=g)
    return torch.where((c & 0x7F) == 0x7F, c ^ 1, c)


def pow2(exps):
    return torch.pow(2.0, exps.float() - 127)


def loaded_linear(g, fmt, n, k):
    """A linear's weight as loaded, on ``g``'s device: (e4m3 codes [N, K] as uint8, scale
    exponent bytes (``fmt`` "block": UE8M0 per 128 x 128 block; "mx": e8m0 per 32 along K),
    the weight they mean in fp32)."""
    codes = random_e4m3(g, (n, k))
    w = codes.view(torch.float8_e4m3fn).float()
    if fmt == "block":
        exps = torch.randint(115, 124, (-(-n // 128), k // 128), dtype=torch.uint8,
                             device=g.device, generator=g)
        w *= pow2(exps).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    else:
        exps = torch.randint(115, 124, (n, k // 32), dtype=torch.uint8, device=g.device,
                             generator=g)
        w *= pow2(exps).repeat_interleave(32, 1)
    return codes, exps, w


def linear_set(cases, g, fmt, n, k):
    """One weight set: (Marlin apply, its prepared-tensor bytes, bf16 dequantised weight)."""
    codes, exps, w = loaded_linear(g, fmt, n, k)
    if fmt == "block":
        apply = cases._prepared(torch, lambda: cases.block_linear(
            torch, codes.clone(), exps.view(torch.float8_e8m0fnu).clone(), n, k))
    else:
        apply = cases._prepared(
            torch, lambda: cases.mx_linear(torch, codes.clone(), exps.clone(), n, k))
    weight_bytes = nbytes(*apply.layer.parameters())
    return apply, weight_bytes, w.to(torch.bfloat16)


def rel_err(y, ref) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def loaded_experts(g, weights, e, k, n):
    """Experts as loaded, uint8 on ``g``'s device. "mxfp4": (w13 [E, 2N, K/2], w2 [E, K, N/2]
    e2m1 pairs, low nibble first; e8m0 bytes per 32 along K [E, 2N, K/32], [E, K, N/32]).
    "fp8": (e4m3 codes [E, 2N, K], [E, K, N]; UE8M0 bytes per 128 x 128 block)."""
    def u8(lo, hi, shape):
        return torch.randint(lo, hi, shape, dtype=torch.uint8, device=g.device, generator=g)

    if weights == "mxfp4":
        return (u8(0, 256, (e, 2 * n, k // 2)), u8(0, 256, (e, k, n // 2)),
                u8(118, 122, (e, 2 * n, k // 32)), u8(118, 122, (e, k, n // 32)))
    return (random_e4m3(g, (e, 2 * n, k)), random_e4m3(g, (e, k, n)),
            u8(116, 120, (e, -(-2 * n // 128), k // 128)),
            u8(116, 120, (e, -(-k // 128), n // 128)))


def expert_set(cases, g, weights, e, k, n):
    """Loaded experts (uint8 on the GPU), the prepared tensors, per-expert prepared bytes."""
    loaded = loaded_experts(g, weights, e, k, n)
    prepare = cases.prepare_mxfp4_experts if weights == "mxfp4" else cases.prepare_fp8_experts
    prepared = cases._prepared(torch, lambda: prepare(torch, *(t.clone() for t in loaded)))
    return loaded, tuple(prepared), nbytes(*prepared) // e


def dequant_expert(cases, weights, loaded, ex, k, n):
    """Expert ``ex``'s w13 [2N, K] and w2 [K, N] in fp32, from the loaded bytes."""
    if weights == "mxfp4":
        w13, w2, s13, s2 = loaded
        return (cases.e2m1_to_float(w13[ex], k).float() * pow2(s13[ex]).repeat_interleave(32, -1),
                cases.e2m1_to_float(w2[ex], n).float() * pow2(s2[ex]).repeat_interleave(32, -1))
    c13, c2, x13, x2 = loaded

    def one(codes, exps, rows):
        s = pow2(exps).repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)
        return codes.view(torch.float8_e4m3fn).float() * s
    return one(c13[ex], x13[ex], 2 * n), one(c2[ex], x2[ex], k)


def moe_reference(cases, weights, loaded, x, topk_w, topk_ids, k, n):
    """fp32 reference of V4's routed experts (SiLU with the swiglu clamp, weighted sum over
    the top-k) from the loaded bytes, per token and expert."""
    out = torch.zeros(x.shape[0], k, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            w13, w2 = dequant_expert(cases, weights, loaded, int(topk_ids[t, j]), k, n)
            h = x[t].float() @ w13.T
            gate, up = h[:n].clamp(max=SWIGLU_LIMIT), h[n:].clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
            out[t] += topk_w[t, j] * ((gate * torch.sigmoid(gate) * up) @ w2.T)
    return out


def routing(g, m, e, top_k):
    ids = torch.rand((m, e), device=DEVICE, generator=g).topk(top_k, -1).indices
    w = torch.softmax(torch.randn((m, top_k), device=DEVICE, generator=g), -1)
    return ids.to(torch.int32), w.float()


def row(report, what, shape, m, impl, t, moved, flops, **extra) -> None:
    # one line per row as it is measured: a run stopped by the device's time limit still
    # leaves its timings in the log (the JSON and table are written only at the end)
    print(f"row: {what} | {shape} | {m} tokens | {impl} | {t.median_us:.2f} us "
          f"({t.p25_us:.2f}-{t.p75_us:.2f}) | {moved} B | {flops} FLOP", flush=True)
    report.add(what=what, **{"N x K": shape}, tokens=m, impl=impl, median_us=t.median_us,
               iqr_us=f"{t.p25_us:.1f}-{t.p75_us:.1f}", tflops=flops / t.median_us / 1e6,
               bytes=moved, flops=flops, timing=t.as_dict(), **extra)


def set_limits(libs, limits) -> None:
    for lib in libs:
        lib.set_limits(limits)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    common.require_cuda()
    missing = harness.missing_dependencies()
    if missing:
        raise SystemExit(f"vLLM's Python dependencies missing here: {', '.join(missing)}")
    # the tree is imported in this process: the GPU bundle's vLLM deps (.site-vllm) go on its path
    harness.add_deps_paths()
    from upstream_import import find_tree

    import vllm_builder_check as checks
    import vllm_marlin_check as cases

    tree = find_tree(version=harness.VLLM_VERSION)
    libs = cases.install_ops(tree, vllm_c_marlin.A100_LIMITS)
    checks.boot(tree, HERE.parent / "overlay", "8.0", (), device=DEVICE)
    props = torch.cuda.get_device_properties(0)
    own = (props.multi_processor_count,
           int(getattr(props, "shared_memory_per_block_optin", 0) or 227 * 1024))
    limit_sets = [("A100 limits (108 SMs, 163 KB)", vllm_c_marlin.A100_LIMITS),
                  (f"this GPU's ({own[0]} SMs, {own[1] // 1024} KB)", own)]
    linears = QUICK["linears"] if args.quick else LINEARS
    tokens = QUICK["tokens"] if args.quick else TOKENS
    experts = QUICK["experts"] if args.quick else EXPERTS
    moe_tokens = QUICK["moe_tokens"] if args.quick else MOE_TOKENS

    report = common.Report(
        name="marlin_vllm",
        title="vLLM's Marlin GEMMs as SM80 code (V4 / V4.1 quantised linears and experts)",
        columns=["what", "N x K", "tokens", "impl", "median_us", "iqr_us", "floor_us",
                 "pct_copy", "tflops", "vs_bf16"])
    seed = common.fresh_seed()
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    report.meta["seed"] = seed
    report.meta["tree"] = str(tree.name)
    report.notes += [
        "vLLM's Marlin kernels built from the applied tree for compute_80 (run as SM80 code), "
        "through vLLM's own linear kernel classes and fused_marlin_moe (SiLU, swiglu clamp 10); "
        "'marlin @ A100 limits': the host code told 108 SMs and 163 KB, 'marlin @ this GPU': "
        "its own SM count and shared memory",
        "bytes = the prepared weight + scale tensors read (experts: those the call's routing "
        "touches) + activations in and out (experts: also each bf16 intermediate written and "
        "read once); floor_us = bytes at the copy bandwidth of this run; "
        "pct_copy = bytes / time / copy bandwidth; tflops = 2 x rows x N x K per GEMM / time",
        "'bf16 matmul (cuBLAS)': torch.nn.functional.linear on the same weights dequantised to "
        "bf16 (2x the weight bytes); on this GPU cuBLAS runs SM90 kernels: context, not an "
        "SM80 baseline. vs_bf16 = its time / this row's time",
        "CUDA-graph replay, median per call over 20 calls per replay; weight sets (linears) and "
        "routings (experts) rotated past 2x L2; fresh random codes and scales each run "
        f"(seed {seed}); V4-Flash sizes at TP 1, experts 256 with top-6"]
    report.meta["copy_start"] = common.copy_bandwidth()
    print(f"copy_start: {report.meta['copy_start']['gbps_read_plus_write']:.0f} GB/s", flush=True)

    for what, fmt, n, k in linears:
        w_one = n * k
        sets = common.rotation_count(w_one)
        built = [linear_set(cases, g, fmt, n, k) for _ in range(sets)]
        apply0, weight_bytes, w0 = built[0]
        x = torch.randn((16, k), device=DEVICE, generator=g).to(torch.bfloat16)
        ref = x.float() @ w0.float().T
        for label, limits in limit_sets:
            set_limits(libs, limits)
            err = rel_err(apply0(x), ref)
            report.check(f"{what} {n}x{k} @ {label}: Marlin vs dequantised fp32 reference at "
                         "16 tokens", err <= 1e-2, f"rel err {err:.2e}")
        set_limits(libs, vllm_c_marlin.A100_LIMITS)
        for m in tokens:
            xs = [torch.randn((m, k), device=DEVICE, generator=g).to(torch.bfloat16)
                  for _ in range(sets)]
            moved = weight_bytes + 2 * m * (k + n)
            flops = 2 * m * n * k
            bf16 = common.graph_time(
                [(lambda x=x, w=b[2]: torch.nn.functional.linear(x, w)) for x, b in zip(xs, built)],
                min_calls=common.CALLS_PER_REPLAY)
            for label, limits in limit_sets:
                set_limits(libs, limits)
                t = common.graph_time([(lambda x=x, f=b[0]: f(x)) for x, b in zip(xs, built)],
                                      min_calls=common.CALLS_PER_REPLAY)
                row(report, what, f"{n} x {k}", m, f"marlin @ {label}", t, moved, flops,
                    vs_bf16=bf16.median_us / t.median_us)
            row(report, what, f"{n} x {k}", m, "bf16 matmul (cuBLAS, SM90 code)", bf16,
                2 * w_one + 2 * m * (k + n), flops, vs_bf16=1.0)
            set_limits(libs, vllm_c_marlin.A100_LIMITS)
        del built, xs
        torch.cuda.empty_cache()

    for what, weights, e, top_k, k, n in experts:
        loaded, prepared, per_expert = expert_set(cases, g, weights, e, k, n)
        apply = cases.marlin_experts(prepared, weights)
        x = torch.randn((3, k), device=DEVICE, generator=g).to(torch.bfloat16)
        ids, w = routing(g, 3, e, top_k)
        ref = moe_reference(cases, weights, loaded, x, w, ids, k, n)
        for label, limits in limit_sets:
            set_limits(libs, limits)
            err = rel_err(apply(x, w, ids), ref)
            report.check(f"{what} E{e} top{top_k} {k}/{n} @ {label}: fused_marlin_moe vs "
                         "dequantised fp32 reference at 3 tokens", err <= 1e-2,
                         f"rel err {err:.2e}")
        set_limits(libs, vllm_c_marlin.A100_LIMITS)
        del loaded
        for m in moe_tokens:
            sets = 8 if m <= 16 else 4 if m <= 128 else 2
            inputs = [(torch.randn((m, k), device=DEVICE, generator=g).to(torch.bfloat16),
                       *routing(g, m, e, top_k)) for _ in range(sets)]
            touched = sum(int(torch.unique(r[1]).numel()) for r in inputs) / sets
            # x in and y out; each intermediate written once and read once (GEMM1's 2N-wide
            # output, the activation's N-wide one, GEMM2's per-expert K-wide rows before
            # the sum over top-k), bf16
            moved = touched * per_expert + 2 * (2 * m * k + m * top_k * (4 * n + 2 * n + 2 * k))
            flops = 2 * m * top_k * (2 * n * k + k * n)
            for label, limits in limit_sets:
                set_limits(libs, limits)
                t = common.graph_time([(lambda a=a, f=apply: f(a[0], a[2], a[1])) for a in inputs],
                                      min_calls=common.CALLS_PER_REPLAY)
                row(report, what, f"E{e} top{top_k}: {2 * n} x {k}, {k} x {n}", m,
                    f"marlin @ {label}", t, moved, flops, experts_touched=touched)
            set_limits(libs, vllm_c_marlin.A100_LIMITS)
            del inputs
        prepared = apply = None
        torch.cuda.empty_cache()
    report.meta["copy_end"] = common.copy_bandwidth()
    report.meta["copy"] = max((report.meta["copy_start"], report.meta["copy_end"]),
                              key=lambda c: c["gbps_read_plus_write"])
    copy = report.meta["copy"]["gbps_read_plus_write"]
    for r in report.rows:  # against the higher of the two copy measurements
        r["floor_us"] = r["bytes"] / (copy * 1e3)
        r["pct_copy"] = 100 * common.gbps(r["bytes"], r["median_us"]) / copy
    return report.finish(not args.no_doc)


if __name__ == "__main__":
    sys.exit(main())
