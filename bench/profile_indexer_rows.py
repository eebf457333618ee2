"""One shape of the prefill rows scorer (csrc/index/indexer_rows.cu, via
``deepinfer_sm80.ops.indexer.indexer_flat_keys(kernel="rows")``) for a profiler: three calls on
fresh random inputs (for ``ncu``). Timings next to the warp kernel: bench/ab_indexer_rows.py.

    python bench/profile_indexer_rows.py [--rows 256 --nk 16384 --heads 64 --chunk 0]
"""
from __future__ import annotations

import argparse
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from bench_indexer_prefill import scorer_call, scorer_set  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--nk", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=0)
    a = ap.parse_args(argv)
    common.require_cuda()
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    call = scorer_call("cuda", scorer_set(a.rows, a.nk, a.heads, g), kernel="rows", chunk=a.chunk)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
