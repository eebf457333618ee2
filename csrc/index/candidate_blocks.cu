// DeepSeek-V4.1's two-level (candidate) selection on a decode's column tiles, reading only the
// visible columns of each row (CandidateParams, index_kernels.h). The torch form of the same step
// (deepinfer_sm80.ampere.indexer.CandidateStep without kernels) runs a scatter-max or a gather
// over every column of the tile, and vLLM's tiles span max_model_len.
//
// Grid (rows, parts): part y of row r takes the y-th share of the row's visible columns in the
// tile, so that no block is launched per max_model_len-wide span of columns; parts is capped
// from the SM count (a few blocks per SM in all rows).
// candidate_block_keys_kernel: one thread per block of block_size columns at a time. In a decode
// a block lies inside one column tile (col0 and n_cols are multiples of block_size, lo 0), so
// each visible block's key is written once over the tiles; a prefill's blocks (starting at each
// row's own first column) may span tiles, and each tile's key is merged by max (merge).
// candidate_mask_kernel: the share in chunks of kMaskCols columns; the row's listed blocks that
// fall in the chunk are marked in a shared-memory bitmap, then the chunk's keys of unlisted
// blocks become INT64_MIN.
#include <cuda_runtime.h>

#include <cstdint>

#include "index/index_kernels.h"

