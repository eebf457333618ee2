// The DeepSeek-V4 `fp8_ds_mla` KV record (584 bytes per entry), defined once.
//
// A cache page (block) of `block_size` entries, starting at
//     block_base = cache + (int64_t)block_id * block_stride_bytes   (block_stride = k_cache.stride(0))
// holds all entry data first, then all scales:
//     entry i data   at block_base + i * 576:  448 e4m3 NoPE bytes (7 groups x 64, one UE8M0
//                                               scale per group), then 64 bf16 RoPE values
//                                               (128 bytes, copied raw)
//     entry i scales at block_base + block_size * 576 + i * 8: 7 UE8M0 bytes + 1 zero byte
// The page is padded up to a multiple of 576 bytes (e.g. 64 x 584 = 37376 -> stride 37440),
// so a [num_blocks, block_size, 584] view must never be indexed as [b, i, :].
#pragma once

#include <cstdint>
#include <vector_types.h>

namespace deepinfer_sm80 {
namespace kv_record {

constexpr int kNopeDim = 448;
constexpr int kRopeDim = 64;
constexpr int kHeadDim = 512;       // kNopeDim + kRopeDim
constexpr int kGroupSize = 64;      // values per UE8M0 scale
constexpr int kNumGroups = 7;       // kNopeDim / kGroupSize
constexpr int kDataBytes = 576;     // kNopeDim + 2 * kRopeDim
constexpr int kRopeOffset = 448;    // byte offset of the RoPE part inside the data
constexpr int kScaleBytes = 8;      // kNumGroups + 1 pad
constexpr int kRecordBytes = 584;   // kDataBytes + kScaleBytes

static_assert(kNopeDim + kRopeDim == kHeadDim, "head dim");
static_assert(kNumGroups * kGroupSize == kNopeDim, "groups");
static_assert(kNopeDim + 2 * kRopeDim == kDataBytes, "data bytes");
static_assert(kDataBytes + kScaleBytes == kRecordBytes, "record bytes");

// Minimum bytes a block must span for `block_size` entries.
__host__ __device__ constexpr int64_t block_bytes(int block_size) {
  return static_cast<int64_t>(block_size) * kRecordBytes;
}

__host__ __device__ __forceinline__ const uint8_t* block_base(const uint8_t* cache,
                                                             int64_t block_id,
                                                             int64_t block_stride_bytes) {
  return cache + block_id * block_stride_bytes;
}
__host__ __device__ __forceinline__ uint8_t* block_base(uint8_t* cache, int64_t block_id,
                                                       int64_t block_stride_bytes) {
  return cache + block_id * block_stride_bytes;
}

// Byte offsets inside a block (int64 so callers never form 32-bit products).
__host__ __device__ __forceinline__ int64_t data_offset(int pos_in_block) {
  return static_cast<int64_t>(pos_in_block) * kDataBytes;
}
__host__ __device__ __forceinline__ int64_t scale_offset(int block_size, int pos_in_block) {
  return static_cast<int64_t>(block_size) * kDataBytes +
         static_cast<int64_t>(pos_in_block) * kScaleBytes;
}

// UE8M0 byte of group g (0..6) from an entry's 8 scale bytes loaded as one uint2.
__host__ __device__ __forceinline__ uint32_t group_scale_byte(uint2 scales, int g) {
  return ((g < 4 ? scales.x : scales.y) >> (8 * (g & 3))) & 0xFFu;
}

}  // namespace kv_record
}  // namespace deepinfer_sm80
