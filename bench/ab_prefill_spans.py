"""Same-run A/B of ``prefill_topk``'s row-chunk column spans: read back in one copy for all
chunks (``indexer.chunk_column_spans``, the shipped code) against the earlier form, two
synchronising reads (``int(ks.min())``, ``int(ke.max())``) at the top of every chunk,
reproduced here by substituting a lazy sequence for ``chunk_column_spans``. Inputs and timing
as ``bench/bench_indexer_prefill.py``'s prefill_topk rows (eager, events around 3 calls, median
of 7), rounds interleaved; both scorers.

    python bench/ab_prefill_spans.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from bench_indexer_prefill import STEP, TOPK, make_k, make_q  # noqa: E402
from deepinfer_sm80.ampere import indexer as I  # noqa: E402

ONE_COPY = I.chunk_column_spans


class PerChunkReads:
    """The chunk loop's earlier spans: two device->host reads when chunk i is reached."""

    def __init__(self, ks, ke, row_chunk):
        self.ks, self.ke, self.rc = ks, ke, row_chunk

    def __getitem__(self, i):
        r0 = i * self.rc
        ks, ke = self.ks[r0:r0 + self.rc], self.ke[r0:r0 + self.rc]
        return int(ks.min()), int(ke.max()), int((ke - ks).clamp(min=0).max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    common.require_cuda()
    common.warm_gpu()
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    for T, nk, H in STEP:
        k, ks = make_k(nk, g)
        q, w = make_q(T, H, g)
        ke = ((4 * nk - T + torch.arange(T, device="cuda") + 1) // 4).to(torch.int32)
        kb = torch.zeros(T, dtype=torch.int32, device="cuda")
        for scorer in ("cuda", "triton"):
            outs = {}
            times = {"one copy": [], "per-chunk reads": []}
            for r in range(args.rounds):
                for name, fn in (("one copy", ONE_COPY), ("per-chunk reads", PerChunkReads)):
                    I.chunk_column_spans = fn
                    out = torch.full((T, TOPK), -7, dtype=torch.int32, device="cuda")
                    step = lambda: I.prefill_topk(q, w, k, ks, kb, ke, TOPK, out, scorer=scorer)  # noqa: E731
                    times[name].append(common._eager_time(step, inner=3, reps=7))
                    outs[name] = out
            I.chunk_column_spans = ONE_COPY
            same = torch.equal(outs["one copy"], outs["per-chunk reads"])
            med = {n: statistics.median(v) for n, v in times.items()}
            print(f"prefill_topk T {T}, Nk {nk}, {H} heads, {scorer}: one copy {med['one copy']:.0f} us, "
                  f"per-chunk reads {med['per-chunk reads']:.0f} us "
                  f"(rounds: {[round(x) for x in times['one copy']]} / "
                  f"{[round(x) for x in times['per-chunk reads']]}); outputs equal: {same}", flush=True)
        k = ks = q = w = None  # drop the tensors (the timed lambda closes over them)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
