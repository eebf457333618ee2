# SPDX-License-Identifier: Apache-2.0
"""Torch references for DeepSeek-V4 sparse MLA attention (decode and prefill).

Written from the semantics of upstream's FlashMLA calls in
``vllm/models/deepseek_v4/nvidia/flashmla.py`` (``flash_mla_with_kvcache`` for decode,
``flash_mla_sparse_fwd`` for prefill):

* one softmax over the union of the selected entries (decode: the sliding-window list
  followed by the compressed "extra" list; prefill: one combined index list);
* an entry takes part when its index is valid (decode: ``>= 0``; prefill: ``0 <= i < s_kv``)
  and its position in the list is below the list's length (``topk_length``);
* logits ``s = scale * <q, k>`` with ``K = V = the full 512-d row`` (448 dequantised NoPE
  values followed by 64 bf16 RoPE values for the FP8 cache);
* the per-head sink logit (fp32, not scaled) joins only the denominator:
  ``out = sum_i exp(s_i) v_i / (sum_i exp(s_i) + exp(sink))``;
* ``lse = log(sum_i exp(s_i))`` (natural log, sink excluded), ``max_logits = max_i s_i``;
* a query with no valid entry gets ``out = 0``, ``lse = +inf``, ``max_logits = -inf``.

``compute_dtype`` selects the arithmetic: ``torch.float64`` is the oracle; ``torch.float32``
is the "same inputs, fp32 arithmetic" comparison point. Both take the bf16 / FP8 inputs as
they are stored (the FP8 cache is decoded exactly).

Imports nothing but torch.
"""

from __future__ import annotations

import math

import torch

from .fp8 import e4m3_values, ue8m0_to_float

HEAD_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
QUANT_GROUP = 64
NUM_SCALES = NOPE_DIM // QUANT_GROUP  # 7
DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
SCALE_BYTES = 8  # 7 UE8M0 bytes + 1 pad
RECORD_BYTES = DATA_BYTES + SCALE_BYTES  # 584
FP8_MAX = 448.0

__all__ = [
    "HEAD_DIM",
    "RECORD_BYTES",
    "decode_e4m3",
    "read_fp8_ds_mla_rows",
    "pack_fp8_ds_mla",
    "sparse_mla_decode_ref",
    "sparse_mla_prefill_ref",
]


