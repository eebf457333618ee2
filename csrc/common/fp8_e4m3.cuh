// Exact OCP FP8 E4M3 ("e4m3fn") codecs for SM80/SM86, by bit manipulation only.
//
// The FP8 conversion instructions (cvt.*.e4m3x2) need SM89; these helpers use integer and
// fp32/fp16 arithmetic only, so they compile for every architecture and give the same bits
// everywhere:
//
//   e4m3_to_float(byte)           exact decode (all 256 codes; 0x7F/0xFF -> NaN).
//   float_to_e4m3_satfinite(x)    round-to-nearest-even, saturate to +-448, exact
//                                 subnormals, NaN -> 0x7F, -0 -> 0x80; bit-identical to
//                                 __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
//                                 (= cvt.rn.satfinite.e4m3x2.f32 on SM89+).
//   e4m3x4_to_bf16x4_scaled(...)  fast decode of four codes straight to bf16 with a UE8M0
//                                 block scale folded in (see its comment for the exact range).
//   e4m3x4_to_bf16x4_bf16mul(...) the same with one bf16x2 multiply, for scale bytes 10..134.
//   e4m3x8_to_bf16x8_bf16mul2(codes, s) eight codes with two bf16x2 multiplies per pair,
//                                 for scale bytes 10..246 (the gather's first choice);
//                                 e4m3_nan_fold / e4m3_nan_any test words for NaN codes.
//   e4m3x8_with(codes, route)     eight codes (one 64-bit chunk) through a four-code route
//                                 -> one uint4 of bf16; e4m3x8_to_bf16x8_bf16mul(codes, s).
//   e4m3x2_lo/hi_to_f16x2_m8(w)  codes 0,1 / 2,3 of a word as fp16x2 times 2^-8, exact, no
//                                 multiply (MMA operands; NaN codes become finite: test them
//                                 with e4m3_nan_fold).
//
// Needs only the CUDA headers (no torch); kernels of every family include it.
#pragma once

#include <cstdint>
#include <cstring>
#include <cmath>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace deepinfer_sm80 {

// Bit casts usable on host and device, so the scalar codecs can also be checked on a CPU
// (tests/test_build_check.py compiles them for the host against cuda_fp8.hpp).
__host__ __device__ __forceinline__ float bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}
__host__ __device__ __forceinline__ uint32_t float_to_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}
// Round to nearest even, |x| < 2^31 (default FP rounding mode on the host).
__host__ __device__ __forceinline__ uint32_t float_to_uint_rne(float x) {
#ifdef __CUDA_ARCH__
  return __float2uint_rn(x);
#else
  return static_cast<uint32_t>(std::nearbyint(x));
#endif
}

// Largest finite E4M3 magnitude and its code.
constexpr float kE4m3Max = 448.0f;
constexpr uint32_t kE4m3MaxCode = 0x7Eu;
constexpr uint32_t kE4m3NanCode = 0x7Fu;

// Exact decode of one E4M3 code (low 8 bits of `byte`).
//   normal    (E != 0): (-1)^s * 2^(E-7) * (1 + M/8)  -> fp32 exponent field E + 120
//   subnormal (E == 0): (-1)^s * M * 2^-9             -> exact via an int->float of M
//   S.1111.111        : NaN (quiet, sign kept)
__host__ __device__ __forceinline__ float e4m3_to_float(uint32_t byte) {
  const uint32_t sign = (byte & 0x80u) << 24;
  const uint32_t em = byte & 0x7Fu;
  float mag;
  if (em >= 0x08u) {
    mag = bits_to_float((em << 20) + (120u << 23));
  } else {
    mag = static_cast<float>(em) * 0x1p-9f;  // exact: em < 8, times a power of two
  }
  uint32_t bits = float_to_bits(mag);
  bits = (em == kE4m3NanCode) ? 0x7FC00000u : bits;
  return bits_to_float(bits | sign);
}

