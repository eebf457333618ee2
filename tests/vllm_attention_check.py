"""vLLM's own attention metadata, fed to the Ampere DeepSeek-V4 attention adapter (CPU).

Run in a subprocess by tests/test_vllm_attention_sm80.py:
``python tests/vllm_attention_check.py --tree T [--capability 8.0] [--overlay DIR]`` with
TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES="", and with ``--device cuda`` on a GPU by
tests/gpu/test_vllm_attention_gpu.py (the model runner's tensors, the world and the builders
on the GPU, vLLM's Triton kernels compiled, this project's CUDA ops; host copies where vLLM
keeps them on the host). The tree is imported under a CUDA platform mocked to the capability
(tests/vllm_cpu_harness.py). For every step of every case in :data:`CASES` it

1. lays a batch out as vLLM's GPU model runner (V2) does: requests in order (decodes
   first), per-request query lengths, CUDA-graph padding requests (query length 0,
   seq_len 0) and padded tokens (slot -1, stale positions) at the end, one block table
   per KV-cache group (SWA pages of 64 tokens, compressed pages of 256 tokens), each as
   wide as max_model_len with stale page ids past a request's pages;
2. builds the metadata with vLLM's own builders, on DEVICE (on the CPU their Triton
   kernels run by the interpreter): ``DeepseekSparseSWAAmpereMetadataBuilder`` (the
   overlay's subclass of ``DeepseekSparseSWAMetadataBuilder``, what
   ``DeepseekSparseSWAAmpereBackend`` returns) for the SWA group and, for a C4A / C128A
   layer, the builder class that ``DeepseekV4AmpereSparseMLABackend.get_builder_cls()``
   returns for the compressed group
   (C128A: ``c128a_global_decode_topk_indices`` / ``c128a_decode_topk_lens`` /
   ``c128a_prefill_topk_indices``);
3. runs ``DeepseekV4AmpereSparseAttention.forward_mqa`` of the working copy's overlay on
   that metadata (portable ops on the CPU, the CUDA extension's on cuda; prefill scratch
   from vLLM's own workspace manager) into a NaN-poisoned output;
4. compares every real token with the float64 oracle (tests/layer_cases.oracle_token:
   the causal window of the token plus the compressed entries it selects, with the
   attention sink; DSpark's non-causal block: :func:`oracle_noncausal`).

C4A top-k rows (the indexer's output in ``topk_indices_buffer``) are drawn here: random
distinct request-local indices below ``(pos + 1) // 4``, -1 after; stale values for
padded tokens (``is_valid_token`` must mask them).

Prints one line ``RESULT {case: {"ok", "max_rel_err", "steps": [...]}}``."""

from __future__ import annotations

import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_builder_check as checks  # noqa: E402
import vllm_cpu_harness as harness  # noqa: E402

TOL = 2e-2                 # bf16-level relative error vs the float64 oracle
HEADS = 8                  # query heads (the adapter takes q already padded)
SWA_BS = 64                # SWA cache page, tokens (layer_cases.SWA_BS)
C_PAGE = 256               # compressed-group page, tokens (V4's sparse-MLA kernel block)
SWA_PREFIX = "model.layers.0.attn.swa_cache"
ATTN_PREFIX = "model.layers.0.attn"
MAX_BATCHED = 256          # scheduler max_num_batched_tokens
#: Where the world, the model runner's tensors, the builders and the ops live: "cpu"
#: (portable ops, Triton interpreter) or "cuda" (--device cuda). Values are drawn from CPU
#: generators either way (the same numbers on both devices).
DEVICE = "cpu"

