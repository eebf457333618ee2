"""Exploration sweep for the sparse MLA kernels (GPU): not the benchmark of record
(bench_attention.py is), but the measurements that decide tuning choices.

- decode at batch 1 (--b1) or any batch and head count (--split-sweep B:H,..) with the split
  count forced (0 = automatic) and the per-kernel device durations of one call
  (torch.profiler), to see where the time of a decode goes;
- decode at batch 32/128 and prefill (4096 tokens) for whatever variant the environment
  selects (e.g. $DEEPINFER_ATTN_NARROW=0), so two processes compare variants (--tag names
  them).

Every timed case is first checked against the fp32 torch computation (poisoned output).
Prints one line per case and writes JSON to $OUT (or bench/results/) when --json is given.

Usage: python bench/explore_attention.py [--tag NAME] [--json PATH] [--smem-cap B]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import bench_attention as ba  # noqa: E402
import common  # noqa: E402


def decode_sets(ref, reqs, rows, heads, n=None):
    probe = ba.make_decode_set(ref, reqs, rows, heads, common.fresh_seed())
    n = n or common.rotation_count(probe["bytes"])
    return [probe] + [ba.make_decode_set(ref, reqs, rows, heads, common.fresh_seed()) for _ in range(n - 1)]


def decode_call(ops, s, splits, smem_cap):
    return lambda: ops.sparse_mla_decode(
        s["q"], s["swa"], s["swa_idx"], s["swa_lens"], s["comp"], s["comp_idx"], s["comp_lens"],
        s["sink"], ba.SCALE, s["out"], s["lse"], num_splits=splits, smem_cap=smem_cap)


def check_decode(ops, ref, s, splits, smem_cap) -> float:
    s["out"].fill_(float("nan"))
    decode_call(ops, s, splits, smem_cap)()
    r32, _ = ref.sparse_mla_decode_ref(s["q"], s["swa"], s["swa_idx"], s["swa_lens"], s["comp"],
                                       s["comp_idx"], s["comp_lens"], s["sink"], ba.SCALE,
                                       compute_dtype=torch.float32)
    if torch.isnan(s["out"]).any():
        return float("inf")
    return ((s["out"].double() - r32.double()).norm() / r32.double().norm()).item()


def kernel_durations(fn) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CUDA or getattr(ev, "device_time_total", 0):
            n = ev.count or 1
            t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            out[ev.key[:60]] = t / n
    return sorted(out.items(), key=lambda kv: -kv[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="default")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smem-cap", type=int, default=0)
    ap.add_argument("--b1", action="store_true", help="also sweep splits at batch 1")
    ap.add_argument("--b1-only", action="store_true", help="only the batch-1 sweep")
    ap.add_argument("--split-sweep", default="",
                    help="forced-split decode sweeps, B:H[:rows per request],.. (e.g. 128:8,32:64:6); "
                         "split 0 = the planner's choice")
    ap.add_argument("--prefill-only", action="store_true", help="only the prefill cases")
    ap.add_argument("--prefill-heads", default="64,32,8", help="head counts of the prefill cases")
    args = ap.parse_args()
    common.require_cuda()
    common.warm_gpu(1.0)
    ops, ref = ba.load_ours()
    rows = []

    def emit(**r):
        r["tag"] = args.tag
        rows.append(r)
        print(json.dumps(r), flush=True)

    sweeps = [(1, 8), (1, 64)] if args.b1 or args.b1_only else []
    sweeps += [tuple(int(x) for x in bh.split(":")) for bh in args.split_sweep.split(",") if bh]
    for reqs, heads, *rest in sweeps:
        rows_per_req = rest[0] if rest else 1
        sets = decode_sets(ref, reqs, rows_per_req, heads, n=8 if reqs == 1 else None)
        for splits in (0, 1, 2, 4, 5, 10, 20):
            err = check_decode(ops, ref, sets[0], splits, args.smem_cap)
            t = common.graph_time([decode_call(ops, s, splits, args.smem_cap) for s in sets],
                                  min_calls=16)
            emit(case=f"decode B={reqs} rows={rows_per_req}", heads=heads, splits=splits, us=t.median_us,
                 err=err)
        try:
            kd = kernel_durations(decode_call(ops, sets[0], 0, args.smem_cap))
            emit(case=f"decode B={reqs} rows={rows_per_req} kernels", heads=heads, kernels=kd[:6])
        except Exception as e:  # noqa: BLE001
            emit(case=f"decode B={reqs} rows={rows_per_req} kernels", heads=heads, error=repr(e)[:200])
        del sets
    for heads, reqs in (() if args.b1_only or args.prefill_only else ((64, 128), (64, 32), (8, 128), (32, 128))):
        sets = decode_sets(ref, reqs, 1, heads)
        err = check_decode(ops, ref, sets[0], 0, args.smem_cap)
        t = common.graph_time([decode_call(ops, s, 0, args.smem_cap) for s in sets])
        plan = ops.sparse_mla_plan(reqs, heads, ba.WINDOW + ba.TOPK, True, 0, args.smem_cap)
        emit(case=f"decode B={reqs}", heads=heads, splits=plan["splits"], us=t.median_us, err=err,
             gbps=common.gbps(sets[0]["bytes"], t.median_us))
        del sets
        torch.cuda.empty_cache()
    t_tok = 4096
    keys = ba.TOPK + ba.WINDOW
    for heads in (() if args.b1_only else [int(h) for h in args.prefill_heads.split(",") if h]):
        sets = [ba.make_prefill_set(t_tok, heads) for _ in range(2)]
        s0 = sets[0]
        s0["out"].fill_(float("nan"))
        call = [lambda s=s: ops.flash_mla_sparse_fwd(s["q"], s["kv"], s["idx"], ba.SCALE,
                                                     attn_sink=s["sink"], topk_length=s["lens"],
                                                     out=s["out"], smem_cap=args.smem_cap)
                for s in sets]
        call[0]()
        sub = ba.prefill_check_tokens(t_tok)
        r32, _, _ = ref.sparse_mla_prefill_ref(s0["q"][sub], s0["kv"], s0["idx"][sub], s0["lens"][sub],
                                               s0["sink"], ba.SCALE, torch.float32)
        err = ((s0["out"][sub].double() - r32.double()).norm() / r32.double().norm()).item()
        t = common.graph_time(call, replays=10)
        tf = 4.0 * 512 * keys * heads * t_tok / (t.median_us * 1e-6) / 1e12
        emit(case="prefill T=4096", heads=heads, us=t.median_us, tflops=tf, err=err)
        del sets
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": common.device_info(), "date": common.utc_now(),
                                               "command": common.command_line(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
