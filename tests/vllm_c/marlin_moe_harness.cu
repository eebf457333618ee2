// C entry point over vLLM's Marlin MoE GEMM (csrc/moe/marlin_moe_wna16/ops.cu: `marlin_mm`,
// the host half of torch op `moe_wna16_marlin_gemm`), for the GPU tests that run the MXFP4
// routed experts of DeepSeek-V4 / V4.1 as SM80 code (tests/vllm_c_marlin.py builds this file,
// family "moe"; tests/vllm_marlin_check.py runs it). On capability 8.x vLLM's MXFP4 MoE
// backend selector picks Marlin (`MarlinExperts`).
//
// `marlin_moe.inc` is ops.cu cut before its torch-op wrapper; the wrapper's host glue (type
// ids, buffers, checks) is restated by the Python caller. The host code's device queries are
// answered as an Ampere card would answer them (marlin_ampere_limits.h).
#include <exception>

#include "marlin_ampere_limits.h"

#define cudaDeviceGetAttribute deepinfer_device_attribute
#include "marlin_moe.inc"
#undef cudaDeviceGetAttribute

extern "C" int deepinfer_moe_marlin_mm(
    const void* a, const void* b, void* c, void* c_tmp, void* b_bias, void* a_s, void* b_s,
    void* g_s, void* zp, void* sorted_token_ids, void* expert_ids, void* num_tokens_past_padded,
    void* topk_weights, int moe_block_size, int num_experts, int top_k, int mul_topk_weights,
    int prob_m, int prob_n, int prob_k, void* workspace, int64_t a_type_id, int64_t b_type_id,
    int64_t c_type_id, int64_t s_type_id, int has_bias, int has_zp, int group_size, int dev,
    void* stream, int thread_k, int thread_n, int sms, int blocks_per_sm, int use_atomic_add,
    int use_fp32_reduce, int is_zp_float, char* err, int err_len) {
  try {
    MARLIN_NAMESPACE_NAME::marlin_mm(
        a, b, c, c_tmp, b_bias,
#if DEEPINFER_MARLIN_A_SCALES
        a_s,
#endif
        b_s, g_s, zp, sorted_token_ids, expert_ids,
        num_tokens_past_padded, topk_weights, moe_block_size, num_experts, top_k,
        mul_topk_weights != 0, prob_m, prob_n, prob_k, workspace,
        vllm::ScalarType::from_id(a_type_id), vllm::ScalarType::from_id(b_type_id),
        vllm::ScalarType::from_id(c_type_id), vllm::ScalarType::from_id(s_type_id),
        has_bias != 0, has_zp != 0, group_size, dev, static_cast<cudaStream_t>(stream), thread_k,
        thread_n, sms, blocks_per_sm, use_atomic_add != 0, use_fp32_reduce != 0,
        is_zp_float != 0);
  } catch (const std::exception& e) {
    return deepinfer_fail(err, err_len, e.what());
  }
  return deepinfer_launched(err, err_len);
}
