"""vLLM's own indexer decode metadata, fed to the Ampere indexer adapter (CPU).

Run in a subprocess by tests/test_vllm_indexer_decode_sm80.py:
``python tests/vllm_indexer_decode_check.py --tree T [--capability 8.0] [--device cuda]`` with
TRITON_INTERPRET=1. The tree is imported under a CUDA platform mocked to the capability
(tests/vllm_cpu_harness.py, no DeepGEMM). For each batch of :data:`CASES` it

1. builds the metadata with vLLM's ``DeepseekV32IndexerMetadataBuilder.build``
   (v1/attention/backends/mla/indexer.py: its split into decodes and prefills, its
   native / flattened / padded decode tensors, the compressed lengths, its Triton
   preparation kernels run by the interpreter) on the CPU, from a
   ``CommonAttentionMetadata`` laid out as vLLM's model runner lays out a speculative
   decode step (requests in order, per-request query lengths, full-width block table);
2. runs ``AmpereSparseAttnIndexer._forward`` of the working copy's overlay on that
   metadata (the portable scorer on the CPU) and records the [rows, next_n] shape each
   ``decode_topk`` call was given;
3. compares every token's top-k set with the float64 oracle over the compressed
   entries that token may see (``(seq_len - query_len + 1 + j) // ratio`` of its request's
   pages), and checks that buffer rows past the batch hold -1.

Prints one line ``RESULT {case: {"ok", "calls", "builder": {...}}}``."""

from __future__ import annotations

import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_builder_check as checks  # noqa: E402
import vllm_cpu_harness as harness  # noqa: E402

