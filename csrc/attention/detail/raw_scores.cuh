// SPDX-License-Identifier: Apache-2.0
// Decode score MMA straight from the raw fp8_ds_mla records in shared memory (kRawScores):
// the A fragments (keys on m16) are built in registers from the e4m3 codes and their UE8M0
// scale (exact: the same bf16 values as the in-block dequantisation), so the score MMA need
// not wait for a dequantised tile, and the score warps store the values they build into the
// bf16 tile that the PV MMA reads. Measured against the serial dequantisation in
// docs/attention.md ("Session of 2026-11-30 from 03:03 UTC").
//
// k order. An m16n8k16 A fragment holds, for lane (g = lane / 4, t = lane % 4), the k pairs
// {2t, 2t+1} (a0 / a1) and {2t+8, 2t+9} (a2 / a3) of rows g and g+8. The MMA sums over k, so
// any permutation of the head dims applied to K and Q alike leaves S unchanged. We choose the
// one where a lane reads one 16-byte vector per row and 64-dim block:
//   NoPE block b (64 e4m3 bytes): lane t reads bytes 16t..16t+15 of the block; k-step s
//     (0..3) uses bytes 4s..4s+3: codes (0,1) -> logical pair t, codes (2,3) -> pair t+4.
//     Physical dim pair phi = 8t + 2s + hi sits at logical pair 8s + t + 4hi.
//   RoPE block (64 bf16 = 128 bytes): lane t reads dims 32h + 8t .. +7 (h = 0, 1); k-step
//     2h + s' (s' = 0, 1) uses dims 8t + 4s' + (0,1) -> pair t and + (2,3) -> pair t+4.
//     Physical pair phi = 16h + 4t + 2s' + hi sits at logical pair 8(2h + s') + t + 4hi.
// Q is stored in shared memory in this logical order (the kernel's prologue), so its B
// fragments come from the usual ldmatrix. The raw rows are 576 bytes apart, so the eight
// lanes of one 128-bit shared load phase (rows g, g+1 x 4 lanes) hit 32 different banks.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "common/fp8_e4m3.cuh"
#include "common/kv_record.cuh"
#include "fp8_record.cuh"
#include "score_store.cuh"
#include "sm80_ptx.cuh"

