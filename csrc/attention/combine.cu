// SPDX-License-Identifier: Apache-2.0
// Sink-aware merge of the split partials of the sparse MLA kernel:
//   M = max_s m_s,  w_s = 2^(m_s - M),  L = sum_s w_s l_s
//   out = sum_s w_s O_s / (L + 2^(sink*log2e - M)),  lse = ln2 * (M + log2 L)
// A token-head with no key at all (L == 0) gets out = 0 and lse = +inf.
#include <cuda_bf16.h>

#include "params.h"

namespace deepinfer_sm80::attention {
namespace {

constexpr float kLog2eC = 1.4426950408889634f;
constexpr float kLn2C = 0.6931471805599453f;
constexpr int kCombineThreads = 64;  // 8 dims each

__global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine_kernel(const SparseMlaParams p) {
  const int h = blockIdx.x % p.num_heads;
  const int tok = blockIdx.x / p.num_heads;
  const int S = p.num_splits, H = p.num_heads;
  const float* ml = p.part_ml + static_cast<int64_t>(tok) * S * 2 * H;
  float M = -INFINITY;
  for (int s = 0; s < S; ++s)
    if (ml[s * 2 * H + H + h] > 0.f) M = fmaxf(M, ml[s * 2 * H + h]);
  float L = 0.f;
  for (int s = 0; s < S; ++s) {
    const float l = ml[s * 2 * H + H + h];
    if (l > 0.f) L += l * exp2f(ml[s * 2 * H + h] - M);
  }
  float inv = 0.f;
  if (L > 0.f) {
    float den = L;
    if (p.sink != nullptr) den += exp2f(p.sink[h] * kLog2eC - M);
    inv = 1.f / den;
  }
  const int d0 = threadIdx.x * 8;
  float o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = 0.f;
  if (L > 0.f) {
    for (int s = 0; s < S; ++s) {
      const float l = ml[s * 2 * H + H + h];
      if (!(l > 0.f)) continue;
      const float w = exp2f(ml[s * 2 * H + h] - M) * inv;
      const float* src = p.part_o + ((static_cast<int64_t>(tok) * S + s) * H + h) * kHeadDim + d0;
      const float4 x = *reinterpret_cast<const float4*>(src);
      const float4 y = *reinterpret_cast<const float4*>(src + 4);
      o[0] += w * x.x; o[1] += w * x.y; o[2] += w * x.z; o[3] += w * x.w;
      o[4] += w * y.x; o[5] += w * y.y; o[6] += w * y.z; o[7] += w * y.w;
    }
  }
  __nv_bfloat162 r[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) r[e] = __floats2bfloat162_rn(o[2 * e], o[2 * e + 1]);
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_tok + h * p.out_stride_head + d0;
  *reinterpret_cast<uint4*>(out) = *reinterpret_cast<uint4*>(r);
  if (threadIdx.x == 0) {
    if (p.lse != nullptr)
      p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] = L > 0.f ? (M + log2f(L)) * kLn2C : INFINITY;
    if (p.max_logits != nullptr)
      p.max_logits[tok * p.ml_stride_tok + h * p.ml_stride_head] = L > 0.f ? M * kLn2C : -INFINITY;
  }
}

}  // namespace

cudaError_t launch_sparse_mla_combine(const SparseMlaParams& p, cudaStream_t stream) {
  const long long blocks = static_cast<long long>(p.num_tokens) * p.num_heads;
  if (blocks == 0) return cudaSuccess;
  sparse_mla_combine_kernel<<<static_cast<unsigned>(blocks), kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace deepinfer_sm80::attention