def decode_e4m3(codes: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Exact value of e4m3fn byte codes (NaN for 0x7F/0xFF), from the shared table."""
    return e4m3_values(codes).to(dtype)


def _as_bytes(cache: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(flat uint8 storage view, block stride in bytes, block size) of a paged cache."""
    if cache.element_size() != 1:
        raise ValueError(f"FP8 cache must have 1-byte elements, got {cache.dtype}")
    block_size = cache.shape[1]
    block_stride = cache.stride(0)
    if cache.shape[0] == 0:
        return cache.new_zeros(0, dtype=torch.uint8), block_stride, block_size
    # the last block's padding may lie outside the storage: stop at its last record
    size = (cache.shape[0] - 1) * block_stride + block_size * RECORD_BYTES
    flat = torch.as_strided(cache.view(torch.uint8), (size,), (1,), cache.storage_offset())
    return flat, block_stride, block_size


def read_fp8_ds_mla_rows(
    cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Dequantise the 584-byte ``fp8_ds_mla`` records at ``slots`` -> ``[..., 512]``.

    ``cache`` is ``[num_blocks, block_size, ...]`` (uint8), indexed through its block
    stride (``cache.stride(0)`` bytes), never as ``[b, i, :]``. Record ``i`` of a block:
    data at ``i * 576`` (448 e4m3 bytes, then 64 bf16), scales at
    ``block_size * 576 + i * 8`` (7 UE8M0 bytes)."""
    flat, block_stride, block_size = _as_bytes(cache)
    s = slots.reshape(-1).to(torch.int64)
    block = s // block_size
    pos = s % block_size
    base = block * block_stride
    data = base + pos * DATA_BYTES
    scale = base + block_size * DATA_BYTES + pos * SCALE_BYTES
    nope_codes = flat[data[:, None] + torch.arange(NOPE_DIM, device=s.device)]
    nope = decode_e4m3(nope_codes, torch.float64)
    sc = flat[scale[:, None] + torch.arange(NUM_SCALES, device=s.device)]
    # 2^(byte - 127), byte 0 -> 0.0 (upstream's `byte << 23` decode), as the gather's oracle
    mult = ue8m0_to_float(sc).to(torch.float64)
    nope = nope * mult.repeat_interleave(QUANT_GROUP, dim=1)
    rope_bytes = flat[data[:, None] + NOPE_DIM + torch.arange(2 * ROPE_DIM, device=s.device)]
    rope = rope_bytes.contiguous().view(torch.bfloat16).to(torch.float64)
    out = torch.cat([nope, rope], dim=1)
    return out.reshape(*slots.shape, HEAD_DIM).to(dtype)


def pack_fp8_ds_mla(
    kv: torch.Tensor,
    slots: torch.Tensor,
    cache: torch.Tensor,
) -> None:
    """Quantise rows ``kv`` ([N, 512] float) into ``cache`` at ``slots`` (test helper).

    Per 64-value group: UE8M0 scale ``2^ceil(log2(absmax / 448))``, e4m3 by torch's
    round-to-nearest-even cast; RoPE part stored as bf16; pad byte 0."""
    flat, block_stride, block_size = _as_bytes(cache)
    n = kv.shape[0]
    if n == 0:
        return
    dev = flat.device
    s = slots.to(device=dev, dtype=torch.int64)
    kv = kv.to(dev)
    nope = kv[:, :NOPE_DIM].double().reshape(n, NUM_SCALES, QUANT_GROUP)
    absmax = nope.abs().amax(-1).clamp(min=1e-30)
    exponent = torch.ceil(torch.log2(absmax / FP8_MAX)).clamp(-127, 127)
    codes = (nope * torch.exp2(-exponent)[..., None]).clamp(-FP8_MAX, FP8_MAX)
    codes = codes.float().to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, NOPE_DIM)
    rope = kv[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)
    sc = (exponent + 127).to(torch.uint8)
    block = s // block_size
    pos = s % block_size
    base = block * block_stride
    data = base + pos * DATA_BYTES
    scale = base + block_size * DATA_BYTES + pos * SCALE_BYTES
    flat[data[:, None] + torch.arange(NOPE_DIM, device=dev)] = codes
    flat[data[:, None] + NOPE_DIM + torch.arange(2 * ROPE_DIM, device=dev)] = rope
    flat[scale[:, None] + torch.arange(NUM_SCALES, device=dev)] = sc
    flat[scale + NUM_SCALES] = 0


def _list_valid(indices: torch.Tensor, lens: torch.Tensor | None, upper: int | None):
    """Validity mask [T, K] of an index list: index in range and position < length."""
    t, k = indices.shape
    valid = indices >= 0
    if upper is not None:
        valid &= indices < upper
    if lens is not None:
        pos = torch.arange(k, device=indices.device)[None, :]
        valid &= pos < lens.to(indices.device).reshape(t, 1).to(torch.int64)
    return valid


def _attend(
    q: torch.Tensor,  # [T, H, D] compute dtype
    kv: torch.Tensor,  # [T, K, D] compute dtype
    valid: torch.Tensor,  # [T, K]
    sink: torch.Tensor | None,  # [H] fp32 or None
    scale: float,
):
    dt = q.dtype
    kv = torch.where(valid[..., None], kv, torch.zeros((), dtype=dt, device=kv.device))
    s = torch.einsum("thd,tkd->thk", q, kv) * scale
    s = s.masked_fill(~valid[:, None, :], -math.inf)
    max_logits = s.amax(-1) if s.shape[-1] > 0 else s.new_full(s.shape[:2], -math.inf)
    lonely = torch.isneginf(max_logits)
    m = torch.where(lonely, torch.zeros_like(max_logits), max_logits)
    p = torch.exp(s - m[..., None])
    denom = p.sum(-1)
    lse = torch.where(lonely, torch.full_like(m, math.inf), m + torch.log(denom))
    num = torch.einsum("thk,tkd->thd", p, kv)
    if sink is not None:
        sk = sink.to(dt).to(q.device)[None, :].expand_as(m)
        denom = denom + torch.exp(sk - m)
    out = num / denom[..., None]
    out = torch.where(lonely[..., None], torch.zeros_like(out), out)
    return out, max_logits, lse


def sparse_mla_decode_ref(
    q: torch.Tensor,
    swa_cache: torch.Tensor,
    swa_indices: torch.Tensor,
    swa_lens: torch.Tensor | None,
    extra_cache: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    extra_lens: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    scale: float,
    compute_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for the decode call: ``q [T, 1, H, 512]`` bf16, FP8 paged caches.

    Returns ``(out [T, 1, H, 512] in compute_dtype, lse [T, H, 1])``; entries of the window
    list come first, then the compressed list (one softmax over both)."""
    t, sq, h, d = q.shape
    if sq != 1 or d != HEAD_DIM:
        raise ValueError(f"q must be [T, 1, H, {HEAD_DIM}], got {tuple(q.shape)}")
    qf = q.reshape(t, h, d).to(compute_dtype)
    idx = swa_indices.reshape(t, -1).to(torch.int64)
    valid = _list_valid(idx, swa_lens, None)
    kv = read_fp8_ds_mla_rows(swa_cache, idx.clamp(min=0), compute_dtype)
    if extra_cache is not None and extra_indices is not None:
        eidx = extra_indices.reshape(t, -1).to(torch.int64)
        evalid = _list_valid(eidx, extra_lens, None)
        ekv = read_fp8_ds_mla_rows(extra_cache, eidx.clamp(min=0), compute_dtype)
        kv = torch.cat([kv, ekv], dim=1)
        valid = torch.cat([valid, evalid], dim=1)
    out, _, lse = _attend(qf, kv, valid, attn_sink, scale)
    return out.reshape(t, 1, h, d), lse.reshape(t, h, 1)


def sparse_mla_prefill_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    scale: float,
    compute_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference for ``flash_mla_sparse_fwd``: ``q [T, H, 512]``, ``kv [s_kv, 1, 512]`` bf16,
    ``indices [T, 1, topk]`` (invalid: ``< 0`` or ``>= s_kv``), ``topk_length [T]``.

    Returns ``(out [T, H, 512], max_logits [T, H], lse [T, H])`` in compute_dtype."""
    t, h, d = q.shape
    s_kv = kv.shape[0]
    kv2 = kv.reshape(s_kv, -1)
    if kv2.shape[1] != HEAD_DIM or d != HEAD_DIM:
        raise ValueError("q and kv must have head dim 512 and one kv head")
    idx = indices.reshape(t, -1).to(torch.int64)
    valid = _list_valid(idx, topk_length, s_kv)
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    rows = kv2.to(compute_dtype)[safe]
    return _attend(q.to(compute_dtype), rows, valid, attn_sink, scale)
