"""DeepSeek-V4.1's candidate step in the indexer's ``decode_topk`` with the block table as wide as
``max_model_len``, as vLLM passes it with every decode step, against a table as wide as the
longest context, and against the same call without the step.

V4.1's indexer (32 heads x 128, top-k 512) runs a two-level selection: the candidate-source
layer writes each row's best 2048 blocks of 8 compressed positions (``write``), later indexers
keep only positions in those blocks (``mask``). ``plain``: no candidate step (a V4 indexer's
call, the baseline of the same run). ``$DEEPINFER_CANDIDATE_KERNEL=0`` forces the torch form of
the step (per-tile torch operations over every column of the table) where the build has the
CUDA one. Same inputs across the variants; the indices (and the written blocks) are checked equal
between the narrow and the wide table. Inputs as in bench_indexer_keys.py (random codes, fresh
per run, sets rotated past twice the L2); CUDA-graph replay, median per call. Also
``prefill_topk`` as the candidate source and as a masking layer, the step through the extension
or in its torch form. And the candidate source over many rows (``--chunks`` alone): in chunks of
requests (``CANDIDATE_DECODE_BUDGET``, the default) against one pass, the same blocks and indices,
times and peak temporary memory.

    python bench/bench_v41_width.py [--quick | --chunks] [--no-doc] [--label L]
"""
from __future__ import annotations

import argparse
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from bench_indexer_keys import BS, TOPK  # noqa: E402
from bench_indexer_width import wide_sets, with_env  # noqa: E402
from deepinfer_sm80.ampere import indexer as I  # noqa: E402

CAND_BLOCKS, CAND_BS = 2048, 8
# (requests, rows per request, context in compressed positions, heads, block-table columns);
# 262,144 columns: max_model_len 1,048,576 at compress ratio 4
SHAPES = [(1, 1, 2048, 32, 262144), (1, 1, 65536, 32, 262144), (1, 6, 4096, 32, 262144),
          (8, 1, 8192, 32, 262144), (64, 1, 2048, 32, 262144), (128, 1, 4096, 32, 32768)]
QUICK = [(1, 1, 2048, 32, 262144), (64, 1, 2048, 32, 262144)]
PREFILL = [(2048, 4096, 32), (4096, 16384, 32)]  # (tokens, compressed positions, heads)
QUICK_PREFILL = [(2048, 4096, 32)]
KERNEL_FORMS = {"cuda": "1", "torch": "0"}
# the candidate source where its block keys exceed CANDIDATE_DECODE_BUDGET: 1,536 plain rows
# (402 MB of keys in one pass, 6 chunks of 256) and 256 requests of 6 DSpark rows (7 chunks)
CHUNK_SHAPES = [(1536, 1, 2048, 32, 262144), (256, 6, 2048, 32, 262144)]
ONE_PASS = {"candidate_budget": 1 << 62}