// Round-to-nearest-even, saturating encode (bit-identical to the CUDA intrinsic above):
//   NaN                 -> 0x7F (sign dropped, like the intrinsic's canonical NaN)
//   |x| > 464 (incl inf)-> 0x7E | sign   (464 = 448 + half an ulp ties to even = 448)
//   |x| <  2^-6         -> RNE of |x| * 2^9 to an integer 0..8 (8 = smallest normal 0x08)
//   otherwise           -> RNE of the fp32 mantissa to 3 bits; a carry bumps the exponent
__host__ __device__ __forceinline__ uint8_t float_to_e4m3_satfinite(float x) {
  const uint32_t bits = float_to_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(kE4m3NanCode);
  if (a > 0x43E80000u) return static_cast<uint8_t>(sign | kE4m3MaxCode);  // > 464.0f
  uint32_t code;
  if (a < 0x3C800000u) {  // < 2^-6: E4M3 subnormal range (or zero)
    // |x| * 512 is exact (power-of-two scale up); float_to_uint_rne rounds to nearest even.
    code = float_to_uint_rne(bits_to_float(a) * 512.0f);
  } else {
    // Keep exponent + top 3 mantissa bits; add just under half an ulp plus the kept lsb
    // so that the truncation below rounds to nearest even.
    const uint32_t rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
    code = (rounded >> 20) - (120u << 3);
  }
  return static_cast<uint8_t>(code | sign);
}

// Four E4M3 codes -> four bf16 values multiplied by a UE8M0 scale 2^(s-127), exactly as
// "decode to fp32, multiply by the fp32 scale, round to bf16 (RNE)" would give them.
//
//   four_bytes  codes c0 (bits 0-7) .. c3 (bits 24-31); lo = {c0, c1}, hi = {c2, c3}
//   mult        e4m3_fast_multiplier(s) (compute once per 64-value group)
//
// How: a code's sign/exponent/mantissa bits are moved into an fp16 bit pattern
// (s.0EEEE.MMM0000000) whose value is v * 2^-8 (subnormal codes land on fp16 subnormals,
// which the hardware handles exactly); fp16 -> fp32 is exact; one fp32 multiply by
// 2^(s-119) = 2^8 * 2^(s-127) is exact because v has 4 significant bits and the product
// stays >= 2^-135 (fp32 resolves 2^-149); the final fp32 -> bf16 conversion rounds RNE,
// which only matters if the product is a bf16 subnormal (s < 10) -- the same rounding the
// fp32 reference does. So the result is bit-identical to the reference for
//   1 <= s <= 246  (e4m3_fast_scale_ok(s)),  and every code except NaN (0x7F/0xFF).
// Outside that range (s = 0 decodes to scale 0 by ue8m0_to_float; s >= 247 needs a
// multiplier above 2^127) and for NaN codes (e4m3x4_has_nan), use e4m3_to_float() times
// ue8m0_to_float() instead. The KV writers produce s in [105, 247]; s = 247 only for a
// group with absmax > 1.75 * 2^127 (~3.0e38, the top of the bf16 range), and there the
// fallback keeps the result exact.
__device__ __forceinline__ bool e4m3_fast_scale_ok(uint32_t s) { return s - 1u < 246u; }

__device__ __forceinline__ float e4m3_fast_multiplier(uint32_t s) {
  return __uint_as_float((s + 8u) << 23);  // 2^(s + 8 - 127)
}

// True if any of the four codes is a NaN code (S.1111.111).
__device__ __forceinline__ bool e4m3x4_has_nan(uint32_t four_bytes) {
  const uint32_t t = (four_bytes & 0x7F7F7F7Fu) ^ 0x7F7F7F7Fu;  // byte == 0 <=> NaN code
  return ((t - 0x01010101u) & ~t & 0x80808080u) != 0u;
}

__device__ __forceinline__ __nv_bfloat162 e4m3x2_in_halves_to_bf16x2(uint32_t lanes,
                                                                      float mult) {
  // `lanes` holds one code in the high byte of each 16-bit half (c << 8).
  const uint32_t h = (lanes & 0x80008000u) | ((lanes >> 1) & 0x3F803F80u);
  __half2 hv;
  *reinterpret_cast<uint32_t*>(&hv) = h;
  const float2 f = __half22float2(hv);
  return __floats2bfloat162_rn(f.x * mult, f.y * mult);
}

__device__ __forceinline__ void e4m3x4_to_bf16x4_scaled(uint32_t four_bytes, float mult,
                                                        __nv_bfloat162& lo,
                                                        __nv_bfloat162& hi) {
  // prmt: bytes {0, c0, 0, c1} and {0, c2, 0, c3} (selector nibble 4 = a zero byte).
  lo = e4m3x2_in_halves_to_bf16x2(__byte_perm(four_bytes, 0u, 0x1404u), mult);
  hi = e4m3x2_in_halves_to_bf16x2(__byte_perm(four_bytes, 0u, 0x3424u), mult);
}

