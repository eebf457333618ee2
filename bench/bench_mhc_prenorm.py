"""The mHC pre block's projection on SM80 tensor cores (csrc/mhc/prenorm_gemm.cu) against
vLLM's TileLang fallback below SM90, alone and inside vLLM's whole pre block.

vLLM's pre block (``mhc_pre_tilelang``) is a projection of the 4 residual streams
(x [T, 4H] bf16 by fn [24, 4H] fp32, plus each token's sum of squares) and a big-fuse kernel
(mixes, Sinkhorn, the RMS-normed sublayer input). Below SM90 the projection is TileLang's
``hc_prenorm_gemm(_block_m)`` kernel: fp32 FMA over 1-2 tokens a block, re-reading fn from
L2 for every 2 tokens (docs/mhc.md: the pre block ran at 10% of its byte floor on an H100).

Rows, all in the same run, per hidden size and token count:
- ``projection``: ours (grid for 108 SMs: K split as ``deepinfer_sm80.ops.mhc.choose_splits``
  picks) and vLLM's TileLang fallback (``_hc_prenorm_gemm_outputs`` under the 8.0 platform);
- ``pre``: vLLM's ``mhc_pre_tilelang`` with upstream's fallback, and the same with its
  module's ``_hc_prenorm_gemm_outputs`` replaced by ours (the integration point: vLLM's
  big-fuse kernels read the K splits as they read DeepGEMM's);
- where the tree carries patch 9 (``vllm/model_executor/kernels/mhc/ampere_prenorm.py``),
  ``vLLM routed (patch 9)`` in both: vLLM's own code choosing our kernel, checked to give our
  projection bit for bit; the fallback rows then force upstream's fallback (``_kernel_loads``
  answering False), so they stay the baseline.
Floors: the bytes each must move at the copy bandwidth of the run. Checks: ours within
``reference.mhc.OUT_REL_TOL`` of float64 (out) and ``SQRSUM_REL_TOL`` (sqrsum), vLLM's
fallback's error reported beside it; the pre block with ours within bf16 tolerances of vLLM's
own (bench_mhc.agrees). CUDA-graph replay, median per call, input sets rotated past 2x L2.

    python bench/bench_mhc_prenorm.py [--quick] [--no-doc] [--no-tilelang]
    (--no-tilelang: ours and float64 only, without TileLang or the vLLM tree)
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from typing import Any

import torch

import _paths  # noqa: E402,F401

import common  # noqa: E402
import mhc_sm80  # noqa: E402

HC = 4
A100_SMS = mhc_sm80.A100_SMS  # the grid of ours sized as for vLLM's split-k grids
HIDDEN = (("V4-Flash", 4096), ("V4.1-Flash", 5120), ("V4-Pro", 7168))
TOKENS = (1, 64, 1024, 8192)
QUICK = {"hidden": (("V4-Flash", 4096),), "tokens": (64, 8192)}


def make_set(T: int, H: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    import bench_mhc

    s = bench_mhc.make_set("pre", T, H, g)  # res [T, 4, H] bf16, fn [24, 4H] fp32, ...
    s["x"] = s["res"].view(T, HC * H)
    return s


def projection_bytes(T: int, H: int, splits: int) -> int:
    K = HC * H
    return T * K * 2 + 24 * K * 4 + splits * T * (24 + 1) * 4


def ours(s: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    from deepinfer_sm80.ops import mhc as op

    return op.hc_prenorm_gemm(s["x"], s["fn"], sm_count=A100_SMS)


@contextlib.contextmanager
def projection_replaced(wrappers: Any):
    """vLLM's pre-block module with its projection replaced by ours (restored after)."""
    orig = wrappers._hc_prenorm_gemm_outputs

    def replacement(x, fn, *, hidden_size, hc_mult, use_tilelang_fallback=True):
        from deepinfer_sm80.ops import mhc as op

        return op.hc_prenorm_gemm(x, fn, sm_count=A100_SMS)

    wrappers._hc_prenorm_gemm_outputs = replacement
    try:
        yield
    finally:
        wrappers._hc_prenorm_gemm_outputs = orig


def routing_module() -> Any | None:
    """Patch 9's router in the imported tree, or None (a tree without it)."""
    try:
        return importlib.import_module("vllm.model_executor.kernels.mhc.ampere_prenorm")
    except ImportError:
        return None


@contextlib.contextmanager
def upstream_fallback(router: Any | None):
    """vLLM's own TileLang projection, also in a tree whose patch 9 routes to ours."""
    if router is None:
        yield
        return
    saved = router._kernel_loads
    router._kernel_loads = lambda: False
    try:
        yield
    finally:
        router._kernel_loads = saved