#: name -> case. ``ratio``: 1 (SWA only), 4 (C4A), 128 (C128A); ``spec``: speculative
#: tokens (decode_threshold = 1 + spec); ``dspark``: DSpark draft step (causal=False);
#: ``max_model_len``; ``steps``: per step, [(seq_len, query_len)] per request, seq_len
#: counting this step's query; ``(0, 0)`` is a CUDA-graph padding request; ``pad``:
#: padded tokens past the real ones (FULL-graph padding); ``chunk``: the layer's
#: PREFILL_CHUNK_SIZE; ``sabotage``: a negative control (see :func:`_sabotage`).
CASES: dict[str, dict] = {
    # (a) C128A decode, two steps: the active top-k width is 128 columns, then 256 (a
    # 16.9k-token context has 132 compressed entries), sliced out of 512-wide buffers.
    "c128_decode_two_widths": dict(
        ratio=128, spec=0, max_model_len=65536,
        steps=[([(700, 1), (300, 1), (1500, 1)], 0),
               ([(16900, 1), (301, 1), (1501, 1)], 0)]),
    # (a)+(b) C128A with MTP next_n 2 and a padding request + padded tokens.
    "c128_decode_next2_padded": dict(
        ratio=128, spec=1, max_model_len=4096,
        steps=[([(900, 2), (129, 2), (640, 2), (0, 0)], 2)]),
    # (b) SWA-only next_n 2 / next_n 6 (DSpark/MTP with 5 draft tokens), padded.
    "swa_decode_next2_padded": dict(
        ratio=1, spec=1, max_model_len=4096,
        steps=[([(900, 2), (35, 2), (640, 2), (0, 0)], 2)]),
    "swa_decode_next6_padded": dict(
        ratio=1, spec=5, max_model_len=4096,
        steps=[([(1000, 6), (411, 6), (0, 0), (0, 0)], 12)]),
    # A short extend (3 < 6 tokens) counted as a decode: non-uniform decode rows.
    "swa_decode_next6_variable": dict(
        ratio=1, spec=5, max_model_len=4096,
        steps=[([(1000, 6), (203, 3), (777, 6)], 0)]),
    # (b) C4A next_n 6 and next_n 2, padded; top-k a strict subset for the long request.
    "c4_decode_next6_padded": dict(
        ratio=4, spec=5, max_model_len=4096,
        steps=[([(2600, 6), (411, 6), (0, 0)], 6)]),
    "c4_decode_next2": dict(
        ratio=4, spec=1, max_model_len=4096,
        steps=[([(900, 2), (35, 2), (640, 2)], 0)]),
    "c128_decode_next6_variable": dict(
        ratio=128, spec=5, max_model_len=4096,
        steps=[([(1000, 6), (203, 3), (777, 6)], 0)]),
    # (c) DSpark draft block (SWA-only draft layers): non-causal indices, 5 query tokens.
    "dspark_noncausal_swa": dict(
        ratio=1, spec=5, dspark=True, max_model_len=4096,
        steps=[([(1000, 5), (70, 5), (300, 5), (0, 0)], 5)]),
    # (d) prefill only, and mixed (next_n-2 decodes first, then a chunked prefill with
    # context and a fresh prefill), for each layer type.
    "swa_prefill": dict(
        ratio=1, spec=0, max_model_len=4096, steps=[([(700, 40), (37, 37)], 0)]),
    "c4_prefill": dict(
        ratio=4, spec=0, max_model_len=4096, steps=[([(2300, 24), (37, 37)], 0)]),
    "c128_prefill": dict(
        ratio=128, spec=0, max_model_len=4096, steps=[([(700, 40), (300, 12)], 0)]),
    "swa_mixed": dict(
        ratio=1, spec=1, max_model_len=4096,
        steps=[([(900, 2), (300, 2), (700, 40), (37, 37)], 0)]),
    # PREFILL_CHUNK_SIZE 1: vLLM's area-bounded plan splits these prefills into chunks
    # (the second starts at a non-zero query offset).
    "c4_mixed": dict(
        ratio=4, spec=1, max_model_len=4096, chunk=1,
        steps=[([(900, 2), (2300, 2), (2300, 24), (2200, 30), (37, 37)], 0)]),
    "c128_mixed": dict(
        ratio=128, spec=1, max_model_len=4096,
        steps=[([(900, 2), (300, 2), (700, 40), (260, 12)], 0)]),
    # Negative controls: one metadata value off; the check must report a failure.
    "control_c128_len_short": dict(
        ratio=128, spec=0, max_model_len=4096, sabotage="c128_len",
        steps=[([(700, 1), (300, 1)], 0)]),
    "control_c4_token_to_req": dict(
        ratio=4, spec=1, max_model_len=4096, sabotage="token_to_req",
        steps=[([(900, 2), (640, 2)], 0)]),
    "control_swa_len_short": dict(
        ratio=1, spec=1, max_model_len=4096, sabotage="swa_len",
        steps=[([(900, 2), (640, 2)], 0)]),
    "control_prefill_gather_len": dict(
        ratio=1, spec=0, max_model_len=4096, sabotage="gather_len",
        steps=[([(700, 40), (37, 37)], 0)]),
}


