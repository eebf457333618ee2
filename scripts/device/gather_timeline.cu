// Where a gather call's time goes: per-block %globaltimer timelines of the shipped tile
// gather (csrc/cache/gather_k.cu, built here with DEEPINFER_GATHER_TIMELINE) next to two
// copy kernels with the same one-warp-block shape, instrumented the same way:
//   copy   - the same bytes, read half and write half (each block: 4 KB in, 4 KB out);
//   widen  - contiguous 584 -> 1024-byte rows, four per block (the gather's read:write mix
//            and tile, no paging, no lookups, no decode).
// For each kernel: graph-replayed per-call time (median of 30 replays of 20 calls cycling
// through input sets that rotate past the L2, like bench/common.py), then one timed call whose
// blocks record when they started, (gather) when their lookups resolved, when their loads
// arrived, and their SM. Printed: dispatch (when the k-th block started), load latency by
// start time, and the rate at which loaded bytes arrive in 1 us bins, with the ramp (time to
// 90% of the steady rate) and the tail (time after the rate falls below 90%).
//
//   nvcc -O3 -std=c++17 -Icsrc -gencode arch=compute_80,code=sm_90 \
//        -o /tmp/gtl scripts/device/gather_timeline.cu && /tmp/gtl 49152 1
// Arguments: entries per request, requests (default 49152 1). Needs only the CUDA runtime.
// With one request it also times, on the gather's inputs, variants of the tile (tile_var:
// one tile per block, with or without the decode, other lookups and load forms) and the paged
// copies (paged_kernel); figures and what they showed: docs/kernels-cache-index.md, session of
// 2026-11-30 from 19:56 UTC (measured with this program at commit 0870414, which also held
// dec59cb's tile kernel as the same-run baseline of the kept change). -DGTL_NO_MARKS builds the timing binary: no timeline code in
// any kernel, graph-replayed times only (gather_timeline.sh builds both).
#ifndef GTL_NO_MARKS
#define DEEPINFER_GATHER_TIMELINE 1
#endif
#include "cache/gather_k.cu"
#ifdef GTL_NO_MARKS
namespace deepinfer_sm80 { namespace { __device__ unsigned long long* g_gather_timeline = nullptr; } }
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace gtl {
using namespace deepinfer_sm80;

constexpr int kBlockSize = 64;                 // entries per cache page (bench_cache C4_BLOCK)
constexpr int kPageStride = 65 * 576;          // bench_cache.page_stride(64) = 37,440 bytes

__device__ unsigned long long* g_copy_timeline = nullptr;

__device__ __forceinline__ void copy_mark(int slot, uint32_t dep) {
#ifdef GTL_NO_MARKS
  return;
#endif
  unsigned long long t = 0;
  if (dep != 0x7F7F7F7Fu) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
  if (threadIdx.x == 0 && g_copy_timeline != nullptr) {
    g_copy_timeline[4 * blockIdx.x + slot] = t;
    if (slot == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      g_copy_timeline[4 * blockIdx.x + 3] = sm;
    }
  }
}

// one warp: 4 KB in (16 B per lane x 8), 4 KB out, ~src
__global__ void __launch_bounds__(32) copy_kernel(const uint4* src, uint4* dst, int64_t blocks) {
  copy_mark(0, 0u);
  const int64_t b = blockIdx.x;
  if (b >= blocks) return;
  uint4 v[8];
  const uint64_t pol = l2_policy_evict_first();
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = ld_nc_v4_pol(src + b * 256 + k * 32 + threadIdx.x, pol);
  uint32_t dep = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) dep ^= v[k].x;
  copy_mark(2, dep);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    st_v4_pol(dst + b * 256 + k * 32 + threadIdx.x, make_uint4(~v[k].x, ~v[k].y, ~v[k].z, ~v[k].w), pol);
  }
}

// one warp, four rows: 4 x 584 contiguous bytes in (146 x 16 B), 4 x 1024 out (the 584 bytes,
// then zeros)
__global__ void __launch_bounds__(32) widen_kernel(const uint4* src, uint4* dst, int64_t rows) {
  copy_mark(0, 0u);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 4;
  if (r0 >= rows) return;
  const uint64_t pol = l2_policy_evict_first();
  const uint4* s = src + r0 * 584 / 16;  // 4 rows = 2336 bytes = 146 vectors, 16-B aligned
  uint4 v[5];
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    const int i = k * 32 + threadIdx.x;
    v[k] = i < 146 ? ld_nc_v4_pol(s + i, pol) : make_uint4(0, 0, 0, 0);
  }
  uint32_t dep = 0;
#pragma unroll
  for (int k = 0; k < 5; ++k) dep ^= v[k].x;
  copy_mark(2, dep);
  // Row `row` gets 37 of the loaded vectors (from vector 36 * row on) and then zeros: the
  // traffic of a 584 -> 1024 copy, not its exact byte placement (a row's 584 bytes are 36.5
  // vectors), which this timing does not need.
  __shared__ uint4 sm[160];
#pragma unroll
  for (int k = 0; k < 5; ++k) sm[k * 32 + threadIdx.x] = v[k];
  __syncwarp();
#pragma unroll
  for (int row = 0; row < 4; ++row) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = h * 32 + threadIdx.x;  // 16-byte column of the 1024-byte row
      const uint4 w = c < 37 ? sm[(row * 36 + c) % 146] : make_uint4(0, 0, 0, 0);
      st_v4_pol(dst + (r0 + row) * 64 + c, w, pol);
    }
  }
}

// One tile of the paged copy from its cache page at `base`: loads, scale words (kScale), the
// timeline mark, then through the warp's shared-memory buffer `sm` (160 vectors) into the rows.
template <bool kScale>
__device__ __forceinline__ void paged_tile_copy(const uint8_t* base, int64_t t, int lane, uint64_t pol,
                                                uint4* dst, uint4* sm) {
  const uint4* data = reinterpret_cast<const uint4*>(base + (t % 16) * 4 * 576);
  uint4 v[5];
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    const int i = k * 32 + lane;
    v[k] = i < 144 ? ld_nc_v4_pol(data + i, pol) : make_uint4(0, 0, 0, 0);
  }
  uint32_t sc = 0;
  if constexpr (kScale) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint2 w = ld_nc_v2(base + kBlockSize * 576 + ((t % 16) * 4 + j) * 8);
      sc ^= w.x ^ w.y;
    }
  }
  uint32_t dep = sc;
#pragma unroll
  for (int k = 0; k < 5; ++k) dep ^= v[k].x;
  copy_mark(2, dep);
  __syncwarp();  // the buffer's previous tile (SM-persistent form) has been stored
#pragma unroll
  for (int k = 0; k < 5; ++k) sm[k * 32 + lane] = v[k];
  __syncwarp();
#pragma unroll
  for (int row = 0; row < 4; ++row) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = h * 32 + lane;
      uint4 w = c < 36 ? sm[row * 36 + c] : make_uint4(sc, 0, 0, 0);
      st_v4_pol(dst + (4 * t + row) * 64 + c, w, pol);
    }
  }
}

