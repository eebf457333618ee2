// SPDX-License-Identifier: Apache-2.0
// Tile configurations. SM80 (A100: 163 KB of opt-in shared memory per block) runs the
// wide ones; SM86 (A6000 / RTX 30xx: 99 KB) runs the ones marked so. The launcher picks
// the widest configuration whose shared memory fits the device's limit (or a forced cap).
//
//            heads  keys  warps  score warp tile (keys x heads)  stages  smem bf16 / fp8 (bytes)
//  kH64       64     32     8     32 x 16 on 4 warps               2     146688 / 151296   SM80
//  kH32       32     32     8     16 x 16 on 4 warps               2     106752 / 111360   SM80
//  kH16       16     32     8     16 x 8  on 4 warps               2      86784 /  91392   SM80, SM86
//  kH8         8     32     8     16 x 8  on 2 warps               2      76800 /  81408   SM80, SM86
#pragma once

#include "tile_config.h"

namespace deepinfer_sm80::attention {

// Score-MMA warp tiles: 64 heads -> 4 warps of 32 keys x 16 heads (384 shared-memory bytes
// per MMA), 32 heads -> 4 warps of 16 x 16 (512 B per MMA); measured on the H200 against
// 8 warps of 16 x 16 (64 heads) / 16 x 8 (32 heads): prefill +8% / +10%, decode batch 128
// +5% / +6% (docs/attention.md). The online softmax stays block-wide (all 8 warps): a
// per-warp softmax in the 4 score warps was measured slower (prefill 64 heads -13%).
using CfgH64 = TileConfig<64, 32, 8, 4, 2, 2, 2>;
using CfgH32 = TileConfig<32, 32, 8, 4, 2, 2, 4>;

constexpr int kSmemCapSm80 = 163 * 1024;

}  // namespace deepinfer_sm80::attention