namespace deepinfer_sm80::attention::raw {

// Logical position (0..31) of physical dim pair phi (0..31) of 64-dim block `block` (7: RoPE).
__host__ __device__ constexpr int logical_pair(int block, int phi) {
  return block < 7 ? 8 * ((phi >> 1) & 3) + (phi >> 3) + 4 * (phi & 1)
                   : 8 * (2 * (phi >> 4) + ((phi >> 1) & 1)) + ((phi >> 2) & 3) + 4 * (phi & 1);
}

// Both orders are permutations of the 32 pairs of a block (checked at compile time).
constexpr bool logical_pair_is_permutation(int block) {
  unsigned seen = 0;
  for (int phi = 0; phi < 32; ++phi) {
    const int l = logical_pair(block, phi);
    if (l < 0 || l >= 32 || (seen >> l) & 1u) return false;
    seen |= 1u << l;
  }
  return seen == 0xFFFFFFFFu;
}
static_assert(logical_pair_is_permutation(0) && logical_pair_is_permutation(7), "k order");

// Four codes of one scale group -> two bf16x2 (codes 0,1 and 2,3). kFast: one bf16x2
// multiply (scale bytes 10..134); otherwise the exact fp32 routes (fp8_record.cuh).
template <bool kFast>
__device__ __forceinline__ void cvt4(uint32_t w, uint32_t sb, __nv_bfloat162 mult, uint32_t& lo,
                                     uint32_t& hi) {
  if constexpr (kFast) {
    __nv_bfloat162 a, b;
    e4m3x4_to_bf16x4_bf16mul(w, mult, a, b);
    lo = bf16x2_bits(a);
    hi = bf16x2_bits(b);
  } else {
    fp8::e4m3x4_exact_to_bf16x4(w, sb, lo, hi);
  }
}

// The warps of head n8-tile 0 also store the bf16 values they build into the swizzled
// bf16 tile `kv` (1 KB rows, chunk c of row r at ((c ^ (r & 7)) << 4)), which then holds the
// whole dequantised tile (the slices cover the dims, the key tiles the rows) for the PV MMA.
__device__ __forceinline__ void store_chunk(uint8_t* kv, int row, int chunk, uint4 v) {
  *reinterpret_cast<uint4*>(kv + row * 1024 + ((chunk ^ (row & 7)) << 4)) = v;
}

template <class Cfg, bool kFast>
__device__ __forceinline__ void score_tile_impl(const uint8_t* raw, const uint8_t* scl, uint32_t q_base,
                                                float* s_scores, uint8_t* kv, int warp, int lane,
                                                float scale_log2) {
  constexpr int KMW = Cfg::KMW, NTW = Cfg::NTW, HN = Cfg::HN, KS_PER = Cfg::KS_PER, BK = Cfg::BK;
  constexpr int NB = KS_PER / 4;  // 64-dim blocks per slice
  constexpr int CH = (KMW * NTW >= 4) ? 1 : 2;
  const int kgrp = warp / Cfg::S_TILES, wt = warp % Cfg::S_TILES;
  const int km0 = (wt / (HN / NTW)) * KMW;
  const int hn0 = (wt % (HN / NTW)) * NTW;
  const int g = lane >> 2, t = lane & 3;
  const bool store = hn0 == 0;
  float sacc[CH][KMW][NTW][4];
  clear_score_tile<Cfg, CH>(sacc);
  // Q^T fragments as in the bf16 path (sparse_mla_kernel.cuh)
  const int mi = lane >> 3, r7 = lane & 7;
  const uint32_t b_row =
      q_base + ((hn0 + (NTW >= 2 ? (mi >> 1) : 0)) * 8 + r7) * 1024 + kgrp * KS_PER * 32;
  uint32_t b_addr[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) b_addr[u] = b_row + ((((2 * u) + (mi & 1)) ^ r7) << 4);
  auto load_b = [&](int ks, uint32_t (&bf)[NTW][2]) {
    const uint32_t addr = b_addr[ks & 3] + (ks >> 2) * 128;
    if constexpr (NTW == 1) {
      ptx::ldmatrix_x2(addr, bf[0][0], bf[0][1]);
    } else {
#pragma unroll
      for (int n = 0; n < NTW; n += 2)
        ptx::ldmatrix_x4(addr + n * 8 * 1024, bf[n][0], bf[n][1], bf[n + 1][0], bf[n + 1][1]);
    }
  };
  // this lane's key rows (km0 + a) * 16 + g + 8 * h2 and their scale words
  const uint8_t* rrow[KMW][2];
  uint2 sc[KMW][2];
#pragma unroll
  for (int a = 0; a < KMW; ++a)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int row = (km0 + a) * 16 + g + 8 * h2;
      rrow[a][h2] = raw + row * kv_record::kDataBytes + t * 16;
      sc[a][h2] = *reinterpret_cast<const uint2*>(scl + row * kv_record::kScaleBytes);
    }
  static_assert(BK == 32, "one scale word per lane in the route check");

#pragma unroll
  for (int bb = 0; bb < NB; ++bb) {
    const int b = kgrp * NB + bb;
    if (bb == NB - 1 && b == kv_record::kNumGroups) {
      // RoPE block: bf16 values, two 16-byte loads per row (h = 0, 1), two k-steps each
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 w[KMW][2];
#pragma unroll
        for (int a = 0; a < KMW; ++a)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2)
            w[a][h2] = *reinterpret_cast<const uint4*>(rrow[a][h2] + kv_record::kRopeOffset + h * 64);
        if (store) {
#pragma unroll
          for (int a = 0; a < KMW; ++a)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2)
              store_chunk(kv, (km0 + a) * 16 + g + 8 * h2, 56 + 4 * h + t, w[a][h2]);
        }
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
          const int ks = bb * 4 + 2 * h + s2, c = CH == 2 ? (ks & 1) : 0;
          uint32_t bf[NTW][2];
          load_b(ks, bf);
#pragma unroll
          for (int a = 0; a < KMW; ++a) {
            uint32_t af[4];
            af[0] = s2 == 0 ? w[a][0].x : w[a][0].z;
            af[2] = s2 == 0 ? w[a][0].y : w[a][0].w;
            af[1] = s2 == 0 ? w[a][1].x : w[a][1].z;
            af[3] = s2 == 0 ? w[a][1].y : w[a][1].w;
#pragma unroll
            for (int n = 0; n < NTW; ++n) ptx::mma_bf16_16816(sacc[c][a][n], af, bf[n][0], bf[n][1]);
          }
        }
      }
    } else {
      uint4 w[KMW][2];
      uint32_t sb[KMW][2];
      __nv_bfloat162 mult[KMW][2];
#pragma unroll
      for (int a = 0; a < KMW; ++a)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          w[a][h2] = *reinterpret_cast<const uint4*>(rrow[a][h2] + b * 64);
          sb[a][h2] = kv_record::group_scale_byte(sc[a][h2], b);
          mult[a][h2] = e4m3_bf16mul_multiplier(sb[a][h2]);
        }
      uint32_t prev[KMW][4];  // the previous k-step's values (rows g, g+8: lo, hi)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int ks = bb * 4 + s, c = CH == 2 ? (ks & 1) : 0;
        uint32_t bf[NTW][2];
        load_b(ks, bf);
