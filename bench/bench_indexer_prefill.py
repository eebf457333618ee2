"""The lightning indexer's prefill step: the CUDA flat scorer (``deepinfer_sm80.ops.indexer.
indexer_flat_keys`` over the gathered K workspace; both kernels: ``rows``, csrc/index/
indexer_rows.cu, blocks of rows sharing K, the default, and ``warp``, indexer_keys.cu's flat
mode, a warp per row) against the Triton scorer it replaces
(``deepinfer_sm80.ampere.indexer_triton.mqa_logits_tile``, flat key mode), same inputs, same
run; and the whole ``prefill_topk`` (row chunks x column tiles, scoring and the running top-k)
with each scorer.

Inputs: a flat FP8 K workspace ([Nk, 128] e4m3 codes without NaN, fp32 scales), 128-wide e4m3
queries, fp32 head weights; fresh random inputs every run.
* scorer rows: one row chunk of ``prefill_topk`` (256 rows) over all Nk columns, every column
  visible; CUDA-graph replay, input sets rotated past twice the L2, median per call.
* prefill_topk rows: the last T tokens of one request whose prompt has 4 x Nk tokens (the
  compressed ratio 4 of V4's indexer layers): token i sees compressed positions
  [0, (4 Nk - T + i + 1) // 4); top-k 512; eager (the step reads the row ranges on the host),
  CUDA events around 3 calls, median of 7.
FLOPs: 2 x 128 x heads per visible (row, column).

    python bench/bench_indexer_prefill.py [--quick] [--sm-count 108]
"""
from __future__ import annotations

import argparse
import sys

import torch

import _paths  # noqa: E402,F401  (overlay/ on sys.path)

import common  # noqa: E402
from deepinfer_sm80.ampere import indexer as I  # noqa: E402
from deepinfer_sm80.ampere.indexer_triton import mqa_logits_tile  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402

D, TOPK = 128, 512

# scorer: (rows, Nk, heads); prefill_topk: (T, Nk, heads)
SCORER = [(256, 16384, 64), (256, 4096, 64), (256, 16384, 32)]
STEP = [(4096, 16384, 64), (2048, 4096, 64)]
QUICK_SCORER = [(256, 16384, 64)]
QUICK_STEP = [(2048, 4096, 64)]


def make_k(nk, g):
    k = torch.randint(0, 256, (nk, D), dtype=torch.uint8, device="cuda", generator=g)
    k[(k & 0x7F) == 0x7F] = 0x38
    return k, torch.rand(nk, device="cuda", generator=g) + 0.5


def make_q(rows, H, g):
    q = torch.randint(0, 256, (rows, H, D), dtype=torch.uint8, device="cuda", generator=g)
    q[(q & 0x7F) == 0x7F] = 0xB8
    return q, torch.randn(rows, H, device="cuda", generator=g) * 0.1


def scorer_set(rows, nk, H, g):
    k, ks = make_k(nk, g)
    q, w = make_q(rows, H, g)
    return dict(q=q, w=w, k=k, ks=ks, lo=torch.zeros(rows, dtype=torch.int32, device="cuda"),
                hi=torch.full((rows,), nk, dtype=torch.int32, device="cuda"),
                out=torch.empty(rows, nk, dtype=torch.int64, device="cuda"), nk=nk)