def fuzz_cases(n: int = 10, seed: int = 20261205) -> dict[str, dict]:
    """``n`` random one-step batches, the same on every run (``seed``), in the order vLLM's
    model runner lays them out (decodes, then prefills; CUDA-graph padding requests and their
    padded tokens only after a decode-only batch): SWA-only, C4A or C128A layers, 0-7
    speculative tokens, up to four decodes (most of them the full 1 + k tokens) and up to two
    prefills (fresh or after a prefix, up to 4,000 tokens of context), within
    max_num_batched_tokens; half of the batches with prefills planned in chunks of one
    request (PREFILL_CHUNK_SIZE 1)."""
    import random

    rnd = random.Random(seed)
    out: dict[str, dict] = {}
    for i in range(n):
        ratio, k = rnd.choice((1, 4, 128)), rnd.choice((0, 1, 3, 5, 7))
        reqs, pad = checks.random_step(rnd, k, max_seq=4000, max_decodes=4, max_prefills=2,
                                       prefill_q=100, budget=MAX_BATCHED - 16)
        prefills = any(q > k + 1 for _, q in reqs)
        case = dict(ratio=ratio, spec=k, max_model_len=4096, steps=[(reqs, pad)])
        if prefills and rnd.random() < 0.5:
            case["chunk"] = 1
        out[f"fuzz_{i:02d}"] = case
    return out


FUZZ_CASES = fuzz_cases()
CASES.update(FUZZ_CASES)


#: FULL CUDA-graph decode as vLLM's model runner (V2) drives it (``--graph``): captured
#: with the runner's dummy batch for the graph's size (``InputBatch.make_dummy``: every
#: request the same query length, seq_len = query length), built as
#: ``prepare_attn(for_capture=True)`` builds it (``build_for_cudagraph_capture``,
#: max_seq_len = max_model_len), after one eager warm-up run. Every listed step is then a
#: replay: it writes its values into the same model-runner tensors (the graph's request and
#: token counts; fewer real requests padded with query length 0 and padded tokens, as the
#: runner pads a smaller batch), the top-k rows and q, rebuilds the metadata with ``build``
#: (into the builders' persistent buffers) and replays. On the CPU the replay is emulated:
#: ``forward_mqa`` runs on the captured step's metadata objects over the rewritten buffers,
#: which is what a graph sees from the host side. ``rebuild=False``: a negative control
#: that replays without rebuilding.
GRAPH_CASES: dict[str, dict] = {
    # C128A: captured at the widest top-k (max_model_len 65,536 -> 512 columns), replayed
    # with contexts of 16.9k (256 columns), 5k and 1.5k (128).
    "graph_c128_decode": dict(
        ratio=128, spec=0, max_model_len=65536,
        steps=[([(16900, 1), (301, 1), (1501, 1), (0, 0)], 1),
               ([(5000, 1), (129, 1), (64, 1), (0, 0)], 1),
               ([(700, 1), (300, 1), (1500, 1), (40, 1)], 0)]),
    "graph_c4_decode_next2_padded": dict(
        ratio=4, spec=1, max_model_len=4096,
        steps=[([(900, 2), (35, 2), (640, 2), (0, 0)], 2),
               ([(1200, 2), (60, 2), (641, 2), (3, 2)], 0),
               ([(2600, 2), (0, 0), (0, 0), (0, 0)], 6)]),
    "graph_swa_decode_next6_padded": dict(
        ratio=1, spec=5, max_model_len=4096,
        steps=[([(1000, 6), (411, 6), (0, 0), (0, 0)], 12),
               ([(700, 6), (900, 6), (77, 6), (2000, 6)], 0)]),
    "graph_dspark_noncausal": dict(
        ratio=1, spec=5, dspark=True, max_model_len=4096,
        steps=[([(1000, 5), (70, 5), (300, 5), (0, 0)], 5),
               ([(1400, 5), (90, 5), (200, 5), (600, 5)], 0)]),
    "control_graph_no_rebuild": dict(
        ratio=4, spec=1, max_model_len=4096, rebuild=False,
        steps=[([(900, 2), (35, 2), (640, 2)], 0)]),
}


