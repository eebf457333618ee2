// combine_topk_swa_indices for SM80+: the -1 fill and the index computation in one pass.
//
// One warp per output row t (grid-stride, grid from the SM count). With one request (b = 0,
// a kernel of its own) every load of a row is issued before the first use of any: the header
// loads, then the top-k loads (one memory round trip per row). With more, the top-k loads go
// first, and the row's request b is found by binary search in query_start_loc (rebased by
// its first element); then, with
//   pos       = seq_len[b] - query_len[b] + (t - query_start[b])
//   k         = min((pos + 1) / ratio, top_k)
//   swa_start = max(pos - (W - 1) - max(left - (W - 1), 0), 0)
//   swa_len   = pos + right - swa_start + 1
// every column c of the row gets
//   c < k                  : topk[t, c] + b * M
//   k <= c < k + swa_store : b * M + N + swa_start + (c - k) - (seq_len - gather_len)
//   otherwise              : -1
// where swa_store = min(swa_len, W * ceil((W + image_width) / W)) (the upstream kernel's
// store loop extent), and lens[t] = k + swa_len. (The one-request kernel takes that extent
// from the host and divides by ratio with a launch-time multiplier, common/fast_div.h, for
// pos + 1 >= 0.) Rows outside every request are all -1
// and their lens are left as they were (as upstream). Columns >= width are never
// written (upstream would spill into the next row; valid inputs never get there).
// Int32 arithmetic wraps like the upstream Triton kernel.
//
// DeepSeek-V4.1's copy of the kernel (deepseek_v41/common/ops/cache_utils.py; kV41, the op's
// v41 flag; no image visibility) differs in three places, all kept here:
//   k         = max(min((pos + 1) / ratio, top_k), 0)        (lens use it too)
//   swa_start = max(pos - (W - 1), 0, seq_len - gather_len)  (SWA bounded replay: gather_len
//               leaves out context below the request's replay start, and the window cannot
//               start before the gathered buffer does), swa_len = max(pos - swa_start + 1, 0)
//   c < k                  : topk[t, c] + b * M when 0 <= topk[t, c] < N, else -1 (a failed or
//                            out-of-pool candidate lands in no other request's rows)
#include <cuda_runtime.h>

#include "common/fast_div.h"
#include "common/vec.cuh"
#include "index/index_kernels.h"

