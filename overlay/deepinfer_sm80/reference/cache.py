"""Torch references of the V4 KV-cache ops (vLLM 0.33.0
``vllm/models/deepseek_v4/common/ops/cache_utils.py``), written from the semantics.

Record (``fp8_ds_mla``, 584 bytes per entry): in a block of ``block_size`` entries that
starts at byte ``block_id * k_cache.stride(0)``, entry ``i``'s data is at ``i * 576`` (448
e4m3 NoPE codes, 7 groups of 64, then 64 bf16 RoPE values) and its 8 scale bytes at
``block_size * 576 + i * 8`` (7 UE8M0 bytes, then 0).

Both functions work on CPU or GPU tensors and mutate their output argument in place, so
"left untouched" is part of what the tests check. Where the upstream kernels would read
or write out of bounds (slot, block-table column, block id or output row out of range)
these references -- like the SM80 kernels -- skip the entry.
"""

from __future__ import annotations

import torch

from deepinfer_sm80.reference.fp8 import dequantize_groups, quantize_groups

NOPE_DIM = 448
ROPE_DIM = 64
HEAD_DIM = 512
GROUP = 64
DATA_BYTES = 576
SCALE_BYTES = 8
RECORD_BYTES = 584


def _flat_bytes(k_cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """1-D uint8 view over every byte the cache's blocks span, and the block stride."""
    nb = k_cache.size(0)
    inner = 1
    for d in range(1, k_cache.dim()):
        inner *= k_cache.size(d)
    stride = k_cache.stride(0) if nb > 1 else inner
    n = (nb - 1) * stride + inner if nb > 0 else 0
    flat = torch.as_strided(k_cache, (n,), (1,), k_cache.storage_offset())
    return flat.view(torch.uint8), stride


def record_offsets(block_ids: torch.Tensor, pos: torch.Tensor, block_size: int,
                   stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(data byte offset, scale byte offset) of entries (int64 tensors)."""
    base = block_ids.to(torch.int64) * stride
    data = base + pos.to(torch.int64) * DATA_BYTES
    scale = base + block_size * DATA_BYTES + pos.to(torch.int64) * SCALE_BYTES
    return data, scale


def encode_records(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 [n, 512] -> (data bytes [n, 576], scale bytes [n, 8]) as the SWA writer."""
    codes, sbytes = quantize_groups(k[:, :NOPE_DIM].to(torch.float32), GROUP)
    rope = k[:, NOPE_DIM:].contiguous().view(torch.uint8).reshape(k.size(0), 2 * ROPE_DIM)
    data = torch.cat([codes, rope], dim=1)
    scales = torch.cat([sbytes, torch.zeros_like(sbytes[:, :1])], dim=1)
    return data, scales


def decode_records(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(data bytes [n, 576], scale bytes [n, 8]) -> bf16 [n, 512]."""
    nope = dequantize_groups(data[:, :NOPE_DIM].contiguous(), scales[:, :7].contiguous(), GROUP)
    rope = data[:, NOPE_DIM:].contiguous().view(torch.bfloat16)
    return torch.cat([nope, rope], dim=1)


def quantize_and_insert_k_cache(k: torch.Tensor, k_cache: torch.Tensor,
                                slot_mapping: torch.Tensor, block_size: int = 64,
                                is_ue8m0: bool = True, use_fnuz: bool = False) -> None:
    """Quantise ``k[:len(slot_mapping)]`` and write each row to its slot (-1 skipped)."""
    assert is_ue8m0 and not use_fnuz
    n = slot_mapping.size(0)
    slots = slot_mapping.to(torch.int64)
    nb = k_cache.size(0)
    keep = (slots >= 0) & (slots < nb * block_size)
    idx = torch.nonzero(keep).flatten()
    if idx.numel() == 0:
        return
    rows = k[:n][idx]
    s = slots[idx]
    data, scales = encode_records(rows)
    flat, stride = _flat_bytes(k_cache)
    d_off, s_off = record_offsets(s // block_size, s % block_size, block_size, stride)
    ar_d = torch.arange(DATA_BYTES, device=flat.device)
    ar_s = torch.arange(SCALE_BYTES, device=flat.device)
    flat[(d_off[:, None] + ar_d).flatten()] = data.flatten().to(flat.device)
    flat[(s_off[:, None] + ar_s).flatten()] = scales.flatten().to(flat.device)


def dequantize_and_gather_k_cache(out: torch.Tensor, k_cache: torch.Tensor,
                                  seq_lens: torch.Tensor, gather_lens: torch.Tensor | None,
                                  block_table: torch.Tensor, block_size: int, offset: int,
                                  use_fnuz: bool = False) -> None:
    """out[r, offset + i] = record at pos = seq_len - g + i (i < g) of request r."""
    assert not use_fnuz
    flat, stride = _flat_bytes(k_cache)
    nb = k_cache.size(0)
    R = seq_lens.size(0)
    sl = seq_lens.to(torch.int64).cpu()
    gl = sl if gather_lens is None else gather_lens.to(torch.int64).cpu()
    ar_d = torch.arange(DATA_BYTES, device=flat.device)
    ar_s = torch.arange(SCALE_BYTES, device=flat.device)
    for r in range(R):
        g = int(gl[r])
        if g <= 0:
            continue
        i = torch.arange(g, device=flat.device)
        pos = int(sl[r]) - g + i
        blk = torch.div(pos, block_size, rounding_mode="floor")
        ok = (pos >= 0) & (blk < block_table.size(1)) & (offset + i < out.size(1))
        blk_c = torch.where(ok, blk, torch.zeros_like(blk))
        phys = block_table[r].to(flat.device)[blk_c].to(torch.int64)
        ok &= (phys >= 0) & (phys < nb)
        i, pos, phys = i[ok], pos[ok], phys[ok]
        if i.numel() == 0:
            continue
        d_off, s_off = record_offsets(phys, pos % block_size, block_size, stride)
        data = flat[d_off[:, None] + ar_d]
        scales = flat[s_off[:, None] + ar_s]
        out[r, offset + i.to(out.device)] = decode_records(data, scales).to(out.device)
