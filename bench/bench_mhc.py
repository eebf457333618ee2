"""vLLM's TileLang mHC kernels (every DeepSeek-V4 / V4.1 decoder layer) timed as SM80 code.

mHC (manifold-constrained hyper-connections) keeps 4 residual streams per token. Between
sublayers vLLM runs one fused post + pre kernel: the post block mixes the streams with the
previous sublayer's output, the pre block of the next sublayer projects the new streams
(RMS-normalised, 24 mixes), runs 20 Sinkhorn iterations on the 4 x 4 combination and
collapses the streams into the sublayer's (RMS-normed) input. A decoder layer runs it twice;
the model's entry runs a pre block and its end a post block and ``hc_head``. One Ampere port
measured mHC at 62 ms of a 534 ms time to first token at 8K context on an A100
(field notes); no mHC kernel had been timed as SM80 code here.

Rows per kernel, hidden size and token count, all measured in the same run:
- ``tilelang``: vLLM's wrapper with the platform at capability 8.0, 108 SMs for its split-k
  grids and TileLang generating SM80 code (bench/mhc_sm80.py; ``TILELANG_DEFAULT_TARGET``
  with ``"arch": "sm_80"``, set by scripts/device/mhc_bench.sh);
- ``torch``: the same math as fp32 torch operations (what a port without TileLang runs; it
  is also the check: every output of the kernel within bf16 tolerances of it);
- ``floor_us``: the bytes the kernel must move (streams in and out, activations, the
  projection weights) at the device-to-device copy bandwidth measured in the run, and
  ``pct_copy`` = floor / time.
Times: CUDA-graph replay, median per call, input sets rotated past twice the L2.

    python bench/bench_mhc.py [--quick] [--no-doc]   (tilelang, the vLLM tree, a CUDA GPU)
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import torch

import _paths  # noqa: E402,F401

import common  # noqa: E402

HC, EPS, POST_ALPHA, SINKHORN = 4, 1e-6, 2.0, 20
#: (model, hidden size, kernels): the streams are 4 x hidden bf16 per token. V4.1 runs the
#: delayed form between sublayers (its pre-mix carried from the previous one).
HIDDEN = [("V4-Flash", 4096, ("pre", "post", "fused_post_pre", "hc_head")),
          ("V4.1-Flash", 5120, ("fused_post_pre_delayed",)),
          ("V4-Pro", 7168, ("fused_post_pre",))]
#: decode batches (1-64 tokens; up to 32 the fused kernel) and prefill chunks
TOKENS = (1, 8, 64, 1024, 8192)
QUICK = {"hidden": [("V4-Flash", 4096, ("fused_post_pre",))], "tokens": (8, 1024)}
#: where inputs are made (a CPU test of the script's flow sets "cpu")
DEVICE = "cuda"
BF16_TOL = dict(atol=1.6e-2, rtol=1e-2)
# (up to 32 tokens the fused kernel projects the new streams before rounding them to bf16,
# the torch form after: ~2e-4 apart, tests/gpu/test_mhc_tilelang_sm80.py)
MIX_TOL = dict(atol=1e-3, rtol=1e-2)


def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def make_set(kernel: str, T: int, H: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """One input set: streams [T, 4, H] bf16, a sublayer output [T, H] bf16, the incoming
    post / combination mixes (and V4.1's carried pre-mix), the pre block's projection
    (fn [24, 4H] fp32 (hc_head: [4, 4H]), scale, base) and the RMSNorm weight."""
    def dev(t):
        return t.to(DEVICE)

    m = HC if kernel == "hc_head" else HC * (2 + HC)
    s = {"res": dev(torch.randn(T, HC, H, generator=g).to(torch.bfloat16)),
         "fn": dev(torch.randn(m, HC * H, generator=g) * 2e-3),
         "scale": dev(torch.rand(1 if kernel == "hc_head" else 3, generator=g) * 0.5 + 0.5),
         "base": dev(torch.randn(m, generator=g) * 0.1),
         "norm_w": dev((torch.rand(H, generator=g) + 0.5).to(torch.bfloat16))}
    if kernel.startswith("fused") or kernel == "post":
        s["x"] = dev(torch.randn(T, H, generator=g).to(torch.bfloat16))
        s["post_in"] = dev(torch.rand(T, HC, 1, generator=g) * POST_ALPHA)
        s["comb_in"] = dev(torch.softmax(torch.randn(T, HC, HC, generator=g), -1))
    if kernel == "fused_post_pre_delayed":
        s["pre_in"] = dev(torch.sigmoid(torch.randn(T, HC, generator=g)) + EPS)
    return s


#: the inputs each kernel reads
READS = {"pre": ("res", "fn", "scale", "base", "norm_w"),
         "post": ("x", "res", "post_in", "comb_in"),
         "hc_head": ("res", "fn", "scale", "base"),
         "fused_post_pre": ("x", "res", "post_in", "comb_in", "fn", "scale", "base", "norm_w"),
         "fused_post_pre_delayed": ("x", "res", "post_in", "comb_in", "pre_in", "fn", "scale",
                                    "base", "norm_w")}


def bytes_moved(kernel: str, s: dict[str, torch.Tensor]) -> int:
    """What the kernel must read and write at least: the inputs it takes, the streams it
    writes (post blocks), the sublayer input (pre blocks: [T, H] bf16) and the mixes."""
    T, _, H = s["res"].shape
    ins = nbytes(*(s[k] for k in READS[kernel]))
    mixes = T * HC * (1 + HC) * 4  # post [T, 4, 1] and comb [T, 4, 4] fp32
    out = {"pre": T * H * 2 + mixes, "post": T * HC * H * 2, "hc_head": T * H * 2,
           "fused_post_pre": T * HC * H * 2 + T * H * 2 + mixes,
           "fused_post_pre_delayed": T * HC * H * 2 + T * H * 2 + mixes + T * HC * 4}[kernel]
    return ins + out


# ------------------------------------------------------------------ the math in fp32 torch
def _mix(proj: torch.Tensor, fn, scale, base):
    """(pre [T, 4], post [T, 4], comb [T, 4, 4]) from the projection input [T, 4H]."""
    T = proj.shape[0]
    m = (proj @ fn.t()) * torch.rsqrt(proj.square().mean(-1, keepdim=True) + EPS)
    pre = torch.sigmoid(m[:, :HC] * scale[0] + base[:HC]) + EPS
    post = torch.sigmoid(m[:, HC:2 * HC] * scale[1] + base[HC:2 * HC]) * POST_ALPHA
    comb = torch.softmax(m[:, 2 * HC:].view(T, HC, HC) * scale[2]
                         + base[2 * HC:].view(HC, HC), -1) + EPS
    comb = comb / (comb.sum(-2, keepdim=True) + EPS)
    for _ in range(SINKHORN - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + EPS)
        comb = comb / (comb.sum(-2, keepdim=True) + EPS)
    return pre, post, comb


def _norm(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    vb = v.to(torch.bfloat16).float()
    return (vb * torch.rsqrt(vb.square().mean(-1, keepdim=True) + EPS) * w.float()).to(torch.bfloat16)


def _post(x, res, post_in, comb_in) -> torch.Tensor:
    mixed = torch.einsum("tij,tih->tjh", comb_in, res.float())
    return (mixed + post_in * x.float().unsqueeze(1)).to(torch.bfloat16)


def torch_call(kernel: str, s: dict[str, torch.Tensor]) -> Callable[[], tuple]:
    fn, scale, base, w = s["fn"], s["scale"], s["base"], s["norm_w"]

    def pre(res):
        T = res.shape[0]
        p, q, c = _mix(res.float().reshape(T, -1), fn, scale, base)
        return q.unsqueeze(-1), c, _norm((p.unsqueeze(-1) * res.float()).sum(1), w)

    def run():
        if kernel == "pre":
            return pre(s["res"])
        if kernel == "post":
            return (_post(s["x"], s["res"], s["post_in"], s["comb_in"]),)
        if kernel == "hc_head":
            res = s["res"]
            x = res.float().reshape(res.shape[0], -1)
            m = (x @ fn.t()) * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
            p = torch.sigmoid(m * scale + base) + EPS
            return ((p.unsqueeze(-1) * res.float()).sum(1).to(torch.bfloat16),)
        cur = _post(s["x"], s["res"], s["post_in"], s["comb_in"])
        if kernel == "fused_post_pre":
            return (cur,) + pre(cur)
        T = cur.shape[0]
        p, q, c = _mix(cur.float().reshape(T, -1), fn, scale, base)
        li = _norm((s["pre_in"].unsqueeze(-1) * cur.float()).sum(1), w)
        return cur, q.unsqueeze(-1), c, li, p
    return run


def tilelang_call(wrappers: Any, kernel: str, s: dict[str, torch.Tensor]) -> Callable[[], tuple]:
    """vLLM's wrapper for ``kernel`` on ``s``; outputs in torch_call's order."""
    args = (s["fn"], s["scale"], s["base"], EPS, EPS, EPS, POST_ALPHA, SINKHORN)

    def run():
        if kernel == "pre":
            return tuple(wrappers.mhc_pre_tilelang(s["res"], *args, norm_weight=s["norm_w"],
                                                   norm_eps=EPS))
        if kernel == "post":
            return (wrappers.mhc_post_tilelang(s["x"], s["res"], s["post_in"], s["comb_in"]),)
        if kernel == "hc_head":
            return (wrappers.hc_head_fused_kernel_tilelang(s["res"], s["fn"], s["scale"],
                                                            s["base"], EPS, EPS),)
        if kernel == "fused_post_pre":
            return tuple(wrappers.mhc_fused_post_pre_tilelang(
                s["x"], s["res"], s["post_in"], s["comb_in"], *args, norm_weight=s["norm_w"],
                norm_eps=EPS))
        out = wrappers.mhc_fused_post_pre_delayed_tilelang(
            s["x"], s["res"], s["post_in"], s["comb_in"], *args, pre_mix=s["pre_in"],
            norm_weight=s["norm_w"], norm_eps=EPS, capture_aux=False)
        return tuple(out[:5])
    return run


def agrees(got: tuple, want: tuple) -> tuple[bool, float, str]:
    """Every output within tolerance of the torch form (bf16 outputs: bf16 tolerances; fp32
    mixes: MIX_TOL), the tolerance picked from the dtypes as the kernels return them; the
    largest relative Frobenius error; and, for each output outside, its index, dtype and
    how many elements fall outside (empty when all agree)."""
    ok, worst, bad = len(got) == len(want), 0.0, []
    for i, (a, b) in enumerate(zip(got, want)):
        low = torch.bfloat16 in (a.dtype, b.dtype)
        tol = BF16_TOL if low else MIX_TOL
        a, b = a.float().reshape(b.shape), b.float()
        close = torch.isclose(a, b, **tol) & torch.isfinite(a)
        out = int((~close).sum())
        worst = max(worst, float((a - b).norm() / b.norm().clamp(min=1e-30)))
        if out:
            ok = False
            bad.append(f"output {i} ({'bf16' if low else 'fp32'}): {out} of {close.numel()} "
                       f"outside, max abs diff {float((a - b).abs().max()):.1e}")
    return ok, worst, "; ".join(bad)


def bench(report: common.Report, wrappers: Any, shapes: dict, copy_gbps: float,
          time_fn: Callable[..., Any] = common.graph_time) -> None:
    g = torch.Generator().manual_seed(common.fresh_seed())
    for model, H, kernels in shapes["hidden"]:
        for kernel in kernels:
            for T in shapes["tokens"]:
                first = make_set(kernel, T, H, g)
                per_set = bytes_moved(kernel, first)
                n = common.rotation_count(per_set, max_sets=8) if DEVICE == "cuda" else 1
                sets = [first] + [make_set(kernel, T, H, g) for _ in range(n - 1)]
                ok, err, why = agrees(tilelang_call(wrappers, kernel, first)(),
                                      torch_call(kernel, first)())
                shape = f"{model} H={H}, T={T}"
                report.check(f"{kernel} {shape}: TileLang within bf16 tolerances of fp32 torch "
                             f"(rel err {err:.1e}{'; ' + why if why else ''})", ok)
                floor = per_set / (copy_gbps * 1e3)  # us
                for impl, make in (("tilelang", lambda s: tilelang_call(wrappers, kernel, s)),
                                   ("torch", lambda s: torch_call(kernel, s))):
                    t = time_fn([make(s) for s in sets], min_calls=common.CALLS_PER_REPLAY)
                    report.add(kernel=kernel, shape=shape, impl=impl, median_us=t.median_us,
                               floor_us=floor, pct_copy=100.0 * floor / t.median_us,
                               mb=per_set / 1e6)
                    print(report.rows[-1], flush=True)
                sets = first = None
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    import mhc_sm80

    common.require_cuda()
    if not mhc_sm80.require_sm80_target():
        return 2
    report = common.Report(
        name="bench_mhc", title="vLLM's TileLang mHC kernels as SM80 code",
        columns=["kernel", "shape", "impl", "median_us", "floor_us", "pct_copy", "mb"])
    copy = common.copy_bandwidth()
    report.meta["copy"] = copy
    report.notes.append(
        f"SM80 code (TileLang arch sm_80, platform at 8.0, split-k grids for "
        f"{mhc_sm80.A100_SMS} SMs); torch = the same math in fp32 torch ops; floor = bytes at "
        f"the copy bandwidth {copy['gbps_read_plus_write']:.0f} GB/s; CUDA-graph replay, median "
        "per call, input sets rotated past 2x L2")
    with mhc_sm80.sm80_mhc() as (wrappers, kernels):
        bench(report, wrappers, QUICK if args.quick else
              {"hidden": HIDDEN, "tokens": TOKENS}, copy["gbps_read_plus_write"])
        targets = mhc_sm80.compiled_targets(kernels)
    report.check("every compiled TileLang kernel targets sm_80",
                 bool(targets) and all('"arch":"sm_80"' in t.replace(" ", "") for _, t in targets),
                 str(sorted({n for n, _ in targets})))
    return report.finish(not args.no_doc)


if __name__ == "__main__":
    sys.exit(main())
