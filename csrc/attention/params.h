// SPDX-License-Identifier: Apache-2.0
// Parameters of the SM80 sparse MLA attention kernels (decode over the FP8 paged cache,
// prefill over the bf16 workspace) and the host launchers' declarations.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace deepinfer_sm80::attention {

constexpr int kHeadDim = 512;     // K = V = the full row
constexpr int kNopeDim = 448;     // FP8 part of a cache record
constexpr int kRopeDim = 64;      // bf16 part of a cache record
constexpr int kDataBytes = 576;   // 448 e4m3 + 64 bf16
constexpr int kScaleBytes = 8;    // 7 UE8M0 + 1 pad, after all data of a block
constexpr int kNumScales = 7;

// One list of key entries per query token.
struct KeySource {
  const uint8_t* base = nullptr;   // FP8 paged cache (decode) or bf16 rows (prefill), bytes
  int64_t block_stride = 0;        // decode: bytes between blocks (cache.stride(0))
  int block_size = 1;              // decode: entries per block
  int64_t row_stride = 0;          // prefill: bytes between kv rows
  int64_t num_rows = 0;            // prefill: s_kv (indices >= s_kv are invalid)
  const int32_t* indices = nullptr;  // [T, topk] (token stride below), -1 = invalid
  int64_t indices_stride = 0;      // elements between tokens
  int topk = 0;                    // list capacity
  const int32_t* lens = nullptr;   // [T] valid prefix length, or nullptr = topk
};

struct SparseMlaParams {
  int num_tokens = 0;
  int num_heads = 0;
  const void* q = nullptr;         // bf16 [T, H, 512] with strides below (elements)
  int64_t q_stride_tok = 0, q_stride_head = 0;
  KeySource src[2];
  int num_sources = 1;
  const float* sink = nullptr;     // [>= H] fp32 or nullptr
  float scale_log2 = 0.f;          // softmax scale * log2(e)
  void* out = nullptr;             // bf16 [T, H, 512]
  int64_t out_stride_tok = 0, out_stride_head = 0;
  float* lse = nullptr;            // [T, H] natural log, +inf for a query without keys
  int64_t lse_stride_tok = 0, lse_stride_head = 0;
  float* max_logits = nullptr;     // [T, H] or nullptr
  int64_t ml_stride_tok = 0, ml_stride_head = 0;
  // Split of each token's key list over several blocks. Decode: num_splits == 1, the main
  // kernel writes out/lse itself; else every token is split and its partials merged by the
  // combine. Prefill: tokens [0, whole_tokens) are not split, the others (the last partial
  // wave's, plan::prefill_tail) num_splits ways, partials [T - whole_tokens, splits, ...].
  int num_splits = 1;
  int whole_tokens = 0;            // prefill only (see above); == num_tokens: nothing split
  int keys_per_split = 0;          // multiple of the tile's key count
  float* part_o = nullptr;         // [split tokens, splits, H, 512] unnormalised sum p*v
  float* part_ml = nullptr;        // [split tokens, splits, 3, H]: max (log2 units), sum of bf16 p, exact sum p
  // Each block prefetches its own token's index lists into L2 in the prologue (0: not).
  int prefetch_lists = 1;
};

// Tile configurations (see config_sm80.h / config_sm86.h and docs/attention.md).
enum class TileConfigId : int { kH64 = 0, kH32 = 1, kH16 = 2, kH8 = 3 };

struct LaunchInfo {
  int heads_per_block;
  int keys_per_tile;
  int threads;
  int smem_bytes;
};

// Shape and shared memory of a configuration: plan::info (plan.h).

// Launch the main kernel (one block per token x split x head group) on stream.
cudaError_t launch_decode(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream);
cudaError_t launch_prefill(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream);

// Merge num_splits partials into out / lse (and the sink).
cudaError_t launch_sparse_mla_combine(const SparseMlaParams& p, cudaStream_t stream);

}  // namespace deepinfer_sm80::attention