// The gather's traffic without its decode, one warp per four-entry tile like the gather:
// the tile's 2,304 data bytes (contiguous in its cache page) as 16-byte vectors through shared
// memory into four 1 KB rows, and with kScale the four entries' 8-byte scale words (each lane
// loads each word, as the gather does) from the page's scale region. Page of tile t: t / 16
// (linear, no lookup) or, with kTable, block_table[t / 16]; with kChain the table load waits
// for seq_lens[0] (the gather's dependent chain). Output: raw bytes, not decoded.
template <bool kScale, bool kTable, bool kChain>
__global__ void __launch_bounds__(32) paged_kernel(const uint8_t* cache, const int32_t* table,
                                                  const int32_t* lens, uint4* dst, int64_t entries) {
  copy_mark(0, 0u);
  const int64_t t = blockIdx.x;
  const uint64_t pol = l2_policy_evict_first();
  int64_t page = t / 16;
  if constexpr (kChain) {
    const int n = lens[0];
    if (4 * t >= n) return;
    if constexpr (kTable) page = table[page];
  } else if constexpr (kTable) {
    page = table[page];
  }
  __shared__ uint4 sm[160];
  paged_tile_copy<kScale>(cache + page * kPageStride, t, threadIdx.x, pol, dst, sm);
}

// Variants of the shipped tile (gather_k_warp_kernel with the L2 policy), one tile per block,
// to find which of its parts cost time:
//   kDecode false: the loaded bytes stored raw (a diagnostic, wrong output by design);
//   kSimpleLookup: entries resolved as paged_kernel does (seq_lens[r], then
//            block_table[i / 64] with the constant page size of these inputs);
//   kSpec:   without gather_lens the tile's block-table entries load next to seq_lens
//            (start = 0), not after it;
//   kContig: when the tile's four entries are consecutive in one page, their 2,304 data bytes
//            load as 144 16-byte vectors (4.5 per lane) and the scale words with the remainder,
//            through shared memory to the per-row decode and stores;
//   kScaleFirst: the four scale words loaded before the records' data.
// Otherwise loads, decode and stores are the shipped kernel's (load_packed, store_entry).
__device__ __forceinline__ void store_raw(uint16_t* row, const EntryLoads& e, int lane, uint64_t pol) {
  st_v4_pol(row + 8 * lane, make_uint4(e.a.x, e.a.y, e.scales.x, e.scales.y), pol);
  st_v4_pol(row + 256 + 8 * lane, e.b, pol);
}

// store_entry with one warp-wide test per entry: when no lane holds a NaN code and every
// lane's scale bytes suit the bf16x2-multiply route (the common case), every chunk takes that
// route without per-chunk branches; otherwise the shipped per-chunk routes (decode8).
__device__ __forceinline__ void store_entry_vote(uint16_t* out_row, const EntryLoads& e, int lane,
                                                 uint64_t pol) {
  const LaneScales sc = lane_scales(e, lane);
  const bool nope_hi = lane < 24;
  const bool ok = !e4m3x4_has_nan(e.a.x) && !e4m3x4_has_nan(e.a.y) && e4m3_bf16mul_scale_ok(sc.lo) &&
                  (!nope_hi || (!e4m3x4_has_nan(e.b.x) && !e4m3x4_has_nan(e.b.y) &&
                                e4m3_bf16mul_scale_ok(sc.hi)));
  uint4 lo, hi;
  if (__all_sync(0xFFFFFFFFu, ok)) {
    lo = e4m3x8_to_bf16x8_bf16mul(e.a, sc.lo);
    hi = nope_hi ? e4m3x8_to_bf16x8_bf16mul(make_uint2(e.b.x, e.b.y), sc.hi) : e.b;
  } else {
    lo = decode8(e.a, sc.lo);
    hi = nope_hi ? decode8(make_uint2(e.b.x, e.b.y), sc.hi) : e.b;
  }
  st_v4_pol(out_row + 8 * lane, lo, pol);
  st_v4_pol(out_row + 256 + 8 * lane, hi, pol);
}

// Decode routes chosen once per entry (kRoute 4) or once per tile (3) by each lane, with no
// warp vote: when none of the lane's codes is NaN and its scale bytes suit the route, both of
// its chunks take it as straight-line code; otherwise decode8's per-chunk routes redo them.
// kTwoMul: the two-multiply bf16x2 route (scale bytes 10..246; the shipped decode_entry),
// else the one-multiply route (10..134).
template <bool kTwoMul>
__device__ __forceinline__ bool entry_fast(const EntryLoads& e, int lane, LaneScales sc) {
  const bool nope_hi = lane < 24;
  uint32_t nan = e4m3_nan_fold(0u, e.a.x);
  nan = e4m3_nan_fold(nan, e.a.y);
  nan = e4m3_nan_fold(nan, nope_hi ? e.b.x : 0u);
  nan = e4m3_nan_fold(nan, nope_hi ? e.b.y : 0u);
  const bool lo_ok = kTwoMul ? e4m3_bf16mul2_scale_ok(sc.lo) : e4m3_bf16mul_scale_ok(sc.lo);
  const bool hi_ok = kTwoMul ? e4m3_bf16mul2_scale_ok(sc.hi) : e4m3_bf16mul_scale_ok(sc.hi);
  return !e4m3_nan_any(nan) && lo_ok && (!nope_hi || hi_ok);
}

template <bool kTwoMul>
__device__ __forceinline__ void decode_entry_fast(const EntryLoads& e, int lane, LaneScales sc,
                                                  uint4& lo, uint4& hi) {
  const uint2 b = make_uint2(e.b.x, e.b.y);
  if constexpr (kTwoMul) {
    lo = e4m3x8_to_bf16x8_bf16mul2(e.a, sc.lo);
    hi = e4m3x8_to_bf16x8_bf16mul2(b, sc.hi);
  } else {
    lo = e4m3x8_to_bf16x8_bf16mul(e.a, sc.lo);
    hi = e4m3x8_to_bf16x8_bf16mul(b, sc.hi);
  }
  if (lane >= 24) hi = e.b;
}

__device__ __forceinline__ void decode_entry_slow(const EntryLoads& e, int lane, LaneScales sc,
                                                  uint4& lo, uint4& hi) {
  lo = decode8(e.a, sc.lo);
  hi = lane < 24 ? decode8(make_uint2(e.b.x, e.b.y), sc.hi) : e.b;
}

template <bool kTwoMul>
__device__ __forceinline__ void store_entry_route(uint16_t* out_row, const EntryLoads& e, int lane,
                                                  uint64_t pol) {
  const LaneScales sc = lane_scales(e, lane);
  uint4 lo, hi;
  decode_entry_fast<kTwoMul>(e, lane, sc, lo, hi);
  if (!entry_fast<kTwoMul>(e, lane, sc)) decode_entry_slow(e, lane, sc, lo, hi);
  st_v4_pol(out_row + 8 * lane, lo, pol);
  st_v4_pol(out_row + 256 + 8 * lane, hi, pol);
}

