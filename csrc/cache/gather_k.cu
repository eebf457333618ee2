// dequantize_and_gather_k_cache for SM80+: V4 584-byte records -> bf16 rows [.., 512].
//
// One warp per entry, so every load and store instruction of a warp touches one
// contiguous span: lane L writes output values [8L, 8L+8) and [256+8L, 256+8L+8)
// (two 512-byte coalesced 16-byte stores per warp), reading NoPE codes [8L, 8L+8) and
// [256+8L, ..) (8-byte loads) or, for L >= 24, RoPE values [8(L-24), ..) (16-byte loads).
// The 8 scale bytes of the entry are one broadcast 8-byte load.
//
// Default layout (gather_k_warp_kernel): blocks of one warp, each gathering tiles of four
// consecutive entries: lanes 0-3 look up the tile's block-table entries, the warp issues
// the loads of all four records, then writes the four rows. The grid is one block per
// tile, capped at 64 waves of resident blocks on the SM count. This is the shape of the
// fastest portable record -> row copy we measured (one Triton program of one warp per four
// records, 80% of copy bandwidth on the H200); it is 1-4% faster than the earlier
// persistent layout below (same-run A/Bs, 2026-11-30 16:53 and 16:57 UTC).
//
// Persistent layout ($DEEPINFER_GATHER_LAYOUT=persistent, and the benchmark knobs below):
// the block-table lookups for the next 32 entries of a warp are done up front, one per
// lane, and handed out with shuffles; each iteration issues the loads of kInFlight entries
// (default 4) before any store. The grid is (blocks per request, requests), sized from the
// SM count and the kernel's occupancy so that the whole GPU is covered once.
//
// Both layouts: the record loads carry the L2::256B prefetch-size hint (an entry's 576
// data bytes span 2-3 aligned 256-byte blocks, read by three load instructions of the
// warp): 0.4-1.6% faster than without it in four same-run comparisons on the H200
// (2026-11-29). Record loads and output stores also carry an L2 evict_first policy (each
// byte is touched once; 1-2.4% faster in two same-run comparisons on the H200, 2026-11-30;
// kEvictFirst below).
//
// Decode: e4m3 -> bf16 with the UE8M0 scale folded in, exact (common/fp8_e4m3.cuh). Each
// lane decodes its 16 codes of an entry by two bf16x2 multiplies per code pair
// (e4m3x8_to_bf16x8_bf16mul2, scale bytes 10..246) as straight-line code, unless one of them
// is a NaN code or a scale byte is outside that range (decode_entry); then, per 8-code
// chunk (decode8): scale bytes 10..134, one bf16x2 multiply (e4m3x4_to_bf16x4_bf16mul);
// other bytes in [1, 246], fp16 -> fp32 and one fp32 multiply (e4m3x4_to_bf16x4_scaled);
// chunks holding a NaN code and the remaining scale bytes, the scalar path. All routes give
// the bits of "fp32 decode * 2^(s-127), RNE to bf16" (upstream's Triton kernel).
#include <cuda_runtime.h>

#include "cache/cache_kernels.h"
#include "common/env_knob.h"
#include "common/fp8_e4m3.cuh"
#include "common/kv_record.cuh"
#include "common/ue8m0.cuh"
#include "common/vec.cuh"