def scorer_call(impl, s, **kw):
    args = dict(col0=0, n_cols=s["nk"], lo=s["lo"], hi=s["hi"], out=s["out"])
    if impl == "triton":
        return lambda: mqa_logits_tile(s["q"], s["w"], k_flat=s["k"], k_scale=s["ks"], **args)
    return lambda: OI.indexer_flat_keys(s["q"], s["w"], k_codes=s["k"], k_scale=s["ks"], **args, **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sm-count", type=int, default=108,
                    help="also time the CUDA scorer with its grid sized for this SM count")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    common.require_cuda()
    report = common.Report(
        name="bench_indexer_prefill",
        title="Lightning-indexer prefill scorer (flat workspace) and prefill_topk",
        columns=["what", "shape", "impl", "median_us", "tflops", "speedup_vs_triton",
                 "equal_to_triton"])
    report.notes.append(
        "triton = the Triton scorer the CUDA kernel replaces (same contract: flat key mode); "
        "scorer rows: one 256-row chunk over every column (CUDA-graph replay, median per call, "
        "input sets rotated past 2x L2); prefill_topk rows: the last T tokens of one request of "
        f"4 x Nk tokens, top-k {TOPK} (triton: Triton scorer + torch.topk merges; cuda: CUDA "
        "scorer + CUDA row top-k; eager, events around 3 calls, median of 7); "
        "TFLOPS = 2 x 128 x heads per visible (row, column); cuda = the default (the rows kernel), "
        "cuda warp = the warp-per-row kernel it replaced")
    common.warm_gpu()
    g = torch.Generator(device="cuda").manual_seed(common.fresh_seed())
    for rows, nk, H in (QUICK_SCORER if args.quick else SCORER):
        shape = f"{rows} rows x {nk} cols, {H} heads"
        flops = 2.0 * rows * nk * H * D
        per_set = nk * (D + 4) + rows * nk * 8
        sets = [scorer_set(rows, nk, H, g) for _ in range(common.rotation_count(per_set, max_sets=8))]
        s0 = sets[0]
        scorer_call("cuda", s0, kernel="warp")()
        k_warp = s0["out"].clone()
        scorer_call("cuda", s0)()
        k_cuda = s0["out"].clone()
        report.check(f"{shape}: the rows kernel's keys bit-equal to the warp kernel's",
                     torch.equal(k_cuda, k_warp))
        scorer_call("triton", s0)()
        k_tri = s0["out"].clone()
        sc_c, sc_t = I.key_scores(k_cuda), I.key_scores(k_tri)
        rel = ((sc_c - sc_t).abs().amax(1) / sc_t.abs().amax(1).clamp(min=1e-30)).max().item()
        same_keys = torch.equal(k_cuda, k_tri)
        report.check(f"{shape}: CUDA scores within 1e-5 of Triton's (relative to the row's "
                     "largest)", rel < 1e-5, f"max {rel:.2e}, keys bit-equal: {same_keys}")
        variants = [("triton", {}), ("cuda warp", dict(kernel="warp")), ("cuda rows", {})]
        if args.sm_count:
            variants.append((f"cuda rows, grid for {args.sm_count} SMs", dict(sm_count=args.sm_count)))
        variants.append(("cuda rows, SM86 limits (84 SMs, 99 KB)",
                         dict(sm_count=84, smem_cap=101376)))
        variants.append(("cuda warp, SM86 limits (84 SMs, 99 KB: 4-stage ring)",
                         dict(sm_count=84, smem_cap=101376, kernel="warp")))
        base = None
        for name, kw in variants:
            impl = "triton" if name == "triton" else "cuda"
            t = common.graph_time([scorer_call(impl, s, **kw) for s in sets],
                                  min_calls=common.CALLS_PER_REPLAY)
            base = t.median_us if name == "triton" else base
            report.add(what="scorer", shape=shape, impl=name, median_us=t.median_us,
                       tflops=flops / t.median_us / 1e6,
                       speedup_vs_triton=base / t.median_us if base else None,
                       equal_to_triton=same_keys if name != "triton" else None)
            print(report.rows[-1], flush=True)
        del sets
        torch.cuda.empty_cache()

    for T, nk, H in (QUICK_STEP if args.quick else STEP):
        shape = f"T {T}, Nk {nk}, {H} heads"
        k, ks = make_k(nk, g)
        q, w = make_q(T, H, g)
        P = 4 * nk
        ke = ((P - T + torch.arange(T, device="cuda") + 1) // 4).to(torch.int32)
        kb = torch.zeros(T, dtype=torch.int32, device="cuda")
        flops = 2.0 * D * H * float(ke.sum())
        outs = {}
        for scorer in ("triton", "cuda"):
            outs[scorer] = torch.full((T, TOPK), -7, dtype=torch.int32, device="cuda")

        outs["cuda warp"] = torch.full((T, TOPK), -7, dtype=torch.int32, device="cuda")

        def step(scorer):
            if scorer == "cuda warp":  # prefill_topk with the warp kernel (its scorer import)
                def run():
                    orig = OI.indexer_flat_keys
                    OI.indexer_flat_keys = lambda *a, **kw: orig(*a, kernel="warp", **kw)
                    try:
                        I.prefill_topk(q, w, k, ks, kb, ke, TOPK, outs[scorer], scorer="cuda")
                    finally:
                        OI.indexer_flat_keys = orig
                return run
            return lambda: I.prefill_topk(q, w, k, ks, kb, ke, TOPK, outs[scorer], scorer=scorer)

        step("cuda")()
        step("cuda warp")()
        report.check(f"{shape}: prefill_topk indices equal with either CUDA kernel",
                     torch.equal(outs["cuda"], outs["cuda warp"]))
        step("triton")()
        a, b = outs["cuda"].cpu(), outs["triton"].cpu()
        overlap = min(len(set(x.tolist()) & set(y.tolist())) / TOPK for x, y in zip(a, b))
        report.check(f"{shape}: top-{TOPK} sets overlap >= 99% per row", overlap >= 0.99,
                     f"min overlap {overlap:.4f}, indices equal: {torch.equal(a, b)}")
        base = None
        for scorer in ("triton", "cuda warp", "cuda"):
            us = common._eager_time(step(scorer), inner=3, reps=7)
            base = us if scorer == "triton" else base
            report.add(what="prefill_topk", shape=shape, impl=scorer, median_us=us,
                       tflops=flops / us / 1e6, speedup_vs_triton=base / us)
            print(report.rows[-1], flush=True)
        k = ks = q = w = outs = None  # drop the tensors (step()'s closures use them)
        torch.cuda.empty_cache()
    return report.finish(not args.no_doc)


if __name__ == "__main__":
    sys.exit(main())
