// Stand-in for vLLM's csrc/torch_utils.h when one of its kernel sources is compiled outside
// vLLM (tests/vllm_c_ops.py). The kernel half of an upstream file needs only
// get_device_prop(); the real header also pulls in the stable-ABI shim, which a plain shared
// library loaded through ctypes has no use for.
//
// Built with -DDEEPINFER_REPORTED_CC=80 (or 86), get_device_prop() reports that capability,
// so that an SM80 build running on a newer GPU takes the launch decisions it takes on an
// A100 / A6000 (upstream's launchers, for one, enable PDL only from 9.0 on).
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include <torch/headeronly/util/Exception.h>

inline cudaDeviceProp* get_device_prop() {
  static std::once_flag flag;
  static std::vector<cudaDeviceProp> props;
  std::call_once(flag, [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    props.resize(n);
    for (int i = 0; i < n; ++i) {
      cudaGetDeviceProperties(&props[i], i);
#ifdef DEEPINFER_REPORTED_CC
      props[i].major = DEEPINFER_REPORTED_CC / 10;
      props[i].minor = DEEPINFER_REPORTED_CC % 10;
#endif
    }
  });
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  STD_TORCH_CHECK(err == cudaSuccess && dev >= 0 && dev < static_cast<int>(props.size()),
                  "cudaGetDevice failed: ", cudaGetErrorString(err));
  return &props[dev];
}
