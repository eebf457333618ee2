# SPDX-License-Identifier: Apache-2.0
"""SM80/SM86 output projection and compressor store for DeepSeek-V4 attention.

Upstream's CUDA ``_o_proj`` (nvidia/ops/o_proj.py) needs DeepGEMM's
``fp8_einsum`` (SM90+), and its ``bmm`` fallback reads ``wo_a.weight`` after
the FP8 linear method has repacked it for Marlin (int32 tiles), which yields
garbage.  This mixin dequantises ``wo_a`` to bf16 once, at load time, *before*
the linear method's ``process_weights_after_loading`` repacks it, and runs
inverse RoPE (bf16, no FP8) + grouped bmm + ``wo_b``
(``deepinfer_sm80.ampere.o_proj``).
"""

from __future__ import annotations

import torch

from deepinfer_sm80.ampere.o_proj import dequant_weight, group_wo_a, o_proj_sm80
from deepinfer_sm80.triton_writers import compress_norm_rope_store_sm80
from vllm.model_executor.utils import replace_parameter
from vllm.models.deepseek_v4.compressor import DeepseekCompressor


def _weight_scale(layer: torch.nn.Module) -> torch.Tensor | None:
    for name in ("weight_scale_inv", "weight_scale"):
        scale = getattr(layer, name, None)
        if scale is not None:
            return scale
    return None


def _weight_block(layer: torch.nn.Module) -> tuple[int, int] | None:
    block = getattr(layer, "weight_block_size", None)
    if block is None:
        qc = getattr(getattr(layer, "quant_method", None), "quant_config", None)
        block = getattr(qc, "weight_block_size", None)
    return tuple(block) if block is not None else None


class AmpereOProjMixin:
    """Mixed into the Ampere attention class; call ``_init_ampere_o_proj()``
    at the end of ``__init__``."""

    _wo_a_grouped: torch.Tensor | None = None

    def _init_ampere_o_proj(self) -> None:
        wo_a = self.wo_a
        quant_method = getattr(wo_a, "quant_method", None)
        if quant_method is None or not hasattr(quant_method, "process_weights_after_loading"):
            return
        original = quant_method.process_weights_after_loading

        def capture_then_process(layer: torch.nn.Module) -> None:
            weight = layer.weight.data
            dequant = dequant_weight(weight, _weight_scale(layer), _weight_block(layer))
            self._wo_a_grouped = group_wo_a(dequant, self.n_local_groups, self.o_lora_rank)
            original(layer)
            # The repacked copy is never read by this _o_proj: free it.
            if layer.weight.data_ptr() != 0 and layer.weight.dtype != torch.bfloat16:
                replace_parameter(layer, "weight", layer.weight.new_empty(0))

        quant_method.process_weights_after_loading = capture_then_process

    def _grouped_wo_a(self) -> torch.Tensor:
        if self._wo_a_grouped is not None:
            return self._wo_a_grouped
        weight = self.wo_a.weight
        if weight.dtype in (torch.bfloat16, torch.float16, torch.float32) and weight.dim() == 2:
            # Unquantised checkpoint (weights never repacked): group lazily.
            self._wo_a_grouped = group_wo_a(
                dequant_weight(weight.data, _weight_scale(self.wo_a)), self.n_local_groups,
                self.o_lora_rank)
            return self._wo_a_grouped
        raise RuntimeError(
            "DeepSeek-V4 on SM80: wo_a was not captured before the FP8 linear method "
            "repacked it (process_weights_after_loading did not run through the Ampere "
            "attention layer's hook). Load the model through vLLM's model loader.")

    def _o_proj(self, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return o_proj_sm80(
            o,
            positions,
            self.rotary_emb.cos_sin_cache,
            self._grouped_wo_a(),
            self.wo_b,
            nope_dim=self.nope_head_dim,
        )


class AmpereCompressor(DeepseekCompressor):
    """``DeepseekCompressor`` whose store step writes with the SM80 Triton
    writers (software e4m3): the 584-byte ``fp8_ds_mla`` record for head 512
    (C4 and C128, UE8M0 exactly as the CuTe DSL writer) and the 132-byte FP8
    indexer page for head 128.  Upstream's CuTe DSL writer and Triton
    writers both need SM89+ FP8 conversion."""

    def _compress_norm_rope_store(self, state_metadata, state_cache, state_width, positions,
                                  rotary_emb, attn_metadata, pdl_kwargs) -> None:
        k_cache_metadata = attn_metadata[self.k_cache_prefix]
        kv_cache = self._static_forward_context[self.k_cache_prefix].kv_cache
        if self.use_fp4_cache or kv_cache.dtype != torch.uint8:
            raise ValueError(
                "DeepSeek-V4 on SM80 stores the fp8_ds_mla / FP8 indexer layouts only "
                f"(got cache dtype {kv_cache.dtype}, fp4={self.use_fp4_cache}); use "
                "--kv-cache-dtype fp8")
        compress_norm_rope_store_sm80(
            state_cache=state_cache,
            num_actual=state_metadata.slot_mapping.shape[0],
            token_to_req_indices=state_metadata.token_to_req_indices,
            positions=positions,
            slot_mapping=state_metadata.slot_mapping,
            block_table=state_metadata.block_table,
            block_size=state_metadata.block_size,
            state_width=state_width,
            cos_sin_cache=rotary_emb.cos_sin_cache,
            kv_cache=kv_cache,
            k_cache_metadata=k_cache_metadata,
            head_dim=self.head_dim,
            rope_head_dim=self.rope_head_dim,
            compress_ratio=self.compress_ratio,
            overlap=self.overlap,
            rms_norm_weight=self.norm.weight,
            rms_norm_eps=self.rms_norm_eps,
            quant_block=self._quant_block,
            token_stride=self._token_stride,
            scale_dim=self._scale_dim,
        )
