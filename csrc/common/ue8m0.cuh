// UE8M0 block scales: one byte s encodes the power of two 2^(s - 127).
//
// Decode: the fp32 bit pattern of 2^(s-127) is exactly s << 23 for s in [1, 254]; s = 255
// gives +inf (= 2^128 overflowed, as exp2f(128) does). s = 0 gives +0.0, NOT the fp32
// subnormal 2^-127: no upstream writer produces byte 0 (their minimum is 105), and a zero
// scale makes a corrupted/zeroed scale region decode to zeros instead of tiny values.
//
// Encode (ue8m0_encode_absmax): the SWA KV writer of vLLM 0.33.0, i.e. the CUDA `_C` op in
// csrc/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu (and the Triton
// quantize_and_insert_k_cache, which copies it: "Match CUDA: fmaxf(amax, 1e-4)"):
//     absmax   = fmaxf(max_i |x_i|, 1e-4f)        (fmaxf ignores NaN elements)
//     exponent = ceilf(log2f(absmax / 448.0f))
//     byte     = clamp(exponent + 127, 0, 255)
//     inv      = exp2f(-exponent);   q_i = e4m3_satfinite(clamp(x_i * inv, -448, 448))
// We match that writer because quantize_and_insert_k_cache writes the same V4 SWA cache
// (same record, same reader) -- not the CuTeDSL/Triton compressors, which floor the scale
// instead of absmax and differ for blocks with absmax < 0.0448.
//
// The exponent is computed with integer ops instead of log2f: for a finite absmax
// a = (1 + f) * 2^E (f the 23-bit fraction), 448 * 2^e >= a first holds at
//     e = E - 8   if f <= 0.75 (a <= 1.75 * 2^E = 448 * 2^(E-8)),   else  e = E - 7.
// This is the exact ceil(log2(a / 448)); log2f agrees with it for every a the writer can
// see (a >= 1e-4 is normal; a / 448 is within 1 ulp and only lands exactly on a power of
// two when a = 448 * 2^e exactly, where both give e). absmax = +inf gives byte 255 and
// inv = 0, as exp2f(-inf) does in the `_C` op.
#pragma once

#include <cstdint>

#include "fp8_e4m3.cuh"  // bits_to_float / float_to_bits

namespace deepinfer_sm80 {

constexpr float kUe8m0AbsmaxFloor = 1e-4f;

__host__ __device__ __forceinline__ uint32_t ue8m0_bits(uint32_t byte) {
  return (byte & 0xFFu) << 23;
}

__host__ __device__ __forceinline__ float ue8m0_to_float(uint32_t byte) {
  return bits_to_float(ue8m0_bits(byte));
}

struct Ue8m0Scale {
  uint32_t byte;    // stored scale byte
  float inv_scale;  // 2^-exponent, multiply values by this before encoding
};

// `absmax` is max |x| over the block (NaN-free, >= 0), floored here at 1e-4.
__host__ __device__ __forceinline__ Ue8m0Scale ue8m0_encode_absmax(float absmax) {
  const float a = (absmax > kUe8m0AbsmaxFloor ? absmax : kUe8m0AbsmaxFloor);
  const uint32_t bits = float_to_bits(a);
  if (bits >= 0x7F800000u) return Ue8m0Scale{255u, 0.0f};  // +inf (NaN excluded above)
  const int E = static_cast<int>(bits >> 23) - 127;
  const int e = E - 8 + (((bits & 0x7FFFFFu) > 0x600000u) ? 1 : 0);
  // a in [1e-4, 3.4e38] -> e in [-22, 120]: the byte (105..247) needs no clamp and 2^-e
  // is a normal float; the clamp is kept to state the format's range.
  const int byte = e + 127 < 0 ? 0 : (e + 127 > 255 ? 255 : e + 127);
  return Ue8m0Scale{static_cast<uint32_t>(byte),
                    bits_to_float(static_cast<uint32_t>(127 - e) << 23)};
}

}  // namespace deepinfer_sm80
