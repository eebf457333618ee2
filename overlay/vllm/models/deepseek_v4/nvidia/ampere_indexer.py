# SPDX-License-Identifier: Apache-2.0
"""DeepSeek-V4 lightning indexer on SM80/SM86 (no DeepGEMM).

``DeepseekV4AmpereIndexer`` is ``DeepseekV4Indexer`` with
* ``_get_attn_cls`` -> ``AmpereSparseAttnIndexer``: logits over exactly
  dequantised FP8 in row chunks x column tiles and a deterministic top-k
  (``deepinfer_sm80.ampere.indexer``), instead of DeepGEMM's
  ``fp8_fp4_mqa_logits`` / ``fp8_fp4_paged_mqa_logits`` and the SM80 top-k
  kernels that other ports found racy;
* ``_get_cache_cls`` -> the upstream FP8 cache layout (132-byte page);
* the index-Q RoPE + FP8 quantisation through the software-e4m3 Triton
  writer (``deepinfer_sm80.triton_writers.indexer_q_rope_quant``), since both
  upstream variants (CuTe DSL, Triton ``fp8e4nv``) need SM89+.
The FP8 indexer cache (132-byte page) is kept: MXFP4 needs SM100.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from deepinfer_sm80.ampere import indexer as ampere_indexer
from deepinfer_sm80.ampere import indexer_memory
from deepinfer_sm80.triton_writers import indexer_q_rope_quant
from vllm import _custom_ops as ops
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.models.deepseek_v4.attention import DeepseekV4Indexer, DeepseekV4IndexerCache
from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadata
from vllm.v1.worker.workspace import current_workspace_manager


def _flattened_uniform_rows(m, dm) -> int:
    """next_n when vLLM's indexer metadata flattened a uniform multi-token decode (every
    request ``next_n`` in 2..8 tokens, one row per token: ``decode_lens`` per token,
    per-token ``seq_lens`` = (L - next_n + 1 + j) // ratio as a [tokens, 1] column (build()
    unsqueezes the flattened 1-D lengths; a 1-D form is taken too), the block table
    repeated per token; ``DeepseekV32IndexerMetadataBuilder._prepare_decode_tensors`` in
    v1/attention/backends/mla/indexer.py, which flattens below SM90 for next_n > 2), else 0.
    Decided from host metadata only (``decode_is_uniform``, ``write_max_decode_len``, the
    request and token counts, shapes): the same at CUDA-graph capture and replay.
    tests/test_vllm_indexer_decode_sm80.py runs vLLM's builder into it."""
    L = int(getattr(dm, "write_max_decode_len", 0) or 0)
    if not getattr(dm, "decode_is_uniform", False) or not 2 <= L <= 8:
        return 0
    nd = m.num_decode_tokens
    sl = dm.seq_lens
    per_token = sl.dim() == 1 or (sl.dim() == 2 and sl.shape[1] == 1)
    if (m.num_decodes * L != nd or dm.decode_lens.shape[0] != nd or not per_token
            or sl.shape[0] < nd or dm.block_table.shape[0] < nd):
        return 0
    return L


