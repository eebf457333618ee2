# SPDX-License-Identifier: Apache-2.0
"""DeepSeek-V4.1 sparse MLA attention for SM80/SM86 (Ampere): the attention step.

Selected by V4.1's ``_select_dsv4_attn_cls`` (nvidia/model.py, patch 6) on capability
8.x; status and what is left in docs/v41-status.md of DeepInfer-SM80.

Same skeleton as V4.1's ``DeepseekV4FlashMLAAttention`` (``nvidia/flashmla.py``) with
FlashMLA replaced by ``deepinfer_sm80.ampere.layer`` (this package's sparse-MLA kernels
when built, portable implementations otherwise):

* V4.1's ratios: 0 is sliding-window only; 1 and 2 attend over a compressed region whose
  entries the index-source layer's top-k selects (``compressed_path="topk"``), read
  from the kv-source layer's compressed cache and metadata (``compressed_cache_prefix``);
* the SWA metadata builder never allocates FlashMLA's tile scheduler (the shared
  builder already skips it below 9.0; this one does regardless);
* ``get_padded_num_q_heads`` returns a head count the ``_C`` fused qnorm/RoPE/KV-insert
  op is instantiated for, as the V4 class does;
* the indexer without DeepGEMM (``DeepseekV41AmpereIndexer``);
* no prefill context parallelism (FlashMLA only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from deepinfer_sm80.ampere import layer as ampere_layer
from vllm.forward_context import get_forward_context
from vllm.models.deepseek_v4.nvidia.ampere_sparse import (
    DeepseekV4AmpereSparseAttention,
    NoTileSchedulerMixin,
    Sm8xBackendMixin,
    _VllmPrefillWorkspace,
    reserve_prefill_workspace,
)
from vllm.models.deepseek_v4.nvidia.ops.o_proj import compute_fp8_einsum_recipe
from vllm.models.deepseek_v41.attention import DeepseekV4Attention
from vllm.models.deepseek_v41.nvidia.ops.o_proj import dsv41_o_proj
from vllm.models.deepseek_v41.sparse_mla import (
    DeepseekV4FlashMLABackend,
    DeepseekV4FlashMLAMetadata,
    DeepseekV41SparseSWAMetadataBuilder,
)
from vllm.utils.math_utils import round_up
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend

if TYPE_CHECKING:
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata


class DeepseekV41AmpereSparseMLABackend(Sm8xBackendMixin, DeepseekV4FlashMLABackend):
    @staticmethod
    def get_name() -> str:
        return "AMPERE_SPARSE_DSV41"


class DeepseekSparseSWAAmpereV41MetadataBuilder(NoTileSchedulerMixin,
                                                DeepseekV41SparseSWAMetadataBuilder):
    pass


class DeepseekSparseSWAAmpereV41Backend(DeepseekSparseSWABackend):
    @staticmethod
    def get_builder_cls() -> type[DeepseekSparseSWAAmpereV41MetadataBuilder]:
        return DeepseekSparseSWAAmpereV41MetadataBuilder


class DeepseekV41AmpereSparseAttention(DeepseekV4Attention):
    """Sparse MLA attention layer for DeepSeek-V4.1 on SM80/SM86."""

    backend_cls = DeepseekV41AmpereSparseMLABackend
    swa_backend_cls = DeepseekSparseSWAAmpereV41Backend

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.use_pcp:
            raise NotImplementedError(
                "prefill context parallelism needs FlashMLA (SM90+); DeepSeek-V4.1 on "
                "SM80/SM86 runs without it")
        self._ampere_ops = ampere_layer.resolve_ops("cuda")
        # The output projection is upstream's dsv41_o_proj: below family 100 it is V4's
        # deep_gemm_fp8_o_proj, which takes the bf16 wo_a path (patch 3).
        self._einsum_recipe, self._tma_aligned_scales = compute_fp8_einsum_recipe(
            self._o_proj_block_size)

    def _indexer_cls(self, k_cache):
        from vllm.models.deepseek_v41.nvidia.ampere_indexer import DeepseekV41AmpereIndexer

        return DeepseekV41AmpereIndexer

    @classmethod
    def get_padded_num_q_heads(cls, num_heads: int) -> int:
        # the same _C insert op and instantiations as DeepSeek-V4
        return DeepseekV4AmpereSparseAttention.get_padded_num_q_heads(num_heads)

    def _o_proj(self, attn_out: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return dsv41_o_proj(self, attn_out, positions)

    def _combined_topk(self, top_k: int) -> int:
        return round_up(top_k + self.window_size, 128)

    def forward_mqa(self, q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor,
                    output: torch.Tensor) -> None:
        assert output.shape == q.shape and output.dtype == q.dtype
        attn_metadata = get_forward_context().attn_metadata
        swa_only = self.compress_ratio == 0
        if attn_metadata is None:
            reserve_prefill_workspace(self, q, output, swa_only)
            return
        assert isinstance(attn_metadata, dict)
        # The compressed cache and its metadata belong to the kv-source layer.
        mla_md = cast(
            "DeepseekV4FlashMLAMetadata | None",
            attn_metadata.get(self.compressed_cache_prefix)
            if self.compressed_cache_prefix is not None else None)
        swa_md = cast("DeepseekSparseSWAMetadata", attn_metadata.get(self.swa_cache_layer.prefix))
        assert swa_md is not None
        compressed_cache = None if swa_only else self._compressed_kv_cache()
        nd_tok = swa_md.num_decode_tokens
        if swa_md.num_prefill_tokens > 0:
            self._forward_prefill(q[nd_tok:], compressed_cache, output[nd_tok:], mla_md, swa_md)
        if nd_tok > 0:  # trimming can leave requests without query tokens
            self._forward_decode(q[:nd_tok], compressed_cache, output[:nd_tok], mla_md, swa_md)

    def _forward_decode(self, q, compressed_cache, output, mla_md, swa_md) -> None:
        nd = swa_md.num_decodes
        T = swa_md.num_decode_tokens
        kwargs: dict = {"compressed_path": "none"}
        if self.compress_ratio > 0:
            assert mla_md is not None and swa_md.is_valid_token is not None
            kwargs = dict(
                compressed_path="topk",
                topk_local=self.topk_indices_buffer[:T],
                token_to_req_indices=swa_md.token_to_req_indices,
                block_table=mla_md.block_table[:nd],
                compressed_block_size=mla_md.block_size // self.compress_ratio,
                is_valid_token=swa_md.is_valid_token,
            )
        ampere_layer.forward_decode(
            self._ampere_ops,
            q=q,
            swa_cache=self.swa_cache_layer.kv_cache,
            compressed_cache=compressed_cache,
            swa_indices=swa_md.decode_swa_indices,
            swa_lens=swa_md.decode_swa_lens,
            compress_ratio=max(self.compress_ratio, 1),
            scale=self.scale,
            attn_sink=self.attn_sink,
            out=output,
            **kwargs,
        )

    def _forward_prefill(self, q, compressed_cache, output, mla_md, swa_md) -> None:
        nd = swa_md.num_decodes
        nd_tok = swa_md.num_decode_tokens
        swa_only = self.compress_ratio == 0
        topk_indices = None
        if not swa_only:
            assert mla_md is not None
            topk_indices = self.topk_indices_buffer[nd_tok:][: swa_md.num_prefill_tokens]
        top_k = 0 if swa_only else topk_indices.shape[-1]
        plan = swa_md.get_prefill_chunk_plan(compress_ratio=self.compress_ratio,
                                             prefill_chunk_size=self.PREFILL_CHUNK_SIZE,
                                             has_compressed=not swa_only)
        ampere_layer.forward_prefill(
            self._ampere_ops,
            _VllmPrefillWorkspace(self.max_num_batched_tokens, self._combined_topk(top_k)),
            q=q,
            out=output,
            swa_cache=self.swa_cache_layer.kv_cache,
            compressed_cache=compressed_cache,
            seq_lens=swa_md.prefill_seq_lens,
            gather_lens=swa_md.prefill_gather_lens,
            query_start_loc=swa_md.query_start_loc[nd:],
            query_start_loc_cpu=swa_md.query_start_loc_cpu[nd:],
            swa_block_table=swa_md.block_table[nd:],
            swa_block_size=swa_md.block_size,
            compressed_block_table=None if swa_only else mla_md.block_table[nd:],
            compressed_block_size=None if swa_only else mla_md.block_size // self.compress_ratio,
            topk_indices=topk_indices,
            # the combine's ratio; a V4.1 SWA-only layer (0) reads no compressed entry
            compress_ratio=max(self.compress_ratio, 1),
            window_size=self.window_size,
            scale=self.scale,
            attn_sink=self.attn_sink,
            chunk_plan=plan,
            max_tokens=self.max_num_batched_tokens,
            swa_only=swa_only,
            # V4.1's combine: after a prefix-cache hit gather_lens start at the replay start
            # (cache_config.swa_bounded_replay); failed top-k entries stay -1
            v41=True,
        )
