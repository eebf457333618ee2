"""Portable Triton ``dequantize_and_gather_k_cache`` for SM80/SM86.

This is the baseline that other Ampere ports of DeepSeek-V4 run: upstream's Triton gather
with the ``tl.float8e4nv`` bitcast (which Triton cannot emit below SM89) replaced by a
software e4m3 decode. FP8 stays ``uint8`` at the kernel boundary.

Semantics (vLLM 0.33.0 ``dequantize_and_gather_k_cache``, V4 ``fp8_ds_mla`` record):
for request ``r`` and ``i < g`` (``g = gather_lens[r]`` or ``seq_lens[r]`` when
``gather_lens`` is None) the cache entry at position ``pos = seq_lens[r] - g + i`` is
read from physical block ``block_table[r, pos // block_size]``, slot
``pos % block_size``, and written to ``out[r, offset + i, :]``:

- ``out[..., :448]`` = e4m3(byte) * 2^(scale_byte - 127), one UE8M0 scale byte per 64
  values, rounded to bf16 (exact: an e4m3 value times a power of two fits in bf16);
- ``out[..., 448:]`` = the 64 bf16 RoPE values copied bit for bit.

Page layout: entry data at ``slot * 576`` (448 e4m3 bytes then 64 bf16), the 8 scale
bytes of a slot at ``block_size * 576 + slot * 8``; the page stride is
``k_cache.stride(0)``. Rows of ``out`` that are not gathered are left untouched.

Unlike upstream, the block table is addressed through its real strides (a strided view is
read correctly) and all byte offsets are 64-bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_DIM = 448  # e4m3 NoPE values per entry
ROPE_DIM = 64  # bf16 RoPE values per entry
HEAD_DIM = FP8_DIM + ROPE_DIM  # 512
QUANT_BLOCK = 64  # values per UE8M0 scale byte
TOKEN_DATA_BYTES = FP8_DIM + 2 * ROPE_DIM  # 576
SCALE_BYTES = 8  # 7 scales + 1 pad per entry

# Launch shape: (requests, NUM_WORKERS) programs, each walking tiles of BLOCK_T entries.
NUM_WORKERS = 128
BLOCK_T = 8
NUM_WARPS = 4


@triton.jit
def _e4m3_to_f32(x):
    """Exact e4m3fn -> fp32 decode by bit manipulation (no FP8 types).

    ``x`` is int32 holding the byte. Normals: sign | (exp + 120) << 23 | mant << 20.
    Subnormals (exp == 0): mant * 2^-9. 0x7F / 0xFF are NaN (e4m3fn has no inf).
    """
    sign = (x & 0x80) << 24
    exp = (x >> 3) & 0xF
    mant = x & 0x7
    normal = (sign | ((exp + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
    sub_mag = mant.to(tl.float32) * 0.001953125  # 2^-9, exact
    sub = (sub_mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)  # keeps -0
    val = tl.where(exp == 0, sub, normal)
    nan = (sign | 0x7FC00000).to(tl.float32, bitcast=True)
    return tl.where((x & 0x7F) == 0x7F, nan, val)


@triton.jit
def _gather_kernel(
    out_ptr,
    out_stride0,
    out_stride1,
    k_cache_ptr,
    block_stride,
    seq_lens_ptr,
    gather_lens_ptr,
    block_table_ptr,
    bt_stride0,
    bt_stride1,
    offset,
    HAS_GATHER_LENS: tl.constexpr,
    CACHE_BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    req = tl.program_id(0)
    worker = tl.program_id(1)
    num_workers = tl.num_programs(1)

    seq_len = tl.load(seq_lens_ptr + req)
    if HAS_GATHER_LENS:
        gather_len = tl.load(gather_lens_ptr + req)
    else:
        gather_len = seq_len
    start_pos = seq_len - gather_len

    cols = tl.arange(0, 512)  # 0..447 e4m3 lanes; the rest masked off
    fp8_col = cols < 448
    rope_cols = tl.arange(0, 64)
    t_ar = tl.arange(0, BLOCK_T)

    req64 = req.to(tl.int64)
    bt_row = block_table_ptr + req64 * bt_stride0
    out_row = out_ptr + req64 * out_stride0

    for t0 in range(worker * BLOCK_T, gather_len, num_workers * BLOCK_T):
        i = t0 + t_ar
        t_mask = i < gather_len
        pos = start_pos + i
        blk = tl.load(bt_row + (pos // CACHE_BLOCK_SIZE).to(tl.int64) * bt_stride1,
                      mask=t_mask, other=0)
        slot = pos % CACHE_BLOCK_SIZE
        page = k_cache_ptr + blk.to(tl.int64) * block_stride
        entry = page + slot.to(tl.int64) * 576
        scales = page + CACHE_BLOCK_SIZE * 576 + slot.to(tl.int64) * 8

        m2 = t_mask[:, None] & fp8_col[None, :]
        q = tl.load(entry[:, None] + cols[None, :], mask=m2, other=0).to(tl.int32)
        s = tl.load(scales[:, None] + (cols // 64)[None, :], mask=m2, other=127)
        scale = (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # 2^(s - 127)
        val = (_e4m3_to_f32(q) * scale).to(tl.bfloat16)

        dst = out_row + (offset + i).to(tl.int64) * out_stride1
        tl.store(dst[:, None] + cols[None, :], val, mask=m2)

        rope_src = (entry + 448).to(tl.pointer_type(tl.bfloat16))
        m3 = t_mask[:, None]
        rope = tl.load(rope_src[:, None] + rope_cols[None, :], mask=m3)
        tl.store(dst[:, None] + 448 + rope_cols[None, :], rope, mask=m3)


def _check(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset):
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ValueError(f"dequantize_and_gather_k_cache (portable Triton): {msg}")

    need(out.dim() == 3 and out.shape[2] == HEAD_DIM and out.dtype == torch.bfloat16,
         f"out must be [R, M, 512] bfloat16, got {tuple(out.shape)} {out.dtype}")
    need(out.stride(2) == 1, "out must be contiguous in its last dimension")
    need(k_cache.dtype == torch.uint8 and k_cache.dim() >= 2,
         f"k_cache must be a uint8 [num_blocks, block_bytes...] tensor, got {k_cache.dtype}")
    need(block_size > 0, f"block_size must be positive, got {block_size}")
    page_bytes = block_size * (TOKEN_DATA_BYTES + SCALE_BYTES)
    need(k_cache[0].numel() >= page_bytes,
         f"k_cache pages hold {k_cache[0].numel()} bytes, need {page_bytes} for block_size {block_size}")
    need(k_cache.stride(0) >= page_bytes and k_cache.stride(-1) == 1,
         "k_cache pages must be byte-contiguous with stride(0) >= one page")
    need(seq_lens.dtype == torch.int32 and seq_lens.dim() == 1,
         f"seq_lens must be 1-D int32, got {seq_lens.dtype}")
    need(block_table.dtype == torch.int32 and block_table.dim() == 2,
         f"block_table must be 2-D int32, got {block_table.dtype}")
    need(block_table.shape[0] >= seq_lens.shape[0], "block_table has fewer rows than seq_lens")
    need(out.shape[0] >= seq_lens.shape[0], "out has fewer rows than seq_lens")
    if gather_lens is not None:
        need(gather_lens.dtype == torch.int32 and gather_lens.shape == seq_lens.shape,
             "gather_lens must be int32 with the shape of seq_lens")
    need(offset >= 0, f"offset must be >= 0, got {offset}")
    devs = {t.device for t in (out, k_cache, seq_lens, block_table)}
    if gather_lens is not None:
        devs.add(gather_lens.device)
    need(len(devs) == 1, f"all tensors must be on one device, got {sorted(map(str, devs))}")


def dequantize_and_gather_k_cache(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int,
    use_fnuz: bool = False,
) -> None:
    """Drop-in for upstream's function of the same name (OCP e4m3 caches only)."""
    if use_fnuz:
        raise NotImplementedError(
            "use_fnuz=True (FNUZ e4m3, AMD gfx942) is not supported by the SM80 portable "
            "gather; NVIDIA caches are OCP e4m3fn (use_fnuz=False)")
    _check(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset)
    num_reqs = seq_lens.shape[0]
    if num_reqs == 0:
        return
    grid = (num_reqs, NUM_WORKERS)
    _gather_kernel[grid](
        out, out.stride(0), out.stride(1),
        k_cache, k_cache.stride(0),
        seq_lens, gather_lens if gather_lens is not None else seq_lens,
        block_table, block_table.stride(0), block_table.stride(1),
        offset,
        HAS_GATHER_LENS=gather_lens is not None,
        CACHE_BLOCK_SIZE=block_size,
        BLOCK_T=BLOCK_T,
        num_warps=NUM_WARPS,
    )


def aot_sources(block_size: int = 64) -> list:
    """Triton ``ASTSource`` objects for every kernel variant the launcher can pick, for
    ahead-of-time compilation checks (``triton.compile(src, target=GPUTarget(...))``)."""
    from triton.compiler import ASTSource

    sig = {
        "out_ptr": "*bf16", "out_stride0": "i64", "out_stride1": "i64",
        "k_cache_ptr": "*u8", "block_stride": "i64",
        "seq_lens_ptr": "*i32", "gather_lens_ptr": "*i32",
        "block_table_ptr": "*i32", "bt_stride0": "i64", "bt_stride1": "i64",
        "offset": "i32",
        "HAS_GATHER_LENS": "constexpr", "CACHE_BLOCK_SIZE": "constexpr", "BLOCK_T": "constexpr",
    }
    return [
        ASTSource(fn=_gather_kernel, signature=sig,
                  constexprs={"HAS_GATHER_LENS": has_g, "CACHE_BLOCK_SIZE": block_size,
                              "BLOCK_T": BLOCK_T})
        for has_g in (False, True)
    ]