namespace deepinfer_sm80 {
namespace {

constexpr int kThreads = 256;
constexpr int kMaskCols = 4096;  // columns per mask chunk (a 512-byte bitmap at block_size 1)
constexpr int kBlocksPerSm = 4;  // the cap of rows x parts
constexpr uint64_t kLow = 0xFFFFFFFFull;
// the high word of order_keys(-inf, .): keys at or below it carry no valid score
constexpr int32_t kOrderedNegInf = static_cast<int32_t>(0xFF800000u ^ 0x7FFFFFFFu);
constexpr int64_t kPinned = int64_t{0x7F800000} << 32;  // order_keys(+inf, .)'s high word

// [a, b): this part's share of [lo, hi), in units rounded up to `unit`
__device__ __forceinline__ void my_share(int64_t lo, int64_t hi, int64_t unit, int64_t& a, int64_t& b) {
  const int64_t n = hi > lo ? hi - lo : 0;
  int64_t per = (n + gridDim.y - 1) / gridDim.y;
  per = (per + unit - 1) / unit * unit;
  a = lo + per * blockIdx.y;
  b = min(a + per, hi);
}

__global__ void __launch_bounds__(kThreads) candidate_block_keys_kernel(const CandidateParams p) {
  const int r = blockIdx.x;
  const int64_t lo = p.lo != nullptr ? p.lo[r] : 0;
  const int64_t hl = static_cast<int64_t>(p.hi[r]) - lo;  // local positions [0, hl)
  const int bs = p.block_size;
  if (p.visible_blocks != nullptr && blockIdx.y == 0 && threadIdx.x == 0) {
    p.visible_blocks[r] = static_cast<int32_t>(hl > 0 ? (hl + bs - 1) / bs : 0);
  }
  // the tile's visible local positions [a, e)
  const int64_t a = max(static_cast<int64_t>(p.col0) - lo, int64_t{0});
  const int64_t e = min(static_cast<int64_t>(p.col0) + p.n_cols - lo, hl);
  if (a >= e) return;  // uniform
  int64_t b0, b1;  // this part's blocks
  my_share(a / bs, (e + bs - 1) / bs, 1, b0, b1);
  const int64_t newest = (hl - 1) / bs;
  const int64_t* row = p.keys + static_cast<int64_t>(r) * p.key_stride - p.col0 + lo;  // by local position
  int64_t* best = p.best + static_cast<int64_t>(r) * p.best_stride;
  for (int64_t b = b0 + threadIdx.x; b < b1; b += kThreads) {
    const int64_t c0 = max(b * bs, a);
    const int64_t c1 = min(b * bs + bs, e);  // the block's visible columns in this tile
    int64_t m = INT64_MIN;
    for (int64_t c = c0; c < c1; ++c) m = max(m, row[c]);
    int64_t key;
    if (b == newest) {  // the newest visible block: pinned first whatever its scores
      key = kPinned | static_cast<int64_t>(kLow - static_cast<uint64_t>(b));
    } else if (static_cast<int32_t>(m >> 32) <= kOrderedNegInf) {
      key = INT64_MIN;  // no position of the block (here) has a score above -inf
    } else {
      key = static_cast<int64_t>((static_cast<uint64_t>(m) & ~kLow) | (kLow - static_cast<uint64_t>(b)));
    }
    best[b] = p.merge ? max(best[b], key) : key;
  }
}

__global__ void __launch_bounds__(kThreads) candidate_mask_kernel(const CandidateParams p) {
  __shared__ uint32_t bits[kMaskCols / 32];
  const int r = blockIdx.x;
  const int bs = p.block_size;
  const int64_t lo = p.lo != nullptr ? p.lo[r] : 0;
  // the tile's visible local positions, this part's share of them
  const int64_t a0 = max(static_cast<int64_t>(p.col0) - lo, int64_t{0});
  const int64_t e0 = min(static_cast<int64_t>(p.col0) + p.n_cols - lo, static_cast<int64_t>(p.hi[r]) - lo);
  int64_t a, e;
  my_share(a0, e0, kMaskCols, a, e);
  const int32_t* listed = p.listed + static_cast<int64_t>(r) * p.listed_stride;
  int64_t* row = p.keys + static_cast<int64_t>(r) * p.key_stride - p.col0 + lo;  // by local position
  for (int64_t t0 = a; t0 < e; t0 += kMaskCols) {  // uniform
    const int64_t t1 = min(t0 + kMaskCols, e);
    const int64_t b0 = t0 / bs;                  // the chunk's first block
    const int64_t nb = (t1 - 1) / bs - b0 + 1;   // its blocks (<= kMaskCols)
    __syncthreads();  // the previous chunk's reads of the bitmap are done
    for (int i = threadIdx.x; i < kMaskCols / 32; i += kThreads) bits[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < p.n_listed; i += kThreads) {
      const int64_t d = static_cast<int64_t>(listed[i]) - b0;
      if (listed[i] >= 0 && d >= 0 && d < nb) atomicOr(&bits[d >> 5], 1u << (d & 31));
    }
    __syncthreads();
    for (int64_t c = t0 + threadIdx.x; c < t1; c += kThreads) {
      const int64_t d = c / bs - b0;
      if (!((bits[d >> 5] >> (d & 31)) & 1u)) row[c] = INT64_MIN;
    }
  }
}

dim3 parts_grid(const CandidateParams& p, int64_t units, int sm_count) {
  const int64_t cap = (static_cast<int64_t>(kBlocksPerSm) * (sm_count > 0 ? sm_count : 1) + p.rows - 1) / p.rows;
  int64_t parts = min(units, cap);
  parts = max(int64_t{1}, min(parts, int64_t{65535}));
  return dim3(static_cast<unsigned>(p.rows), static_cast<unsigned>(parts));
}

}  // namespace

void launch_candidate_block_keys(const CandidateParams& p, int sm_count, cudaStream_t stream) {
  if (p.rows <= 0 || (p.n_cols <= 0 && p.visible_blocks == nullptr)) return;
  const int64_t blocks = (p.n_cols + p.block_size - 1) / p.block_size;
  candidate_block_keys_kernel<<<parts_grid(p, (blocks + kThreads - 1) / kThreads, sm_count), kThreads, 0, stream>>>(p);
}

void launch_candidate_mask(const CandidateParams& p, int sm_count, cudaStream_t stream) {
  if (p.rows <= 0 || p.n_cols <= 0) return;
  candidate_mask_kernel<<<parts_grid(p, (p.n_cols + kMaskCols - 1) / kMaskCols, sm_count), kThreads, 0, stream>>>(p);
}

}  // namespace deepinfer_sm80
