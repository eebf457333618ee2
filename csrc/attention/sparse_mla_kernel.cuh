// SPDX-License-Identifier: Apache-2.0
// SM80 sparse MLA attention: one block = one query token x one group of HG heads x one
// split of the token's key list (the 64-head prefill: kGroups = 2 groups of HG = 32 heads,
// 4 warps each, over shared key stages; see kBarGroup below). Keys stream through shared
// memory in tiles of BK:
//   bf16 source (prefill): cp.async of 1 KB rows straight into the swizzled tile;
//   fp8 source (decode):   cp.async of the raw 584-byte records, then an exact in-block
//                          dequantisation (e4m3 * UE8M0 -> bf16) into the tile, or
//                          (kRawScores) score warps that build their K fragments from the
//                          raw records and store the bf16 tile on the way.
// Keys are loaded one tile ahead, their indices one more tile ahead, by the warps that the
// score MMA leaves idle (8 threads per key row), while the score warps compute.
// Per tile:  S^T = K Q^T   (mma m16n8k16: keys on m16, heads on n8; KSPLIT warps per warp
//                          tile, one slice of the head dims each) -> smem (fp32, per slice)
//            online softmax per head (log2 domain) -> P (bf16) in smem, rescale factors
//            O^T += V^T P^T (mma m16n8k16: head dims on m16, heads on n8, V = K tile)
// End: out = O / (l + 2^(sink*log2e - m)) and lse, or (m, l, O) partials for combine.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "detail/fp8_record.cuh"
#include "detail/raw_scores.cuh"
#include "detail/score_store.cuh"
#include "detail/sm80_ptx.cuh"
#include "params.h"
#include "tile_config.h"

namespace deepinfer_sm80::attention {

// Measurement build only (-DDEEPINFER_ATTN_PHASE_CLOCKS, bench/phase_clocks.py): per-phase
// SM cycles of two threads (a score warp and a non-score warp; per group) of a few blocks, printed.
#ifdef DEEPINFER_ATTN_PHASE_CLOCKS
#define PHASE_MARK(k)                                  \
  do {                                                 \
    const long long now_ = clock64();                  \
    ph_cyc[k] += now_ - ph_t;                          \
    ph_t = now_;                                       \
  } while (0)
#else
#define PHASE_MARK(k) \
  do {                \
  } while (0)
#endif

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;


__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * 1024 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ int list_len(const KeySource& s, int tok) {
  if (s.indices == nullptr) return 0;
  if (s.lens == nullptr) return s.topk;
  int n = s.lens[tok];
  return n < 0 ? 0 : (n > s.topk ? s.topk : n);
}

// Two-group tile (kGroups = 2, bf16 keys only; the 64-head prefill): two groups of NWARPS
// warps, each with its own HG heads (Q rows, scores, P, statistics, O), stream the same key
// stages and synchronise only within the group (named barrier kBarGroup + group), so each
// group runs its phases on its own clock and one group's MMAs fill the other's softmax and
// barrier waits. The second group's idle warps copy the next tile: kBarEmpty (the first
// group is done with the stage) before, kBarFull (the copies have landed) after.
// Measured on the H200 (docs/attention.md): 64-head prefill +3-5% over one 8-warp group of
// 64 heads; forcing the groups' score phases to alternate, or to start half a tile apart,
// lost 2-4%.
constexpr int kBarGroup = 1;  // + group: the group's own barrier (NTHREADS)
constexpr int kBarFull = 3;   // + stage
constexpr int kBarEmpty = 5;  // + stage

// kRawScores (fp8 only): the score warps read the raw records (detail/raw_scores.cuh) and
// store the bf16 values they build into the tile for the PV MMA, instead of the whole block
// dequantising each tile before the score MMA.
template <class Cfg, bool kFp8, int kGroups = 1, bool kRawScores = false>
__global__ void __launch_bounds__(Cfg::NTHREADS * kGroups, 1) sparse_mla_kernel(const SparseMlaParams p) {
  using L = typename Cfg::template Layout<kFp8, kGroups>;
  constexpr int HG = Cfg::HG, BK = Cfg::BK, NT = Cfg::NTHREADS, STAGES = Cfg::STAGES;
  constexpr int HN = Cfg::HN, KM = Cfg::KM, NTW = Cfg::NTW, KMW = Cfg::KMW, DM = Cfg::DM,
                TPH = Cfg::TPH;
  static_assert(kGroups == 1 || (kGroups == 2 && !kFp8), "two-group tile: bf16 keys only");
  static_assert(!kRawScores || (kFp8 && kGroups == 1 && BK == 32), "raw scores: fp8 keys, one group, 32-key tiles");

  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s_base = ptx::smem_u32(smem);
  // group-local ids; in the second group the score warps are its last ones, so that the two
  // groups' score warps sit on different SM sub-partitions (warp % 4)
  const int grp = kGroups == 1 ? 0 : static_cast<int>(threadIdx.x) / NT;
  const int lane = threadIdx.x & 31;
  const int warp = grp == 0 ? (static_cast<int>(threadIdx.x) >> 5)
                            : (((static_cast<int>(threadIdx.x) % NT) >> 5) + Cfg::NWARPS / 2) % Cfg::NWARPS;
  const int tid = warp * 32 + lane;
  const int gofs = grp * L::group_stride;
  float* s_scores = reinterpret_cast<float*>(smem + L::scores + gofs);
  __nv_bfloat16* s_probs = reinterpret_cast<__nv_bfloat16*>(smem + L::probs + gofs);
  int* s_valid = reinterpret_cast<int*>(smem + L::valid);
  float* s_alpha = reinterpret_cast<float*>(smem + L::alpha + gofs);
  float* s_l = reinterpret_cast<float*>(smem + L::stat_l + gofs);
  const uint32_t q_base = s_base + L::q + grp * HG * Cfg::kRowBytes;
  auto group_sync = [&] {
    if constexpr (kGroups == 1) {
      __syncthreads();
    } else {
      ptx::bar_sync(kBarGroup + grp, NT);
    }
  };
#ifdef DEEPINFER_ATTN_PHASE_CLOCKS
  long long ph_cyc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const long long ph_start = clock64();
  long long ph_t = ph_start;
  unsigned long long ph_ns0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ph_ns0));
