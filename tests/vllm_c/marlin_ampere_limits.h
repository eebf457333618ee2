// Shared by tests/vllm_c/marlin_harness.cu and marlin_moe_harness.cu (one per library): what
// vLLM's Marlin host code reads of the device, answered as an Ampere card would answer it, and
// the entry points both libraries export besides their GEMM.
//
// Built with -DDEEPINFER_REPORTED_CC=80 the capability reads 8.0 (so `stages` and the
// FP8-activation checks take the SM80 branch); `deepinfer_marlin_set_limits` caps the SM count
// and the opt-in shared memory per block (A100: 108 SMs, 163 KB), from which upstream's
// `determine_exec_config` picks the tile configuration. A harness defines
// `cudaDeviceGetAttribute` as `deepinfer_device_attribute` around its upstream include.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "core/scalar_type.hpp"

namespace {
int g_sms_cap = 0;   // 0: the device's own
int g_smem_cap = 0;  // bytes; 0: the device's own

int deepinfer_fail(char* err, int err_len, const char* what) {
  if (err && err_len > 0) std::snprintf(err, err_len, "%s", what);
  return 1;
}

// 0, or 1 with the launch's error in `err`.
int deepinfer_launched(char* err, int err_len) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return deepinfer_fail(err, err_len, cudaGetErrorString(e));
  return 0;
}
}  // namespace

static cudaError_t deepinfer_device_attribute(int* value, cudaDeviceAttr attr, int device) {
  cudaError_t err = ::cudaDeviceGetAttribute(value, attr, device);
  if (err != cudaSuccess) return err;
#ifdef DEEPINFER_REPORTED_CC
  if (attr == cudaDevAttrComputeCapabilityMajor) *value = DEEPINFER_REPORTED_CC / 10;
  if (attr == cudaDevAttrComputeCapabilityMinor) *value = DEEPINFER_REPORTED_CC % 10;
#endif
  if (attr == cudaDevAttrMultiProcessorCount && g_sms_cap > 0 && *value > g_sms_cap)
    *value = g_sms_cap;
  if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin && g_smem_cap > 0 && *value > g_smem_cap)
    *value = g_smem_cap;
  return err;
}

extern "C" void deepinfer_marlin_set_limits(int sms, int smem_optin) {
  g_sms_cap = sms;
  g_smem_cap = smem_optin;
}

// The ScalarType ids of the C++ side, for the Python caller's type decisions:
// [kFloat16, kBFloat16, kFE4M3fn, kFE8M0fnu, kFE2M1f, kS8].
extern "C" void deepinfer_marlin_type_ids(int64_t* out) {
  out[0] = vllm::kFloat16.id();
  out[1] = vllm::kBFloat16.id();
  out[2] = vllm::kFE4M3fn.id();
  out[3] = vllm::kFE8M0fnu.id();
  out[4] = vllm::kFE2M1f.id();
  out[5] = vllm::kS8.id();
}
