// Per-row top-k of int64 keys, sorted descending: what torch.topk(keys, k, sorted=True).values
// gives for the indexer's keys (deepinfer_sm80.ampere.indexer.order_keys: unique per row except
// INT64_MIN, which marks "no column"), rows shorter than k padded with INT64_MIN.
//
// One block per row. Radix select from the most significant byte on the keys made unsigned
// (key ^ 2^63 keeps their order): each pass histograms one byte of the keys that share the
// prefix chosen so far, and picks the byte value at which the count from the top reaches the
// number still needed. A row of at most kStageMax keys is copied to shared memory by the first
// pass, and the other passes and the selection read it there. Longer rows: while more than kCand
// candidates share the prefix, the passes read the row from global memory (the scorer has just
// written it, so from L2); once at most kCand remain, they are copied to shared memory and the
// remaining passes run there. The k-th largest key T is then known exactly: every key above T
// is selected, and copies of T fill the rest (T repeats only as INT64_MIN). A pass whose chosen
// byte holds exactly the keys still needed ends the select early: the k keys are then those at
// or above the prefix (for the indexer's keys, whose high half is the score, usually after 3-4
// of the 8 passes). The k keys are sorted (bitonic, in registers: warp shuffles for strides
// under 32, shared memory for the longer ones) and written, as keys or (out_idx) as the int32
// column indices the keys carry. Deterministic: the result is a function of the multiset of
// keys.
//
// Windows (RowTopkParams::win_*): a row is then read as its prefix (a running best, in the row or
// in its own tensor) and the columns of its visible window only; the caller promises INT64_MIN
// everywhere else, so the result is the same as over the whole row. A vLLM decode's rows are as
// wide as max_model_len and visible only up to their context (docs/indexer-scorer.md).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/env_knob.h"
#include "index/index_kernels.h"

namespace deepinfer_sm80 {
namespace {

constexpr int kThreads = 512;
constexpr int kCand = 4096;  // candidates kept in shared memory (32 KB)
// Rows of at most kStageMax keys (64 KB) are copied to shared memory by the first pass, and
// every later pass and the final selection read them there (no candidate copy).
constexpr int kStageMax = 8192;
constexpr uint64_t kSign = uint64_t{1} << 63;

// the bitonic sort's width: the smallest power of two >= k
__host__ __device__ __forceinline__ int pow2_at_least(int k) {
  int s = 1;
  while (s < k) s <<= 1;
  return s;
}

// hist[bin] += 1 when take: a predicated shared-memory reduction (no branch around the atomic,
// no returned value), so the passes' loops stay straight-line code.
__device__ __forceinline__ void hist_add_if(int* hist, uint32_t bin, bool take) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(hist + bin));
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\t@p red.shared.add.u32 [%0], 1;\n\t}"
      ::"r"(addr), "r"(static_cast<uint32_t>(take)));
}

// The byte of the next pass: hist[256] of the candidates, `need` >= 1 of them wanted from the
// top. Returns the byte value d and updates need (what is still wanted among keys with byte d)
// and count (how many candidates have byte d). Run by one warp.
__device__ __forceinline__ void pick_digit(const int* hist, int& need, int& digit, int& count) {
  const int lane = threadIdx.x & 31;
  // lane L owns bytes 255 - 8L .. 248 - 8L (descending)
  int c[8];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    c[i] = hist[255 - 8 * lane - i];
    sum += c[i];
  }
  // exclusive prefix over lanes (counts of larger bytes)
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (lane >= o) incl += v;
  }
  const int excl = incl - sum;
  const bool mine = excl < need && incl >= need;
  const unsigned who = __ballot_sync(0xFFFFFFFFu, mine);
  const int src = __ffs(who) - 1;
  int d = 0, above = 0, cnt = 0;
  if (lane == src) {
    int acc = excl;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (acc + c[i] >= need) {
        d = 255 - 8 * lane - i;
        above = acc;
        cnt = c[i];
        break;
      }
      acc += c[i];
    }
  }
  digit = __shfl_sync(0xFFFFFFFFu, d, src);
  need -= __shfl_sync(0xFFFFFFFFu, above, src);
  count = __shfl_sync(0xFFFFFFFFu, cnt, src);
}

// One compare-exchange of the bitonic network for element i (own value v, partner's o): keep
// the larger when i is the pair's lower index in a descending run (i & size == 0) or its upper
// index in an ascending one; else the smaller.
__device__ __forceinline__ uint64_t bitonic_keep(uint64_t v, uint64_t o, int i, int size,
                                                 int stride) {
  const bool take_max = ((i & size) == 0) == ((i & stride) == 0);
  return (v > o) == take_max ? v : o;
}

