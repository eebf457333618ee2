// SPDX-License-Identifier: Apache-2.0
// The warp-specialised 64-head prefill tile (sparse_mla_ws_kernel.cuh): its shape and its
// shared-memory layout, host-visible so that plan.h can size launches without CUDA code.
//
// 12 warps: 4 score warps hold Q in registers (32 heads x 256 dims each, 128 registers) and
// read only K through ldmatrix (128 shared-memory bytes per MMA instead of 256 with Q in
// shared memory); 8 PV warps hold O^T (64 dims x 64 heads each, 128 registers), run the
// softmax and copy the key tiles. The score warps work one tile ahead of the PV warps, so the
// two MMA phases overlap. Q no longer needs shared memory: three key stages fit instead.
#pragma once

#include "params.h"

namespace deepinfer_sm80::attention {

struct WsPrefillCfg {
  static constexpr int HG = 64;          // heads per block
  static constexpr int BK = 32;          // keys per tile
  static constexpr int S_WARPS = 4;      // score warps: (head half) x (256-dim slice)
  static constexpr int P_WARPS = 8;      // PV / softmax / loader warps, 64 head dims each
  static constexpr int NTHREADS = (S_WARPS + P_WARPS) * 32;
  static constexpr int P_THREADS = P_WARPS * 32;
  static constexpr int STAGES = 3;       // key tiles in shared memory
  static constexpr int SBUF = 2;         // score buffers (the score warps run one tile ahead)
  static constexpr int KSPLIT = 2;       // head-dim slices of the score MMA
  static constexpr int S_STRIDE = HG + 8;  // fp32 scores [KSPLIT][BK][S_STRIDE]
  static constexpr int P_STRIDE = BK + 8;  // bf16 probabilities [HG][P_STRIDE]
  static constexpr int TPH = P_THREADS / HG;  // softmax threads per head
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kTileBytes = BK * kRowBytes;

  struct Layout {
    static constexpr int kv = 0;
    static constexpr int scores = kv + STAGES * kTileBytes;
    static constexpr int probs = scores + SBUF * KSPLIT * BK * S_STRIDE * 4;
    static constexpr int valid = probs + 2 * HG * P_STRIDE * 2;
    static constexpr int alpha = valid + STAGES * BK * 4;
    static constexpr int stat_m = alpha + 2 * HG * 4;
    static constexpr int stat_l = stat_m + HG * 4;
    static constexpr int total = stat_l + HG * 4;
    static_assert(HG * kRowBytes <= STAGES * kTileBytes, "the output is staged in the key stages");
  };
  static_assert(TPH == 4 && BK % TPH == 0, "softmax split");
};

}  // namespace deepinfer_sm80::attention
