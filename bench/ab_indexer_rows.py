"""Same-run A/B of the rows scorer (csrc/index/indexer_rows.cu) between builds of the
extension (``$DEEPINFER_SM80_EXT`` picks the .so; scripts/device/indexer_rows_ab.sh runs this
once per build and round): flat prefill shapes and paged decode shapes with several rows per
request (``--one-row``: one row per request instead; ``--paged-only``: no flat shapes), each next to the warp-per-row kernel of the same build, keys checked bit-equal to it.
CUDA-graph replay, input sets rotated past twice the L2, median per call.

    python bench/ab_indexer_rows.py --label NAME [--quick]
"""
from __future__ import annotations

import argparse
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import bench_indexer_keys as K  # noqa: E402
import bench_indexer_prefill as P  # noqa: E402
import common  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402

FLAT = [(256, 16384, 64), (256, 16384, 32), (256, 4096, 64), (256, 16384, 16)]
PAGED = [(32, 6, 8192, 64), (32, 2, 8192, 64), (16, 6, 8192, 32)]
# one row per request (rows_per_req=1: one row per block)
ONE_ROW = [(64, 1, 8192, 64), (128, 1, 4096, 32), (8, 1, 65536, 64), (16, 1, 8192, 64), (4, 1, 8192, 64)]


def timed(calls):
    return common.graph_time(calls, min_calls=common.CALLS_PER_REPLAY).median_us


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--paged-only", action="store_true", help="no flat shapes")
    ap.add_argument("--one-row", action="store_true", help="the paged shapes with one row per request")
    a = ap.parse_args(argv)
    common.require_cuda()
    common.warm_gpu(0.5)
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    ok = True
    for rows, nk, H in [] if a.paged_only else FLAT[:2] if a.quick else FLAT:
        per_set = nk * 132 + rows * nk * 8
        sets = [P.scorer_set(rows, nk, H, g) for _ in range(common.rotation_count(per_set, max_sets=8))]
        P.scorer_call("cuda", sets[0], kernel="warp")()
        want = sets[0]["out"].clone()
        P.scorer_call("cuda", sets[0], kernel="rows")()
        same = torch.equal(sets[0]["out"], want)
        ok &= same
        tr = timed([P.scorer_call("cuda", s, kernel="rows") for s in sets])
        tw = timed([P.scorer_call("cuda", s, kernel="warp") for s in sets])
        print(f"ab {a.label} | flat {rows} x {nk}, {H} heads | rows {tr:.1f} us "
              f"({2.0 * rows * nk * H * 128 / tr / 1e6:.0f} TF) | warp {tw:.1f} us | "
              f"{'keys equal' if same else 'KEYS DIFFER'}", flush=True)
        del sets
    for B, NN, ctx, H in ONE_ROW if a.one_row else PAGED[:1] if a.quick else PAGED:
        per_set = B * -(-ctx // K.BS) * K.BS * (K.D + 4) + B * NN * ctx * 8
        sets = [K.make_set(B, NN, ctx, H, g) for _ in range(common.rotation_count(per_set, max_sets=8))]
        K.scorer_call(OI.indexer_paged_keys, sets[0])()
        want = sets[0]["out"].clone()
        K.scorer_call(OI.indexer_paged_keys, sets[0], rows_per_req=NN)()
        same = torch.equal(sets[0]["out"], want)
        ok &= same
        tr = timed([K.scorer_call(OI.indexer_paged_keys, s, rows_per_req=NN) for s in sets])
        tw = timed([K.scorer_call(OI.indexer_paged_keys, s) for s in sets])
        print(f"ab {a.label} | paged {B} x {NN} rows, ctx {ctx}, {H} heads | rows {tr:.1f} us | "
              f"warp {tw:.1f} us | {'keys equal' if same else 'KEYS DIFFER'}", flush=True)
        del sets
        torch.cuda.empty_cache()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
