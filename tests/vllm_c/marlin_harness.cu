// C entry points over vLLM's Marlin GEMM and its weight repack, for the GPU tests that run
// them as SM80 code (tests/vllm_c_marlin.py builds this file; tests/vllm_marlin_check.py and
// tests/gpu/test_vllm_c_marlin_sm80.py run it).
//
// On capability 8.x vLLM sends every FP8-block linear of DeepSeek-V4 and V4.1's MXFP8 linears
// to Marlin (weight-only FP8: `MarlinFP8ScaledMMLinearKernel`, `MarlinMxfp8LinearKernel`).
// `marlin_gemm.inc` is csrc/quantization/marlin/marlin.cu cut before its torch-op wrapper
// (`marlin_mm` and the config selection it calls are upstream's, unchanged);
// `marlin_repack.inc` is gptq_marlin_repack.cu's kernel half. The wrappers' host glue
// (type ids, buffers, checks) is restated by the Python caller, the repack launch below.
//
// What the host code reads of the device is answered as an Ampere card would answer it
// (marlin_ampere_limits.h). -DDEEPINFER_MARLIN_A_SCALES
// and -DDEEPINFER_MARLIN_REPACK_A8 (tests/vllm_c_marlin.py reads them off the tree) say whether
// the tree still has 8-bit activations (vLLM 0.33.0) or not (0.34.0).
#include <exception>

#include "marlin_ampere_limits.h"

#define cudaDeviceGetAttribute deepinfer_device_attribute
#include "marlin_gemm.inc"  // ends with the #endif of upstream's `#if __CUDA_ARCH__ < 750`
#include "marlin_repack.inc"
#undef cudaDeviceGetAttribute

extern "C" int deepinfer_marlin_mm(
    const void* a, const void* b, void* c, void* c_tmp, void* b_bias, void* a_s, void* b_s,
    void* g_s, void* zp, int prob_m, int prob_n, int prob_k, int lda, void* workspace,
    int64_t a_type_id, int64_t b_type_id, int64_t c_type_id, int64_t s_type_id, int has_bias,
    int has_zp, int num_groups, int group_size, int dev, void* stream, int sms,
    int use_atomic_add, int use_fp32_reduce, int is_zp_float, char* err, int err_len) {
  try {
    marlin::marlin_mm(a, b, c, c_tmp, b_bias,
#if DEEPINFER_MARLIN_A_SCALES
                      a_s,
#endif
                      b_s, g_s, zp, prob_m, prob_n, prob_k, lda,
                      workspace, vllm::ScalarType::from_id(a_type_id),
                      vllm::ScalarType::from_id(b_type_id),
                      vllm::ScalarType::from_id(c_type_id),
                      vllm::ScalarType::from_id(s_type_id), has_bias != 0, has_zp != 0,
                      num_groups, group_size, dev, static_cast<cudaStream_t>(stream), -1, -1,
                      sms, use_atomic_add != 0, use_fp32_reduce != 0, is_zp_float != 0);
  } catch (const std::exception& e) {
    return deepinfer_fail(err, err_len, e.what());
  }
  return deepinfer_launched(err, err_len);
}

// gptq_marlin_repack's launch (its CALL_IF chain), restated; argument checks in the caller.
extern "C" int deepinfer_gptq_marlin_repack(const void* in, void* out, int size_k, int size_n,
                                            int num_bits, int is_a_8bit, int dev, void* stream,
                                            char* err, int err_len) {
  int blocks = 0, max_shared_mem = 0;
  deepinfer_device_attribute(&blocks, cudaDevAttrMultiProcessorCount, dev);
  deepinfer_device_attribute(&max_shared_mem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (blocks <= 0 || max_shared_mem <= 0) return deepinfer_fail(err, err_len, "device attributes");
  auto const* src = static_cast<uint32_t const*>(in);
  auto* dst = static_cast<uint32_t*>(out);
  auto s = static_cast<cudaStream_t>(stream);
#define DEEPINFER_REPACK_LAUNCH(KERNEL)                                                      \
  {                                                                                         \
    auto k = KERNEL;                                                                        \
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_mem);   \
    k<<<blocks, marlin::repack_threads, max_shared_mem, s>>>(src, dst, size_k, size_n);     \
    return deepinfer_launched(err, err_len);                                                          \
  }
#if DEEPINFER_MARLIN_REPACK_A8  // vLLM 0.33.0: the kernel also takes is_a_8bit
  if (num_bits == 4 && !is_a_8bit)
    DEEPINFER_REPACK_LAUNCH((marlin::gptq_marlin_repack_kernel<marlin::repack_threads, 4, false>))
  if (num_bits == 8 && !is_a_8bit)
    DEEPINFER_REPACK_LAUNCH((marlin::gptq_marlin_repack_kernel<marlin::repack_threads, 8, false>))
  if (num_bits == 4 && is_a_8bit)
    DEEPINFER_REPACK_LAUNCH((marlin::gptq_marlin_repack_kernel<marlin::repack_threads, 4, true>))
  if (num_bits == 8 && is_a_8bit)
    DEEPINFER_REPACK_LAUNCH((marlin::gptq_marlin_repack_kernel<marlin::repack_threads, 8, true>))
#else  // vLLM 0.34.0 on: 16-bit activations only
  if (num_bits == 4 && !is_a_8bit)
    DEEPINFER_REPACK_LAUNCH((marlin::gptq_marlin_repack_kernel<marlin::repack_threads, 4>))
  if (num_bits == 8 && !is_a_8bit)
    DEEPINFER_REPACK_LAUNCH((marlin::gptq_marlin_repack_kernel<marlin::repack_threads, 8>))
#endif
#undef DEEPINFER_REPACK_LAUNCH
  return deepinfer_fail(err, err_len, "unsupported repack config");
}
