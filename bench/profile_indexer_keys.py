"""One shape of the CUDA indexer scorer (``deepinfer_sm80.ops.indexer``) for a profiler or a
knob sweep: by default three calls (for ``ncu``); ``--time`` prints the graph-replayed median
per call (input sets rotated past 2x L2) with the bytes and FLOPs of bench_indexer_keys.py.
Kernel knobs ($DEEPINFER_INDEXER_DIAG, $DEEPINFER_INDEXER_SMEM_PAD) are read once per process.

    python bench/profile_indexer_keys.py [--time] [--batch 64 --ctx 8192 --heads 64 --rows 1]
"""
from __future__ import annotations

import argparse
import os

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import bench_indexer_keys as B  # noqa: E402
import common  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--sm-count", type=int, default=0)
    ap.add_argument("--smem-cap", type=int, default=0)
    a = ap.parse_args()
    common.require_cuda()
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    rows = a.batch * a.rows
    nbytes = a.batch * a.ctx * (B.D + 4) + rows * a.heads * (B.D + 4) + rows * a.ctx * 8
    per_set = a.batch * a.ctx * (B.D + 4) + rows * a.ctx * 8
    n_sets = common.rotation_count(per_set, max_sets=8) if a.time else 1
    sets = [B.make_set(a.batch, a.rows, a.ctx, a.heads, g) for _ in range(n_sets)]
    calls = [B.scorer_call(OI.indexer_paged_keys, s, sm_count=a.sm_count, smem_cap=a.smem_cap)
             for s in sets]
    knobs = {k: v for k, v in os.environ.items() if k.startswith("DEEPINFER_INDEXER")}
    if not a.time:
        for _ in range(3):
            calls[0]()
        torch.cuda.synchronize()
        return
    common.warm_gpu(0.5)
    t = common.graph_time(calls, min_calls=common.CALLS_PER_REPLAY)
    print(f"{a.batch} req x {a.rows} rows, ctx {a.ctx}, {a.heads} heads, knobs {knobs}, sm_count {a.sm_count}, smem_cap {a.smem_cap}: "
          f"{t.median_us:.1f} us, {common.gbps(nbytes, t.median_us):.0f} GB/s, "
          f"{2.0 * rows * a.ctx * a.heads * B.D / t.median_us / 1e6:.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
