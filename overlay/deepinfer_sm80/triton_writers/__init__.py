"""Portable Triton FP8 writers for SM80/SM86 (software e4m3, uint8 at the
kernel boundary).  Imports nothing but torch and triton.

* ``compress_norm_rope_store_sm80``: drop-in for upstream's
  ``compress_norm_rope_store_triton`` / the CuTe DSL compressor call
  (head 512 -> 584-B ``fp8_ds_mla`` record, C4 and C128; head 128 -> 132-B
  indexer page).
* ``indexer_q_rope_quant``: drop-in for ``fused_indexer_q_rope_quant`` (FP8).
"""

from typing import Any

import torch

from .compressor_store import compress_store_fp8_ds_mla
from .indexer_q import indexer_q_rope_quant
from .indexer_store import indexer_compress_store


def compress_norm_rope_store_sm80(
    state_cache: torch.Tensor,
    num_actual: int,
    token_to_req_indices: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    state_width: int,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    k_cache_metadata: Any,
    pdl_kwargs: dict | None = None,
    head_dim: int = 512,
    rope_head_dim: int = 64,
    compress_ratio: int = 4,
    overlap: bool = True,
    use_fp4_cache: bool = False,
    rms_norm_weight: torch.Tensor | None = None,
    rms_norm_eps: float = 1e-6,
    quant_block: int = 64,
    token_stride: int = 576,
    scale_dim: int = 8,
    **unused: Any,
) -> None:
    """Same keyword signature as upstream's compressor store launchers; the
    cache slot mapping comes from ``k_cache_metadata.slot_mapping``."""
    if use_fp4_cache:
        raise NotImplementedError("MXFP4 indexer cache is SM100-only; use the FP8 cache")
    if unused.get("store_full_kv"):
        raise NotImplementedError("SM80 stores only the fp8_ds_mla layout")
    assert rms_norm_weight is not None
    kv_slot_mapping = k_cache_metadata.slot_mapping
    common = dict(
        state_cache=state_cache,
        token_to_req_indices=token_to_req_indices,
        positions=positions,
        slot_mapping=slot_mapping,
        block_table=block_table,
        block_size=block_size,
        state_width=state_width,
        cos_sin_cache=cos_sin_cache,
        kv_cache=kv_cache,
        kv_slot_mapping=kv_slot_mapping,
        compress_ratio=compress_ratio,
        rms_norm_weight=rms_norm_weight,
        rms_norm_eps=rms_norm_eps,
        head_dim=head_dim,
        rope_head_dim=rope_head_dim,
        num_actual=num_actual,
    )
    if head_dim == 512:
        if (quant_block, token_stride, scale_dim) != (64, 576, 8):
            raise ValueError("fp8_ds_mla record needs quant_block 64, stride 576, 8 scales")
        compress_store_fp8_ds_mla(**common)
    elif head_dim == 128:
        indexer_compress_store(**common)
    else:
        raise ValueError(f"unsupported compressor head_dim {head_dim}")


__all__ = [
    "compress_norm_rope_store_sm80",
    "compress_store_fp8_ds_mla",
    "indexer_compress_store",
    "indexer_q_rope_quant",
]
