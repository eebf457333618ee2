"""What DeepSeek-V4.1's two-level (candidate) selection costs the SM80 indexer's decode step.

``deepinfer_sm80.ampere.indexer.decode_topk`` on a paged FP8 indexer cache (132-byte entries,
64 per page, V4.1's 32 heads x 128), top-k 512, with no candidate step, as the candidate
source (``write``: per-row block maxima, 8-position blocks, best 2048 blocks) and as a later
indexer (``mask``: 2048 listed blocks). Fresh random inputs; median of CUDA-event timings
after warm-up, the three calls timed round-robin; the first column is the baseline of the
same run.

    python bench/bench_v41_indexer.py [--reps 30]
"""
from __future__ import annotations

import argparse
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)
from deepinfer_sm80.ampere import indexer as I  # noqa: E402

H, D, BS, TOPK, CAND_BLOCKS, CAND_BS = 32, 128, 64, 512, 2048, 8


def case(batch: int, ctx: int, g: torch.Generator):
    pages_per_req = -(-ctx // BS)
    nb = batch * pages_per_req + 1
    pages = torch.randint(0, 256, (nb, BS * (D + 4)), dtype=torch.uint8, device="cuda",
                          generator=g)
    codes = pages[:, : BS * D]
    codes[(codes & 0x7F) >= 0x78] &= 0xB7  # no NaN / huge codes
    scales = torch.rand(nb, BS, device="cuda", generator=g) + 0.5
    pages[:, BS * D:] = scales.view(torch.uint8).view(nb, -1)
    bt = torch.randperm(nb - 1, device="cuda", generator=g)[: batch * pages_per_req]
    bt = bt.view(batch, pages_per_req).int()
    q = torch.randint(0, 256, (batch, 1, H, D), dtype=torch.uint8, device="cuda", generator=g)
    q[(q & 0x7F) >= 0x70] &= 0xB7
    w = torch.randn(batch, H, device="cuda", generator=g) * 0.1
    lens = torch.full((batch, 1), ctx, dtype=torch.int32, device="cuda")
    return pages.view(nb, BS, D + 4), bt, q, w, lens


def time_ms(fns: list, reps: int) -> list[float]:
    """Median ms of each function, timed round-robin (the same conditions for all)."""
    for fn in fns:
        for _ in range(5):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times[i].append(a.elapsed_time(b))
    return [sorted(t)[len(t) // 2] for t in times]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    g = torch.Generator(device="cuda")
    g.manual_seed(int(torch.randint(0, 2**31 - 1, (1,)).item()))
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("| batch | context (compressed positions) | no candidates (ms) | write (ms) | mask (ms) |")
    print("|---|---|---|---|---|")
    for batch, ctx in ((8, 65536), (64, 8192), (128, 4096)):
        pages, bt, q, w, lens = case(batch, ctx, g)
        out = torch.empty(batch, TOPK, dtype=torch.int32, device="cuda")
        cand = torch.full((batch, CAND_BLOCKS), -1, dtype=torch.int32, device="cuda")

        def run(step=None):
            I.decode_topk(q, w, pages, lens, bt, BS, TOPK, out, candidates=step)

        run(I.CandidateStep(cand, CAND_BS, write=True))  # the blocks the mask rows list
        ref = out.clone()
        run()
        assert torch.equal(out, ref)  # the source layer's own top-k is unaffected
        mask_cand = cand.clone()
        plain, write, mask = time_ms(
            [run, lambda: run(I.CandidateStep(cand, CAND_BS, write=True)),
             lambda: run(I.CandidateStep(mask_cand, CAND_BS, write=False))], args.reps)
        kept = int((mask_cand >= 0).sum(1).min())
        print(f"| {batch} | {ctx} | {plain:.3f} | {write:.3f} | {mask:.3f} |"
              f"  (blocks listed per row >= {kept})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