namespace deepinfer_sm80 {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int kWarpEntries = 4;  // entries per tile of gather_k_warp_kernel
constexpr int kWarpWaves = 64;   // its grid cap, in waves of resident blocks

// 8 codes (one 64-bit chunk) of a group with scale byte s -> 8 bf16 (one uint4).
__device__ __forceinline__ uint4 decode8(uint2 codes, uint32_t s) {
  const bool no_nan = !e4m3x4_has_nan(codes.x) && !e4m3x4_has_nan(codes.y);
  if (e4m3_bf16mul_scale_ok(s) && no_nan) return e4m3x8_to_bf16x8_bf16mul(codes, s);
  if (e4m3_fast_scale_ok(s) && no_nan) {
    const float mult = e4m3_fast_multiplier(s);
    return e4m3x8_with(codes, [&](uint32_t w, __nv_bfloat162& lo, __nv_bfloat162& hi) {
      e4m3x4_to_bf16x4_scaled(w, mult, lo, hi);
    });
  }
  const float scale = ue8m0_to_float(s);
  return e4m3x8_with(codes, [&](uint32_t w, __nv_bfloat162& lo, __nv_bfloat162& hi) {
    lo = __floats2bfloat162_rn(e4m3_to_float(w & 0xFFu) * scale, e4m3_to_float((w >> 8) & 0xFFu) * scale);
    hi = __floats2bfloat162_rn(e4m3_to_float((w >> 16) & 0xFFu) * scale, e4m3_to_float(w >> 24) * scale);
  });
}

// Measurement builds only (scripts/device/gather_timeline.cu defines DEEPINFER_GATHER_TIMELINE
// and includes this file): lane 0 of each block of the tile kernel records %globaltimer when
// the block starts, when its tile's lookups have resolved and when its record loads have
// arrived, and the SM it ran on, in g_gather_timeline[4 * block + slot] (slot 3: the SM id).
// A mark waits for its `dep` value: the timer is read under a predicate computed from it.
// The shipped build compiles none of this.
#ifdef DEEPINFER_GATHER_TIMELINE
__device__ unsigned long long* g_gather_timeline = nullptr;
__device__ __forceinline__ void gather_timeline_mark(int slot, uint32_t dep, int lane) {
  unsigned long long t = 0;
  if (dep != 0x7F7F7F7Fu) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
  if (lane == 0 && g_gather_timeline != nullptr) {
    const int64_t b = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
    g_gather_timeline[4 * b + slot] = t;
    if (slot == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      g_gather_timeline[4 * b + 3] = sm;
    }
  }
}
#define GATHER_TIMELINE(slot, dep, lane) gather_timeline_mark(slot, dep, lane)
#else
#define GATHER_TIMELINE(slot, dep, lane) ((void)0)
#endif

struct EntryLoads {
  uint2 a;       // NoPE codes [8L, 8L+8)
  uint4 b;       // NoPE codes [256+8L, ..) in b.x/b.y (L < 24) or RoPE bf16 (L >= 24)
  uint2 scales;  // the entry's 8 scale bytes
};

// kEvictFirst: the record loads and the output stores carry an L2 evict_first policy
// (createpolicy + .L2::cache_hint): every record is read once and every output line written
// once, so neither should displace other lines from the L2. Measured on the H200 (same-run
// A/Bs, 2026-11-30 11:41 and 11:49 UTC, docs/kernels-cache-index.md): 2.4% and 1% faster
// than no policy at 1 x 49,152 and 4 x 12,288; evict_first on the loads alone or the stores
// alone, and evict_last on the stores, were not faster. $DEEPINFER_GATHER_L2POLICY=0 turns
// it off.
template <bool kEvictFirst>
__device__ __forceinline__ uint2 ld_record_v2(const void* p, uint64_t pol) {
  if constexpr (kEvictFirst) return ld_nc_v2_pol(p, pol);
  else return ld_nc_v2<true>(p);
}
template <bool kEvictFirst>
__device__ __forceinline__ uint4 ld_record_v4(const void* p, uint64_t pol) {
  if constexpr (kEvictFirst) return ld_nc_v4_pol(p, pol);
  else return ld_nc_v4<true>(p);
}

template <bool kEvictFirst>
__device__ __forceinline__ EntryLoads load_entry(const uint8_t* entry, const uint8_t* scales,
                                                 int lane, uint64_t pol) {
  EntryLoads e;
  e.a = ld_record_v2<kEvictFirst>(entry + 8 * lane, pol);
  if (lane < 24) {
    const uint2 t = ld_record_v2<kEvictFirst>(entry + 256 + 8 * lane, pol);
    e.b = make_uint4(t.x, t.y, 0u, 0u);
  } else {
    e.b = ld_record_v4<kEvictFirst>(entry + kv_record::kRopeOffset + 16 * (lane - 24), pol);
  }
  e.scales = ld_nc_v2(scales);
  return e;
}

template <bool kEvictFirst>
__device__ __forceinline__ EntryLoads load_packed(const GatherKParams& p, int64_t packed,
                                                  int lane, uint64_t pol) {
  const int in_blk = static_cast<int>(packed & 0xFFFF);
  const uint8_t* blk = kv_record::block_base(p.cache, packed >> 16, p.block_stride);
  return load_entry<kEvictFirst>(blk + kv_record::data_offset(in_blk),
                                 blk + kv_record::scale_offset(p.block_size, in_blk), lane, pol);
}

template <bool kStreaming, bool kEvictFirst>
__device__ __forceinline__ void store16(void* p, uint4 v, uint64_t pol) {
  if constexpr (kEvictFirst) {
    st_v4_pol(p, v, pol);
  } else if (kStreaming) {
    st_cs_v4(p, v);
  } else {
    st_v4(p, v);
  }
}

// The scale bytes of a lane's two chunks of an entry: group L/8 for codes [8L, 8L+8), group
// 4+L/8 for codes [256+8L, ..) (lanes 24-31 hold RoPE values there and do not use it).
struct LaneScales {
  uint32_t lo, hi;
};
__device__ __forceinline__ LaneScales lane_scales(const EntryLoads& e, int lane) {
  const int g = lane >> 3;
  return {kv_record::group_scale_byte(e.scales, g), kv_record::group_scale_byte(e.scales, 4 + g)};
}

// A lane's share of one entry decoded: lo = NoPE codes [8L, 8L+8) with group L/8's scale
// byte, hi = codes [256+8L, ..) with group 4+L/8's (L < 24) or the RoPE values (L >= 24).
// When none of the lane's 16 codes is a NaN code and its scale bytes lie in 10..246 (every
// byte the KV writers produce below 247), both chunks take the two-multiply bf16x2 route as
// straight-line code; otherwise decode8 redoes them by its per-chunk routes. Measured on the
// H200 (scripts/device/gather_timeline.sh, 2026-11-30 21:19 UTC): 1.1% faster than choosing
// among decode8's routes for each chunk (a branch region per chunk that the compiler could
// not interleave), with the benchmark's scale bytes 110..135.
__device__ __forceinline__ void decode_entry(const EntryLoads& e, int lane, uint4& lo, uint4& hi) {
  const LaneScales sc = lane_scales(e, lane);
  const uint32_t s_lo = sc.lo, s_hi = sc.hi;
  const bool rope = lane >= 24;  // hi holds RoPE values, not codes
  const uint2 b = make_uint2(e.b.x, e.b.y);
  // Every lane computes both chunks and the test without a branch (lanes 24-31 then take
  // their RoPE values); short-circuit tests and a branch around the second chunk made the
  // compiler split this into divergent regions and cost the 1.1% (H200, 2026-11-30).
  lo = e4m3x8_to_bf16x8_bf16mul2(e.a, s_lo);
  hi = e4m3x8_to_bf16x8_bf16mul2(b, s_hi);
  if (rope) hi = e.b;
  uint32_t nan = e4m3_nan_fold(e4m3_nan_fold(0u, e.a.x), e.a.y);
  nan = e4m3_nan_fold(e4m3_nan_fold(nan, rope ? 0u : b.x), rope ? 0u : b.y);
  const bool fast = !e4m3_nan_any(nan) & e4m3_bf16mul2_scale_ok(s_lo) &
                    (rope | e4m3_bf16mul2_scale_ok(s_hi));
  if (!fast) {
    lo = decode8(e.a, s_lo);
    hi = rope ? e.b : decode8(b, s_hi);
  }
}

template <bool kStreaming, bool kEvictFirst>
__device__ __forceinline__ void store_entry(uint16_t* out_row, const EntryLoads& e, int lane,
                                            uint64_t pol) {
  uint4 lo, hi;
  decode_entry(e, lane, lo, hi);
  store16<kStreaming, kEvictFirst>(out_row + 8 * lane, lo, pol);
  store16<kStreaming, kEvictFirst>(out_row + 256 + 8 * lane, hi, pol);
}

// Entry i of a request (0 <= i < gather_len) -> (physical block << 16) | position in block,
// or -1 when it must be skipped: an out-of-range position, block-table column, block id or
// output row is never read or written.
// pos = start + i < seq_len <= INT32_MAX, so a non-negative pos divides by block_size with
// the launch-time divisor p.block_div (common/fast_div.h: one multiply-high and a shift). The
// 64-bit division it replaces (a long instruction sequence) cost the tile gather about 1%
// (scripts/device/gather_timeline.sh, H200, 2026-11-30).
__device__ __forceinline__ int64_t resolve_entry(const GatherKParams& p, const int32_t* bt_row,
                                                 int start, int64_t i) {
  int64_t packed = -1;
  const int64_t pos = start + i;
  if (pos >= 0 && p.offset + i < p.out_rows) {
    const int32_t pos32 = static_cast<int32_t>(pos);
    const int32_t blk = fast_div(pos32, p.block_div);
    if (blk < p.max_blocks) {
      const int64_t phys = bt_row[static_cast<int64_t>(blk) * p.bt_stride1];
      if (phys >= 0 && phys < p.num_blocks) packed = (phys << 16) | (pos32 - blk * p.block_size);
    }
  }
  return packed;
}

template <int kInFlight, bool kStreaming, bool kEvictFirst = false>
__global__ void __launch_bounds__(kThreads)
gather_k_kernel(const GatherKParams p) {
  using namespace kv_record;
  uint64_t pol = 0;
  if constexpr (kEvictFirst) pol = l2_policy_evict_first();
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.y;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;

  const int seq_len = p.seq_lens[r];
  const int gather_len = p.gather_lens != nullptr ? p.gather_lens[r] : seq_len;
  const int start = seq_len - gather_len;
  const int32_t* bt_row = p.block_table + static_cast<int64_t>(r) * p.bt_stride0;
  uint16_t* out_req = p.out + static_cast<int64_t>(r) * p.out_stride0;

  // Batches of up to 32 entries per warp: entry i_k = base + k * nwarps, k < 32.
  for (int64_t base = warp; base < gather_len; base += 32 * nwarps) {
    // Lane k resolves entry i_k (resolve_entry).
    const int64_t i = base + lane * nwarps;
    int64_t packed = -1;
    if (i < gather_len) packed = resolve_entry(p, bt_row, start, i);
    const int64_t remaining = (gather_len - base + nwarps - 1) / nwarps;
    const int n = static_cast<int>(remaining < 32 ? remaining : 32);
    for (int k = 0; k < n; k += kInFlight) {
      int64_t ep[kInFlight];
      bool has[kInFlight];
      EntryLoads e[kInFlight];
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        ep[j] = __shfl_sync(0xFFFFFFFFu, packed, (k + j) & 31);
        has[j] = (k + j < n) && ep[j] >= 0;
      }
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        if (has[j]) e[j] = load_packed<kEvictFirst>(p, ep[j], lane, pol);
      }
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        if (has[j]) {
          store_entry<kStreaming, kEvictFirst>(out_req + (p.offset + base + (k + j) * nwarps) * p.out_stride1, e[j], lane, pol);
        }
      }
    }
  }
}