#pragma unroll
        for (int a = 0; a < KMW; ++a) {
          uint32_t af[4];
          const uint32_t w0 = s == 0 ? w[a][0].x : s == 1 ? w[a][0].y : s == 2 ? w[a][0].z : w[a][0].w;
          const uint32_t w1 = s == 0 ? w[a][1].x : s == 1 ? w[a][1].y : s == 2 ? w[a][1].z : w[a][1].w;
          cvt4<kFast>(w0, sb[a][0], mult[a][0], af[0], af[2]);
          cvt4<kFast>(w1, sb[a][1], mult[a][1], af[1], af[3]);
#pragma unroll
          for (int n = 0; n < NTW; ++n) ptx::mma_bf16_16816(sacc[c][a][n], af, bf[n][0], bf[n][1]);
          // k-steps 2u, 2u+1 hold dims 16t + 8u .. + 7 of the block: chunk 8b + 2t + u
          if (s & 1) {
            if (store) {
              const int chunk = 8 * b + 2 * t + (s >> 1), row = (km0 + a) * 16 + g;
              store_chunk(kv, row, chunk, make_uint4(prev[a][0], prev[a][1], af[0], af[2]));
              store_chunk(kv, row + 8, chunk, make_uint4(prev[a][2], prev[a][3], af[1], af[3]));
            }
          } else {
            prev[a][0] = af[0];
            prev[a][1] = af[2];
            prev[a][2] = af[1];
            prev[a][3] = af[3];
          }
        }
      }
    }
  }
  store_score_tile<Cfg, CH>(sacc, s_scores, kgrp, km0, hn0, lane, scale_log2);
}

// One score warp's share of a tile. The bf16-multiply route is taken when every valid row of
// the tile has all seven scale bytes in 10..134 (every realistic cache); a warp-uniform
// decision, so the other route's code never runs on the common path.
template <class Cfg>
__device__ __forceinline__ void score_tile(const uint8_t* raw, const uint8_t* scl, const int* valid,
                                           uint32_t q_base, float* s_scores, uint8_t* kv, int warp,
                                           int lane, float scale_log2) {
  const uint2 sw = *reinterpret_cast<const uint2*>(scl + lane * kv_record::kScaleBytes);
  bool ok = true;
#pragma unroll
  for (int gi = 0; gi < kv_record::kNumGroups; ++gi)
    ok &= e4m3_bf16mul_scale_ok(kv_record::group_scale_byte(sw, gi));
  ok |= valid[lane] == 0;
  if (__all_sync(0xffffffffu, ok)) {
    score_tile_impl<Cfg, true>(raw, scl, q_base, s_scores, kv, warp, lane, scale_log2);
  } else {
    score_tile_impl<Cfg, false>(raw, scl, q_base, s_scores, kv, warp, lane, scale_log2);
  }
}

}  // namespace deepinfer_sm80::attention::raw
