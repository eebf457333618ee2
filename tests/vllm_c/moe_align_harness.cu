// C entry point over vLLM's `moe_align_block_size` kernels (csrc/moe/moe_align_sum_kernels.cu),
// which group the routed rows by expert for the Marlin MoE GEMMs in vLLM's fused_marlin_moe.
// `upstream_kernels.inc` is the file cut before its first torch-op wrapper; the launch of the
// op without an expert map (both of upstream's branches: the one-block small-batch kernel,
// and align + count-and-sort) is restated below for int32 top-k ids. The caller passes the
// (num_experts + 1)-entry cumsum buffer that the wrapper allocates. Argument checks live in
// the Python caller.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "upstream_kernels.inc"

extern "C" int moe_align_block_size_i32(const int32_t* topk_ids, int64_t numel, int topk_num,
                                        int num_experts, int block_size, int32_t* sorted_token_ids,
                                        int64_t sorted_size, int32_t* experts_ids,
                                        int32_t* num_tokens_post_pad, int32_t* cumsum_buffer,
                                        void* stream_ptr, char* err, int err_len) {
  using scalar_t = int32_t;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  int64_t padded_num_experts = ((num_experts + WARP_SIZE - 1) / WARP_SIZE) * WARP_SIZE;
  int experts_per_warp = WARP_SIZE;
  int threads = 1024;
  threads = ((threads + WARP_SIZE - 1) / WARP_SIZE) * WARP_SIZE;
  if (padded_num_experts >= 1024) {
    if (err && err_len > 0) std::snprintf(err, err_len, "padded_num_experts must be < 1024");
    return 1;
  }
  int32_t* expert_map = nullptr;  // no expert map: upstream passes an empty tensor's pointer
  bool small_batch_expert_mode = (numel < 1024) && (num_experts <= 64);
  if (small_batch_expert_mode) {
    const int32_t sthreads = std::max((int32_t)num_experts, (int32_t)WARP_SIZE);
    const int32_t shared_mem_size =
        ((sthreads + 1) * num_experts + (num_experts + 1)) * sizeof(int32_t);
    constexpr int32_t fill_threads = 256;
    auto kernel = vllm::moe::moe_align_block_size_small_batch_expert_kernel<scalar_t, fill_threads>;
    kernel<<<1, fill_threads + sthreads, shared_mem_size, stream>>>(
        topk_ids, sorted_token_ids, experts_ids, num_tokens_post_pad, expert_map, num_experts,
        block_size, numel, sorted_size, topk_num, false, nullptr);
  } else {
    auto align_kernel = vllm::moe::moe_align_block_size_kernel<scalar_t>;
    size_t num_warps = CEILDIV(padded_num_experts, experts_per_warp);
    size_t shared_mem_size = num_warps * experts_per_warp * sizeof(int32_t);
    align_kernel<<<2, threads, shared_mem_size, stream>>>(
        topk_ids, sorted_token_ids, experts_ids, num_tokens_post_pad, expert_map, num_experts,
        padded_num_experts, experts_per_warp, block_size, numel, cumsum_buffer, sorted_size,
        topk_num, false);
    const int block_threads = std::min(256, (int)threads);
    const int num_blocks = (numel + block_threads - 1) / block_threads;
    const int actual_blocks = std::min(num_blocks, 65535);
    dim3 gridDims(1, actual_blocks);
    auto sort_kernel = vllm::moe::count_and_sort_expert_tokens_kernel<scalar_t>;
    sort_kernel<<<gridDims, block_threads, 0, stream>>>(
        topk_ids, sorted_token_ids, cumsum_buffer, expert_map, numel, num_experts, sorted_size,
        topk_num, false, nullptr);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    if (err && err_len > 0) std::snprintf(err, err_len, "%s", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
