// Device-side hooks that expose the scalar FP8 codecs to the GPU tests
// (torch.ops.deepinfer_sm80._fp8_codec_test); not used by any model path.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cache/cache_kernels.h"
#include "common/fp8_e4m3.cuh"
#include "common/ue8m0.cuh"

namespace deepinfer_sm80 {
namespace {

__global__ void fp8_codec_test_kernel(int mode, const void* in, const uint8_t* scales,
                                      void* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    if (mode == 0) {
      static_cast<uint8_t*>(out)[i] = float_to_e4m3_satfinite(static_cast<const float*>(in)[i]);
    } else if (mode == 1) {
      static_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(
          __nv_cvt_float_to_fp8(static_cast<const float*>(in)[i], __NV_SATFINITE, __NV_E4M3));
    } else if (mode == 2) {
      static_cast<float*>(out)[i] = e4m3_to_float(static_cast<const uint8_t*>(in)[i]);
    } else if ((mode == 3 || mode == 4 || mode == 5) && (i & 3) == 0 && i + 3 < n) {
      // Four codes sharing scale scales[i / 4], through one of the gather kernel's decode
      // routes: mode 3 the fp16/fp32 route (s in [1, 246]), mode 4 the bf16-multiply route
      // (s in [10, 134]), mode 5 the two-multiply bf16 route (s in [10, 246]); NaN codes and
      // other scale bytes take the scalar route.
      const uint32_t four = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(in) + i);
      const uint32_t s = scales[i / 4];
      __nv_bfloat162 lo, hi;
      if (mode == 5 && e4m3_bf16mul2_scale_ok(s) && !e4m3_nan_any(e4m3_nan_fold(0u, four))) {
        e4m3x4_to_bf16x4_bf16mul2(four, ue8m0_to_bf16x2(s), lo, hi);
      } else if (mode == 4 && e4m3_bf16mul_scale_ok(s) && !e4m3x4_has_nan(four)) {
        e4m3x4_to_bf16x4_bf16mul(four, e4m3_bf16mul_multiplier(s), lo, hi);
      } else if (mode == 3 && e4m3_fast_scale_ok(s) && !e4m3x4_has_nan(four)) {
        e4m3x4_to_bf16x4_scaled(four, e4m3_fast_multiplier(s), lo, hi);
      } else {
        const float sc = ue8m0_to_float(s);
        lo = __floats2bfloat162_rn(e4m3_to_float(four & 0xFF) * sc,
                                   e4m3_to_float((four >> 8) & 0xFF) * sc);
        hi = __floats2bfloat162_rn(e4m3_to_float((four >> 16) & 0xFF) * sc,
                                   e4m3_to_float(four >> 24) * sc);
      }
      __nv_bfloat162* o = static_cast<__nv_bfloat162*>(out) + i / 2;
      o[0] = lo;
      o[1] = hi;
    }
  }
}

}  // namespace

void launch_fp8_codec_test(int mode, const void* in, const uint8_t* scales, void* out,
                           int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  fp8_codec_test_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(mode, in, scales,
                                                                          out, n);
}

}  // namespace deepinfer_sm80