// The default layout: one warp per block, each warp gathering kWarpEntries consecutive
// entries at a time (tile t: entries [4t, 4t + 4)), tiles walked with stride gridDim.x.
// Lane k < 4 resolves entry k of the tile (resolve_entry), the warp loads all four records
// and then writes the four rows (two 512-byte stores per row).
// The tile reads its request's header (seq_lens, gather_lens) itself, so that nothing but
// the kernel parameters and the tile index stays live across it: the tile kernel then fits
// 64 registers (32 resident blocks per SM on SM80 and SM90) without spills.
template <bool kEvictFirst>
__device__ __forceinline__ void gather_tile(const GatherKParams& p, int r, int64_t first, int lane,
                                            uint64_t pol) {
  const int seq_len = p.seq_lens[r];
  const int gather_len = p.gather_lens != nullptr ? p.gather_lens[r] : seq_len;
  const int start = seq_len - gather_len;
  const int32_t* bt_row = p.block_table + static_cast<int64_t>(r) * p.bt_stride0;
  uint16_t* out_req = p.out + static_cast<int64_t>(r) * p.out_stride0;
  const int64_t i = first + lane;
  int64_t packed = -1;
  if (lane < kWarpEntries && i < gather_len) packed = resolve_entry(p, bt_row, start, i);
  int64_t ep[kWarpEntries];
  EntryLoads e[kWarpEntries];
#pragma unroll
  for (int j = 0; j < kWarpEntries; ++j) ep[j] = __shfl_sync(0xFFFFFFFFu, packed, j);
  GATHER_TIMELINE(1, static_cast<uint32_t>(ep[kWarpEntries - 1]), lane);
#pragma unroll
  for (int j = 0; j < kWarpEntries; ++j) {
    if (ep[j] >= 0) e[j] = load_packed<kEvictFirst>(p, ep[j], lane, pol);
  }
#ifdef DEEPINFER_GATHER_TIMELINE
  {
    uint32_t dep = 0;
#pragma unroll
    for (int j = 0; j < kWarpEntries; ++j) {
      if (ep[j] >= 0) dep ^= e[j].a.x ^ e[j].b.x ^ e[j].scales.x;
    }
    GATHER_TIMELINE(2, dep, lane);
  }
#endif
#pragma unroll
  for (int j = 0; j < kWarpEntries; ++j) {
    if (ep[j] >= 0) {
      store_entry<false, kEvictFirst>(out_req + (p.offset + first + j) * p.out_stride1, e[j], lane, pol);
    }
  }
}

