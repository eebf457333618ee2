"""Indexer-compressor writer (head 128 -> 132-byte indexer page) for SM80.

Semantics of upstream's ``_fused_kv_compress_norm_rope_insert_indexer_attn``
(the writer CUDA runs for this cache): softmax pool of the C4 overlap window
of saved states, RMSNorm, GPT-J RoPE on the last 64 dims at position
(pos // ratio) * ratio, bf16 round, one UE8M0 scale per 128 values from
max(absmax, 1e-4) * (1/448), e4m3 codes.  Page: ``[bs * 128 e4m3][bs * 4 fp32
scale]``.  The exponent uses the exact integer ceil-log2 (upstream uses
``tl.log2``, which can differ only for a scale within 2^-22 of a power of
two); e4m3 is encoded in software.
"""

import torch
import triton
import triton.language as tl

from .fp8 import bf16_rne, e4m3_encode, ue8m0_from_scale, ue8m0_to_scale


@triton.jit
def _indexer_compress_store_kernel(
    state_ptr,
    state_stride0,
    state_stride1,
    t2r_ptr,
    pos_ptr,
    n_pos,
    slot_ptr,
    bt_ptr,
    bt_stride,
    state_block_size,
    w_ptr,
    eps,
    cs_ptr,
    cs_stride,
    k_ptr,
    kv_slot_ptr,
    n_kv_slots,
    kv_block_size,
    kv_block_stride,
    HEAD: tl.constexpr,
    STATE_WIDTH: tl.constexpr,
    COMPRESS_RATIO: tl.constexpr,
    OVERLAP: tl.constexpr,
    ROPE: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok)
    position = tl.load(pos_ptr + tok, mask=tok < n_pos, other=0).to(tl.int64)
    kv_slot = tl.load(kv_slot_ptr + tok, mask=tok < n_kv_slots, other=-1).to(tl.int64)
    active = (slot >= 0) & (tok < n_pos) & (kv_slot >= 0)
    active = active & ((position + 1) % COMPRESS_RATIO == 0)
    if active:
        req = tl.load(t2r_ptr + tok).to(tl.int64)
        WINDOW: tl.constexpr = (1 + OVERLAP) * COMPRESS_RATIO
        rows = tl.arange(0, WINDOW)
        p = position - WINDOW + 1 + rows
        valid = p >= 0
        pc = tl.maximum(p, 0)
        blk = tl.load(bt_ptr + req * bt_stride + pc // state_block_size, mask=valid, other=0)
        row = (state_ptr + blk.to(tl.int64) * state_stride0
               + (pc % state_block_size) * state_stride1
               + (rows >= COMPRESS_RATIO).to(tl.int32) * HEAD)
        cols = tl.arange(0, HEAD)
        m2 = valid[:, None] & (cols[None, :] < HEAD)
        sc = tl.load(row[:, None] + STATE_WIDTH + cols[None, :], mask=m2, other=float("-inf"))
        kv = tl.load(row[:, None] + cols[None, :], mask=m2, other=0.0)
        pool = tl.softmax(sc, dim=0)
        x = tl.sum(kv * pool, axis=0)
        ms = tl.sum(x * x, axis=0) / HEAD
        w = tl.load(w_ptr + cols).to(tl.float32)
        y = x * tl.rsqrt(ms + eps) * w

        NOPE: tl.constexpr = HEAD - ROPE
        even, odd = tl.split(tl.reshape(y, (HEAD // 2, 2)))
        pair = tl.arange(0, HEAD // 2) - NOPE // 2
        is_rope = pair >= 0
        pj = tl.maximum(pair, 0)
        cpos = (position // COMPRESS_RATIO) * COMPRESS_RATIO
        cs_row = cs_ptr + cpos * cs_stride
        cos_v = tl.load(cs_row + pj, mask=is_rope, other=1.0).to(tl.float32)
        sin_v = tl.load(cs_row + ROPE // 2 + pj, mask=is_rope, other=0.0).to(tl.float32)
        z = tl.interleave(even * cos_v - odd * sin_v, odd * cos_v + even * sin_v)

        zb = bf16_rne(z)
        absmax = tl.maximum(tl.max(tl.abs(zb), axis=0), 1.0e-4)
        ue, inv_scale = ue8m0_from_scale(absmax * (1.0 / 448.0))
        q = tl.minimum(tl.maximum(zb * inv_scale, -448.0), 448.0)

        page = kv_slot // kv_block_size
        in_page = kv_slot - page * kv_block_size
        page_base = k_ptr + page * kv_block_stride
        tl.store(page_base + in_page * HEAD + cols, e4m3_encode(q))
        scale_ptr = (page_base + kv_block_size * HEAD + in_page * 4).to(
            tl.pointer_type(tl.float32))
        tl.store(scale_ptr, ue8m0_to_scale(ue))


def indexer_compress_store(
    *,
    state_cache: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    state_width: int,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    compress_ratio: int,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    head_dim: int = 128,
    rope_head_dim: int = 64,
    num_actual: int | None = None,
) -> None:
    """Write indexer K entries into the uint8 ``[nb, bs, 132]`` cache view."""
    if head_dim != 128:
        raise ValueError(f"indexer writer needs head_dim=128, got {head_dim}")
    overlap = compress_ratio == 4
    if state_width != (2 if overlap else 1) * head_dim:
        raise ValueError(f"state_width {state_width} does not match ratio {compress_ratio}")
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 3:
        raise ValueError("kv_cache must be the uint8 [num_blocks, block_size, 132] view")
    n = slot_mapping.shape[0] if num_actual is None else num_actual
    if n == 0:
        return
    _indexer_compress_store_kernel[(n,)](
        state_cache,
        state_cache.stride(0),
        state_cache.stride(1),
        token_to_req_indices,
        positions,
        positions.shape[0],
        slot_mapping,
        block_table,
        block_table.stride(0),
        block_size,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
        cos_sin_cache.stride(0),
        kv_cache,
        kv_slot_mapping,
        kv_slot_mapping.shape[0],
        kv_cache.shape[1],
        kv_cache.stride(0),
        HEAD=head_dim,
        STATE_WIDTH=state_width,
        COMPRESS_RATIO=compress_ratio,
        OVERLAP=overlap,
        ROPE=rope_head_dim,
        num_warps=4,
    )
