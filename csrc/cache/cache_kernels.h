// Launchers of the V4 KV-cache kernels (torch-free; called from csrc/api/cache.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_limits.h"
#include "common/fast_div.h"

namespace deepinfer_sm80 {

// quantize_and_insert_k_cache: k[num_tokens, 512] bf16 -> 584-byte records.
struct InsertKParams {
  const uint16_t* k;          // bf16 bits; row r at k + r * k_row_stride (16-B aligned)
  int64_t k_row_stride;       // elements, multiple of 8
  const int64_t* slot_mapping;  // [num_tokens]; slot < 0 is skipped
  uint8_t* cache;             // block b at cache + b * block_stride (16-B aligned)
  int64_t block_stride;       // bytes, multiple of 16
  int64_t num_blocks;         // slots >= num_blocks * block_size are skipped (not written)
  int block_size;
  int num_tokens;
};

// dequantize_and_gather_k_cache: out[r, offset + i, :] = record(block_table[r, pos / bs],
// pos % bs) dequantised, for pos = seq_len - gather_len + i, i < gather_len.
struct GatherKParams {
  uint16_t* out;              // bf16 bits, [num_reqs, out_rows, 512], last dim contiguous
  int64_t out_stride0;        // elements, multiple of 8
  int64_t out_stride1;        // elements, multiple of 8
  int64_t out_rows;           // out.shape[1]; rows offset + i >= out_rows are skipped
  const uint8_t* cache;
  int64_t block_stride;       // bytes, multiple of 16
  int64_t num_blocks;         // entries in blocks outside [0, num_blocks) are skipped
  const int32_t* seq_lens;    // [num_reqs]
  const int32_t* gather_lens; // [num_reqs] or nullptr (= seq_lens)
  const int32_t* block_table; // [num_reqs, max_blocks], any strides (elements)
  int64_t bt_stride0;
  int64_t bt_stride1;
  int max_blocks;             // block_table.shape[1]; positions beyond it are skipped
  int block_size;
  int offset;
  int num_reqs;
  // block_size as a launch-time divisor (common/fast_div.h): set by launch_gather_k (callers
  // leave it), so that the kernels find an entry's block without a run-time division
  FastDivU31 block_div;
};

void launch_insert_k(const InsertKParams& p, const DeviceLimits& lim, cudaStream_t stream);
void launch_gather_k(const GatherKParams& p, const DeviceLimits& lim, cudaStream_t stream);

// Test hooks for the scalar codecs (csrc/cache/fp8_codec_test.cu).
//   mode 0: out_u8[i]  = float_to_e4m3_satfinite(in_f32[i])
//   mode 1: out_u8[i]  = __nv_cvt_float_to_fp8(in_f32[i], __NV_SATFINITE, __NV_E4M3)
//   mode 2: out_f32[i] = e4m3_to_float(in_u8[i])
//   mode 3: out_bf16[i] = bf16(e4m3(in_u8[i]) * 2^(s_i - 127)) via the packed fast path
//           (falls back like the gather kernel), s_i = scale_u8[i / 4]
//   mode 4: the same through the bf16-multiply decode (scale bytes 10..134)
//   mode 5: the same through the two-multiply bf16 decode (scale bytes 10..246)
void launch_fp8_codec_test(int mode, const void* in, const uint8_t* scales, void* out,
                           int64_t n, cudaStream_t stream);

}  // namespace deepinfer_sm80