// Sorts sel_n (a power of two, <= kPer * kThreads) keys descending; thread tid holds elements
// tid + r * kThreads (r < kPer) in v, and leaves them there sorted. A step with stride < 32
// pairs lanes of one warp and exchanges by shuffles, with no barrier (35 of the 45 steps at
// sel_n 512; unrolled, so the lane tests fold into constants); a longer stride goes through
// `sel` in shared memory (two barriers). Elements >= sel_n carry junk that no valid element
// reads: a partner i ^ stride (stride < size <= sel_n, powers of two) is < sel_n exactly when
// i is.
template <int kPer>
__device__ __forceinline__ void bitonic_desc(uint64_t (&v)[kPer], uint64_t* sel, int sel_n,
                                             int tid) {
  for (int size = 2; size <= sel_n; size <<= 1) {
    for (int stride = size >> 1; stride >= 32; stride >>= 1) {
      __syncthreads();  // every read of the previous shared-memory step is done
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        const int i = tid + r * kThreads;
        if (i < sel_n) sel[i] = v[r];
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        const int i = tid + r * kThreads;
        if (i < sel_n) v[r] = bitonic_keep(v[r], sel[i ^ stride], i, size, stride);
      }
    }
#pragma unroll
    for (int stride = 16; stride > 0; stride >>= 1) {
      if (stride < size) {  // uniform
#pragma unroll
        for (int r = 0; r < kPer; ++r) {
          const uint64_t o = __shfl_xor_sync(0xFFFFFFFFu, v[r], stride);
          v[r] = bitonic_keep(v[r], o, tid + r * kThreads, size, stride);
        }
      }
    }
  }
}

