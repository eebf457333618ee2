"""One shape of the row top-k (csrc/index/row_topk.cu, via
``deepinfer_sm80.ops.indexer.row_topk_keys``) for a profiler: three calls on fresh scorer-like
keys (bench/ab_row_topk.py's ``make_keys``), checked against ``torch.topk`` first. Timings:
bench/ab_row_topk.py.

    python bench/profile_row_topk.py [--rows 1 --n 8192 --k 512]
"""
from __future__ import annotations

import argparse
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from ab_row_topk import make_keys  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=512)
    a = ap.parse_args(argv)
    common.require_cuda()
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    keys = make_keys(a.rows, a.n, g)
    out = torch.empty(a.rows, a.k, dtype=torch.int64, device="cuda")
    for _ in range(3):
        OI.row_topk_keys(keys, a.k, out=out)
    torch.cuda.synchronize()
    ok = torch.equal(out, torch.topk(keys, a.k, dim=1, sorted=True).values)
    print(f"row_topk {a.rows}x{a.n} k {a.k}: equal_to_torch_topk={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