def fuzz_graph_cases(n: int = 4, seed: int = 20261205) -> dict[str, dict]:
    """``n`` random graph cases, the same on every run: SWA-only, C4A or C128A, 0-7
    speculative tokens, a graph of 2-5 requests, and 2-3 replays with 1 to all of them real
    (uniform decodes at 1 + k tokens, up to 4,000 tokens of context), the rest padding
    requests and padded tokens."""
    import random

    rnd = random.Random(seed + 1)
    out: dict[str, dict] = {}
    for i in range(n):
        ratio, k = rnd.choice((1, 4, 128)), rnd.choice((0, 1, 3, 5, 7))
        steps = checks.random_graph_steps(rnd, k, 4000)
        out[f"fuzz_graph_{i:02d}"] = dict(ratio=ratio, spec=k, max_model_len=4096, steps=steps)
    return out


GRAPH_CASES.update(fuzz_graph_cases())


# --------------------------------------------------------------------------- config


def _config(case: dict):
    """A stand-in ``VllmConfig`` with the fields the two builders read: DeepSeek-V4's
    window 128 and index top-k 512, one layer of each kind (compress ratios 4, 128, 0),
    the speculative config (MTP, or DSpark with ``use_dspark()``), model runner V2."""
    from vllm.config import AttentionConfig

    hf = types.SimpleNamespace(model_type="deepseek_v4", index_topk=512, sliding_window=128,
                               compress_ratios=[4, 128, 0])
    spec = case["spec"]
    method = "dspark" if case.get("dspark") else "mtp"
    speculative = None
    if spec:
        speculative = types.SimpleNamespace(
            num_speculative_tokens=spec, parallel_drafting=False, method=method,
            enable_adaptive_verification=False, use_dspark=lambda: method == "dspark",
            max_num_new_slots_for_drafting=0)
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=hf, hf_text_config=hf,
                                           max_model_len=case["max_model_len"]),
        parallel_config=types.SimpleNamespace(
            tensor_parallel_size=1, decode_context_parallel_size=1,
            prefill_context_parallel_size=1, cp_kv_cache_interleave_size=1),
        attention_config=AttentionConfig(),
        cache_config=types.SimpleNamespace(cache_dtype="fp8_ds_mla", block_size=SWA_BS),
        scheduler_config=types.SimpleNamespace(max_num_seqs=16,
                                               max_num_batched_tokens=MAX_BATCHED),
        # 0.34.0's indexer builder reads the layers' static forward context
        compilation_config=types.SimpleNamespace(static_forward_context={}),
        speculative_config=speculative, use_v2_model_runner=True)


def _builders(mod, cfg, ratio: int):
    """(SWA builder, compressed-group builder or None), of the classes vLLM picks for the
    Ampere layer's backends, constructed as the model runner constructs them."""
    import torch

    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec

    swa_spec = SlidingWindowMLASpec(
        block_size=SWA_BS, num_kv_heads=1, max_tp_shards=1, head_size=512,
        dtype=torch.uint8, sliding_window=128, cache_dtype_str="fp8_ds_mla",
        alignment=576, model_version="deepseek_v4")
    cls = mod.DeepseekV4AmpereSparseAttention.swa_backend_cls.get_builder_cls()
    swa = cls(swa_spec, [SWA_PREFIX], cfg, torch.device(DEVICE))
    if ratio == 1:
        return swa, None
    c_spec = MLAAttentionSpec(
        block_size=C_PAGE, num_kv_heads=1, max_tp_shards=1, head_size=512,
        dtype=torch.uint8, tokens_per_state=ratio, cache_dtype_str="fp8_ds_mla",
        alignment=576, model_version="deepseek_v4")
    mcls = mod.DeepseekV4AmpereSparseAttention.backend_cls.get_builder_cls()
    return swa, mcls(c_spec, [ATTN_PREFIX], cfg, torch.device(DEVICE))


# --------------------------------------------------------------------------- batch


def _wide_table(compact, used: list[int], width: int, npages: int, g):
    """``compact`` (layer_cases' block table) widened to ``width`` columns (max_model_len
    wide, as vLLM's are), every column past a request's ``used`` pages holding a stale
    page id: an adapter that reads past a request's context reads other data. Drawn on
    the CPU, returned on DEVICE."""
    import torch

    compact = compact.cpu()
    rows = len(used)
    bt = torch.randint(0, npages, (rows, width), generator=g, dtype=torch.int32)
    for r, n in enumerate(used):
        bt[r, :n] = compact[r, :n]
    return bt.to(DEVICE)