#endif
  const int groups = (p.num_heads + HG * kGroups - 1) / (HG * kGroups);
  int bid = blockIdx.x;
  // whole: this block runs its token's whole key list and writes out / lse itself; else it
  // writes split partials for the combine. Decode: every block alike (num_splits). Prefill:
  // tokens [0, p.whole_tokens) one block per token x head group, then the last partial
  // wave's tokens num_splits blocks each (plan::prefill_tail), in the same launch so that
  // they fill the SMs as the whole blocks drain; their partials are numbered from
  // p.whole_tokens.
  bool whole;
  int ns = p.num_splits, tok0 = 0;
  if constexpr (kFp8) {
    whole = p.num_splits == 1;
  } else {
    whole = bid < p.whole_tokens * groups;
    if (whole) {
      ns = 1;
    } else {
      bid -= p.whole_tokens * groups;
      tok0 = p.whole_tokens;
    }
  }
  const int hgi = bid % groups;
  bid /= groups;
  const int split = bid % ns;
  const int tok = tok0 + bid / ns;
  const int head0 = (hgi * kGroups + grp) * HG;

  const int len0 = list_len(p.src[0], tok);
  const int len1 = p.num_sources > 1 ? list_len(p.src[1], tok) : 0;
  const int n_keys = len0 + len1;
  int k_begin = 0, k_end = n_keys;
  if (!whole) {
    k_begin = split * p.keys_per_split;
    k_end = min(n_keys, k_begin + p.keys_per_split);
  }
  const int num_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;

  // ---- tile loader: the warps that the score MMA leaves idle (S_WARPS..NWARPS-1) copy the
  // next tile while the score warps compute, so the copies' issue is off the critical path
  // (measured per phase with bench/phase_clocks.py: issuing all copies right after the
  // tile barrier cost ~700 of ~4,400 cycles per 64-head tile). 8 loader threads per key
  // row, LRPT rows each: thread (lr0 = ltid / 8, lq = ltid % 8) serves rows
  // lr0 + LROWS * r. It loads a row's index one iteration before it issues the row's copies
  // (so the index latency never stalls the warp), then resolves the source (one block
  // division for the paged cache) and copies chunks lq, lq + 8, ... of the row: source and
  // swizzled destination are a per-thread base plus compile-time offsets
  // ((lq + 8i) ^ (lr & 7) == 8i + (lq ^ (lr & 7))).
  constexpr int LTHREADS = NT - Cfg::S_WARPS * 32;
  constexpr int LROWS = LTHREADS / 8;  // rows served at once
  constexpr int LRPT = BK / LROWS;     // rows per loader thread
  static_assert(LTHREADS > 0 && LTHREADS % 8 == 0 && BK % LROWS == 0, "loader warps");
  const bool loader = warp >= Cfg::S_WARPS && grp == kGroups - 1;  // two groups: the second's
  const int ltid = tid - Cfg::S_WARPS * 32;
  const int lr0 = ltid >> 3, lq = tid & 7;
  int nidx[LRPT];  // indices of the thread's rows of the next tile (-1: invalid or past the list)
  auto fetch_rows = [&](int j) {
#pragma unroll
    for (int r = 0; r < LRPT; ++r) {
      const int k = k_begin + j * BK + lr0 + r * LROWS;
      int idx = -1;
      if (k < k_end) {
        const bool second = k >= len0;  // sources as fields, not a dynamically indexed array
        const int32_t* ind = second ? p.src[1].indices : p.src[0].indices;
        const int64_t istride = second ? p.src[1].indices_stride : p.src[0].indices_stride;
        idx = ind[tok * istride + (second ? k - len0 : k)];
      }
      nidx[r] = idx;
    }
  };
  auto issue_tile = [&](int j) {
    const int st = j % STAGES;
    const uint8_t* zero_src = p.src[0].base;  // never read: zero-fill copies (src size 0)
#pragma unroll
    for (int r = 0; r < LRPT; ++r) {
      const int lr = lr0 + r * LROWS;
      const bool second = k_begin + j * BK + lr >= len0;
      const uint8_t* base = second ? p.src[1].base : p.src[0].base;
      if constexpr (!kFp8) {
        const int64_t rows = second ? p.src[1].num_rows : p.src[0].num_rows;
        const int64_t rstride = second ? p.src[1].row_stride : p.src[0].row_stride;
        const bool ok = nidx[r] >= 0 && nidx[r] < rows;
        const uint8_t* row = base + static_cast<int64_t>(ok ? nidx[r] : 0) * rstride;
        const uint32_t dst =
            s_base + L::kv + st * Cfg::kTileBytes + lr * 1024 + ((lq ^ (lr & 7)) << 4);
#pragma unroll
        for (int i = 0; i < 8; ++i)
          ptx::cp_async_16(dst + i * 128, ok ? row + lq * 16 + i * 128 : zero_src, ok ? 16 : 0);
        if (lq == 0) s_valid[st * BK + lr] = ok;
      } else {
        const bool ok = nidx[r] >= 0;
        const int bs = second ? p.src[1].block_size : p.src[0].block_size;
        const int64_t bstride = second ? p.src[1].block_stride : p.src[0].block_stride;
        const int blk = ok ? nidx[r] / bs : 0, off = ok ? nidx[r] - blk * bs : 0;
        const uint8_t* block = base + static_cast<int64_t>(blk) * bstride;
        const uint8_t* row = block + off * kDataBytes;
        // 36 data chunks: lq + 8i for i < 4, and 32 + lq for lq < 4; the scale word: lq == 4
        const uint32_t dst = s_base + L::raw + st * Cfg::kRawBytes + lr * kDataBytes + lq * 16;
#pragma unroll
        for (int i = 0; i < 4; ++i)
          ptx::cp_async_16(dst + i * 128, ok ? row + lq * 16 + i * 128 : zero_src, ok ? 16 : 0);
        if (lq < 4) {
          ptx::cp_async_16(dst + 512, ok ? row + lq * 16 + 512 : zero_src, ok ? 16 : 0);
        } else if (lq == 4) {
          ptx::cp_async_8(s_base + L::raw_scale + st * Cfg::kRawScaleBytes + lr * kScaleBytes,
                          ok ? block + bs * kDataBytes + off * kScaleBytes : zero_src, ok ? 8 : 0);
          s_valid[st * BK + lr] = ok;
        }
      }
    }
  };

  // ---- prologue: Q joins the first group; the rows of the next tile resolved
  static_assert(STAGES == 2, "the loader pipelines one tile ahead");
  // The first tile's index loads go out before Q's copies: they head the dependent chain
  // index -> key rows, and behind Q's 64 KB of copies they would wait in the same queue.
  if (loader && num_tiles > 0) fetch_rows(0);
  // ---- Q: HG rows of 512 bf16 (zero rows past the head count).
  if constexpr (kRawScores) {
    // In the score MMA's k order (detail/raw_scores.cuh): each 4-byte dim pair copied to its
    // logical position, so that the Q^T fragments pair with the A fragments read from the
    // records (cp.async, so that Q lands while the first tile's records are in flight).
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q) + tok * p.q_stride_tok;
    for (int i = tid; i < HG * 256; i += NT) {
      const int r = i >> 8, ph = i & 255, h = head0 + r;  // ph: physical dim pair of the row
      const int blk = ph >> 5;
      const int lp = raw::logical_pair(blk, ph & 31);
      const bool ok = h < p.num_heads;
      ptx::cp_async_4(q_base + swz(r, blk * 8 + (lp >> 2)) + (lp & 3) * 4,
                      ok ? q + h * p.q_stride_head + ph * 2 : q, ok ? 4 : 0);
    }
  } else {
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q) + tok * p.q_stride_tok;
    for (int i = tid; i < HG * 64; i += NT) {
      const int r = i >> 6, c = i & 63, h = head0 + r;
      const bool ok = h < p.num_heads;
      const __nv_bfloat16* src = ok ? q + h * p.q_stride_head + c * 8 : q;
      ptx::cp_async_16(q_base + swz(r, c), src, ok ? 16 : 0);
    }
  }

  if (loader && num_tiles > 0) issue_tile(0);
  ptx::cp_async_commit();
  if (loader && num_tiles > 1) fetch_rows(1);
  // L2 prefetch of this block's own index lists (one 128-byte line per thread, issued after
  // the first tile's loads): the loader's per-tile index loads then hit L2 instead of DRAM.
  // Measured on the H200 (docs/attention.md, session of 2026-11-30 from 10:07 UTC): this is
  // what the earlier prefetch of the next wave's Q rows and index list gained; its Q part
  // alone was slower than no prefetch.
  if (p.prefetch_lists) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      if (s < p.num_sources && threadIdx.x * 32 < p.src[s].topk)
        ptx::prefetch_l2(p.src[s].indices + static_cast<int64_t>(tok) * p.src[s].indices_stride +
                         threadIdx.x * 32);
    }
  }
  if constexpr (kGroups > 1) {  // Q and the first tile in place for both groups
    ptx::cp_async_wait<0>();
    __syncthreads();
  }

  float acc[DM][HN][4];