def bench(report: common.Report, wrappers: Any | None, shapes: dict, copy_gbps: float,
          router: Any | None = None) -> None:
    import bench_mhc
    from deepinfer_sm80.ops import mhc as op
    from deepinfer_sm80.reference import mhc as ref

    g = torch.Generator().manual_seed(common.fresh_seed())
    for model, H in shapes["hidden"]:
        K = HC * H
        for T in shapes["tokens"]:
            shape = f"{model} H={H}, T={T}"
            splits = op.choose_splits(T, K, A100_SMS)
            first = make_set(T, H, g)
            per_set = first["res"].numel() * 2 + first["fn"].numel() * 4
            n = common.rotation_count(per_set)  # up to 64 sets: fn too leaves L2 at small T
            sets = [first] + [make_set(T, H, g) for _ in range(n - 1)]
            want_out, want_sq = ref.hc_prenorm_gemm(first["x"].cpu(), first["fn"].cpu(), 1)
            out, sq = ours(first)
            err = ref.rel_err(out.sum(0).cpu(), want_out[0])
            serr = ref.sqrsum_rel_err(sq.sum(0).cpu(), want_sq[0])
            report.check(f"projection {shape}: ours within float64 tolerances (out {err:.1e}, "
                         f"sqrsum {serr:.1e}; {splits} splits)",
                         err <= ref.OUT_REL_TOL and serr <= ref.SQRSUM_REL_TOL
                         and bool(torch.isfinite(out).all()))
            floor = projection_bytes(T, H, splits) / (copy_gbps * 1e3)
            impls = [(f"ours ({splits} splits)", ours)]
            if wrappers is not None:
                def vllm_projection(s):
                    return wrappers._hc_prenorm_gemm_outputs(s["x"], s["fn"], hidden_size=H,
                                                             hc_mult=HC)

                def fallback(s):
                    with upstream_fallback(router):
                        return vllm_projection(s)
                o2, s2 = fallback(first)
                report.notes.append(
                    f"projection {shape}: vLLM's TileLang fallback vs float64: out "
                    f"{ref.rel_err(o2.sum(0).cpu(), want_out[0]):.1e}, sqrsum "
                    f"{ref.sqrsum_rel_err(s2.sum(0).cpu(), want_sq[0]):.1e}")
                impls.append(("vLLM TileLang fallback", fallback))
                if router is not None:
                    o3, s3 = vllm_projection(first)
                    report.check(f"projection {shape}: patch 9 routes vLLM to ours (serves: "
                                 f"{router.ampere_prenorm_gemm_serves(K, 24)}; same outputs "
                                 "bit for bit)", torch.equal(o3, out) and torch.equal(s3, sq))
                    impls.append(("vLLM routed (patch 9)", vllm_projection))
            for impl, fn in impls:
                t = common.graph_time([lambda s=s, fn=fn: fn(s) for s in sets],
                                      min_calls=common.CALLS_PER_REPLAY)
                report.add(what="projection", shape=shape, impl=impl, median_us=t.median_us,
                           floor_us=floor, pct_copy=100.0 * floor / t.median_us)
                print(report.rows[-1], flush=True)
            if wrappers is not None:
                pre = lambda s: bench_mhc.tilelang_call(wrappers, "pre", s)()  # noqa: E731
                with upstream_fallback(router):
                    base = pre(first)
                variants = [("vLLM", lambda: upstream_fallback(router)),
                            ("vLLM with our projection", lambda: projection_replaced(wrappers))]
                if router is not None:
                    variants.append(("vLLM routed (patch 9)", contextlib.nullcontext))
                for impl, ctx in variants[1:]:
                    with ctx():
                        ok, perr, why = bench_mhc.agrees(pre(first), base)
                    report.check(f"pre {shape}: {impl} within bf16 tolerances of vLLM's (rel "
                                 f"err {perr:.1e}{'; ' + why if why else ''})", ok)
                floor = bench_mhc.bytes_moved("pre", first) / (copy_gbps * 1e3)
                for impl, ctx in variants:
                    with ctx():
                        t = common.graph_time([lambda s=s: pre(s) for s in sets],
                                              min_calls=common.CALLS_PER_REPLAY)
                    report.add(what="pre", shape=shape, impl=impl, median_us=t.median_us,
                               floor_us=floor, pct_copy=100.0 * floor / t.median_us)
                    print(report.rows[-1], flush=True)
            sets = first = None
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--no-tilelang", action="store_true")
    args = ap.parse_args(argv)
    common.require_cuda()
    report = common.Report(
        name="bench_mhc_prenorm",
        title="mHC pre-block projection: SM80 tensor-core kernel vs vLLM's TileLang fallback",
        columns=["what", "shape", "impl", "median_us", "floor_us", "pct_copy"])
    copy = common.copy_bandwidth()
    report.meta["copy"] = copy
    report.notes.append(
        f"ours: csrc/mhc/prenorm_gemm.cu, grid for {A100_SMS} SMs; vLLM's rows: TileLang "
        f"generating SM80 code, platform at 8.0 (bench/mhc_sm80.py); floor = bytes at the "
        f"copy bandwidth {copy['gbps_read_plus_write']:.0f} GB/s; CUDA-graph replay, median "
        "per call, input sets rotated past 2x L2")
    shapes = QUICK if args.quick else {"hidden": HIDDEN, "tokens": TOKENS}
    if args.no_tilelang:
        bench(report, None, shapes, copy["gbps_read_plus_write"])
    else:
        if not mhc_sm80.require_sm80_target():
            return 2
        with mhc_sm80.sm80_mhc() as (wrappers, _kernels):
            router = routing_module()
            report.notes.append("tree: " + ("patch 9 present (rows 'vLLM routed')" if router
                                            else "without patch 9"))
            bench(report, wrappers, shapes, copy["gbps_read_plus_write"], router)
    return report.finish(not args.no_doc)


if __name__ == "__main__":
    sys.exit(main())
