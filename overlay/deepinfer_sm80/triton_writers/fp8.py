"""Software FP8 (e4m3fn) and UE8M0 helpers for Triton kernels on SM80/SM86.

Triton cannot emit ``tl.float8e4nv`` below SM89, so the writers keep FP8 as
uint8 at every kernel boundary and encode with integer arithmetic here.

Encoder contract (identical to ``cvt.rn.satfinite.e4m3x2.f32`` and to
``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)``): round to nearest
even, saturate finite values to +-448, subnormals exact (smallest 2^-9), the
sign of zero kept, NaN -> 0x7F.

UE8M0: the CuTe DSL writer's integer exponent, ``(bits + 0x7FFFFF) >> 23`` of
the fp32 scale, i.e. ceil(log2(scale)) + 127 with no approximate log2.
"""

import triton
import triton.language as tl


@triton.jit
def e4m3_encode(x):
    """fp32 tensor -> uint8 e4m3fn codes (RNE, satfinite)."""
    bits = x.to(tl.uint32, bitcast=True)
    sign = (bits >> 31).to(tl.uint32)
    mag_bits = bits & 0x7FFFFFFF
    a = mag_bits.to(tl.float32, bitcast=True)
    # Normal range (a >= 2^-6): round the 23-bit mantissa to 3 bits, RNE, on
    # the integer bit pattern; a carry moves into the exponent by itself.
    lsb = (mag_bits >> 20) & 1
    rounded = (mag_bits + 0x7FFFF + lsb) >> 20
    # fp32 exponent bias 127 vs e4m3 bias 7: subtract (120 << 3).
    normal = rounded.to(tl.int32) - (120 << 3)
    # Subnormal range (a < 2^-6): code = round_half_even(a * 2^9). a * 512 is
    # exact; adding and subtracting 1.5 * 2^23 rounds to an integer, RNE.
    sub_f = (a * 512.0 + 12582912.0) - 12582912.0
    sub = sub_f.to(tl.int32)
    code = tl.where(a < 0.015625, sub, normal)
    code = tl.minimum(code, 0x7E)  # satfinite (also catches +inf)
    code = tl.where(a != a, 0x7F, code)  # NaN
    code = code.to(tl.uint32) | (sign << 7)
    return code.to(tl.uint8)


@triton.jit
def e4m3_decode(c):
    """uint8 e4m3fn codes -> exact fp32 values (0x7F/0xFF -> NaN)."""
    c32 = c.to(tl.uint32)
    sign = (c32 >> 7) << 31
    e = (c32 >> 3) & 0xF
    m = c32 & 0x7
    normal_bits = ((e + 120) << 23) | (m << 20)
    sub_val = m.to(tl.float32) * 0.001953125  # m * 2^-9, exact
    mag = tl.where(e == 0, sub_val, normal_bits.to(tl.float32, bitcast=True))
    mag = tl.where((c32 & 0x7F) == 0x7F, float("nan"), mag)
    return (mag.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def ue8m0_from_scale(scale_raw):
    """fp32 scale (> 0) -> (ue8m0 exponent byte as int32, exact 1/2^(e-127))."""
    bits = scale_raw.to(tl.uint32, bitcast=True)
    ue = ((bits + 0x7FFFFF) >> 23) & 0xFF
    inv_scale = ((254 - ue) << 23).to(tl.float32, bitcast=True)
    return ue.to(tl.int32), inv_scale


@triton.jit
def ue8m0_to_scale(ue):
    """ue8m0 byte (int) -> fp32 2^(ue-127) (ue >= 1)."""
    return (ue.to(tl.uint32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def bf16_rne(x):
    """fp32 -> nearest bf16 value (RNE, as ``cvt.rn.bf16.f32``), kept in fp32.

    Done on the bit pattern so the result does not depend on how a backend
    (or Triton's CPU interpreter, which truncates) lowers ``.to(bfloat16)``;
    the later ``.to(tl.bfloat16)`` of the result is then exact."""
    bits = x.to(tl.uint32, bitcast=True)
    lsb = (bits >> 16) & 1
    r = ((bits + 0x7FFF + lsb) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r)
