"""Main-compressor writers (head 512) for the V4 ``fp8_ds_mla`` cache on SM80.

One program per token; only compression-boundary tokens ((pos + 1) % ratio
== 0) with a valid state slot and a valid cache slot write anything, so CUDA
graph padding rows (slot -1) never publish a cache entry.

Math follows the production CuTe DSL writer (nvidia/ops/
sparse_attn_compress_cutedsl.py) operation by operation, including its fp32
reduction trees, so that the bytes agree with it:

* C4 (overlap, window 8): online softmax over the 8 window rows (rows with a
  negative position skipped), value = product / sum, RMSNorm with per-lane
  8-element sums, a 32-lane butterfly, then warp 0 + warp 1.
* C128 (window 128 = 8 warps x 16 rows), two stages like the CuTe DSL split
  kernels: per (token, 64-column tile) per-warp max, per-warp sequential
  exp-sums, a rescaled 8-way butterfly combine, value = product / sum into an
  fp32 scratch row; then per token RMSNorm with 2-element lane sums, a 32-lane
  butterfly and an 8-way butterfly.
* NoPE 448 = 7 groups of 64: bf16-round, absmax, scale = max(1e-4, absmax /
  448), UE8M0 exponent by ``(bits + 0x7FFFFF) >> 23``, e4m3 RNE satfinite in
  software.  RoPE 64 (GPT-J pairs, position (pos // ratio) * ratio) stored
  as bf16 after the 448 FP8 bytes.  Scales at ``bs * 576 + slot * 8``: 7
  UE8M0 bytes and a zero pad.
"""

import torch
import triton
import triton.language as tl

from .fp8 import bf16_rne, e4m3_encode, ue8m0_from_scale

_RCP_LN2 = 1.4426950408889634
_FP8_MAX = 448.0
_MIN_SCALE = 1.0e-4


@triton.jit
def _butterfly_sum32(v, LEAD: tl.constexpr):
    """Sum a [LEAD, 32] tensor over its lane axis in xor-butterfly order
    (offsets 16, 8, 4, 2, 1) as lane 0 of a warp computes it."""
    v = tl.sum(tl.reshape(v, (LEAD, 2, 16)), axis=1)
    v = tl.sum(tl.reshape(v, (LEAD, 2, 8)), axis=1)
    v = tl.sum(tl.reshape(v, (LEAD, 2, 4)), axis=1)
    v = tl.sum(tl.reshape(v, (LEAD, 2, 2)), axis=1)
    v = tl.sum(v, axis=1)
    return v