// The decode of gather_k.cu before commit 5effdc6: a route chosen for each 8-code chunk
// (decode8), one branch region per chunk.
__device__ __forceinline__ void store_entry_chunks(uint16_t* out_row, const EntryLoads& e, int lane,
                                                   uint64_t pol) {
  // written as store_entry was (scale bytes read in the calls): through lane_scales ptxas
  // schedules it slightly differently, and this variant stands for that kernel
  const int g = lane >> 3;
  st_v4_pol(out_row + 8 * lane, decode8(e.a, kv_record::group_scale_byte(e.scales, g)), pol);
  const uint4 hi = lane < 24 ? decode8(make_uint2(e.b.x, e.b.y), kv_record::group_scale_byte(e.scales, 4 + g))
                             : e.b;
  st_v4_pol(out_row + 256 + 8 * lane, hi, pol);
}

// The shipped decode_entry's route, but the fast results are stored before the route test,
// and lanes whose test fails store their chunks again, decoded by decode8 (their stores need
// not wait for the test).
__device__ __forceinline__ void store_entry_fix(uint16_t* out_row, const EntryLoads& e, int lane,
                                                uint64_t pol) {
  const LaneScales sc = lane_scales(e, lane);
  uint4 lo, hi;
  decode_entry_fast<true>(e, lane, sc, lo, hi);
  st_v4_pol(out_row + 8 * lane, lo, pol);
  st_v4_pol(out_row + 256 + 8 * lane, hi, pol);
  if (!entry_fast<true>(e, lane, sc)) {
    decode_entry_slow(e, lane, sc, lo, hi);
    st_v4_pol(out_row + 8 * lane, lo, pol);
    if (lane < 24) st_v4_pol(out_row + 256 + 8 * lane, hi, pol);  // RoPE lanes stored theirs
  }
}

// kRoute: 0 the shipped decode (store_entry: decode_entry), 1 store_entry_vote, 3 one route
// test per lane for the whole tile (two-multiply route), then the tile's eight stores,
// 4 store_entry_route<false> (one-multiply route per entry), 5 store_entry_chunks,
// 6 store_entry_fix.
// kPtrShfl: lanes 0-3 hand out the record addresses instead of the packed entries.
template <bool kDecode, bool kSimpleLookup, bool kSpec, bool kContig, bool kScaleFirst, int kRoute = 0,
          bool kPtrShfl = false>