def _batch(w, reqs, pad: int, case: dict, g):
    """The model runner's tensors for one step, on DEVICE: per group block tables and slot
    mappings, query_start_loc (padding requests end at the real token count), seq_lens,
    positions (padded tokens: stale positions); host copies ``qsl_cpu`` / ``seq_cpu`` of
    query_start_loc and seq_lens (vLLM's query_start_loc_cpu / seq_lens_cpu_upper_bound)."""
    import torch

    real = [(r, s, q) for r, (s, q) in enumerate(reqs) if q > 0]
    nreq = len(reqs)
    qlens = [q for _, q in reqs]
    qsl = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    toks = [(r, p) for r, s, q in real for p in range(s - q, s)]
    ntok = len(toks) + pad
    # vLLM never schedules more tokens than max_num_batched_tokens, which sizes the
    # builders' buffers: a larger case would write past them (heap corruption under the
    # Triton interpreter, not an error)
    assert ntok <= MAX_BATCHED, ntok
    mml = case["max_model_len"]
    swa_used = [-(-s // SWA_BS) if q else 0 for s, q in reqs]
    bt_swa = _wide_table(_pad_rows(w.swa_bt, nreq), swa_used, mml // SWA_BS,
                         w.swa_cache.shape[0], g)
    b = types.SimpleNamespace(reqs=reqs, toks=toks, ntok=ntok, qsl=qsl.to(DEVICE),
                              qsl_cpu=qsl, bt_swa=bt_swa)
    b.seq_cpu = torch.tensor([s for s, _ in reqs], dtype=torch.int32)
    b.seq = b.seq_cpu.to(DEVICE)
    b.positions = torch.tensor([p for _, p in toks] + [mml // 3] * pad, dtype=torch.int64,
                               device=DEVICE)
    b.slots_swa = _slots(toks, pad, bt_swa, SWA_BS)
    if w.compressed:
        cbs = w.cbs
        c_used = [-(-(s // w.ratio) // cbs) if q else 0 for s, q in reqs]
        b.bt_c = _wide_table(_pad_rows(w.c_bt, nreq), c_used, mml // C_PAGE,
                             w.c_cache.shape[0], g)
        b.slots_c = _slots(toks, pad, b.bt_c, C_PAGE)
    return b


def _pad_rows(bt, nreq: int):
    """The world's table with rows for padding requests (their ids are stale anyway)."""
    import torch

    if bt.shape[0] >= nreq:
        return bt[:nreq]
    return torch.cat([bt, bt[:1].expand(nreq - bt.shape[0], -1)])


def _slots(toks, pad: int, bt, page: int):
    """Token-level slot mapping of one KV-cache group (``block * page + offset``), -1
    for padded tokens (vLLM's PAD_SLOT_ID); on DEVICE."""
    import torch

    bt = bt.cpu()
    s = [int(bt[r, p // page]) * page + p % page for r, p in toks] + [-1] * pad
    return torch.tensor(s, dtype=torch.int64, device=DEVICE)


def _common(b, bt, slots, causal: bool, max_seq_len: int | None = None):
    """``CommonAttentionMetadata`` of one KV-cache group, as ``build_attn_metadata`` makes
    it in FULL-graph mode (padded request and token counts); ``max_seq_len``: the capture's
    worst case (default: the batch's)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qlens = [q for _, q in b.reqs]
    return CommonAttentionMetadata(
        query_start_loc=b.qsl, query_start_loc_cpu=b.qsl_cpu.clone(), seq_lens=b.seq,
        num_reqs=len(b.reqs), num_actual_tokens=b.ntok, max_query_len=max(qlens),
        max_seq_len=int(b.seq_cpu.max()) if max_seq_len is None else max_seq_len,
        block_table_tensor=bt, slot_mapping=slots,
        causal=causal, positions=b.positions, seq_lens_cpu_upper_bound=b.seq_cpu.clone())


# --------------------------------------------------------------------------- layer


def _layer(mod, w, ratio: int, topk_buf, chunk: int):
    """The overlay's ``DeepseekV4AmpereSparseAttention`` with only what ``forward_mqa``
    reads set (its constructor builds linear layers and caches a CPU test cannot)."""
    import torch

    from deepinfer_sm80.ampere import layer as L

    layer = object.__new__(mod.DeepseekV4AmpereSparseAttention)
    torch.nn.Module.__init__(layer)
    layer.prefix, layer.compress_ratio = ATTN_PREFIX, ratio
    layer.swa_cache_layer = types.SimpleNamespace(prefix=SWA_PREFIX, kv_cache=w.swa_cache)
    layer.kv_cache = w.c_cache if w.compressed else torch.tensor([], device=DEVICE)
    layer.topk_indices_buffer = topk_buf
    layer.window_size, layer.max_image_tokens, layer.max_model_len = 128, 0, 4096
    layer.scale, layer.attn_sink = w.scale, w.attn_sink
    layer.PREFILL_CHUNK_SIZE, layer.max_num_batched_tokens = chunk, MAX_BATCHED
    layer._ampere_ops = L.resolve_ops(DEVICE)
    checks.require_extension_ops(layer._ampere_ops, DEVICE)
    return layer


def _topk_buffer(w, b, ratio: int, g):
    """The indexer's output buffer [max_num_batched_tokens, 512]: C4A rows of random
    distinct request-local indices below (pos + 1) // 4 (-1 after); stale values for
    padded tokens (masked by is_valid_token) and past the batch (never read: an
    out-of-range page if they were); all -1 for other layers (unused). Drawn on the CPU,
    returned on DEVICE."""
    import torch

    import layer_cases as C

    buf = torch.full((MAX_BATCHED, C.TOPK), -1, dtype=torch.int32)
    if ratio == 4:
        buf[: len(b.toks)] = C.v41_topk(w, [p for _, p in b.toks], g).cpu()
        buf[len(b.toks):] = torch.randint(0, 1 << 20, (MAX_BATCHED - len(b.toks), C.TOPK),
                                          generator=g, dtype=torch.int32)
    return buf.to(DEVICE)


# --------------------------------------------------------------------------- oracle


def oracle_noncausal(w, r: int, lo: int, hi: int, q):
    """float64 output [H, 512] of a query attending to positions [lo, hi) of request r's
    SWA cache (DSpark's non-causal block: window of the context plus the whole block),
    with the sink; the same formula as layer_cases.oracle_token."""
    import torch

    import layer_cases as C

    p = torch.arange(lo, hi, device=w.device)
    slots = w.swa_bt[r, p // C.SWA_BS].long() * C.SWA_BS + p % C.SWA_BS
    rows = C.read_fp8_ds_mla_rows(w.swa_cache, slots, torch.float64)
    s = (q.double() @ rows.t()) * w.scale
    m = s.amax(1, keepdim=True)
    e = torch.exp(s - m)
    den = e.sum(1) + torch.exp(w.attn_sink.double() - m.squeeze(1))
    return (e @ rows) / den.unsqueeze(1)


def _reference(w, b, t: int, q, topk, dspark: bool):
    """The oracle for batch token ``t``."""
    import layer_cases as C

    r, p = b.toks[t]
    s, qlen = b.reqs[r]
    if dspark:
        return oracle_noncausal(w, r, max(s - qlen - 128, 0), s, q)
    if w.ratio == 4:
        comp = [int(j) for j in topk[t].tolist() if j >= 0]
    elif w.ratio == 128:
        comp = list(range((p + 1) // 128))
    else:
        comp = []
    return C.oracle_token(w, r, p, q, comp)


# --------------------------------------------------------------------------- run


def _sabotage(kind: str | None, swa_md, mla_md) -> None:
    """Negative controls: change one value of the builders' metadata (one token's length
    or request) so that the check has to report a failure."""
    if kind == "c128_len":
        mla_md.c128a_decode_topk_lens[0] -= 1
    elif kind == "token_to_req":
        swa_md.token_to_req_indices[0] = 1
    elif kind == "swa_len":
        swa_md.decode_swa_lens[1] -= 1
    elif kind == "gather_len":
        swa_md.prefill_gather_lens[0] -= 1
    elif kind is not None:
        raise ValueError(kind)


def _describe(swa_md, mla_md) -> dict:
    """The layouts the builders produced (shapes, strides, splits), for the test's
    assertions on what vLLM hands the adapter."""
    info = {"num_decodes": swa_md.num_decodes, "num_prefills": swa_md.num_prefills,
            "num_decode_tokens": swa_md.num_decode_tokens,
            "num_prefill_tokens": swa_md.num_prefill_tokens,
            "swa_indices_shape": list(swa_md.decode_swa_indices.shape),
            "swa_lens_shape": list(swa_md.decode_swa_lens.shape),
            "decode_swa_width": swa_md.decode_swa_width}
    if swa_md.num_decode_tokens <= 24:
        info["swa_lens"] = swa_md.decode_swa_lens.tolist()
    if mla_md is not None and mla_md.c128a_global_decode_topk_indices is not None:
        gi = mla_md.c128a_global_decode_topk_indices
        info.update(c128_decode_shape=list(gi.shape), c128_decode_stride=list(gi.stride()),
                    c128_lens=mla_md.c128a_decode_topk_lens.tolist())
    if mla_md is not None and mla_md.c128a_prefill_topk_indices is not None:
        info["c128_prefill_shape"] = list(mla_md.c128a_prefill_topk_indices.shape)
    return info


def run_step(mod, w, case: dict, reqs, pad: int, g) -> dict:
    """One step: build the metadata with vLLM's builders, run ``forward_mqa``, compare."""
    import torch

    import layer_cases as C

    ratio = case["ratio"]
    cfg = _config(case)
    swa_b, mla_b = _builders(mod, cfg, ratio)
    b = _batch(w, reqs, pad, case, g)
    causal = not case.get("dspark")
    swa_md = swa_b.build(0, _common(b, b.bt_swa, b.slots_swa, causal))
    mla_md = None if mla_b is None else mla_b.build(0, _common(b, b.bt_c, b.slots_c, causal))
    _sabotage(case.get("sabotage"), swa_md, mla_md)
    topk = _topk_buffer(w, b, ratio, g)
    layer = _layer(mod, w, ratio, topk, case.get("chunk", 4))
    info = _describe(swa_md, mla_md)
    if swa_md.num_prefills:  # the plan forward_mqa asks for, recorded for the test
        info["chunk_plan"] = swa_md.get_prefill_chunk_plan(
            compress_ratio=ratio, prefill_chunk_size=layer.PREFILL_CHUNK_SIZE)
    q, _, _ = C.make_queries(w, [p for _, p in b.toks] + [0] * pad, g)
    out = torch.full_like(q, float("nan"))
    md = {SWA_PREFIX: swa_md}
    if mla_md is not None:
        md[ATTN_PREFIX] = mla_md
    with harness._patched([(mod, "get_forward_context",
                            lambda: types.SimpleNamespace(attn_metadata=md))]):
        layer.forward_mqa(q, None, None, out)
    errs = [C.rel_err(out[t], _reference(w, b, t, q[t], topk, bool(case.get("dspark"))))
            for t in range(len(b.toks))]
    bad = [t for t, e in enumerate(errs) if not e <= TOL]   # NaN (unwritten) fails too
    info.update(tokens=len(b.toks), padded_tokens=pad, max_rel_err=max(errs),
                bad_tokens=bad[:8], padded_rows_finite=bool(out[len(b.toks):].isfinite().all()))
    return info


def _world(case: dict):
    """One layer world holding, per request, every position below its longest seq_len
    over the steps (a shorter step leaves later positions in the cache: reading them
    is an error the oracle sees)."""
    import layer_cases as C

    steps = case["steps"]
    n = max(len(reqs) for reqs, _ in steps)
    longest = [max([reqs[r][0] for reqs, _ in steps if r < len(reqs)] + [1])
               for r in range(n)]
    return C.build_world(ratio=case["ratio"], seq_lens=longest, heads=HEADS, device=DEVICE,
                         seed=len(steps) * 7 + case["ratio"])


def run_case(mod, name: str, case: dict) -> dict:
    import torch

    g = torch.Generator().manual_seed(sum(map(ord, name)))
    w = _world(case)
    steps = [run_step(mod, w, case, reqs, pad, g) for reqs, pad in case["steps"]]
    worst = max(s["max_rel_err"] for s in steps)
    ok = all(not s["bad_tokens"] for s in steps) and worst <= TOL
    return {"ok": bool(ok), "max_rel_err": worst, "steps": steps}


def _compare(w, b, q, out, topk, case: dict) -> dict:
    """Every real token of ``out`` against the oracle; padded rows must stay finite."""
    import layer_cases as C

    errs = [C.rel_err(out[t], _reference(w, b, t, q[t], topk, bool(case.get("dspark"))))
            for t in range(len(b.toks))]
    bad = [t for t, e in enumerate(errs) if not e <= TOL]   # NaN (unwritten) fails too
    return {"tokens": len(b.toks), "max_rel_err": max(errs), "bad_tokens": bad[:8],
            "padded_rows_finite": bool(out[len(b.toks):].isfinite().all())}


def run_graph_case(mod, name: str, case: dict) -> dict:
    """:data:`GRAPH_CASES`: capture the first step, replay the others (see there)."""
    import torch

    import layer_cases as C

    g = torch.Generator().manual_seed(sum(map(ord, name)))
    w = _world(case)
    ratio, causal = case["ratio"], not case.get("dspark")
    swa_b, mla_b = _builders(mod, _config(case), ratio)
    steps = case["steps"]
    # the capture's batch, as vLLM's runner makes it
    dummy = checks.dummy_reqs(*checks.graph_shape(steps))
    # the model runner's persistent inputs, the indexer's output buffer, q and out
    b0 = _batch(w, dummy, 0, case, g)
    run = checks.rewrite_inputs(None, b0)
    topk = _topk_buffer(w, b0, ratio, g)
    q = C.make_queries(w, [p for _, p in b0.toks], g)[0].clone()
    out = torch.full_like(q, float("nan"))
    layer = _layer(mod, w, ratio, topk, case.get("chunk", 4))

    def build(b, capture: bool):
        mml = case["max_model_len"] if capture else None
        cm = _common(b, run["bt_swa"], run["slots_swa"], causal, mml)
        md = {SWA_PREFIX: swa_b.build_for_cudagraph_capture(cm) if capture
              else swa_b.build(0, cm)}
        if mla_b is not None:
            cm = _common(b, run["bt_c"], run["slots_c"], causal, mml)
            md[ATTN_PREFIX] = (mla_b.build_for_cudagraph_capture(cm) if capture
                               else mla_b.build(0, cm))
        return md

    def forward(md):
        with harness._patched([(mod, "get_forward_context",
                                lambda: types.SimpleNamespace(attn_metadata=md))]):
            layer.forward_mqa(q, None, None, out)

    captured = build(b0, capture=True)
    forward(captured)  # the warm-up run (eager, the capture's metadata)
    first = dict(_compare(w, b0, q, out, topk, case), step="capture (eager warm-up)",
                 **_describe(captured[SWA_PREFIX], captured.get(ATTN_PREFIX)))
    graph = checks.CapturedForward(forward, captured, DEVICE)
    results = [first]
    for reqs, pad in steps:
        b = _batch(w, reqs, pad, case, g)
        checks.rewrite_inputs(run, b)  # new values, same tensors
        topk.copy_(_topk_buffer(w, b, ratio, g))
        q.copy_(C.make_queries(w, [p for _, p in b.toks] + [0] * pad, g)[0])
        out.fill_(float("nan"))
        fresh = build(b, capture=False) if case.get("rebuild", True) else None
        graph.replay()
        info = dict(_compare(w, b, q, out, topk, case), step="replay")
        if fresh is not None:
            info.update(_describe(fresh[SWA_PREFIX], fresh.get(ATTN_PREFIX)))
        results.append(info)
    worst = max(r["max_rel_err"] for r in results)
    ok = all(not r["bad_tokens"] for r in results) and worst <= TOL
    return {"ok": bool(ok), "max_rel_err": worst, "steps": results,
            "graph": graph.graph is not None}


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = checks.arg_parser(__doc__)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--graph", action="store_true",
                    help="the FULL CUDA-graph cases (GRAPH_CASES; emulated on the CPU)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    mod = checks.boot(args.tree, args.overlay, args.capability, tuple(
        f"vllm.models.deepseek_v4.nvidia.{m}" for m in ("ampere_ops", "ampere_indexer",
                                                        "ampere_sparse")), device=DEVICE)
    if args.graph:
        return checks.run_cases(args.case or list(GRAPH_CASES),
                                lambda name: run_graph_case(mod, name, GRAPH_CASES[name]))
    return checks.run_cases(args.case or list(CASES),
                            lambda name: run_case(mod, name, CASES[name]))


if __name__ == "__main__":
    sys.exit(main())