namespace deepinfer_sm80 {
namespace {

// Two warps (two rows) per block, measured on the H200 against 1, 4, 8, 12, 16 and 32
// (docs/kernels-cache-index.md): T=1536 L2-warm 2.98-2.99 us against 3.04-3.06 with 4 warps in
// one same-run A/B, 3.18-3.20 with 1, larger blocks slower still; between two record runs the
// 2- and 4-warp kernels read 3.03 / 3.02 us, so the gain is at most those 2%.
constexpr int kWarpsPerBlock = 2;
constexpr int kGridWarpsPerSm = 64;  // grid cap: resident warps per SM the grid asks for
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int kHeld = 8;  // int4 column chunks per lane held in registers (1024 columns)

__device__ __forceinline__ int32_t add32(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
__device__ __forceinline__ int32_t mul32(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}

struct RowPlan {
  int k;            // top-k columns (>= 0 for writing)
  int swa_end;      // k + swa_store, clipped to [k, width]
  int32_t bM;       // b * M
  int32_t swa_val;  // value at column k (column c gets swa_val + (c - k))
};

// The request header of row t in request b: every load issued at once, as asm loads that
// nvcc keeps in place (as plain loads it sinks seq_lens / gather_lens into the branch on the
// row's range, behind the query_start_loc loads: two dependent round trips).
struct RowHeader {
  int32_t qs, qe, seq_len, gather_len, left, right;
};
__device__ __forceinline__ RowHeader load_header(const CombineParams& p, int b, int t) {
  RowHeader h;
  h.qs = static_cast<int32_t>(ld_nc_u32(p.query_start_loc + b));
  h.qe = static_cast<int32_t>(ld_nc_u32(p.query_start_loc + b + 1));
  h.seq_len = static_cast<int32_t>(ld_nc_u32(p.seq_lens + b));
  h.gather_len = static_cast<int32_t>(ld_nc_u32(p.gather_lens + b));
  h.left = h.right = 0;
  if (p.image_width > 0) {
    h.left = static_cast<int32_t>(ld_nc_u32(p.left_visible + t));
    h.right = static_cast<int32_t>(ld_nc_u32(p.right_visible + t));
  }
  return h;
}

// The row's top-k value at a column c < k: + b * M; with kV41 a candidate outside [0, N) is -1.
template <bool kV41>
__device__ __forceinline__ int32_t topk_value(int32_t v, int32_t bM, int32_t N) {
  if constexpr (kV41) {
    return (v >= 0 && v < N) ? add32(v, bM) : -1;
  } else {
    return add32(v, bM);
  }
}

template <bool kVec4, bool kV41>
__global__ void __launch_bounds__(kThreads) combine_kernel(const CombineParams p) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * kWarpsPerBlock;
  const int32_t q0 = p.num_reqs > 0 ? p.query_start_loc[0] : 0;

  for (int t = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5); t < p.num_tokens; t += nwarps) {
    const int32_t* src = p.topk + static_cast<int64_t>(t) * p.topk_stride0;
    int32_t* dst = p.idx + static_cast<int64_t>(t) * p.idx_stride0;
    // The first kHeld * 128 top-k columns are loaded before the request lookup: they do
    // not depend on it, so their latency overlaps the header loads (one memory round trip
    // per row instead of one per step). Columns c < top_k are in bounds (host check).
    int4 held[kHeld];
    if (kVec4) {
#pragma unroll
      for (int i = 0; i < kHeld; ++i) {
        const int c = (i * 32 + lane) * 4;
        held[i] = c < p.top_k ? *reinterpret_cast<const int4*>(src + c) : make_int4(0, 0, 0, 0);
      }
    }

    // Request of row t: largest b with qsl[b] - q0 <= t, and t < qsl[b + 1] - q0.
    int lo = 0, hi = p.num_reqs;  // invariant: qsl[lo] - q0 <= t (for lo = 0: q0 - q0 = 0)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (p.query_start_loc[mid] - q0 <= t) lo = mid; else hi = mid;
    }
    const int b = lo;
    RowPlan plan{0, 0, 0, 0};
    if (p.num_reqs > 0) {
      const int qs = p.query_start_loc[b] - q0;
      const int qe = p.query_start_loc[b + 1] - q0;
      const int seq_len = p.seq_lens[b];
      const int gather_len = p.gather_lens[b];
      int left = 0, right = 0;
      if (p.image_width > 0) {
        left = p.left_visible[t];
        right = p.right_visible[t];
      }
      if (qs <= t && t < qe) {
        const int pos = seq_len - (qe - qs) + (t - qs);
        int k = min((pos + 1) / p.ratio, p.top_k);
        const int left_add = max(left - (p.window - 1), 0);
        int swa_start = max(pos - (p.window - 1) - left_add, 0);
        int swa_len = pos + right - swa_start + 1;
        if constexpr (kV41) {  // (left = right = 0: the host refuses images with v41)
          k = max(k, 0);
          swa_start = max(swa_start, seq_len - gather_len);
          swa_len = max(pos - swa_start + 1, 0);
        }
        const int loop_extent =
            p.window > 0 ? (p.window + p.image_width + p.window - 1) / p.window * p.window : 0;
        const int swa_store = max(min(swa_len, loop_extent), 0);
        plan.k = min(max(k, 0), p.width);
        plan.swa_end = min(plan.k + swa_store, p.width);
        plan.bM = mul32(p.M, b);
        plan.swa_val = add32(add32(plan.bM, p.N), swa_start - (seq_len - gather_len));
        if (lane == 0) p.lens[t] = k + swa_len;
      }
    }
    auto value = [&](int c, int32_t topk_val) -> int32_t {
      if (c < plan.k) return topk_value<kV41>(topk_val, plan.bM, p.N);
      if (c < plan.swa_end) return add32(plan.swa_val, c - plan.k);
      return -1;
    };
    if (kVec4) {
      // Chunks past the top-k part need no top-k value: store them first, while the
      // top-k loads may still be in flight; then the chunks that use them.
#pragma unroll
      for (int i = 0; i < kHeld; ++i) {
        const int c = (i * 32 + lane) * 4;
        if (c < p.width && c >= plan.k) {
          *reinterpret_cast<int4*>(dst + c) =
              make_int4(value(c, 0), value(c + 1, 0), value(c + 2, 0), value(c + 3, 0));
        }
      }
#pragma unroll
      for (int i = 0; i < kHeld; ++i) {
        const int c = (i * 32 + lane) * 4;
        if (c < p.width && c < plan.k) {
          const int4 tv = held[i];
          *reinterpret_cast<int4*>(dst + c) = make_int4(
              value(c, tv.x), value(c + 1, tv.y), value(c + 2, tv.z), value(c + 3, tv.w));
        }
      }
      for (int c = kHeld * 128 + lane * 4; c < p.width; c += 128) {  // wide rows only
        int4 tv = make_int4(0, 0, 0, 0);
        if (c < plan.k) tv = *reinterpret_cast<const int4*>(src + c);
        *reinterpret_cast<int4*>(dst + c) = make_int4(value(c, tv.x), value(c + 1, tv.y),
                                                      value(c + 2, tv.z), value(c + 3, tv.w));
      }
    } else {
      for (int c = lane; c < p.width; c += 32) {
        dst[c] = value(c, c < plan.k ? src[c] : 0);
      }
    }
  }
}

