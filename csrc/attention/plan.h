// SPDX-License-Identifier: Apache-2.0
// Launch planning of the sparse MLA kernels, host-only and torch-free so that it can be
// checked on a CPU (tests/native/attention_plan_check.cpp):
//   info(id, fp8)                     heads / keys per tile / threads / shared memory of a configuration
//   widest_config(heads, fp8, cap)    the widest configuration that fits a shared-memory cap
//   decode_config(...)                the same, narrowed for decode grids that would leave SMs idle
//   decode_splits(...)                split count of each token's key list for decode
//   prefill_tail(...)                 tokens of a prefill's last partial wave and their splits
#pragma once

#include <algorithm>
#include <cstdint>

#include "config_sm80.h"
#include "config_sm86.h"
#include "params.h"

namespace deepinfer_sm80::attention::plan {

constexpr int64_t kMaxSplits = 64;  // combine keeps the per-split weights in shared memory

template <class Cfg, bool kFp8, int kGroups = 1>
constexpr LaunchInfo info_of() {
  return LaunchInfo{Cfg::HG * kGroups, Cfg::BK, Cfg::NTHREADS * kGroups,
                    Cfg::template Layout<kFp8, kGroups>::total};
}

// decode = fp8 loader, prefill = bf16 loader (64 heads: two groups of CfgH64x2)
inline LaunchInfo info(TileConfigId id, bool fp8) {
  switch (id) {
    case TileConfigId::kH64:
      return fp8 ? info_of<CfgH64, true>() : info_of<CfgH64x2, false, kH64PrefillGroups>();
    case TileConfigId::kH32: return fp8 ? info_of<CfgH32, true>() : info_of<CfgH32, false>();
    case TileConfigId::kH16: return fp8 ? info_of<CfgH16, true>() : info_of<CfgH16, false>();
    case TileConfigId::kH8: break;
  }
  return fp8 ? info_of<CfgH8, true>() : info_of<CfgH8, false>();
}

// Key tiles of a list of `keys` keys (at least one: an empty list still runs one tile).
inline int64_t tiles(int64_t keys, const LaunchInfo& li) {
  return std::max<int64_t>(1, (keys + li.keys_per_tile - 1) / li.keys_per_tile);
}

// Head groups (blocks per token and split) a configuration needs for `heads` heads.
inline int64_t head_groups(int64_t heads, const LaunchInfo& li) {
  return (heads + li.heads_per_block - 1) / li.heads_per_block;
}

// Widest configuration (most heads per block, up to the head count) whose shared memory
// fits smem_cap; false when none does.
inline bool widest_config(int64_t heads, bool fp8, int smem_cap, TileConfigId* out) {
  const TileConfigId order[] = {TileConfigId::kH64, TileConfigId::kH32, TileConfigId::kH16,
                                TileConfigId::kH8};
  for (TileConfigId id : order) {
    const LaunchInfo li = info(id, fp8);
    if (li.heads_per_block > 8 && li.heads_per_block > heads) continue;
    if (li.smem_bytes <= smem_cap) {
      *out = id;
      return true;
    }
  }
  return false;
}

// Decode: from the widest configuration that fits, narrow the head group while the grid,
// even with the most useful splits (one tile each), would leave more than half of the SMs
// idle: a batch-1 step with 64 heads runs 4 groups of 16 heads x 20 splits instead of 20
// blocks that each do 4x the work per tile; the groups re-read the same keys from L2.
// Measured on the H200 (batch 1, 64 heads, 640 keys): 64-head blocks 14.4 us, 8-head
// groups 11.5 us, 16-head groups 10.5 us (docs/attention.md).
inline TileConfigId decode_config(TileConfigId widest, int64_t tokens, int64_t heads,
                                  int64_t capacity, int sms, bool narrow) {
  TileConfigId id = widest;
  if (!narrow) return id;
  while (id != TileConfigId::kH8) {
    const LaunchInfo li = info(id, true);
    const int64_t groups = head_groups(heads, li);
    const int64_t useful_splits = std::min<int64_t>(tiles(capacity, li), kMaxSplits);
    if (2 * tokens * groups * useful_splits >= sms) break;
    id = static_cast<TileConfigId>(static_cast<int>(id) + 1);  // next narrower (kH64 -> kH32 -> ...)
  }
  return id;
}

// Blocks of a configuration resident per SM under a shared-memory cap (1 KB reserved per
// block; at most 2048 threads per SM).
inline int64_t resident_blocks(const LaunchInfo& li, int smem_cap) {
  return std::max<int64_t>(
      1, std::min<int64_t>((smem_cap + 1024) / (li.smem_bytes + 1024), 2048 / li.threads));
}

// Split count for decode: fill the machine without paying for many partials. Cost model in
// tiles of work: waves * (tiles per block + 2 for Q load / epilogue) + 1 for the combine.
inline int decode_splits(int64_t tokens, int64_t groups, int64_t capacity, const LaunchInfo& li,
                         int sms, int smem_cap) {
  if (tokens == 0 || capacity <= li.keys_per_tile) return 1;
  const int64_t max_splits = std::min<int64_t>(tiles(capacity, li), kMaxSplits);
  const int64_t slots = sms * resident_blocks(li, smem_cap);
  const int64_t base = tokens * groups;
  double best = 1e30;
  int best_s = 1;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t waves = (base * s + slots - 1) / slots;
    const int64_t per_block = (capacity + s * li.keys_per_tile - 1) / (s * li.keys_per_tile);
    const double cost = static_cast<double>(waves) * (per_block + 2) + (s > 1 ? 1.0 : 0.0);
    if (cost < best - 1e-9) {
      best = cost;
      best_s = static_cast<int>(s);
    }
  }
  return best_s;
}

