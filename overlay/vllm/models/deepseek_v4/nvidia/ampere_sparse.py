# SPDX-License-Identifier: Apache-2.0
"""DeepSeek-V4 sparse MLA attention for SM80/SM86 (Ampere).

Selected by ``_select_dsv4_attn_cls`` (nvidia/model.py) on capability 8.x.
Same skeleton as ``DeepseekV4FlashMLAAttention`` with FlashMLA replaced:

* decode / prefill: ``deepinfer_sm80.ampere.layer`` (this package's sparse-MLA
  kernels when built, portable implementations otherwise);
* the SWA metadata builder never calls FlashMLA's tile-scheduler allocation
  (``get_mla_metadata`` raises without ``_flashmla_C``);
* ``get_padded_num_q_heads`` returns a head count the ``_C`` fused
  qnorm/RoPE/KV-insert op is instantiated for (8/16/32/64/128), so TP8's 8
  local heads are not padded to 64;
* output projection without DeepGEMM (``AmpereOProjMixin``);
* compressor store through the SM80 Triton FP8 writers (``AmpereCompressor``);
* indexer without DeepGEMM (``DeepseekV4AmpereIndexer``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar, cast

import torch

from deepinfer_sm80.ampere import layer as ampere_layer
from vllm.forward_context import get_forward_context
from vllm.models.deepseek_v4.attention import DeepseekV4Attention
from vllm.models.deepseek_v4.nvidia.ampere_indexer import DeepseekV4AmpereIndexer
from vllm.models.deepseek_v4.nvidia.ampere_ops import AmpereCompressor, AmpereOProjMixin
from vllm.models.deepseek_v4.sparse_mla import (
    DeepseekV4FlashMLABackend,
    DeepseekV4FlashMLAMetadata,
)
from vllm.utils.math_utils import round_up
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.mla.sparse_swa import (
    DeepseekSparseSWABackend,
    DeepseekSparseSWAMetadataBuilder,
)
from vllm.v1.worker.workspace import current_workspace_manager

if TYPE_CHECKING:
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

# Padded-head instantiations of torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert.
_C_PADDED_HEADS = (8, 16, 32, 64, 128)


class Sm8xBackendMixin:
    """A sparse-MLA backend for capability 8.x only (V4's and V4.1's Ampere backends)."""

    @classmethod
    def supports_compute_capability(cls, capability: "DeviceCapability") -> bool:
        return capability.major == 8


class NoTileSchedulerMixin:
    """SWA metadata without FlashMLA's tile scheduler (the Ampere decode is varlen and
    needs no planner); V4's and V4.1's Ampere SWA builders."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS

    def build_tile_scheduler(self, num_decode_tokens: int) -> dict:
        from vllm.v1.attention.backends.mla import sparse_swa

        keys = [getattr(sparse_swa, n) for n in dir(sparse_swa) if n.startswith("_LAYER_TYPE_")]
        return {k: None for k in keys}


class DeepseekV4AmpereSparseMLABackend(Sm8xBackendMixin, DeepseekV4FlashMLABackend):
    @staticmethod
    def get_name() -> str:
        return "AMPERE_SPARSE_DSV4"


class DeepseekSparseSWAAmpereMetadataBuilder(NoTileSchedulerMixin,
                                             DeepseekSparseSWAMetadataBuilder):
    pass


class DeepseekSparseSWAAmpereBackend(DeepseekSparseSWABackend):
    @staticmethod
    def get_builder_cls() -> type[DeepseekSparseSWAAmpereMetadataBuilder]:
        return DeepseekSparseSWAAmpereMetadataBuilder