// Bf16-arithmetic decode, for UE8M0 bytes 10 <= s <= 134 and non-NaN codes. A code's bits
// placed in the bf16 layout (sign to bit 15, the 7 magnitude bits to bits 4..10) are the
// code's value times 2^-120, e4m3 subnormals becoming bf16 subnormals; one bf16x2 multiply
// by 2^(s - 7) (a normal bf16 for s <= 134) applies the rebias and the scale. Every product
// value * 2^(s-127) has at most 4 significant bits and, for s >= 10, is a normal bf16 (the
// smallest, 2^-9 * 2^(s-127), is >= 2^-126), so the multiply is exact: the same bits as
// "fp32 decode * 2^(s-127), RNE to bf16", zeros keeping their sign (x * 2^k for x = -0 is
// -0). Half the instructions of the fp16/fp32 route above. The bits are placed by one prmt
// that sign-extends each code into its 16-bit half, one shift and one mask (since
// 2026-11-30; two shifts and two masks before: same bits, the GPU test compares all code x
// scale pairs; decode 2-3% faster on the H200, the gather unchanged).
__device__ __forceinline__ bool e4m3_bf16mul_scale_ok(uint32_t s) { return s - 10u <= 124u; }

__device__ __forceinline__ __nv_bfloat162 e4m3_bf16mul_multiplier(uint32_t s) {
  const uint32_t b = (s + 120u) << 7;  // bf16 bits of 2^(s - 7): exponent field s - 7 + 127
  const uint32_t bb = b | (b << 16);
  __nv_bfloat162 m;
  memcpy(&m, &bb, 4);
  return m;
}

// prmt.b32 with sign replication: a selector nibble with its top bit set yields 0xFF or 0x00,
// the sign of the byte it selects (PTX ISA, prmt, default mode).
__device__ __forceinline__ uint32_t prmt_sext(uint32_t a, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(d) : "r"(a), "r"(selector));
  return d;
}

__device__ __forceinline__ __nv_bfloat162 e4m3x2_sext_to_bf16x2_bf16mul(uint32_t h, __nv_bfloat162 mult) {
  // `h` holds one code sign-extended to 16 bits in each half (s..s s eeee mmm); shifted left
  // by 4, bit 15 is the sign and bits 10..4 the magnitude: s 0000 eeee mmm 0000 (the bits
  // shifted from the low half into the high one fall outside the mask)
  const uint32_t bits = (h << 4) & 0x87F087F0u;
  __nv_bfloat162 v;
  memcpy(&v, &bits, 4);
  return __hmul2(v, mult);
}

__device__ __forceinline__ void e4m3x4_to_bf16x4_bf16mul(uint32_t four_bytes, __nv_bfloat162 mult,
                                                         __nv_bfloat162& lo, __nv_bfloat162& hi) {
  // prmt: halves {c0, c1} and {c2, c3}, each code sign-extended (selector nibbles 8 + byte)
  lo = e4m3x2_sext_to_bf16x2_bf16mul(prmt_sext(four_bytes, 0x9180u), mult);
  hi = e4m3x2_sext_to_bf16x2_bf16mul(prmt_sext(four_bytes, 0xB3A2u), mult);
}

// Bf16-arithmetic decode for UE8M0 bytes 10 <= s <= 246 and non-NaN codes: two bf16x2
// multiplies instead of one. The code's bits in the bf16 layout (v * 2^-120, as above) times
// 2^120 give v itself, exactly (v >= 2^-9 is a normal bf16); times 2^(s-127) (a normal bf16
// for 1 <= s <= 254) give v * 2^(s-127), exactly for 10 <= s <= 246: at most 4 significant
// bits, the smallest product 2^-9 * 2^-117 = 2^-126 is normal, the largest
// 448 * 2^119 = 1.75 * 2^127 below the bf16 maximum. So it covers every scale byte the KV
// writers produce below 247 (the one-multiply route stops at 134), zeros keeping their sign.
__device__ __forceinline__ bool e4m3_bf16mul2_scale_ok(uint32_t s) { return s - 10u <= 236u; }

__device__ __forceinline__ __nv_bfloat162 bf16x2_from_bits(uint32_t b) {
  __nv_bfloat162 v;
  memcpy(&v, &b, 4);
  return v;
}

// bf16 bits of 2^(s - 127) in both halves (1 <= s <= 254)
__device__ __forceinline__ __nv_bfloat162 ue8m0_to_bf16x2(uint32_t s) {
  return bf16x2_from_bits((s << 7) | (s << 23));
}

