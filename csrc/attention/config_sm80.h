// SPDX-License-Identifier: Apache-2.0
// Tile configurations. SM80 (A100: 163 KB of opt-in shared memory per block) runs the
// wide ones; SM86 (A6000 / RTX 30xx: 99 KB) runs the ones marked so. The launcher picks
// the widest configuration whose shared memory fits the device's limit (or a forced cap).
//
//            heads  keys  warps  score n-tiles  stages   smem bf16 / fp8 (bytes)
//  kH64       64     32     8        2            2       146688 / 151296   SM80
//  kH32       32     32     8        1            2       106752 / 111360   SM80
//  kH16       16     32     8        1            2        86784 /  91392   SM80, SM86
//  kH8         8     32     8        1            2        76800 /  81408   SM80, SM86
#pragma once

#include "tile_config.h"

namespace deepinfer_sm80::attention {

// Score-MMA warp tiles: 64 heads -> 4 warps of 32 keys x 16 heads (384 shared-memory bytes
// per MMA; the warp holds all keys of its heads, so the softmax runs in its registers);
// 32 heads -> 4 warps of 16 x 16 (512 B per MMA, softmax through shared memory).
using CfgH64 = TileConfig<64, 32, 8, 2, 2, 2>;
using CfgH32 = TileConfig<32, 32, 8, 2, 2, 1>;
// Register-softmax alternative for 32 heads (4 warps of 32 keys x 8 heads), selected with
// $DEEPINFER_ATTN_REGSM=1 while being measured.
using CfgH32r = TileConfig<32, 32, 8, 1, 2, 2>;

constexpr int kSmemCapSm80 = 163 * 1024;

}  // namespace deepinfer_sm80::attention