// Resident one-warp blocks per SM the kernels are compiled for: the block limit of SM80
// and SM90, 32, which holds them at 64 registers (ptxas gave the loop-free kernel 68 on
// sm_80, 28 resident blocks). SM86 holds 16 blocks per SM and needs no limit.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 900)
constexpr int kWarpMinBlocks = 32;
#else
constexpr int kWarpMinBlocks = 0;
#endif

// kWalk false: one tile per block, no loop (the grid covers every tile: below the grid cap,
// every benchmark shape). kWalk true: the blocks walk the tiles with stride gridDim.x. The
// loop is not peeled: with the tile reading its own header (gather_tile) both kernels fit 64
// registers on sm_80 and sm_90 (32 resident blocks per SM) without spills; a peeled first
// tile took 71 (28 resident blocks, 1% slower), or spilled under a 64-register cap. At
// 49,152 entries the walking kernel trailed a loop-free tile by 0.7-0.9% (H200,
// scripts/device/gather_timeline.sh, 2026-11-30 21:27 UTC), hence the loop-free one.
template <bool kEvictFirst, bool kWalk>
__global__ void __launch_bounds__(32, kWarpMinBlocks)
gather_k_warp_kernel(const GatherKParams p) {
  uint64_t pol = 0;
  if constexpr (kEvictFirst) pol = l2_policy_evict_first();
  const int lane = threadIdx.x;
  const int r = blockIdx.y;
  GATHER_TIMELINE(0, 0u, lane);
  if constexpr (!kWalk) {
    gather_tile<kEvictFirst>(p, r, static_cast<int64_t>(blockIdx.x) * kWarpEntries, lane, pol);
  } else {
    // tiles at or past out_rows - offset hold no entry that may be written (resolve_entry)
    const int64_t rows = p.out_rows - p.offset;
    const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpEntries;
#pragma unroll 1
    for (int64_t first = static_cast<int64_t>(blockIdx.x) * kWarpEntries; first < rows; first += step) {
      gather_tile<kEvictFirst>(p, r, first, lane, pol);
    }
  }
}