__global__ void __launch_bounds__(32) tile_var(const GatherKParams p) {
  using namespace kv_record;
  copy_mark(0, 0u);
  const uint64_t pol = l2_policy_evict_first();
  const int lane = threadIdx.x;
  const int r = blockIdx.y;
  const int32_t* bt_row = p.block_table + static_cast<int64_t>(r) * p.bt_stride0;
  uint16_t* out_req = p.out + static_cast<int64_t>(r) * p.out_stride0;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarpEntries;
  const int64_t i = first + lane;
  int64_t packed = -1;
  if constexpr (kSimpleLookup) {
    const int n = p.seq_lens[r];
    if (lane < kWarpEntries && i < n) packed = (static_cast<int64_t>(bt_row[i / 64]) << 16) | (i % 64);
  } else if (kSpec && p.gather_lens == nullptr) {
    int64_t phys = -1;
    const int32_t blk = fast_div(static_cast<int32_t>(i), p.block_div);
    if (lane < kWarpEntries && blk < p.max_blocks) phys = bt_row[static_cast<int64_t>(blk) * p.bt_stride1];
    const int seq_len = p.seq_lens[r];
    if (lane < kWarpEntries && i < seq_len && p.offset + i < p.out_rows && phys >= 0 && phys < p.num_blocks) {
      packed = (phys << 16) | (i - static_cast<int64_t>(blk) * p.block_size);
    }
  } else {
    const int seq_len = p.seq_lens[r];
    const int gather_len = p.gather_lens != nullptr ? p.gather_lens[r] : seq_len;
    const int start = seq_len - gather_len;
    if (lane < kWarpEntries && i < gather_len) packed = resolve_entry(p, bt_row, start, i);
  }
  int64_t ep[kWarpEntries];
  uint64_t d[kWarpEntries], sc[kWarpEntries];  // kPtrShfl: the records' data and scale addresses
  bool fast = kContig && !kPtrShfl;
  if constexpr (kPtrShfl) {
    // lanes 0-3 turn their entry into its data and scale-word addresses; the warp receives
    // the addresses (two 64-bit shuffles per entry) instead of the packed entry, so that no
    // lane repeats the 64-bit page arithmetic of all four entries
    uint64_t dptr = 0, sptr = 0;
    if (packed >= 0) {
      const uint8_t* blk = block_base(p.cache, packed >> 16, p.block_stride);
      const int in_blk = static_cast<int>(packed & 0xFFFF);
      dptr = reinterpret_cast<uint64_t>(blk + data_offset(in_blk));
      sptr = reinterpret_cast<uint64_t>(blk + scale_offset(p.block_size, in_blk));
    }
#pragma unroll
    for (int j = 0; j < kWarpEntries; ++j) {
      d[j] = __shfl_sync(0xFFFFFFFFu, dptr, j);
      sc[j] = __shfl_sync(0xFFFFFFFFu, sptr, j);
      ep[j] = d[j] != 0 ? 0 : -1;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kWarpEntries; ++j) {
      ep[j] = __shfl_sync(0xFFFFFFFFu, packed, j);
      fast = fast && ep[0] >= 0 && ep[j] == ep[0] + j;
    }
  }
  EntryLoads e[kWarpEntries];
  if (kContig && fast) {
    __shared__ __align__(16) uint8_t s_data[kWarpEntries * kDataBytes];
    __shared__ __align__(16) uint2 s_scale[kWarpEntries];
    const int in_blk = static_cast<int>(ep[0] & 0xFFFF);
    const uint8_t* blk = block_base(p.cache, ep[0] >> 16, p.block_stride);
    const uint8_t* d = blk + data_offset(in_blk);
    uint4 v[4];
    uint4 vr = make_uint4(0u, 0u, 0u, 0u);
    uint2 sc = make_uint2(0u, 0u);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = ld_nc_v4_pol(d + 16 * (lane + 32 * k), pol);
    if (lane < 16) {
      vr = ld_nc_v4_pol(d + 16 * (128 + lane), pol);
    } else if (lane < 20) {
      sc = ld_nc_v2(blk + scale_offset(p.block_size, in_blk + lane - 16));
    }
    copy_mark(2, v[0].x ^ vr.x ^ sc.x);
#pragma unroll
    for (int k = 0; k < 4; ++k) reinterpret_cast<uint4*>(s_data)[lane + 32 * k] = v[k];
    if (lane < 16) {
      reinterpret_cast<uint4*>(s_data)[128 + lane] = vr;
    } else if (lane < 20) {
      s_scale[lane - 16] = sc;
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kWarpEntries; ++j) {
      const uint8_t* rec = s_data + j * kDataBytes;
      e[j].a = *reinterpret_cast<const uint2*>(rec + 8 * lane);
      if (lane < 24) {
        const uint2 t = *reinterpret_cast<const uint2*>(rec + 256 + 8 * lane);
        e[j].b = make_uint4(t.x, t.y, 0u, 0u);
      } else {
        e[j].b = *reinterpret_cast<const uint4*>(rec + kRopeOffset + 16 * (lane - 24));
      }
      e[j].scales = s_scale[j];
    }
  } else {
    if constexpr (kScaleFirst) {
#pragma unroll
      for (int j = 0; j < kWarpEntries; ++j) {
        if (ep[j] >= 0) {
          e[j].scales = ld_nc_v2(block_base(p.cache, ep[j] >> 16, p.block_stride) +
                                 scale_offset(p.block_size, static_cast<int>(ep[j] & 0xFFFF)));
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kWarpEntries; ++j) {
      if (ep[j] >= 0) {
        if constexpr (kScaleFirst) {  // the data as load_entry loads it, the scales already here
          const uint8_t* entry = block_base(p.cache, ep[j] >> 16, p.block_stride) +
                                 data_offset(static_cast<int>(ep[j] & 0xFFFF));
          e[j].a = ld_record_v2<true>(entry + 8 * lane, pol);
          if (lane < 24) {
            const uint2 t = ld_record_v2<true>(entry + 256 + 8 * lane, pol);
            e[j].b = make_uint4(t.x, t.y, 0u, 0u);
          } else {
            e[j].b = ld_record_v4<true>(entry + kRopeOffset + 16 * (lane - 24), pol);
          }
        } else if constexpr (kPtrShfl) {
          e[j] = load_entry<true>(reinterpret_cast<const uint8_t*>(d[j]),
                                  reinterpret_cast<const uint8_t*>(sc[j]), lane, pol);
        } else {
          e[j] = load_packed<true>(p, ep[j], lane, pol);
        }
      }
    }
    uint32_t dep = 0;
#pragma unroll
    for (int j = 0; j < kWarpEntries; ++j) {
      if (ep[j] >= 0) dep ^= e[j].a.x ^ e[j].b.x ^ e[j].scales.x;
    }
    copy_mark(2, dep);
  }
  if constexpr (kDecode && kRoute == 3) {
    uint4 lo[kWarpEntries], hi[kWarpEntries];
    bool fast = true;
#pragma unroll
    for (int j = 0; j < kWarpEntries; ++j) {
      const LaneScales sc = lane_scales(e[j], lane);
      decode_entry_fast<true>(e[j], lane, sc, lo[j], hi[j]);
      fast = fast && (ep[j] < 0 || entry_fast<true>(e[j], lane, sc));
    }
    if (!fast) {
#pragma unroll
      for (int j = 0; j < kWarpEntries; ++j) decode_entry_slow(e[j], lane, lane_scales(e[j], lane), lo[j], hi[j]);
    }
#pragma unroll
    for (int j = 0; j < kWarpEntries; ++j) {
      if (ep[j] >= 0) {
        uint16_t* row = out_req + (p.offset + first + j) * p.out_stride1;
        st_v4_pol(row + 8 * lane, lo[j], pol);
        st_v4_pol(row + 256 + 8 * lane, hi[j], pol);
      }
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kWarpEntries; ++j) {
    if (ep[j] >= 0) {
      uint16_t* row = out_req + (p.offset + first + j) * p.out_stride1;
      if constexpr (kDecode && kRoute == 1) {
        store_entry_vote(row, e[j], lane, pol);
      } else if constexpr (kDecode && kRoute == 6) {
        store_entry_fix(row, e[j], lane, pol);
      } else if constexpr (kDecode && kRoute == 5) {
        store_entry_chunks(row, e[j], lane, pol);
      } else if constexpr (kDecode && kRoute == 4) {
        store_entry_route<false>(row, e[j], lane, pol);
      } else if constexpr (kDecode) {
        store_entry<false, true>(row, e[j], lane, pol);
      } else {
        store_raw(row, e[j], lane, pol);
      }
    }
  }
}

__global__ void fill_cache(uint8_t* cache, int64_t pages, uint32_t seed) {
  const int64_t n = pages * kPageStride;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    const int64_t off = i % kPageStride;
    uint8_t b = static_cast<uint8_t>(h);
    if (off < kBlockSize * 576) {
      if (off % 576 < 448 && (b & 0x7F) == 0x7F) b -= 1;      // no NaN codes
    } else if (off < kBlockSize * 584) {
      const int k = static_cast<int>((off - kBlockSize * 576) % 8);
      b = k == 7 ? 0 : static_cast<uint8_t>(110 + h % 26);  // UE8M0 110..135, pad 0
    }
    cache[i] = b;
  }
}

__global__ void fill_words(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = h;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class F>
double graph_time_us(const std::vector<F>& calls, cudaStream_t st) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  const int n = 20;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < n; ++i) calls[i % calls.size()](st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, st));
  std::vector<double> ts;
  for (int i = 0; i < 30; ++i) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1000.0 / n);
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return median(ts);
}

struct Block {
  double start, lookup, loaded;
  int sm;
};

