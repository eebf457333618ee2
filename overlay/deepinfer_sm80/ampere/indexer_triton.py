"""Fused Triton scorer for the SM80 lightning indexer.

One program per (query row, column tile): the row's FP8 index-Q [H, 128] and
a tile of FP8 index-K [BLOCK_N, 128] are decoded exactly in registers
(software e4m3 -> bf16, exact), multiplied with ``tl.dot`` (bf16 mma.sync,
fp32 accumulation; products of e4m3 values are exact in fp32), then
relu * w[h] is reduced over heads and scaled by the column's fp32 k-scale.
Only the [rows, tile] fp32 logits leave the kernel; no [rows, heads, cols]
intermediate exists.  K is read either from the paged indexer cache
(``[bs * 128 e4m3][bs * 4 fp32]`` pages through a block table: decode) or
from a flat gathered workspace (prefill).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_sm80.triton_writers.fp8 import e4m3_decode

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _mqa_logits_kernel(
    q_ptr,  # u8 [rows, H, D]
    w_ptr,  # f32 [rows, H]
    k_ptr,  # u8: pages [nb, page_bytes] (PAGED) or flat codes [Nk, D]
    ks_ptr,  # f32 flat scales [Nk] (flat mode only)
    bt_ptr,  # i32 [B, maxb] (PAGED)
    row_req_ptr,  # i32 [rows] request of each row (PAGED)
    lo_ptr,  # i32 [rows] first visible column
    hi_ptr,  # i32 [rows] end of visible columns
    out_ptr,  # f32 logits or i64 keys [rows, out_stride]
    col0,  # first column of this call's tile range
    n_cols,  # columns in this call
    out_stride,
    bt_stride,
    bt_col_stride,
    page_bytes,
    block_size,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    DOT_BF16: tl.constexpr,
    DK: tl.constexpr = 32,
    EMIT_KEYS: tl.constexpr = False,
):
    row = tl.program_id(0)
    tile = tl.program_id(1)
    lc = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # local column in this call
    col = col0 + lc
    lo = tl.load(lo_ptr + row)
    hi = tl.load(hi_ptr + row)
    valid = (lc < n_cols) & (col >= lo) & (col < hi)
    h = tl.arange(0, H)
    q_row = q_ptr + row.to(tl.int64) * (H * D)
    if PAGED:
        req = tl.load(row_req_ptr + row).to(tl.int64)
        cc = tl.where(valid, col, 0)
        page = tl.load(bt_ptr + req * bt_stride + (cc // block_size) * bt_col_stride,
                       mask=valid, other=0)
        page = tl.maximum(page, 0).to(tl.int64)
        base = k_ptr + page * page_bytes
        slot = cc % block_size
        k_rows = base + slot * D
        ksc = tl.load((base + block_size * D + slot * 4).to(tl.pointer_type(tl.float32)),
                      mask=valid, other=0.0)
    else:
        cc = tl.where(valid, col, 0).to(tl.int64)
        k_rows = k_ptr + cc * D
        ksc = tl.load(ks_ptr + cc, mask=valid, other=0.0)
    s = tl.zeros((H, BLOCK_N), tl.float32)
    for d0 in tl.range(0, D, DK):
        dd = d0 + tl.arange(0, DK)
        q = e4m3_decode(tl.load(q_row + h[:, None] * D + dd[None, :]))
        k = e4m3_decode(tl.load(k_rows[:, None] + dd[None, :], mask=valid[:, None], other=0))
        if DOT_BF16:  # e4m3 values are exact in bf16: mma.sync bf16, fp32 accumulation
            s = tl.dot(q.to(tl.bfloat16), tl.trans(k.to(tl.bfloat16)), s)
        else:  # Triton's CPU interpreter mishandles bf16 dot: exact fp32 there
            s = tl.dot(q, tl.trans(k), s, input_precision="ieee")
    w = tl.load(w_ptr + row.to(tl.int64) * H + h)
    s = tl.maximum(s, 0.0) * w[:, None]
    logits = tl.sum(s, axis=0) * ksc
    if EMIT_KEYS:
        # int64 key ordering (score desc, index asc); see indexer.order_keys.
        x = tl.where(logits != logits, float("-inf"), logits)
        x = tl.where(x == 0.0, 0.0, x)  # -0.0 -> +0.0
        bits = x.to(tl.int32, bitcast=True)
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
        local = (col - lo).to(tl.int64)
        key = (ordered << 32) + (4294967295 - local)
        key = tl.where(valid, key, -9223372036854775807 - 1)
        tl.store(out_ptr + row.to(tl.int64) * out_stride + lc, key, mask=lc < n_cols)
    else:
        tl.store(out_ptr + row.to(tl.int64) * out_stride + lc, logits, mask=lc < n_cols)


def mqa_logits_tile(q_u8, w, *, col0, n_cols, lo, hi, out, k_flat=None, k_scale=None,
                    pages=None, block_table=None, row_req=None, block_size=0, block_n=64):
    """Columns [col0, col0 + n_cols) of every row into ``out`` [rows, >= n_cols]:
    fp32 logits (columns outside [lo, hi) hold garbage; callers mask them), or,
    for an int64 ``out``, top-k keys (``indexer.order_keys`` of the logits with
    index ``col - lo``; INT64_MIN outside [lo, hi))."""
    rows, H, D = q_u8.shape
    if rows == 0 or n_cols == 0:
        return out
    paged = pages is not None
    dummy_i32 = lo
    grid = (rows, triton.cdiv(n_cols, block_n))
    _mqa_logits_kernel[grid](
        q_u8, w,
        pages if paged else k_flat,
        k_scale if not paged else w,
        block_table if paged else dummy_i32,
        row_req if paged else dummy_i32,
        lo, hi, out, col0, n_cols, out.stride(0),
        block_table.stride(0) if paged else 0,
        block_table.stride(1) if paged else 0,
        pages.stride(0) if paged else 0,
        block_size,
        H=H, D=D, BLOCK_N=block_n, PAGED=paged, DOT_BF16=not _INTERPRET,
        EMIT_KEYS=out.dtype == torch.int64, num_warps=8,
    )
    return out


def aot_sources() -> dict:
    """Triton sources of every variant, for the CPU compile test (cuda 80/86)."""
    from triton.compiler import ASTSource

    sig = {"q_ptr": "*u8", "w_ptr": "*fp32", "k_ptr": "*u8", "ks_ptr": "*fp32",
           "bt_ptr": "*i32", "row_req_ptr": "*i32", "lo_ptr": "*i32", "hi_ptr": "*i32",
           "out_ptr": "*fp32", "col0": "i32", "n_cols": "i32", "out_stride": "i32",
           "bt_stride": "i32", "bt_col_stride": "i32", "page_bytes": "i64", "block_size": "i32",
           "H": "constexpr", "D": "constexpr", "BLOCK_N": "constexpr", "PAGED": "constexpr",
           "DOT_BF16": "constexpr", "DK": "constexpr", "EMIT_KEYS": "constexpr"}
    out = {}
    for paged in (True, False):
        for keys in (True, False):
            consts = {"H": 64, "D": 128, "BLOCK_N": 64, "PAGED": paged, "DOT_BF16": True,
                      "DK": 32, "EMIT_KEYS": keys}
            s = dict(sig, out_ptr="*i64" if keys else "*fp32")
            out[f"indexer_{'keys' if keys else 'logits'}_{'paged' if paged else 'flat'}"] = (
                ASTSource(fn=_mqa_logits_kernel, signature=s, constexprs=consts), 8)
    return out


__all__ = ["mqa_logits_tile", "aot_sources"]
_ = torch
