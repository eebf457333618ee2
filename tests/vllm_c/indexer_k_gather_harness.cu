// C entry point over vLLM's cp_gather_indexer_k_quant_cache_kernel (csrc/cache_kernels.cu),
// for tests that run the indexer K gather of the SM80 prefill indexer as SM80 code
// (tests/vllm_c_ops.py builds this file; tests/gpu/test_vllm_c_indexer_k_gather_sm80.py
// runs it). `upstream_kernels.inc` is that one kernel, taken from the file; the launch of
// the op `cp_gather_indexer_k_quant_cache` (its CALL_CP_GATHER_INDEXER_K_QUANT_CACHE
// dispatch) is restated below: argument validation lives in the Python caller.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "core/utils.hpp"

namespace vllm {
#include "upstream_kernels.inc"
}  // namespace vllm

namespace {

template <int kBlockY>
void launch(char const* kv_cache, char* dst_k, char* dst_scale, int const* block_table,
            int const* cu_seq_lens, int batch_size, int64_t token_stride, int64_t head_dim,
            int64_t block_stride, int64_t cache_token_stride, int64_t cache_block_size,
            int num_blocks, int num_tokens, int quant_block_size, cudaStream_t stream) {
  constexpr int vec_size = 16;
  dim3 grid((num_tokens + kBlockY - 1) / kBlockY,
            static_cast<unsigned>((head_dim + 8 * vec_size - 1) / (8 * vec_size)));
  vllm::cp_gather_indexer_k_quant_cache_kernel<kBlockY><<<grid, dim3(8, kBlockY), 0, stream>>>(
      kv_cache, dst_k, dst_scale, block_table, cu_seq_lens, batch_size, token_stride, head_dim,
      block_stride, cache_token_stride, cache_block_size, num_blocks, num_tokens,
      quant_block_size);
}

}  // namespace

extern "C" int cp_gather_indexer_k_quant_cache(
    void const* kv_cache, void* dst_k, void* dst_scale, int const* block_table,
    int const* cu_seq_lens, int batch_size, int64_t token_stride, int64_t head_dim,
    int64_t block_stride, int64_t cache_token_stride, int64_t cache_block_size,
    int num_blocks, int num_tokens, int quant_block_size, void* stream, char* err,
    int err_len) {
  auto const* kv = static_cast<char const*>(kv_cache);
  auto* k = static_cast<char*>(dst_k);
  auto* sc = static_cast<char*>(dst_scale);
  auto s = static_cast<cudaStream_t>(stream);
#define DI_LAUNCH(Y)                                                                    \
  launch<Y>(kv, k, sc, block_table, cu_seq_lens, batch_size, token_stride, head_dim,    \
            block_stride, cache_token_stride, cache_block_size, num_blocks, num_tokens, \
            quant_block_size, s)
  if (num_tokens < 32) {
    DI_LAUNCH(1);
  } else if (num_tokens < 64) {
    DI_LAUNCH(2);
  } else if (num_tokens < 128) {
    DI_LAUNCH(4);
  } else if (num_tokens < 256) {
    DI_LAUNCH(8);
  } else if (num_tokens < 512) {
    DI_LAUNCH(16);
  } else {
    DI_LAUNCH(32);
  }
#undef DI_LAUNCH
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", cudaGetErrorString(e));
  return 1;
}
