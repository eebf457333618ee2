"""Checks of the DeepSeek-V4.1 Ampere attention adapter against a vLLM
source tree, run in a subprocess by tests/test_ampere_adapters.py with the tree first on
sys.path. The overlay modules are loaded from overlay/vllm/... under their vLLM module
names. ``forward_mqa`` runs on the CPU with the portable ops on a V4.1 layer world
(tests/layer_cases.py, ``v41=True``) and vLLM-shaped metadata, against the float64 oracle.
Prints one JSON line."""

import importlib.util
import json
import os
import sys
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(1, os.path.join(ROOT, "overlay"))
sys.path.insert(1, HERE)

import torch  # noqa: E402


def load_overlay(rel: str):
    """overlay/vllm/<rel>.py as module vllm.<rel with dots>."""
    name = "vllm." + rel.replace("/", ".")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "overlay", "vllm", rel + ".py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def fake_layer(mod, w, ratio: int, topk_buf: torch.Tensor):
    """A V4.1 Ampere attention layer with only what forward_mqa reads set."""
    from deepinfer_sm80.ampere import layer as L
    import layer_cases as C

    A = mod.DeepseekV41AmpereSparseAttention
    layer = object.__new__(A)
    torch.nn.Module.__init__(layer)
    layer.compress_ratio = ratio
    layer.compressed_cache_prefix = None if ratio == 0 else "model.layers.2.attn"  # kv source
    layer.swa_cache_layer = SimpleNamespace(prefix="model.layers.5.attn.swa",
                                            kv_cache=w.swa_cache)
    layer._compressed_kv_cache = lambda: w.c_cache
    layer.topk_indices_buffer = topk_buf
    layer.window_size, layer.scale, layer.attn_sink = C.WINDOW, w.scale, w.attn_sink
    layer.PREFILL_CHUNK_SIZE, layer.max_num_batched_tokens = 4, topk_buf.shape[0]
    layer._ampere_ops = L.resolve_ops("cpu")
    return layer


def swa_metadata(w, md, *, decode: bool):
    """DeepseekSparseSWAMetadata-shaped namespace for an all-decode or all-prefill batch."""
    from deepinfer_sm80.ampere.layer import plan_prefill_chunks
    import layer_cases as C

    n = w.nreq
    common = dict(block_table=w.swa_bt, block_size=C.SWA_BS)
    if decode:
        return SimpleNamespace(
            num_decodes=n, num_decode_tokens=md.T, num_prefills=0, num_prefill_tokens=0,
            decode_swa_indices=md.swa_indices, decode_swa_lens=md.swa_lens,
            token_to_req_indices=md.token_to_req, is_valid_token=md.is_valid, **common)

    def plan(compress_ratio, prefill_chunk_size, has_compressed=None):
        return plan_prefill_chunks(list(w.seq_lens), compress_ratio, C.WINDOW,
                                   chunk_size=prefill_chunk_size,
                                   max_query_lens=md.query_lens, swa_only=not has_compressed)

    return SimpleNamespace(
        num_decodes=0, num_decode_tokens=0, num_prefills=n, num_prefill_tokens=md.T,
        prefill_seq_lens=md.seq_lens, prefill_gather_lens=md.gather_lens,
        query_start_loc=md.query_start_loc, query_start_loc_cpu=md.query_start_loc_cpu,
        get_prefill_chunk_plan=plan, **common)