def reserve_prefill_workspace(layer, q: torch.Tensor, output: torch.Tensor,
                              swa_only: bool) -> None:
    """Profile run (no metadata): reserve what ``_forward_prefill`` takes from vLLM's
    shared workspace and zero the output. V4's and V4.1's Ampere layers."""
    n = 0 if swa_only else -(-layer.max_model_len // layer.compress_ratio)
    top_k = 0 if swa_only else layer.topk_indices_buffer.shape[-1]
    current_workspace_manager().get_simultaneous(
        ((layer.PREFILL_CHUNK_SIZE, n + layer.window_size + layer.max_num_batched_tokens,
          q.shape[-1]), torch.bfloat16),
        ((layer.max_num_batched_tokens, layer._combined_topk(top_k)), torch.int32),
        ((layer.max_num_batched_tokens,), torch.int32),
    )
    output.zero_()


class _VllmPrefillWorkspace:
    """Prefill scratch from vLLM's shared workspace manager (as upstream)."""

    def __init__(self, max_tokens: int, combined_topk: int) -> None:
        self.max_tokens = max_tokens
        self.combined_topk = combined_topk
        self._cur: dict[str, torch.Tensor] = {}

    def get(self, name, shape, dtype, device):
        if name == "prefill_kv":
            kv, idx, lens = current_workspace_manager().get_simultaneous(
                (shape, torch.bfloat16),
                ((self.max_tokens, self.combined_topk), torch.int32),
                ((self.max_tokens,), torch.int32),
            )
            self._cur = {"prefill_idx": idx, "prefill_len": lens}
            return kv
        buf = self._cur[name]
        return buf.view(-1)[: math.prod(shape)].view(shape)


class DeepseekV4AmpereSparseAttention(AmpereOProjMixin, DeepseekV4Attention):
    """Sparse MLA attention layer for DeepSeek-V4 on SM80/SM86."""

    backend_cls = DeepseekV4AmpereSparseMLABackend
    swa_backend_cls = DeepseekSparseSWAAmpereBackend

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.compressor is not None:
            # The base class builds the main compressor directly (no hook):
            # give it the SM80 store step.
            self.compressor.__class__ = AmpereCompressor
        self._ampere_ops = ampere_layer.resolve_ops("cuda")
        self._init_ampere_o_proj()

    def _get_indexer_cls(self, vllm_config) -> type[DeepseekV4AmpereIndexer]:
        return DeepseekV4AmpereIndexer

    @classmethod
    def get_padded_num_q_heads(cls, num_heads: int) -> int:
        for h in _C_PADDED_HEADS:
            if num_heads <= h:
                return h
        raise ValueError(
            f"DeepSeek-V4 on SM80 supports up to {_C_PADDED_HEADS[-1]} local query heads, "
            f"got {num_heads}; raise the tensor-parallel size.")

    def _combined_topk(self, top_k: int) -> int:
        return round_up(top_k + self.window_size + self.max_image_tokens, 128)

    def forward_mqa(self, q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor,
                    output: torch.Tensor) -> None:
        assert output.shape == q.shape and output.dtype == q.dtype
        attn_metadata = get_forward_context().attn_metadata
        swa_only = self.compress_ratio <= 1
        if attn_metadata is None:
            reserve_prefill_workspace(self, q, output, swa_only)
            return
        assert isinstance(attn_metadata, dict)
        mla_md = cast("DeepseekV4FlashMLAMetadata | None", attn_metadata.get(self.prefix))
        swa_md = cast("DeepseekSparseSWAMetadata", attn_metadata.get(self.swa_cache_layer.prefix))
        assert swa_md is not None
        compressed_cache = self.kv_cache if not swa_only else None
        nd_tok = swa_md.num_decode_tokens
        if swa_md.num_prefills > 0:
            self._forward_prefill(q[nd_tok:], compressed_cache, output[nd_tok:], mla_md, swa_md)
        if swa_md.num_decodes > 0:
            self._forward_decode(q[:nd_tok], compressed_cache, output[:nd_tok], mla_md, swa_md)

    def _forward_decode(self, q, compressed_cache, output, mla_md, swa_md) -> None:
        nd = swa_md.num_decodes
        T = swa_md.num_decode_tokens
        kwargs = {}
        if self.compress_ratio == 4:
            kwargs = dict(
                topk_local=self.topk_indices_buffer[:T],
                token_to_req_indices=swa_md.token_to_req_indices,
                block_table=mla_md.block_table[:nd],
                compressed_block_size=mla_md.block_size // self.compress_ratio,
                is_valid_token=swa_md.is_valid_token,
            )
        elif self.compress_ratio > 1:
            kwargs = dict(c128_global_indices=mla_md.c128a_global_decode_topk_indices,
                          c128_lens=mla_md.c128a_decode_topk_lens)
        ampere_layer.forward_decode(
            self._ampere_ops,
            q=q,
            swa_cache=self.swa_cache_layer.kv_cache,
            compressed_cache=compressed_cache,
            swa_indices=swa_md.decode_swa_indices,
            swa_lens=swa_md.decode_swa_lens,
            compress_ratio=self.compress_ratio,
            scale=self.scale,
            attn_sink=self.attn_sink,
            out=output,
            **kwargs,
        )

    def _forward_prefill(self, q, compressed_cache, output, mla_md, swa_md) -> None:
        nd = swa_md.num_decodes
        nd_tok = swa_md.num_decode_tokens
        swa_only = mla_md is None or self.compress_ratio <= 1
        if swa_only:
            topk_indices = None
        elif self.compress_ratio == 4:
            topk_indices = self.topk_indices_buffer[nd_tok:][: swa_md.num_prefill_tokens]
        else:
            topk_indices = mla_md.c128a_prefill_topk_indices
        top_k = 0 if swa_only else topk_indices.shape[-1]
        qsl_cpu = swa_md.query_start_loc_cpu[nd:]
        qsl = swa_md.query_start_loc[nd:]
        plan = swa_md.get_prefill_chunk_plan(compress_ratio=self.compress_ratio,
                                             prefill_chunk_size=self.PREFILL_CHUNK_SIZE)
        ampere_layer.forward_prefill(
            self._ampere_ops,
            _VllmPrefillWorkspace(self.max_num_batched_tokens, self._combined_topk(top_k)),
            q=q,
            out=output,
            swa_cache=self.swa_cache_layer.kv_cache,
            compressed_cache=compressed_cache,
            seq_lens=swa_md.prefill_seq_lens,
            gather_lens=swa_md.prefill_gather_lens,
            query_start_loc=qsl,
            query_start_loc_cpu=qsl_cpu,
            swa_block_table=swa_md.block_table[nd:],
            swa_block_size=swa_md.block_size,
            compressed_block_table=None if swa_only else mla_md.block_table[nd:],
            compressed_block_size=None if swa_only else mla_md.block_size // self.compress_ratio,
            topk_indices=topk_indices,
            compress_ratio=self.compress_ratio if not swa_only else 1,
            window_size=self.window_size,
            scale=self.scale,
            attn_sink=self.attn_sink,
            chunk_plan=plan,
            max_tokens=self.max_num_batched_tokens,
        )
