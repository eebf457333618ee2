"""The indexer's ``decode_topk`` when the block table is as wide as ``max_model_len``, as vLLM
passes it with every decode step, against a block table as wide as the longest context.

The scorer writes INT64_MIN for every column past a row's context, and until 2026-12-03 the
row top-k read each whole row: at max_model_len 1M (262,144 compressed columns) a batch-1 decode
read 2 MB of keys per row several times on one SM, whatever the context. Since then the top-k
reads only the columns [0, hi) of each row (``row_topk_indices(..., hi=...)``); the old
behaviour stays reachable with ``$DEEPINFER_INDEXER_WINDOW=0``. Same inputs, same run, the
indices checked equal across the three:

* ``narrow``: block table [B, ceil(ctx / 64)] (what the other benchmarks time);
* ``wide, window``: block table [B, width / 64], pages past the context 0 (vLLM's zeros);
* ``wide, whole rows``: the same, ``$DEEPINFER_INDEXER_WINDOW=0``;
* ``wide, window, one block per row``: the window without the row top-k's split launches for
  long windows and few rows (``$DEEPINFER_ROW_TOPK_SPLIT=0``).

Also the scorer alone over the narrow and the wide columns, and the row top-k alone over the
wide keys with and without the window. Inputs as in bench_indexer_keys.py (random codes, fresh
per run, sets rotated past twice the L2); CUDA-graph replay, median per call.

    python bench/bench_indexer_width.py [--quick] [--no-doc]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from bench_indexer_keys import BS, TOPK, make_set  # noqa: E402
from deepinfer_sm80.ampere import indexer as I  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402

# (requests, rows per request, context in compressed positions, heads, block-table columns)
# 262,144 columns: max_model_len 1,048,576 at compress ratio 4; 32,768: 131,072. Context 262,144:
# a request 1M tokens long.
SHAPES = [(1, 1, 2048, 64, 262144), (1, 1, 16384, 64, 262144), (1, 1, 262144, 64, 262144),
          (1, 6, 65536, 64, 262144), (1, 6, 2048, 64, 262144),
          (8, 1, 8192, 64, 262144), (64, 1, 2048, 64, 262144), (1, 1, 2048, 64, 32768),
          (128, 1, 4096, 32, 32768), (256, 1, 2048, 64, 262144), (64, 6, 2048, 64, 262144),
          (64, 1, 65536, 64, 262144), (16, 6, 65536, 64, 262144), (16, 6, 8192, 32, 32768),
          (128, 1, 65536, 64, 262144), (256, 1, 16384, 64, 262144)]
QUICK = [(1, 1, 2048, 64, 262144), (64, 1, 2048, 64, 262144)]


def widen(s, B, width):
    bt = torch.zeros(B, width // BS, dtype=torch.int32, device="cuda")
    bt[:, : s["bt"].shape[1]] = s["bt"]
    s["bt_wide"] = bt
    return s


def wide_sets(B, NN, ctx, H, width, g, key_buffers=1):
    """Input sets of one shape (bench_indexer_keys.make_set, each with ``bt_wide``), as many as
    rotate past twice the L2: each holds the requests' pages and ``key_buffers`` int64 key tiles
    of the decode (one column tile of its tile budget)."""
    rows = B * NN
    tile = max(BS, (I.decode_tile_budget(rows) // max(1, rows * 8)) // BS * BS)
    per_set = B * -(-ctx // BS) * BS * (128 + 4) + rows * min(tile, width) * 8 * key_buffers
    return [widen(make_set(B, NN, ctx, H, g), B, width)
            for _ in range(common.rotation_count(per_set, max_sets=6))], tile


def with_env(env: dict, fn):
    """fn() with the environment variables ``env`` set (and restored after)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def topk_call(s, B, NN, H, bt_key, window, split="1", budget=None, layout="native"):
    """``budget``: decode_topk's tile_budget (the key buffer's bytes), None its default.
    ``layout``: "native" ([B, next_n] rows); "flat": the rows as vLLM's indexer metadata
    flattens them where the platform has no native multi-row decode (SM80 for next_n > 2,
    ``_supports_native_decode`` in v1/attention/backends/mla/indexer.py): one single-token row
    per query token, each with its own copy of its request's block-table row and its own
    length; "regrouped": those flattened buffers as the indexer adapter passes them ([B, next_n]
    views, every next_n-th block-table row: ``_flattened_uniform_rows`` in
    overlay/vllm/models/deepseek_v4/nvidia/ampere_indexer.py)."""
    if layout == "regrouped":  # the indexer adapter's views of vLLM's flattened rows
        q4 = s["q"].view(B, NN, H, -1)
        lens, bt = s["lens"].reshape(B * NN).view(B, NN), s[bt_key + "_flat"][::NN]
    elif layout == "flat":
        q4 = s["q"].view(B * NN, 1, H, -1)
        lens, bt = s["lens"].reshape(B * NN), s[bt_key + "_flat"]
    else:
        q4, lens, bt = s["q"].view(B, NN, H, -1), s["lens"], s[bt_key]
    env = {"DEEPINFER_INDEXER_WINDOW": window, "DEEPINFER_ROW_TOPK_SPLIT": split}
    kw = {} if budget is None else {"tile_budget": budget}
    return lambda: with_env(env, lambda: I.decode_topk(
        q4, s["w"], s["pages"], lens, bt, BS, TOPK, s["idx"], scorer="cuda", **kw))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--shapes", default="",
                    help="comma-separated indices into SHAPES (default all)")
    ap.add_argument("--budgets", default="", help="comma-separated key-buffer sizes in MB: more "
                    "'wide, window' variants with that tile budget (default budget: "
                    f"{I.DEFAULT_TILE_BUDGET >> 20} MB of int64 keys up to 64 rows, 512 KB per row "
                    f"up to {I.DECODE_TILE_BUDGET_MAX >> 20} MB: decode_tile_budget)")
    ap.add_argument("--label", default="", help="prefix of the impl names (e.g. the build)")
    args = ap.parse_args(argv)
    # $DEEPINFER_INDEXER_WINDOW=0 from the caller: the build has no window (a base build in a
    # same-run A/B), so only the whole-row variants run
    whole_only = os.environ.get("DEEPINFER_INDEXER_WINDOW") == "0"
    lbl = f"{args.label}: " if args.label else ""
    common.require_cuda()
    report = common.Report(
        name="bench_indexer_width",
        title="Indexer decode_topk with a max_model_len-wide block table",
        columns=["what", "shape", "impl", "median_us", "vs_whole_rows"])
    report.notes.append(
        f"top-k {TOPK}, CUDA scorer; width = block-table columns x {BS} (compressed positions); "
        "wide tables have page 0 past each context; 'whole rows' = $DEEPINFER_INDEXER_WINDOW=0 "
        "(the top-k read every column, as before 2026-12-03); CUDA-graph replay, median per "
        "call, input sets rotated past 2x L2")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    shapes = QUICK if args.quick else SHAPES
    if args.shapes:
        shapes = [SHAPES[int(i)] for i in args.shapes.split(",")]
    for B, NN, ctx, H, width in shapes:
        shape = f"{B} req x {NN} rows, ctx {ctx}, {H} heads, width {width}"
        rows = B * NN
        sets, tile = wide_sets(B, NN, ctx, H, width, g)
        s0 = sets[0]
        variants = [("wide, whole rows", "bt_wide", "0", "1", None, "native"),
                    ("wide, window", "bt_wide", "1", "1", None, "native"),
                    ("wide, window, one block per row", "bt_wide", "1", "0", None, "native"),
                    ("narrow", "bt", "0" if whole_only else "1", "1", None, "native")]
        variants += [(f"wide, window, keys {mb} MB", "bt_wide", "1", "1", int(mb) << 20, "native")
                     for mb in args.budgets.split(",") if mb]
        if NN > 1 and not whole_only:  # vLLM's flattened layout on SM80 (next_n > 2)
            for st in sets:
                st["bt_flat"] = st["bt"].repeat_interleave(NN, 0)
                st["bt_wide_flat"] = st["bt_wide"].repeat_interleave(NN, 0)
            variants += [("narrow, flattened rows", "bt", "1", "1", None, "flat"),
                         ("wide, window, flattened rows", "bt_wide", "1", "1", None, "flat"),
                         ("narrow, flattened rows regrouped by the adapter", "bt", "1", "1", None,
                          "regrouped")]
        if whole_only:
            variants = [v for v in variants if not v[0].startswith("wide, window")]
        got = {}
        for name, bt_key, window, split, budget, layout in variants:
            s0["idx"].fill_(-7)
            topk_call(s0, B, NN, H, bt_key, window, split, budget, layout)()
            got[name] = s0["idx"].clone()
        report.check(f"{shape}: the same indices with the wide table",
                     all(torch.equal(v, got["narrow"]) for v in got.values()))
        times = {}
        for name, bt_key, window, split, budget, layout in variants:
            t = common.graph_time([topk_call(s, B, NN, H, bt_key, window, split, budget, layout)
                                   for s in sets],
                                  min_calls=common.CALLS_PER_REPLAY)
            times[name] = t.median_us
            report.add(what="decode_topk", shape=shape, impl=lbl + name, median_us=t.median_us,
                       vs_whole_rows=times["wide, whole rows"] / t.median_us)
            print(report.rows[-1], flush=True)
        # the scorer alone over the narrow and the wide columns (the decode's scorer choice)
        for name, n_cols in (("narrow", -(-ctx // BS) * BS), ("wide", width)):
            n_tile = min(tile, n_cols)
            rpr = I.decode_rows_per_req(NN, rows, n_tile, sms)
            buf = torch.empty(rows, n_tile, dtype=torch.int64, device="cuda")
            bt_key = "bt" if name == "narrow" else "bt_wide"
            row_req = torch.arange(B, device="cuda", dtype=torch.int32).repeat_interleave(NN)
            lo = torch.zeros(rows, dtype=torch.int32, device="cuda")

            def mk(s, n_tile=n_tile, rpr=rpr, buf=buf, bt_key=bt_key, row_req=row_req, lo=lo):
                kw = {"rows_per_req": rpr} if rpr else {}
                return lambda: OI.indexer_paged_keys(
                    s["q"], s["w"], col0=0, n_cols=n_tile, lo=lo, hi=s["hi"], out=buf,
                    pages=s["pages"], block_table=s[bt_key], row_req=row_req, block_size=BS, **kw)
            t = common.graph_time([mk(s) for s in sets], min_calls=common.CALLS_PER_REPLAY)
            report.add(what=f"scorer, first column tile ({n_tile} columns)", shape=shape,
                       impl=lbl + name, median_us=t.median_us)
            print(report.rows[-1], flush=True)
            if name == "wide":  # the row top-k alone on these keys, whole rows and window
                keys = buf
                mk(s0)()
                want = OI.row_topk_keys(keys, TOPK)
                kinds = [("whole rows", {}, "1")]
                if not whole_only:
                    report.check(f"{shape}: row top-k with the window equals whole rows",
                                 torch.equal(OI.row_topk_keys(keys, TOPK, hi=s0["hi"]), want))
                    kinds += [("window", {"hi": s0["hi"]}, "1"),
                              ("window, one block per row", {"hi": s0["hi"]}, "0")]
                t_whole = None
                for impl, kw, split in kinds:
                    out = torch.empty(rows, TOPK, dtype=torch.int64, device="cuda")
                    env = {"DEEPINFER_ROW_TOPK_SPLIT": split}
                    t = common.graph_time([lambda kw=kw, out=out, env=env: with_env(
                        env, lambda: OI.row_topk_keys(keys, TOPK, out=out, **kw))],
                                          min_calls=common.CALLS_PER_REPLAY)
                    t_whole = t.median_us if t_whole is None else t_whole
                    report.add(what=f"row top-k of the first tile's keys ({n_tile} columns)",
                               shape=shape, impl=lbl + impl, median_us=t.median_us,
                               vs_whole_rows=t_whole / t.median_us)
                    print(report.rows[-1], flush=True)
        sets = None
        torch.cuda.empty_cache()
    return report.finish(not args.no_doc)


if __name__ == "__main__":
    sys.exit(main())
