// Small helpers shared by the torch-facing files of csrc/api (checks, stream, limits).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <mutex>

#include "common/device_limits.h"

namespace deepinfer_sm80 {
namespace api {

inline void check_cuda(const at::Tensor& t, const char* name, const at::Device& dev) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.device() == dev, name, " is on ", t.device(), " but the op runs on ", dev);
}

inline void check_dtype(const at::Tensor& t, const char* name, at::ScalarType dt) {
  TORCH_CHECK(t.scalar_type() == dt, name, " must be ", dt, ", got ", t.scalar_type());
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Limits of `device`, queried once per device; sm_count > 0 overrides the SM count.
inline DeviceLimits limits(int device, int64_t sm_count) {
  static std::mutex mu;
  static std::array<DeviceLimits, 64> cache;
  static std::array<bool, 64> have{};
  DeviceLimits lim;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (device >= 0 && device < 64) {
      if (!have[device]) {
        cache[device] = DeviceLimits::query(device);
        have[device] = true;
      }
      lim = cache[device];
    } else {
      lim = DeviceLimits::query(device);
    }
  }
  TORCH_CHECK(sm_count >= 0, "sm_count must be >= 0 (0 = use the device's), got ", sm_count);
  return lim.with_overrides(static_cast<int>(sm_count), 0);
}

inline cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

inline void check_launch() { C10_CUDA_KERNEL_LAUNCH_CHECK(); }

}  // namespace api
}  // namespace deepinfer_sm80
