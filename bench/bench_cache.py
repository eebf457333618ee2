"""GPU benchmark: KV-cache gather and top-k/SWA index combine, ours vs baselines.

Implementations timed in the same process, on the same inputs:
- ``ours``: ``deepinfer_sm80.ops.cache`` (CUDA extension), when built;
- ``upstream``: vLLM's Triton kernels imported from the applied tree (0.33.0, the pin, unless
  ``VLLM`` or ``DEEPINFER_VLLM_TREE`` names another; the report gives the tree's version)
  (``bench/upstream_import.py``; they use ``tl.float8e4nv``, so they need SM89+: an H200
  runs them; below SM89 the gather's upstream rows are left out and the report says why,
  while upstream's combine, which has no FP8, still runs);
- ``portable``: ``deepinfer_sm80.triton_portable`` (software e4m3; what other Ampere ports
  run). ``combine_topk_swa_indices`` has no FP8 and upstream's kernel compiles for SM80
  unchanged (checked here by an AOT compile for cuda 80), so its portable baseline is
  upstream's kernel itself.

Inputs are as at vLLM's prefill call sites (``nvidia/flashmla.py`` ``_forward_prefill``):
- gather: the compressed (C4) region: 256-token pages hold 64 entries
  (``block_size = 256 // 4``), page stride ``round_up(64 * 584, 576) = 37440``,
  ``gather_lens=None``, ``offset=0``, a random permutation of physical pages in the block
  table, fresh random fp8_ds_mla records (no NaN codes; UE8M0 bytes 110..135);
- combine: ratio 4, topk 512, window 128, every request a chunk of ``T / R`` query tokens
  after a 4096-token prefix, local top-k indices drawn from the visible compressed
  positions, ``gather_lens = qlen + min(prefix, 127)``, ``N`` = max compressed length,
  ``M = N + max gather_len``, output width ``round_up(512 + 128, 128) = 640``; timed
  including the ``-1`` fill of the output, as upstream's function does it.

Times: CUDA-graph replay, median over replays, each replay cycling through enough input
sets to exceed twice the L2 size. Bandwidth: gather counts 584 B read + 1024 B written per
entry; combine counts the top-k entries read, the full output row (640 x 4 B) and the
length written. Percent of the device-to-device copy bandwidth measured in the same run.
Before timing, every implementation's output is checked bit for bit against upstream's on
the same inputs (outputs poisoned first) and printed.

Usage: python bench/bench_cache.py [--tree DIR] [--quick] [--no-doc] [--sm-count N]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
import upstream_import  # noqa: E402

ENTRY_DATA = 576
ENTRY_BYTES = 584
HEAD = 512
C4_BLOCK = 64  # compressed entries per 256-token page at ratio 4
GATHER_CASES = [(1, 49152), (4, 12288), (16, 2048)]  # (requests, entries per request)
COMBINE_CASES = [(1536, 1), (8192, 4), (16384, 1)]  # (query tokens, requests)
TOPK, WINDOW, RATIO, PREFIX = 512, 128, 4, 4096
WIDTH = -(-(TOPK + WINDOW) // 128) * 128


def page_stride(block_size: int) -> int:
    return -(-(block_size * ENTRY_BYTES) // ENTRY_DATA) * ENTRY_DATA


# ---------------------------------------------------------------- inputs ----------------
def make_cache(num_blocks: int, block_size: int, gen: torch.Generator) -> torch.Tensor:
    """Random fp8_ds_mla pages: e4m3 bytes without NaN codes, bf16 RoPE from randn,
    UE8M0 bytes 110..135 and a zero pad byte; bytes after the scales stay random."""
    stride = page_stride(block_size)
    cache = torch.randint(0, 256, (num_blocks, stride), dtype=torch.uint8, device="cuda",
                          generator=gen)
    data = cache[:, : block_size * ENTRY_DATA].view(num_blocks, block_size, ENTRY_DATA)
    fp8 = data[:, :, :448]
    fp8.sub_(((fp8 & 0x7F) == 0x7F).to(torch.uint8))  # 0x7F/0xFF (NaN) -> 0x7E/0xFE
    rope = torch.randn(num_blocks, block_size, 64, device="cuda", generator=gen,
                       dtype=torch.float32).to(torch.bfloat16)
    data[:, :, 448:].copy_(rope.view(torch.uint8).view(num_blocks, block_size, 128))
    sc = cache[:, block_size * ENTRY_DATA: block_size * ENTRY_BYTES].view(num_blocks, block_size, 8)
    sc[:, :, :7] = torch.randint(110, 136, (num_blocks, block_size, 7), dtype=torch.uint8,
                                 device="cuda", generator=gen)
    sc[:, :, 7] = 0
    return cache


def make_gather_set(reqs: int, n: int, gen: torch.Generator) -> dict[str, Any]:
    bpr = -(-n // C4_BLOCK)
    nb = reqs * bpr + 8
    cache = make_cache(nb, C4_BLOCK, gen)
    perm = torch.randperm(nb, device="cuda", generator=gen)[: reqs * bpr].to(torch.int32)
    width = bpr + 16  # the table is wider than the request, as at the call site
    table = torch.randint(0, nb, (reqs, width), dtype=torch.int32, device="cuda", generator=gen)
    table[:, :bpr] = perm.view(reqs, bpr)
    return {
        "out": torch.empty(reqs, n, HEAD, dtype=torch.bfloat16, device="cuda"),
        "k_cache": cache,
        "seq_lens": torch.full((reqs,), n, dtype=torch.int32, device="cuda"),
        "gather_lens": None,
        "block_table": table,
        "block_size": C4_BLOCK,
        "offset": 0,
    }


def make_combine_set(tokens: int, reqs: int, gen: torch.Generator,
                     ratio: int = RATIO, topk: int = TOPK) -> dict[str, Any]:
    """Inputs of one combine call; ``topk`` columns per row (V4-Flash 512, V4-Pro 1024), the
    output ``idx`` as wide as upstream allocates it (top-k + window, rounded up to 128)."""
    qlen = tokens // reqs
    qlens = torch.full((reqs,), qlen, dtype=torch.int64)
    seq = qlens + PREFIX
    gather = qlens + min(PREFIX, WINDOW - 1)
    comp = seq // ratio
    N = int(comp.max())
    M = N + int(gather.max())
    qsl = torch.zeros(reqs + 1, dtype=torch.int64)
    qsl[1:] = torch.cumsum(qlens, 0)
    # local top-k indices: for a token at position pos, in [0, (pos + 1) // ratio)
    pos = torch.cat([torch.arange(PREFIX, PREFIX + qlen) for _ in range(reqs)]).cuda()
    visible = ((pos + 1) // ratio).clamp(min=1)
    width = -(-(topk + WINDOW) // 128) * 128
    topk_idx = (torch.rand(tokens, topk, device="cuda", generator=gen)
                * visible[:, None]).to(torch.int32)
    return {
        "topk_indices": topk_idx,
        "query_start_loc": qsl.to(torch.int32).cuda(),
        "seq_lens": seq.to(torch.int32).cuda(),
        "gather_lens": gather.to(torch.int32).cuda(),
        "M": M, "N": N,
        "idx": torch.empty(tokens, width, dtype=torch.int32, device="cuda"),
        "lens": torch.empty(tokens, dtype=torch.int32, device="cuda"),
    }


def gather_call(fn: Callable, s: dict[str, Any], out: torch.Tensor | None = None) -> Callable[[], None]:
    o = s["out"] if out is None else out
    return lambda: fn(o, s["k_cache"], s["seq_lens"], s["gather_lens"], s["block_table"],
                      s["block_size"], s["offset"])


def combine_call(fn: Callable, s: dict[str, Any], out=None) -> Callable[[], Any]:
    idx, lens = (s["idx"], s["lens"]) if out is None else out
    return lambda: fn(s["topk_indices"], s["query_start_loc"], s["seq_lens"], s["gather_lens"],
                      WINDOW, RATIO, TOPK, s["M"], s["N"], out=(idx, lens))


# ---------------------------------------------------------------- implementations -------
def bench_capability() -> tuple[int, int]:
    """The GPU's compute capability, or $DEEPINFER_BENCH_CAPABILITY ("8.0") to check on a
    newer GPU which baselines a run on an older one leaves out (scripts/device/
    bench_as_ampere.sh). It only steers that choice: every kernel still runs natively, and
    the report records the variable with the run's other DEEPINFER_* settings."""
    forced = os.environ.get("DEEPINFER_BENCH_CAPABILITY")
    if forced:
        major, _, minor = forced.partition(".")
        return int(major), int(minor or 0)
    return torch.cuda.get_device_capability()


