// SPDX-License-Identifier: Apache-2.0
// The start and end of a score warp's tile (zeroed accumulators; the store), shared by the bf16-tile and the raw-record score paths:
// fold the even/odd k-step accumulators (CH == 2) and store the warp's KMW x NTW MMA tiles,
// times scale * log2(e), into its slice's fp32 score buffer [BK][S_STRIDE] (keys x heads).
#pragma once

namespace deepinfer_sm80::attention {

template <class Cfg, int CH>
__device__ __forceinline__ void clear_score_tile(float (&sacc)[CH][Cfg::KMW][Cfg::NTW][4]) {
#pragma unroll
  for (int u = 0; u < CH; ++u)
#pragma unroll
    for (int a = 0; a < Cfg::KMW; ++a)
#pragma unroll
      for (int n = 0; n < Cfg::NTW; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) sacc[u][a][n][c] = 0.f;
}

template <class Cfg, int CH>
__device__ __forceinline__ void store_score_tile(float (&sacc)[CH][Cfg::KMW][Cfg::NTW][4], float* s_scores,
                                                 int kgrp, int km0, int hn0, int lane, float scale_log2) {
  constexpr int KMW = Cfg::KMW, NTW = Cfg::NTW;
  const int g = lane >> 2, t = lane & 3;
  if constexpr (CH == 2) {
#pragma unroll
    for (int a = 0; a < KMW; ++a)
#pragma unroll
      for (int n = 0; n < NTW; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) sacc[0][a][n][c] += sacc[1][a][n][c];
  }
  float* sbuf = s_scores + kgrp * Cfg::BK * Cfg::S_STRIDE;
#pragma unroll
  for (int a = 0; a < KMW; ++a)
#pragma unroll
    for (int n = 0; n < NTW; ++n) {
      const int col = (hn0 + n) * 8 + 2 * t;
      const int row = (km0 + a) * 16 + g;
      *reinterpret_cast<float2*>(sbuf + row * Cfg::S_STRIDE + col) =
          make_float2(sacc[0][a][n][0] * scale_log2, sacc[0][a][n][1] * scale_log2);
      *reinterpret_cast<float2*>(sbuf + (row + 8) * Cfg::S_STRIDE + col) =
          make_float2(sacc[0][a][n][2] * scale_log2, sacc[0][a][n][3] * scale_log2);
    }
}

}  // namespace deepinfer_sm80::attention
