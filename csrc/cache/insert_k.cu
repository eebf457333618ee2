// quantize_and_insert_k_cache for SM80+: bf16 K rows -> V4 584-byte fp8_ds_mla records.
//
// One warp per token. Lane L owns values [16L, 16L + 16): lanes 0..27 are the 448 NoPE
// values (4 lanes per 64-value UE8M0 group, reduced with two xor-shuffles), lanes 28..31
// copy the 64 RoPE values. Quantisation matches the SWA `_C` writer bit for bit (see
// common/ue8m0.cuh): absmax floored at 1e-4, power-of-two scale from integer ops,
// x * 2^-e clamped with fmaxf/fminf (NaN -> -448, as in the `_C` op), RNE e4m3.
#include <cuda_runtime.h>

#include "cache/cache_kernels.h"
#include "common/fp8_e4m3.cuh"
#include "common/kv_record.cuh"
#include "common/ue8m0.cuh"
#include "common/vec.cuh"

namespace deepinfer_sm80 {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

__device__ __forceinline__ float bf16_bits_to_float(uint32_t b16) {
  return __uint_as_float(b16 << 16);
}

__global__ void __launch_bounds__(kThreads)
insert_k_kernel(const InsertKParams p) {
  using namespace kv_record;
  const int lane = threadIdx.x & 31;
  const int warps_total = gridDim.x * kWarpsPerBlock;
  const int64_t slot_limit = p.num_blocks * static_cast<int64_t>(p.block_size);

  for (int t = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5); t < p.num_tokens;
       t += warps_total) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0 || slot >= slot_limit) continue;  // warp-uniform
    const int64_t block_id = slot / p.block_size;
    const int pos = static_cast<int>(slot - block_id * p.block_size);
    uint8_t* base = kv_record::block_base(p.cache, block_id, p.block_stride);
    uint8_t* entry = base + data_offset(pos);

    const uint16_t* row = p.k + static_cast<int64_t>(t) * p.k_row_stride + lane * 16;
    const uint4 v0 = ld_nc_v4(row);
    const uint4 v1 = ld_nc_v4(row + 8);

    if (lane >= kNopeDim / 16) {
      // RoPE lanes: raw copy of 16 bf16 values (32 bytes).
      uint8_t* dst = entry + kRopeOffset + (lane - kNopeDim / 16) * 32;
      st_v4(dst, v0);
      st_v4(dst + 16, v1);
    }

    const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    float x[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[2 * j] = bf16_bits_to_float(w[j] & 0xFFFFu);
      x[2 * j + 1] = bf16_bits_to_float(w[j] >> 16);
    }
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(x[j]));
    // Group of 4 lanes (all 32 lanes participate; RoPE lanes' result is unused).
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
    const Ue8m0Scale sc = ue8m0_encode_absmax(amax);

    if (lane < kNopeDim / 16) {
      uint32_t q[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t packed = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          float s = x[4 * j + b] * sc.inv_scale;
          s = fminf(fmaxf(s, -kE4m3Max), kE4m3Max);
          packed |= static_cast<uint32_t>(float_to_e4m3_satfinite(s)) << (8 * b);
        }
        q[j] = packed;
      }
      st_v4(entry + lane * 16, make_uint4(q[0], q[1], q[2], q[3]));
    }

    // Lane 4g holds group g's scale byte; lane 0 writes the 7 bytes plus the zero pad.
    uint32_t s_lo = 0, s_hi = 0;
#pragma unroll
    for (int g = 0; g < kNumGroups; ++g) {
      const uint32_t b = __shfl_sync(0xFFFFFFFFu, sc.byte, 4 * g);
      if (g < 4) {
        s_lo |= b << (8 * g);
      } else {
        s_hi |= b << (8 * (g - 4));
      }
    }
    if (lane == 0) st_v2(base + scale_offset(p.block_size, pos), make_uint2(s_lo, s_hi));
  }
}

}  // namespace

void launch_insert_k(const InsertKParams& p, const DeviceLimits& lim, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  const int blocks = lim.grid_blocks(p.num_tokens, kWarpsPerBlock, 8);
  insert_k_kernel<<<blocks, kThreads, 0, stream>>>(p);
}

}  // namespace deepinfer_sm80