def call(s, B, NN, H, bt_key, mode, cand, form):
    """One decode_topk; ``mode`` plain / write / mask; ``form``: the step's cuda / torch form."""
    q4 = s["q"].view(B, NN, H, -1)
    env = {"DEEPINFER_CANDIDATE_KERNEL": KERNEL_FORMS[form]}

    def run():
        step = None if mode == "plain" else I.CandidateStep(cand, CAND_BS, write=mode == "write")
        I.decode_topk(q4, s["w"], s["pages"], s["lens"], s[bt_key], BS, TOPK, s["idx"],
                      scorer="cuda", candidates=step)
    return lambda: with_env(env, run)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--chunks", action="store_true",
                    help="only the candidate source in request chunks against one pass")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--label", default="", help="prefix of the impl names (e.g. the build)")
    args = ap.parse_args(argv)
    lbl = f"{args.label}: " if args.label else ""
    common.require_cuda()
    report = common.Report(
        name="bench_v41_width",
        title="V4.1 candidate step in decode_topk with a max_model_len-wide block table",
        columns=["mode", "shape", "impl", "median_us", "vs_plain"])
    report.notes.append(
        f"32 heads, top-k {TOPK}, CUDA scorer, candidate blocks {CAND_BLOCKS} x {CAND_BS}; width = "
        f"block-table columns x {BS}; wide tables have page 0 past each context; plain = no "
        "candidate step (same run); torch = $DEEPINFER_CANDIDATE_KERNEL=0; CUDA-graph replay, "
        "median per call, input sets rotated past 2x L2")
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    if args.chunks:
        chunks(report, g, lbl, CHUNK_SHAPES)
        return report.finish(not args.no_doc)
    for B, NN, ctx, H, width in (QUICK if args.quick else SHAPES):
        shape = f"{B} req x {NN} rows, ctx {ctx}, width {width}"
        rows = B * NN
        sets, _ = wide_sets(B, NN, ctx, H, width, g, key_buffers=2)
        for s in sets:  # the blocks a mask layer reads: those its source layer wrote
            s["cand"] = torch.full((rows, CAND_BLOCKS), -1, dtype=torch.int32, device="cuda")
            with_env({"DEEPINFER_CANDIDATE_KERNEL": "0"}, lambda: I.decode_topk(
                s["q"].view(B, NN, H, -1), s["w"], s["pages"], s["lens"], s["bt"], BS, TOPK,
                s["idx"], scorer="cuda", candidates=I.CandidateStep(s["cand"], CAND_BS, True)))
        s0 = sets[0]
        variants = [(mode, bt_key, form) for mode in ("plain", "write", "mask")
                    for bt_key in ("bt", "bt_wide") for form in ("torch", "cuda")
                    if not (mode == "plain" and form == "cuda")]
        got = {}
        for mode, bt_key, form in variants:
            cand = s0["cand"].clone() if mode != "mask" else s0["cand"]
            if mode == "write":
                cand.fill_(-7)
            s0["idx"].fill_(-7)
            call(s0, B, NN, H, bt_key, mode, cand, form)()
            got[(mode, bt_key, form)] = (s0["idx"].clone(), cand.clone())
        for mode in ("plain", "write", "mask"):
            same = [v for k, v in got.items() if k[0] == mode]
            ok = all(torch.equal(a[0], same[0][0]) and torch.equal(a[1], same[0][1]) for a in same)
            report.check(f"{shape}, {mode}: the same indices and blocks (narrow / wide, torch / cuda)", ok)
        times = {}
        for mode, bt_key, form in variants:
            cands = [s["cand"].clone() if mode == "write" else s["cand"] for s in sets]
            t = common.graph_time([call(s, B, NN, H, bt_key, mode, c, form) for s, c in zip(sets, cands)],
                                  min_calls=common.CALLS_PER_REPLAY)
            table = "narrow" if bt_key == "bt" else "wide"
            times[(mode, table, form)] = t.median_us
            base = times.get(("plain", table, "torch"), t.median_us)
            impl = f"{lbl}{table}" + ("" if mode == "plain" else f", {form}")
            report.add(mode=mode, shape=shape, impl=impl, median_us=t.median_us,
                       vs_plain=t.median_us / base)
            print(report.rows[-1], flush=True)
        sets = None
        torch.cuda.empty_cache()
    prefill(report, g, lbl, QUICK_PREFILL if args.quick else PREFILL)
    if not args.quick:
        chunks(report, g, lbl, CHUNK_SHAPES)
    return report.finish(not args.no_doc)


