// SPDX-License-Identifier: Apache-2.0
// Compile-time tile configuration of the sparse MLA kernel and its shared-memory layout.
//
// Orientation (docs/attention.md): the score MMA computes S^T = K * Q^T with keys on the
// m16 side and heads on the n8 side, so a block of 8 heads uses whole MMAs; the output MMA
// computes O^T = V^T * P^T with head dims on m16 and heads again on n8.
#pragma once

#include "params.h"

namespace deepinfer_sm80::attention {

template <int kHG, int kBK, int kWarps, int kNTW, int kStages, int kKMW = 1, int kKSplit = 1>
struct TileConfig {
  static constexpr int HG = kHG;          // heads per block
  static constexpr int BK = kBK;          // keys per tile
  static constexpr int NWARPS = kWarps;
  static constexpr int NTHREADS = kWarps * 32;
  static constexpr int NTW = kNTW;        // head n8-tiles per warp in the score MMA
  static constexpr int KMW = kKMW;        // key m16-tiles per warp in the score MMA
  static constexpr int STAGES = kStages;  // bf16: K/V tiles in flight; fp8: raw record tiles
  static constexpr int KM = BK / 16;      // key m16-tiles per tile
  static constexpr int HN = HG / 8;       // head n8-tiles
  static constexpr int S_TILES = KM * HN / (NTW * KMW);  // score warp tiles per key tile
  static constexpr int KSPLIT = kKSplit;  // head-dim slices of the score MMA (one warp each)
  static constexpr int S_WARPS = S_TILES * KSPLIT;        // warps busy in the score MMA
  static constexpr int KS_PER = kHeadDim / 16 / KSPLIT;   // 16-dim k-steps per score warp
  static constexpr int DW = kHeadDim / NWARPS;   // head dims per warp in the PV MMA
  static constexpr int DM = DW / 16;
  static constexpr int TPH = NTHREADS / HG;      // softmax threads per head
  // fp32 scores [KSPLIT][BK][S_STRIDE]; 8-head tiles pad by 2 only, so that with two
  // slices the fp8 layout still fits two blocks in an A100 SM (2 x (81888 + 1024) B <= 164 KB)
  static constexpr int S_STRIDE = HG + (HG >= 16 ? 8 : 2);
  static constexpr int P_STRIDE = BK + 8;        // bf16 probabilities [HG][BK + 8]

  static_assert(HG % 8 == 0 && BK % 16 == 0, "tile shape");
  static_assert((HN % NTW) == 0 && (KM % KMW) == 0 && S_WARPS <= NWARPS, "score MMA split");
  static_assert(KS_PER % 4 == 0, "score k-slices start on a 64-dim (swizzle period) boundary");
  static_assert(DW % 64 == 0, "PV MMA split (the swizzle arithmetic needs 64-dim slices)");
  static_assert(TPH >= 1 && TPH <= 32 && (TPH & (TPH - 1)) == 0 && BK % TPH == 0, "softmax split");
  static_assert(NTW <= 8 && (NTW == 1 || NTW % 2 == 0), "B fragment loads");

  // Shared memory layout (bytes). Q and K/V rows are 1024 bytes with 16-byte chunks
  // XOR-swizzled by (row & 7) so that ldmatrix of 8 rows touches 8 different bank groups.
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kTileBytes = BK * kRowBytes;
  static constexpr int kRawBytes = BK * kDataBytes;      // fp8 records, data part
  static constexpr int kRawScaleBytes = BK * kScaleBytes;
  // kGroups > 1 (the two-group 64-head prefill): the block holds kGroups groups of NWARPS warps, each
  // with its own HG heads (Q rows, scores, P, statistics) over the same K/V stages; the
  // per-group buffers (scores .. stat_l) repeat after the first group's, group g's at
  // + g * group_stride (valid: the first group's, shared).
  template <bool kFp8, int kGroups = 1>
  struct Layout {
    static constexpr int q = 0;
    static constexpr int kv = q + kGroups * HG * kRowBytes;
    static constexpr int kv_tiles = kFp8 ? 1 : STAGES;
    static constexpr int raw = kv + kv_tiles * kTileBytes;
    static constexpr int raw_scale = raw + (kFp8 ? STAGES * kRawBytes : 0);
    static constexpr int scores = raw_scale + (kFp8 ? STAGES * kRawScaleBytes : 0);
    static constexpr int probs = scores + KSPLIT * BK * S_STRIDE * 4;
    static constexpr int valid = probs + HG * P_STRIDE * 2;
    static constexpr int alpha = valid + STAGES * BK * 4;
    // stat_m: unused since the epilogue's normaliser moved into registers (2026-11-30); kept
    // so that the measured layouts (and the 8-head tiles' two blocks per A100 SM) stay as recorded
    static constexpr int stat_m = alpha + HG * 4;
    static constexpr int stat_l = stat_m + HG * 4;
    static constexpr int group_stride = stat_l + HG * 4 - scores;
    static constexpr int total = stat_l + HG * 4 + (kGroups - 1) * group_stride;
    static_assert(group_stride % 16 == 0, "per-group buffers keep 16-byte alignment");
  };
};

}  // namespace deepinfer_sm80::attention
