"""Exploration (not a record): the prefill rows scorer (csrc/index/indexer_rows.cu) by column
chunk, for the rows per block $DEEPINFER_INDEXER_ROWS of this process (at most; see the kernel's
launcher), against the warp-per-row kernel in the same process. CUDA-graph replay, input sets
rotated past twice the L2, median per call; keys checked bit-equal to the warp kernel's.

    DEEPINFER_INDEXER_ROWS=4 python bench/explore_indexer_rows.py [--chunks 0,2048,4096]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from bench_indexer_prefill import scorer_call, scorer_set  # noqa: E402

SHAPES = [(256, 16384, 64), (256, 16384, 32), (256, 4096, 64), (64, 65536, 64)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", default="0,1024,2048,4096,8192")
    ap.add_argument("--sm-count", type=int, default=0)
    args = ap.parse_args(argv)
    common.require_cuda()
    common.warm_gpu()
    cfg = os.environ.get("DEEPINFER_INDEXER_ROWS", "8")
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    ok = True
    for rows, nk, H in SHAPES:
        flops = 2.0 * rows * nk * H * 128
        per_set = nk * 132 + rows * nk * 8
        sets = [scorer_set(rows, nk, H, g) for _ in range(common.rotation_count(per_set, max_sets=8))]
        s0 = sets[0]
        scorer_call("cuda", s0, kernel="warp")()
        want = s0["out"].clone()
        line = [f"rows {cfg} | {rows} x {nk}, {H} heads"]
        t = common.graph_time([scorer_call("cuda", s, kernel="warp") for s in sets],
                              min_calls=common.CALLS_PER_REPLAY)
        line.append(f"warp {t.median_us:.1f}")
        for chunk in (int(c) for c in args.chunks.split(",")):
            kw = dict(kernel="rows", chunk=chunk, sm_count=args.sm_count or None)
            scorer_call("cuda", s0, **kw)()
            same = torch.equal(s0["out"], want)
            ok &= same
            t = common.graph_time([scorer_call("cuda", s, **kw) for s in sets],
                                  min_calls=common.CALLS_PER_REPLAY)
            line.append(f"chunk {chunk}: {t.median_us:.1f} us ({flops / t.median_us / 1e6:.0f} TF)"
                        + ("" if same else " KEYS DIFFER"))
        print(" | ".join(line), flush=True)
        del sets
        torch.cuda.empty_cache()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
