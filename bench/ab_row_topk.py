"""Times the extension's row top-k (``deepinfer_sm80.ops.indexer.row_topk_keys``, k 512) alone,
for same-run A/B of two builds (``scripts/device/ab.sh`` with ``AB_BENCH=topk`` runs it
interleaved on a base and a new ``.so`` through ``$DEEPINFER_SM80_EXT``).

Keys: the indexer's ``order_keys`` of scorer-like scores (sum over 64 heads of relu(x) * w with
x, w ~ N(0, 1), so the high bytes of most keys agree, as in the real indexer), 2% of columns
invalid; fresh random inputs every run; input sets rotated past twice the L2; CUDA-graph
replay, median per call. Checks the result against torch.topk before timing.

    python bench/ab_row_topk.py [--label NAME]
"""
from __future__ import annotations

import argparse

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from deepinfer_sm80.ampere import indexer as I  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402

K = 512
# (rows, columns): decode 1 x 8,192 / 64 x 8,192 / 128 x 4,096 / 8 x 65,536 / MTP 192 x 8,192;
# a prefill merge (256 rows x one 16,384-column tile plus the 512 kept)
SHAPES = [(1, 8192), (64, 8192), (128, 4096), (8, 65536), (192, 8192), (256, 16896)]


def make_keys(rows, n, g):
    s = torch.zeros(rows, n, device="cuda")
    for _ in range(8):  # 8 groups of 8 heads: keeps the temporaries small
        x = torch.randn(rows, 8, n, device="cuda", generator=g).relu_()
        w = torch.randn(rows, 8, 1, device="cuda", generator=g)
        s += (x * w).sum(1)
    cols = torch.arange(n, device="cuda").unsqueeze(0)
    valid = torch.rand(rows, n, device="cuda", generator=g) > 0.02
    return I.order_keys(s, cols, valid)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    common.require_cuda()
    g = torch.Generator(device="cuda")
    g.manual_seed(common.fresh_seed())
    common.warm_gpu()
    for rows, n in SHAPES:
        nsets = common.rotation_count(rows * n * 8)
        sets = [make_keys(rows, n, g) for _ in range(nsets)]
        outs = [torch.empty(rows, K, dtype=torch.int64, device="cuda") for _ in sets]
        got = OI.row_topk_keys(sets[0], K)
        ok = torch.equal(got, torch.topk(sets[0], K, dim=1, sorted=True).values)
        t = common.graph_time([(lambda s=s, o=o: OI.row_topk_keys(s, K, out=o)) for s, o in zip(sets, outs)],
                              min_calls=common.CALLS_PER_REPLAY)
        print(f"row_topk {args.label} {rows}x{n}: {t.median_us:.2f} us (p25 {t.p25_us:.2f}, "
              f"p75 {t.p75_us:.2f}) equal_to_torch_topk={ok}", flush=True)
        del sets, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