// Reads a timeline, prints its summary. bytes_per_block: bytes the block moves (read + write).
void report(const char* what, const std::vector<unsigned long long>& tl, int64_t blocks,
            double bytes_per_block, double call_us, double ceiling_gbps, int sms) {
  if (tl.empty()) {  // timing build: the graph-replayed time only
    std::printf("== %s: %.1f MB per call; graph-replayed %.2f us = %.1f%% of %.0f GB/s\n", what,
                blocks * bytes_per_block / 1e6, call_us,
                100.0 * blocks * bytes_per_block / (call_us * 1e3) / ceiling_gbps, ceiling_gbps);
    return;
  }
  std::vector<Block> bl(blocks);
  unsigned long long t0 = ~0ull;
  for (int64_t b = 0; b < blocks; ++b) t0 = std::min(t0, tl[4 * b]);
  std::vector<unsigned long long> stamps;
  for (int64_t b = 0; b < blocks; ++b) {
    bl[b] = {(tl[4 * b] - t0) / 1e3, tl[4 * b + 1] ? (tl[4 * b + 1] - t0) / 1e3 : -1,
             (tl[4 * b + 2] - t0) / 1e3, static_cast<int>(tl[4 * b + 3])};
    stamps.push_back(tl[4 * b]);
    stamps.push_back(tl[4 * b + 2]);
  }
  std::sort(stamps.begin(), stamps.end());
  stamps.erase(std::unique(stamps.begin(), stamps.end()), stamps.end());
  unsigned long long res = ~0ull;
  for (size_t i = 1; i < stamps.size(); ++i) res = std::min(res, stamps[i] - stamps[i - 1]);
  std::vector<double> starts, loaded;
  for (auto& x : bl) { starts.push_back(x.start); loaded.push_back(x.loaded); }
  std::sort(starts.begin(), starts.end());
  std::sort(loaded.begin(), loaded.end());
  const double span = loaded.back();
  std::printf("\n== %s: %lld blocks, %.1f MB per call; graph-replayed %.2f us = %.1f%% of %.0f GB/s; "
              "timeline span (first start -> last loads arrived) %.2f us; timer step %llu ns\n",
              what, static_cast<long long>(blocks), blocks * bytes_per_block / 1e6, call_us,
              100.0 * blocks * bytes_per_block / (call_us * 1e3) / ceiling_gbps, ceiling_gbps, span, res);
  std::printf("   SMs used: %d\n", [&] {
    std::vector<int> seen(1024, 0);
    int n = 0;
    for (auto& x : bl) if (x.sm < 1024 && !seen[x.sm]++) ++n;
    return n;
  }());
  std::printf("   blocks started by (us):");
  for (double f : {0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0}) {
    const size_t k = std::min(starts.size() - 1, static_cast<size_t>(f * starts.size()));
    std::printf(" %g%%:%.2f", 100 * f, starts[k]);
  }
  std::printf("\n   first loads arrived at %.2f us; the first %d blocks (one per resident slot, 32/SM) "
              "started by %.2f us\n", loaded.front(), 32 * sms,
              starts[std::min<size_t>(starts.size() - 1, 32 * sms - 1)]);
  // 1 us bins over [0, span]: blocks started, blocks whose loads arrived, their mean latency
  const int nb = static_cast<int>(span) + 1;
  std::vector<double> started(nb, 0), arrived(nb, 0), lat(nb, 0), look(nb, 0);
  std::vector<int> latn(nb, 0), lookn(nb, 0);
  for (auto& x : bl) {
    const int s = std::min(nb - 1, static_cast<int>(x.start));
    started[s] += 1;
    arrived[std::min(nb - 1, static_cast<int>(x.loaded))] += 1;
    lat[s] += x.loaded - x.start;
    latn[s] += 1;
    if (x.lookup >= 0) { look[s] += x.lookup - x.start; lookn[s] += 1; }
  }
  std::vector<double> rate(nb);
  for (int i = 0; i < nb; ++i) rate[i] = arrived[i] * bytes_per_block / 1e3;  // GB/s (bytes per ns)
  std::vector<double> full(rate.begin(), rate.end());
  std::sort(full.begin(), full.end());
  const double steady = full[full.size() * 3 / 4];
  int ramp = 0, tail = nb;
  while (ramp < nb && rate[ramp] < 0.9 * steady) ++ramp;
  while (tail > 0 && rate[tail - 1] < 0.9 * steady) --tail;
  std::printf("   steady rate (75th pct of 1 us bins) %.0f GB/s = %.1f%% of the ceiling; ramp to 90%%: %d us; "
              "below 90%% after %d us (tail %.2f us)\n",
              steady, 100 * steady / ceiling_gbps, ramp, tail, span - tail);
  std::printf("   us  | started | loads arrived | GB/s moved by arrivals | mean load latency of blocks started (us)%s\n",
              lookn[0] ? " | mean lookup latency" : "");
  for (int i = 0; i < nb; ++i) {
    std::printf("   %3d | %7.0f | %13.0f | %6.0f | %6.2f", i, started[i], arrived[i], rate[i],
                latn[i] ? lat[i] / latn[i] : 0.0);
    if (lookn[0]) std::printf(" | %6.2f", lookn[i] ? look[i] / lookn[i] : 0.0);
    std::printf("\n");
  }
}


// SM-persistent forms (diagnostic, 2026-11-30 22:42 UTC session): kSmWarps-warp blocks, two per
// SM (grid 2 x SMs), whose warps pull tiles one at a time through a shared-memory counter.
// kContig: each block's tiles are one contiguous range (the tiles in flight on an SM then come
// from a few cache pages and one output region); else tile k * gridDim.x + blockIdx.x
// (interleaved across blocks, like the one-tile-per-block grid's concurrent tiles).
constexpr int kSmWarps = 16;
// The warp's next tile, pulled through the block's counter (lane 0 increments it), or -1 when
// the block's share of `tiles` is done.
template <bool kContig>
__device__ __forceinline__ int64_t sm_next_tile(int* next, int lane, int64_t tiles) {
  const int64_t share = (tiles + gridDim.x - 1) / gridDim.x;
  int k = 0;
  if (lane == 0) k = atomicAdd(next, 1);
  k = __shfl_sync(0xFFFFFFFFu, k, 0);
  if (k >= share) return -1;
  const int64_t t = kContig ? static_cast<int64_t>(blockIdx.x) * share + k
                            : static_cast<int64_t>(k) * gridDim.x + blockIdx.x;
  return t < tiles ? t : -1;
}

// the paged copy with the chain (paged_kernel<true, true, true>'s body), SM-persistent
template <bool kContig>
__global__ void __launch_bounds__(kSmWarps * 32) paged_sm_kernel(const uint8_t* cache, const int32_t* table,
                                                               const int32_t* lens, uint4* dst,
                                                               int64_t entries) {
  __shared__ int s_next;
  __shared__ uint4 s_buf[kSmWarps][160];
  if (threadIdx.x == 0) s_next = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  uint4* sm = s_buf[threadIdx.x >> 5];
  const int64_t tiles = (entries + 3) / 4;
  const uint64_t pol = l2_policy_evict_first();
  for (int64_t t; (t = sm_next_tile<kContig>(&s_next, lane, tiles)) >= 0;) {
    const int n = lens[0];
    if (4 * t >= n) continue;
    paged_tile_copy<true>(cache + static_cast<int64_t>(table[t / 16]) * kPageStride, t, lane, pol, dst, sm);
  }
}

// the shipped tile (gather_tile of csrc/cache/gather_k.cu), SM-persistent, one request
template <bool kContig>
__global__ void __launch_bounds__(kSmWarps * 32, 2) gather_sm_kernel(const GatherKParams p) {
  __shared__ int s_next;
  if (threadIdx.x == 0) s_next = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t tiles = (p.out_rows - p.offset + 3) / 4;
  const uint64_t pol = l2_policy_evict_first();
  for (int64_t t; (t = sm_next_tile<kContig>(&s_next, lane, tiles)) >= 0;) {
    gather_tile<true>(p, 0, t * 4, lane, pol);
  }
}


// The shipped tile with the block -> tile order permuted (diagnostic): block b takes tile
// (b mod kWays) * (tiles / kWays) + b / kWays, so that the blocks in flight at one time (about
// 4,224 consecutive block indices) draw from kWays regions of the request instead of one window
// of consecutive tiles. Needs tiles % kWays == 0 (one request).
template <int kWays>
__global__ void __launch_bounds__(32, 32) gather_perm_kernel(const GatherKParams p) {
  const int64_t tiles = (p.out_rows - p.offset + 3) / 4;
  const int64_t b = blockIdx.x;
  const int64_t t = (b % kWays) * (tiles / kWays) + b / kWays;
  gather_tile<true>(p, 0, t * 4, threadIdx.x, l2_policy_evict_first());
}