def run_case(mod, ratio: int, decode: bool, replay: bool = False) -> dict:
    """``replay``: a prefill after prefix-cache hits (vLLM's swa_bounded_replay: gather lengths
    from each request's replay start; the window of the first query tokens starts there) whose
    top-k lists hold failed (-1) candidates."""
    from deepinfer_sm80.ampere import layer as L
    import layer_cases as C

    seq_lens = [900, 300] if decode else [700, 260]
    w = C.build_world(ratio=max(ratio, 1), seq_lens=seq_lens, heads=8, device="cpu",
                      seed=40 + ratio + decode, v41=ratio > 0)
    g = torch.Generator().manual_seed(11 + ratio)
    if decode:
        md = C.decode_metadata(w, 2)
        positions = md.tok_pos + [0, 0]
    else:
        md = C.prefill_metadata(w, [200, 9], replay_starts=[450, 200] if replay else None)
        positions = md.tok_pos
    q, iq, iw = C.make_queries(w, positions, g)
    topk = (C.v41_topk(w, positions, g, holes=0.3 if replay else 0.0) if ratio > 0
            else torch.full((len(positions), C.TOPK), -1, dtype=torch.int32))
    layer = fake_layer(mod, w, ratio, topk)
    swa_md = swa_metadata(w, md, decode=decode)
    mla_md = None if ratio == 0 else SimpleNamespace(
        block_table=w.c_bt, block_size=w.cbs * ratio)  # the kernel block, in tokens
    metadata = {layer.swa_cache_layer.prefix: swa_md}
    if mla_md is not None:
        metadata[layer.compressed_cache_prefix] = mla_md
    mod.get_forward_context = lambda: SimpleNamespace(attn_metadata=metadata)

    class Workspace(L.Workspace):  # the shared vLLM workspace's role, on the CPU
        def __init__(self, max_tokens, combined_topk):
            super().__init__()

    mod._VllmPrefillWorkspace = Workspace
    out = torch.full_like(q, float("nan"))
    layer.forward_mqa(q, None, None, out)
    worst, _, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    return {"max_rel_err": worst, "tokens": n,
            "compressed_attended": int(sum(int((topk[t] >= 0).sum()) for t in range(n)))}


def run_mixed_case(mod, ratio: int) -> dict:
    """A mixed batch as vLLM orders it: two decode requests (one token each) first, then two
    prefill requests; the adapter slices the block tables, query_start_loc (which then starts
    at the decode tokens' count) and the shared top-k buffer at the split. Every token against
    the float64 oracle."""
    import layer_cases as C

    seq, qlens = [900, 300, 700, 260], [1, 1, 200, 9]
    w = C.build_world(ratio=max(ratio, 1), seq_lens=seq, heads=8, device="cpu",
                      seed=60 + ratio, v41=ratio > 0)
    md_d = C.decode_metadata(w, 1, pad_rows=0, seq_lens=seq[:2])
    tok_req = md_d.tok_req + [r for r in (2, 3) for _ in range(qlens[r])]
    tok_pos = md_d.tok_pos + [p for r in (2, 3) for p in range(seq[r] - qlens[r], seq[r])]
    qsl = [0]
    for ql in qlens:
        qsl.append(qsl[-1] + ql)
    g = torch.Generator().manual_seed(21 + ratio)
    q, iq, iw = C.make_queries(w, tok_pos, g)
    topk = (C.v41_topk(w, tok_pos, g) if ratio > 0
            else torch.full((len(tok_pos), C.TOPK), -1, dtype=torch.int32))
    layer = fake_layer(mod, w, ratio, topk)
    pre_seq, pre_q = seq[2:], qlens[2:]
    from deepinfer_sm80.ampere.layer import plan_prefill_chunks

    def plan(compress_ratio, prefill_chunk_size, has_compressed=None):
        return plan_prefill_chunks(pre_seq, compress_ratio, C.WINDOW, chunk_size=prefill_chunk_size,
                                   max_query_lens=pre_q, swa_only=not has_compressed)

    swa_md = SimpleNamespace(
        num_decodes=2, num_decode_tokens=2, num_prefills=2, num_prefill_tokens=sum(pre_q),
        decode_swa_indices=md_d.swa_indices, decode_swa_lens=md_d.swa_lens,
        token_to_req_indices=md_d.token_to_req, is_valid_token=md_d.is_valid,
        prefill_seq_lens=torch.tensor(pre_seq, dtype=torch.int32),
        prefill_gather_lens=torch.tensor([ql + min(L - ql, C.WINDOW - 1)
                                          for L, ql in zip(pre_seq, pre_q)], dtype=torch.int32),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
        get_prefill_chunk_plan=plan, block_table=w.swa_bt, block_size=C.SWA_BS)
    metadata = {layer.swa_cache_layer.prefix: swa_md}
    if ratio > 0:
        metadata[layer.compressed_cache_prefix] = SimpleNamespace(block_table=w.c_bt,
                                                                  block_size=w.cbs * ratio)
    mod.get_forward_context = lambda: SimpleNamespace(attn_metadata=metadata)
    out = torch.full_like(q, float("nan"))
    layer.forward_mqa(q, None, None, out)
    worst = 0.0
    for t, (r, p) in enumerate(zip(tok_req, tok_pos)):
        comp = [int(j) for j in topk[t].tolist() if j >= 0] if ratio > 0 else []
        worst = max(worst, C.rel_err(out[t], C.oracle_token(w, r, p, q[t], comp)))
    return {"max_rel_err": worst, "tokens": len(tok_pos),
            "compressed_attended": int((topk >= 0).sum())}


