"""One shape of the prefill rows scorer (csrc/index/indexer_rows.cu, via
``deepinfer_sm80.ops.indexer.indexer_flat_keys(kernel="rows")``) for a profiler: three calls
on fresh random inputs (for ``ncu``), or with ``--time`` the graph-replayed median per call
(input sets rotated past 2x L2) next to the warp-per-row kernel, keys checked bit-equal.

    python bench/profile_indexer_rows.py [--time] [--rows 256 --nk 16384 --heads 64]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch

_ROOT = pathlib.Path(__file__).resolve().parents[1]
for _p in (_ROOT / "overlay", _ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import common  # noqa: E402
from bench_indexer_prefill import scorer_call, scorer_set  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--nk", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=0)
    a = ap.parse_args(argv)
    common.require_cuda()
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    if not a.time:
        s = scorer_set(a.rows, a.nk, a.heads, g)
        call = scorer_call("cuda", s, kernel="rows", chunk=a.chunk)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        return 0
    common.warm_gpu(0.5)
    per_set = a.nk * 132 + a.rows * a.nk * 8
    sets = [scorer_set(a.rows, a.nk, a.heads, g) for _ in range(common.rotation_count(per_set, max_sets=8))]
    s0 = sets[0]
    scorer_call("cuda", s0, kernel="warp")()
    want = s0["out"].clone()
    scorer_call("cuda", s0, kernel="rows", chunk=a.chunk)()
    same = torch.equal(s0["out"], want)
    flops = 2.0 * a.rows * a.nk * a.heads * 128
    line = [f"{a.rows} x {a.nk}, {a.heads} heads"]
    for name, kw in (("warp", dict(kernel="warp")), ("rows", dict(kernel="rows", chunk=a.chunk))):
        t = common.graph_time([scorer_call("cuda", s, **kw) for s in sets], min_calls=common.CALLS_PER_REPLAY)
        line.append(f"{name} {t.median_us:.1f} us ({flops / t.median_us / 1e6:.0f} TF)")
    line.append("keys equal" if same else "KEYS DIFFER")
    print(" | ".join(line), flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