// Keys per split block when a list of `capacity` keys is split `splits` ways: whole tiles,
// the same for every split (the last split may get fewer keys).
inline int keys_per_split(int64_t capacity, int splits, const LaunchInfo& li) {
  return static_cast<int>((tiles(capacity, li) + splits - 1) / splits * li.keys_per_tile);
}

// Prefill: the tokens of the last, partial wave of blocks, and their split count. A prefill
// runs one block per token x head group, each the whole key list; when the blocks are not a
// multiple of the resident slots, the last wave runs a few long blocks on an otherwise idle
// GPU (4,096 tokens of 64 heads on the H200's 132 SMs: 32 waves for 31.03 waves of work, ~3%
// of the time; on a 108-SM A100, 37.9 waves). Those tokens' key lists are split instead
// (decode_splits' cost model on the tail alone): their split blocks run after the whole ones
// in the same launch, and the combine merges them. {0, 1}: nothing split (the blocks fill
// whole waves, splitting does not pay, or two blocks share an SM).
struct PrefillTail {
  int64_t tokens;
  int splits;
};

inline PrefillTail prefill_tail(int64_t tokens, int64_t groups, int64_t capacity,
                                const LaunchInfo& li, int sms, int smem_cap) {
  if (tokens <= 0 || groups <= 0 || sms <= 0) return {0, 1};
  // Only where one block fills an SM: with two resident blocks per SM a partial last wave
  // runs its blocks one per SM, faster than the model's full-wave cost (8 heads, 4,096 tokens
  // on 132 SMs, 136 tokens x 3 splits: 515 us against 505 unsplit, H200 2026-11-30 08:31 UTC).
  if (resident_blocks(li, smem_cap) != 1) return {0, 1};
  const int64_t slots = sms;
  const int64_t rem_blocks = (tokens * groups) % slots;
  if (rem_blocks == 0) return {0, 1};
  const int64_t tail = std::min<int64_t>(tokens, (rem_blocks + groups - 1) / groups);
  const int s = decode_splits(tail, groups, capacity, li, sms, smem_cap);
  if (s <= 1) return {0, 1};
  return {tail, s};
}

}  // namespace deepinfer_sm80::attention::plan
