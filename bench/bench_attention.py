"""GPU benchmark: SM80 sparse MLA attention (decode over the FP8 cache, prefill over the
bf16 workspace), ours vs baselines, in one process on the same inputs.

Decode (upstream ``_forward_decode`` shapes): R requests x rows (1, or 6 for MTP/DSpark
verification), every query row attends to 128 window entries (SWA cache, 64-entry pages)
and 512 compressed entries (C4 cache, 64-entry pages, stride 37440), heads 8 / 64. The
rows of one request share their compressed selection and their windows overlap. Bytes
counted: every distinct selected record once (584 B), Q read, output written (bf16).
Baseline: a straightforward torch implementation (gather + exact dequant + fp32 einsum,
``reference.attention`` with ``compute_dtype=float32``). Upstream's ROCm Triton decode
(``rocm_aiter_mla_sparse.py``) is not run: its import chain needs vLLM's config /
forward-context / platform stack.

Prefill (upstream ``flash_mla_sparse_fwd`` shapes): chunks of 4096 query tokens, each with
640 keys (512 compressed + 128 window rows of a gathered bf16 workspace of 4 requests),
heads 8 / 64. FLOPs: 4 x 512 x keys per token-head. Baselines: upstream's portable Triton
kernel ``vllm/v1/attention/ops/xpu_mla_sparse.py`` (``block_dpe=0``; it has no sink, so
it is timed only) loaded from ``$DEEPINFER_XPU_MLA`` or the applied tree, and torch gather
+ einsum in bf16.

Times: CUDA-graph replay medians (bench/common.py), input sets rotated past 2x L2.
Usage: python bench/bench_attention.py [--quick] [--no-doc] [--sm-count N] [--smem-cap B]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402

BLOCK = 64
STRIDE = 37440
REC = 584
WINDOW, TOPK = 128, 512
SCALE = 512**-0.5


def load_ours():
    lib = os.environ.get("DEEPINFER_SM80_LIB")
    if lib:
        torch.ops.load_library(lib)
    from deepinfer_sm80.ops import attention as ops
    from deepinfer_sm80.reference import attention as ref

    return ops, ref


def load_xpu_triton():
    """Upstream's portable Triton sparse-MLA prefill, imported with a minimal
    ``vllm.triton_utils`` (it needs only triton, tl, LOG2E, LOGE2 from it)."""
    import upstream_import

    cands = [os.environ.get("DEEPINFER_XPU_MLA"),
             *(str(t / "vllm/v1/attention/ops/xpu_mla_sparse.py")
               for t in upstream_import.candidate_trees())]
    path = next((c for c in cands if c and Path(c).is_file()), None)
    if path is None:
        return None, "xpu_mla_sparse.py not found (set DEEPINFER_XPU_MLA)"
    import triton
    import triton.language as tl

    shim = types.ModuleType("vllm.triton_utils")
    shim.triton, shim.tl = triton, tl
    shim.LOG2E, shim.LOGE2 = 1.4426950408889634, 0.6931471805599453
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    sys.modules["vllm.triton_utils"] = shim
    spec = importlib.util.spec_from_file_location("xpu_mla_sparse_upstream", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # record where it came from without this machine's absolute path
    shown = Path(path).resolve()
    for root in (REPO, REPO.parent):
        if shown.is_relative_to(root):
            shown = shown.relative_to(root)
            break
    return mod.triton_bf16_mla_sparse_interface, str(shown)


# ---------------------------------------------------------------------------- decode
def make_decode_set(ref, reqs: int, rows: int, heads: int, gen_seed: int) -> dict[str, Any]:
    torch.manual_seed(gen_seed)
    dev = "cuda"
    t = reqs * rows
    ctx_pages = 64  # compressed context per request: 64 pages = 4096 entries (16K tokens)
    swa_pages = 4
    comp_storage = torch.empty(reqs * ctx_pages * STRIDE, dtype=torch.uint8, device=dev)
    comp = torch.as_strided(comp_storage, (reqs * ctx_pages, BLOCK, REC), (STRIDE, REC, 1))
    swa_storage = torch.empty(reqs * swa_pages * STRIDE, dtype=torch.uint8, device=dev)
    swa = torch.as_strided(swa_storage, (reqs * swa_pages, BLOCK, REC), (STRIDE, REC, 1))
    comp_pt = torch.randperm(reqs * ctx_pages, device=dev).view(reqs, ctx_pages)
    swa_pt = torch.randperm(reqs * swa_pages, device=dev).view(reqs, swa_pages)
    sel = torch.rand(reqs, ctx_pages * BLOCK, device=dev).topk(TOPK, dim=1).indices
    comp_sel = comp_pt.gather(1, sel // BLOCK) * BLOCK + sel % BLOCK  # [reqs, 512]
    comp_idx = comp_sel.repeat_interleave(rows, 0).int().contiguous()
    pos0 = torch.randint(WINDOW + rows, swa_pages * BLOCK - rows, (reqs,), device=dev)
    pos = pos0.repeat_interleave(rows) + torch.arange(rows, device=dev).repeat(reqs)
    w = pos[:, None] - WINDOW + 1 + torch.arange(WINDOW, device=dev)[None, :]
    req = torch.arange(reqs, device=dev).repeat_interleave(rows)
    swa_idx = (swa_pt[req[:, None], w // BLOCK] * BLOCK + w % BLOCK).int().contiguous()
    for cache, idx in ((comp, comp_idx), (swa, swa_idx)):
        slots = torch.unique(idx.long())
        kv = torch.randn(slots.numel(), 512, device=dev)
        ref.pack_fp8_ds_mla(kv, slots, cache)
    q = torch.randn(t, 1, heads, 512, device=dev).to(torch.bfloat16)
    distinct = torch.unique(comp_idx.long()).numel() + torch.unique(swa_idx.long()).numel()
    return {
        "q": q, "swa": swa, "swa_idx": swa_idx.view(t, 1, WINDOW),
        "swa_lens": torch.full((t,), WINDOW, dtype=torch.int32, device=dev),
        "comp": comp, "comp_idx": comp_idx.view(t, 1, TOPK),
        "comp_lens": torch.full((t,), TOPK, dtype=torch.int32, device=dev),
        "sink": torch.randn(heads, device=dev),
        "out": torch.empty_like(q), "lse": torch.empty(t, heads, 1, device=dev),
        "bytes": distinct * REC + 2 * q.numel() * 2,
    }


def bench_decode(report, ops, ref, quick: bool, sm_count: int, smem_cap: int) -> None:
    cases = [(1, 1), (8, 1), (32, 1), (128, 1), (1, 6), (8, 6), (32, 6), (128, 6)]
    if quick:
        cases = [(1, 1), (128, 1), (32, 6)]
    for heads in (8, 64):
        for reqs, rows in cases:
            probe = make_decode_set(ref, reqs, rows, heads, common.fresh_seed())
            n_sets = common.rotation_count(probe["bytes"])
            sets = [probe] + [make_decode_set(ref, reqs, rows, heads, common.fresh_seed())
                              for _ in range(n_sets - 1)]

            def call(s):
                return lambda: ops.sparse_mla_decode(
                    s["q"], s["swa"], s["swa_idx"], s["swa_lens"], s["comp"], s["comp_idx"],
                    s["comp_lens"], s["sink"], SCALE, s["out"], s["lse"],
                    num_sms=sm_count, smem_cap=smem_cap)

            # correctness on the timed inputs first (poisoned output)
            s0 = sets[0]
            s0["out"].fill_(float("nan"))
            call(s0)()
            r32, _ = ref.sparse_mla_decode_ref(
                s0["q"], s0["swa"], s0["swa_idx"], s0["swa_lens"], s0["comp"], s0["comp_idx"],
                s0["comp_lens"], s0["sink"], SCALE, compute_dtype=torch.float32)
            err = ((s0["out"].double() - r32.double()).norm() / r32.double().norm()).item()
            ok = not torch.isnan(s0["out"]).any().item() and err < 5e-3
            report.check(f"decode R={reqs} rows={rows} h={heads}: vs fp32 torch", ok, f"rel err {err:.2e}")
            t_ours = common.graph_time([call(s) for s in sets])
            plan = ops.sparse_mla_plan(reqs * rows, heads, WINDOW + TOPK, True, sm_count, smem_cap)
            torch_t = None
            try:
                torch_t = common.graph_time([lambda s=s: ref.sparse_mla_decode_ref(
                    s["q"], s["swa"], s["swa_idx"], s["swa_lens"], s["comp"], s["comp_idx"],
                    s["comp_lens"], s["sink"], SCALE, compute_dtype=torch.float32)
                    for s in sets[:2]], replays=5).median_us
            except Exception as e:  # noqa: BLE001
                report.notes.append(f"torch decode baseline failed R={reqs} h={heads}: {type(e).__name__}")
            gbps = common.gbps(s0["bytes"], t_ours.median_us)
            report.add(kind="decode", heads=heads, requests=reqs, rows=rows,
                       config=f"{plan['heads_per_block']}h x {plan['keys_per_tile']}k, {plan['splits']} split",
                       ours_us=t_ours.median_us, spread_us=t_ours.p75_us - t_ours.p25_us,
                       gbps=gbps, pct_copy=100 * gbps / report.meta["copy"]["gbps_read_plus_write"],
                       torch_us=torch_t, speedup_torch=(torch_t / t_ours.median_us) if torch_t else None)
            del sets, probe
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- prefill
def make_prefill_set(t: int, heads: int, reqs: int = 4, ctx: int = 16384) -> dict[str, Any]:
    dev = "cuda"
    n_comp = ctx // 4
    per_req_q = t // reqs
    rows_per_req = n_comp + WINDOW + per_req_q
    s_kv = reqs * rows_per_req
    kv = torch.randn(s_kv, 1, 512, device=dev).to(torch.bfloat16)
    q = torch.randn(t, heads, 512, device=dev).to(torch.bfloat16)
    req = torch.arange(t, device=dev) // per_req_q
    qpos = torch.arange(t, device=dev) % per_req_q
    sel = torch.rand(t, n_comp, device=dev).topk(TOPK, dim=1).indices
    comp = req[:, None] * rows_per_req + sel
    win = req[:, None] * rows_per_req + n_comp + qpos[:, None] + torch.arange(WINDOW, device=dev)[None, :]
    idx = torch.cat([comp, win], 1).int().view(t, 1, TOPK + WINDOW).contiguous()
    return {"q": q, "kv": kv, "idx": idx, "lens": torch.full((t,), TOPK + WINDOW, dtype=torch.int32, device=dev),
            "sink": torch.randn(heads, device=dev), "out": torch.empty_like(q)}


def prefill_check_tokens(t: int, dev: str = "cuda") -> torch.Tensor:
    """Tokens whose output the benchmarks check against fp32 torch: the first 128 and the
    last 128 (the last partial wave's tokens run as split blocks, plan::prefill_tail)."""
    n = min(128, t)
    return torch.unique(torch.cat([torch.arange(n), torch.arange(t - n, t)])).to(dev)


def bench_prefill(report, ops, ref, quick: bool, sm_count: int, smem_cap: int, xpu) -> None:
    t = 4096
    keys = TOPK + WINDOW
    for heads in (64, 8):
        sets = [make_prefill_set(t, heads) for _ in range(2)]
        s0 = sets[0]
        s0["out"].fill_(float("nan"))
        ops.flash_mla_sparse_fwd(s0["q"], s0["kv"], s0["idx"], SCALE, attn_sink=s0["sink"],
                                 topk_length=s0["lens"], out=s0["out"], smem_cap=smem_cap,
                                 num_sms=sm_count)
        sub = prefill_check_tokens(t)
        r32, _, _ = ref.sparse_mla_prefill_ref(s0["q"][sub], s0["kv"], s0["idx"][sub], s0["lens"][sub],
                                               s0["sink"], SCALE, torch.float32)
        err = ((s0["out"][sub].double() - r32.double()).norm() / r32.double().norm()).item()
        ok = not torch.isnan(s0["out"]).any().item() and err < 5e-3
        report.check(f"prefill T={t} h={heads}: vs fp32 torch (first and last 128 tokens)", ok,
                     f"rel err {err:.2e}")
        flops = 4.0 * 512 * keys * heads * t
        ours = common.graph_time([lambda s=s: ops.flash_mla_sparse_fwd(
            s["q"], s["kv"], s["idx"], SCALE, attn_sink=s["sink"], topk_length=s["lens"],
            out=s["out"], smem_cap=smem_cap, num_sms=sm_count) for s in sets],
            replays=10 if quick else 20)
        xpu_us = None
        if xpu is not None:
            try:
                xpu_us = common.graph_time([lambda s=s: xpu(s["q"], s["kv"], s["idx"], SCALE, 512, 0)
                                            for s in sets], replays=5 if quick else 10).median_us
            except Exception as e:  # noqa: BLE001
                report.notes.append(f"xpu Triton baseline failed at h={heads}: {type(e).__name__}: {e}")
        torch_us = None
        try:
            def torch_impl(s):
                kvr = s["kv"].view(-1, 512)[s["idx"].view(t, -1).long()]  # [T, K, 512]
                sc = torch.einsum("thd,tkd->thk", s["q"], kvr).float() * SCALE
                pr = torch.softmax(sc, -1).to(torch.bfloat16)
                return torch.einsum("thk,tkd->thd", pr, kvr)
            torch_us = common.graph_time([lambda s=s: torch_impl(s) for s in sets[:1]], replays=5).median_us
        except Exception as e:  # noqa: BLE001
            report.notes.append(f"torch prefill baseline failed at h={heads}: {type(e).__name__}: {e}")
        plan = ops.sparse_mla_plan(t, heads, keys, False, sm_count, smem_cap)
        tf = flops / (ours.median_us * 1e-6) / 1e12
        tail = (f", last {plan['split_tokens']} tokens x {plan['splits']} splits"
                if plan["split_tokens"] else "")
        report.add(kind="prefill", heads=heads, requests=4, rows=t,
                   config=f"{plan['heads_per_block']}h x {plan['keys_per_tile']}k{tail}",
                   ours_us=ours.median_us, spread_us=ours.p75_us - ours.p25_us, tflops=tf,
                   xpu_triton_us=xpu_us, xpu_tflops=(flops / (xpu_us * 1e-6) / 1e12) if xpu_us else None,
                   torch_us=torch_us, speedup_best_portable=(min(x for x in (xpu_us, torch_us) if x) / ours.median_us)
                   if (xpu_us or torch_us) else None)
        del sets
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--sm-count", type=int, default=0, help="SM count for the split choice (0 = device)")
    ap.add_argument("--smem-cap", type=int, default=0, help="shared-memory cap per block (0 = device)")
    ap.add_argument("--only", choices=["decode", "prefill"], default=None)
    ap.add_argument("--section", default="attention",
                    help="docs/benchmarks.md section / results file prefix (attention_sm86 for "
                         "the 99 KB-cap run)")
    args = ap.parse_args()
    common.require_cuda()
    ops, ref = load_ours()
    xpu, xpu_src = load_xpu_triton()
    title = "Sparse MLA attention (decode FP8 cache, prefill bf16 workspace)"
    if args.smem_cap or args.sm_count:
        title += (f", shared-memory cap {args.smem_cap or 'device'} B, grid for "
                  f"{args.sm_count or 'the device'} SMs")
    report = common.Report(
        name=args.section, title=title,
        columns=["kind", "heads", "requests", "rows", "config", "ours_us", "spread_us", "gbps",
                 "pct_copy", "tflops", "xpu_triton_us", "xpu_tflops", "torch_us",
                 "speedup_torch", "speedup_best_portable"])
    report.meta["copy"] = common.copy_bandwidth()
    report.meta["smem_cap"] = args.smem_cap
    report.notes.append(f"xpu Triton baseline: {xpu_src if xpu else 'not run: ' + xpu_src}")
    report.notes.append("ROCm Triton decode (rocm_aiter_mla_sparse.py): not run (needs vLLM's "
                        "config/forward-context/platform import chain)")
    report.notes.append("decode bytes: distinct selected records x 584 B + Q read + output written; "
                        "prefill FLOPs: 4 x 512 x keys per token-head")
    if args.only in (None, "decode"):
        bench_decode(report, ops, ref, args.quick, args.sm_count, args.smem_cap)
    if args.only in (None, "prefill"):
        bench_prefill(report, ops, ref, args.quick, args.sm_count, args.smem_cap, xpu)
    report.print_table()
    path = report.write_json()
    print(f"results: {path}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], path.name).write_text(path.read_text())
    if not args.no_doc:
        report.write_markdown()


if __name__ == "__main__":
    main()