// One request (num_reqs == 1; 16-byte rows): b = 0 without a search, the header loads go out
// ahead of the top-k loads and come back with them (one round trip per row), the division by
// ratio uses the launch's multiplier and the store extent comes from the host. The stores
// are combine_kernel's 16-byte path, line for line: kept apart so that combine_kernel's SASS
// stays as measured (a shared __forceinline__ store function changed the SASS of both
// kernels, 2026-11-30).
// Same-run A/B on the H200 (2026-11-30 13:49 UTC, docs/kernels-cache-index.md), three rounds:
// T=1536 2.82-2.86 us L2-warm / 4.06-4.08 cold against 3.00-3.02 / 4.17-4.20 for
// combine_kernel, T=16384 21.44-21.48 against 21.94-22.02 us. The same order in the one
// kernel for every request count made T=8192 with 4 requests 4-5% slower L2-warm (13:41
// UTC), so launches with more requests keep combine_kernel.
template <bool kV41>
__global__ void __launch_bounds__(kThreads) combine_one_req_kernel(const CombineParams p,
                                                                   const CombineOneReqParams x) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * kWarpsPerBlock;

  for (int t = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5); t < p.num_tokens; t += nwarps) {
    const int32_t* src = p.topk + static_cast<int64_t>(t) * p.topk_stride0;
    int32_t* dst = p.idx + static_cast<int64_t>(t) * p.idx_stride0;
    // b = 0, and query_start_loc[0] = q0: the row's range is [0, qe - q0). The header loads
    // go out first, then the first kHeld * 128 top-k columns (in bounds: host check).
    const RowHeader h = load_header(p, 0, t);
    int4 held[kHeld];
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int c = (i * 32 + lane) * 4;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (c < p.top_k) v = ld_nc_v4(src + c);
      held[i] = make_int4(static_cast<int>(v.x), static_cast<int>(v.y), static_cast<int>(v.z),
                          static_cast<int>(v.w));
    }
    RowPlan plan{0, 0, 0, 0};
    const int qe = h.qe - h.qs;
    if (t < qe) {
      const int pos = h.seq_len - qe + t;
      const int n = pos + 1;  // (pos + 1) / ratio: the multiplier for n >= 0 (every valid row)
      int k = min(n >= 0 ? fast_div(n, x.ratio_div) : n / p.ratio, p.top_k);
      const int left_add = max(h.left - (p.window - 1), 0);
      int swa_start = max(pos - (p.window - 1) - left_add, 0);
      int swa_len = pos + h.right - swa_start + 1;
      if constexpr (kV41) {  // as in combine_kernel
        k = max(k, 0);
        swa_start = max(swa_start, h.seq_len - h.gather_len);
        swa_len = max(pos - swa_start + 1, 0);
      }
      const int swa_store = max(min(swa_len, x.swa_extent), 0);
      plan.k = min(max(k, 0), p.width);
      plan.swa_end = min(plan.k + swa_store, p.width);
      plan.swa_val = add32(p.N, swa_start - (h.seq_len - h.gather_len));  // b * M = 0
      if (lane == 0) p.lens[t] = k + swa_len;
    }
    auto value = [&](int c, int32_t topk_val) -> int32_t {
      if (c < plan.k) return topk_value<kV41>(topk_val, plan.bM, p.N);
      if (c < plan.swa_end) return add32(plan.swa_val, c - plan.k);
      return -1;
    };
    // Chunks past the top-k part need no top-k value: store them first, while the
    // top-k loads may still be in flight; then the chunks that use them.
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int c = (i * 32 + lane) * 4;
      if (c < p.width && c >= plan.k) {
        *reinterpret_cast<int4*>(dst + c) =
            make_int4(value(c, 0), value(c + 1, 0), value(c + 2, 0), value(c + 3, 0));
      }
    }
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int c = (i * 32 + lane) * 4;
      if (c < p.width && c < plan.k) {
        const int4 tv = held[i];
        *reinterpret_cast<int4*>(dst + c) = make_int4(
            value(c, tv.x), value(c + 1, tv.y), value(c + 2, tv.z), value(c + 3, tv.w));
      }
    }
    for (int c = kHeld * 128 + lane * 4; c < p.width; c += 128) {  // wide rows only
      int4 tv = make_int4(0, 0, 0, 0);
      if (c < plan.k) tv = *reinterpret_cast<const int4*>(src + c);
      *reinterpret_cast<int4*>(dst + c) = make_int4(value(c, tv.x), value(c + 1, tv.y),
                                                    value(c + 2, tv.z), value(c + 3, tv.w));
    }
  }
}

}  // namespace

