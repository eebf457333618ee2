"""Runs the sparse MLA kernels for Nsight Compute (scripts/device/explore.sh profile-attn):
prefill with 64 heads (1024 tokens x 640 keys, bf16 workspace) and decode with 64 heads
(batch 128, 512 + 128 FP8 entries per token), each once after a warm-up call, so that the
profiler sees two launches of each (the second is the steady state)."""

from __future__ import annotations


import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import bench_attention as ba  # noqa: E402
import explore_attention as ea  # noqa: E402


def main() -> None:
    ops, ref = ba.load_ours()
    torch.manual_seed(1)
    s = ba.make_prefill_set(1024, 64)
    for _ in range(2):
        ops.flash_mla_sparse_fwd(s["q"], s["kv"], s["idx"], ba.SCALE, attn_sink=s["sink"],
                                 topk_length=s["lens"], out=s["out"])
    d = ba.make_decode_set(ref, 128, 1, 64, 2)
    for _ in range(2):
        ea.decode_call(ops, d, 0, 0)()  # planner's splits, the device's shared-memory limit
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
