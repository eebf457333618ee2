// Pieces shared by the indexer's two scorers (indexer_keys.cu: a warp per row; indexer_rows.cu:
// a block of rows sharing each decoded K tile): the key order and NaN constants.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace deepinfer_sm80 {
namespace indexer_keys {

constexpr int kD = 128;                     // index head dim (bytes per code row)
constexpr int64_t kKeyMin = INT64_MIN;      // a column outside [lo, hi)
constexpr uint32_t kF16x2NaN = 0x7E007E00u;  // two fp16 NaNs: poisons an MMA operand

__device__ __forceinline__ void words8(uint4 a, uint4 b, uint32_t (&w)[8]) {
  w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
  w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}

// deepinfer_sm80.ampere.indexer.order_keys: the score's order in the high 32 bits (NaN as
// -inf, -0 as +0), then the column ascending (`local` = column - lo) in the low 32.
__device__ __forceinline__ int64_t order_key(float x, int64_t local) {
  if (x != x) x = -__int_as_float(0x7F800000);  // NaN -> -inf
  if (x == 0.0f) x = 0.0f;                        // -0 -> +0
  const int32_t bits = __float_as_int(x);
  const int64_t ordered = bits < 0 ? static_cast<int64_t>(bits ^ 0x7FFFFFFF) : bits;
  return ordered * (int64_t{1} << 32) + (int64_t{0xFFFFFFFF} - local);
}

// x clamped to [lo, hi] (lo <= hi), as an int: a window bound in the call's columns.
__host__ __device__ __forceinline__ int clamp_cols(int64_t x, int lo, int hi) {
  return static_cast<int>(x < lo ? lo : (x > hi ? hi : x));
}

// Columns per block when a row's (or a block of rows') n_vis visible columns are spread over
// the row's `blocks` blocks: the even share rounded up to whole units of `unit` columns, at
// most `chunk` (the launch's columns per block, which the shared memory is sized for; blocks
// x chunk covers the call, so blocks x the result covers the visible columns).
__host__ __device__ __forceinline__ int visible_chunk(int n_vis, int blocks, int unit, int chunk) {
  int c = (n_vis + blocks - 1) / blocks;
  c = (c + unit - 1) / unit * unit;
  return c < chunk ? c : chunk;
}

// Calls f(std::integral_constant<int, NT>{}) with NT = heads / 8 head tiles for 16, 32 or 64
// heads (the ops check the head count first); false for any other count.
template <class F>
bool with_head_tiles(int heads, F&& f) {
  switch (heads) {
    case 16: f(std::integral_constant<int, 2>{}); return true;
    case 32: f(std::integral_constant<int, 4>{}); return true;
    case 64: f(std::integral_constant<int, 8>{}); return true;
    default: return false;
  }
}

}  // namespace indexer_keys
}  // namespace deepinfer_sm80
