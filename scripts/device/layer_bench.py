"""Per-step timings of one DeepSeek-V4 attention layer on the GPU (SM80 code
path forced), to report which steps remain portable and their share of the
layer time.  CUDA-event timing, warm-up, median of N, fresh random inputs per
run.  Baselines measured in the same run: upstream's Triton writers (SM90
fp8e4nv) where importable.  Prints a markdown table and writes JSON to
$OUT/layer_bench.json.

Usage: python3 scripts/device/layer_bench.py [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
from types import SimpleNamespace

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
for p in (ROOT / "overlay", ROOT / "tests", ROOT / "bench"):
    sys.path.insert(0, str(p))

import layer_cases as C  # noqa: E402
from deepinfer_sm80.ampere import indexer as I  # noqa: E402
from deepinfer_sm80.ampere import layer as L  # noqa: E402
from deepinfer_sm80.ampere import o_proj as O  # noqa: E402
from deepinfer_sm80.triton_writers import indexer_q_rope_quant  # noqa: E402
from writer_cases import call_sm80_store, make_compressor_case  # noqa: E402


def timed(fn, prepare, reps):
    """Median ms of fn() over reps runs, each after prepare() (fresh inputs)."""
    for _ in range(3):
        prepare()
        fn()
    ts = []
    for _ in range(reps):
        prepare()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    ops = L.resolve_ops("cuda")
    rows = []
    dev = torch.device("cuda")
    # Decode: 16 requests at ~8K context, C4 layer, 8 local heads (TP8) and 64.
    seq = [8192 + 37 * i for i in range(16)]
    w = C.build_world(ratio=4, seq_lens=seq, heads=64, device="cuda", seed=1)
    sink64 = w.attn_sink
    for heads in (8, 64):
        w.heads, w.attn_sink = heads, sink64[:heads].contiguous()
        for next_n in (1, 6):
            md = C.decode_metadata(w, next_n, pad_rows=0)
            g = torch.Generator().manual_seed(1)
            q, iq, iw = C.make_queries(w, md.tok_pos, g)
            topk = torch.full((md.T, C.TOPK), -1, dtype=torch.int32, device=dev)
            out = torch.empty_like(q)

            def fresh():
                q.normal_(0, 0.5)
                iw.normal_(0, 0.1)

            t_idx = timed(lambda: I.decode_topk(
                iq.view(w.nreq, next_n, C.IDX_HEADS, C.IDX_DIM), iw, w.idx_raw, md.ctx,
                w.idx_bt, w.ibs, C.TOPK, topk), fresh, args.reps)
            t_attn = timed(lambda: L.forward_decode(
                ops, q=q, swa_cache=w.swa_cache, compressed_cache=w.c_cache,
                swa_indices=md.swa_indices, swa_lens=md.swa_lens, compress_ratio=4,
                scale=w.scale, attn_sink=w.attn_sink, out=out, topk_local=topk,
                token_to_req_indices=md.token_to_req, block_table=w.c_bt,
                compressed_block_size=w.cbs, is_valid_token=md.is_valid), fresh, args.reps)
            # o_proj (real dims: o_lora 1024, 8 heads per group, hidden 4096)
            groups = heads // 8
            grouped = (torch.randn(groups, 1024, 8 * 512, device=dev) * 0.02).to(torch.bfloat16)
            wo_b = (torch.randn(4096, groups * 1024, device=dev) * 0.02).to(torch.bfloat16)
            cs = torch.randn(65536, 64, device=dev)
            t_oproj = timed(lambda: O.o_proj_sm80(out, md.positions, cs, grouped,
                                                  lambda z: z @ wo_b.t()), fresh, args.reps)
            # index-Q writer
            iqb = torch.randn(md.T, 64, 128, device=dev).to(torch.bfloat16)
            iwb = torch.randn(md.T, 64, device=dev).to(torch.bfloat16)
            t_iq = timed(lambda: indexer_q_rope_quant(md.positions, iqb, cs, iwb, 128**-0.5,
                                                      0.125), lambda: iqb.normal_(), args.reps)
            total = t_idx + t_attn + t_oproj + t_iq
            rows.append(dict(step="decode", heads=heads, next_n=next_n, tokens=md.T,
                             indexer_topk_ms=t_idx, attention_ms=t_attn, o_proj_ms=t_oproj,
                             index_q_ms=t_iq, total_ms=total))
    # Writers: ours vs upstream Triton on the same inputs (prefill-sized batch).
    up = None
    try:
        from upstream_import import import_upstream

        up = import_upstream("vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache")
    except Exception as e:  # noqa: BLE001
        print("upstream writers not importable:", e)
    for name, ratio, head in (("c4", 4, 512), ("c128", 128, 512), ("indexer", 4, 128)):
        seqs = [4096] * 4
        case = make_compressor_case(ratio, head, seqs, device="cuda", seed=3, pad_rows=0)
        t_ours = timed(lambda: call_sm80_store(case), lambda: None, args.reps)
        t_up = None
        if up is not None:
            a = case.args
            t_up = timed(lambda: up.compress_norm_rope_store_triton(
                state_cache=a["state_cache"], num_actual=a["slot_mapping"].shape[0],
                token_to_req_indices=a["token_to_req_indices"], positions=a["positions"],
                slot_mapping=a["slot_mapping"], block_table=a["block_table"],
                block_size=a["block_size"], state_width=case.state_width,
                cos_sin_cache=a["cos_sin_cache"], kv_cache=a["kv_cache"],
                k_cache_metadata=SimpleNamespace(slot_mapping=a["kv_slot_mapping"]),
                pdl_kwargs={"launch_pdl": False}, head_dim=head, rope_head_dim=64,
                compress_ratio=ratio, overlap=case.overlap, use_fp4_cache=False,
                rms_norm_weight=a["rms_norm_weight"], rms_norm_eps=1e-6,
                quant_block=64 if head == 512 else 128,
                token_stride=576 if head == 512 else 128, scale_dim=8 if head == 512 else 4),
                lambda: None, args.reps)
        rows.append(dict(step=f"writer {name}", tokens=sum(seqs), ours_ms=t_ours,
                         upstream_triton_sm90_ms=t_up))
    res = dict(device=torch.cuda.get_device_name(), ops=ops.source, rows=rows,
               torch=torch.__version__)
    print(json.dumps(res, indent=1))
    print("| step | heads | next_n | tokens | indexer top-k ms | attention ms | o_proj ms | index-Q ms | total ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["step"] == "decode":
            print(f"| decode | {r['heads']} | {r['next_n']} | {r['tokens']} | {r['indexer_topk_ms']:.3f} "
                  f"| {r['attention_ms']:.3f} | {r['o_proj_ms']:.3f} | {r['index_q_ms']:.3f} | {r['total_ms']:.3f} |")
    for r in rows:
        if r["step"] != "decode":
            print(f"| {r['step']} | tokens {r['tokens']} | ours {r['ours_ms']:.3f} ms | upstream "
                  f"{r['upstream_triton_sm90_ms']} ms |")
    out = os.environ.get("OUT")
    if out:
        pathlib.Path(out, "layer_bench.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
