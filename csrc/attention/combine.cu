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
// Block = one (token, head): kGroups split groups x 128 threads, one float4 of O each (4
// warps x 128 dims per group); group g merges splits g, g + kGroups, ... Each warp reduces
// the split statistics itself (one split per lane, twice for up to 64 splits), and the first
// kBatch of its group's splits are loaded before the statistics are known, so a merge of up
// to kGroups * kBatch splits costs one round trip to L2; the groups' sums meet in shared
// memory. The launcher takes the fewest groups that cover the splits in one round trip:
// small blocks keep many merges resident per SM (the earlier kernel always ran 4 groups,
// 512 threads with 92 registers, one block per SM: 18 us for 128 tokens x 8 heads x 2
// splits; docs/attention.md).
constexpr int kDimThreads = kHeadDim / 4;  // 128
constexpr int kBatch = 8;                  // a thread's splits loaded together
constexpr int kMaxSplits = static_cast<int>(plan::kMaxSplits);  // the planner's cap
static_assert(kMaxSplits <= 64, "one split per lane, twice");

template <int kGroups>
__global__ void __launch_bounds__(kDimThreads * kGroups) sparse_mla_combine_kernel(const SparseMlaParams p) {
  const int h = blockIdx.x % p.num_heads;
  const int tok = blockIdx.x / p.num_heads;
  const int S = p.num_splits, H = p.num_heads;
  const int lane = threadIdx.x & 31;
  const int sg = threadIdx.x / kDimThreads, dt = threadIdx.x % kDimThreads;
  const int64_t split_stride = static_cast<int64_t>(H) * kHeadDim;
  const float* src = p.part_o + (static_cast<int64_t>(tok) * S * H + h) * kHeadDim + dt * 4;
  float4 x[kBatch];
  auto load_batch = [&](int b) {  // splits sg + kGroups * (b * kBatch + i)
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int sp = sg + kGroups * (b * kBatch + i);
      x[i] = sp < S ? *reinterpret_cast<const float4*>(src + sp * split_stride) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load_batch(0);
  // statistics: lane = split (and split + 32): max, then weights 2^(m_s - M) / den
  const float* ml = p.part_ml + static_cast<int64_t>(tok) * S * 3 * H;
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
  w[0] *= inv;
  w[1] *= inv;
  if (threadIdx.x == 0) {
    if (p.lse != nullptr)
      p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] = L > 0.f ? (M + log2f(LX)) * kLn2C : INFINITY;
    if (p.max_logits != nullptr)
      p.max_logits[tok * p.ml_stride_tok + h * p.ml_stride_head] = L > 0.f ? M * kLn2C : -INFINITY;
  }
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int b = 0; sg + kGroups * b * kBatch < S; ++b) {
    if (b > 0) load_batch(b);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int sp = sg + kGroups * (b * kBatch + i);  // warp-uniform
      if (sp >= S) break;
      const float ws = __shfl_sync(0xffffffffu, sp < 32 ? w[0] : w[1], sp & 31);
      if (ws == 0.f) continue;  // empty split: its partial may be anything finite
      o.x += ws * x[i].x; o.y += ws * x[i].y; o.z += ws * x[i].z; o.w += ws * x[i].w;
    }
  }
  if constexpr (kGroups > 1) {
    __shared__ float4 s_sum[kGroups - 1][kDimThreads];
    if (sg > 0) s_sum[sg - 1][dt] = o;
    __syncthreads();
    if (sg > 0) return;
#pragma unroll
    for (int g = 0; g < kGroups - 1; ++g) {
      const float4 y = s_sum[g][dt];
      o.x += y.x; o.y += y.y; o.z += y.z; o.w += y.w;
    }
  }
  const __nv_bfloat162 a = __floats2bfloat162_rn(o.x, o.y);
  const __nv_bfloat162 b = __floats2bfloat162_rn(o.z, o.w);
  uint2 v;
  v.x = *reinterpret_cast<const uint32_t*>(&a);
  v.y = *reinterpret_cast<const uint32_t*>(&b);
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_tok + h * p.out_stride_head + dt * 4;
  *reinterpret_cast<uint2*>(out) = v;
}

}  // namespace

cudaError_t launch_sparse_mla_combine(const SparseMlaParams& p, cudaStream_t stream) {
  const long long blocks = static_cast<long long>(p.num_tokens) * p.num_heads;
  if (blocks == 0) return cudaSuccess;
  if (p.num_splits > kMaxSplits) return cudaErrorInvalidValue;
  const unsigned nb = static_cast<unsigned>(blocks);
  if (p.num_splits <= kBatch) {
    sparse_mla_combine_kernel<1><<<nb, kDimThreads, 0, stream>>>(p);
  } else if (p.num_splits <= 2 * kBatch) {
    sparse_mla_combine_kernel<2><<<nb, 2 * kDimThreads, 0, stream>>>(p);
  } else {
    sparse_mla_combine_kernel<4><<<nb, 4 * kDimThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace deepinfer_sm80::attention