void launch_combine_topk_swa(const CombineParams& p, const DeviceLimits& lim,
                             cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  const int blocks = lim.grid_blocks(p.num_tokens, kWarpsPerBlock, kGridWarpsPerSm / kWarpsPerBlock);
  if (p.vec4 && p.num_reqs == 1) {
    // The upstream kernel's store-loop extent, W * ceil((W + image_width) / W), in the
    // kernel's int32 arithmetic (wrapping adds and multiply; W >= 1 by the host check)
    CombineOneReqParams x;
    const uint32_t W = static_cast<uint32_t>(p.window);
    const int32_t num = static_cast<int32_t>(W + static_cast<uint32_t>(p.image_width) + W - 1u);
    x.swa_extent = static_cast<int32_t>(static_cast<uint32_t>(num / p.window) * W);
    x.ratio_div = make_fast_div(p.ratio);
    (p.v41 ? combine_one_req_kernel<true> : combine_one_req_kernel<false>)
        <<<blocks, kThreads, 0, stream>>>(p, x);
  } else if (p.vec4) {
    (p.v41 ? combine_kernel<true, true> : combine_kernel<true, false>)<<<blocks, kThreads, 0, stream>>>(p);
  } else {
    (p.v41 ? combine_kernel<false, true> : combine_kernel<false, false>)<<<blocks, kThreads, 0, stream>>>(p);
  }
}

}  // namespace deepinfer_sm80