#: name -> (speculative tokens, compress ratio, page size in tokens, V4.1 candidate step
#: (None, "write" or "mask"), [(seq_len, query_len) per request]). seq_len counts the
#: request's tokens including this step's query (vLLM's seq_lens). Page sizes are the
#: indexer backends' kernel block sizes below SM90: V4 256, V4.1 128 (indexer.py).
CASES: dict[str, tuple[int, int, int, str | None, list[tuple[int, int]]]] = {
    # DSpark / MTP with 5 draft tokens: next_n 6 > 2 is flattened below SM90.
    "flat_uniform_c4": (5, 4, 256, None, [(1000, 6), (411, 6), (777, 6)]),
    # DSpark with 7 draft tokens (upstream's recipe default for DeepSeek-V4-Flash): next_n 8,
    # the most rows per request the regrouping and the scorer's rows kernel take.
    "flat_uniform_c4_k7": (7, 4, 256, None, [(1000, 8), (411, 8)]),
    "v41_flat_uniform_c1_mask_k7": (7, 1, 128, "mask", [(300, 8), (97, 8), (520, 8)]),
    # A request with fewer tokens (short extend counted as a decode): variable flattening.
    "flat_variable_c4": (5, 4, 256, None, [(1000, 6), (203, 3), (777, 6)]),
    # Padding requests (query length 0, seq_len 0), as in a CUDA-graph padded batch.
    "flat_padded_c4": (5, 4, 256, None, [(1000, 6), (411, 6), (0, 0), (0, 0)]),
    # One draft token: native [B, 2] rows, 2-D lengths.
    "native2_c4": (1, 4, 256, None, [(900, 2), (35, 2), (640, 2)]),
    # A padding request in a next_n 2 step: the padded (pack_seq) path.
    "native2_padded_c4": (1, 4, 256, None, [(900, 2), (35, 2), (0, 0)]),
    # No speculation.
    "plain_c4": (0, 4, 256, None, [(900, 1), (35, 1), (640, 1), (5, 1)]),
    # An MTP draft step after the first: the drafter advances every seq_len by one and vLLM
    # refreshes the decode metadata in place (``update_draft_decode_metadata``).
    "draft_update_c4": (1, 4, 256, None, [(899, 1), (34, 1), (639, 1), (4, 1)]),
    # DeepSeek-V4.1: C2A / C1A indexers with the two-level candidate step, flattened.
    "v41_flat_uniform_c2_write": (3, 2, 128, "write", [(300, 4), (97, 4), (520, 4), (64, 4)]),
    "v41_flat_uniform_c1_mask": (3, 1, 128, "mask", [(300, 4), (97, 4), (201, 4)]),
    "v41_flat_variable_c2_mask": (3, 2, 128, "mask", [(300, 4), (97, 2), (520, 4)]),
    # Prefills (vLLM's prefill chunks: cu_seqlen_ks / ke, token ranges, the K gather per
    # chunk): prefill only; logits budget of 1 MB (CASE_ENV), so that vLLM splits one long
    # request along its queries (the second slice skips the gather) and two requests into
    # two chunks; decodes then prefills; V4.1 with the candidate step.
    "prefill_c4": (0, 4, 256, None, [(700, 40), (300, 300)]),
    "prefill_query_split_c4": (0, 4, 256, None, [(4000, 400)]),
    "prefill_two_chunks_c4": (0, 4, 256, None, [(2000, 200), (1600, 300)]),
    "mixed_c4": (1, 4, 256, None, [(900, 2), (35, 2), (700, 40), (300, 64)]),
    "v41_mixed_c2_mask": (1, 2, 128, "mask", [(300, 2), (97, 2), (520, 30)]),
    "v41_prefill_c1_write": (0, 1, 128, "write", [(300, 20), (97, 97)]),
    # A 1-token request before next_n 2 ones: vLLM keeps a decode batch uniform below SM90
    # (require_uniform without flattening), so the longer requests become prefills; V4 top-k
    # and V4.1's candidate rows written and read over that split.
    "short_first_mixed_c4": (1, 4, 256, None, [(97, 1), (900, 2), (700, 40)]),
    "v41_short_first_mixed_c2_write": (1, 2, 128, "write", [(97, 1), (300, 2), (520, 30)]),
    "v41_short_first_mixed_c2_mask": (1, 2, 128, "mask", [(97, 1), (300, 2), (520, 30)]),
    # V4.1 in the padded (pack_seq) decode: a CUDA-graph padding request after next_n 2 ones.
    "v41_native2_padded_c2_write": (1, 2, 128, "write", [(300, 2), (97, 2), (0, 0)]),
    "v41_native2_padded_c1_mask": (1, 1, 128, "mask", [(300, 2), (97, 2), (0, 0)]),
    # V4.1's candidate source in chunks of requests (CANDIDATE_BUDGET below: one request a
    # chunk), flattened and regrouped, and in the padded path through the packed candidate rows
    "v41_flat_uniform_c2_write_chunks": (3, 2, 128, "write",
                                         [(300, 4), (97, 4), (520, 4), (64, 4)]),
    "v41_native2_padded_c2_write_chunks": (1, 2, 128, "write", [(300, 2), (97, 2), (0, 0)]),
    # The same batches as the short_first ones with vLLM's split told not to require uniform
    # decodes (NON_UNIFORM_SPLIT: what its builder makes where varlen decodes are allowed):
    # decode lengths [1, 2] padded to [2, 2] rows, the 4th of which is the prefill's first
    # token row. Unreachable through vLLM below SM90 today; the adapter keeps it right.
    "nonuniform_mixed_c4": (1, 4, 256, None, [(97, 1), (900, 2), (700, 40)]),
    "v41_nonuniform_mixed_c2_write": (1, 2, 128, "write", [(97, 1), (300, 2), (520, 30)]),
    "v41_nonuniform_mixed_c2_mask": (1, 2, 128, "mask", [(97, 1), (300, 2), (520, 30)]),
}
#: Environment of a case while vLLM builds its metadata (read by vllm.envs at build time).
CASE_ENV = {"prefill_query_split_c4": {"VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "1"},
            "prefill_two_chunks_c4": {"VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "1"}}


def fuzz_cases(n: int = 12, seed: int = 20261205) -> dict[str, tuple]:
    """``n`` random batches, the same on every run (``seed``), in the order vLLM's scheduler
    gives them (decodes, then prefills; CUDA-graph padding requests only after a decode-only
    batch): 0-7 speculative tokens, V4's C4 indexer or V4.1's with the candidate step, up to
    five decodes (most of them the full 1 + k tokens) and up to three prefills (fresh or
    after a prefix, up to 4,000 tokens of context) within max_num_batched_tokens. Every second
    batch is built with a 1 MB logits budget, so that vLLM splits its prefills into several
    chunks and query slices. Other ports' silent corruptions came from batch compositions no
    hand-written case had (docs/field-notes of the project's brief)."""
    import random

    rnd = random.Random(seed)
    layers = ((4, 256, None), (4, 256, None), (2, 128, "write"), (1, 128, "write"),
              (1, 128, "mask"), (2, 128, "mask"))
    out: dict[str, tuple] = {}
    for i in range(n):
        k = rnd.choice((0, 1, 3, 5, 7))
        ratio, page, cand = rnd.choice(layers)
        reqs, _ = checks.random_step(rnd, k, max_seq=4000, max_decodes=5, max_prefills=3,
                                     prefill_q=400, budget=1000)
        out[f"fuzz_{i:02d}"] = (k, ratio, page, cand, reqs)
    return out


FUZZ_CASES = fuzz_cases()
CASES.update(FUZZ_CASES)
CASE_ENV.update({name: {"VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "1"}
                 for i, name in enumerate(sorted(FUZZ_CASES)) if i % 2})
#: Cases run with ``deepinfer_sm80.ampere.indexer.CANDIDATE_DECODE_BUDGET`` set to this many
#: bytes: the candidate source's decode then runs one request a chunk.
CANDIDATE_BUDGET = {"v41_flat_uniform_c2_write_chunks": 1, "v41_native2_padded_c2_write_chunks": 1}
#: Cases whose metadata is built with split_decodes_and_prefills(require_uniform=False).
NON_UNIFORM_SPLIT = {"nonuniform_mixed_c4", "v41_nonuniform_mixed_c2_write",
                     "v41_nonuniform_mixed_c2_mask"}

H, D, TOPK = 16, 128, 32
#: Where the metadata, cache and scorer live: "cpu" (portable scorer, Triton interpreter) or
#: "cuda" (vLLM's Triton kernels compiled, this project's CUDA scorer; --device cuda).
DEVICE = "cpu"
CAND_BLOCK, CAND_BLOCKS = 8, 5     # V4.1 candidate block size and blocks per token (small)


def _config(num_spec: int, page_tokens: int):
    from vllm.config import AttentionConfig

    hf = types.SimpleNamespace(model_type="deepseek_v4", index_topk=TOPK)
    attention = AttentionConfig()
    attention.sparse_mla_prefill_workspace_factor = 5  # vLLM's default, set at engine start
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=hf, hf_text_config=hf, max_model_len=4096,
                                           architectures=["DeepseekV4ForCausalLM"]),
        parallel_config=types.SimpleNamespace(
            tensor_parallel_size=1, decode_context_parallel_size=1,
            prefill_context_parallel_size=1, cp_kv_cache_interleave_size=1),
        attention_config=attention,
        cache_config=types.SimpleNamespace(cache_dtype="fp8", block_size=page_tokens),
        # (vLLM sizes the builders' buffers from max_num_batched_tokens and never schedules
        # more tokens than it: at least every case's token count)
        scheduler_config=types.SimpleNamespace(max_num_seqs=16, max_num_batched_tokens=1024),
        # 0.34.0's indexer builder reads the layers' static forward context
        compilation_config=types.SimpleNamespace(static_forward_context={}, cudagraph_mode=None),
        speculative_config=(types.SimpleNamespace(num_speculative_tokens=num_spec,
                                                  enable_adaptive_verification=False,
                                                  max_num_new_slots_for_drafting=0)
                            if num_spec else None),
        num_speculative_tokens=num_spec)


def _common_metadata(reqs, block_table, page_tokens):
    """The model runner's tensors on DEVICE (host copies where vLLM keeps them on the host)."""
    import torch

    from vllm.v1.attention.backend import CommonAttentionMetadata

    qlens = [q for _, q in reqs]
    qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0).tolist()), dtype=torch.int32)
    seq = torch.tensor([s for s, _ in reqs], dtype=torch.int32)
    slots = []
    for r, (s, q) in enumerate(reqs):
        for pos in range(s - q, s):
            slots.append(int(block_table[r, pos // page_tokens]) * page_tokens + pos % page_tokens)
    return CommonAttentionMetadata(
        query_start_loc=qsl.to(DEVICE), query_start_loc_cpu=qsl.clone(), seq_lens=seq.to(DEVICE),
        num_reqs=len(reqs), num_actual_tokens=int(qsl[-1]), max_query_len=max(qlens),
        max_seq_len=int(seq.max()), block_table_tensor=block_table.to(DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        seq_lens_cpu_upper_bound=seq.clone())


def _pages(nreq: int, width: int, bs: int, g):
    """The indexer cache: ``nreq * width + 3`` pages of ``bs`` entries (dyadic e4m3 codes,
    power-of-two scales), and a block table of distinct pages per request in a random order
    (stale ids past each context). Returns (pages [nb, bs, D + 4] uint8, values [nb, bs, D]
    float64, scales [nb, bs], block_table [nreq, width] int32)."""
    import torch

    from indexer_cases import dyadic_fp8, k_scales

    nb = nreq * width + 3
    codes, vals = dyadic_fp8((nb, bs, D), g)
    sc = k_scales(nb * bs, g).view(nb, bs)
    raw = torch.zeros(nb, bs * (D + 4), dtype=torch.uint8)
    raw[:, : bs * D] = codes.view(nb, -1)
    raw[:, bs * D:] = sc.float().contiguous().view(torch.uint8).view(nb, -1)
    block_table = torch.randperm(nb, generator=g)[: nreq * width].view(nreq, width)
    return raw.view(nb, bs, D + 4), vals, sc, block_table.to(torch.int32).contiguous()


def cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
    """vLLM's compiled ``cp_gather_indexer_k_quant_cache`` (csrc/cache_kernels.cu; not built on
    the CPU), in torch: token t of request r lands in row ``cu_seq_lens[r] + t`` as its 128 code
    bytes and 4 scale bytes from block ``block_table[r, t // bs]`` (a block: bs x 128 codes,
    then bs x 4 scale bytes). The layout is checked bit for bit against the compiled op on the
    GPU (tests/gpu/test_vllm_c_indexer_k_gather_sm80.py); on CUDA the real op is not built here
    either, so this runs there too."""
    import torch

    nb, bs = kv_cache.shape[0], kv_cache.shape[1]
    flat = kv_cache.view(torch.uint8).reshape(nb, -1)
    dk = dst_k.view(torch.uint8)
    cu = cu_seq_lens.tolist()
    for r in range(len(cu) - 1):
        t = torch.arange(cu[r + 1] - cu[r], device=flat.device)
        blocks = flat[block_table[r, t // bs].long()]
        off = (t % bs).unsqueeze(1)
        dk[cu[r]:cu[r + 1]] = blocks.gather(1, off * D + torch.arange(D, device=flat.device))
        dst_scale[cu[r]:cu[r + 1]] = blocks.gather(
            1, bs * D + off * 4 + torch.arange(4, device=flat.device))


def run_case(name: str, num_spec: int, ratio: int, page_tokens: int, cand: str | None,
             reqs) -> dict:
    import torch

    from deepinfer_sm80.ampere import indexer as I
    from indexer_cases import (_oracle_candidates, _oracle_masked_topk, dyadic_fp8,
                               dyadic_weights, logits64)
    from vllm.models.deepseek_v4.nvidia import ampere_indexer as mi
    from vllm.v1.attention.backends.mla import indexer as mla
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    g = torch.Generator().manual_seed(sum(map(ord, name)))
    # block-table width (as wide as max_model_len: past every request's pages)
    width = max(6, -(-max(sq for sq, _ in reqs) // page_tokens) + 2)
    pages, vals, sc, block_table = _pages(len(reqs), width, page_tokens // ratio, g)
    spec = MLAAttentionSpec(block_size=page_tokens, num_kv_heads=1, max_tp_shards=1,
                            head_size=D + 4, dtype=torch.uint8, tokens_per_state=ratio,
                            alignment=512)
    cfg = _config(num_spec, page_tokens)
    # vLLM never schedules more tokens than max_num_batched_tokens, which sizes the
    # builders' buffers: a larger case would write past them (heap corruption under the
    # Triton interpreter, not an error)
    assert sum(q for _, q in reqs) <= cfg.scheduler_config.max_num_batched_tokens
    with harness._patched([(mla, "num_compute_units", lambda *a: 108)]):
        builder = mla.DeepseekV32IndexerMetadataBuilder(
            spec, ["l.indexer.k_cache"], cfg, torch.device(DEVICE), block_table_width=width)
    split = mla.split_decodes_and_prefills
    patches = ([(mla, "split_decodes_and_prefills",
                 lambda *a, **kw: split(*a, **{**kw, "require_uniform": False}))]
               if name in NON_UNIFORM_SPLIT else [])
    with checks.with_env(CASE_ENV.get(name, {})), harness._patched(patches):
        md = builder.build(0, _common_metadata(reqs, block_table, page_tokens))
    if name.startswith("draft_update"):
        md.seq_lens.add_(1)  # the drafter's next position (the common seq_lens, in place)
        builder.update_draft_decode_metadata(md)
        reqs = [(s + 1, q) for s, q in reqs]
    dm = md.decode
    info = {"num_decodes": md.num_decodes, "num_decode_tokens": md.num_decode_tokens,
            "num_prefills": md.num_prefills, "use_flattening": builder.use_flattening}
    if dm is not None:
        info.update(seq_lens_shape=list(dm.seq_lens.shape),
                    block_table_shape=list(dm.block_table.shape),
                    decode_is_uniform=bool(dm.decode_is_uniform),
                    requires_padding=bool(dm.requires_padding))

    T = md.num_decode_tokens + md.num_prefill_tokens
    if md.prefill is not None:
        info["prefill_chunks"] = [
            [c.token_start, c.token_end, bool(c.skip_kv_gather)] for c in md.prefill.chunks]
    q, q64 = dyadic_fp8((T, H, D), g)
    w64 = dyadic_weights((T, H), g)
    spare = 3
    buf = torch.full((T + spare, TOPK), -7, dtype=torch.int32, device=DEVICE)  # poison
    op = object.__new__(mi.AmpereSparseAttnIndexer)
    torch.nn.Module.__init__(op)
    op.k_cache = types.SimpleNamespace(prefix="l.indexer.k_cache", kv_cache=pages.to(DEVICE))
    op.topk_indices_buffer, op.topk_tokens, op.head_dim = buf, TOPK, D
    # the gather workspace's rows, as the layer sizes it: the builder's prefill buffer (its
    # chunks never hold more compressed entries)
    op.max_total_seq_len = builder.max_prefill_buffer_size
    blocks = None
    if cand is not None:  # V4.1: the candidate-source indexer writes, later ones mask
        blocks = (torch.full((T + spare, CAND_BLOCKS), -7, dtype=torch.int32) if cand == "write"
                  else torch.randint(-1, 40, (T + spare, CAND_BLOCKS), generator=g,
                                     dtype=torch.int32)).to(DEVICE)
        op.candidate_blocks, op.candidate_block_size = blocks, CAND_BLOCK
        op.candidate_write = cand == "write"
    calls, prefill_calls = [], []
    real, real_prefill = mi.ampere_indexer.decode_topk, mi.ampere_indexer.prefill_topk

    def spy(q4, *a, **kw):
        calls.append(list(q4.shape[:2]))
        return real(q4, *a, **kw)

    def spy_prefill(q, *a, **kw):
        prefill_calls.append(q.shape[0])
        return real_prefill(q, *a, **kw)

    with harness._patched([
            (mi, "get_forward_context",
             lambda: types.SimpleNamespace(attn_metadata={"l.indexer.k_cache": md})),
            (mi.ampere_indexer, "decode_topk", spy),
            (mi.ampere_indexer, "prefill_topk", spy_prefill),
            (mi.ops, "cp_gather_indexer_k_quant_cache", cp_gather_indexer_k_quant_cache)]
            + ([(mi.ampere_indexer, "CANDIDATE_DECODE_BUDGET", CANDIDATE_BUDGET[name])]
               if name in CANDIDATE_BUDGET else [])):
        op._forward(torch.zeros(T + spare, 8, device=DEVICE),
                    q.to(DEVICE).view(torch.float8_e4m3fn), None, w64.float().to(DEVICE))
    buf = buf.cpu()
    blocks = None if blocks is None else blocks.cpu()

    ok = bool((buf[T:] == -1).all())
    bad = []
    t = 0
    for r, (s, qlen) in enumerate(reqs):
        kv = torch.cat([vals[int(p)] for p in block_table[r]])
        ks = torch.cat([sc[int(p)] for p in block_table[r]])
        for j in range(qlen):
            n = (s - qlen + 1 + j) // ratio
            L = logits64(q64[t:t + 1], w64[t:t + 1], kv, ks)
            valid = (torch.arange(kv.shape[0]) < n).unsqueeze(0)
            got = {x for x in buf[t].tolist() if x >= 0}
            if cand == "write":
                good = blocks[t].tolist() == _oracle_candidates(L[0], n, CAND_BLOCK, CAND_BLOCKS)
            elif cand == "mask":
                good = got == _oracle_masked_topk(L[0], n, blocks[t].tolist(), CAND_BLOCK, TOPK)
            else:
                good = got == I.reference_topk_sets(L, valid, TOPK)[0]
            if not good or (buf[t] == -7).any():
                bad.append(t)
            t += 1
    ok &= not bad and t == T
    if cand == "write":
        ok &= bool((blocks[T:] == -7).all())  # candidate rows past the batch untouched
    return {"ok": bool(ok), "bad_rows": bad[:8], "rows": t, "calls": calls,
            "prefill_calls": prefill_calls, "builder": info}


# --------------------------------------------------------------- FULL CUDA-graph decode

#: ``--graph``: name -> (speculative tokens, ratio, page tokens, V4.1 candidate step,
#: [([(seq_len, query_len) per request], padded tokens) per replayed step]). Captured as
#: vLLM's model runner (V2) captures a uniform-decode graph: ``InputBatch.make_dummy``'s
#: batch (every request the same query length, seq_len = query length) built with
#: ``build_for_cudagraph_capture`` at max_seq_len = max_model_len, one eager warm-up run,
#: then the capture. Each replayed step writes its values into the same model-runner
#: tensors (query_start_loc, seq_lens, block table, slot mapping), q and the weights,
#: rebuilds with ``build`` (padding requests of query length 0 and padded tokens, as the
#: runner pads a smaller batch to the graph's size) and replays; on the CPU the replay is
#: emulated (``_forward`` on the captured metadata objects). The capture's batch is
#: uniform, so vLLM flattens it with the uniform kernel and the adapter regroups it to
#: [requests, next_n] rows; a padded replay takes vLLM's variable path into the same
#: buffers. ``rebuild=False`` replays without rebuilding: the negative control.
GRAPH_CASES = {
    "graph_flat_c4": (5, 4, 256, None,
                      [([(1000, 6), (411, 6), (777, 6), (40, 6)], 0),
                       ([(1000, 6), (411, 6), (0, 0), (0, 0)], 12),
                       ([(1500, 6), (90, 6), (300, 6), (0, 0)], 6)]),
    "graph_native2_c4": (1, 4, 256, None,
                         [([(900, 2), (35, 2), (640, 2)], 0),
                          ([(1200, 2), (60, 2), (0, 0)], 2)]),
    "graph_plain_c4": (0, 4, 256, None,
                       [([(900, 1), (35, 1), (640, 1), (5, 1)], 0),
                        ([(1300, 1), (80, 1), (0, 0), (0, 0)], 2)]),
    "graph_v41_flat_c2_write": (3, 2, 128, "write",
                                [([(300, 4), (97, 4), (520, 4)], 0),
                                 ([(340, 4), (0, 0), (0, 0)], 8)]),
    "control_graph_no_rebuild": (5, 4, 256, None,
                                 [([(1000, 6), (411, 6), (777, 6)], 0)]),
}


def fuzz_graph_cases(n: int = 4, seed: int = 20261205) -> dict[str, tuple]:
    """``n`` random graph cases, the same on every run: 0-7 speculative tokens, V4's C4
    indexer or V4.1's candidate-source step, a graph of 2-5 requests, and 2-3 replays with
    1 to all of them real (uniform decodes at 1 + k tokens, up to 4,000 tokens of context),
    the rest padding requests and padded tokens."""
    import random

    rnd = random.Random(seed + 1)
    out: dict[str, tuple] = {}
    for i in range(n):
        k = rnd.choice((0, 1, 3, 5, 7))
        ratio, page, cand = rnd.choice(((4, 256, None), (2, 128, "write")))
        steps = checks.random_graph_steps(rnd, k, 4000)
        out[f"fuzz_graph_{i:02d}"] = (k, ratio, page, cand, steps)
    return out


GRAPH_CASES.update(fuzz_graph_cases())


def run_graph_case(name: str, num_spec: int, ratio: int, page_tokens: int, cand, steps
                   ) -> dict:
    import torch

    from deepinfer_sm80.ampere import indexer as I
    from indexer_cases import (_oracle_candidates, dyadic_fp8, dyadic_weights, logits64)
    from vllm.models.deepseek_v4.nvidia import ampere_indexer as mi
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.mla import indexer as mla
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    g = torch.Generator().manual_seed(sum(map(ord, name)))
    nreq, ntok = checks.graph_shape(steps)
    max_model_len = 4096
    width = max_model_len // page_tokens
    pages, vals, sc, block_table = _pages(nreq, width, page_tokens // ratio, g)
    spec = MLAAttentionSpec(block_size=page_tokens, num_kv_heads=1, max_tp_shards=1,
                            head_size=D + 4, dtype=torch.uint8, tokens_per_state=ratio,
                            alignment=512)
    cfg = _config(num_spec, page_tokens)
    with harness._patched([(mla, "num_compute_units", lambda *a: 108)]):
        builder = mla.DeepseekV32IndexerMetadataBuilder(
            spec, ["l.indexer.k_cache"], cfg, torch.device(DEVICE), block_table_width=width)
    # the model runner's persistent inputs
    run = types.SimpleNamespace(
        qsl=torch.zeros(nreq + 1, dtype=torch.int32, device=DEVICE),
        seq=torch.zeros(nreq, dtype=torch.int32, device=DEVICE),
        bt=block_table.to(DEVICE), slots=torch.zeros(ntok, dtype=torch.int64, device=DEVICE))

    def common(reqs, capture: bool):
        qlens = [q for _, q in reqs]
        qsl = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
        seq = torch.tensor([s for s, _ in reqs], dtype=torch.int32)
        slots = [int(block_table[r, pos // page_tokens]) * page_tokens + pos % page_tokens
                 for r, (s, q) in enumerate(reqs) for pos in range(s - q, s)]
        run.qsl.copy_(qsl)
        run.seq.copy_(seq)
        run.slots.copy_(torch.tensor(slots + [-1] * (ntok - len(slots)), dtype=torch.int64))
        return CommonAttentionMetadata(
            query_start_loc=run.qsl, query_start_loc_cpu=qsl, seq_lens=run.seq,
            num_reqs=nreq, num_actual_tokens=ntok, max_query_len=max(qlens),
            max_seq_len=max_model_len if capture else int(seq.max()),
            block_table_tensor=run.bt, slot_mapping=run.slots, seq_lens_cpu_upper_bound=seq)

    spare = 3
    buf = torch.full((ntok + spare, TOPK), -7, dtype=torch.int32, device=DEVICE)
    qbuf = torch.zeros(ntok, H, D, dtype=torch.uint8, device=DEVICE)
    wbuf = torch.zeros(ntok, H, dtype=torch.float32, device=DEVICE)
    x = torch.zeros(ntok + spare, 8, device=DEVICE)
    op = object.__new__(mi.AmpereSparseAttnIndexer)
    torch.nn.Module.__init__(op)
    op.k_cache = types.SimpleNamespace(prefix="l.indexer.k_cache", kv_cache=pages.to(DEVICE))
    op.topk_indices_buffer, op.topk_tokens, op.head_dim = buf, TOPK, D
    op.max_total_seq_len = max_model_len
    blocks = None
    if cand is not None:
        blocks = torch.full((ntok + spare, CAND_BLOCKS), -7, dtype=torch.int32, device=DEVICE)
        op.candidate_blocks, op.candidate_block_size = blocks, CAND_BLOCK
        op.candidate_write = cand == "write"

    def forward(md):
        with harness._patched([(mi, "get_forward_context", lambda: types.SimpleNamespace(
                attn_metadata={"l.indexer.k_cache": md}))]):
            op._forward(x, qbuf.view(torch.float8_e4m3fn), None, wbuf)

    def fresh_inputs():
        q, q64 = dyadic_fp8((ntok, H, D), g)
        w64 = dyadic_weights((ntok, H), g)
        qbuf.copy_(q.to(DEVICE))
        wbuf.copy_(w64.float().to(DEVICE))
        return q64, w64

    def compare(reqs, q64, w64, step: str) -> dict:
        got_buf = buf.cpu()
        got_blocks = None if blocks is None else blocks.cpu()
        bad, t = [], 0
        for r, (s, qlen) in enumerate(reqs):
            kv = torch.cat([vals[int(pg)] for pg in block_table[r]])
            ks = torch.cat([sc[int(pg)] for pg in block_table[r]])
            for j in range(qlen):
                n = (s - qlen + 1 + j) // ratio
                L = logits64(q64[t:t + 1], w64[t:t + 1], kv, ks)
                valid = (torch.arange(kv.shape[0]) < n).unsqueeze(0)
                if cand == "write":
                    good = got_blocks[t].tolist() == _oracle_candidates(L[0], n, CAND_BLOCK,
                                                                        CAND_BLOCKS)
                else:
                    good = ({x for x in got_buf[t].tolist() if x >= 0}
                            == I.reference_topk_sets(L, valid, TOPK)[0])
                if not good or (got_buf[t] == -7).any():
                    bad.append(t)
                t += 1
        past = bool((got_buf[ntok:] == -1).all())
        return {"step": step, "tokens": t, "bad_rows": bad[:8], "rows_past_batch_fill": past}

    dummy = checks.dummy_reqs(nreq, ntok)
    captured = builder.build_for_cudagraph_capture(common(dummy, capture=True))
    info = {"capture_uniform": bool(captured.decode.decode_is_uniform),
            "capture_seq_lens_shape": list(captured.decode.seq_lens.shape),
            "num_decode_tokens": captured.num_decode_tokens}
    q64, w64 = fresh_inputs()
    forward(captured)  # the eager warm-up run
    results = [compare(dummy, q64, w64, "capture (eager warm-up)")]
    graph = checks.CapturedForward(forward, captured, DEVICE)
    replay_uniform = []
    for reqs, _pad in steps:
        cm = common(reqs, capture=False)
        if not name.startswith("control_"):
            md = builder.build(0, cm)
            replay_uniform.append(bool(md.decode.decode_is_uniform))
        q64, w64 = fresh_inputs()
        buf.fill_(-7)
        if blocks is not None:
            blocks.fill_(-7)
        graph.replay()
        results.append(compare(reqs, q64, w64, "replay"))
    info["replay_uniform"] = replay_uniform
    ok = all(not r["bad_rows"] and r["rows_past_batch_fill"] for r in results)
    return {"ok": bool(ok), "steps": results, "graph": graph.graph is not None,
            "builder": info}


def main(argv=None) -> int:
    ap = checks.arg_parser(__doc__)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--graph", action="store_true",
                    help="the FULL CUDA-graph cases (GRAPH_CASES; emulated on the CPU)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    checks.boot(args.tree, args.overlay, args.capability,
                ("vllm.models.deepseek_v4.nvidia.ampere_indexer",), device=DEVICE)
    if args.graph:
        return checks.run_cases(args.case or list(GRAPH_CASES),
                                lambda name: run_graph_case(name, *GRAPH_CASES[name]))
    return checks.run_cases(args.case or list(CASES), lambda name: run_case(name, *CASES[name]))


if __name__ == "__main__":
    sys.exit(main())
