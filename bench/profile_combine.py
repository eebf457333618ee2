"""Runs our combine_topk_swa_indices at T=1536 (1 request, top-k 512, window 128) and an
elementwise copy moving the same bytes, three times each on the same buffers, for Nsight
Compute (scripts/device/explore.sh profile-combine, caches not flushed: the L2-warm case):
the combine takes ~3.05 us graph-replayed against 2.26 us for the copy; the kernel
durations, stall reasons and issue statistics side by side say where the difference is."""

from __future__ import annotations


import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import bench_cache as bc  # noqa: E402

from deepinfer_sm80.ops import index as ours  # noqa: E402


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    tokens = 1536
    s = bc.make_combine_set(tokens, 1, gen)
    nbytes = tokens * (bc.TOPK * 4 + bc.WIDTH * 4 + 4)
    a = torch.empty(nbytes // 8, dtype=torch.int32, device="cuda").random_()
    b = torch.empty_like(a)
    call = bc.combine_call(ours.combine_topk_swa_indices, s)
    for _ in range(3):
        call()
        torch.bitwise_not(a, out=b)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