def chunks(report, g, lbl, shapes):
    """The candidate source (write, the step's kernels) over the wide table in chunks of
    requests (decode_topk's default) and in one pass (``candidate_budget`` unbounded), and the
    plain call: the same indices and blocks; CUDA-graph replay, median per call; the peak
    temporary memory of one eager call (``torch.cuda.max_memory_allocated`` above the inputs)."""
    for B, NN, ctx, H, width in shapes:
        rows = B * NN
        per = I.candidate_decode_requests(B, NN, width, CAND_BS)
        shape = f"{B} req x {NN} rows, ctx {ctx}, width {width}"
        sets, _ = wide_sets(B, NN, ctx, H, width, g, key_buffers=2)
        for s in sets:
            s["cand"] = torch.full((rows, CAND_BLOCKS), -7, dtype=torch.int32, device="cuda")
        variants = {"plain": ("plain", {}), f"chunks of {per} requests": ("write", {}),
                    "one pass": ("write", ONE_PASS)}

        def run(s, mode, kw):
            q4 = s["q"].view(B, NN, H, -1)
            step = None if mode == "plain" else I.CandidateStep(s["cand"], CAND_BS, write=True)
            return lambda: with_env({"DEEPINFER_CANDIDATE_KERNEL": "1"}, lambda: I.decode_topk(
                q4, s["w"], s["pages"], s["lens"], s["bt_wide"], BS, TOPK, s["idx"],
                scorer="cuda", candidates=step, **kw))

        s0, got, peak = sets[0], {}, {}
        for name, (mode, kw) in variants.items():
            run(s0, mode, kw)()  # (compiles, allocator)
            s0["idx"].fill_(-7)
            s0["cand"].fill_(-7)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            run(s0, mode, kw)()
            torch.cuda.synchronize()
            peak[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
            got[name] = (s0["idx"].clone(), s0["cand"].clone())
        a, b = got[f"chunks of {per} requests"], got["one pass"]
        report.check(f"{shape}: chunks of {per} requests and one pass give the same indices and "
                     "blocks", torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
        report.check(f"{shape}: the plain call's indices equal the source layer's",
                     torch.equal(got["plain"][0], a[0]))
        report.notes.append(f"{shape}: peak temporary memory of one eager call, MiB: " + ", ".join(
            f"{k} {v:.1f}" for k, v in peak.items()))
        print(report.notes[-1], flush=True)
        one = None
        for name in ["one pass"] + [k for k in variants if k != "one pass"]:
            mode, kw = variants[name]
            t = common.graph_time([run(s, mode, kw) for s in sets], min_calls=common.CALLS_PER_REPLAY)
            one = one or t.median_us
            report.add(mode="write" if mode == "write" else "plain", shape=shape,
                       impl=f"{lbl}{name}", median_us=t.median_us, vs_plain=t.median_us / one)
            print(report.rows[-1], flush=True)
        report.notes.append(f"{shape}: vs_plain of these rows is against the one-pass call")
        sets = None
        torch.cuda.empty_cache()


def prefill(report, g, lbl, shapes):
    """prefill_topk of the last T tokens of one request (compressed ratio 4: token i sees
    [0, (4 Nk - T + i + 1) // 4)): plain, as the candidate source (write) and as a masking layer
    (mask, the blocks the source wrote), the step through the extension (cuda) or its torch form;
    eager (the step reads its row ranges on the host), CUDA events around each call, median of
    7 after 2 warm-ups."""
    from bench_indexer_prefill import make_k, make_q

    for T, nk, H in shapes:
        shape = f"prefill, {T} tokens, {nk} compressed positions"
        k, ks = make_k(nk, g)
        q, w = make_q(T, H, g)
        i = torch.arange(T, device="cuda")
        ke = ((4 * nk - T + i + 1) // 4).to(torch.int32)
        kss = torch.zeros(T, dtype=torch.int32, device="cuda")
        out = torch.empty(T, TOPK, dtype=torch.int32, device="cuda")
        listed = torch.full((T, CAND_BLOCKS), -1, dtype=torch.int32, device="cuda")

        def run(mode, form):
            cand = torch.full((T, CAND_BLOCKS), -7, dtype=torch.int32, device="cuda")
            step = (None if mode == "plain" else I.CandidateStep(cand, CAND_BS, write=True)
                    if mode == "write" else I.CandidateStep(listed, CAND_BS, write=False))
            with_env({"DEEPINFER_CANDIDATE_KERNEL": KERNEL_FORMS[form]}, lambda: I.prefill_topk(
                q, w, k, ks, kss, ke, TOPK, out, scorer="cuda", candidates=step))
            return cand
        got = {form: (run("write", form), out.clone()) for form in ("torch", "cuda")}
        listed.copy_(got["cuda"][0])
        for form in ("torch", "cuda"):
            run("mask", form)
            got[form] += (out.clone(),)
        report.check(f"{shape}: the same blocks and indices, write and mask (torch / cuda)",
                     all(torch.equal(a, b) for a, b in zip(got["torch"], got["cuda"])))
        base = None
        for mode, form in (("plain", "torch"), ("write", "torch"), ("write", "cuda"),
                           ("mask", "torch"), ("mask", "cuda")):
            ts = []
            for _ in range(9):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                run(mode, form)
                b.record()
                torch.cuda.synchronize()
                ts.append(a.elapsed_time(b) * 1000.0)
            t = sorted(ts[2:])[3]
            base = base or t
            report.add(mode=mode, shape=shape, impl=lbl + ("plain" if mode == "plain" else form),
                       median_us=t, vs_plain=t / base)
            print(report.rows[-1], flush=True)

if __name__ == "__main__":
    sys.exit(main())