__device__ __forceinline__ __nv_bfloat162 e4m3x2_sext_to_bf16x2_bf16mul2(uint32_t h,
                                                                         __nv_bfloat162 mult) {
  const __nv_bfloat162 k2p120 = bf16x2_from_bits(0x7B807B80u);  // 2^120 in both halves
  const __nv_bfloat162 v = bf16x2_from_bits((h << 4) & 0x87F087F0u);
  return __hmul2(__hmul2(v, k2p120), mult);
}

// Four codes (one 32-bit word) through the two-multiply route; mult = ue8m0_to_bf16x2(s).
__device__ __forceinline__ void e4m3x4_to_bf16x4_bf16mul2(uint32_t four_bytes, __nv_bfloat162 mult,
                                                          __nv_bfloat162& lo, __nv_bfloat162& hi) {
  lo = e4m3x2_sext_to_bf16x2_bf16mul2(prmt_sext(four_bytes, 0x9180u), mult);
  hi = e4m3x2_sext_to_bf16x2_bf16mul2(prmt_sext(four_bytes, 0xB3A2u), mult);
}

// Codes 0,1 (lo) and 2,3 (hi) of a word as fp16x2, each the code's value times 2^-8, exactly:
// fp16 has one more exponent bit and seven more mantissa bits than e4m3, so the code's sign
// at bit 15 and its 7 magnitude bits at bits 13..7 are that value, subnormals included. The
// prmt sign-extends each code into a 16-bit half (s..s s eeee mmm); shifted left by 7, bit 15
// is the sign and bits 13..7 the magnitude; bit 14 (a sign copy) and the low half's bits that
// crossed into the high half are masked off. A NaN code (0x7F / 0xFF) becomes +-1.875 * 2^0:
// callers that must see NaN test the words with e4m3_nan_fold.
__device__ __forceinline__ uint32_t e4m3x2_lo_to_f16x2_m8(uint32_t w) {
  return (prmt_sext(w, 0x9180u) << 7) & 0xBF80BF80u;
}
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2_m8(uint32_t w) {
  return (prmt_sext(w, 0xB3A2u) << 7) & 0xBF80BF80u;
}

// True if any of the codes of the words folded in by e4m3_nan_fold is a NaN code: a byte's
// low 7 bits plus one carry into its bit 7 only for 0x7F (no carry leaves the byte). The
// foldable form tests several words with one final test (the gather's decode_entry);
// e4m3x4_has_nan stays as it is for decode8: rewritten on top of this fold it made ptxas
// spill 12 bytes in the gather's loop-free tile kernel on sm_80 (2026-11-30).
__device__ __forceinline__ uint32_t e4m3_nan_fold(uint32_t acc, uint32_t four_bytes) {
  return acc | ((four_bytes & 0x7F7F7F7Fu) + 0x01010101u);
}
__device__ __forceinline__ bool e4m3_nan_any(uint32_t acc) { return (acc & 0x80808080u) != 0u; }

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// Eight codes through a four-code route `dec(word, lo, hi)` -> one uint4 of bf16.
template <class Decode4>
__device__ __forceinline__ uint4 e4m3x8_with(uint2 codes, Decode4 dec) {
  __nv_bfloat162 a, b, c, d;
  dec(codes.x, a, b);
  dec(codes.y, c, d);
  return make_uint4(bf16x2_bits(a), bf16x2_bits(b), bf16x2_bits(c), bf16x2_bits(d));
}

// Eight codes of a group with UE8M0 byte s (10..134) through the bf16x2 route.
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8_bf16mul(uint2 codes, uint32_t s) {
  const __nv_bfloat162 mult = e4m3_bf16mul_multiplier(s);
  return e4m3x8_with(codes, [&](uint32_t w, __nv_bfloat162& lo, __nv_bfloat162& hi) {
    e4m3x4_to_bf16x4_bf16mul(w, mult, lo, hi);
  });
}

// Eight codes of a group with UE8M0 byte s (10..246) through the two-multiply bf16x2 route.
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8_bf16mul2(uint2 codes, uint32_t s) {
  const __nv_bfloat162 mult = ue8m0_to_bf16x2(s);
  return e4m3x8_with(codes, [&](uint32_t w, __nv_bfloat162& lo, __nv_bfloat162& hi) {
    e4m3x4_to_bf16x4_bf16mul2(w, mult, lo, hi);
  });
}

}  // namespace deepinfer_sm80
