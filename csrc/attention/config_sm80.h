// SPDX-License-Identifier: Apache-2.0
// Tile configurations. SM80 (A100: 163 KB of opt-in shared memory per block) runs the
// wide ones; SM86 (A6000 / RTX 30xx: 99 KB) runs the ones marked so. The launcher picks
// the widest configuration whose shared memory fits the device's limit (or a forced cap).
//
//         heads keys warps  score warp tile (keys x heads) x head-dim slices  smem bf16 / fp8 (B)
//  kH64    64    32    8     32 x 32 x 2 slices = 4 warps, 256 B/MMA         155648 / 160256   SM80
//          (prefill: 2 groups of CfgH64x2, each 32 heads x 4 warps, 2 score warps    157952 / -)
//  kH32    32    32    8     32 x 32 x 4 slices = 4 warps, 256 B/MMA         121984 / 126592   SM80
//  kH16    16    32    8     32 x 16 x 4 slices = 4 warps, 384 B/MMA          95936 / 100544   SM80, SM86
//  kH8      8    32    8     16 x 8  x 2 slices = 4 warps, 768 B/MMA          77280 /  81888   SM80, SM86
// (B/MMA: shared-memory bytes that the score warps' ldmatrix loads move per m16n8k16 MMA.)
#pragma once

#include "tile_config.h"

namespace deepinfer_sm80::attention {

// Score-MMA warp tiles: the score phase is bound by shared-memory bandwidth (ldmatrix of
// K and Q), so the widest warp tiles win even on fewer warps: measured on the H200
// (docs/attention.md) 64 heads 8 warps of 32 x 16 (384 B/MMA) -> 4 warps of 32 x 32,
// together with the loader's raw-index fix: prefill 169 -> 203 TFLOP/s, decode batch 128
// 93 -> 80 us; 32 heads 8 warps of 16 x 16 x 2 slices -> 4 warps of 32 x 32 x 4 slices
// alone: prefill 131 -> 138 TFLOP/s, decode batch 128 66 -> 63 us. The slices' partial
// scores go to one buffer each and the block-wide softmax adds them.
using CfgH64 = TileConfig<64, 32, 8, 4, 2, 2, 2>;
using CfgH32 = TileConfig<32, 32, 8, 4, 2, 2, 4>;
// 64-head decode whose score warps read the raw records (kRawScores): warp tiles of 16 keys x
// 64 heads x 2 slices, so that every key value is converted by one warp only (32 x 32 tiles
// would convert each twice, once per head half). Same shared-memory layout as CfgH64.
using CfgH64Raw = TileConfig<64, 32, 8, 8, 2, 1, 2>;
// The 64-head prefill (bf16 keys) runs two groups of this 32-head, 4-warp configuration
// over shared key stages (kGroups = 2, sparse_mla_kernel.cuh): 157952 B of shared memory,
// 246 registers; the score warp tile as in kH64 (32 x 32 x 2 slices, 2 warps per group).
using CfgH64x2 = TileConfig<32, 32, 4, 4, 2, 2, 2>;
constexpr int kH64PrefillGroups = 2;

constexpr int kSmemCapSm80 = 163 * 1024;

}  // namespace deepinfer_sm80::attention
