// SPDX-License-Identifier: Apache-2.0
// mHC pre block's projection on SM80/SM86 tensor cores (see mhc_kernels.h for the contract).
//
// Why: vLLM's TileLang fallback below SM90 (`hc_prenorm_gemm_block_m_tilelang`, 2 tokens a
// block, fp32 FMA) re-reads all of fn (24 x K fp32, 1.5 MB at hidden 4096) from L2 for every
// 2 tokens: 6.4 GB of L2 reads at 8,192 tokens, which is where the pre block's 1.1 ms went on
// an H100 running it as SM80 code (docs/mhc.md). Here a block takes 64 tokens, so fn is read
// once per 64 tokens, and x (the only large input) streams through shared memory once.
//
// Block: 4 warps, 64 tokens x one K-split; per stage a [64 x 64] bf16 tile of x and a
// [24 x 64] fp32 tile of fn (cp.async, 3 stages, rows padded so that ldmatrix (x) and the
// float2 reads (fn) are free of bank conflicts). Warp w owns tokens 16w..16w+15: A fragments by
// ldmatrix.x4, B fragments built from the fp32 tile as hi/lo bf16 pairs, 2 mma per (n-tile,
// k16). sqrsum comes from the same A fragments. Rows past T are zero-filled and not written.
#include <cuda_bf16.h>

#include <cstdint>

#include "attention/detail/sm80_ptx.cuh"
#include "mhc/mhc_kernels.h"

