// Device limits that size grids and shared memory, passed explicitly so that SM80/SM86
// configurations can be exercised on any newer GPU (e.g. an H200 emulating an A100 with
// sm_count = 108 and max_dynamic_smem = 163 KB).
//
//   DeviceLimits lim = DeviceLimits::query(device);        // the real device
//   DeviceLimits lim = DeviceLimits::a100();               // 108 SMs, 163 KB
//   lim = lim.with_overrides(sm_count_or_0, smem_or_0);    // explicit parameters win
//   int blocks = lim.grid_blocks(work_items, items_per_block, blocks_per_sm);
//
// Needs only the CUDA runtime (no torch).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace deepinfer_sm80 {

struct DeviceLimits {
  int sm_count = 108;                   // multiprocessors used to size grids
  int max_dynamic_smem = 163 * 1024;    // per-block dynamic shared-memory cap, bytes
  int cc_major = 8;
  int cc_minor = 0;

  static constexpr int kSm80SmemBytes = 163 * 1024;  // A100 / A800 (sm_80)
  static constexpr int kSm86SmemBytes = 99 * 1024;   // A6000, RTX 3090 (sm_86)

  static DeviceLimits a100() { return DeviceLimits{108, kSm80SmemBytes, 8, 0}; }
  static DeviceLimits a6000() { return DeviceLimits{84, kSm86SmemBytes, 8, 6}; }
  static DeviceLimits rtx3090() { return DeviceLimits{82, kSm86SmemBytes, 8, 6}; }

  // Reads the device's SM count and opt-in shared-memory limit. The result is cached per
  // device by the callers that need it on a hot path; this call itself is a few
  // cudaDeviceGetAttribute queries (no synchronisation, safe during graph capture).
  static DeviceLimits query(int device) {
    DeviceLimits d;
    cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&d.max_dynamic_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                           device);
    cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, device);
    return d;
  }

  // Explicit parameters (> 0) replace the queried values; a shared-memory override can
  // only lower the device's own limit.
  DeviceLimits with_overrides(int sm_count_override, int smem_override) const {
    DeviceLimits d = *this;
    if (sm_count_override > 0) d.sm_count = sm_count_override;
    if (smem_override > 0) d.max_dynamic_smem = std::min(d.max_dynamic_smem, smem_override);
    return d;
  }

  // Blocks for a persistent / grid-stride kernel: enough to fill every SM
  // `blocks_per_sm` times, but never more than the work needs (and at least 1).
  int grid_blocks(int64_t work_items, int64_t items_per_block, int blocks_per_sm) const {
    const int64_t needed = (work_items + items_per_block - 1) / std::max<int64_t>(items_per_block, 1);
    const int64_t cap = static_cast<int64_t>(sm_count) * std::max(blocks_per_sm, 1);
    return static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
  }
};

}  // namespace deepinfer_sm80
