"""The lightning indexer's paged decode scorer: the CUDA kernel (``deepinfer_sm80.ops.indexer``,
csrc/index/indexer_keys.cu) against the Triton scorer it replaces
(``deepinfer_sm80.ampere.indexer_triton.mqa_logits_tile``, paged key mode), same inputs, same
run; and the whole ``decode_topk`` (scoring + running top-k) with each scorer.

Inputs: a paged FP8 indexer cache (64-entry pages of 132-byte entries, random page order,
random codes without NaN, fp32 scales), 128-wide e4m3 queries, fp32 head weights, every
request's rows seeing its whole context (next_n rows per request share its pages). Fresh
random inputs every run; input sets rotated past twice the L2; CUDA-graph replay, median per
call. Bytes that must move: each request's K entries once (132 B), Q and weights, 8-byte keys
written per row and column. FLOPs: 2 x 128 x heads per row and column.

    python bench/bench_indexer_keys.py [--quick] [--sm-count 108]
"""
from __future__ import annotations

import argparse
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from deepinfer_sm80.ampere import indexer as I  # noqa: E402
from deepinfer_sm80.ampere.indexer_triton import mqa_logits_tile  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402

D, BS, TOPK = 128, 64, 512

# (requests, rows per request, context in compressed positions, heads)
SHAPES = [(1, 1, 8192, 64), (8, 1, 65536, 64), (64, 1, 8192, 64), (128, 1, 4096, 64),
          (128, 1, 4096, 32), (32, 6, 8192, 64), (32, 2, 8192, 64), (16, 6, 8192, 32)]
QUICK = [(64, 1, 8192, 64), (32, 6, 8192, 64)]


