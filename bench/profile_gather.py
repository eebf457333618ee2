"""Runs our gather (1 x 49,152 entries) and an elementwise copy moving the same bytes, twice
each, for Nsight Compute (scripts/device/explore.sh): DRAM bytes read/written and
throughput of the two side by side explain the gather's distance from the copy ceiling."""

from __future__ import annotations


import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import bench_cache as bc  # noqa: E402

from deepinfer_sm80.ops import cache as ours  # noqa: E402


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    s = bc.make_gather_set(1, 49152, gen)
    per_set = 49152 * (bc.ENTRY_BYTES + 2 * bc.HEAD)
    a = torch.empty(per_set // 8, dtype=torch.int32, device="cuda").random_()
    b = torch.empty_like(a)
    for _ in range(2):
        bc.gather_call(ours.dequantize_and_gather_k_cache, s)()
        torch.bitwise_not(a, out=b)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