// $DEEPINFER_GATHER_SMEM_PAD = bytes (benchmark and test knob, at most 48 KB): launch the tile
// kernel with that much unused dynamic shared memory, so that fewer of its one-warp blocks
// are resident per SM. It emulates the residency of a part with fewer block slots per SM on
// a GPU with more: 13,312 bytes leave 16 per SM on an H200 (228 KB per SM, 1 KB reserved per
// block), the limit of an SM86 part (A100 and H200 allow 32).
int gather_smem_pad() {
  static const int pad = [] {
    const int b = knob_int("DEEPINFER_GATHER_SMEM_PAD", 0);
    return b > 0 && b <= 48 * 1024 ? b : 0;
  }();
  return pad;
}

template <bool kEvictFirst>
int gather_warp_blocks_per_sm() {
  static int cached = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gather_k_warp_kernel<kEvictFirst, true>, 32,
                                                      gather_smem_pad()) != cudaSuccess ||
        n <= 0) {
      n = 16;
    }
    return n;
  }();
  return cached;
}

// Grid: one block per tile, capped at kWarpWaves waves of resident blocks on lim.sm_count
// SMs (split over the requests); past the cap each block walks several tiles. Measured on
// the H200 (docs/kernels-cache-index.md): one block per tile is 1-4% faster than one wave of
// persistent blocks at 49,152 entries (same-run A/B, 2026-11-30 16:57 UTC), and 1% / 3.6%
// faster than a cap of 4 waves at 196,608 / 786,432 entries, where that cap made each block
// walk 3 / 12 tiles (2026-11-30 18:11 UTC): blocks that walk a fixed share of the tiles
// finish unevenly, fresh blocks are balanced by the block scheduler. The cap of 64 waves
// binds only beyond ~1.08M entries per call on 132 SMs (~885k on 108, ~344k on an SM86
// part with 84 SMs and 16 resident blocks each). $DEEPINFER_GATHER_WARP_WAVES = n
// (benchmark and test knob) sets the waves.
template <bool kEvictFirst>
void launch_warp(const GatherKParams& p, const DeviceLimits& lim, cudaStream_t stream) {
  const int64_t rows = p.out_rows - p.offset;  // upper bound of any gather_len we write
  if (rows <= 0) return;
  int64_t x = (rows + kWarpEntries - 1) / kWarpEntries;
  static const int waves = knob_int("DEEPINFER_GATHER_WARP_WAVES", kWarpWaves);
  int64_t cap = static_cast<int64_t>(lim.sm_count) * gather_warp_blocks_per_sm<kEvictFirst>() *
                (waves > 0 ? waves : kWarpWaves) / p.num_reqs;
  if (cap < 1) cap = 1;
  const bool walk = x > cap;
  if (walk) x = cap;
  dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(p.num_reqs));
  if (walk) {
    gather_k_warp_kernel<kEvictFirst, true><<<grid, 32, gather_smem_pad(), stream>>>(p);
  } else {
    gather_k_warp_kernel<kEvictFirst, false><<<grid, 32, gather_smem_pad(), stream>>>(p);
  }
}

