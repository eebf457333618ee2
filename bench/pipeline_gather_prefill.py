"""The gather feeding the prefill, timed together (scripts/device/pipeline.sh).

`dequantize_and_gather_k_cache` writes the bf16 workspace that `flash_mla_sparse_fwd` then
reads by index. The gather's stores carry an L2 evict_first policy (csrc/cache/gather_k.cu,
off with DEEPINFER_GATHER_L2POLICY=0, read once per process); this measures whether that
costs the prefill that reads the workspace next. One request of W = 20,992 entries (the
workspace of bench_attention's prefill set: 4 requests x (4,096 compressed + 128 window +
1,024 query rows)), then a prefill of 4,096 query tokens x 640 indices into it, with 64 and
8 heads. CUDA-graph replay medians (bench/common.graph_time), two input sets rotated; prints
one JSON line per case with the policy setting of this process.

    DEEPINFER_GATHER_L2POLICY=0|1 python bench/pipeline_gather_prefill.py
"""

from __future__ import annotations

import json
import os

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import bench_attention as ba  # noqa: E402
import bench_cache as bc  # noqa: E402
import common  # noqa: E402

from deepinfer_sm80.ops import cache as cache_ops  # noqa: E402


def main() -> None:
    policy = os.environ.get("DEEPINFER_GATHER_L2POLICY", "1")
    ops, _ = ba.load_ours()
    common.warm_gpu()
    gen = torch.Generator(device="cuda").manual_seed(7)
    for heads in (64, 8):
        torch.manual_seed(11 + heads)
        sets = []
        for _ in range(2):
            p = ba.make_prefill_set(4096, heads)
            g = bc.make_gather_set(1, p["kv"].shape[0], gen)
            p["kv"] = g["out"].view(-1, 1, bc.HEAD)  # the prefill reads what the gather wrote
            sets.append((g, p))

        def gather(g):
            return bc.gather_call(cache_ops.dequantize_and_gather_k_cache, g)

        def prefill(p):
            return lambda: ops.flash_mla_sparse_fwd(p["q"], p["kv"], p["idx"], ba.SCALE,
                                                    attn_sink=p["sink"], topk_length=p["lens"],
                                                    out=p["out"])

        def both(g, p):
            fg, fp = gather(g), prefill(p)
            return lambda: (fg(), fp())

        # every output finite: the prefill really read a gathered workspace
        both(*sets[0])()
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(sets[0][1]["out"]).all().item())
        t_both = common.graph_time([both(g, p) for g, p in sets])
        t_gather = common.graph_time([gather(g) for g, _ in sets])
        t_prefill = common.graph_time([prefill(p) for _, p in sets])
        print(json.dumps({"case": "gather + prefill", "heads": heads, "policy": policy,
                          "workspace_rows": int(sets[0][1]["kv"].shape[0]),
                          "both_us": round(t_both.median_us, 2),
                          "gather_us": round(t_gather.median_us, 2),
                          "prefill_us": round(t_prefill.median_us, 2),
                          "outputs_finite": finite}), flush=True)


if __name__ == "__main__":
    main()