def upstream_gather_unsupported(capability: tuple[int, int]) -> str | None:
    """Why upstream's gather cannot run on a GPU of this compute capability, or None.

    Its Triton kernel decodes through ``tl.float8e4nv``, which Triton compiles only for SM89
    and newer: on an A100 / A6000 the first call would fail to compile. The benchmark then
    leaves its rows out (and says so) instead of losing every gather row to the error."""
    if tuple(capability) < (8, 9):
        return (f"needs SM89+ (tl.float8e4nv); this GPU is sm_{capability[0]}{capability[1]} "
                "(upstream's combine has no FP8 and still runs)")
    return None


class _Skipped(Exception):
    """A baseline left out on purpose (--ours-only)."""


class Impls:
    """Resolves the implementations once; ``missing`` says why one is absent."""

    def __init__(self, tree: str | None, sm_count: int | None, baselines: bool = True):
        self.gather: dict[str, Callable] = {}
        self.combine: dict[str, Callable] = {}
        self.missing: dict[str, str] = {}
        self.upstream_mod = None
        self.upstream_version: str | None = None  # of the tree upstream's kernels came from
        if not baselines:
            self.missing["baselines"] = "not run (--ours-only)"
        try:
            if not baselines:
                raise _Skipped()
            mod = upstream_import.import_upstream(upstream_import.CACHE_UTILS, tree)
            self.upstream_mod = mod
            self.upstream_version = upstream_import.tree_version(upstream_import.find_tree(tree))
            from vllm.utils.import_utils import has_cutedsl  # type: ignore[import-not-found]

            if has_cutedsl():
                self.missing["upstream gather note"] = (
                    "cutlass DSL present: upstream's public gather would take the CuTeDSL "
                    "path; the Triton kernel object is called directly")
            kern = mod._DEQUANTIZE_AND_GATHER_K_CACHE_KERNEL
            why_not = upstream_gather_unsupported(bench_capability())
            if why_not:
                self.missing["upstream gather"] = why_not
            else:
                self.gather["upstream"] = (
                    lambda out, kc, sl, gl, bt, bs, off: kern(out, kc, sl, gl, bt, bs, off, use_fnuz=False))
            self.combine["upstream"] = mod.combine_topk_swa_indices
        except _Skipped:
            pass
        except Exception as e:  # recorded, the run goes on
            self.missing["upstream"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        try:
            if not baselines:
                raise _Skipped()
            from deepinfer_sm80.triton_portable import dequantize_and_gather_k_cache as pg

            self.gather["portable"] = pg
        except _Skipped:
            pass
        except Exception as e:
            self.missing["portable"] = f"{type(e).__name__}: {e}"
        try:
            from deepinfer_sm80 import _ext  # type: ignore[import-not-found]

            _ext.load()  # ImportError saying how to build, when _C is absent
            from deepinfer_sm80.ops import cache as ours  # type: ignore[import-not-found]
            from deepinfer_sm80.ops import index as ours_index  # type: ignore[import-not-found]

            self.gather["ours"] = ours.dequantize_and_gather_k_cache
            self.combine["ours"] = ours_index.combine_topk_swa_indices
            if sm_count:  # same kernels, grid sized for another GPU's SM count
                tag = f"ours@{sm_count}SM"
                self.gather[tag] = functools.partial(ours.dequantize_and_gather_k_cache,
                                                     sm_count=sm_count)
                self.combine[tag] = functools.partial(ours_index.combine_topk_swa_indices,
                                                      sm_count=sm_count)
        except Exception as e:
            self.missing["ours"] = f"{type(e).__name__}: {e}"
        self.sm_count = sm_count


def upstream_sm80_compile_check(report: common.Report, mod) -> None:
    """AOT-compile upstream's two kernels for cuda 80: gather must fail (fp8e4nv), combine
    must compile (so it is its own portable baseline)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def sig_for(fn, ptr_types, constexprs):
        sig = {}
        for name in fn.arg_names:
            if name in constexprs:
                sig[name] = "constexpr"
            elif name in ptr_types:
                sig[name] = ptr_types[name]
            else:
                sig[name] = "i32"
        return sig

    g_fn = mod.DequantizeAndGatherKCacheKernel.kernel
    g_const = dict(max_blocks_per_seq=1024, fp8_dim=448, bf16_dim=64, scale_dim=8, quant_block=64,
                   cache_block_size=64, token_data_size=576, block_stride=37440, output_dim=512,
                   fp8_max=448.0, n_quant_blocks=7, use_fnuz=False)
    g_ptr = {"out_ptr": "*bf16", "k_cache_ptr": "*u8", "seq_lens_ptr": "*i32",
             "block_table_ptr": "*i32", "gather_lens_ptr": "*i32"}
    c_fn = mod.CombineTopkSwaIndicesKernel.kernel
    c_const = dict(TOP_K=TOPK, COMPRESS_RATIO=RATIO, WINDOW_SIZE=WINDOW, IMAGE_WIDTH=0, PADDED_TOP_K=512)
    c_ptr = {n: "*i32" for n in c_fn.arg_names if n.endswith("_ptr")}
    for label, fn, ptr, const, expect_ok in (("gather", g_fn, g_ptr, g_const, False),
                                            ("combine", c_fn, c_ptr, c_const, True)):
        src = ASTSource(fn=fn, signature=sig_for(fn, ptr, const), constexprs=const)
        try:
            triton.compile(src, target=GPUTarget("cuda", 80, 32))
            ok, detail = True, "compiled"
        except Exception as e:
            ok, detail = False, str(e).strip().splitlines()[-1][:120]
        report.check(f"upstream {label} kernel AOT-compiles for cuda 80 == {expect_ok}",
                     ok == expect_ok, detail)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, int]:
    if a.dtype in (torch.bfloat16, torch.float16):
        a, b = a.view(torch.int16), b.view(torch.int16)
    diff = int((a != b).sum())
    return diff == 0, diff


# ---------------------------------------------------------------- benchmarks -------------
def _baseline_ran(report: common.Report, what: str, name: str, call: Callable[[], Any]) -> bool:
    """Runs ``call`` once (the correctness pass). Our kernels' errors propagate; a baseline
    that fails is recorded as a failed check and left out of the timing, so that one broken
    baseline does not take every row of the shape with it."""
    try:
        call()
        torch.cuda.synchronize()
        return True
    except Exception as e:  # a baseline's failure is recorded; the others go on
        if name.startswith("ours"):
            raise
        traceback.print_exc()
        report.check(f"{what}: baseline ran", False, f"{type(e).__name__}: {str(e)[:200]}")
        return False


def bench_gather(report: common.Report, impls: Impls, copy_gbps: float, quick: bool,
                 all_shapes: bool = False, shapes: list[tuple[int, int]] | None = None) -> None:
    order = [k for k in impls.gather if k.startswith("ours")] + \
        [k for k in ("upstream", "portable") if k in impls.gather]
    cases = shapes or (GATHER_CASES[:2] if quick and not all_shapes else GATHER_CASES)
    for reqs, n in cases:
        gen = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
        per_set = reqs * n * (ENTRY_BYTES + 2 * HEAD)
        nsets = common.rotation_count(per_set, max_sets=4)
        sets = [make_gather_set(reqs, n, gen) for _ in range(nsets)]
        shape = f"{reqs} x {n:,}"
        # correctness on set 0: every implementation, outputs poisoned with NaN
        outs = {}
        for name in list(order):
            o = torch.full_like(sets[0]["out"], float("nan"))
            if not _baseline_ran(report, f"gather {shape} {name}", name,
                                 gather_call(impls.gather[name], sets[0], o)):
                order.remove(name)
                continue
            outs[name] = o
            report.check(f"gather {shape} {name}: every output element written",
                         not bool(o.isnan().any()))
        exact = {}
        if "upstream" in outs:
            for name in order:
                if name != "upstream":
                    ok, diff = bits_equal(outs[name], outs["upstream"])
                    exact[name] = ok
                    report.check(f"gather {shape} {name} bit-exact vs upstream", ok,
                                 f"{diff} differing bf16 elements" if diff else "")
        del outs
        times = {}
        for name in order:
            t = common.graph_time([gather_call(impls.gather[name], s) for s in sets],
                                  min_calls=common.CALLS_PER_REPLAY, replays=10 if quick else 30)
            times[name] = t
        base = times.get("upstream")
        for name in order:
            t = times[name]
            bw = common.gbps(per_set, t.median_us)
            report.add(kernel="dequantize_and_gather_k_cache", shape=shape, impl=name,
                       median_us=t.median_us, iqr_us=f"{t.p25_us:.1f}-{t.p75_us:.1f}",
                       gbps=bw, pct_copy=100.0 * bw / copy_gbps,
                       speedup_vs_upstream=(base.median_us / t.median_us) if base else None,
                       speedup_vs_portable=(times["portable"].median_us / t.median_us)
                       if "portable" in times else None,
                       exact_vs_upstream=exact.get(name, True if name == "upstream" else None),
                       sets=len(sets), timing=t.as_dict())
            print(f"gather {shape:>10} {name:>9}: {t.median_us:9.1f} us  {bw:7.0f} GB/s "
                  f"({100 * bw / copy_gbps:5.1f}% of copy)", flush=True)
        same_bytes_row(report, "dequantize_and_gather_k_cache", shape, per_set, copy_gbps)
        same_mix_row(report, shape, reqs * n, copy_gbps)
        del sets
        torch.cuda.empty_cache()


def reference_row(report: common.Report, kernel: str, shape: str, impl: str, nbytes: int,
                  t: common.Timing, copy_gbps: float) -> None:
    """One context row (a copy measured next to the kernels): time, GB/s, % of the ceiling."""
    bw = common.gbps(nbytes, t.median_us)
    report.add(kernel=kernel, shape=shape, impl=impl, median_us=t.median_us,
               iqr_us=f"{t.p25_us:.2f}-{t.p75_us:.2f}", gbps=bw, pct_copy=100.0 * bw / copy_gbps,
               timing=t.as_dict())
    print(f"{kernel[:7]} {shape:>16} {impl[:18]}: {t.median_us:8.2f} us  {bw:7.0f} GB/s "
          f"({100 * bw / copy_gbps:5.1f}% of copy)", flush=True)


def same_bytes_row(report: common.Report, kernel: str, shape: str, nbytes: int,
                   copy_gbps: float) -> None:
    """Reference row: an elementwise copy kernel moving the same bytes (half read, half
    written), graph-replayed like the kernels: the copy ceiling at this size."""
    reference_row(report, kernel, shape, "copy, same bytes", nbytes,
                  common.same_bytes_copy_time(nbytes), copy_gbps)


def same_mix_row(report: common.Report, shape: str, rows: int, copy_gbps: float) -> None:
    """Reference rows for the gather's read:write mix (bench/mixed_copy.py), without the
    gather and the decode: contiguous rows read at 584 bytes and written at 1024 (a simple
    masked kernel), and 16-byte chunks read 9 : written 16 (the best of three shapes: what
    the memory system gives this mix). Two more with the gather's page placement (random
    64-entry cache pages through a block table, ``rows`` entries): the same page bytes read
    in 2 KB chunks (``chunk_pages_time``, 2 warps per half page), and the faithful record ->
    row copy (``records_widen_time``, every output byte computed from loaded bytes, one warp
    per four records: the gather's traffic without the e4m3 arithmetic)."""
    try:
        import mixed_copy
        t = mixed_copy.widen_rows_time(rows, ENTRY_BYTES, 2 * HEAD)
        tc, moved, how = mixed_copy.chunk_mix_best(rows * (ENTRY_BYTES + 2 * HEAD))
        tp, moved_p = mixed_copy.chunk_pages_time(rows, num_warps=2)
        tr = mixed_copy.records_widen_time(rows, per_prog=4, num_warps=1)
    except Exception as e:  # triton missing or failing: the rows are context, not results
        report.check(f"gather {shape}: same-mix copy rows", False, f"{type(e).__name__}: {e}")
        return
    reference_row(report, "dequantize_and_gather_k_cache", shape,
                  "copy, same read:write mix (584 B in, 1024 B out per row)",
                  rows * (ENTRY_BYTES + 2 * HEAD), t, copy_gbps)
    reference_row(report, "dequantize_and_gather_k_cache", shape,
                  f"copy, 9:16 read:write mix ({how}; bytes within 0.1%)", moved, tc, copy_gbps)
    reference_row(report, "dequantize_and_gather_k_cache", shape,
                  "copy, 9:16 chunks from the random cache pages (2048 B, 2 warps)", moved_p, tp, copy_gbps)
    reference_row(report, "dequantize_and_gather_k_cache", shape,
                  "copy, records -> rows from the random cache pages, faithful (1 warp per 4)",
                  rows * (ENTRY_BYTES + 2 * HEAD), tr, copy_gbps)


def bench_combine(report: common.Report, impls: Impls, copy_gbps: float, quick: bool,
                  all_shapes: bool = False) -> None:
    order = [k for k in impls.combine if k.startswith("ours")] + \
        [k for k in ("upstream",) if k in impls.combine]
    for tokens, reqs in COMBINE_CASES[:1] if quick and not all_shapes else COMBINE_CASES:
        gen = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
        per_set = tokens * (TOPK * 4 + WIDTH * 4 + 4)
        nsets = common.rotation_count(per_set)
        sets = [make_combine_set(tokens, reqs, gen) for _ in range(nsets)]
        shape = f"T={tokens}, {reqs} req"
        outs = {}
        for name in list(order):
            idx = torch.full_like(sets[0]["idx"], 0x7EEEEEEE)
            lens = torch.full_like(sets[0]["lens"], 0x7EEEEEEE)
            if not _baseline_ran(report, f"combine {shape} {name}", name,
                                 combine_call(impls.combine[name], sets[0], (idx, lens))):
                order.remove(name)
                continue
            outs[name] = (idx, lens)
        exact = {}
        if "upstream" in outs:
            ui, ul = outs["upstream"]
            report.check(f"combine {shape} upstream: output fully written (no poison left)",
                         not bool((ui == 0x7EEEEEEE).any() or (ul == 0x7EEEEEEE).any()))
            for name in order:
                if name != "upstream":
                    i, l = outs[name]
                    ok = torch.equal(i, ui) and torch.equal(l, ul)
                    exact[name] = ok
                    report.check(f"combine {shape} {name} bit-exact vs upstream", ok,
                                 f"{int((i != ui).sum())} idx / {int((l != ul).sum())} lens differ"
                                 if not ok else "")
        # top-k entries each token reads: min((pos + 1) // RATIO, TOPK) (pos >= PREFIX)
        qlen = tokens // reqs
        pos = torch.arange(PREFIX, PREFIX + qlen)
        topk_read = reqs * int(torch.clamp((pos + 1) // RATIO, max=TOPK).sum()) * 4
        bytes_moved = topk_read + tokens * (WIDTH * 4 + 4)
        del outs
        times = {name: common.graph_time([combine_call(impls.combine[name], s) for s in sets],
                                         min_calls=common.CALLS_PER_REPLAY, replays=10 if quick else 30)
                 for name in order}
        base = times.get("upstream")
        for name in order:
            t = times[name]
            bw = common.gbps(bytes_moved, t.median_us)
            report.add(kernel="combine_topk_swa_indices", shape=shape, impl=name,
                       median_us=t.median_us, iqr_us=f"{t.p25_us:.2f}-{t.p75_us:.2f}",
                       gbps=bw, pct_copy=100.0 * bw / copy_gbps,
                       speedup_vs_upstream=(base.median_us / t.median_us) if base else None,
                       exact_vs_upstream=exact.get(name, True if name == "upstream" else None),
                       sets=len(sets), timing=t.as_dict())
            print(f"combine {shape:>16} {name:>9}: {t.median_us:8.2f} us  {bw:7.0f} GB/s", flush=True)
        # L2-warm: one input set called repeatedly (how the upstream figures were
        # taken, and the production case: the top-k buffer comes straight from the top-k
        # kernel, still in L2)
        for name in [k for k in ("ours", "upstream") if k in order]:
            t = common.graph_time([combine_call(impls.combine[name], sets[0])], min_calls=common.CALLS_PER_REPLAY,
                                  replays=10 if quick else 30)
            bw = common.gbps(bytes_moved, t.median_us)
            report.add(kernel="combine_topk_swa_indices", shape=shape, impl=f"{name}, L2-warm",
                       median_us=t.median_us, iqr_us=f"{t.p25_us:.2f}-{t.p75_us:.2f}", gbps=bw,
                       pct_copy=100.0 * bw / copy_gbps, sets=1, timing=t.as_dict())
            print(f"combine {shape:>16} {name + ', L2-warm':>9}: {t.median_us:8.2f} us", flush=True)
        same_bytes_row(report, "combine_topk_swa_indices", shape, bytes_moved, copy_gbps)
        reference_row(report, "combine_topk_swa_indices", shape, "copy, same bytes, L2-warm",
                      bytes_moved, common.same_bytes_copy_time(bytes_moved, warm=True), copy_gbps)
        del sets
        torch.cuda.empty_cache()


def parse_gather_shape(text: str) -> tuple[int, int]:
    """'REQSxN' -> (requests, entries per request), both positive."""
    try:
        reqs, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"gather shape {text!r}: expected REQSxN, e.g. 1x196608") from None
    if reqs <= 0 or n <= 0:
        raise argparse.ArgumentTypeError(f"gather shape {text!r}: both numbers must be positive")
    return reqs, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="gather/combine benchmark (GPU)")
    ap.add_argument("--tree", help="vLLM source tree for the upstream baseline")
    ap.add_argument("--quick", action="store_true",
                    help="gather 1 x 49,152 and 4 x 12,288, combine T=1536 only, 10 replays")
    ap.add_argument("--only", choices=("gather", "combine"), help="one kernel's cases only")
    ap.add_argument("--all-shapes", action="store_true",
                    help="with --quick: every shape (still the quick replay counts)")
    ap.add_argument("--gather-shape", action="append", type=parse_gather_shape, metavar="REQSxN",
                    help="gather shape(s) to time instead of the standard ones, e.g. 1x196608 "
                         "(repeatable; a diagnostic: implies --only gather and --no-doc)")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--sm-count", type=int, default=108,
                    help="also time our kernels with the grid sized for this SM count "
                         "(default 108, an A100's; 0: only the device's own)")
    ap.add_argument("--ours-only", action="store_true",
                    help="time only our kernels (variant sweeps); no upstream/portable baselines")
    args = ap.parse_args(argv)
    if args.gather_shape:
        if args.only == "combine":
            ap.error("--gather-shape times the gather; it cannot go with --only combine")
        args.only, args.no_doc = "gather", True
    common.require_cuda()
    impls = Impls(args.tree, args.sm_count, baselines=not args.ours_only)
    report = common.Report(
        name="bench_cache",
        title="KV-cache gather and index combine (issue 4)",
        columns=["kernel", "shape", "impl", "median_us", "iqr_us", "gbps", "pct_copy",
                 "speedup_vs_upstream", "speedup_vs_portable", "exact_vs_upstream"],
    )
    report.meta["copy"] = common.copy_bandwidth()
    copy_gbps = report.meta["copy"]["gbps_read_plus_write"]
    print(f"device-to-device copy: {copy_gbps:.0f} GB/s (read + write; by method: "
          f"{report.meta['copy'].get('by_method_gbps')})", flush=True)
    report.meta["implementations_missing"] = impls.missing
    for k, v in impls.missing.items():
        report.notes.append(f"not run: {k}: {v}")
    report.meta["upstream_vllm_version"] = impls.upstream_version
    report.notes.append(
        f"upstream = vLLM {impls.upstream_version or '(none imported)'} Triton kernels "
        "imported from the applied tree; portable = "
        "deepinfer_sm80.triton_portable (software e4m3); combine's portable baseline is "
        "upstream's kernel (no FP8, compiles for SM80)")
    report.notes.append(
        "times: CUDA-graph replay, median per call (iqr = 25th-75th percentile), input sets "
        "rotated to exceed 2x L2; 'copy, same bytes' = graph-replayed bitwise_not reading half "
        "and writing half of the row's bytes (the copy ceiling at this size); 'copy, same read:write mix' = contiguous "
        "584-byte rows -> 1024-byte rows (masked loads; not a ceiling); 'copy, 9:16 read:write mix' = 16-byte-aligned "
        "chunks, 9 read per 16 written, the best of three shapes (bench/mixed_copy.py); 'from the random cache pages' = "
        "the same page placement as the gather's inputs (64-entry pages in random order through a block table): "
        "'9:16 chunks' reads each half page as 9 2 KB chunks and writes 16, 'records -> rows, faithful' writes each "
        "record as a 1 KB row whose every byte is computed from loaded bytes (NoPE widened 1 -> 2 bytes and keyed by "
        "the scale word, RoPE copied; no e4m3 arithmetic); gather bytes = 584 read + "
        "1024 written per entry; combine bytes = top-k entries read + 640x4 B row + 4 B length written per token")
    if impls.upstream_mod is not None:
        try:
            upstream_sm80_compile_check(report, impls.upstream_mod)
        except Exception as e:
            report.check("upstream kernels AOT compile check ran", False, repr(e)[:200])
    failed = False
    for fn, extra in ((bench_gather, {"shapes": args.gather_shape}), (bench_combine, {})):
        if args.only and fn.__name__ != f"bench_{args.only}":
            continue
        try:
            fn(report, impls, copy_gbps, args.quick, args.all_shapes, **extra)
        except Exception as e:
            traceback.print_exc()
            report.check(f"{fn.__name__} completed", False, repr(e)[:300])
            failed = True
    # the ceiling: the higher of two copy measurements (start and end of the run), so a
    # clock change during the run cannot flatter the percentages
    end_copy = common.copy_bandwidth()
    report.meta["copy_end"] = end_copy
    print(f"device-to-device copy at the end: {end_copy['gbps_read_plus_write']:.0f} GB/s", flush=True)
    if end_copy["gbps_read_plus_write"] > copy_gbps:
        report.meta["copy"], report.meta["copy_start"] = end_copy, report.meta["copy"]
        copy_gbps = end_copy["gbps_read_plus_write"]
        for row in report.rows:
            if row.get("gbps") is not None:
                row["pct_copy"] = 100.0 * row["gbps"] / copy_gbps
    return 1 if (report.finish(not args.no_doc) or failed) else 0


if __name__ == "__main__":
    sys.exit(main())