// The tile with its records in shared memory (diagnostic, 2026-11-30 22:42 UTC session): blocks
// of kAsyncWarps warps, one tile per warp; the warp copies its four records (4 x 36 16-byte
// chunks) and scale words into shared memory by cp.async, waits, then decodes each entry from
// shared memory with the shipped decode and stores. No record data lives in registers while
// in flight, so the kernel needs fewer registers and more warps fit on an SM (kMinBlocks).
// kPol: the copies carry the evict_first policy (else only the L2::256B prefetch size).
template <bool kPol>
__device__ __forceinline__ void cp_async16_rec(uint32_t dst, const void* src, uint64_t pol) {
  if constexpr (kPol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "l"(pol) : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
  }
}
template <bool kPol, int kAsyncWarps, int kMinBlocks>
__global__ void __launch_bounds__(kAsyncWarps * 32, kMinBlocks) tile_async_kernel(const GatherKParams p) {
  using namespace kv_record;
  __shared__ __align__(16) uint8_t s_rec[kAsyncWarps][kWarpEntries * kDataBytes];
  __shared__ __align__(16) uint2 s_sc[kAsyncWarps][kWarpEntries];
  const int lane = threadIdx.x & 31;
  const int w = threadIdx.x >> 5;
  const uint64_t pol = l2_policy_evict_first();
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kAsyncWarps + w) * kWarpEntries;
  const int seq_len = p.seq_lens[0];
  const int gather_len = p.gather_lens != nullptr ? p.gather_lens[0] : seq_len;
  const int start = seq_len - gather_len;
  const int64_t i = first + lane;
  int64_t packed = -1;
  if (lane < kWarpEntries && i < gather_len) packed = resolve_entry(p, p.block_table, start, i);
  const uint8_t* dptr = nullptr;
  if (packed >= 0) dptr = block_base(p.cache, packed >> 16, p.block_stride) + data_offset(static_cast<int>(packed & 0xFFFF));
  if (lane < kWarpEntries && packed >= 0) {
    const uint8_t* sp = block_base(p.cache, packed >> 16, p.block_stride) +
                        scale_offset(p.block_size, static_cast<int>(packed & 0xFFFF));
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&s_sc[w][lane]));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(sp) : "memory");
  }
  const uint32_t rec0 = static_cast<uint32_t>(__cvta_generic_to_shared(&s_rec[w][0]));
  bool has[kWarpEntries];
#pragma unroll
  for (int j = 0; j < kWarpEntries; ++j) {
    const uint8_t* d = reinterpret_cast<const uint8_t*>(__shfl_sync(0xFFFFFFFFu, reinterpret_cast<uint64_t>(dptr), j));
    has[j] = d != nullptr;
    // 36 chunks of 16 bytes per record: lanes 0-31 chunks 0-31, lanes 0-3 chunks 32-35
    if (has[j]) {
      cp_async16_rec<kPol>(rec0 + j * kDataBytes + 16 * lane, d + 16 * lane, pol);
      if (lane < 4) cp_async16_rec<kPol>(rec0 + j * kDataBytes + 512 + 16 * lane, d + 512 + 16 * lane, pol);
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncwarp();
  uint16_t* out_req = p.out;
#pragma unroll
  for (int j = 0; j < kWarpEntries; ++j) {
    if (!has[j]) continue;
    const uint8_t* rec = s_rec[w] + j * kDataBytes;
    EntryLoads e;
    e.a = *reinterpret_cast<const uint2*>(rec + 8 * lane);
    if (lane < 24) {
      const uint2 t = *reinterpret_cast<const uint2*>(rec + 256 + 8 * lane);
      e.b = make_uint4(t.x, t.y, 0u, 0u);
    } else {
      e.b = *reinterpret_cast<const uint4*>(rec + kRopeOffset + 16 * (lane - 24));
    }
    e.scales = s_sc[w][j];
    store_entry<false, true>(out_req + (p.offset + first + j) * p.out_stride1, e, lane, pol);
  }
}

}  // namespace gtl