def make_set(B, NN, ctx, H, g):
    ppr = -(-ctx // BS)
    nb = B * ppr + 1
    pages = torch.randint(0, 256, (nb, BS * (D + 4)), dtype=torch.uint8, device="cuda", generator=g)
    codes = pages[:, : BS * D]
    codes[(codes & 0x7F) == 0x7F] = 0x38
    scales = torch.rand(nb, BS, device="cuda", generator=g) + 0.5
    pages[:, BS * D:] = scales.view(torch.uint8).view(nb, -1)
    bt = torch.randperm(nb, device="cuda", generator=g)[: B * ppr].view(B, ppr).int()
    q = torch.randint(0, 256, (B * NN, H, D), dtype=torch.uint8, device="cuda", generator=g)
    q[(q & 0x7F) == 0x7F] = 0xB8
    w = torch.randn(B * NN, H, device="cuda", generator=g) * 0.1
    rows = B * NN
    return dict(pages=pages, bt=bt, q=q, w=w, rows=rows, n_cols=ppr * BS,
                row_req=torch.arange(B, device="cuda", dtype=torch.int32).repeat_interleave(NN),
                lo=torch.zeros(rows, dtype=torch.int32, device="cuda"),
                hi=torch.full((rows,), ctx, dtype=torch.int32, device="cuda"),
                out=torch.empty(rows, ppr * BS, dtype=torch.int64, device="cuda"),
                idx=torch.empty(rows, TOPK, dtype=torch.int32, device="cuda"),
                tk=torch.empty(rows, TOPK, dtype=torch.int64, device="cuda"),
                lens=torch.full((B, NN), ctx, dtype=torch.int32, device="cuda"))


def scorer_call(fn, s, **kw):
    return lambda: fn(s["q"], s["w"], col0=0, n_cols=s["n_cols"], lo=s["lo"], hi=s["hi"],
                      out=s["out"], pages=s["pages"], block_table=s["bt"], row_req=s["row_req"],
                      block_size=BS, **kw)


def topk_call(s, B, NN, H, scorer):
    q4 = s["q"].view(B, NN, H, D)
    if scorer == "cuda warp":  # decode_topk with the warp-per-row scorer for every row count
        def run():
            orig = OI.indexer_paged_keys
            OI.indexer_paged_keys = lambda *a, rows_per_req=0, **kw: orig(*a, **kw)
            try:
                I.decode_topk(q4, s["w"], s["pages"], s["lens"], s["bt"], BS, TOPK, s["idx"],
                              scorer="cuda")
            finally:
                OI.indexer_paged_keys = orig
        return run
    return lambda: I.decode_topk(q4, s["w"], s["pages"], s["lens"], s["bt"], BS, TOPK, s["idx"],
                                 scorer=scorer)


def unfused_call(s, B, NN, H):
    """Baseline: ``decode_topk`` as it was composed at commit 49911c9 (until 2026-12-02 04:00
    UTC), the same scorer and row top-k kernels around them: lengths widened to int64 and
    back, the request of each row by ``repeat_interleave``, the last merge writing int64 keys,
    then ``keys_to_indices`` (five elementwise kernels) and a copy into the index buffer."""
    q_u8 = s["q"].view(B * NN, H, D)

    def run():
        rows = B * NN
        ctx = s["lens"].reshape(B, -1).to(torch.int64)
        if ctx.shape[1] != NN:
            ctx = ctx[:, -1:].expand(B, NN)
        w32 = s["w"][:rows].to(torch.float32).contiguous()
        row_req = torch.arange(B, device="cuda", dtype=torch.int32).repeat_interleave(NN)
        lo = torch.zeros(rows, dtype=torch.int32, device="cuda")
        hi = ctx.reshape(rows).to(torch.int32)
        bt32 = s["bt"].to(torch.int32)
        rows_kw = {"rows_per_req": NN} if 2 <= NN <= 8 else {}
        total = s["bt"].shape[1] * BS
        tile = max(BS, (I.decode_tile_budget(rows) // max(1, rows * 8)) // BS * BS)
        buf = torch.empty((rows, min(tile, total)), dtype=torch.int64, device="cuda")
        best = None
        for t0 in range(0, total, tile):
            t1 = min(total, t0 + tile)
            keys = OI.indexer_paged_keys(q_u8, w32, col0=t0, n_cols=t1 - t0, lo=lo, hi=hi, out=buf,
                                         pages=s["pages"], block_table=bt32, row_req=row_req,
                                         block_size=BS, **rows_kw)[:, : t1 - t0]
            best = I.merge_topk(best, keys, TOPK, True)
        s["idx"][:rows, :TOPK] = I.keys_to_indices(best)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sm-count", type=int, default=108,
                    help="also time the CUDA scorer with its grid sized for this SM count")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    common.require_cuda()
    report = common.Report(
        name="bench_indexer_keys",
        title="Lightning-indexer paged decode scorer and decode top-k",
        columns=["what", "shape", "impl", "median_us", "gbps", "pct_copy", "tflops",
                 "speedup_vs_triton", "equal_to_triton"])
    report.meta["copy"] = common.copy_bandwidth()
    copy_gbps = report.meta["copy"]["gbps_read_plus_write"]
    print(f"device-to-device copy: {copy_gbps:.0f} GB/s", flush=True)
    report.notes.append(
        "triton = the Triton scorer the CUDA kernel replaces (same contract: paged key mode); "
        "scorer rows time one call over all columns; 'top-k of the keys' rows time the running "
        "top-k alone (speedup column: against torch.topk); decode_topk rows time the whole step "
        "(triton: Triton scorer + torch.topk; cuda: CUDA scorer + CUDA row top-k, the scorer "
        "being the rows kernel for 2+ rows per request since 2026-12-02, and for one row per request where "
        "its grid covers the SMs (decode_rows_per_req) since 2026-12-02 06:40 UTC; cuda warp: the warp-per-row "
        "scorer for every row; cuda unfused: the same kernels composed as at commit 49911c9 (until 2026-12-02 04:00 UTC), "
        "the last merge writing int64 keys converted to indices by torch ops) "
        f"(top-k {TOPK}); bytes = unique K entries (132 B) + Q + weights + 8 B keys per row and "
        "column; CUDA-graph replay, median per call, input sets rotated past 2x L2")
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    for B, NN, ctx, H in (QUICK if args.quick else SHAPES):
        shape = f"{B} req x {NN} rows, ctx {ctx}, {H} heads"
        rows = B * NN
        nbytes = B * ctx * (D + 4) + rows * H * (D + 4) + rows * ctx * 8
        flops = 2.0 * rows * ctx * H * D
        per_set = B * -(-ctx // BS) * BS * (D + 4) + rows * ctx * 8
        sets = [make_set(B, NN, ctx, H, g) for _ in range(common.rotation_count(per_set, max_sets=8))]
        # equality on the first set: the two scorers' keys (fp32 sums in different orders may
        # differ in the last bit) and the selected indices
        s0 = sets[0]
        scorer_call(OI.indexer_paged_keys, s0)()
        k_cuda = s0["out"].clone()
        scorer_call(mqa_logits_tile, s0)()
        k_tri = s0["out"].clone()
        sc_c, sc_t = I.key_scores(k_cuda), I.key_scores(k_tri)
        # fp32 sums in two orders: the difference, relative to the row's largest |score|
        rel = ((sc_c - sc_t).abs().amax(1) / sc_t.abs().amax(1).clamp(min=1e-30)).max().item()
        same_keys = torch.equal(k_cuda, k_tri)
        report.check(f"{shape}: CUDA scores within 1e-5 of Triton's (relative to the row's "
                     "largest)", rel < 1e-5, f"max {rel:.2e}")
        topk_call(s0, B, NN, H, "cuda")()
        i_c = s0["idx"].clone()
        topk_call(s0, B, NN, H, "triton")()
        i_t = s0["idx"].clone()
        overlap = min(len(set(a.tolist()) & set(b.tolist())) / TOPK for a, b in zip(i_c.cpu(), i_t.cpu()))
        report.check(f"{shape}: top-{TOPK} sets overlap >= 99% per row", overlap >= 0.99,
                     f"min overlap {overlap:.4f}, keys bit-equal: {same_keys}")
        variants = [("triton", lambda s: scorer_call(mqa_logits_tile, s)),
                    ("cuda", lambda s: scorer_call(OI.indexer_paged_keys, s))]
        # the rows kernel: blocks of a request's rows sharing each K tile (one row: one per block)
        scorer_call(OI.indexer_paged_keys, s0, rows_per_req=NN)()
        report.check(f"{shape}: the rows kernel's keys bit-equal to the warp kernel's",
                     torch.equal(s0["out"], k_cuda))
        variants.append((f"cuda rows (rows_per_req={NN})",
                         lambda s: scorer_call(OI.indexer_paged_keys, s, rows_per_req=NN)))
        variants.append(("cuda rows, SM86 limits (84 SMs, 99 KB)", lambda s: scorer_call(
            OI.indexer_paged_keys, s, rows_per_req=NN, sm_count=84, smem_cap=101376)))
        if args.sm_count:
            variants.append((f"cuda, grid for {args.sm_count} SMs",
                             lambda s: scorer_call(OI.indexer_paged_keys, s, sm_count=args.sm_count)))
        variants.append(("cuda, SM86 limits (84 SMs, 99 KB: 4-stage ring)",
                         lambda s: scorer_call(OI.indexer_paged_keys, s, sm_count=84, smem_cap=101376)))
        base = None
        for name, mk in variants:
            t = common.graph_time([mk(s) for s in sets], min_calls=common.CALLS_PER_REPLAY)
            base = t.median_us if name == "triton" else base
            gb = common.gbps(nbytes, t.median_us)
            report.add(what="scorer", shape=shape, impl=name, median_us=t.median_us, gbps=gb,
                       pct_copy=100.0 * gb / copy_gbps, tflops=flops / t.median_us / 1e6,
                       speedup_vs_triton=base / t.median_us if base else None,
                       equal_to_triton=same_keys if name != "triton" else None)
            print(report.rows[-1], flush=True)
        # the running top-k alone, on the scorer's keys of each set
        for s in sets:
            scorer_call(OI.indexer_paged_keys, s)()
        got = OI.row_topk_keys(s0["out"], TOPK)
        report.check(f"{shape}: CUDA row top-k equals torch.topk", torch.equal(
            got, torch.topk(s0["out"], TOPK, dim=1, sorted=True).values))
        base = None
        for name, mk in (("torch.topk", lambda s: lambda: torch.topk(s["out"], TOPK, dim=1, sorted=True)),
                         ("cuda row_topk_keys", lambda s: lambda: OI.row_topk_keys(s["out"], TOPK, out=s["tk"]))):
            t = common.graph_time([mk(s) for s in sets], min_calls=common.CALLS_PER_REPLAY)
            base = t.median_us if base is None else base
            report.add(what="top-k of the keys", shape=shape, impl=name, median_us=t.median_us,
                       speedup_vs_triton=base / t.median_us)
            print(report.rows[-1], flush=True)
        topk_call(s0, B, NN, H, "cuda")()
        i_fused = s0["idx"].clone()
        unfused_call(s0, B, NN, H)()
        report.check(f"{shape}: decode_topk equals its unfused composition (indices)",
                     torch.equal(s0["idx"], i_fused))
        base = None
        for scorer in ("triton", "cuda unfused", "cuda warp", "cuda"):
            mk = (lambda s: unfused_call(s, B, NN, H)) if scorer == "cuda unfused" else (
                lambda s: topk_call(s, B, NN, H, scorer))
            t = common.graph_time([mk(s) for s in sets], min_calls=common.CALLS_PER_REPLAY)
            base = t.median_us if scorer == "triton" else base
            report.add(what="decode_topk", shape=shape, impl=scorer, median_us=t.median_us,
                       speedup_vs_triton=base / t.median_us)
            print(report.rows[-1], flush=True)
        del sets
        torch.cuda.empty_cache()
    return report.finish(not args.no_doc)


if __name__ == "__main__":
    sys.exit(main())
