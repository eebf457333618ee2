"""One query row per request (plain decode): which paged scorer kernel is faster, by batch and
context. The warp kernel (``rows_per_req=0``: a warp per row, Q fragments in registers,
csrc/index/indexer_keys.cu) against the rows kernel with one row per block
(``rows_per_req=1``: Q in shared memory, csrc/index/indexer_rows.cu), same inputs, same run,
with the grid sized for this GPU and for ``--sm-count`` SMs (A100: 108). The keys of the two
kernels are checked bit-equal at every shape. ``decode_topk`` picks the kernel from this
sweep (``deepinfer_sm80.ampere.indexer.decode_rows_per_req``).

Inputs as bench_indexer_keys.py (fresh random pages, random page order, input sets rotated
past twice the L2); CUDA-graph replay, median per call.

    python bench/sweep_decode_scorer.py [--sm-count 108] [--heads 64 32]
"""
from __future__ import annotations

import argparse
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from bench_indexer_keys import D, make_set, scorer_call  # noqa: E402
from deepinfer_sm80.ampere import indexer as I  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
CONTEXTS = [2048, 8192, 32768]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sm-count", type=int, default=108)
    ap.add_argument("--heads", type=int, nargs="+", default=[64, 32])
    args = ap.parse_args(argv)
    common.require_cuda()
    report = common.Report(
        name="sweep_decode_scorer",
        title="Paged decode scorer, one row per request: warp kernel vs rows kernel",
        columns=["heads", "batch", "context", "grid", "warp_us", "rows_us", "rows_over_warp",
                 "keys_equal", "picked"])
    report.notes.append(
        "warp = rows_per_req=0 (indexer_keys.cu), rows = rows_per_req=1 (indexer_rows.cu, one "
        "row per block); grid 'device' = sized for this GPU's SMs, else for that many SMs; "
        "picked = what decode_topk's rule (decode_rows_per_req) chooses for this shape on a "
        "GPU with that many SMs; CUDA-graph replay, median per call, input sets rotated past 2x L2")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    print(f"{'H':>3} {'B':>4} {'ctx':>6} {'grid':>6} {'warp us':>8} {'rows us':>8} {'rows/warp':>9} pick")
    for H in args.heads:
        for ctx in CONTEXTS:
            for B in BATCHES:
                per_set = B * ctx * (D + 4) + B * ctx * 8
                sets = [make_set(B, 1, ctx, H, g)
                        for _ in range(common.rotation_count(per_set, max_sets=8))]
                s0 = sets[0]
                scorer_call(OI.indexer_paged_keys, s0)()
                want = s0["out"].clone()
                scorer_call(OI.indexer_paged_keys, s0, rows_per_req=1)()
                equal = torch.equal(s0["out"], want)
                report.check(f"{H} heads, {B} x {ctx}: rows kernel keys bit-equal to the warp kernel's",
                             equal)
                for grid, sm in (("device", None), (str(args.sm_count), args.sm_count)):
                    kw = {"sm_count": sm} if sm else {}
                    tw = common.graph_time([scorer_call(OI.indexer_paged_keys, s, **kw) for s in sets],
                                           min_calls=common.CALLS_PER_REPLAY).median_us
                    tr = common.graph_time([scorer_call(OI.indexer_paged_keys, s, rows_per_req=1, **kw)
                                            for s in sets], min_calls=common.CALLS_PER_REPLAY).median_us
                    pick = "rows" if I.decode_rows_per_req(1, B, s0["n_cols"], sm or sms) else "warp"
                    report.add(heads=H, batch=B, context=ctx, grid=grid, warp_us=tw, rows_us=tr,
                               rows_over_warp=tr / tw, keys_equal=equal, picked=pick)
                    print(f"{H:>3} {B:>4} {ctx:>6} {grid:>6} {tw:8.1f} {tr:8.1f} {tr / tw:9.2f} {pick}",
                          flush=True)
                del sets
                torch.cuda.empty_cache()
    print(f"results: {report.write_json()}")
    return 1 if any(not c["ok"] for c in report.checks) else 0


if __name__ == "__main__":
    sys.exit(main())
