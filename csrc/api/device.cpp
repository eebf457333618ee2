// Device queries and codec test hooks:
//   deepinfer_sm80::device_info(int device=-1) -> int[]
//       [sm_count, max_dynamic_smem_optin_bytes, cc_major, cc_minor]
//   deepinfer_sm80::_fp8_codec_test(Tensor input, Tensor? scales, int mode) -> Tensor
//       modes of launch_fp8_codec_test (csrc/cache/cache_kernels.h); tests only.
#include "api/api_utils.h"
#include "cache/cache_kernels.h"

namespace deepinfer_sm80 {
namespace {

std::vector<int64_t> device_info(int64_t device) {
  int dev = static_cast<int>(device);
  if (dev < 0) {
    TORCH_CHECK(cudaGetDevice(&dev) == cudaSuccess, "no CUDA device available");
  }
  const DeviceLimits lim = DeviceLimits::query(dev);
  return {lim.sm_count, lim.max_dynamic_smem, lim.cc_major, lim.cc_minor};
}

at::Tensor fp8_codec_test(const at::Tensor& input, const std::optional<at::Tensor>& scales,
                          int64_t mode) {
  TORCH_CHECK(input.is_cuda() && input.is_contiguous(), "input must be a contiguous CUDA tensor");
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor out;
  const uint8_t* sc = nullptr;
  if (mode == 0 || mode == 1) {
    api::check_dtype(input, "input", at::kFloat);
    out = at::empty(input.sizes(), input.options().dtype(at::kByte));
  } else if (mode == 2) {
    api::check_dtype(input, "input", at::kByte);
    out = at::empty(input.sizes(), input.options().dtype(at::kFloat));
  } else if (mode == 3 || mode == 4 || mode == 5) {
    api::check_dtype(input, "input", at::kByte);
    TORCH_CHECK(input.numel() % 4 == 0, "modes 3-5 need a multiple of 4 codes");
    TORCH_CHECK(scales.has_value() && scales->is_cuda() && scales->is_contiguous() &&
                    scales->scalar_type() == at::kByte && scales->numel() * 4 == input.numel(),
                "modes 3-5 need one uint8 scale per 4 codes");
    sc = scales->data_ptr<uint8_t>();
    out = at::empty(input.sizes(), input.options().dtype(at::kBFloat16));
  } else {
    TORCH_CHECK(false, "unknown mode ", mode);
  }
  launch_fp8_codec_test(static_cast<int>(mode), input.data_ptr(), sc, out.data_ptr(),
                        input.numel(), api::stream());
  api::check_launch();
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(deepinfer_sm80, m) {
  m.def("device_info(int device=-1) -> int[]", &device_info);
  m.def("_fp8_codec_test(Tensor input, Tensor? scales, int mode) -> Tensor");
}

TORCH_LIBRARY_IMPL(deepinfer_sm80, CUDA, m) { m.impl("_fp8_codec_test", &fp8_codec_test); }

}  // namespace deepinfer_sm80
