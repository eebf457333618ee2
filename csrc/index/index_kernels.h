// Launchers of the sparse-attention index kernels (torch-free; csrc/api/index.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_limits.h"
#include "common/fast_div.h"

namespace deepinfer_sm80 {

// compute_global_topk_indices_and_lens:
//   global[t, j] = l >= 0 ? block_table[req[t], l / bs] * bs + l % bs : -1   (int32 wrap)
//   lens[t]      = is_valid[t] ? #{j : topk[t, j] >= 0} : 0
// A lookup outside block_table (req or column out of range) yields -1 (never read).
struct GlobalTopkParams {
  int32_t* global_idx;            // [T, K]
  int64_t global_stride0;         // elements
  int32_t* lens;                  // [T]
  const int32_t* topk;            // [T, K], last dim contiguous
  int64_t topk_stride0;
  const int32_t* token_to_req;    // [T]
  const int32_t* block_table;     // [R, max_blocks], any strides
  int64_t bt_stride0;
  int64_t bt_stride1;
  int num_reqs;
  int max_blocks;
  int block_size;
  const bool* is_valid_token;     // [T]
  int num_tokens;
  int k;
  bool vec4;                      // 16-byte rows: K % 4 == 0, strides % 4 == 0, aligned
};

// combine_topk_swa_indices (one pass: every element of idx is written, -1 where unused).
struct CombineParams {
  int32_t* idx;                   // [T, width]
  int64_t idx_stride0;
  int width;
  int32_t* lens;                  // [T]; rows outside every request are left unwritten
  const int32_t* topk;            // [T, >= top_k], last dim contiguous
  int64_t topk_stride0;
  const int32_t* query_start_loc; // [R + 1] (rebased by its first element)
  const int32_t* seq_lens;        // [R]
  const int32_t* gather_lens;     // [R]
  const int32_t* left_visible;    // [T] or nullptr
  const int32_t* right_visible;   // [T] or nullptr
  int num_reqs;
  int num_tokens;
  int window;
  int ratio;
  int top_k;
  int image_width;                // max_image_tokens when left/right are given, else 0
  int32_t M;
  int32_t N;
  bool vec4;                      // idx and topk rows 16-byte aligned (see index.cpp)
  bool v41 = false;               // DeepSeek-V4.1's semantics (combine_topk_swa.cu); no image
};

// What the one-request combine kernel takes from the host, once per launch (a second kernel
// argument, so that CombineParams, and the SASS of the kernel for more requests, stay as
// measured).
struct CombineOneReqParams {
  int swa_extent;                 // W * ceil((W + image_width) / W), int32 arithmetic
  FastDivU31 ratio_div;           // make_fast_div(ratio)
};

// Lightning-indexer scorer (indexer_keys.cu), paged (decode) or flat (prefill): int64 top-k keys of
//   logit[row, c] = k_scale[c] * sum_h relu(q[row, h] . k[c]) * w[row, h]
// for the call's columns c = col0 + i, 0 <= i < n_cols; INT64_MIN outside [lo[row], hi[row]).
struct IndexerKeysParams {
  int64_t* out;                   // [rows, >= n_cols], row stride out_stride0 (elements)
  int64_t out_stride0;
  const uint8_t* q;               // [rows, heads, 128] e4m3 codes, contiguous
  const float* w;                 // [rows, heads], contiguous
  // Paged mode (k_codes == nullptr); flat mode reads none of these, so they default to empty.
  const uint8_t* pages = nullptr;  // [num_pages, page_stride bytes]: bs x 128 codes, bs fp32
  int64_t page_stride = 0;         // bytes, a multiple of 16
  int64_t num_pages = 0;
  const int32_t* block_table = nullptr;  // [num_reqs, max_blocks], any strides
  int64_t bt_stride0 = 0;
  int64_t bt_stride1 = 0;
  int num_reqs = 0;
  int max_blocks = 0;
  const int32_t* row_req = nullptr;  // [rows] request of each row
  const int32_t* lo;              // [rows] first visible global column
  const int32_t* hi;              // [rows] end of the visible columns
  int rows;
  int heads;                      // 16, 32 or 64
  int col0;
  int n_cols;
  int block_size = 0;             // columns per page (paged mode)
  FastDivU31 bs_div;              // set by the launcher
  int chunk;                      // columns per block (multiple of 64); <= 0: the launcher's
  // Flat mode (the prefill workspace; k_codes != nullptr): column c is row c of k_codes
  // ([num_k, 128] e4m3 codes, row stride k_stride bytes, a multiple of 16) with scale
  // k_scales[c]; pages, block_table and row_req are not read, and columns at or past num_k
  // are never read (they score 0, as a column of a missing page does in paged mode).
  const uint8_t* k_codes = nullptr;
  int64_t k_stride = 0;
  const float* k_scales = nullptr;
  int64_t num_k = 0;
  // Paged mode of the rows kernel (launch_indexer_rows): rows per block, each block taking rows
  // [b * group_rows, (b + 1) * group_rows); 2..8. Rows of one request should be contiguous and
  // aligned to it (then a block streams one request's pages once for all its rows); any order
  // is correct.
  int group_rows = 0;
  // false: columns outside every row's [lo, hi) (a warp-kernel row's window; a rows-kernel
  // block's union of its rows' windows) are left as they are instead of set to INT64_MIN, for
  // a caller that reads only the windows (the decode top-k with a max_model_len-wide block
  // table). A row without a valid request is still written whole.
  bool fill = true;
};

constexpr int kIndexerKeysChunkStep = 64;  // 4 warps x 16-column tiles
// Page ids a block keeps in shared memory: chunks span at most this many pages (so that
// the page table stays within 8 KB of shared memory).
constexpr int kIndexerKeysMaxPages = 2048;
void launch_indexer_keys(const IndexerKeysParams& p, const DeviceLimits& lim, cudaStream_t stream);
// Blocks of rows sharing each decoded K tile (indexer_rows.cu): the same keys as
// launch_indexer_keys, bit for bit. Flat mode (k_codes set, group_rows 0) or paged (group_rows
// 2..8). Fits where the block's fp16 Q, weights and (paged) page-id table fit the cap.
bool indexer_rows_fits(int heads, const DeviceLimits& lim, int group_rows = 0);
void launch_indexer_rows(const IndexerKeysParams& p, const DeviceLimits& lim, cudaStream_t stream);

// Per-row top-k of int64 keys, sorted descending (row_topk.cu): out[r, :k] equals
// torch.topk(keys[r] padded with INT64_MIN to >= k, k, sorted=True).values.
struct RowTopkParams {
  const int64_t* keys;            // [rows, n], row stride key_stride (elements)
  int64_t key_stride;
  int64_t* out;                   // [rows, >= k], row stride out_stride; or nullptr and:
  int64_t out_stride;
  int32_t* out_idx = nullptr;     // [rows, >= k] int32 column indices instead of the keys:
                                  // (2^32 - 1) - (key & (2^32 - 1)), -1 for INT64_MIN
                                  // (deepinfer_sm80.ampere.indexer.keys_to_indices)
  int rows;
  int n;
  int k;                          // 1..kRowTopkMaxK
  // Optional visible window (win_hi != nullptr): the caller promises that key j >= win_prefix
  // of row r, the key of column win_col0 + (j - win_prefix), is INT64_MIN unless that column is
  // in [win_lo[r] (0 when win_lo is nullptr), win_hi[r]). The kernel then reads only keys
  // [0, win_prefix) and the window's keys: the same result as over the whole row (the skipped
  // keys are INT64_MIN, which only pads), without reading a row as wide as the block table.
  // With win_head (window mode only): the win_prefix keys of a running best come from row r of
  // win_head (row stride win_head_stride), and every key of `keys` is a window column (key j of
  // column win_col0 + j; n counts both), so a merge needs no concatenated copy.
  const int32_t* win_lo = nullptr;
  const int32_t* win_hi = nullptr;
  int64_t win_col0 = 0;
  int win_prefix = 0;
  const int64_t* win_head = nullptr;
  int64_t win_head_stride = 0;
  int stage_max = 0;              // set by the launcher: rows of at most this many keys (and
                                  // more than k) are staged in shared memory
};
constexpr int kRowTopkMaxK = 2048;  // 2048: DeepSeek-V4.1's candidate blocks per row
// The split launches (row_topk_split_blocks > 0: windows without a prefix, rows longer than
// shared memory holds, at most a quarter as many rows as SMs): a first launch takes each row's window in `blocks`
// chunks (of the staged row length), one block each, and writes each chunk's top-k keys to ws
// [rows, blocks, k]; a second takes the top-k of a row's chunk results. A window of at most one
// chunk is done whole by the first launch. Same result: the k largest keys of a row are among
// the k largest of its chunks. (Its own argument: growing RowTopkParams changed the code ptxas
// makes of the one-launch kernel, 36 -> 26 unrolled key loads on sm_90, slower.)
struct RowTopkSplit {
  int64_t* ws = nullptr;
  int blocks = 0;
};
// Chunks per row of the split launches for p (its window set) on a device of sm_count SMs, 0:
// one launch. $DEEPINFER_ROW_TOPK_SPLIT=0: always 0.
int row_topk_split_blocks(const RowTopkParams& p, int sm_count);
void launch_row_topk(const RowTopkParams& p, cudaStream_t stream, const RowTopkSplit& split = {});

// DeepSeek-V4.1's two-level selection on one column tile of an indexer step's keys
// (candidate_blocks.cu; deepinfer_sm80.ampere.indexer.CandidateStep). keys[r, j] is the key of
// column col0 + j (deepinfer_sm80.ampere.indexer.order_keys); row r sees columns [lo[r], hi[r])
// (lo nullptr: 0, a decode's request-local columns), local position c - lo[r]; block b is local
// positions [b * block_size, (b + 1) * block_size). Only the visible columns of the tile are read
// or written: a vLLM decode's tiles span max_model_len.
struct CandidateParams {
  int64_t* keys;                  // [rows, >= n_cols], row stride key_stride
  int64_t key_stride;
  int col0;
  int n_cols;
  const int32_t* hi;              // [rows]
  const int32_t* lo = nullptr;    // [rows] or nullptr (0)
  int rows;
  int block_size;
  // block keys (the candidate-source layer): best[r, b] for every block b visible in the tile =
  // the largest key of its columns with the low word replaced by the inverted block id,
  // INT64_MIN when that key's score is -inf or below (no valid position), the score +inf for the
  // row's newest block (pinned first): ordered by (score desc, block asc), so the row top-k of
  // best over [0, ceil((hi - lo) / block_size)) with column indices gives the blocks. merge
  // false: the tile holds each of its blocks whole (a decode: col0 and n_cols multiples of
  // block_size, lo 0), best[r, b] is written; true: best[r, b] = max(best[r, b], that key), for
  // blocks split across tiles (a prefill's rows start anywhere; best starts at INT64_MIN).
  int64_t* best = nullptr;        // [rows, >= blocks], row stride best_stride
  int64_t best_stride = 0;
  bool merge = false;
  int32_t* visible_blocks = nullptr;  // optional [rows]: ceil(max(hi - lo, 0) / block_size),
                                      // the window of that row top-k
  // mask (a later layer): keys of visible columns whose block is not among the row's listed
  // blocks (listed[r, 0:n_listed], -1 or out-of-range entries list nothing) become INT64_MIN.
  const int32_t* listed = nullptr;  // [rows, n_listed], row stride listed_stride
  int64_t listed_stride = 0;
  int n_listed = 0;
};
void launch_candidate_block_keys(const CandidateParams& p, int sm_count, cudaStream_t stream);
void launch_candidate_mask(const CandidateParams& p, int sm_count, cudaStream_t stream);

void launch_global_topk(const GlobalTopkParams& p, const DeviceLimits& lim, cudaStream_t stream);
void launch_combine_topk_swa(const CombineParams& p, const DeviceLimits& lim, cudaStream_t stream);

}  // namespace deepinfer_sm80
