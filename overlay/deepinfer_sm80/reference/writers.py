"""Torch references of the FP8 cache writers, written from the semantics.

CPU-runnable oracles for the Triton writers in ``deepinfer_sm80.triton_writers``
and for upstream's writers.  The arithmetic before quantisation is done in
float64 (the writers use fp32, so rare last-bit differences before the bf16 /
FP8 rounding are expected and the tests allow one code step there); the
quantisation itself (bf16 rounding, UE8M0 exponent, e4m3 rounding) is exact.

Formats:
* ``fp8_ds_mla`` record (main KV, head 512): per page of ``bs`` entries, entry
  ``i`` data at ``i * 576``: 448 e4m3 bytes (7 groups of 64) then 64 bf16 RoPE
  values; scales at ``bs * 576 + i * 8``: 7 UE8M0 bytes and one zero byte.
* indexer page (head 128): ``[bs * 128 e4m3][bs * 4 fp32 scale]``.
"""

from __future__ import annotations

import math

import torch

from . import fp8

FP8_MAX = fp8.E4M3_MAX


# ----------------------------------------------------------------------------
# e4m3fn and UE8M0 codecs
# ----------------------------------------------------------------------------
def e4m3_decode_table() -> torch.Tensor:
    """float64 value of each of the 256 e4m3fn codes (0x7F, 0xFF -> NaN)."""
    return fp8.E4M3_VALUES.clone()


# The codecs are the shared ones in reference/fp8.py (nearest code, ties to even,
# saturating to +-448, NaN -> 0x7F, sign of zero kept).
e4m3_decode_ref = fp8.e4m3_values
e4m3_encode_ref = fp8.float_to_e4m3_satfinite


def ue8m0_exponent_ref(scale: torch.Tensor) -> torch.Tensor:
    """ceil(log2(scale)) + 127 for positive scales, computed exactly (frexp)."""
    mant, exp = torch.frexp(scale.to(torch.float64))
    ceil_log2 = torch.where(mant == 0.5, exp - 1, exp)
    return (ceil_log2 + 127).clamp(0, 255).to(torch.int64)


def ue8m0_decode_ref(byte: torch.Tensor) -> torch.Tensor:
    return torch.pow(2.0, byte.to(torch.float64) - 127.0)


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """x (any float) -> fp32 -> bf16 (RNE) -> float64."""
    return x.to(torch.float32).to(torch.bfloat16).to(torch.float64)


