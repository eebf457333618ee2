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
};

// What the one-request combine kernel takes from the host, once per launch (a second kernel
// argument, so that CombineParams, and the SASS of the kernel for more requests, stay as
// measured).
struct CombineOneReqParams {
  int swa_extent;                 // W * ceil((W + image_width) / W), int32 arithmetic
  FastDivU31 ratio_div;           // make_fast_div(ratio)
};

void launch_global_topk(const GlobalTopkParams& p, const DeviceLimits& lim, cudaStream_t stream);
void launch_combine_topk_swa(const CombineParams& p, const DeviceLimits& lim, cudaStream_t stream);

}  // namespace deepinfer_sm80