int main(int argc, char** argv) {
  using namespace gtl;
  const int64_t entries = argc > 1 ? std::atoll(argv[1]) : 49152;
  const int reqs = argc > 2 ? std::atoi(argv[2]) : 1;
  int dev = 0, sms = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // copy ceiling: a 2 GiB device-to-device copy, eager, best of 10
  double ceiling = 0;
  {
    const size_t n = size_t(2) << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemsetAsync(a, 1, n, st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 12; ++i) {
      CK(cudaEventRecord(e0, st));
      CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 2) ceiling = std::max(ceiling, 2.0 * n / (ms * 1e6));
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
  }

  // gather sets: like bench_cache.make_gather_set (random page permutation, table wider than
  // the request), enough sets that a replay's working set exceeds twice the L2
  const int64_t bpr = (entries + kBlockSize - 1) / kBlockSize;
  const int64_t nb = reqs * bpr + 8;
  const double per_set = double(reqs) * entries * (584 + 1024);
  const int sets = std::max<int>(2, static_cast<int>(2.0 * l2 / per_set) + 1);
  const int width = static_cast<int>(bpr + 16);
  std::mt19937 rng(static_cast<uint32_t>(time(nullptr)));
  struct Set { uint8_t* cache; int32_t* table; int32_t* lens; uint16_t* out; };
  std::vector<Set> gs(sets);
  for (int s = 0; s < sets; ++s) {
    CK(cudaMalloc(&gs[s].cache, nb * kPageStride));
    fill_cache<<<1024, 256, 0, st>>>(gs[s].cache, nb, rng());
    std::vector<int32_t> perm(nb);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> table(size_t(reqs) * width);
    for (int r = 0; r < reqs; ++r)
      for (int c = 0; c < width; ++c)
        table[size_t(r) * width + c] = c < bpr ? perm[r * bpr + c] : static_cast<int32_t>(rng() % nb);
    CK(cudaMalloc(&gs[s].table, table.size() * 4));
    CK(cudaMemcpy(gs[s].table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> lens(reqs, static_cast<int32_t>(entries));
    CK(cudaMalloc(&gs[s].lens, reqs * 4));
    CK(cudaMemcpy(gs[s].lens, lens.data(), reqs * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&gs[s].out, size_t(reqs) * entries * 1024));
  }
  DeviceLimits lim = DeviceLimits::query(dev);
  auto gparams = [&](const Set& s) {
    GatherKParams p{};
    p.out = s.out;
    p.out_stride0 = entries * 512;
    p.out_stride1 = 512;
    p.out_rows = entries;
    p.cache = s.cache;
    p.block_stride = kPageStride;
    p.num_blocks = nb;
    p.seq_lens = s.lens;
    p.gather_lens = nullptr;
    p.block_table = s.table;
    p.bt_stride0 = width;
    p.bt_stride1 = 1;
    p.max_blocks = width;
    p.block_size = kBlockSize;
    p.offset = 0;
    p.num_reqs = reqs;
    p.block_div = make_fast_div(kBlockSize);  // launch_gather_k sets it itself; the variants read it
    return p;
  };
  using Call = std::function<void(cudaStream_t)>;
  std::vector<Call> gcalls;
  for (int s = 0; s < sets; ++s) gcalls.push_back([&, s](cudaStream_t t) { launch_gather_k(gparams(gs[s]), lim, t); });

  // copy and widen sets with the gather's bytes per call
  const int64_t cblocks = static_cast<int64_t>(per_set / 8192);
  const int64_t wrows = static_cast<int64_t>(reqs) * entries;
  const int64_t wblocks = (wrows + 3) / 4;
  std::vector<std::pair<uint4*, uint4*>> cs(sets), ws(sets);
  for (int s = 0; s < sets; ++s) {
    CK(cudaMalloc(&cs[s].first, cblocks * 4096));
    CK(cudaMalloc(&cs[s].second, cblocks * 4096));
    fill_words<<<1024, 256, 0, st>>>(reinterpret_cast<uint32_t*>(cs[s].first), cblocks * 1024, rng());
    CK(cudaMalloc(&ws[s].first, wblocks * 4 * 584 + 64));
    CK(cudaMalloc(&ws[s].second, wblocks * 4 * 1024));
    fill_words<<<1024, 256, 0, st>>>(reinterpret_cast<uint32_t*>(ws[s].first), wblocks * 584, rng());
  }
  std::vector<Call> ccalls, wcalls;
  for (int s = 0; s < sets; ++s) {
    ccalls.push_back([&, s](cudaStream_t t) { copy_kernel<<<cblocks, 32, 0, t>>>(cs[s].first, cs[s].second, cblocks); });
    wcalls.push_back([&, s](cudaStream_t t) { widen_kernel<<<wblocks, 32, 0, t>>>(ws[s].first, ws[s].second, wrows); });
  }
  CK(cudaStreamSynchronize(st));

  std::printf("GPU: %d SMs, L2 %d MB, copy ceiling %.0f GB/s (2 GiB cudaMemcpy, best of 10); "
              "%d x %lld entries, %d input sets\n", sms, l2 >> 20, ceiling, reqs,
              static_cast<long long>(entries), sets);
  // warm the clocks
  for (int i = 0; i < 200; ++i) gcalls[i % sets](st);
  CK(cudaStreamSynchronize(st));

  const int64_t gblocks = static_cast<int64_t>(reqs) * ((entries + 3) / 4);
  unsigned long long* tl;
  const int64_t tl_blocks = std::max({gblocks, cblocks, wblocks});
  CK(cudaMalloc(&tl, tl_blocks * 4 * 8));

  auto timeline_of = [&](std::vector<Call>& calls, bool gather, int64_t blocks) {
    unsigned long long* null_ptr = nullptr;
    // timed without the timeline writes
    CK(cudaMemcpyToSymbol(g_gather_timeline, &null_ptr, sizeof(null_ptr)));
    CK(cudaMemcpyToSymbol(g_copy_timeline, &null_ptr, sizeof(null_ptr)));
    const double us = graph_time_us(calls, st);
#ifdef GTL_NO_MARKS
    return std::make_pair(us, std::vector<unsigned long long>());
#endif
    CK(cudaMemsetAsync(tl, 0, blocks * 4 * 8, st));
    for (int i = 0; i < 2 * sets; ++i) calls[i % sets](st);  // L2 holds other sets' lines
    if (gather) CK(cudaMemcpyToSymbol(g_gather_timeline, &tl, sizeof(tl)));
    else CK(cudaMemcpyToSymbol(g_copy_timeline, &tl, sizeof(tl)));
    calls[0](st);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    std::vector<unsigned long long> h(blocks * 4);
    CK(cudaMemcpy(h.data(), tl, h.size() * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpyToSymbol(g_gather_timeline, &null_ptr, sizeof(null_ptr)));
    CK(cudaMemcpyToSymbol(g_copy_timeline, &null_ptr, sizeof(null_ptr)));
    return std::make_pair(us, h);
  };
  auto g = timeline_of(gcalls, true, gblocks);
  report("gather (shipped tile kernel)", g.second, gblocks, 4 * 1608.0, g.first, ceiling, sms);
  auto c = timeline_of(ccalls, false, cblocks);
  report("copy, same bytes (4 KB in, 4 KB out per block)", c.second, cblocks, 8192.0, c.first, ceiling, sms);
  auto w = timeline_of(wcalls, false, wblocks);
  report("widen, 4 x 584 -> 4 x 1024 contiguous per block", w.second, wblocks, 4 * 1608.0, w.first, ceiling, sms);
  if (reqs == 1) {
    // TL_ONLY=a,b: time only the variants whose description contains one of these words
    const char* only = std::getenv("TL_ONLY");
    auto wanted = [&](const char* what) {
      if (only == nullptr || *only == 0) return true;
      std::string list(only);
      size_t at = 0;
      while (at <= list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const std::string word = list.substr(at, comma - at);
        if (!word.empty() && std::string(what).find(word) != std::string::npos) return true;
        at = comma + 1;
      }
      return false;
    };
    // the gather's traffic without the decode (paged_kernel), on the gather's input sets
    auto paged = [&](auto kern, const char* what, bool linear_table) {
      if (!wanted(what)) return;
      std::vector<Call> calls;
      for (int s = 0; s < sets; ++s) {
        calls.push_back([&, s, kern](cudaStream_t t) {
          kern<<<gblocks, 32, 0, t>>>(gs[s].cache, gs[s].table, gs[s].lens,
                                      reinterpret_cast<uint4*>(gs[s].out), entries);
        });
      }
      (void)linear_table;
      auto r = timeline_of(calls, false, gblocks);
      report(what, r.second, gblocks, 4 * 1608.0, r.first, ceiling, sms);
    };
    // the shipped launcher's output of input set 0: every decoding variant must match it
    const size_t out_bytes = static_cast<size_t>(entries) * 1024;
    std::vector<unsigned char> ref(out_bytes), got(out_bytes);
    CK(cudaMemsetAsync(gs[0].out, 0xFF, out_bytes, st));
    gcalls[0](st);
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(ref.data(), gs[0].out, out_bytes, cudaMemcpyDeviceToHost));
    // a decoding variant: launch(set, stream) runs it on one input set; its output on set 0 is
    // compared with the shipped launcher's, then it is timed like the others
    auto check_and_time = [&](const char* what, std::function<void(int, cudaStream_t)> launch) {
      CK(cudaMemsetAsync(gs[0].out, 0xFF, out_bytes, st));
      launch(0, st);
      CK(cudaStreamSynchronize(st));
      CK(cudaGetLastError());
      CK(cudaMemcpy(got.data(), gs[0].out, out_bytes, cudaMemcpyDeviceToHost));
      size_t diff = 0;
      for (size_t k = 0; k < out_bytes; ++k) diff += got[k] != ref[k];
      std::printf("== output of \"%s\": %s (%zu of %zu bytes differ from the shipped gather)\n", what,
                  diff == 0 ? "identical" : "DIFFERS", diff, out_bytes);
      std::vector<Call> calls;
      for (int s = 0; s < sets; ++s) calls.push_back([launch, s](cudaStream_t t) { launch(s, t); });
      auto r = timeline_of(calls, false, gblocks);
      report(what, r.second, gblocks, 4 * 1608.0, r.first, ceiling, sms);
    };
    auto clone = [&](auto kern, const char* what) {
      if (!wanted(what)) return;
      check_and_time(what, [&, kern](int s, cudaStream_t t) {
        kern<<<dim3(static_cast<unsigned>(gblocks), 1), 32, 0, t>>>(gparams(gs[s]));
      });
    };
    // SM-persistent forms: two blocks of kSmWarps warps per SM
    auto sm_paged = [&](auto kern, const char* what) {
      if (!wanted(what)) return;
      std::vector<Call> calls;
      for (int s = 0; s < sets; ++s) {
        calls.push_back([&, s, kern](cudaStream_t t) {
          kern<<<2 * sms, kSmWarps * 32, 0, t>>>(gs[s].cache, gs[s].table, gs[s].lens,
                                                 reinterpret_cast<uint4*>(gs[s].out), entries);
        });
      }
      auto r = timeline_of(calls, false, gblocks);
      report(what, r.second, gblocks, 4 * 1608.0, r.first, ceiling, sms);
    };
    auto sm_gather = [&](auto kern, const char* what) {
      if (!wanted(what)) return;
      check_and_time(what, [&, kern](int s, cudaStream_t t) {
        kern<<<2 * sms, kSmWarps * 32, 0, t>>>(gparams(gs[s]));
      });
    };
    if (entries % 64 == 0) {
      clone(gather_perm_kernel<4>, "tile order: blocks spread over 4 regions");
      clone(gather_perm_kernel<16>, "tile order: blocks spread over 16 regions");
    }
    // the shipped tile kernel (one tile per block) with fewer resident blocks per SM: unused
    // dynamic shared memory per block (TL_PAD_BLOCKS="28 24 ...": target blocks per SM)
    if (const char* pads = std::getenv("TL_PAD_BLOCKS")) {
      int smem_sm = 0;
      CK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
      std::string list(pads);
      size_t at = 0;
      while (at < list.size()) {
        const size_t sp = std::min(list.find(' ', at), list.size());
        const int want = std::atoi(list.substr(at, sp - at).c_str());
        at = sp + 1;
        if (want <= 0) continue;
        // reserved 1 KB per block; the largest pad that still fits `want` blocks
        const int pad = smem_sm / want - 1024;
        auto kern = gather_k_warp_kernel<true, false>;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, pad));
        int resident = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kern, 32, pad));
        char what[160];
        std::snprintf(what, sizeof what, "shipped tile kernel, %d resident blocks per SM (%d B unused shared memory per block)",
                      resident, pad);
        std::vector<Call> calls;
        for (int s = 0; s < sets; ++s) {
          calls.push_back([&, s, kern, pad](cudaStream_t t) {
            GatherKParams q = gparams(gs[s]);
            kern<<<dim3(static_cast<unsigned>(gblocks), 1), 32, pad, t>>>(q);
          });
        }
        auto r = timeline_of(calls, false, gblocks);
        report(what, r.second, gblocks, 4 * 1608.0, r.first, ceiling, sms);
      }
    }
    // records through shared memory by cp.async, two warps per block
    auto async_clone = [&](auto kern, int warps, const char* what) {
      if (!wanted(what)) return;
      const unsigned ablocks = static_cast<unsigned>((gblocks + warps - 1) / warps);
      check_and_time(what, [&, kern, ablocks, warps](int s, cudaStream_t t) {
        kern<<<ablocks, warps * 32, 0, t>>>(gparams(gs[s]));
      });
    };
    async_clone(tile_async_kernel<true, 1, 32>, 1, "async tile: cp.async records, 1 warp per block (32 warps per SM), evict_first");
    async_clone(tile_async_kernel<true, 2, 24>, 2, "async tile: cp.async records, 2 warps per block (48 warps per SM), evict_first");
    async_clone(tile_async_kernel<true, 2, 32>, 2, "async tile: cp.async records, 2 warps per block (64 warps per SM, spills), evict_first");
    async_clone(tile_async_kernel<false, 2, 24>, 2, "async tile: cp.async records, 2 warps per block (48 warps per SM), no policy");
    sm_paged(paged_sm_kernel<true>, "sm-persistent paged copy (chain, no decode), contiguous ranges");
    sm_paged(paged_sm_kernel<false>, "sm-persistent paged copy (chain, no decode), interleaved tiles");
    sm_gather(gather_sm_kernel<true>, "sm-persistent gather tile, contiguous ranges");
    sm_gather(gather_sm_kernel<false>, "sm-persistent gather tile, interleaved tiles");
    // <kDecode, kSimpleLookup, kSpec, kContig, kScaleFirst>
    clone(tile_var<true, false, false, false, false>, "tile, one per block (the shipped tile)");
    clone(tile_var<false, false, false, false, false>, "tile without the decode (raw bytes stored)");
    clone(tile_var<true, true, false, false, false>, "tile with the simple lookup");
    clone(tile_var<false, true, false, false, false>, "tile with the simple lookup, without the decode");
    clone(tile_var<true, false, true, false, false>, "tile: block table next to seq_lens");
    clone(tile_var<true, false, false, true, false>, "tile: tile-contiguous loads");
    clone(tile_var<true, false, false, false, true>, "tile: scale words loaded first");
    clone(tile_var<true, false, true, true, false>, "tile: block table next to seq_lens, contiguous loads");
    clone(tile_var<true, false, false, false, false, 1>, "tile: one warp vote per entry for the decode route");
    clone(tile_var<true, false, false, false, false, 5>, "tile: a decode route per chunk (shipped before commit 5effdc6)");
    clone(tile_var<true, false, false, false, false, 0, true>, "tile: record addresses shuffled from lanes 0-3");
    clone(tile_var<true, false, false, false, false, 6>, "tile: fast chunks stored before the route test, fixed after");
    clone(tile_var<true, false, false, false, false, 4>, "tile: route per lane and entry, one-multiply bf16");
    clone(tile_var<true, false, false, false, false, 3>, "tile: route per lane and tile, two-multiply bf16");
    clone(tile_var<true, false, false, false, false, 0>, "tile, one per block (the shipped tile, again)");
    paged(paged_kernel<false, false, false>, "paged: linear pages, data only", true);
    paged(paged_kernel<true, false, false>, "paged: linear pages, data + scale words", true);
    paged(paged_kernel<false, true, false>, "paged: random pages (block table), data only", false);
    paged(paged_kernel<true, true, false>, "paged: random pages, data + scale words", false);
    paged(paged_kernel<true, true, true>, "paged: random pages, data + scale, seq_lens -> table chain (the gather without decode)", false);
  }
  return 0;
}