@triton.jit
def _quant_store_nope_rope(
    y,  # [HEAD] fp32 normalised values
    cols,
    position,
    cs_ptr,
    cs_stride,
    k_ptr,
    kv_slot,
    kv_block_size,
    kv_block_stride,
    COMPRESS_RATIO: tl.constexpr,
    HEAD: tl.constexpr,
    ROPE: tl.constexpr,
    QB: tl.constexpr,
    TOKEN_STRIDE: tl.constexpr,
    SCALE_DIM: tl.constexpr,
):
    NOPE: tl.constexpr = HEAD - ROPE
    NGROUPS: tl.constexpr = HEAD // QB
    NOPE_GROUPS: tl.constexpr = NOPE // QB
    HALF_ROPE: tl.constexpr = ROPE // 2
    NPAIRS: tl.constexpr = HEAD // 2

    page = kv_slot // kv_block_size
    in_page = kv_slot - page * kv_block_size
    page_base = k_ptr + page.to(tl.int64) * kv_block_stride
    value_base = page_base + in_page * TOKEN_STRIDE
    scale_base = page_base + kv_block_size * TOKEN_STRIDE + in_page * SCALE_DIM

    # ---- NoPE: bf16 round, per-64 absmax, UE8M0, software e4m3 ----
    yb = bf16_rne(y)
    y2 = tl.reshape(yb, (NGROUPS, QB))
    absmax = tl.max(tl.abs(y2), axis=1)
    scale_raw = tl.maximum(tl.div_rn(absmax, 448.0), 1.0e-4)
    ue, inv_scale = ue8m0_from_scale(scale_raw)
    q = y2 * tl.reshape(inv_scale, (NGROUPS, 1))
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    codes = tl.reshape(e4m3_encode(q), (HEAD,))
    tl.store(value_base + cols, codes, mask=cols < NOPE)
    gidx = tl.arange(0, NGROUPS)
    sbytes = tl.where(gidx < NOPE_GROUPS, ue, 0).to(tl.uint8)
    tl.store(scale_base + gidx, sbytes, mask=gidx < SCALE_DIM)

    # ---- RoPE: GPT-J pairs on the last ROPE dims, bf16 store ----
    even, odd = tl.split(tl.reshape(y, (NPAIRS, 2)))
    pair = tl.arange(0, NPAIRS) - NOPE // 2
    is_rope = pair >= 0
    pj = tl.maximum(pair, 0)
    cpos = (position // COMPRESS_RATIO) * COMPRESS_RATIO
    cs_row = cs_ptr + cpos * cs_stride
    cos_v = tl.load(cs_row + pj, mask=is_rope, other=1.0).to(tl.float32)
    sin_v = tl.load(cs_row + HALF_ROPE + pj, mask=is_rope, other=0.0).to(tl.float32)
    real = even * cos_v - odd * sin_v
    imag = even * sin_v + odd * cos_v
    rot = tl.interleave(real, imag)
    rope_ptr = (value_base + NOPE).to(tl.pointer_type(tl.bfloat16))
    tl.store(rope_ptr + (cols - NOPE), bf16_rne(rot).to(tl.bfloat16), mask=cols >= NOPE)


@triton.jit
def _c4_compress_store_kernel(
    state_ptr,
    state_stride0,
    state_stride1,
    t2r_ptr,
    n_req_idx,
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
    ROPE: tl.constexpr,
    QB: tl.constexpr,
    TOKEN_STRIDE: tl.constexpr,
    SCALE_DIM: tl.constexpr,
):
    tl.static_assert(HEAD == 512)
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok)
    position = tl.load(pos_ptr + tok, mask=tok < n_pos, other=0).to(tl.int64)
    kv_slot = tl.load(kv_slot_ptr + tok, mask=tok < n_kv_slots, other=-1).to(tl.int64)
    active = (slot >= 0) & (tok < n_pos) & (tok < n_req_idx) & (kv_slot >= 0)
    active = active & ((position + 1) % COMPRESS_RATIO == 0)
    if active:
        req = tl.load(t2r_ptr + tok).to(tl.int64)
        WINDOW: tl.constexpr = 2 * COMPRESS_RATIO
        start = position - (WINDOW - 1)
        cols = tl.arange(0, HEAD)
        run_max = tl.full((HEAD,), float("-inf"), tl.float32)
        run_sum = tl.zeros((HEAD,), tl.float32)
        run_prod = tl.zeros((HEAD,), tl.float32)
        for r in tl.static_range(WINDOW):
            p = start + r
            valid = p >= 0
            pc = tl.maximum(p, 0)
            blk = tl.load(bt_ptr + req * bt_stride + pc // state_block_size).to(tl.int64)
            row = state_ptr + blk * state_stride0 + (pc % state_block_size) * state_stride1
            row = row + (r // COMPRESS_RATIO) * HEAD
            kv = tl.load(row + cols, mask=valid & (cols < HEAD), other=0.0)
            sc = tl.load(row + STATE_WIDTH + cols, mask=valid & (cols < HEAD), other=0.0)
            new_max = tl.maximum(run_max, sc)
            old_scale = tl.math.exp2((run_max - new_max) * 1.4426950408889634)
            new_scale = tl.math.exp2((sc - new_max) * 1.4426950408889634)
            n_sum = run_sum * old_scale + new_scale
            n_prod = run_prod * old_scale + kv * new_scale
            run_max = tl.where(valid, new_max, run_max)
            run_sum = tl.where(valid, n_sum, run_sum)
            run_prod = tl.where(valid, n_prod, run_prod)
        x = tl.div_rn(run_prod, run_sum)

        # RMSNorm: lane (warp w, lane l) owns x[w*256 + 8*l : +8]; sequential
        # 8-element sum, 32-lane butterfly, then warp0 + warp1.
        t0, t1 = tl.split(tl.reshape(x, (64, 2, 2, 2)))
        t00, t01 = tl.split(t0)
        t10, t11 = tl.split(t1)
        e0, e4 = tl.split(t00)
        e2, e6 = tl.split(t01)
        e1, e5 = tl.split(t10)
        e3, e7 = tl.split(t11)
        acc = e0 * e0
        acc = acc + e1 * e1
        acc = acc + e2 * e2
        acc = acc + e3 * e3
        acc = acc + e4 * e4
        acc = acc + e5 * e5
        acc = acc + e6 * e6
        acc = acc + e7 * e7
        per_warp = _butterfly_sum32(tl.reshape(acc, (2, 32)), 2)
        total = tl.sum(per_warp, axis=0)
        rrms = tl.rsqrt(total * (1.0 / HEAD) + eps)
        w = tl.load(w_ptr + cols).to(tl.float32)
        y = x * rrms * w
        _quant_store_nope_rope(
            y, cols, position, cs_ptr, cs_stride, k_ptr, kv_slot, kv_block_size,
            kv_block_stride, COMPRESS_RATIO, HEAD, ROPE, QB, TOKEN_STRIDE, SCALE_DIM,
        )


@triton.jit
def _c128_active(slot_ptr, pos_ptr, n_pos, n_req_idx, kv_slot_ptr, n_kv_slots, tok,
                 COMPRESS_RATIO: tl.constexpr):
    slot = tl.load(slot_ptr + tok)
    position = tl.load(pos_ptr + tok, mask=tok < n_pos, other=0).to(tl.int64)
    kv_slot = tl.load(kv_slot_ptr + tok, mask=tok < n_kv_slots, other=-1).to(tl.int64)
    active = (slot >= 0) & (tok < n_pos) & (tok < n_req_idx) & (kv_slot >= 0)
    active = active & ((position + 1) % COMPRESS_RATIO == 0)
    return active, position, kv_slot


@triton.jit
def _c128_compress_kernel(
    state_ptr,
    state_stride0,
    state_stride1,
    t2r_ptr,
    n_req_idx,
    pos_ptr,
    n_pos,
    slot_ptr,
    bt_ptr,
    bt_stride,
    state_block_size,
    kv_slot_ptr,
    n_kv_slots,
    scratch_ptr,
    HEAD: tl.constexpr,
    STATE_WIDTH: tl.constexpr,
    COMPRESS_RATIO: tl.constexpr,
    HEAD_TILE: tl.constexpr,
):
    """Stage 1 (per token x 64-column tile): softmax pool of the 128 window
    rows as 8 "warps" of 16 rows, written to an fp32 scratch row."""
    tl.static_assert(COMPRESS_RATIO == 128)
    tok = tl.program_id(0)
    split = tl.program_id(1)
    active, position, kv_slot = _c128_active(slot_ptr, pos_ptr, n_pos, n_req_idx, kv_slot_ptr,
                                             n_kv_slots, tok, COMPRESS_RATIO)
    if active:
        req = tl.load(t2r_ptr + tok).to(tl.int64)
        start = position - (COMPRESS_RATIO - 1)  # >= 0 at a boundary
        cols = split * HEAD_TILE + tl.arange(0, HEAD_TILE)
        warps = tl.arange(0, 8)
        m_w = tl.full((8, HEAD_TILE), float("-inf"), tl.float32)
        for i in tl.static_range(16):
            p = start + warps * 16 + i
            blk = tl.load(bt_ptr + req * bt_stride + p // state_block_size).to(tl.int64)
            row = state_ptr + blk * state_stride0 + (p % state_block_size) * state_stride1
            sc = tl.load(row[:, None] + STATE_WIDTH + cols[None, :])
            m_w = tl.maximum(m_w, sc)
        s_w = tl.zeros((8, HEAD_TILE), tl.float32)
        p_w = tl.zeros((8, HEAD_TILE), tl.float32)
        for i in tl.static_range(16):
            p = start + warps * 16 + i
            blk = tl.load(bt_ptr + req * bt_stride + p // state_block_size).to(tl.int64)
            row = state_ptr + blk * state_stride0 + (p % state_block_size) * state_stride1
            sc = tl.load(row[:, None] + STATE_WIDTH + cols[None, :])
            kv = tl.load(row[:, None] + cols[None, :])
            e = tl.math.exp2((sc - m_w) * 1.4426950408889634)
            s_w = s_w + e
            p_w = p_w + kv * e
        g_max = tl.max(m_w, axis=0)
        resc = tl.math.exp2((m_w - g_max[None, :]) * 1.4426950408889634)
        gs = s_w * resc
        gp = p_w * resc
        # 8-way butterfly (offsets 4, 2, 1) over the warp axis.
        gs = tl.sum(tl.reshape(gs, (2, 4, HEAD_TILE)), axis=0)
        gs = tl.sum(tl.reshape(gs, (2, 2, HEAD_TILE)), axis=0)
        gs = tl.sum(gs, axis=0)
        gp = tl.sum(tl.reshape(gp, (2, 4, HEAD_TILE)), axis=0)
        gp = tl.sum(tl.reshape(gp, (2, 2, HEAD_TILE)), axis=0)
        gp = tl.sum(gp, axis=0)
        tl.store(scratch_ptr + tok.to(tl.int64) * HEAD + cols, tl.div_rn(gp, gs))


@triton.jit
def _c128_store_kernel(
    scratch_ptr,
    t2r_ptr,
    n_req_idx,
    pos_ptr,
    n_pos,
    slot_ptr,
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
    COMPRESS_RATIO: tl.constexpr,
    ROPE: tl.constexpr,
    QB: tl.constexpr,
    TOKEN_STRIDE: tl.constexpr,
    SCALE_DIM: tl.constexpr,
):
    """Stage 2 (per token): RMSNorm (2-element lane sums, 32-lane butterfly,
    8-way butterfly), UE8M0 FP8 NoPE, bf16 RoPE."""
    tl.static_assert(HEAD == 512)
    tok = tl.program_id(0)
    active, position, kv_slot = _c128_active(slot_ptr, pos_ptr, n_pos, n_req_idx, kv_slot_ptr,
                                             n_kv_slots, tok, COMPRESS_RATIO)
    if active:
        cols = tl.arange(0, HEAD)
        x = tl.load(scratch_ptr + tok.to(tl.int64) * HEAD + cols)
        x0, x1 = tl.split(tl.reshape(x, (HEAD // 2, 2)))
        lane_ss = x0 * x0 + x1 * x1
        per_warp = _butterfly_sum32(tl.reshape(lane_ss, (8, 32)), 8)
        t = tl.sum(tl.reshape(per_warp, (2, 4)), axis=0)
        t = tl.sum(tl.reshape(t, (2, 2)), axis=0)
        total = tl.sum(t, axis=0)
        rrms = tl.rsqrt(total * (1.0 / HEAD) + eps)
        w = tl.load(w_ptr + cols).to(tl.float32)
        y = x * rrms * w
        _quant_store_nope_rope(
            y, cols, position, cs_ptr, cs_stride, k_ptr, kv_slot, kv_block_size,
            kv_block_stride, COMPRESS_RATIO, HEAD, ROPE, QB, TOKEN_STRIDE, SCALE_DIM,
        )


def compress_store_fp8_ds_mla(
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
    head_dim: int = 512,
    rope_head_dim: int = 64,
    num_actual: int | None = None,
    scratch: torch.Tensor | None = None,
) -> None:
    """Compress + RMSNorm + RoPE + UE8M0 FP8 + insert into the 584-B record.

    ``kv_cache``: uint8 ``[num_blocks, kv_block_size, 584]`` view of pages whose
    stride(0) may be padded (37440 for 64 entries).  ``state_cache``: fp32
    ``[num_state_blocks, state_block_size, 2 * state_width]``.
    """
    if head_dim != 512 or rope_head_dim != 64:
        raise ValueError(
            f"fp8_ds_mla writer needs head_dim=512, rope_head_dim=64; got "
            f"{head_dim}, {rope_head_dim}"
        )
    if compress_ratio not in (4, 128):
        raise ValueError(f"compress_ratio must be 4 or 128, got {compress_ratio}")
    if compress_ratio == 4 and state_width != 2 * head_dim:
        raise ValueError("C4 (overlap) needs state_width == 2 * head_dim")
    if compress_ratio == 128 and (state_width != head_dim or block_size != 8):
        raise ValueError("C128 needs state_width == head_dim and state block size 8")
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 3:
        raise ValueError(
            "kv_cache must be the uint8 [num_blocks, block_size, 584] fp8_ds_mla "
            f"view; got dtype={kv_cache.dtype}, shape={tuple(kv_cache.shape)}"
        )
    if state_cache.dtype != torch.float32 or state_cache.stride(-1) != 1:
        raise ValueError("state_cache must be fp32 with a unit last stride")
    if cos_sin_cache.stride(-1) != 1:
        raise ValueError("cos_sin_cache must have a unit last stride")
    n = slot_mapping.shape[0] if num_actual is None else num_actual
    if n == 0:
        return
    common = (token_to_req_indices, token_to_req_indices.shape[0], positions, positions.shape[0],
              slot_mapping)
    if compress_ratio == 4:
        _c4_compress_store_kernel[(n,)](
            state_cache, state_cache.stride(0), state_cache.stride(1), *common,
            block_table, block_table.stride(0), block_size, rms_norm_weight, rms_norm_eps,
            cos_sin_cache, cos_sin_cache.stride(0), kv_cache, kv_slot_mapping,
            kv_slot_mapping.shape[0], kv_cache.shape[1], kv_cache.stride(0),
            HEAD=head_dim, STATE_WIDTH=state_width, COMPRESS_RATIO=compress_ratio,
            ROPE=rope_head_dim, QB=64, TOKEN_STRIDE=576, SCALE_DIM=8, num_warps=4,
        )
        return
    if scratch is None or scratch.shape[0] < n:
        scratch = torch.empty((n, head_dim), dtype=torch.float32, device=state_cache.device)
    _c128_compress_kernel[(n, head_dim // 64)](
        state_cache, state_cache.stride(0), state_cache.stride(1), *common,
        block_table, block_table.stride(0), block_size, kv_slot_mapping,
        kv_slot_mapping.shape[0], scratch,
        HEAD=head_dim, STATE_WIDTH=state_width, COMPRESS_RATIO=compress_ratio, HEAD_TILE=64,
        num_warps=4,
    )
    _c128_store_kernel[(n,)](
        scratch, *common, rms_norm_weight, rms_norm_eps, cos_sin_cache,
        cos_sin_cache.stride(0), kv_cache, kv_slot_mapping, kv_slot_mapping.shape[0],
        kv_cache.shape[1], kv_cache.stride(0),
        HEAD=head_dim, COMPRESS_RATIO=compress_ratio, ROPE=rope_head_dim, QB=64,
        TOKEN_STRIDE=576, SCALE_DIM=8, num_warps=8,
    )