# ----------------------------------------------------------------------------
# Quantisation stages
# ----------------------------------------------------------------------------
def quant_group_ue8m0(yb: torch.Tensor, min_scale: float = 1e-4):
    """CuTe DSL compressor quantisation of bf16-valued groups.

    ``yb``: [..., G, 64] float64 holding bf16 values.  scale = max(1e-4,
    fl32(absmax / 448)); byte = ceil(log2(scale)) + 127; codes =
    e4m3(clamp(yb * 2^(127 - byte))).  Returns (codes uint8, bytes int64).
    """
    absmax = yb.abs().amax(dim=-1)
    scale = torch.clamp(absmax.to(torch.float32) / torch.tensor(448.0), min=min_scale)
    ue = ue8m0_exponent_ref(scale)
    inv = torch.pow(2.0, 127.0 - ue.to(torch.float64))
    q = (yb * inv.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    return e4m3_encode_ref(q), ue


def gptj_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  inverse: bool = False) -> torch.Tensor:
    """GPT-J (interleaved pairs) rotation of the last dim of ``x`` (float64)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    if inverse:
        sin = -sin
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


# ----------------------------------------------------------------------------
# Compressor (softmax pool over the window of saved states)
# ----------------------------------------------------------------------------
def compress_window_ref(state_cache, block_table_row, state_block_size, position,
                        ratio, head_dim, state_width):
    """float64 [head_dim] compressed vector for the boundary token at
    ``position``.  C4 (overlap): window of 2*ratio rows, the first ``ratio``
    rows use the first half of each state row, the last ``ratio`` the second;
    rows with a negative position are left out.  C128: window of ``ratio``."""
    overlap = ratio == 4
    window = (2 if overlap else 1) * ratio
    kvs, scores = [], []
    for r in range(window):
        p = position - window + 1 + r
        if p < 0:
            continue
        blk = int(block_table_row[p // state_block_size])
        off = p % state_block_size
        head_off = (r // ratio) * head_dim if overlap else 0
        row = state_cache[blk, off].to(torch.float64)
        kvs.append(row[head_off:head_off + head_dim])
        scores.append(row[state_width + head_off:state_width + head_off + head_dim])
    kv = torch.stack(kvs)
    sc = torch.stack(scores)
    w = torch.softmax(sc, dim=0)
    return (kv * w).sum(dim=0)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.to(torch.float64)
    return xd * torch.rsqrt(xd.pow(2).mean() + eps) * weight.to(torch.float64)


def fp8_ds_mla_entry_ref(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         nope_dim: int = 448, group: int = 64):
    """One 584-byte entry from normalised values ``y`` [512] (float64).

    Returns (nope codes uint8 [448], scale bytes uint8 [8], rope bf16 [64])."""
    yb = bf16_round(y[:nope_dim]).view(-1, group)
    codes, ue = quant_group_ue8m0(yb)
    scale_bytes = torch.zeros(8, dtype=torch.uint8)
    scale_bytes[: ue.numel()] = ue.to(torch.uint8)
    rope = gptj_rope_ref(y[nope_dim:], cos, sin).to(torch.float32).to(torch.bfloat16)
    return codes.flatten(), scale_bytes, rope


def fp8_ds_mla_entry_bytes(codes, scale_bytes, rope, page_size: int):
    """Place an entry into (value bytes [576], scale bytes [8])."""
    value = torch.empty(576, dtype=torch.uint8)
    value[:448] = codes
    value[448:] = rope.contiguous().view(torch.uint8)
    return value, scale_bytes


def _compressed_rows(state_cache, token_to_req_indices, positions, slot_mapping, block_table,
                     block_size, cos_sin_cache, kv_slot_mapping, compress_ratio,
                     rms_norm_weight, rms_norm_eps, head_dim):
    """The tokens a compressor store writes (a compression boundary, a state slot and a
    cache slot, within every per-token array, as the kernels' masks have it), each with
    its RMS-normalised compressed vector (float64) and the cos/sin row of its compressed
    position: yields (t, y, cos_sin)."""
    state_width = state_cache.shape[-1] // 2
    for t in range(slot_mapping.shape[0]):
        if t >= positions.shape[0] or t >= kv_slot_mapping.shape[0]:
            continue
        pos = int(positions[t])
        if int(slot_mapping[t]) < 0 or int(kv_slot_mapping[t]) < 0:
            continue
        if (pos + 1) % compress_ratio != 0:
            continue
        req = int(token_to_req_indices[t])
        comp = compress_window_ref(state_cache, block_table[req], block_size, pos,
                                   compress_ratio, head_dim, state_width)
        y = rms_norm_ref(comp, rms_norm_weight, rms_norm_eps)
        cpos = (pos // compress_ratio) * compress_ratio
        yield t, y, cos_sin_cache[cpos].to(torch.float64)


def compressor_store_ref(*, state_cache, token_to_req_indices, positions, slot_mapping,
                         block_table, block_size, cos_sin_cache, kv_cache,
                         kv_slot_mapping, compress_ratio, rms_norm_weight, rms_norm_eps,
                         head_dim=512, rope_head_dim=64):
    """Reference of the main compressor store: returns a copy of ``kv_cache``
    (uint8 [nb, bs, 584] view with padded stride) with every boundary token's
    entry written, plus the float64 normalised vectors keyed by token."""
    flat = kv_cache.as_strided((kv_cache.shape[0], kv_cache.stride(0)), (kv_cache.stride(0), 1))
    out = flat.clone()
    bs = kv_cache.shape[1]
    half = rope_head_dim // 2
    normed = {}
    for t, y, cs in _compressed_rows(state_cache, token_to_req_indices, positions, slot_mapping,
                                     block_table, block_size, cos_sin_cache, kv_slot_mapping,
                                     compress_ratio, rms_norm_weight, rms_norm_eps, head_dim):
        normed[t] = y
        codes, sbytes, rope = fp8_ds_mla_entry_ref(y, cs[:half], cs[half:rope_head_dim])
        value, sbytes = fp8_ds_mla_entry_bytes(codes, sbytes, rope, bs)
        slot = int(kv_slot_mapping[t])
        page, i = divmod(slot, bs)
        out[page, i * 576:(i + 1) * 576] = value
        out[page, bs * 576 + i * 8: bs * 576 + i * 8 + 8] = sbytes
    return out, normed


# ----------------------------------------------------------------------------
# Indexer compressor (head 128 -> 132-byte indexer page)
# ----------------------------------------------------------------------------
def indexer_entry_ref(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      rope_dim: int = 64):
    """Normalised [128] float64 -> (128 e4m3 codes, fp32 scale).  RoPE on the
    last ``rope_dim`` dims, bf16 round of the whole row, one UE8M0 scale from
    fl32(max(absmax, 1e-4) * fl32(1/448))."""
    z = y.clone()
    z[-rope_dim:] = gptj_rope_ref(y[-rope_dim:], cos, sin)
    zb = bf16_round(z)
    absmax = torch.clamp(zb.abs().max().to(torch.float32), min=1e-4)
    raw = absmax * torch.tensor(1.0 / 448.0, dtype=torch.float32)
    ue = ue8m0_exponent_ref(raw)
    scale = torch.pow(2.0, ue.to(torch.float64) - 127.0)
    q = (zb / scale).clamp(-FP8_MAX, FP8_MAX)
    return e4m3_encode_ref(q), scale.to(torch.float32)


def indexer_store_ref(*, state_cache, token_to_req_indices, positions, slot_mapping,
                      block_table, block_size, cos_sin_cache, kv_cache, kv_slot_mapping,
                      compress_ratio, rms_norm_weight, rms_norm_eps, head_dim=128,
                      rope_head_dim=64):
    """Reference of the indexer compressor store into ``kv_cache`` (uint8
    [nb, bs, 132] view).  Returns the written copy as [nb, stride0] bytes."""
    flat = kv_cache.as_strided((kv_cache.shape[0], kv_cache.stride(0)), (kv_cache.stride(0), 1))
    out = flat.clone()
    bs = kv_cache.shape[1]
    half = rope_head_dim // 2
    for t, y, cs in _compressed_rows(state_cache, token_to_req_indices, positions, slot_mapping,
                                     block_table, block_size, cos_sin_cache, kv_slot_mapping,
                                     compress_ratio, rms_norm_weight, rms_norm_eps, head_dim):
        codes, scale = indexer_entry_ref(y, cs[:half], cs[half:rope_head_dim], rope_head_dim)
        slot = int(kv_slot_mapping[t])
        page, i = divmod(slot, bs)
        out[page, i * head_dim:(i + 1) * head_dim] = codes
        out[page, bs * head_dim + i * 4: bs * head_dim + i * 4 + 4] = (
            scale.reshape(1).view(torch.uint8))
    return out


# ----------------------------------------------------------------------------
# Index Q: RoPE + per-(token, head) UE8M0 FP8 + weight fold
# ----------------------------------------------------------------------------
def indexer_q_ref(positions, q, cos_sin_cache, weights, softmax_scale, head_scale,
                  rope_dim: int = 64):
    """Returns (codes uint8 [T, H, D], weights_out fp32 [T, H], scale [T, H]).

    RoPE (GPT-J) on the last ``rope_dim`` dims in float64 rounded to bf16; the
    NoPE dims pass through; scale = 2^ceil(log2(max(amax, 1e-4) / 448));
    codes = e4m3(x / scale); weights_out = w * scale * softmax_scale *
    head_scale (fp32 products in that order)."""
    T, H, D = q.shape
    half = rope_dim // 2
    cs = cos_sin_cache[positions.long()].to(torch.float64)  # [T, rope]
    cos = cs[:, None, :half]
    sin = cs[:, None, half:rope_dim]
    x = q.to(torch.float64)
    z = x.clone()
    z[..., D - rope_dim:] = bf16_round(gptj_rope_ref(x[..., D - rope_dim:], cos, sin))
    amax = z.abs().amax(dim=-1).to(torch.float32)
    raw = torch.clamp(amax, min=1e-4) / torch.tensor(448.0)
    ue = ue8m0_exponent_ref(raw)
    scale = torch.pow(2.0, ue.to(torch.float64) - 127.0)
    codes = e4m3_encode_ref(z / scale.unsqueeze(-1))
    w = weights.to(torch.float32) * scale.to(torch.float32)
    w = w * torch.tensor(softmax_scale, dtype=torch.float32)
    w = w * torch.tensor(head_scale, dtype=torch.float32)
    return codes, w, scale.to(torch.float32)


def fp8_ds_mla_dequant_ref(page_bytes: torch.Tensor, bs: int, i: int) -> torch.Tensor:
    """Decode entry ``i`` of one page (flat uint8) to float64 [512]."""
    base = i * 576
    codes = page_bytes[base:base + 448]
    scales = page_bytes[bs * 576 + i * 8: bs * 576 + i * 8 + 7]
    nope = e4m3_decode_ref(codes).view(7, 64) * ue8m0_decode_ref(scales).unsqueeze(-1)
    rope = page_bytes[base + 448: base + 576].contiguous().view(torch.bfloat16)
    return torch.cat([nope.flatten(), rope.to(torch.float64)])


__all__ = [name for name in dir() if not name.startswith("_") and name != "math"]
del math
