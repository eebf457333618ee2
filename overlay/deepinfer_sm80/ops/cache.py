"""SM80 drop-ins for upstream's V4 KV-cache ops (vLLM 0.33.0
``vllm/models/deepseek_v4/common/ops/cache_utils.py``): same arguments, same results.

* :func:`quantize_and_insert_k_cache` - bf16 K rows -> 584-byte ``fp8_ds_mla`` records;
  the scale and rounding of the SWA CUDA writer (bit-exact, see csrc/common/ue8m0.cuh).
* :func:`dequantize_and_gather_k_cache` - records -> bf16 rows, bit-exact with upstream's
  Triton kernel; the block table is read through its strides.

Semantics are those of :mod:`deepinfer_sm80.reference.cache`. Entries whose slot, block
column, block id or output row is out of range are skipped (upstream would read or write
out of bounds). ``sm_count`` (keyword) sizes the grid (0/None: the device's).
"""

from __future__ import annotations

import torch

from deepinfer_sm80.ops import _checks as C


def _ops():
    from deepinfer_sm80 import _ext  # loads _C, or raises ImportError saying how to build it

    return _ext.ops()

HEAD_DIM = 512
RECORD_BYTES = 584


def _check_k_cache(k_cache: torch.Tensor, block_size: int, device: torch.device) -> None:
    C.cuda_tensor(k_cache, "k_cache", device)
    if k_cache.element_size() != 1:
        raise TypeError(f"k_cache must be a byte tensor (uint8 or an fp8 view), got {k_cache.dtype}")
    if k_cache.dim() < 2:
        raise ValueError(f"k_cache must be [num_blocks, block_bytes], got {tuple(k_cache.shape)}")
    if not 1 <= block_size < 65536:
        raise ValueError(f"block_size must be in [1, 65535], got {block_size}")
    inner = 1
    for d in range(1, k_cache.dim()):
        inner *= k_cache.size(d)
    if inner < block_size * RECORD_BYTES:
        raise ValueError(f"k_cache blocks hold {inner} bytes, block_size={block_size} needs "
                         f"{block_size * RECORD_BYTES} ({block_size} x {RECORD_BYTES})")
    if k_cache.stride(0) % 16 or k_cache.data_ptr() % 16:
        raise ValueError(f"k_cache blocks must be 16-byte aligned (stride(0)={k_cache.stride(0)})")


def quantize_and_insert_k_cache(k: torch.Tensor, k_cache: torch.Tensor,
                                slot_mapping: torch.Tensor, block_size: int = 64,
                                is_ue8m0: bool = True, use_fnuz: bool = False, *,
                                sm_count: int | None = None) -> None:
    """Quantise ``k[:len(slot_mapping)]`` ([num_tokens, 512] bf16) into ``k_cache``."""
    if not is_ue8m0:
        raise ValueError("only UE8M0 scales are supported (is_ue8m0=True), as upstream")
    if use_fnuz:
        raise ValueError("use_fnuz=True (ROCm FNUZ e4m3) is not an SM80 format")
    C.cuda_tensor(k, "k")
    C.dtype(k, "k", torch.bfloat16)
    C.dim(k, "k", 2, "[num_tokens, 512]")
    if k.size(1) != HEAD_DIM:
        raise ValueError(f"k must be [num_tokens, 512], got {tuple(k.shape)}")
    C.rows16(k, "k")
    C.vector(slot_mapping, "slot_mapping", k.device, torch.int64)
    if slot_mapping.size(0) > k.size(0):
        raise ValueError(f"slot_mapping has {slot_mapping.size(0)} entries but k has only "
                         f"{k.size(0)} rows")
    _check_k_cache(k_cache, block_size, k.device)
    _ops().quantize_and_insert_k_cache(k, k_cache, slot_mapping, block_size, sm_count or 0)


def dequantize_and_gather_k_cache(out: torch.Tensor, k_cache: torch.Tensor,
                                  seq_lens: torch.Tensor, gather_lens: torch.Tensor | None,
                                  block_table: torch.Tensor, block_size: int, offset: int,
                                  use_fnuz: bool = False, *,
                                  sm_count: int | None = None) -> None:
    """out[r, offset + i] = dequantised entry at position seq_lens[r] - g + i, i < g
    (g = gather_lens[r], or seq_lens[r] when gather_lens is None)."""
    if use_fnuz:
        raise ValueError("use_fnuz=True (ROCm FNUZ e4m3) is not an SM80 format")
    C.cuda_tensor(out, "out")
    C.dtype(out, "out", torch.bfloat16)
    C.dim(out, "out", 3, "[num_reqs, max_num_tokens, 512]")
    if out.size(2) != HEAD_DIM:
        raise ValueError(f"out must be [num_reqs, max_num_tokens, 512], got {tuple(out.shape)}")
    C.rows16(out, "out")
    dev = out.device
    _check_k_cache(k_cache, block_size, dev)
    C.vector(seq_lens, "seq_lens", dev, torch.int32)
    R = seq_lens.size(0)
    if out.size(0) < R:
        raise ValueError(f"out has {out.size(0)} request rows, seq_lens has {R}")
    if gather_lens is not None:
        C.vector(gather_lens, "gather_lens", dev, torch.int32, R)
    C.cuda_tensor(block_table, "block_table", dev)
    C.dtype(block_table, "block_table", torch.int32)
    C.dim(block_table, "block_table", 2, "[num_reqs, max_blocks_per_seq]")
    if block_table.size(0) < R:
        raise ValueError(f"block_table has {block_table.size(0)} rows, seq_lens has {R}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    _ops().dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table,
                                            block_size, offset, sm_count or 0)