def check_indexer_candidates(write: bool, layout: str = "native") -> dict:
    """V4's AmpereSparseAttnIndexer as V4.1 builds it (candidate blocks), on a decode batch
    with vLLM-shaped metadata: the candidate rows (write) or the masked top-k sets (mask)
    equal the float64 oracle's. ``layout``: "native" ([requests, next_n] rows, 2-D lengths),
    "flattened" (what the metadata builder makes below SM90 for next_n > 2: one row per token,
    per-token lengths as a [tokens, 1] column, the block table repeated per token with stale
    columns past it, a uniform batch: the adapter regroups the rows) or "flattened_mixed" (the
    same, not uniform: the rows stay one per token). tests/vllm_indexer_decode_check.py
    builds these layouts with vLLM's own builder."""
    from indexer_cases import (_oracle_candidates, _oracle_masked_topk, dyadic_fp8,
                               dyadic_weights, k_scales, logits64)

    mi = sys.modules["vllm.models.deepseek_v4.nvidia.ampere_indexer"]
    g = torch.Generator().manual_seed(12 + write)
    B, NN, H, D, bs, nb, K, cbs, nblk = 3, 2, 32, 128, 64, 8, 48, 8, 6
    codes, vals = dyadic_fp8((nb, bs, D), g)
    sc = k_scales(nb * bs, g).view(nb, bs)
    raw = torch.zeros(nb, bs * 132, dtype=torch.uint8)
    raw[:, : bs * D] = codes.view(nb, -1)
    raw[:, bs * D:] = sc.float().contiguous().view(torch.uint8).view(nb, -1)
    bt = torch.tensor([[3, 1], [0, 5], [7, 2]], dtype=torch.int32)
    seq = torch.tensor([[90, 91], [30, 31], [127, 128]], dtype=torch.int32)
    q, q64 = dyadic_fp8((B * NN, H, D), g)
    w64 = dyadic_weights((B * NN, H), g)
    buf = torch.full((B * NN + 2, K), 7, dtype=torch.int32)
    cand = (torch.full((B * NN + 2, nblk), -7, dtype=torch.int32) if write
            else torch.randint(-1, 17, (B * NN + 2, nblk), generator=g, dtype=torch.int32))
    op = object.__new__(mi.AmpereSparseAttnIndexer)
    torch.nn.Module.__init__(op)
    op.k_cache = SimpleNamespace(prefix="l.indexer.k_cache", kv_cache=raw.view(nb, bs, 132))
    op.topk_indices_buffer, op.topk_tokens, op.head_dim = buf, K, D
    op.max_total_seq_len = 1024
    op.candidate_blocks, op.candidate_block_size, op.candidate_write = cand, cbs, write
    if layout == "native":
        dec = SimpleNamespace(decode_lens=torch.full((B,), NN), seq_lens=seq,
                              requires_padding=False, block_table=bt)
    else:  # vLLM's flattened buffers: wider than the batch, stale page ids past it
        T = B * NN
        flat_bt = torch.randint(0, nb, (T + 3, bt.shape[1] + 2), generator=g, dtype=torch.int32)
        flat_bt[:T, : bt.shape[1]] = bt.repeat_interleave(NN, 0)
        flat_seq = torch.zeros(T + 3, dtype=torch.int32)
        flat_seq[:T] = seq.reshape(-1)
        dec = SimpleNamespace(decode_lens=torch.ones(T, dtype=torch.int32),
                              seq_lens=flat_seq[:T].unsqueeze(-1),
                              requires_padding=False, block_table=flat_bt[:T],
                              decode_is_uniform=layout == "flattened", write_max_decode_len=NN)
    md = SimpleNamespace(num_prefills=0, num_decodes=B, num_decode_tokens=B * NN, prefill=None,
                         decode=dec)
    mi.get_forward_context = lambda: SimpleNamespace(attn_metadata={"l.indexer.k_cache": md})
    shapes = []
    real_topk = mi.ampere_indexer.decode_topk
    mi.ampere_indexer.decode_topk = lambda q4, *a, **kw: shapes.append(tuple(q4.shape[:2])) or \
        real_topk(q4, *a, **kw)
    try:
        op._forward(torch.zeros(B * NN + 2, 16), q.view(torch.float8_e4m3fn), None, w64.float())
    finally:
        mi.ampere_indexer.decode_topk = real_topk
    ok = True
    for b in range(B):
        kv = torch.cat([vals[int(p)] for p in bt[b]])
        ks = torch.cat([sc[int(p)] for p in bt[b]])
        L = logits64(q64[b * NN:(b + 1) * NN], w64[b * NN:(b + 1) * NN], kv, ks)
        for i in range(NN):
            r, n = b * NN + i, int(seq[b, i])
            got = {j for j in buf[r].tolist() if j >= 0}
            if write:
                ok &= cand[r].tolist() == _oracle_candidates(L[i], n, cbs, nblk)
            else:
                ok &= got == _oracle_masked_topk(L[i], n, cand[r].tolist(), cbs, K)
    ok &= bool((cand[B * NN:] == -7).all()) if write else True  # rows past the batch untouched
    return {"ok": bool(ok), "rows_shape": shapes}


