"""GPU diagnostic: what the gather pays per call, apart from moving bytes.

The gather streams at ~94% of the copy ceiling on the H200 and pays ~3.0 us per call where
a plain copy of the same bytes pays ~2.2 us (docs/kernels-cache-index.md, "Current record";
the 4.3 against 2.1 us of the 17:49 UTC session mixed 2 and 20 calls per graph replay). This
times, graph-replayed like bench_cache.py (common.CALLS_PER_REPLAY calls per replay) and on
its inputs (random 64-entry pages, several input sets rotated past the L2):

- ``full``: the gather as benchmarked;
- ``idle grid``: the same launch (the grid follows the output rows) with ``seq_lens`` = 0,
  so every block reads its request header and exits: the cost of launching the grid;
- ``1/8 gathered``: ``gather_lens`` = N / 8 of the last entries, the rest of the grid idle;
- ``tiny copy``: a 4-byte device copy, the graph's cost of one more kernel node.

Usage: python bench/gather_overhead.py [N ...]   (default 49152 196608)
"""

from __future__ import annotations

import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import bench_cache  # noqa: E402
import common  # noqa: E402


def variants(s: dict, n: int) -> dict[str, dict]:
    """The benchmark set ``s`` and its idle-grid / 1/8 copies (same cache, table, output)."""
    idle = dict(s, seq_lens=torch.zeros_like(s["seq_lens"]))
    eighth = dict(s, gather_lens=torch.full_like(s["seq_lens"], max(1, n // 8)))
    return {"full": s, "idle grid (seq_lens = 0)": idle, "1/8 gathered": eighth}


def main(argv: list[str]) -> int:
    common.require_cuda()
    from deepinfer_sm80 import _ext  # type: ignore[import-not-found]

    _ext.load()
    from deepinfer_sm80.ops import cache as ours  # type: ignore[import-not-found]

    sizes = [int(a) for a in argv] or [49152, 196608]
    common.warm_gpu(1.0)
    ceil = common.copy_bandwidth()["gbps_read_plus_write"]
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    a, b = torch.zeros(1, dtype=torch.int32, device="cuda"), torch.ones(1, dtype=torch.int32, device="cuda")
    t = common.graph_time([lambda: a.copy_(b)], min_calls=common.CALLS_PER_REPLAY)
    print(f"tiny copy (one more graph node): {t.median_us:.2f} us", flush=True)
    for n in sizes:
        gen = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
        per_set = n * (bench_cache.ENTRY_BYTES + 2 * bench_cache.HEAD)
        sets = [bench_cache.make_gather_set(1, n, gen) for _ in range(common.rotation_count(per_set, max_sets=4))]
        by = [variants(s, n) for s in sets]
        # the full call must write every row and the idle one none (poisoned outputs)
        o = torch.full_like(sets[0]["out"], float("nan"))
        bench_cache.gather_call(ours.dequantize_and_gather_k_cache, by[0]["idle grid (seq_lens = 0)"], o)()
        torch.cuda.synchronize()
        if not bool(o.isnan().all()):
            raise RuntimeError("idle grid wrote output rows")
        bench_cache.gather_call(ours.dequantize_and_gather_k_cache, by[0]["full"], o)()
        torch.cuda.synchronize()
        if bool(o.isnan().any()):
            raise RuntimeError("full gather left rows unwritten")
        for name in by[0]:
            t = common.graph_time([bench_cache.gather_call(ours.dequantize_and_gather_k_cache, v[name])
                                   for v in by], min_calls=common.CALLS_PER_REPLAY, replays=20)
            moved = per_set if name == "full" else (per_set // 8 if name.startswith("1/8") else 0)
            pct = f" = {100 * moved / (t.median_us * 1e3) / ceil:.1f}% of copy" if moved else ""
            print(f"{n:>8} entries, {name}: {t.median_us:.2f} us{pct}", flush=True)
        del sets, by
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
