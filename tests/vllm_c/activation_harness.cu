// C entry point over vLLM's `silu_and_mul_with_clamp` (csrc/activation_kernels.cu: the
// `act_and_mul_kernel` template with `silu_kernel`, HAS_CLAMP), the activation between the two
// GEMMs of DeepSeek-V4's routed experts (SiLU with swiglu_limit) in vLLM's fused_marlin_moe.
// `upstream_kernels.inc` is the file cut before its launch macro
// (LAUNCH_ACTIVATION_GATE_KERNEL); the macro's body for `silu_and_mul_clamp` is restated
// below, with upstream's dispatch macro binding scalar_t. get_device_prop() reports the
// capability the library was built to report (tests/vllm_c/torch_utils.h), so the launch
// takes the vector width an A100 gets. Argument checks live in the Python caller.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>

#include "torch_utils.h"
#include "upstream_kernels.inc"

extern "C" int silu_and_mul_with_clamp(void* out, const void* input, int dtype_code,
                                       int64_t num_tokens, int d, float limit, float alpha,
                                       float beta, void* stream_ptr, char* err, int err_len) {
  // dtype_code: 0 float16, 1 bfloat16 (the dtypes the experts' activations take)
  auto dtype = dtype_code == 0 ? torch::headeronly::ScalarType::Half
                               : torch::headeronly::ScalarType::BFloat16;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  try {
    if (num_tokens == 0) return 0;
    dim3 grid(num_tokens);
    int cc_major = get_device_prop()->major;
    bool wide = CUDA_VERSION >= 12090 && cc_major >= 10 && num_tokens > 128;
    int support_vec = wide ? vllm::VecTraits<true>::ARCH_MAX_VEC_SIZE
                           : vllm::VecTraits<false>::ARCH_MAX_VEC_SIZE;
    int vec_size = support_vec / 2;  // input.element_size() of a 16-bit dtype
    const bool use_vec = (d % vec_size == 0);
    if (use_vec) {
      dim3 block(std::min(d / vec_size, 1024));
      if (wide) {
        VLLM_STABLE_DISPATCH_FLOATING_TYPES(dtype, "act_and_mul_kernel", [&] {
          vllm::act_and_mul_kernel<
              scalar_t, typename vllm::PackedTypeConverter<scalar_t>::Type,
              vllm::silu_kernel<scalar_t>,
              vllm::packed_silu_kernel<typename vllm::PackedTypeConverter<scalar_t>::Type>,
              true, true, true, true><<<grid, block, 0, stream>>>(
              static_cast<scalar_t*>(out), static_cast<const scalar_t*>(input), d, limit,
              alpha, beta);
        });
      } else {
        VLLM_STABLE_DISPATCH_FLOATING_TYPES(dtype, "act_and_mul_kernel", [&] {
          vllm::act_and_mul_kernel<
              scalar_t, typename vllm::PackedTypeConverter<scalar_t>::Type,
              vllm::silu_kernel<scalar_t>,
              vllm::packed_silu_kernel<typename vllm::PackedTypeConverter<scalar_t>::Type>,
              true, true, true, false><<<grid, block, 0, stream>>>(
              static_cast<scalar_t*>(out), static_cast<const scalar_t*>(input), d, limit,
              alpha, beta);
        });
      }
    } else {
      dim3 block(std::min(d, 1024));
      VLLM_STABLE_DISPATCH_FLOATING_TYPES(dtype, "act_and_mul_kernel", [&] {
        vllm::act_and_mul_kernel<
            scalar_t, typename vllm::PackedTypeConverter<scalar_t>::Type,
            vllm::silu_kernel<scalar_t>,
            vllm::packed_silu_kernel<typename vllm::PackedTypeConverter<scalar_t>::Type>,
            true, false, true><<<grid, block, 0, stream>>>(
            static_cast<scalar_t*>(out), static_cast<const scalar_t*>(input), d, limit, alpha,
            beta);
      });
    }
  } catch (const std::exception& e) {
    if (err && err_len > 0) std::snprintf(err, err_len, "%s", e.what());
    return 1;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    if (err && err_len > 0) std::snprintf(err, err_len, "%s", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
