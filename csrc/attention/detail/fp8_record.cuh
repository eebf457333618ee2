// SPDX-License-Identifier: Apache-2.0
// Exact decode of the V4 fp8_ds_mla NoPE bytes: e4m3 code times a UE8M0 group scale,
// rounded to bf16 (the product is a bf16 number, so the rounding is exact whenever the
// result is in bf16's range, which a finite cache entry always is).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "common/fp8_e4m3.cuh"
#include "common/kv_record.cuh"
#include "common/ue8m0.cuh"

namespace deepinfer_sm80::attention::fp8 {

// Value of one e4m3 code as fp32, times 2^-120: the 7 magnitude bits placed in the fp32
// exponent/mantissa fields (a subnormal code becomes an fp32 subnormal), sign on top.
__device__ __forceinline__ float e4m3_bits_times_2m120(uint32_t code) {
  return __uint_as_float(((code & 0x80u) << 24) | ((code & 0x7Fu) << 20));
}

// Four codes (little-endian in w) times scale -> two packed bf16x2 words.
__device__ __forceinline__ void e4m3x4_scaled_to_bf16x4(uint32_t w, float scale,
                                                        uint32_t& lo, uint32_t& hi) {
  // scale * 2^120 in two steps: each product is exact (no double rounding) unless the
  // result itself overflows.
  const float k = 0x1p120f;
  float f0 = e4m3_bits_times_2m120(w & 0xFFu) * k * scale;
  float f1 = e4m3_bits_times_2m120((w >> 8) & 0xFFu) * k * scale;
  float f2 = e4m3_bits_times_2m120((w >> 16) & 0xFFu) * k * scale;
  float f3 = e4m3_bits_times_2m120(w >> 24) * k * scale;
  __nv_bfloat162 a = __floats2bfloat162_rn(f0, f1);
  __nv_bfloat162 b = __floats2bfloat162_rn(f2, f3);
  lo = *reinterpret_cast<uint32_t*>(&a);
  hi = *reinterpret_cast<uint32_t*>(&b);
}

// Fast path: 2^120 * 2^(byte - 127) = 2^(byte - 7) is one normal fp32 number for
// byte <= 134, so a single (exact) multiply applies exponent rebias and scale together.
constexpr uint32_t kOneStepMaxScaleByte = 134;

__device__ __forceinline__ float one_step_factor(uint32_t byte) {
  return __uint_as_float((byte + 120u) << 23);
}

__device__ __forceinline__ void e4m3x4_times_factor_to_bf16x4(uint32_t w, float f, uint32_t& lo,
                                                              uint32_t& hi) {
  float f0 = e4m3_bits_times_2m120(w & 0xFFu) * f;
  float f1 = e4m3_bits_times_2m120((w >> 8) & 0xFFu) * f;
  float f2 = e4m3_bits_times_2m120((w >> 16) & 0xFFu) * f;
  float f3 = e4m3_bits_times_2m120(w >> 24) * f;
  __nv_bfloat162 a = __floats2bfloat162_rn(f0, f1);
  __nv_bfloat162 b = __floats2bfloat162_rn(f2, f3);
  lo = *reinterpret_cast<uint32_t*>(&a);
  hi = *reinterpret_cast<uint32_t*>(&b);
}

// Four codes of one scale group with any UE8M0 byte, exactly, through the fp32 routes: one
// multiply for bytes 1..134, two for byte 0 (scale 0.0: zeros) and above 134. Shared by the
// in-block dequantisation's per-chunk path and the raw-record score path (raw_scores.cuh)
// for bytes outside 10..134.
__device__ __forceinline__ void e4m3x4_exact_to_bf16x4(uint32_t w, uint32_t sb, uint32_t& lo, uint32_t& hi) {
  if (sb - 1u < kOneStepMaxScaleByte) {
    e4m3x4_times_factor_to_bf16x4(w, one_step_factor(sb), lo, hi);
  } else {
    e4m3x4_scaled_to_bf16x4(w, deepinfer_sm80::ue8m0_to_float(sb), lo, hi);  // byte 0: 0.0, as upstream
  }
}

// One thread's share of dequantising a key row (8 threads per row, thread lq): output
// chunks c = lq + 8i of the row, i < 7 the NoPE codes 8c..8c+7 of scale group i (as bf16),
// i == 7 RoPE chunk lq (copied). raw: the row's 576 data bytes; sc: its 8 scale bytes; out:
// the row's swizzled destination of chunk lq (chunk lq + 8i lies i * 128 bytes further).
// A row whose 7 UE8M0 bytes all lie in 10..134 (every realistic cache: scales 2^-117 ..
// 2^7) goes straight-line (all loads, then the conversions, then the stores) through one
// bf16x2 multiply per code pair (common/fp8_e4m3.cuh: exact, so the same bits as the fp32
// routes above, NaN codes included, which decode to 480 * 2^(s-127) on every route); other
// rows chunk by chunk through the fp32 routes.
__device__ __forceinline__ void dequant_row_share(const uint8_t* raw, uint2 sc, int lq,
                                                  uint8_t* out) {
  constexpr int kGroups = kv_record::kNumGroups;
  bool bf16_route = true;
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
    bf16_route &= deepinfer_sm80::e4m3_bf16mul_scale_ok(kv_record::group_scale_byte(sc, g));
  if (bf16_route) {
    uint2 w[kGroups];
#pragma unroll
    for (int i = 0; i < kGroups; ++i) w[i] = *reinterpret_cast<const uint2*>(raw + (lq + 8 * i) * 8);
    const uint4 rope = *reinterpret_cast<const uint4*>(raw + kv_record::kRopeOffset + lq * 16);
#pragma unroll
    for (int i = 0; i < kGroups; ++i)
      *reinterpret_cast<uint4*>(out + i * 128) =
          deepinfer_sm80::e4m3x8_to_bf16x8_bf16mul(w[i], kv_record::group_scale_byte(sc, i));
    *reinterpret_cast<uint4*>(out + kGroups * 128) = rope;
    return;
  }
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    const uint2 w = *reinterpret_cast<const uint2*>(raw + (lq + 8 * i) * 8);
    const uint32_t sb = kv_record::group_scale_byte(sc, i);
    uint4 v;
    e4m3x4_exact_to_bf16x4(w.x, sb, v.x, v.y);
    e4m3x4_exact_to_bf16x4(w.y, sb, v.z, v.w);
    *reinterpret_cast<uint4*>(out + i * 128) = v;
  }
  *reinterpret_cast<uint4*>(out + kGroups * 128) =
      *reinterpret_cast<const uint4*>(raw + kv_record::kRopeOffset + lq * 16);
}

}  // namespace deepinfer_sm80::attention::fp8