class AmpereSparseAttnIndexer(SparseAttnIndexer):
    """Scores and selects top-k for the FP8 indexer cache without DeepGEMM."""

    # DeepSeek-V4.1's two-level selection; V4 (and instances built without
    # __init__, as in tests) has none.
    candidate_blocks: torch.Tensor | None = None
    candidate_block_size = 0
    candidate_write = False
    # decode rows of one step (max_num_seqs x (1 + speculative tokens)); 0: as many as tokens
    max_decode_rows = 0
    decode_next_n = 1

    def __init__(self, k_cache, quant_block_size: int, scale_fmt: str, topk_tokens: int,
                 head_dim: int, max_model_len: int, max_total_seq_len: int,
                 topk_indices_buffer: torch.Tensor, skip_k_cache_insert: bool = False,
                 use_fp4_cache: bool = False, compress_ratio: int = 1,
                 candidate_blocks: torch.Tensor | None = None, candidate_block_size: int = 0,
                 candidate_write: bool = False, **unsupported: Any):
        # SparseAttnIndexer.__init__ refuses CUDA without DeepGEMM; set the
        # same attributes without that check.
        CustomOp.__init__(self)
        if use_fp4_cache:
            raise ValueError("DeepSeek-V4 on SM80 keeps the FP8 indexer cache (MXFP4 needs SM100)")
        if any(v for v in unsupported.values()):
            raise ValueError(f"SM80 indexer does not support {sorted(unsupported)}")
        self.k_cache = k_cache
        self.quant_block_size = quant_block_size
        self.scale_fmt = scale_fmt
        self.topk_tokens = topk_tokens
        self.head_dim = head_dim
        self.max_model_len = max_model_len
        self.max_total_seq_len = max_total_seq_len
        self.topk_indices_buffer = topk_indices_buffer
        self.skip_k_cache_insert = skip_k_cache_insert
        self.use_fp4_cache = False
        self.compress_ratio = compress_ratio
        # DeepSeek-V4.1's two-level selection (None for V4): the candidate-source
        # indexer writes its best blocks per token here, later indexers mask to them.
        if candidate_blocks is not None and candidate_block_size <= 0:
            raise ValueError("candidate_blocks needs candidate_block_size > 0")
        self.candidate_blocks = candidate_blocks
        self.candidate_block_size = candidate_block_size
        self.candidate_write = candidate_write
        self.dense_mha_metadata_layer_name = ""
        cfg = get_current_vllm_config()
        parallel = cfg.parallel_config
        if parallel.decode_context_parallel_size > 1 or parallel.prefill_context_parallel_size > 1:
            raise ValueError("DeepSeek-V4 on SM80: context parallelism is not supported")
        spec = cfg.speculative_config
        n_spec = (getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
        max_seqs = int(getattr(cfg.scheduler_config, "max_num_seqs", 0) or 0)
        self.max_decode_rows = max_seqs * (1 + n_spec)
        self.decode_next_n = 1 + n_spec  # rows a request in a decode step

    def profile_scratch_bytes(self, tokens: int, heads: int, device: torch.device) -> int:
        """The most memory one step of this indexer takes beyond its inputs, outputs and
        vLLM's workspace: a prefill of ``tokens`` rows over the gathered workspace, or an eager
        decode (no CUDA graph: larger than the captured sizes, or enforce_eager) of up to
        ``max_decode_rows`` rows over a block table as wide as max_model_len, whichever is
        larger (``deepinfer_sm80.ampere.indexer_memory``); a padded decode's packed copies
        counted too."""
        device = torch.device(device)
        sms = (ampere_indexer._sm_count(ampere_indexer._cuda_index(device))
               if device.type == "cuda" else 0)
        cand = {}
        if self.candidate_blocks is not None:
            cand = dict(candidate_k=self.candidate_blocks.shape[1],
                        candidate_block_size=self.candidate_block_size,
                        candidate_write=self.candidate_write)
        ratio = max(1, getattr(self, "compress_ratio", 1))
        cache_cfg = getattr(self.k_cache, "cache_config", None)
        page = max(1, getattr(cache_cfg, "block_size", 64) // ratio)  # compressed entries
        columns = -(-self.max_model_len // page) * page  # the decode block table's width
        topk = self.topk_tokens
        prefill = indexer_memory.prefill_scratch_bytes(
            tokens, heads, self.max_total_seq_len, topk, sm_count=sms,
            row_columns=self.max_model_len, **cand)
        rows = min(tokens, self.max_decode_rows) if self.max_decode_rows else tokens
        decode = indexer_memory.decode_scratch_bytes(rows, heads, columns, page, topk,
                                                     sm_count=sms, next_n=self.decode_next_n,
                                                     **cand)
        k = cand.get("candidate_k", 0)
        decode += rows * (topk * 4 + heads * (self.head_dim + 4) + 2 * k * 4)  # packed copies
        return max(prefill, decode)

    def _candidates(self, r0: int, r1: int) -> ampere_indexer.CandidateStep | None:
        """The candidate step for token rows [r0, r1): prefill chunk rows, unpadded decode
        rows (a padded decode's go through ``_packed_candidate_rows``)."""
        if self.candidate_blocks is None:
            return None
        return self._candidate_step(self.candidate_blocks[r0:r1])

    def forward_native(self, hidden_states, q_quant, k, weights):
        return self._forward(hidden_states, q_quant, k, weights)

    def forward_cuda(self, hidden_states, q_quant, k, weights):
        return self._forward(hidden_states, q_quant, k, weights)

    def _forward(self, hidden_states: torch.Tensor, q_quant, k, weights: torch.Tensor):
        if isinstance(q_quant, tuple):
            raise ValueError("SM80 indexer takes FP8 Q (q scale folded into weights)")
        buf = self.topk_indices_buffer
        md = get_forward_context().attn_metadata
        if not isinstance(md, dict):
            # Profile run: reserve the prefill gather workspace, and let the memory profile see
            # the scoring's scratch (upstream allocates its logits budget here the same way).
            current_workspace_manager().get_simultaneous(
                ((self.max_total_seq_len, self.head_dim), torch.uint8),
                ((self.max_total_seq_len, 4), torch.uint8),
            )
            n = self.profile_scratch_bytes(hidden_states.shape[0], weights.shape[-1],
                                           hidden_states.device)
            _ = torch.empty(n, dtype=torch.uint8, device=hidden_states.device)
            return buf
        m = cast(DeepseekV32IndexerMetadata, md[self.k_cache.prefix])
        kv_cache = self.k_cache.kv_cache
        q_u8 = q_quant.view(torch.uint8)
        buf[: hidden_states.shape[0]] = -1
        topk = self.topk_tokens

        if m.num_prefills > 0:
            pm = m.prefill
            k_full, s_full = current_workspace_manager().get_simultaneous(
                ((self.max_total_seq_len, self.head_dim), torch.uint8),
                ((self.max_total_seq_len, 4), torch.uint8),
            )
            for chunk in pm.chunks:
                n_rows = chunk.max_local_total_seq_lens or chunk.total_seq_lens
                k_q, k_s = k_full[:n_rows], s_full[:n_rows]
                if not chunk.skip_kv_gather and chunk.total_seq_lens > 0:
                    ops.cp_gather_indexer_k_quant_cache(
                        kv_cache, k_q.view(torch.float8_e4m3fn), k_s, chunk.block_table,
                        chunk.local_cu_seq_lens if chunk.local_cu_seq_lens is not None
                        else chunk.cu_seq_lens)
                r0, r1 = chunk.token_start, chunk.token_end
                if r1 <= r0:
                    continue
                ampere_indexer.prefill_topk(
                    q_u8[r0:r1], weights[r0:r1], k_q, k_s.view(torch.float32).view(-1),
                    chunk.cu_seqlen_ks, chunk.cu_seqlen_ke, topk, buf[r0:r1],
                    candidates=self._candidates(r0, r1))

        if m.num_decodes > 0:
            dm = m.decode
            nd = m.num_decode_tokens
            B = dm.decode_lens.shape[0]
            ctx, bt = dm.seq_lens[:B], dm.block_table[:B]
            rows_per_req = _flattened_uniform_rows(m, dm)
            padded = not rows_per_req and (dm.requires_padding or (nd % B != 0))
            if rows_per_req:
                # vLLM flattened a uniform speculative decode (one row per token, each with
                # its own copy of its request's block-table row: no native multi-row decode
                # below SM90 for next_n > 2). The same rows as [requests, next_n] again, with
                # each request's first block-table row: the scorer then reads each request's
                # K once for its next_n rows instead of once per row. Views only.
                next_n = rows_per_req
                B = nd // next_n
                qp = q_u8[:nd].view(B, next_n, *q_u8.shape[1:])
                wp = weights[:nd]
                ctx = dm.seq_lens[:nd].reshape(B, next_n)
                bt = dm.block_table[:nd:next_n]
                tmp = buf[:nd]
            elif padded:
                from vllm.v1.attention.ops.common import pack_seq_triton, unpack_seq_triton

                qp = pack_seq_triton(q_u8[:nd], dm.decode_lens, pad_value=0)
                wp = pack_seq_triton(weights[:nd], dm.decode_lens, pad_value=0.0)
                next_n = qp.shape[1]
                wp = wp.reshape(B * next_n, -1)
                tmp = torch.empty((B * next_n, topk), dtype=buf.dtype, device=buf.device)
            else:
                next_n = nd // B
                qp = q_u8[:nd].view(B, next_n, *q_u8.shape[1:])
                wp = weights[:nd]
                tmp = buf[: B * next_n]
            cand_rows = (self._packed_candidate_rows(nd, B, next_n, dm.decode_lens)
                         if padded else None)
            ampere_indexer.decode_topk(
                qp, wp, kv_cache, ctx, bt, kv_cache.shape[1], topk, tmp,
                candidates=(self._candidates(0, B * next_n) if cand_rows is None else
                            self._candidate_step(cand_rows)))
            if padded:
                rows = unpack_seq_triton(tmp[:, :topk].reshape(B, next_n, topk), dm.decode_lens)
                buf[: rows.shape[0], :topk] = rows
                if cand_rows is not None and self.candidate_write:
                    self._unpack_candidate_rows(cand_rows, nd, B, next_n, dm.decode_lens)
        return buf

    # The padded decode (pack_seq) runs [B, next_n] rows, more than its nd tokens. Its
    # candidate rows go through a packed copy, so that the buffer stays in token order: row t
    # is token t's, for the candidate source and for the layers that read it, and rows at or
    # past nd (a prefill's first tokens, or past the batch) are not written. Upstream slices
    # ``candidate_blocks[:B * next_n]`` in the packed order instead, which writes over those
    # rows (sparse_attn_indexer.py, decode branch). Below SM90 vLLM pads only CUDA-graph
    # padding requests (length 0, after the real ones), where both orders agree on every real
    # row; this keeps the buffer right for any decode_lens. Index arithmetic on the device
    # (no host sync), the sizes from host metadata.
    def _packed_candidate_rows(self, nd: int, B: int, next_n: int,
                               decode_lens: torch.Tensor) -> torch.Tensor | None:
        """[B * next_n, blocks]: the token rows' candidates in the decode's packed order
        (a padding slot repeats a row of the batch; its result is dropped), or uninitialised
        rows for the candidate source to write."""
        if self.candidate_blocks is None:
            return None
        cb = self.candidate_blocks
        if self.candidate_write or nd == 0:
            return torch.empty((B * next_n, cb.shape[1]), dtype=cb.dtype, device=cb.device)
        lens = decode_lens.to(device=cb.device, dtype=torch.int64)
        starts = torch.cumsum(lens, 0) - lens
        j = torch.arange(next_n, device=cb.device)
        token = starts.unsqueeze(1) + torch.minimum(j.unsqueeze(0), (lens - 1).unsqueeze(1))
        return cb[token.reshape(-1).clamp(0, nd - 1)]

    def _unpack_candidate_rows(self, packed: torch.Tensor, nd: int, B: int, next_n: int,
                               decode_lens: torch.Tensor) -> None:
        """Token t's packed row into ``candidate_blocks[t]``, for t < nd."""
        if nd == 0:
            return
        lens = decode_lens.to(device=packed.device, dtype=torch.int64)
        starts = torch.cumsum(lens, 0) - lens
        req = torch.repeat_interleave(torch.arange(B, device=packed.device), lens,
                                      output_size=nd)
        t = torch.arange(nd, device=packed.device)
        self.candidate_blocks[:nd].copy_(packed[req * next_n + (t - starts[req])])

    def _candidate_step(self, rows: torch.Tensor) -> ampere_indexer.CandidateStep:
        return ampere_indexer.CandidateStep(rows, self.candidate_block_size,
                                            self.candidate_write)


class DeepseekV4AmpereIndexerCache(DeepseekV4IndexerCache):
    """The upstream 132-byte FP8 indexer page, unchanged (the scorer above
    reads it directly).  Its metadata builder is upstream's; DeepGEMM's
    paged-MQA schedule metadata is skipped below SM90 by the patch set's
    architecture gate (indexer.py), not here."""


class DeepseekV4AmpereIndexer(DeepseekV4Indexer):
    def _get_compressor_cls(self):
        from vllm.models.deepseek_v4.nvidia.ampere_ops import AmpereCompressor

        return AmpereCompressor

    def _get_cache_cls(self):
        return DeepseekV4AmpereIndexerCache

    def _get_attn_cls(self):
        return AmpereSparseAttnIndexer

    def _register_q_quant_warmup(self) -> None:
        # Upstream registers Triton fp8e4nv / CuTe DSL kernels: SM89+ only.
        return None

    def _q_rope_quant(self, positions, q, rotary_emb, indexer_weights):
        return indexer_q_rope_quant(
            positions, q, rotary_emb.cos_sin_cache, indexer_weights, self.softmax_scale,
            self.n_head**-0.5)
