"""vLLM's own attention metadata, fed to the Ampere DeepSeek-V4.1 attention adapter (CPU).

Run in a subprocess by tests/test_vllm_v41_attention_sm80.py:
``python tests/vllm_v41_attention_check.py --tree T [--capability 8.0] [--overlay DIR]`` with
TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES="", and with ``--device cuda`` on a GPU by
tests/gpu/test_vllm_v41_attention_gpu.py (the model runner's and the model state's tensors,
the world and the builders on the GPU, vLLM's Triton kernels compiled, this project's CUDA
ops; host copies where vLLM keeps them on the host). The tree is imported under a CUDA
platform mocked to the capability (tests/vllm_cpu_harness.py). The V4.1 sibling of
tests/vllm_attention_check.py (same structure). For every step of every case in
:data:`CASES` it

1. derives each prefix-cache hit's replay start with vLLM's own code: the SWA cache spec of
   the layer's ``DeepseekV4SWACache`` (``bounded_replay=True``, cache_config
   ``swa_bounded_replay``) gives ``prefix_replay_tokens`` (the window, 128), the scheduler's
   ``Scheduler._mark_prefix_replay`` turns a hit into ``Request.replay_start`` (hit - 128)
   and the number of hit tokens to recompute; the V2 model state's rule (only prefilling
   requests carry it, ``DeepseekV41ModelState.prepare_attn``) and its
   ``ReplayAttnMetadata.get_extra_attn_kwargs`` hand it to the SWA builder; its
   ``_pad_replayed_slots_kernel`` pads the replayed tokens' slots in the prefix-cacheable
   (compressed) group;
2. lays the batch out as the V2 model runner does (decodes first; CUDA-graph padding
   requests and padded tokens; block tables as wide as max_model_len with stale page ids
   past a request's pages and, for a replaying request, in place of the SWA pages wholly
   below its replay start, which bounded replay retired);
3. builds the metadata with the builders vLLM picks for the V4.1 Ampere layer on DEVICE
   (on the CPU their Triton kernels run by the interpreter):
   ``DeepseekSparseSWAAmpereV41MetadataBuilder``
   (``DeepseekSparseSWAAmpereV41Backend.get_builder_cls()``, a subclass of V4.1's
   ``DeepseekV41SparseSWAMetadataBuilder``) for the SWA group (32-token pages, the layer's
   ``block_size=32``) and, for ratio 1 / 2, ``DeepseekV41AmpereSparseMLABackend
   .get_builder_cls()`` (V4.1's ``DeepseekV4FlashMLAMetadataBuilder``) for the kv-source
   layer's compressed group (spec from V4.1's own ``DeepseekV4Attention.get_kv_cache_spec``,
   kernel block from the backend's ``get_supported_kernel_block_sizes``: 128 tokens);
4. runs ``DeepseekV41AmpereSparseAttention.forward_mqa`` of the working copy's overlay on
   that metadata (portable ops on the CPU, the CUDA extension's on cuda; prefill scratch
   from vLLM's workspace manager) into a NaN-poisoned output;
5. compares every real token with the float64 oracle (tests/layer_cases.oracle_token with
   ``floor`` = the request's replay start: no window KV exists below it).

Top-k rows (the index-source layer's output in the shared ``topk_indices_buffer``) are
drawn here as layer_cases.v41_topk does, with ``holes`` (-1 failed candidates) where a case
asks; stale values for padded tokens and past the batch.

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
WINDOW = 128               # V4.1's sliding window
SWA_PREFIX = "model.layers.5.attn.swa_cache"
ATTN_PREFIX = "model.layers.5.attn"
KV_SOURCE_PREFIX = "model.layers.3.attn"   # the kv-source layer owning the compressed cache
MAX_BATCHED = 512          # scheduler max_num_batched_tokens
SCHED_BLOCK = 128          # cache_config.block_size (the compressed spec's block)
#: Where the world, the model runner's tensors, the builders and the ops live: "cpu"
#: (portable ops, Triton interpreter) or "cuda" (--device cuda). Values are drawn from CPU
#: generators either way (the same numbers on both devices).
DEVICE = "cpu"

#: name -> case. ``ratio``: V4.1's 0 (SWA only), 1 or 2 (compressed, top-k from the shared
#: buffer); ``spec``: speculative tokens (decode_threshold = 1 + spec); ``steps``: per
#: step ([request], pad) with request (seq_len, query_len) or (seq_len, query_len, hit): a
#: prefilling request admitted with a prefix-cache hit of ``hit`` tokens (its replay start
#: from vLLM's scheduler); seq_len counts this step's query; (0, 0) is a CUDA-graph padding
#: request; ``pad``: padded tokens past the real ones; ``holes``: fraction of -1 top-k
#: entries; ``chunk``: PREFILL_CHUNK_SIZE; ``sabotage``: a negative control.
CASES: dict[str, dict] = {
    # Decode: next_n 1, 2 and 6 (MTP with 5 draft tokens), CUDA-graph padding, variable.
    "r0_decode_next1": dict(
        ratio=0, spec=0, steps=[([(900, 1), (300, 1), (37, 1)], 0)]),
    "r2_decode_next2_padded": dict(
        ratio=2, spec=1, holes=0.3,
        steps=[([(900, 2), (129, 2), (640, 2), (0, 0)], 2)]),
    "r1_decode_next6_padded": dict(
        ratio=1, spec=5, holes=0.2,
        steps=[([(1000, 6), (411, 6), (0, 0), (0, 0)], 12)]),
    "r2_decode_next6_variable": dict(
        ratio=2, spec=5, steps=[([(1000, 6), (203, 3), (777, 6)], 0)]),
    "r0_decode_next6_padded": dict(
        ratio=0, spec=5, steps=[([(1000, 6), (70, 6), (0, 0)], 6)]),
    # Prefill after prefix-cache hits, swa_bounded_replay on. First step after the hit: the
    # query starts at the replay start (hit - 128), gather_len == query_len; hits of 512,
    # 256 and 384 tokens and a fresh prefill alongside.
    "r0_prefill_replay": dict(
        ratio=0, spec=0, steps=[([(524, 140, 512), (238, 110, 256), (30, 30)], 0)]),
    "r1_prefill_replay": dict(
        ratio=1, spec=0, holes=0.3,
        steps=[([(238, 110, 256), (300, 44, 384), (30, 30)], 0)]),
    "r2_prefill_replay": dict(
        ratio=2, spec=0, holes=0.3,
        steps=[([(524, 140, 512), (238, 110, 256), (30, 30)], 0)]),
    # Chunked prefill of a replaying request: later chunks keep the replay start, their
    # gather_len = query_len + min(prefix - replay_start, 127) (< query_len + 127).
    "r2_prefill_replay_chunks": dict(
        ratio=2, spec=0, holes=0.3,
        steps=[([(424, 40, 512), (190, 62, 256)], 0),
               ([(480, 56, 512), (260, 70, 256), (90, 90)], 0)]),
    "r0_prefill_replay_chunks": dict(
        ratio=0, spec=0,
        steps=[([(424, 40, 512)], 0), ([(480, 56, 512), (90, 90)], 0)]),
    # Mixed: next_n-2 decodes first, then replaying prefills (a first and a later chunk)
    # and a fresh one.
    "r2_mixed_replay": dict(
        ratio=2, spec=1, holes=0.3,
        steps=[([(900, 2), (300, 2), (524, 140, 512), (480, 56, 512), (13, 13)], 0)]),
    # A replaying chunk of 3 tokens with next_n 6 is classified as a decode: its replay
    # start reaches the decode SWA indices. PREFILL_CHUNK_SIZE 1: vLLM's area-bounded plan
    # runs the SWA-only layer's two prefills as two chunks (the second at a query offset).
    "r0_mixed_replay_decode_split": dict(
        ratio=0, spec=5, chunk=1,
        steps=[([(1000, 6), (387, 3, 512), (644, 260, 512), (172, 44, 256)], 0)]),
    "r2_mixed_replay_decode_split": dict(
        ratio=2, spec=5, chunk=1, holes=0.3,
        steps=[([(1000, 6), (387, 3, 512), (524, 140, 512), (172, 44, 256)], 0)]),
    # Negative controls: the check must report a failure.
    "control_gather_len": dict(
        ratio=0, spec=0, sabotage="gather_len",
        steps=[([(238, 110, 256), (37, 37)], 0)]),
    "control_swa_len": dict(
        ratio=2, spec=1, sabotage="swa_len",
        steps=[([(900, 2), (640, 2)], 0)]),
    "control_token_to_req": dict(
        ratio=1, spec=1, sabotage="token_to_req",
        steps=[([(900, 2), (640, 2)], 0)]),
    # The model state not handing replay_start to the builder (V4's gather lengths).
    "control_no_replay_start": dict(
        ratio=2, spec=0, sabotage="no_replay_start",
        steps=[([(238, 110, 256), (37, 37)], 0)]),
    # The adapter with V4's combine (v41=False) on the replay cases: a first chunk, and a
    # later one (the replaying request second in its chunk, so that V4's window offsets
    # below the gathered buffer land in the previous request's rows).
    "control_v4_combine_first_chunk": dict(
        ratio=2, spec=0, sabotage="v4_combine",
        steps=[([(238, 110, 256), (37, 37)], 0)]),
    "control_v4_combine_later_chunk": dict(
        ratio=0, spec=0, sabotage="v4_combine",
        steps=[([(90, 90), (480, 56, 512)], 0)]),
}


def fuzz_cases(n: int = 10, seed: int = 20261205) -> dict[str, dict]:
    """``n`` random one-step batches, the same on every run (``seed``), in the order vLLM's
    model runner lays them out (decodes, then prefills; CUDA-graph padding requests and their
    padded tokens only after a decode-only batch): V4.1's ratios 0, 1 and 2 (top-k with or
    without -1 holes), 0-7 speculative tokens, up to four decodes (most of them the full
    1 + k tokens) and up to three prefills, fresh or after a prefix-cache hit of 256-640
    tokens (swa_bounded_replay: the first chunk after the hit starts at the replay start,
    a later one past it), within max_num_batched_tokens; half of the batches with prefills
    planned in chunks of one request (PREFILL_CHUNK_SIZE 1)."""
    import random

    rnd = random.Random(seed)
    out: dict[str, dict] = {}
    for i in range(n):
        ratio, k = rnd.choice((0, 1, 2)), rnd.choice((0, 1, 3, 5, 7))

        def after_hit(q: int) -> tuple[int, int, int] | None:
            if rnd.random() >= 0.5:
                return None  # a fresh prefill
            hit = SCHED_BLOCK * rnd.randint(2, 5)
            prefix = hit - WINDOW + (0 if rnd.random() < 0.5 else rnd.randint(1, 200))
            return (prefix + q, q, hit)

        reqs, pad = checks.random_step(rnd, k, max_seq=2000, max_decodes=4, max_prefills=3,
                                       prefill_q=150, budget=MAX_BATCHED - 32, prefill=after_hit)
        prefills = any(r[1] > k + 1 for r in reqs)
        case = dict(ratio=ratio, spec=k, steps=[(reqs, pad)])
        if ratio and rnd.random() < 0.5:
            case["holes"] = 0.3
        if prefills and rnd.random() < 0.5:
            case["chunk"] = 1
        out[f"fuzz_{i:02d}"] = case
    return out


FUZZ_CASES = fuzz_cases()
CASES.update(FUZZ_CASES)


# --------------------------------------------------------------------------- config


#: FULL CUDA-graph decode (``--graph``), as tests/vllm_attention_check.GRAPH_CASES: captured
#: with vLLM's dummy batch for the graph's size, built as vLLM captures
#: (``build_for_cudagraph_capture``, max_seq_len = max_model_len, no replay start: "graph
#: captures build without it"), warmed up eagerly; every listed step rewrites the same
#: model-runner tensors, the top-k rows and q, rebuilds with ``build`` (the model state's
#: replay starts, zero for decodes) and replays (emulated on the CPU). ``rebuild=False``:
#: the negative control.
GRAPH_CASES: dict[str, dict] = {
    "graph_r2_decode_next2_padded": dict(
        ratio=2, spec=1, holes=0.3,
        steps=[([(900, 2), (129, 2), (640, 2), (0, 0)], 2),
               ([(1300, 2), (200, 2), (641, 2), (5, 2)], 0)]),
    "graph_r1_decode_next6_padded": dict(
        ratio=1, spec=5, holes=0.2,
        steps=[([(1000, 6), (411, 6), (0, 0), (0, 0)], 12),
               ([(700, 6), (950, 6), (30, 6), (0, 0)], 6)]),
    "graph_r0_decode_next1": dict(
        ratio=0, spec=0,
        steps=[([(900, 1), (300, 1), (37, 1)], 0), ([(1200, 1), (0, 0), (0, 0)], 2)]),
    "control_graph_no_rebuild": dict(
        ratio=2, spec=1, rebuild=False,
        steps=[([(900, 2), (129, 2), (640, 2)], 0)]),
}


def fuzz_graph_cases(n: int = 4, seed: int = 20261205) -> dict[str, dict]:
    """``n`` random graph cases, the same on every run: V4.1's ratios 0, 1 and 2 (top-k with
    or without -1 holes), 0-7 speculative tokens, a graph of 2-5 requests, and 2-3 replays
    with 1 to all of them real (uniform decodes at 1 + k tokens, up to 2,000 tokens of
    context), the rest padding requests and padded tokens."""
    import random

    rnd = random.Random(seed + 1)
    out: dict[str, dict] = {}
    for i in range(n):
        ratio, k = rnd.choice((0, 1, 2)), rnd.choice((0, 1, 3, 5, 7))
        steps = checks.random_graph_steps(rnd, k, 2000)
        case = dict(ratio=ratio, spec=k, steps=steps)
        if ratio and rnd.random() < 0.5:
            case["holes"] = 0.3
        out[f"fuzz_graph_{i:02d}"] = case
    return out


GRAPH_CASES.update(fuzz_graph_cases())


def _config(case: dict):
    """A stand-in ``VllmConfig`` with the fields the builders and the layer's cache specs
    read: ``tests/vllm_cpu_harness._v41_config``'s V4.1 shape (window 128, index top-k
    512, compress ratios [0, 2, 2, 1, 1, 0, 0, 0]) with swa_bounded_replay on (vLLM's
    default) and prefix caching, MTP speculation, model runner V2."""
    from vllm.config import AttentionConfig

    hf = types.SimpleNamespace(
        model_type="deepseek_v41", index_topk=512, sliding_window=WINDOW,
        compress_ratios=[0, 2, 2, 1, 1, 0, 0, 0], kv_source_layer_ids=[1, 3],
        index_source_layer_ids=[1, 3, 4], num_hidden_layers=8)
    spec = case["spec"]
    speculative = None
    if spec:
        speculative = types.SimpleNamespace(
            num_speculative_tokens=spec, parallel_drafting=False, method="mtp",
            enable_adaptive_verification=False, use_dspark=lambda: False,
            max_num_new_slots_for_drafting=0)
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=hf, hf_text_config=hf,
                                           max_model_len=case.get("max_model_len", 4096)),
        parallel_config=types.SimpleNamespace(
            tensor_parallel_size=1, decode_context_parallel_size=1,
            prefill_context_parallel_size=1, cp_kv_cache_interleave_size=1),
        attention_config=AttentionConfig(),
        cache_config=types.SimpleNamespace(
            cache_dtype="fp8_ds_mla", block_size=SCHED_BLOCK, swa_bounded_replay=True,
            enable_prefix_caching=True),
        scheduler_config=types.SimpleNamespace(max_num_seqs=16,
                                               max_num_batched_tokens=MAX_BATCHED),
        # 0.34.0's indexer builder reads the layers' static forward context
        compilation_config=types.SimpleNamespace(static_forward_context={}),
        speculative_config=speculative, use_v2_model_runner=True)


def _swa_spec(mod, cfg):
    """The SWA group's spec, from the layer's real ``DeepseekV4SWACache`` as V4.1's
    attention constructs it below family 100 (584-byte records, 576-byte page alignment,
    32-token pages, bounded replay from cache_config.swa_bounded_replay)."""
    import torch

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    with set_current_vllm_config(VllmConfig()):
        cache = DeepseekV4SWACache(
            head_dim=512, window_size=WINDOW, dtype=torch.uint8, prefix=SWA_PREFIX,
            cache_config=cfg.cache_config,
            backend_cls=mod.DeepseekV41AmpereSparseAttention.swa_backend_cls, block_size=32,
            packed_bytes_per_token=584, packed_page_alignment=576,
            bounded_replay=cfg.cache_config.swa_bounded_replay)
    return cache, cache.get_kv_cache_spec(cfg)


def _compressed_spec(mod, cfg, ratio: int):
    """The kv-source layer's compressed-cache spec (V4.1's own
    ``DeepseekV4Attention.get_kv_cache_spec`` on the fields it reads), at the kernel block
    size the Ampere backend supports (vLLM's ``copy_with_new_block_size``)."""
    import torch

    from vllm.models.deepseek_v41.attention import DeepseekV4Attention

    fields = types.SimpleNamespace(
        is_kv_source=True, kv_cache_dtype="fp8_ds_mla", compress_ratio=ratio, head_dim=512,
        kv_cache_torch_dtype=torch.uint8, kv_page_alignment=576,
        compressed_bytes_per_token=584)
    spec = DeepseekV4Attention.get_kv_cache_spec(fields, cfg)
    kernel = mod.DeepseekV41AmpereSparseAttention.backend_cls.get_supported_kernel_block_sizes()
    assert len(kernel) == 1 and spec.block_size % kernel[0] == 0, kernel
    return spec.copy_with_new_block_size(kernel[0]) if kernel[0] != spec.block_size else spec


def _builders(mod, cfg, ratio: int):
    """(SWA cache layer, SWA spec, SWA builder, compressed spec, compressed builder or
    None), of the classes vLLM picks for the V4.1 Ampere layer's backends, constructed as
    the model runner constructs them."""
    import torch

    A = mod.DeepseekV41AmpereSparseAttention
    cache, swa_spec = _swa_spec(mod, cfg)
    swa = cache.get_attn_backend().get_builder_cls()(swa_spec, [SWA_PREFIX], cfg,
                                                     torch.device(DEVICE))
    if ratio == 0:
        return swa_spec, swa, None, None
    c_spec = _compressed_spec(mod, cfg, ratio)
    mla = A.backend_cls.get_builder_cls()(c_spec, [KV_SOURCE_PREFIX], cfg,
                                          torch.device(DEVICE))
    return swa_spec, swa, c_spec, mla


# --------------------------------------------------------------------------- batch


def _replay_starts(reqs, swa_spec) -> list[int]:
    """Per request of the step: the replay start a prefilling request with a prefix hit
    carries (the scheduler's ``_mark_prefix_replay`` on a hit of ``hit`` tokens; the model
    state hands it on while the request is prefilling), 0 otherwise."""
    from vllm.v1.core.sched.scheduler import Scheduler

    out = []
    for req in reqs:
        if len(req) < 3 or not req[2]:
            out.append(0)
            continue
        seq, q, hit = req
        sched = types.SimpleNamespace(prefix_replay_tokens=swa_spec.prefix_replay_tokens)
        request = types.SimpleNamespace(replay_start=0)
        rewind = Scheduler._mark_prefix_replay(sched, request, hit, False)
        # the request's first scheduled token is hit - rewind; this step's query must not
        # start below it (a case that did would describe no vLLM schedule)
        assert seq - q >= hit - rewind == request.replay_start, (req, rewind)
        out.append(request.replay_start)
    return out


def _wide_table(compact, used: list[int], width: int, npages: int, g, retired=None):
    """``compact`` (layer_cases' block table) widened to ``width`` columns (max_model_len
    wide, as vLLM's are), every column past a request's ``used`` pages holding a stale
    page id; ``retired[r]`` leading columns too (SWA pages below a replay start). Drawn
    on the CPU, returned on DEVICE."""
    import torch

    compact = compact.cpu()
    rows = len(used)
    bt = torch.randint(0, npages, (rows, width), generator=g, dtype=torch.int32)
    for r, n in enumerate(used):
        lo = retired[r] if retired else 0
        bt[r, lo:n] = compact[r, lo:n]
    return bt.to(DEVICE)


def _pad_rows(bt, nreq: int):
    import torch

    if bt.shape[0] >= nreq:
        return bt[:nreq]
    return torch.cat([bt, bt[:1].expand(nreq - bt.shape[0], -1)])


def _slots(toks, pad: int, bt, page: int):
    """Token-level slot mapping of one KV-cache group, -1 for padded tokens; on DEVICE."""
    import torch

    bt = bt.cpu()
    s = [int(bt[r, p // page]) * page + p % page for r, p in toks] + [-1] * pad
    return torch.tensor(s, dtype=torch.int64, device=DEVICE)


def _batch(w, reqs, pad: int, case: dict, replay: list[int], g, swa_bs: int, c_page: int):
    """The model runner's tensors for one step, on DEVICE (as vllm_attention_check._batch);
    host copies ``qsl_cpu`` / ``seq_cpu`` of query_start_loc and seq_lens."""
    import torch

    reqs2 = [tuple(r[:2]) for r in reqs]
    nreq = len(reqs2)
    qlens = [q for _, q in reqs2]
    qsl = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    toks = [(r, p) for r, (s, q) in enumerate(reqs2) if q for p in range(s - q, s)]
    mml = case.get("max_model_len", 4096)
    swa_used = [-(-s // swa_bs) if q else 0 for s, q in reqs2]
    retired = [rs // swa_bs for rs in replay]
    # vLLM never schedules more tokens than max_num_batched_tokens, which sizes the
    # builders' buffers: a larger case would write past them (heap corruption under the
    # Triton interpreter, not an error)
    assert len(toks) + pad <= MAX_BATCHED, (len(toks), pad)
    b = types.SimpleNamespace(reqs=reqs2, toks=toks, ntok=len(toks) + pad, qsl=qsl.to(DEVICE),
                              qsl_cpu=qsl)
    b.bt_swa = _wide_table(_pad_rows(w.swa_bt, nreq), swa_used, mml // swa_bs,
                           w.swa_cache.shape[0], g, retired)
    b.seq_cpu = torch.tensor([s for s, _ in reqs2], dtype=torch.int32)
    b.seq = b.seq_cpu.to(DEVICE)
    b.positions = torch.tensor([p for _, p in toks] + [mml // 3] * pad, dtype=torch.int64,
                               device=DEVICE)
    b.slots_swa = _slots(toks, pad, b.bt_swa, swa_bs)
    if w.compressed:
        c_used = [-(-(s // w.ratio) // w.cbs) if q else 0 for s, q in reqs2]
        b.bt_c = _wide_table(_pad_rows(w.c_bt, nreq), c_used, mml // c_page,
                             w.c_cache.shape[0], g)
        b.slots_c = _slots(toks, pad, b.bt_c, c_page)
    return b


def _pad_replayed_slots(b, specs, replay_start) -> None:
    """vLLM's model state (``DeepseekV41ModelState.prepare_attn``): the replayed tokens'
    slots in the prefix-cacheable groups are padded (their cached KV stays as is); run
    with its own Triton kernel over [swa, compressed] slot mappings."""
    import torch

    from vllm.models.deepseek_v41.nvidia import model_state as ms
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    window = max(s.prefix_replay_tokens for s in specs)
    groups = torch.tensor([i for i, s in enumerate(specs) if s.prefix_cacheable],
                          dtype=torch.int32, device=DEVICE)
    if not window or not bool(replay_start.any()) or groups.numel() == 0:
        return
    slots = torch.stack([b.slots_swa] + ([b.slots_c] if len(specs) > 1 else []))
    ms._pad_replayed_slots_kernel[(len(b.reqs),)](
        slots, slots.stride(0), groups, b.qsl, b.positions, replay_start, window,
        PAD_SLOT_ID, NUM_GROUPS=groups.numel(), BLOCK=1024)
    b.slots_swa = slots[0].clone()
    if len(specs) > 1:
        b.slots_c = slots[1].clone()


def _common(b, bt, slots, max_seq_len: int | None = None):
    """``CommonAttentionMetadata`` of one KV-cache group (padded counts, FULL graph);
    ``max_seq_len``: the capture's worst case (default: the batch's)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qlens = [q for _, q in b.reqs]
    return CommonAttentionMetadata(
        query_start_loc=b.qsl, query_start_loc_cpu=b.qsl_cpu.clone(), seq_lens=b.seq,
        num_reqs=len(b.reqs), num_actual_tokens=b.ntok, max_query_len=max(qlens),
        max_seq_len=int(b.seq_cpu.max()) if max_seq_len is None else max_seq_len,
        block_table_tensor=bt, slot_mapping=slots, causal=True, positions=b.positions,
        seq_lens_cpu_upper_bound=b.seq_cpu.clone())


# --------------------------------------------------------------------------- layer


def _layer(mod, w, ratio: int, topk_buf, chunk: int):
    """The overlay's ``DeepseekV41AmpereSparseAttention`` with only what ``forward_mqa``
    reads set (its constructor builds linear layers and caches a CPU test cannot): a
    consumer of the kv-source layer's compressed cache, read through its real
    ``_compressed_kv_cache`` from the static forward context."""
    import torch

    from deepinfer_sm80.ampere import layer as L

    layer = object.__new__(mod.DeepseekV41AmpereSparseAttention)
    torch.nn.Module.__init__(layer)
    layer.prefix, layer.compress_ratio = ATTN_PREFIX, ratio
    layer.is_kv_source = False
    layer.compressed_cache_prefix = KV_SOURCE_PREFIX if ratio else None
    layer._static_forward_context = {
        KV_SOURCE_PREFIX: types.SimpleNamespace(kv_cache=w.c_cache if w.compressed else None)}
    layer.swa_cache_layer = types.SimpleNamespace(prefix=SWA_PREFIX, kv_cache=w.swa_cache)
    layer.topk_indices_buffer = topk_buf
    layer.window_size, layer.max_model_len = WINDOW, 4096
    layer.scale, layer.attn_sink = w.scale, w.attn_sink
    layer.PREFILL_CHUNK_SIZE, layer.max_num_batched_tokens = chunk, MAX_BATCHED
    layer._ampere_ops = L.resolve_ops(DEVICE)
    checks.require_extension_ops(layer._ampere_ops, DEVICE)
    return layer


def _topk_buffer(w, b, ratio: int, g, holes: float, num_decode_tokens: int):
    """The shared top-k buffer [max_num_batched_tokens, 512]: for ratio 1 / 2, random
    distinct request-local indices below (pos + 1) // ratio, ``holes`` of them -1, -1
    after (layer_cases.v41_topk); stale values for padded tokens (is_valid_token masks
    them), past the batch and for SWA-only layers (never read).

    Decode rows keep their failed candidates at the end (the valid ones first): V4.1's
    decode reads a row as upstream does, ``compute_global_topk_indices_and_lens`` counting
    the valid entries and FlashMLA's ``extra_topk_length`` (the portable/CUDA decode alike)
    reading that many leading columns, so an interior -1 would cut off a valid entry in
    upstream's FlashMLA path as well; the indexers write -1 after the selected entries.
    Prefill rows keep interior holes (V4.1's combine skips them). Drawn on the CPU,
    returned on DEVICE."""
    import torch

    import layer_cases as C

    buf = torch.randint(0, 1 << 20, (MAX_BATCHED, C.TOPK), generator=g, dtype=torch.int32)
    if ratio:
        rows = C.v41_topk(w, [p for _, p in b.toks], g, holes=holes).cpu()
        for t in range(min(num_decode_tokens, len(b.toks))):
            kept = rows[t][rows[t] >= 0]
            rows[t] = -1
            rows[t, : kept.numel()] = kept
        buf[: len(b.toks)] = rows
    return buf.to(DEVICE)


# --------------------------------------------------------------------------- run


def _sabotage(kind, swa_md, mla_md) -> None:
    """Negative controls: one value of the builders' metadata off."""
    if kind == "gather_len":
        swa_md.prefill_gather_lens[0] -= 1
    elif kind == "swa_len":
        swa_md.decode_swa_lens[1] -= 1
    elif kind == "token_to_req":
        swa_md.token_to_req_indices[0] = 1
    elif kind not in (None, "no_replay_start", "v4_combine"):
        raise ValueError(kind)


def _describe(swa_md, replay: list[int], b) -> dict:
    info = {"num_decodes": swa_md.num_decodes, "num_prefills": swa_md.num_prefills,
            "num_decode_tokens": swa_md.num_decode_tokens,
            "num_prefill_tokens": swa_md.num_prefill_tokens,
            "swa_indices_shape": list(swa_md.decode_swa_indices.shape),
            "block_size": swa_md.block_size, "replay_start": replay,
            "md_replay_start": swa_md.replay_start[: len(replay)].tolist(),
            "slots_swa_padded": int((b.slots_swa[: len(b.toks)] < 0).sum())}
    if hasattr(b, "slots_c"):
        info["slots_c_padded"] = int((b.slots_c[: len(b.toks)] < 0).sum())
    if swa_md.num_decode_tokens <= 24:
        info["swa_lens"] = swa_md.decode_swa_lens.tolist()
    if swa_md.num_prefills:
        info["gather_lens"] = swa_md.prefill_gather_lens.tolist()
    return info


def _forward(mod, layer, q, out, md, v4_combine: bool) -> None:
    """``forward_mqa`` with vLLM's forward context holding ``md``; ``v4_combine``: the
    adapter's call to the layer's prefill with V4's combine (v41=False), a control."""
    from deepinfer_sm80.ampere import layer as L

    patches = [(mod, "get_forward_context", lambda: types.SimpleNamespace(attn_metadata=md))]
    if v4_combine:
        real = L.forward_prefill
        patches.append((mod.ampere_layer, "forward_prefill",
                        lambda *a, **kw: real(*a, **dict(kw, v41=False))))
    with harness._patched(patches):
        layer.forward_mqa(q, None, None, out)


def run_step(mod, w, case: dict, reqs, pad: int, g) -> dict:
    """One step: vLLM's replay starts and builders, ``forward_mqa``, the oracle."""
    import torch

    import layer_cases as C
    from vllm.models.deepseek_v41.nvidia.model_state import ReplayAttnMetadata

    ratio = case["ratio"]
    cfg = _config(case)
    swa_spec, swa_b, c_spec, mla_b = _builders(mod, cfg, ratio)
    assert swa_spec.block_size == C.SWA_BS and (c_spec is None or c_spec.block_size == 128)
    replay = _replay_starts(reqs, swa_spec)
    b = _batch(w, reqs, pad, case, replay, g, swa_spec.block_size,
               c_spec.block_size if c_spec else 0)
    # the model state's per-request buffer (max_num_seqs rows), sliced to the batch
    buf = torch.zeros(cfg.scheduler_config.max_num_seqs, dtype=torch.int32, device=DEVICE)
    buf[: len(replay)] = torch.tensor(replay, dtype=torch.int32, device=DEVICE)
    replay_start = buf[: len(replay)]
    _pad_replayed_slots(b, [swa_spec] + ([c_spec] if c_spec else []), replay_start)
    extra = ReplayAttnMetadata(replay_start)
    kw = extra.get_extra_attn_kwargs(swa_b, len(b.reqs))
    assert set(kw) == {"replay_start"}, kw
    if case.get("sabotage") == "no_replay_start":
        kw = {}
    swa_md = swa_b.build(0, _common(b, b.bt_swa, b.slots_swa), **kw)
    mla_md = None
    if mla_b is not None:
        assert extra.get_extra_attn_kwargs(mla_b, len(b.reqs)) == {}
        mla_md = mla_b.build(0, _common(b, b.bt_c, b.slots_c))
    _sabotage(case.get("sabotage"), swa_md, mla_md)
    topk = _topk_buffer(w, b, ratio, g, case.get("holes", 0.0), swa_md.num_decode_tokens)
    layer = _layer(mod, w, ratio, topk, case.get("chunk", 4))
    info = _describe(swa_md, replay, b)
    if swa_md.num_prefills:
        info["chunk_plan"] = swa_md.get_prefill_chunk_plan(
            compress_ratio=ratio, prefill_chunk_size=layer.PREFILL_CHUNK_SIZE,
            has_compressed=ratio > 0)
    q, _, _ = C.make_queries(w, [p for _, p in b.toks] + [0] * pad, g)
    out = torch.full_like(q, float("nan"))
    md = {SWA_PREFIX: swa_md}
    if mla_md is not None:
        md[KV_SOURCE_PREFIX] = mla_md
    _forward(mod, layer, q, out, md, case.get("sabotage") == "v4_combine")
    errs = []
    for t, (r, p) in enumerate(b.toks):
        comp = [int(j) for j in topk[t].tolist() if j >= 0] if ratio else []
        errs.append(C.rel_err(out[t], C.oracle_token(w, r, p, q[t], comp, floor=replay[r])))
    bad = [t for t, e in enumerate(errs) if not e <= TOL]   # NaN (unwritten) fails too
    # tokens whose causal window reaches below their request's replay start
    clamped = [t for t, (r, p) in enumerate(b.toks) if replay[r] and p - WINDOW + 1 < replay[r]]
    info.update(tokens=len(b.toks), padded_tokens=pad, max_rel_err=max(errs),
                bad_tokens=bad[:8], num_bad=len(bad), clamped_tokens=len(clamped),
                bad_clamped=len(set(bad) & set(clamped)),
                compressed_attended=int((topk[: len(b.toks)] >= 0).sum()) if ratio else 0,
                padded_rows_finite=bool(out[len(b.toks):].isfinite().all()))
    return info


def _world(case: dict):
    """One V4.1 layer world holding, per request, every position below its longest
    seq_len over the steps (SWA pages of 32 tokens, compressed pages of 128 // ratio
    entries)."""
    import layer_cases as C

    steps = case["steps"]
    n = max(len(reqs) for reqs, _ in steps)
    longest = [max([reqs[r][0] for reqs, _ in steps if r < len(reqs)] + [1])
               for r in range(n)]
    ratio = case["ratio"]
    return C.build_world(ratio=max(ratio, 1), seq_lens=longest, heads=HEADS, device=DEVICE,
                         seed=len(steps) * 7 + ratio, v41=ratio > 0)


def run_case(mod, name: str, case: dict) -> dict:
    import time

    import torch

    t0 = time.monotonic()
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    w = _world(case)
    steps = [run_step(mod, w, case, reqs, pad, g) for reqs, pad in case["steps"]]
    worst = max(s["max_rel_err"] for s in steps)
    ok = all(not s["bad_tokens"] for s in steps) and worst <= TOL
    return {"ok": bool(ok), "max_rel_err": worst, "steps": steps,
            "seconds": round(time.monotonic() - t0, 2)}


def run_graph_case(mod, name: str, case: dict) -> dict:
    """:data:`GRAPH_CASES`: capture the first step, replay the others."""
    import torch

    import layer_cases as C
    from vllm.models.deepseek_v41.nvidia.model_state import ReplayAttnMetadata

    g = torch.Generator().manual_seed(sum(map(ord, name)))
    w = _world(case)
    ratio, steps = case["ratio"], case["steps"]
    nreq, ntok = checks.graph_shape(steps)
    dummy = checks.dummy_reqs(nreq, ntok)  # the capture's batch, as vLLM's runner makes it
    cfg = _config(case)
    swa_spec, swa_b, c_spec, mla_b = _builders(mod, cfg, ratio)
    blocks = (swa_spec.block_size, c_spec.block_size if c_spec else 0)
    b0 = _batch(w, dummy, 0, case, [0] * nreq, g, *blocks)
    run = checks.rewrite_inputs(None, b0)
    replay_buf = torch.zeros(cfg.scheduler_config.max_num_seqs, dtype=torch.int32,
                             device=DEVICE)
    ndec = ntok  # a decode-only batch: every token a decode row
    topk = _topk_buffer(w, b0, ratio, g, case.get("holes", 0.0), ndec)
    q = C.make_queries(w, [p for _, p in b0.toks], g)[0].clone()
    out = torch.full_like(q, float("nan"))
    layer = _layer(mod, w, ratio, topk, case.get("chunk", 4))

    def build(b, replay, capture: bool):
        mml = case.get("max_model_len", 4096) if capture else None
        cm = _common(b, run["bt_swa"], run["slots_swa"], mml)
        if capture:
            md = {SWA_PREFIX: swa_b.build_for_cudagraph_capture(cm)}
        else:
            replay_buf[: len(replay)] = torch.tensor(replay, dtype=torch.int32, device=DEVICE)
            kw = ReplayAttnMetadata(replay_buf[: len(replay)]).get_extra_attn_kwargs(
                swa_b, len(b.reqs))
            md = {SWA_PREFIX: swa_b.build(0, cm, **kw)}
        if mla_b is not None:
            cm = _common(b, run["bt_c"], run["slots_c"], mml)
            md[KV_SOURCE_PREFIX] = (mla_b.build_for_cudagraph_capture(cm) if capture
                                    else mla_b.build(0, cm))
        return md

    def compare(b, replay, step: str) -> dict:
        errs = []
        for t, (r, p) in enumerate(b.toks):
            comp = [int(j) for j in topk[t].tolist() if j >= 0] if ratio else []
            errs.append(C.rel_err(out[t], C.oracle_token(w, r, p, q[t], comp,
                                                         floor=replay[r])))
        bad = [t for t, e in enumerate(errs) if not e <= TOL]   # NaN (unwritten) fails too
        return {"step": step, "tokens": len(b.toks), "max_rel_err": max(errs),
                "bad_tokens": bad[:8], "padded_rows_finite":
                bool(out[len(b.toks):].isfinite().all())}

    captured = build(b0, None, capture=True)
    assert captured[SWA_PREFIX].num_decode_tokens == ndec, "decode-only graph cases"
    _forward(mod, layer, q, out, captured, False)  # the eager warm-up run
    results = [compare(b0, [0] * len(b0.reqs), "capture (eager warm-up)")]
    graph = checks.CapturedForward(lambda md: _forward(mod, layer, q, out, md, False),
                                   captured, DEVICE)
    for reqs, pad in steps:
        replay = _replay_starts(reqs, swa_spec)
        b = _batch(w, reqs, pad, case, replay, g, *blocks)
        checks.rewrite_inputs(run, b)  # new values, same tensors
        topk.copy_(_topk_buffer(w, b, ratio, g, case.get("holes", 0.0), ndec))
        q.copy_(C.make_queries(w, [p for _, p in b.toks] + [0] * pad, g)[0])
        out.fill_(float("nan"))
        if case.get("rebuild", True):
            build(b, replay, capture=False)
        graph.replay()
        results.append(compare(b, replay, "replay"))
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
    # the V4 Ampere modules first: the V4.1 ones import them
    mod = checks.boot(args.tree, args.overlay, args.capability, tuple(
        f"vllm.models.deepseek_v4.nvidia.{m}" for m in ("ampere_ops", "ampere_indexer",
                                                        "ampere_sparse"))
        + ("vllm.models.deepseek_v41.nvidia.ampere_sparse",), device=DEVICE)
    import layer_cases as C

    C.SWA_BS = 32   # V4.1's SWA pages (DeepseekV4SWACache); read by build_world, oracle_token
    if args.graph:
        return checks.run_cases(args.case or list(GRAPH_CASES),
                                lambda name: run_graph_case(mod, name, GRAPH_CASES[name]))
    return checks.run_cases(args.case or list(CASES),
                            lambda name: run_case(mod, name, CASES[name]))


if __name__ == "__main__":
    sys.exit(main())