// kPer keys per thread in the sort: 1 when pow2_at_least(k) <= kThreads, 2 up to 2 * kThreads,
// else 4 (k up to 2048: V4.1's candidate blocks). kHead: the
// row is read in two segments (a prefix, then the window: win_prefix > 0); otherwise key i is
// one pointer's element i, as without a window (the loads of the passes keep their form).
// kSplit: 0 one launch; 1 and 2 the split launches (RowTopkSplit), kHead false.
template <int kPer, bool kHead, int kSplit>
__device__ __forceinline__ void row_topk_body(const RowTopkParams& p, const RowTopkSplit& sp) {
  static_assert(kSplit == 0 || !kHead, "split launches read windows without a prefix");
  __shared__ int hist[256];
  __shared__ int s_need, s_digit, s_count, s_n;
  // [pow2 >= k] selection, then [kCand] candidates or (staged rows) the row's n keys
  extern __shared__ __align__(16) uint64_t sel[];

  const int tid = threadIdx.x;
  const int row = blockIdx.x;
  const int64_t* keys = p.keys + static_cast<int64_t>(row) * p.key_stride;
  // The keys the row is read as: key i is head[i] for i < pre, tail[i - pre] after (the window).
  int n = p.n;
  int pre = n;
  const int64_t* head = keys;
  const int64_t* tail = keys;  // key i >= pre is tail[i - pre]
  if (p.win_hi != nullptr) {
    pre = p.win_prefix;
    // the window columns: win_cols[j] is column win_col0 + j, span of them
    const int64_t* win_cols = keys + pre;
    const int64_t span = n - pre;
    if (p.win_head != nullptr) {  // the prefix from its own rows; every key a window column
      head = p.win_head + static_cast<int64_t>(row) * p.win_head_stride;
      win_cols = keys;
    }
    int64_t a = (p.win_lo != nullptr ? p.win_lo[row] : 0) - p.win_col0;
    int64_t b = p.win_hi[row] - p.win_col0;
    a = a < 0 ? 0 : (a > span ? span : a);
    b = b < a ? a : (b > span ? span : b);
    tail = win_cols + a;
    n = pre + static_cast<int>(b - a);
  }
  int64_t* ws_out = nullptr;  // split launch 1: this chunk's top-k keys go here
  if constexpr (kSplit != 0) {  // the split launches over a long window (pre is 0)
    const int w = n, S = kStageMax;  // chunks staged in shared memory
    const int chunks = (w + S - 1) / S;  // chunks with keys
    if constexpr (kSplit == 1) {
      const int c = blockIdx.y;
      if (chunks > 1) {  // chunk c's top-k keys to the workspace
        if (c >= chunks) return;
        tail += static_cast<int64_t>(c) * S;
        n = min(S, w - c * S);
        ws_out = sp.ws + (static_cast<int64_t>(row) * sp.blocks + c) * p.k;
      } else if (c != 0) {
        return;  // block 0 takes the whole (short) window
      }
    } else {
      if (chunks <= 1) return;  // done by the first launch
      tail = sp.ws + static_cast<int64_t>(row) * sp.blocks * p.k;
      n = chunks * p.k;
    }
  }
  auto key_at = [&](int i) -> uint64_t {
    if constexpr (kHead) {
      return static_cast<uint64_t>(i < pre ? head[i] : tail[i - pre]) ^ kSign;
    } else {
      return static_cast<uint64_t>(tail[i]) ^ kSign;  // pre is 0 (window) or n (keys)
    }
  };
  const int k = p.k;
  const int sel_n = pow2_at_least(k);
  uint64_t* const cand = sel + sel_n;
  const bool staged = n > k && n <= p.stage_max;  // the row goes to cand[0, n) in the first pass
  if constexpr (kHead) {
    // An empty window behind k prefix keys that are already in descending order (a previous
    // top-k's output: the column tiles of a decode past every context): they are the result,
    // already in place when out is the running best itself (nothing to write).
    if (n == pre && pre == k) {
      bool sorted = true;
      for (int i = tid; i + 1 < k; i += kThreads) sorted &= head[i] >= head[i + 1];
      if (__syncthreads_and(sorted)) {
        if (p.out != nullptr && p.out == p.win_head && p.out_stride == p.win_head_stride) return;
        for (int i = tid; i < k; i += kThreads) {
          const int64_t key = head[i];
          if (p.out_idx != nullptr) {
            p.out_idx[static_cast<int64_t>(row) * p.out_stride + i] =
                key == INT64_MIN ? -1 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
          } else {
            p.out[static_cast<int64_t>(row) * p.out_stride + i] = key;
          }
        }
        return;
      }
    }
  }

  uint64_t thr;       // the k-th largest key (unsigned form); keys above it are all selected
  int fill;           // copies of thr to add
  bool at_least = false;  // select the keys >= thr instead (no copies): see the early exit
  if (n <= k) {
    thr = 0;          // INT64_MIN: every key is above or equal; pad with INT64_MIN
    fill = 0;
  } else {
    uint64_t prefix = 0, mask = 0;
    int need = k;
    bool in_smem = false;
    int ncand = n;
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
      __syncthreads();
      if (staged) {
        if (shift == 56) {  // first pass: every key counts; copy the row
          for (int i = tid; i < n; i += kThreads) {
            const uint64_t u = key_at(i);
            cand[i] = u;
            atomicAdd(&hist[u >> 56], 1);
          }
        } else if (shift >= 32) {  // prefix and byte in the high word: read only that
          const uint32_t* hi = reinterpret_cast<const uint32_t*>(cand) + 1;
          const uint32_t pre_hi = static_cast<uint32_t>(prefix >> 32);
          const uint32_t mask_hi = static_cast<uint32_t>(mask >> 32);
          const int sh = shift - 32;
          for (int i = tid; i < n; i += kThreads) {
            const uint32_t h = hi[2 * i];
            hist_add_if(hist, (h >> sh) & 255, (h & mask_hi) == pre_hi);
          }
        } else {
          for (int i = tid; i < n; i += kThreads) {
            const uint64_t u = cand[i];
            hist_add_if(hist, static_cast<uint32_t>(u >> shift) & 255, (u & mask) == prefix);
          }
        }
      } else if (!in_smem) {
        for (int i = tid; i < n; i += kThreads) {
          const uint64_t u = key_at(i);
          hist_add_if(hist, static_cast<uint32_t>(u >> shift) & 255, (u & mask) == prefix);
        }
      } else {
        for (int i = tid; i < ncand; i += kThreads) {
          atomicAdd(&hist[(cand[i] >> shift) & 255], 1);
        }
      }
      __syncthreads();
      if (tid < 32) {
        int d, cnt, nd = need;
        pick_digit(hist, nd, d, cnt);
        if (tid == 0) {
          s_need = nd;
          s_digit = d;
          s_count = cnt;
        }
      }
      __syncthreads();
      need = s_need;
      const uint64_t d = static_cast<uint64_t>(s_digit);
      const int count = s_count;
      const uint64_t dmask = uint64_t{255} << shift;
      if (count == need) {
        // Early exit: every key with this prefix is wanted, so the k keys are exactly those
        // whose masked bits are >= the prefix, i.e. (the lower bits of the prefix being 0)
        // the keys u >= prefix. Uniform: need and count come from shared memory.
        prefix |= d << shift;
        at_least = true;
        need = 0;
        break;
      }
      // narrow the candidates to byte d
      if (in_smem) {
        if (tid == 0) s_n = 0;
        __syncthreads();
        uint64_t mine[kCand / kThreads];
        bool keep[kCand / kThreads];
#pragma unroll
        for (int j = 0; j < kCand / kThreads; ++j) {
          const int i = tid + j * kThreads;
          mine[j] = i < ncand ? cand[i] : 0;
          keep[j] = i < ncand && ((mine[j] >> shift) & 255) == d;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kCand / kThreads; ++j) {
          if (keep[j]) cand[atomicAdd(&s_n, 1)] = mine[j];
        }
        __syncthreads();
        ncand = s_n;
      }
      prefix |= d << shift;
      mask |= dmask;
      if (!staged && !in_smem && count <= kCand && shift > 0) {
        if (tid == 0) s_n = 0;
        __syncthreads();
        for (int i = tid; i < n; i += kThreads) {
          const uint64_t u = key_at(i);
          if ((u & mask) == prefix) cand[atomicAdd(&s_n, 1)] = u;
        }
        __syncthreads();
        ncand = s_n;
        in_smem = true;
      }
    }
    thr = prefix;
    fill = need;  // copies of thr among the k
  }

  // gather the keys above thr (and, when n <= k, every key), then the copies of thr
  if (tid == 0) s_n = 0;
  __syncthreads();
  for (int i = tid; i < n; i += kThreads) {
    const uint64_t u = staged ? cand[i] : key_at(i);
    if (n <= k ? true : (at_least ? u >= thr : u > thr)) sel[atomicAdd(&s_n, 1)] = u;
  }
  __syncthreads();
  const int above = s_n;
  // A row of n <= k keys sorts only the next power of two >= n of them; the rest of the k are
  // INT64_MIN (0 in the unsigned form). V4.1's candidate blocks: k = 2048, a row's visible
  // blocks often a few hundred.
  const int sort_n = n <= k ? pow2_at_least(n > 0 ? n : 1) : sel_n;
  for (int i = above + tid; i < sort_n; i += kThreads) sel[i] = (i < above + fill) ? thr : 0;
  __syncthreads();

  // Bitonic sort, descending, in registers (bitonic_desc): thread tid holds elements
  // tid + r * kThreads, r < kPer.
  uint64_t v[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int i = tid + r * kThreads;
    v[r] = i < sort_n ? sel[i] : 0;
  }
  bitonic_desc<kPer>(v, sel, sort_n, tid);
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    if (tid + r * kThreads >= sort_n) v[r] = 0;  // past the sorted keys: INT64_MIN
  }
  if constexpr (kSplit == 1) {
    if (ws_out != nullptr) {  // a chunk's keys, for the second launch
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        const int i = tid + r * kThreads;
        if (i < k) ws_out[i] = static_cast<int64_t>(v[r] ^ kSign);
      }
      return;
    }
  }
  if (p.out_idx != nullptr) {  // the keys' column indices (keys_to_indices), -1 for INT64_MIN
    int32_t* out = p.out_idx + static_cast<int64_t>(row) * p.out_stride;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int i = tid + r * kThreads;
      if (i < k) {
        const uint64_t key = v[r] ^ kSign;
        out[i] = key == kSign ? -1 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
      }
    }
    return;
  }
  int64_t* out = p.out + static_cast<int64_t>(row) * p.out_stride;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int i = tid + r * kThreads;
    if (i < k) out[i] = static_cast<int64_t>(v[r] ^ kSign);
  }
}