template <int kInFlight, bool kStreaming, bool kEvictFirst = false>
int gather_blocks_per_sm() {
  static int cached = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &n, gather_k_kernel<kInFlight, kStreaming, kEvictFirst>, kThreads, 0) != cudaSuccess ||
        n <= 0) {
      n = 4;
    }
    // $DEEPINFER_GATHER_BLOCKS_PER_SM (benchmark knob): fewer resident blocks per SM than
    // the occupancy limit (each warp then handles more entries)
    const int want = knob_int("DEEPINFER_GATHER_BLOCKS_PER_SM", 0);
    if (want > 0 && want < n) n = want;
    return n;
  }();
  return cached;
}

template <int kInFlight, bool kStreaming, bool kEvictFirst = false>
void launch(const GatherKParams& p, const DeviceLimits& lim, cudaStream_t stream) {
  const int64_t rows = p.out_rows - p.offset;  // upper bound of any gather_len we write
  if (rows <= 0) return;
  const int64_t total =
      static_cast<int64_t>(lim.sm_count) * gather_blocks_per_sm<kInFlight, kStreaming, kEvictFirst>();
  int64_t x = total / p.num_reqs;
  const int64_t needed = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (x > needed) x = needed;
  if (x < 1) x = 1;
  dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(p.num_reqs));
  gather_k_kernel<kInFlight, kStreaming, kEvictFirst><<<grid, kThreads, 0, stream>>>(p);
}