def main():
    res = {}
    # the working copy's V4 overlay modules, which the V4.1 ones import
    for rel in ("ampere_ops", "ampere_indexer", "ampere_sparse"):
        load_overlay(f"models/deepseek_v4/nvidia/{rel}")
    mod = load_overlay("models/deepseek_v41/nvidia/ampere_sparse")
    idx = load_overlay("models/deepseek_v41/nvidia/ampere_indexer")
    res["indexer_cls"] = mod.DeepseekV41AmpereSparseAttention._indexer_cls(None, None).__name__
    res["indexer_attn_cls"] = idx.DeepseekV41AmpereIndexer.attn_cls.__name__
    res["indexer_candidates_write"] = check_indexer_candidates(True)
    res["indexer_candidates_mask"] = check_indexer_candidates(False)
    for layout in ("flattened", "flattened_mixed"):
        res[f"indexer_candidates_write_{layout}"] = check_indexer_candidates(True, layout)
        res[f"indexer_candidates_mask_{layout}"] = check_indexer_candidates(False, layout)
    A = mod.DeepseekV41AmpereSparseAttention
    from vllm.platforms.interface import DeviceCapability

    be = mod.DeepseekV41AmpereSparseMLABackend
    res["backend_name"] = be.get_name()
    res["backend_caps"] = {f"{m}.{n}": be.supports_compute_capability(DeviceCapability(m, n))
                           for m, n in ((8, 0), (8, 6), (9, 0), (10, 0), (12, 0))}
    b = object.__new__(mod.DeepseekSparseSWAAmpereV41MetadataBuilder)
    sched = b.build_tile_scheduler(7)
    res["tile_scheduler_all_none"] = bool(sched) and all(v is None for v in sched.values())
    res["tile_scheduler_keys"] = sorted(sched)
    res["padded_heads"] = {n: A.get_padded_num_q_heads(n) for n in (8, 16, 32, 64)}
    res["abstract_methods"] = sorted(getattr(A, "__abstractmethods__", ()))
    for ratio in (0, 1, 2):
        for decode in (True, False):
            res[f"{'decode' if decode else 'prefill'}_ratio{ratio}"] = run_case(mod, ratio, decode)
        res[f"prefill_replay_ratio{ratio}"] = run_case(mod, ratio, False, replay=True)
        res[f"mixed_ratio{ratio}"] = run_mixed_case(mod, ratio)
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
