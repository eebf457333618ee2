"""Triton inverse GPT-J RoPE for the SM80 output projection: one kernel
reads the live heads of the (head-padded) attention output and writes the
rotated bf16 rows contiguously for the grouped ``wo_a`` bmm (no FP8)."""

import triton
import triton.language as tl

from deepinfer_sm80.triton_writers.fp8 import bf16_rne


@triton.jit
def inverse_rope_kernel(o_ptr, o_s0, o_s1, pos_ptr, cs_ptr, cs_s0, out_ptr, out_s0, H,
                        D: tl.constexpr, NOPE: tl.constexpr, HALF: tl.constexpr):
    """Program (token t, head h): NoPE dims copied, the last 2*HALF dims
    rotated back: even' = e*cos + o*sin, odd' = o*cos - e*sin (fp32, RNE)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    src = o_ptr + t.to(tl.int64) * o_s0 + h * o_s1
    dst = out_ptr + t.to(tl.int64) * out_s0 + h * D
    n = tl.arange(0, D)
    tl.store(dst + n, tl.load(src + n, mask=n < NOPE), mask=n < NOPE)
    j = tl.arange(0, HALF)
    pos = tl.load(pos_ptr + t)
    cos = tl.load(cs_ptr + pos * cs_s0 + j).to(tl.float32)
    sin = tl.load(cs_ptr + pos * cs_s0 + HALF + j).to(tl.float32)
    e = tl.load(src + NOPE + 2 * j).to(tl.float32)
    d = tl.load(src + NOPE + 2 * j + 1).to(tl.float32)
    tl.store(dst + NOPE + 2 * j, bf16_rne(e * cos + d * sin).to(tl.bfloat16))
    tl.store(dst + NOPE + 2 * j + 1, bf16_rne(d * cos - e * sin).to(tl.bfloat16))