template <int kPer, bool kHead>
__global__ void __launch_bounds__(kThreads) row_topk_kernel(const RowTopkParams p) {
  row_topk_body<kPer, kHead, 0>(p, RowTopkSplit{});
}

template <int kPer, int kSplit>
__global__ void __launch_bounds__(kThreads) row_topk_split_kernel(const RowTopkParams p,
                                                                  const RowTopkSplit sp) {
  row_topk_body<kPer, false, kSplit>(p, sp);
}

// Dynamic shared memory: the selection (pow2 >= k keys), then kCand candidates or a staged row
// of up to stage_max keys.
int row_topk_smem_bytes(int k, int stage_max) {
  return (pow2_at_least(k) + (stage_max > kCand ? stage_max : kCand)) *
         static_cast<int>(sizeof(uint64_t));
}

}  // namespace

void launch_row_topk(const RowTopkParams& params, cudaStream_t stream, const RowTopkSplit& split) {
  if (params.rows <= 0 || params.k <= 0) return;
  RowTopkParams p = params;
  static const bool can_stage = [] {  // beyond 48 KB of dynamic shared memory, once
    const int bytes = row_topk_smem_bytes(kRowTopkMaxK, kStageMax);
    const auto attr = cudaFuncAttributeMaxDynamicSharedMemorySize;
    bool ok = true;
    for (const void* f : {reinterpret_cast<const void*>(row_topk_kernel<1, false>),
                          reinterpret_cast<const void*>(row_topk_kernel<2, false>),
                          reinterpret_cast<const void*>(row_topk_kernel<4, false>),
                          reinterpret_cast<const void*>(row_topk_kernel<1, true>),
                          reinterpret_cast<const void*>(row_topk_kernel<2, true>),
                          reinterpret_cast<const void*>(row_topk_kernel<4, true>),
                          reinterpret_cast<const void*>(row_topk_split_kernel<1, 1>),
                          reinterpret_cast<const void*>(row_topk_split_kernel<2, 1>),
                          reinterpret_cast<const void*>(row_topk_split_kernel<4, 1>),
                          reinterpret_cast<const void*>(row_topk_split_kernel<1, 2>),
                          reinterpret_cast<const void*>(row_topk_split_kernel<2, 2>),
                          reinterpret_cast<const void*>(row_topk_split_kernel<4, 2>)}) {
      ok = ok && cudaFuncSetAttribute(f, attr, bytes) == cudaSuccess;
    }
    return ok;
  }();
  if (p.win_hi == nullptr) {  // every row has p.n keys
    p.stage_max = can_stage && p.n > p.k && p.n <= kStageMax ? p.n : 0;
  } else {  // rows of up to p.n keys, each as long as its window: staged where it fits
    p.stage_max = can_stage ? (p.n < kStageMax ? p.n : kStageMax) : 0;
  }
  const int smem = p.win_hi == nullptr && p.stage_max > 0
                       ? (pow2_at_least(p.k) + p.stage_max) * static_cast<int>(sizeof(uint64_t))
                       : row_topk_smem_bytes(p.k, p.stage_max);
  const bool head = p.win_hi != nullptr && p.win_prefix > 0;
  // keys per thread in the sort: 1, 2 or 4 (k up to 512, 1024, 2048)
  const int per = pow2_at_least(p.k) <= kThreads ? 1 : (pow2_at_least(p.k) <= 2 * kThreads ? 2 : 4);
  if (split.blocks > 0 && split.ws != nullptr && !head && p.win_hi != nullptr) {
    const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(split.blocks));
    (per == 1 ? row_topk_split_kernel<1, 1> : per == 2 ? row_topk_split_kernel<2, 1> : row_topk_split_kernel<4, 1>)
        <<<grid, kThreads, smem, stream>>>(p, split);
    (per == 1 ? row_topk_split_kernel<1, 2> : per == 2 ? row_topk_split_kernel<2, 2> : row_topk_split_kernel<4, 2>)
        <<<p.rows, kThreads, smem, stream>>>(p, split);
    return;
  }
  const auto kernel = per == 1 ? (head ? row_topk_kernel<1, true> : row_topk_kernel<1, false>)
                    : per == 2 ? (head ? row_topk_kernel<2, true> : row_topk_kernel<2, false>)
                               : (head ? row_topk_kernel<4, true> : row_topk_kernel<4, false>);
  kernel<<<p.rows, kThreads, smem, stream>>>(p);
}

int row_topk_split_blocks(const RowTopkParams& p, int sm_count) {
  if (p.win_hi == nullptr || p.win_prefix > 0 || p.win_head != nullptr) return 0;  // windows only
  // Rows longer than shared memory holds, and few enough rows that one block per row leaves
  // most SMs idle: at most a quarter as many as SMs. (H200, 2026-12-03 07:41 UTC: split, 1 x 1M
  // keys 124 -> 30.3 us, but 128 rows of 4,096 visible keys 9.81 -> 13.0 us and 64 of 2,048
  // 7.66 -> 9.11 us, where one block per row already fills the GPU.)
  if (p.n <= kStageMax || p.rows <= 0 || 4 * p.rows > sm_count) return 0;
  if (knob_off("DEEPINFER_ROW_TOPK_SPLIT")) return 0;
  const int64_t chunks = (static_cast<int64_t>(p.n) + kStageMax - 1) / kStageMax;
  return chunks <= 65535 ? static_cast<int>(chunks) : 0;  // grid.y
}

}  // namespace deepinfer_sm80
