// C entry points over the kernel half of vLLM's
// csrc/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu, for tests that run vLLM's own
// SWA writer as SM80 code (tests/vllm_c_ops.py builds this file; tests/gpu/
// test_vllm_c_insert_sm80.py runs it). `upstream_kernels.inc` is that source cut before its
// torch-op wrappers (stable ABI, which this library does not link); the host glue of the
// two wrappers the DeepSeek-V4/V4.1 attention layers call on the 584-byte record is
// restated below: argument validation lives in the Python caller.
#include "upstream_kernels.inc"

#include <cstdio>
#include <cstring>
#include <exception>

namespace {

using Bf16 = c10::BFloat16;
namespace dsv4 = vllm::deepseek_v4_fused_ops;

int finish(char* err, int err_len) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", cudaGetErrorString(e));
  return 1;
}

int fail(char* err, int err_len, char const* what) {
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", what);
  return 2;
}

}  // namespace

// torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert after its checks and the
// allocation of q_out: the bf16 dispatch of launchFusedDeepseekV4QNormRopeKVRopeQuantInsert.
extern "C" int dsv4_qnorm_rope_kv_rope_quant_insert(
    void const* q_in, void* q_out, void const* kv, void* k_cache, int64_t const* slot_mapping,
    int64_t const* position_ids, float const* cos_sin_cache, float eps, int num_tokens_full,
    int num_tokens_insert, int num_heads_q, int num_heads_q_padded, int cache_block_size,
    int kv_block_stride, int apply_q_norm, int kv_mxfp8, int apply_q_rope,
    int is_q_interleaved, void* stream, char* err, int err_len) {
  try {
    dsv4::launchFusedDeepseekV4QNormRopeKVRopeQuantInsert<Bf16>(
        static_cast<Bf16 const*>(q_in), static_cast<Bf16*>(q_out),
        static_cast<Bf16 const*>(kv), static_cast<uint8_t*>(k_cache), slot_mapping,
        position_ids, cos_sin_cache, eps, num_tokens_full, num_tokens_insert, num_heads_q,
        num_heads_q_padded, cache_block_size, kv_block_stride, apply_q_norm != 0,
        kv_mxfp8 != 0, apply_q_rope != 0, is_q_interleaved != 0,
        static_cast<cudaStream_t>(stream));
  } catch (std::exception const& e) {
    return fail(err, err_len, e.what());
  }
  return finish(err, err_len);
}

// torch.ops._C.fused_deepseek_v4_kv_rope_insert on a packed (uint8) cache, after its checks:
// the zero-query-head instantiation of the fused kernel.
extern "C" int dsv4_kv_rope_insert_packed(void const* kv, void* k_cache,
                                          int64_t const* slot_mapping,
                                          int64_t const* position_ids,
                                          float const* cos_sin_cache, int num_tokens,
                                          int cache_block_size, int kv_block_stride,
                                          int kv_mxfp8, void* stream, char* err,
                                          int err_len) {
  if (num_tokens == 0) return 0;
  try {
    dsv4::launchFusedDeepseekV4Templated<Bf16, 0, false, false>(
        nullptr, nullptr, static_cast<Bf16 const*>(kv), static_cast<uint8_t*>(k_cache),
        slot_mapping, position_ids, cos_sin_cache, 0.0f, num_tokens, num_tokens, 0,
        cache_block_size, kv_block_stride, kv_mxfp8 != 0, /*apply_q_rope=*/true,
        static_cast<cudaStream_t>(stream));
  } catch (std::exception const& e) {
    return fail(err, err_len, e.what());
  }
  return finish(err, err_len);
}

// The capability the library's launchers see (get_device_prop, DEEPINFER_REPORTED_CC).
extern "C" int dsv4_reported_capability() {
  cudaDeviceProp* p = get_device_prop();
  return p->major * 10 + p->minor;
}
