// SPDX-License-Identifier: Apache-2.0
// Sink-aware merge of the split partials of the sparse MLA kernel:
//   M = max_s m_s,  w_s = 2^(m_s - M),  L = sum_s w_s l_s
//   out = sum_s w_s O_s / (L + 2^(sink*log2e - M)),  lse = ln2 * (M + log2 L)
// A token-head with no key at all (L == 0) gets out = 0 and lse = +inf. At most 64 splits.
#include <cuda_bf16.h>

#include "params.h"

namespace deepinfer_sm80::attention {
namespace {

constexpr float kLog2eC = 1.4426950408889634f;
constexpr float kLn2C = 0.6931471805599453f;
constexpr int kCombineThreads = 64;  // 8 dims each

__global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine_kernel(const SparseMlaParams p) {
  constexpr int kMaxSplits = 64;
  __shared__ float s_w[kMaxSplits];
  const int h = blockIdx.x % p.num_heads;
  const int tok = blockIdx.x / p.num_heads;
  const int S = p.num_splits, H = p.num_heads;
  const float* ml = p.part_ml + static_cast<int64_t>(tok) * S * 3 * H;
  // one split per lane of warp 0: max, then weights 2^(m_s - M) * l_s, in parallel
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float m[2], l[2], lx[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int sp = lane + 32 * e;
      const bool ok = sp < S;
      m[e] = ok ? ml[sp * 3 * H + h] : -INFINITY;
      l[e] = ok ? ml[sp * 3 * H + H + h] : 0.f;
      lx[e] = ok ? ml[sp * 3 * H + 2 * H + h] : 0.f;
      if (!(l[e] > 0.f)) m[e] = -INFINITY;
    }
    float M = fmaxf(m[0], m[1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.f, LX = 0.f, w[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      w[e] = l[e] > 0.f ? exp2f(m[e] - M) : 0.f;
      L += w[e] * l[e];
      LX += w[e] * lx[e];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      L += __shfl_xor_sync(0xffffffffu, L, o);
      LX += __shfl_xor_sync(0xffffffffu, LX, o);
    }
    float inv = 0.f;
    if (L > 0.f) {
      float den = L;
      if (p.sink != nullptr) den += exp2f(p.sink[h] * kLog2eC - M);
      inv = 1.f / den;
    }
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (lane + 32 * e < S) s_w[lane + 32 * e] = w[e] * inv;
    if (lane == 0) {
      if (p.lse != nullptr)
        p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] = L > 0.f ? (M + log2f(LX)) * kLn2C : INFINITY;
      if (p.max_logits != nullptr)
        p.max_logits[tok * p.ml_stride_tok + h * p.ml_stride_head] = L > 0.f ? M * kLn2C : -INFINITY;
    }
  }
  __syncthreads();
  const int d0 = threadIdx.x * 8;
  float o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = 0.f;
  const float* src = p.part_o + (static_cast<int64_t>(tok) * S * H + h) * kHeadDim + d0;
#pragma unroll 4
  for (int sp = 0; sp < S; ++sp) {
    const float w = s_w[sp];
    if (w == 0.f) continue;  // empty split: its partial may be anything finite
    const float4 x = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(sp) * H * kHeadDim);
    const float4 y = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(sp) * H * kHeadDim + 4);
    o[0] += w * x.x; o[1] += w * x.y; o[2] += w * x.z; o[3] += w * x.w;
    o[4] += w * y.x; o[5] += w * y.y; o[6] += w * y.z; o[7] += w * y.w;
  }
  __nv_bfloat162 r[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) r[e] = __floats2bfloat162_rn(o[2 * e], o[2 * e + 1]);
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_tok + h * p.out_stride_head + d0;
  *reinterpret_cast<uint4*>(out) = *reinterpret_cast<uint4*>(r);
}

}  // namespace

cudaError_t launch_sparse_mla_combine(const SparseMlaParams& p, cudaStream_t stream) {
  const long long blocks = static_cast<long long>(p.num_tokens) * p.num_heads;
  if (blocks == 0) return cudaSuccess;
  sparse_mla_combine_kernel<<<static_cast<unsigned>(blocks), kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace deepinfer_sm80::attention