namespace deepinfer_sm80 {
namespace mhc {
namespace {

namespace ptx = deepinfer_sm80::attention::ptx;

constexpr int kWarps = kPrenormBM / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
constexpr int kNTiles = kPrenormN / 8;
constexpr int kXStride = kPrenormBK + 8;  // bf16 per smem row of x: 144 B, ldmatrix conflict-free
constexpr int kFStride = kPrenormBK + 8;  // fp32 per smem row of fn: 288 B, float2 reads conflict-free
constexpr int kXStage = kPrenormBM * kXStride;  // bf16 elements
constexpr int kFStage = kPrenormN * kFStride;   // fp32 elements
constexpr int kSmemBytes = kStages * (kXStage * 2 + kFStage * 4);
constexpr int kXChunks = kPrenormBM * kPrenormBK * 2 / 16 / kThreads;  // 16-B copies a thread
constexpr int kFChunks = kPrenormN * kPrenormBK * 4 / 16 / kThreads;
static_assert(kPrenormBM * kPrenormBK * 2 % (16 * kThreads) == 0, "x tile copy");
static_assert(kPrenormN * kPrenormBK * 4 % (16 * kThreads) == 0, "fn tile copy");
static_assert(kPrenormN % 8 == 0 && kPrenormBK % 16 == 0, "mma tiles");

// (hi, lo) bf16 pairs of two fp32 values: hi = bf16(v), lo = bf16(v - hi). v - hi is exact.
__device__ __forceinline__ void split_bf16x2(float2 v, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(v.x - hf.x, v.y - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

__device__ __forceinline__ float sq_bf16x2(uint32_t v) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  return f.x * f.x + f.y * f.y;
}

__global__ void __launch_bounds__(kThreads)
hc_prenorm_gemm_kernel(const PrenormGemmParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* sx = reinterpret_cast<__nv_bfloat16*>(smem);
  float* sf = reinterpret_cast<float*>(smem + kStages * kXStage * 2);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m0 = blockIdx.x * kPrenormBM;
  const int split = blockIdx.y;
  // split s takes K tiles [s * tiles / n_splits, (s + 1) * tiles / n_splits): any n_splits up
  // to the tile count, as vLLM's compute_num_split picks them for DeepGEMM's GEMM
  const int tiles = p.k / kPrenormBK;
  const int tile_begin = static_cast<int>(static_cast<int64_t>(split) * tiles / p.n_splits);
  const int tile_end = static_cast<int>(static_cast<int64_t>(split + 1) * tiles / p.n_splits);
  const int k_begin = tile_begin * kPrenormBK;
  const int num_k_tiles = tile_end - tile_begin;
  const auto* x = static_cast<const __nv_bfloat16*>(p.x);

  auto load_stage = [&](int slot, int kt) {
    const int k0 = k_begin + kt * kPrenormBK;
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int c = tid + i * kThreads;
      const int row = c / (kPrenormBK / 8), col = (c % (kPrenormBK / 8)) * 8;
      const int t = m0 + row;
      const bool live = t < p.num_tokens;
      const __nv_bfloat16* src = x + (live ? static_cast<int64_t>(t) * p.x_stride : 0) + k0 + col;
      ptx::cp_async_16(ptx::smem_u32(sx + slot * kXStage + row * kXStride + col), src,
                       live ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kFChunks; ++i) {
      const int c = tid + i * kThreads;
      const int row = c / (kPrenormBK / 4), col = (c % (kPrenormBK / 4)) * 4;
      ptx::cp_async_16(ptx::smem_u32(sf + slot * kFStage + row * kFStride + col),
                       p.fn + static_cast<int64_t>(row) * p.k + k0 + col, 16);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_k_tiles) load_stage(s, s);
    ptx::cp_async_commit();
  }

  // mma.sync's fp32 accumulation is not round-to-nearest (it truncates on A100-class parts,
  // Fasi et al. 2021), so a chain of K / 16 x 2 mma steps into one accumulator drifts (a
  // model of it gave 5e-5 - 9e-5 relative at K = 16384 - 28672): each 64-column tile goes
  // into a fresh accumulator of 8 mma steps, added to the running sum with an ordinary fp32 add
  float acc[kNTiles][4] = {};
  float sq[2] = {0.f, 0.f};  // rows g and g + 8 of this warp
  const int g = lane >> 2, t4 = lane & 3;

  for (int kt = 0; kt < num_k_tiles; ++kt) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; slot (kt - 1) % kStages is free
    {
      const int next = kt + kStages - 1;
      if (next < num_k_tiles) load_stage(next % kStages, next);
      ptx::cp_async_commit();
    }
    const __nv_bfloat16* xs = sx + (kt % kStages) * kXStage + (warp * 16) * kXStride;
    const float* fs = sf + (kt % kStages) * kFStage;
    float part[kNTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kPrenormBK / 16; ++kk) {
      uint32_t a[4];
      ptx::ldmatrix_x4(ptx::smem_u32(xs + (lane & 15) * kXStride + kk * 16 + (lane >> 4) * 8),
                       a[0], a[1], a[2], a[3]);
      sq[0] += sq_bf16x2(a[0]) + sq_bf16x2(a[2]);
      sq[1] += sq_bf16x2(a[1]) + sq_bf16x2(a[3]);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const float* f = fs + (j * 8 + g) * kFStride + kk * 16 + 2 * t4;
        uint32_t hi0, lo0, hi1, lo1;
        split_bf16x2(*reinterpret_cast<const float2*>(f), hi0, lo0);
        split_bf16x2(*reinterpret_cast<const float2*>(f + 8), hi1, lo1);
        ptx::mma_bf16_16816(part[j], a, hi0, hi1);
        ptx::mma_bf16_16816(part[j], a, lo0, lo1);
      }
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] += part[j][e];
    }
  }
  ptx::cp_async_wait<0>();

  // sqrsum: the 4 lanes of a row group hold disjoint k's of rows g and g + 8
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sq[r] += __shfl_xor_sync(0xffffffffu, sq[r], 1);
    sq[r] += __shfl_xor_sync(0xffffffffu, sq[r], 2);
  }
  const int row0 = m0 + warp * 16 + g;
  float* out = p.out + static_cast<int64_t>(split) * p.num_tokens * kPrenormN;
  float* sqrsum = p.sqrsum + static_cast<int64_t>(split) * p.num_tokens;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + r * 8;
    if (t >= p.num_tokens) continue;
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      *reinterpret_cast<float2*>(out + static_cast<int64_t>(t) * kPrenormN + j * 8 + 2 * t4) =
          make_float2(acc[j][2 * r], acc[j][2 * r + 1]);
    }
    if (t4 == 0) sqrsum[t] = sq[r];
  }
}

}  // namespace

void launch_prenorm_gemm(const PrenormGemmParams& p, const DeviceLimits& lim,
                         cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  (void)lim;  // 47 KB a block: within every 8.x part's limit without opting in
  const dim3 grid((p.num_tokens + kPrenormBM - 1) / kPrenormBM, p.n_splits);
  hc_prenorm_gemm_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
}

}  // namespace mhc
}  // namespace deepinfer_sm80
