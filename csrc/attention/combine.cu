// SPDX-License-Identifier: Apache-2.0
// Sink-aware merge of the split partials of the sparse MLA kernel:
//   M = max_s m_s,  w_s = 2^(m_s - M),  L = sum_s w_s l_s
//   out = sum_s w_s O_s / (L + 2^(sink*log2e - M)),  lse = ln2 * (M + log2 L)
// A token-head with no key at all (L == 0) gets out = 0 and lse = +inf. At most 64 splits.
#include <cuda_bf16.h>

#include "params.h"
#include "plan.h"

namespace deepinfer_sm80::attention {
namespace {

constexpr float kLog2eC = 1.4426950408889634f;
constexpr float kLn2C = 0.6931471805599453f;
// Block = one (token, head): kGroups split groups x 128 threads x 4 dims. Every thread
// issues the loads of all its splits' partials (split sg + kGroups * i) before it waits
// for the weights, so the whole merge costs one round trip to L2 for the partials, in
// parallel with the one for the (m, l) statistics; the groups' sums meet in shared memory.
constexpr int kDimThreads = kHeadDim / 4;  // 128: one float4 of O each
constexpr int kGroups = 4;
constexpr int kCombineThreads = kDimThreads * kGroups;
constexpr int kMaxSplits = static_cast<int>(plan::kMaxSplits);  // the planner's cap
static_assert(kMaxSplits % kGroups == 0 && kMaxSplits <= 64, "one split per lane of warp 0, twice");
constexpr int kPerThread = kMaxSplits / kGroups;

__global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine_kernel(const SparseMlaParams p) {
  __shared__ float s_w[kMaxSplits];
  __shared__ float4 s_sum[kGroups - 1][kDimThreads];
  const int h = blockIdx.x % p.num_heads;
  const int tok = blockIdx.x / p.num_heads;
  const int S = p.num_splits, H = p.num_heads;
  const int sg = threadIdx.x / kDimThreads, dt = threadIdx.x % kDimThreads;
  const float* src = p.part_o + (static_cast<int64_t>(tok) * S * H + h) * kHeadDim + dt * 4;
  float4 x[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int sp = sg + kGroups * i;
    x[i] = sp < S ? *reinterpret_cast<const float4*>(src + static_cast<int64_t>(sp) * H * kHeadDim)
                  : make_float4(0.f, 0.f, 0.f, 0.f);
  }
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
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int sp = sg + kGroups * i;
    if (sp >= S) break;
    const float w = s_w[sp];
    if (w == 0.f) continue;  // empty split: its partial may be anything finite
    o.x += w * x[i].x; o.y += w * x[i].y; o.z += w * x[i].z; o.w += w * x[i].w;
  }
  if (sg > 0) s_sum[sg - 1][dt] = o;
  __syncthreads();
  if (sg == 0) {
#pragma unroll
    for (int g = 0; g < kGroups - 1; ++g) {
      const float4 y = s_sum[g][dt];
      o.x += y.x; o.y += y.y; o.z += y.z; o.w += y.w;
    }
    const __nv_bfloat162 a = __floats2bfloat162_rn(o.x, o.y);
    const __nv_bfloat162 b = __floats2bfloat162_rn(o.z, o.w);
    uint2 v;
    v.x = *reinterpret_cast<const uint32_t*>(&a);
    v.y = *reinterpret_cast<const uint32_t*>(&b);
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_tok + h * p.out_stride_head + dt * 4;
    *reinterpret_cast<uint2*>(out) = v;
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
