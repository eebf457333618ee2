// C entry point over the kernel half of vLLM's csrc/moe/topk_softplus_sqrt_kernels.cu, for
// tests that run DeepSeek-V4's MoE router on its hash layers as SM80 code
// (tests/vllm_c_ops.py builds this file; tests/gpu/test_vllm_c_hash_topk_sm80.py runs it).
// `upstream_kernels.inc` is that source cut before its torch-op wrappers; the host glue of
// `topk_softplus_sqrt` for fp32 router logits with a hash table (what
// `vllm_topk_softplus_sqrt` passes on hash layers) is restated below: argument validation
// lives in the Python caller.
#include "upstream_kernels.inc"

#include <cstdint>
#include <cstdio>
#include <exception>

namespace {

template <typename OutInd, typename HashInd>
void launch(float const* gating, float* weights, void* indices, int* token_expert_indices,
            int num_tokens, int num_experts, int topk, bool renormalize, double scale,
            float const* bias, void const* input_ids, void const* tid2eid,
            bool const* is_padding, float const* bias_vl, int64_t image_sentinel_lo,
            cudaStream_t stream) {
  vllm::moe::topkGatingSoftplusSqrtKernelLauncher<OutInd, float, HashInd>(
      gating, weights, static_cast<OutInd*>(indices), token_expert_indices, num_tokens,
      num_experts, topk, renormalize, scale, bias, /*use_hash=*/true,
      static_cast<HashInd const*>(input_ids), static_cast<HashInd const*>(tid2eid), stream,
      is_padding, bias_vl, image_sentinel_lo);
}

}  // namespace

// torch.ops._moe_C.topk_hash_softplus_sqrt with fp32 gating_output and tid2eid given.
extern "C" int dsv4_topk_hash_softplus_sqrt(
    float const* gating, float* weights, void* indices, int indices_int64,
    int* token_expert_indices, int num_tokens, int num_experts, int topk, int renormalize,
    double routed_scaling_factor, float const* bias, void const* input_ids,
    void const* tid2eid, int hash_int64, bool const* is_padding, float const* bias_vl,
    int64_t image_sentinel_lo, void* stream, char* err, int err_len) {
  auto s = static_cast<cudaStream_t>(stream);
  try {
    if (indices_int64 != 0 && hash_int64 != 0) {
      launch<int64_t, int64_t>(gating, weights, indices, token_expert_indices, num_tokens,
                               num_experts, topk, renormalize != 0, routed_scaling_factor,
                               bias, input_ids, tid2eid, is_padding, bias_vl,
                               image_sentinel_lo, s);
    } else if (indices_int64 != 0) {
      launch<int64_t, int>(gating, weights, indices, token_expert_indices, num_tokens,
                           num_experts, topk, renormalize != 0, routed_scaling_factor, bias,
                           input_ids, tid2eid, is_padding, bias_vl, image_sentinel_lo, s);
    } else if (hash_int64 != 0) {
      launch<int, int64_t>(gating, weights, indices, token_expert_indices, num_tokens,
                           num_experts, topk, renormalize != 0, routed_scaling_factor, bias,
                           input_ids, tid2eid, is_padding, bias_vl, image_sentinel_lo, s);
    } else {
      launch<int, int>(gating, weights, indices, token_expert_indices, num_tokens,
                       num_experts, topk, renormalize != 0, routed_scaling_factor, bias,
                       input_ids, tid2eid, is_padding, bias_vl, image_sentinel_lo, s);
    }
  } catch (std::exception const& e) {
    if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", e.what());
    return 2;
  }
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", cudaGetErrorString(e));
  return 1;
}
