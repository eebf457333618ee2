"""Where the V4.1 candidate step's time goes in the SM80 indexer's decode top-k: the CUDA
kernels of one call (plain, candidate write, candidate mask) from torch.profiler, summed
per kernel name over 20 calls. A diagnostic for bench/bench_v41_indexer.py.

    python bench/profile_v41_indexer.py [--batch 64 --ctx 8192] [--width 262144] [--plain] [--timeline]

--width: the block table as wide as that many compressed positions (vLLM's max_model_len-wide
table; page 0 past each context), not as the context; --plain: only the call without the step; --timeline: also each kernel of
the last call in launch order with its time (the column tiles' kernels one by one).
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import _paths  # noqa: E402,F401  (overlay/ on sys.path)
import bench_v41_indexer as B  # noqa: E402
from deepinfer_sm80.ampere import indexer as I  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--width", type=int, default=0)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--timeline", action="store_true")
    args = ap.parse_args()
    g = torch.Generator(device="cuda")
    g.manual_seed(1234)
    pages, bt, q, w, lens = B.case(args.batch, args.ctx, g)
    if args.width > bt.shape[1] * B.BS:
        wide = torch.zeros(args.batch, -(-args.width // B.BS), dtype=bt.dtype, device="cuda")
        wide[:, : bt.shape[1]] = bt
        bt = wide
    out = torch.empty(args.batch, B.TOPK, dtype=torch.int32, device="cuda")
    cand = torch.full((args.batch, B.CAND_BLOCKS), -1, dtype=torch.int32, device="cuda")

    def run(step=None):
        I.decode_topk(q, w, pages, lens, bt, B.BS, B.TOPK, out, candidates=step)

    run(I.CandidateStep(cand, B.CAND_BS, write=True))
    variants = {"plain": lambda: run(),
                "write": lambda: run(I.CandidateStep(cand.clone(), B.CAND_BS, write=True)),
                "mask": lambda: run(I.CandidateStep(cand, B.CAND_BS, write=False))}
    if args.plain:
        variants = {"plain": variants["plain"]}
    for name, fn in variants.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        rows = sorted(((e.key, e.device_time_total / 20, e.count // 20)
                       for e in prof.key_averages() if e.device_time_total > 0),
                      key=lambda r: -r[1])
        total = sum(r[1] for r in rows)
        print(f"## {name} (batch {args.batch}, ctx {args.ctx}, table {bt.shape[1] * B.BS}): "
              f"{total:.1f} us of kernels per call")
        for key, us, n in rows[:12]:
            print(f"  {us:8.1f} us  x{n:<3d} {key[:110]}")
        if args.timeline:  # the last call's kernels (every call launches the same number)
            kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            kern.sort(key=lambda e: e.time_range.start)
            per_call = len(kern) // 20
            print(f"### {name}: the last call's {per_call} kernels in launch order")
            for e in kern[-per_call:]:
                print(f"  {e.time_range.elapsed_us():8.1f} us  {e.name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
