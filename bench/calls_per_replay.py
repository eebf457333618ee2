"""GPU diagnostic: how the calls captured per graph replay change a per-call time.

``common.graph_time`` times whole replays and divides by the calls in the graph, so the
replay's own cost (graph launch and event records, paid once) is spread over those calls.
Until 2026-11-30 the gather rows of bench_cache.py captured one call per input set (two at
1 x 49,152 entries) while the same-bytes copy captured 20. This times both, on bench_cache's
inputs, with 1, 2, 4, 20 and 80 calls per replay, in interleaved rounds.

Usage: python bench/calls_per_replay.py [rounds]   (default 3)
"""

from __future__ import annotations

import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import bench_cache  # noqa: E402
import common  # noqa: E402

COUNTS = (1, 2, 4, 20, 80)


def main(argv: list[str]) -> int:
    common.require_cuda()
    from deepinfer_sm80 import _ext  # type: ignore[import-not-found]

    _ext.load()
    from deepinfer_sm80.ops import cache as ours  # type: ignore[import-not-found]

    rounds = int(argv[0]) if argv else 3
    common.warm_gpu(1.0)
    ceil = common.copy_bandwidth()["gbps_read_plus_write"]
    n = 49152
    per_set = n * (bench_cache.ENTRY_BYTES + 2 * bench_cache.HEAD)
    gen = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    sets = [bench_cache.make_gather_set(1, n, gen) for _ in range(common.rotation_count(per_set))]
    gather = [bench_cache.gather_call(ours.dequantize_and_gather_k_cache, s) for s in sets]
    words = per_set // 8
    bufs = [(torch.empty(words, dtype=torch.int32, device="cuda").random_(),
             torch.empty(words, dtype=torch.int32, device="cuda")) for _ in range(len(sets))]
    copy = [(lambda a=a, b=b: torch.bitwise_not(a, out=b)) for a, b in bufs]
    print(f"copy ceiling {ceil:.0f} GB/s; 1 x {n} entries, {per_set / 1e6:.1f} MB per call, "
          f"{len(sets)} input sets", flush=True)
    print("| round | kernel | " + " | ".join(f"{c} per replay" for c in COUNTS) + " |")
    print("|---|---|" + "---|" * len(COUNTS))
    for r in range(rounds):
        for name, calls in (("gather", gather), ("copy, same bytes", copy)):
            cells = []
            for c in COUNTS:
                t = common.graph_time(calls, calls_per_replay=c, replays=30)
                cells.append(f"{t.median_us:.2f} us = {100 * per_set / (t.median_us * 1e3) / ceil:.1f}%")
            print(f"| {r + 1} | {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