#pragma unroll
  for (int a = 0; a < DM; ++a)
#pragma unroll
    for (int b = 0; b < HN; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;

  const int sm_head = tid / TPH;   // softmax: head of this thread
  const int sm_part = tid % TPH;   // softmax: key offset of this thread
  // The head's sink (-inf: none, or a split block, whose combine adds it), loaded now and
  // used in the epilogue, so that the normaliser waits for no global load there.
  float sink_raw = -INFINITY;
  if (sm_part == 0 && whole && p.sink != nullptr && head0 + sm_head < p.num_heads)
    sink_raw = p.sink[head0 + sm_head];
  float m_run = -INFINITY, l_run = 0.f, lx_run = 0.f;  // running max, sums of weights
  const int g = lane >> 2, t = lane & 3;

  PHASE_MARK(7);
  for (int j = 0; j < num_tiles; ++j) {
    if constexpr (kGroups == 1) {
      ptx::cp_async_wait<0>();
      __syncthreads();
    } else if (grp == 0) {
      // tile j landed (tile 0: the prologue); the barrier also holds back every warp of the
      // group until all of them left the previous PV
      if (j > 0) ptx::bar_sync(kBarFull + (j & 1), NT + LTHREADS);
    } else {
      group_sync();
      if (loader && j + 1 < num_tiles) {
        // stage (j+1)%2 held tile j-1: wait until the first group's PV is done with it, copy
        // tile j+1 (the wait for the copies and kBarFull follow the score phase)
        if (j >= 1) ptx::bar_sync(kBarEmpty + ((j + 1) & 1), NT + LTHREADS);
        issue_tile(j + 1);
        if (j + 2 < num_tiles) fetch_rows(j + 2);
        ptx::cp_async_commit();
      }
    }
    PHASE_MARK(0);
    const int st = j % STAGES;
    uint32_t kt = s_base + L::kv;
    const int lr = tid >> 3;  // the dequantisation: 8 threads per row (lq as the loader's)
    if constexpr (kFp8 && !kRawScores) {
      // raw records of stage st -> bf16 tile (exact), 8 threads per row
      const uint8_t* raw = smem + L::raw + st * Cfg::kRawBytes + lr * kDataBytes;
      const uint2 sc = *reinterpret_cast<const uint2*>(smem + L::raw_scale + st * Cfg::kRawScaleBytes +
                                                       lr * kScaleBytes);
      fp8::dequant_row_share(raw, sc, lq, smem + L::kv + lr * 1024 + ((lq ^ (lr & 7)) << 4));
      __syncthreads();
      PHASE_MARK(1);
    } else if constexpr (!kFp8) {
      kt += st * Cfg::kTileBytes;
    }

    // ---- scores: S^T[key][head] = K Q^T. A warp owns KMW key m16-tiles x NTW head
    // n8-tiles over one of KSPLIT head-dim slices (KS_PER 16-dim k-steps); per k-step it
    // loads KMW A fragments (ldmatrix.x4 of K) and NTW B fragments (ldmatrix of Q) for
    // KMW * NTW MMAs. The slices' partial sums go to KSPLIT score buffers that the softmax
    // adds: every warp of the block takes part instead of S_TILES of them. With fewer than
    // 4 MMAs per k-step the even and odd k-steps accumulate into separate registers.
    if (warp < Cfg::S_WARPS) {
      constexpr int CH = (KMW * NTW >= 4) ? 1 : 2;
      if constexpr (kRawScores) {
        // straight from the raw records; the tile for the PV MMA is written on the way
        raw::score_tile<Cfg>(smem + L::raw + st * Cfg::kRawBytes, smem + L::raw_scale + st * Cfg::kRawScaleBytes,
                             s_valid + st * BK, q_base, s_scores, smem + L::kv, warp, lane, p.scale_log2);
      } else {
        constexpr int KS_PER = Cfg::KS_PER;
        const int kgrp = warp / Cfg::S_TILES, wt = warp % Cfg::S_TILES;
        const int km0 = (wt / (HN / NTW)) * KMW;
        const int hn0 = (wt % (HN / NTW)) * NTW;
        float sacc[CH][KMW][NTW][4];
        clear_score_tile<Cfg, CH>(sacc);
        // Every ldmatrix row r has (r & 7) == (lane & 7), so the swizzled byte offset of chunk
        // c = 2*ks + lo is (ks >> 2) * 128 + (((ks & 3) * 2 + lo) ^ (lane & 7)) * 16: four
        // per-thread base addresses plus a compile-time offset once the loop is unrolled
        // (other m-tiles / n-tile pairs of the warp: + 16 rows = + 16 KB). A slice starts at
        // k-step kgrp * KS_PER (a multiple of 4): + kgrp * KS_PER * 32 bytes.
        const int mi = lane >> 3, r7 = lane & 7;
        const uint32_t kslice = kgrp * KS_PER * 32;
        const uint32_t a_row = kt + (km0 * 16 + (mi & 1) * 8 + r7) * 1024 + kslice;
        const uint32_t b_row =
            q_base + ((hn0 + (NTW >= 2 ? (mi >> 1) : 0)) * 8 + r7) * 1024 + kslice;
        uint32_t a_addr[4], b_addr[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          a_addr[u] = a_row + ((((2 * u) + (mi >> 1)) ^ r7) << 4);
          b_addr[u] = b_row + ((((2 * u) + (mi & 1)) ^ r7) << 4);
        }
#pragma unroll
        for (int ks = 0; ks < KS_PER; ++ks) {
          const int u = ks & 3, c = CH == 2 ? (ks & 1) : 0;
          const uint32_t koff = (ks >> 2) * 128;
          uint32_t bf[NTW][2];
          if constexpr (NTW == 1) {
            ptx::ldmatrix_x2(b_addr[u] + koff, bf[0][0], bf[0][1]);
          } else {
#pragma unroll
            for (int n = 0; n < NTW; n += 2)
              ptx::ldmatrix_x4(b_addr[u] + koff + n * 8 * 1024, bf[n][0], bf[n][1], bf[n + 1][0],
                               bf[n + 1][1]);
          }
#pragma unroll
          for (int a = 0; a < KMW; ++a) {
            uint32_t af[4];
            ptx::ldmatrix_x4(a_addr[u] + koff + a * 16 * 1024, af[0], af[1], af[2], af[3]);
#pragma unroll
            for (int n = 0; n < NTW; ++n) ptx::mma_bf16_16816(sacc[c][a][n], af, bf[n][0], bf[n][1]);
          }
        }
        store_score_tile<Cfg, CH>(sacc, s_scores, kgrp, km0, hn0, lane, p.scale_log2);
      }
    } else if constexpr (kGroups == 1) {
      // the loader warps: next tile's copies, then the indices of the one after
      if (j + 1 < num_tiles) issue_tile(j + 1);
      if (j + 2 < num_tiles) fetch_rows(j + 2);
    }
    if constexpr (kGroups == 1) {
      ptx::cp_async_commit();
    } else if (loader && j + 1 < num_tiles) {  // the second group's copies of tile j+1 landed
      ptx::cp_async_wait<0>();
      ptx::bar_arrive(kBarFull + ((j + 1) & 1), NT + LTHREADS);
    }
    // V^T fragments of the PV MMA's first k-step, loaded now (the K tile is already in shared
    // memory) so that their latency and shared-memory traffic overlap the softmax.
    // ldmatrix.trans of the K tile: row kk*16 + (mi>>1)*8 + r7, chunk warp*DW/8 + 2*dm +
    // (mi&1); DW is a multiple of 64, so as in the score phase the swizzle depends on
    // (dm & 3) only.
    uint32_t v_addr[4];
    {
      const int mi = lane >> 3, r7 = lane & 7;
      const uint32_t v_row = kt + ((mi >> 1) * 8 + r7) * 1024 + (warp * Cfg::DW / 64) * 128;
#pragma unroll
      for (int u = 0; u < 4; ++u) v_addr[u] = v_row + ((((2 * u) + (mi & 1)) ^ r7) << 4);
    }
    uint32_t vf0[DM][4];
    auto load_vf0 = [&] {
#pragma unroll
      for (int dm = 0; dm < DM; ++dm)
        ptx::ldmatrix_x4_trans(v_addr[dm & 3] + (dm >> 2) * 128, vf0[dm][0], vf0[dm][1], vf0[dm][2],
                               vf0[dm][3]);
    };
    if constexpr (!kRawScores) load_vf0();  // raw scores: the tile is written during the score phase
    PHASE_MARK(2);
    group_sync();
    if constexpr (kRawScores) load_vf0();
    PHASE_MARK(3);

    // ---- online softmax, one head per TPH threads; a key's score is the sum of the
    // KSPLIT slice buffers (read once, kept in registers for both passes)
    {
      const int* valid = s_valid + st * BK;
      constexpr int RPT = BK / TPH;  // keys per thread
      float sv[RPT];
      float mx = -INFINITY;
#pragma unroll
      for (int q = 0; q < RPT; ++q) {
        const int r = sm_part + q * TPH;
        float v = s_scores[r * Cfg::S_STRIDE + sm_head];
#pragma unroll
        for (int kg = 1; kg < Cfg::KSPLIT; ++kg) v += s_scores[(kg * BK + r) * Cfg::S_STRIDE + sm_head];
        sv[q] = valid[r] ? v : -INFINITY;
        mx = fmaxf(mx, sv[q]);
      }
#pragma unroll
      for (int o = TPH / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      // The weights are taken against the exact running max, so the largest weight so far is
      // exactly 1 in bf16. (Measured: a lazy max, moved only past a 2^8 slack, rounds that
      // weight too and raised the prefill error vs fp32 from <= 1.9e-3 to 2.1e-3.)
      const float m_new = fmaxf(m_run, mx);
      // branch-free: a masked key (-inf) gets 2^-inf = 0; with no valid key yet (m_new = -inf)
      // every weight is 0 against any finite reference
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      float sum = 0.f, sum_x = 0.f;  // of the bf16 weights used / of the exact weights
#pragma unroll
      for (int q = 0; q < RPT; ++q) {
        const int r = sm_part + q * TPH;
        const float pr = ptx::ex2(sv[q] - m_ref);
        const __nv_bfloat16 pb = __float2bfloat16_rn(pr);
        s_probs[sm_head * Cfg::P_STRIDE + r] = pb;
        sum += __bfloat162float(pb);
        sum_x += pr;
      }
#pragma unroll
      for (int o = TPH / 2; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
        sum_x += __shfl_xor_sync(0xffffffffu, sum_x, o);
      }
      const float alpha = (m_run == m_new) ? 1.f : ptx::ex2(m_run - m_ref);
      l_run = l_run * alpha + sum;
      lx_run = lx_run * alpha + sum_x;
      m_run = m_new;
      if (sm_part == 0) s_alpha[sm_head] = alpha;
    }
    PHASE_MARK(4);
    group_sync();
    PHASE_MARK(5);

    // ---- O^T[dim][head] += V^T P^T
    {
      // rescale by 2^(m_old - m_new), per group of 8 heads; a group is skipped when the
      // running max of none of its heads moved (most groups after the first tiles)
#pragma unroll
      for (int hn = 0; hn < HN; ++hn) {
        const float al0 = s_alpha[hn * 8 + 2 * t], al1 = s_alpha[hn * 8 + 2 * t + 1];
        if (__any_sync(0xffffffffu, (al0 != 1.f) | (al1 != 1.f))) {
#pragma unroll
          for (int dm = 0; dm < DM; ++dm) {
            acc[dm][hn][0] *= al0;
            acc[dm][hn][1] *= al1;
            acc[dm][hn][2] *= al0;
            acc[dm][hn][3] *= al1;
          }
        }
      }
      const int mi = lane >> 3, r7 = lane & 7;
      const uint32_t p_base = s_base + L::probs + gofs;
#pragma unroll
      for (int kk = 0; kk < KM; ++kk) {
        uint32_t b[HN][2];
        if constexpr (HN == 1) {
          ptx::ldmatrix_x2(p_base + (r7 * Cfg::P_STRIDE + kk * 16 + (mi & 1) * 8) * 2, b[0][0], b[0][1]);
        } else {
#pragma unroll
          for (int hn = 0; hn < HN; hn += 2) {
            const int row = (hn + (mi >> 1)) * 8 + r7;
            ptx::ldmatrix_x4(p_base + (row * Cfg::P_STRIDE + kk * 16 + (mi & 1) * 8) * 2, b[hn][0],
                             b[hn][1], b[hn + 1][0], b[hn + 1][1]);
          }
        }
#pragma unroll
        for (int dm = 0; dm < DM; ++dm) {
          uint32_t af[4];
          if (kk == 0) {
#pragma unroll
            for (int c = 0; c < 4; ++c) af[c] = vf0[dm][c];
          } else {
            ptx::ldmatrix_x4_trans(v_addr[dm & 3] + kk * 16 * 1024 + (dm >> 2) * 128, af[0], af[1], af[2], af[3]);
          }
#pragma unroll
          for (int hn = 0; hn < HN; ++hn) ptx::mma_bf16_16816(acc[dm][hn], af, b[hn][0], b[hn][1]);
        }
      }
    }
    if constexpr (kGroups > 1) {  // the first group is done with tile j's stage
      if (grp == 0 && j + 2 < num_tiles) ptx::bar_arrive(kBarEmpty + (j & 1), NT + LTHREADS);
    }
    PHASE_MARK(6);
  }
  ptx::cp_async_wait<0>();
#ifdef DEEPINFER_ATTN_PHASE_CLOCKS
  const long long ph_epi0 = clock64();
#endif

  // ---- epilogue. The softmax lane 0 of each head writes its statistics (lse, max_logits
  // or the split partials) from registers, and (one split) the head's normaliser
  // 1 / (l + 2^(sink*log2e - m)) to s_l, once per head and with the sink loaded in the
  // prologue. It used to be computed per output element, its sink loads between the staging
  // stores, which the compiler may not move them past (a global round trip each: the 64-head
  // decode at batch 128 spent ~11,000 of ~107,000 cycles per block in the epilogue, ~5,500
  // after this change; phase clocks 2026-11-30 07:06 / 07:10 UTC).
  // whole and tok0 recomputed from the parameters, not held in registers over the tile loop
  if constexpr (kFp8) {
    whole = p.num_splits == 1;
  } else {
    whole = static_cast<int>(blockIdx.x) < p.whole_tokens * groups;
    tok0 = whole ? 0 : p.whole_tokens;
  }
  if (sm_part == 0 && whole)
    s_l[sm_head] = l_run > 0.f ? 1.f / (l_run + exp2f(sink_raw * kLog2e - m_run)) : 0.f;
  const bool stat_lane = sm_part == 0 && head0 + sm_head < p.num_heads;
  __syncthreads();
  const int d_base = warp * Cfg::DW;
  if (whole) {
    // normalise, stage bf16 rows [head][dim] in the (free) Q area, then 16-byte stores
    uint8_t* stage = smem + L::q + grp * HG * Cfg::kRowBytes;
#pragma unroll
    for (int hn = 0; hn < HN; ++hn) {
      const float inv[2] = {s_l[hn * 8 + 2 * t], s_l[hn * 8 + 2 * t + 1]};
#pragma unroll
      for (int dm = 0; dm < DM; ++dm) {
        const int d = d_base + dm * 16 + g;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hl = hn * 8 + 2 * t + (e & 1);
          const int dd = d + (e >> 1) * 8;
          const __nv_bfloat16 v = __float2bfloat16_rn(acc[dm][hn][e] * inv[e & 1]);
          *reinterpret_cast<__nv_bfloat16*>(stage + swz(hl, dd >> 3) + (dd & 7) * 2) = v;
        }
      }
    }
    __syncthreads();
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_tok;
    for (int i = tid; i < HG * 64; i += NT) {
      const int r = i >> 6, c = i & 63, h = head0 + r;
      if (h < p.num_heads)
        *reinterpret_cast<uint4*>(out + h * p.out_stride_head + c * 8) =
            *reinterpret_cast<const uint4*>(stage + swz(r, c));
    }
    if (stat_lane) {
      const int h = head0 + sm_head;
      if (p.lse != nullptr)
        p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] =
            l_run > 0.f ? (m_run + log2f(lx_run)) * kLn2 : INFINITY;
      if (p.max_logits != nullptr)
        p.max_logits[tok * p.ml_stride_tok + h * p.ml_stride_head] = l_run > 0.f ? m_run * kLn2 : -INFINITY;
    }
  } else {
    const int64_t row0 = (static_cast<int64_t>(tok - tok0) * p.num_splits + split) * p.num_heads;
#pragma unroll
    for (int hn = 0; hn < HN; ++hn)
#pragma unroll
      for (int dm = 0; dm < DM; ++dm)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = head0 + hn * 8 + 2 * t + (e & 1);
          const int d = d_base + dm * 16 + g + (e >> 1) * 8;
          if (h < p.num_heads) p.part_o[(row0 + h) * kHeadDim + d] = acc[dm][hn][e];
        }
    if (stat_lane) {
      const int64_t ml = (static_cast<int64_t>(tok - tok0) * p.num_splits + split) * 3 * p.num_heads;
      p.part_ml[ml + head0 + sm_head] = m_run;
      p.part_ml[ml + p.num_heads + head0 + sm_head] = l_run;
      p.part_ml[ml + 2 * p.num_heads + head0 + sm_head] = lx_run;
    }
  }
#ifdef DEEPINFER_ATTN_PHASE_CLOCKS
  if ((tid == 0 || tid == 32 * (NT / 32 - 1)) && (blockIdx.x % 997 == 5)) {
    const long long now = clock64();
    unsigned long long ph_ns1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ph_ns1));
    printf("PHASE HG=%d fp8=%d blk=%d grp=%d warp=%d tiles=%d total=%lld ns=%lld pro=%lld wait=%lld "
           "deq=%lld score=%lld bar1=%lld softmax=%lld bar2=%lld pv=%lld epi=%lld\n",
           HG, kFp8 ? 1 : 0, blockIdx.x, grp, warp, num_tiles, now - ph_start,
           static_cast<long long>(ph_ns1 - ph_ns0), ph_cyc[7], ph_cyc[0], ph_cyc[1], ph_cyc[2],
           ph_cyc[3], ph_cyc[4], ph_cyc[5], ph_cyc[6], now - ph_epi0);
  }
#endif
}

}  // namespace deepinfer_sm80::attention