// Tuning knobs for benchmarks, read once per process (INFLIGHT, STORE and BLOCKS_PER_SM
// select variants of the persistent layout):
//   $DEEPINFER_GATHER_LAYOUT = persistent: the persistent layout instead of the default;
//   $DEEPINFER_GATHER_SMEM_PAD = bytes: fewer resident tile blocks per SM (gather_smem_pad);
//   $DEEPINFER_GATHER_WARP_WAVES = n (default kWarpWaves = 64): the default layout's grid
//   cap in waves;
//   $DEEPINFER_GATHER_INFLIGHT = 2 | 4 | 8 (default 4): entries a warp keeps in flight;
//   $DEEPINFER_GATHER_STORE = cs: streaming (evict-first) stores of the output rows;
//   $DEEPINFER_GATHER_BLOCKS_PER_SM = n: at most n resident blocks per SM in the grid size;
//   $DEEPINFER_GATHER_L2POLICY = 0: no L2 evict_first policy on the loads and stores of
//   either layout's default kernel (the other variants carry none).
int gather_variant() {
  static int v = [] {
    const int want = knob_int("DEEPINFER_GATHER_INFLIGHT", 4);
    const int inflight = (want == 2 || want == 8) ? want : 4;
    const bool cs = knob_is("DEEPINFER_GATHER_STORE", "cs");
    return inflight + (cs ? 1 : 0);
  }();
  return v;
}

bool gather_layout_persistent() {
  static const bool on = knob_is("DEEPINFER_GATHER_LAYOUT", "persistent");
  return on;
}

bool gather_l2_evict_first() {
  static const bool on = !knob_off("DEEPINFER_GATHER_L2POLICY");
  return on;
}

}  // namespace

void launch_gather_k(const GatherKParams& params, const DeviceLimits& lim, cudaStream_t stream) {
  if (params.num_reqs <= 0) return;
  GatherKParams p = params;
  p.block_div = make_fast_div(p.block_size);
  switch (gather_variant()) {
    case 2: launch<2, false>(p, lim, stream); break;
    case 3: launch<2, true>(p, lim, stream); break;
    case 5: launch<4, true>(p, lim, stream); break;
    case 8: launch<8, false>(p, lim, stream); break;
    case 9: launch<8, true>(p, lim, stream); break;
    default: {
      const bool ef = gather_l2_evict_first();
      if (gather_layout_persistent()) {
        ef ? launch<4, false, true>(p, lim, stream) : launch<4, false>(p, lim, stream);
      } else {
        ef ? launch_warp<true>(p, lim, stream) : launch_warp<false>(p, lim, stream);
      }
      break;
    }
  }
}

}  // namespace deepinfer_sm80
