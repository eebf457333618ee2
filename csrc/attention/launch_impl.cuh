// SPDX-License-Identifier: Apache-2.0
// Launch helper shared by the decode (fp8) and prefill (bf16) instantiation files.
#pragma once

#include <algorithm>

#include <cuda_runtime.h>

#include "config_sm80.h"
#include "config_sm86.h"
#ifdef DEEPINFER_AB_OLD  // temporary same-run A/B: the kernel of 8bd408f (one item per block)
#include "sparse_mla_kernel_ab_old.cuh"
#else
#include "sparse_mla_kernel.cuh"
#endif

namespace deepinfer_sm80::attention {

// Grid: one block per work item (token x split x head group), or, with sms > 0, a persistent
// grid of sms x (blocks that fit an SM under smem_cap and the device's own occupancy) blocks
// that each run every gridDim-th item (the kernel's item loop).
template <class Cfg, bool kFp8, int kGroups = 1>
cudaError_t launch_cfg(const SparseMlaParams& p, cudaStream_t stream, int sms = 0, int smem_cap = 0) {
  constexpr int smem = Cfg::template Layout<kFp8, kGroups>::total;
  constexpr int threads = Cfg::NTHREADS * kGroups;
  auto kernel = sparse_mla_kernel<Cfg, kFp8, kGroups>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const long long groups = (p.num_heads + Cfg::HG * kGroups - 1) / (Cfg::HG * kGroups);
  const long long items = static_cast<long long>(p.num_tokens) * p.num_splits * groups;
  long long blocks = items;
  if (sms > 0) {
    int occ = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem);
    if (err != cudaSuccess) return err;
    // an SM of the emulated device holds smem_cap + 1 KB (163 KB per block of 164 KB on
    // SM80, 99 of 100 KB on SM86), 1 KB of it reserved per block
    const int per_sm = smem_cap > 0 ? std::min(occ, (smem_cap + 1024) / (smem + 1024)) : occ;
    blocks = std::min<long long>(items, static_cast<long long>(sms) * std::max(per_sm, 1));
  }
  if (blocks == 0) return cudaSuccess;
  if (items > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <bool kFp8>
cudaError_t launch_dispatch(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream, int sms = 0,
                            int smem_cap = 0) {
  switch (id) {
    case TileConfigId::kH64: return launch_cfg<CfgH64, kFp8>(p, stream, sms, smem_cap);
    case TileConfigId::kH32: return launch_cfg<CfgH32, kFp8>(p, stream, sms, smem_cap);
    case TileConfigId::kH16: return launch_cfg<CfgH16, kFp8>(p, stream, sms, smem_cap);
    case TileConfigId::kH8: return launch_cfg<CfgH8, kFp8>(p, stream, sms, smem_cap);
  }
  return cudaErrorInvalidValue;
}

}  // namespace deepinfer_sm80::attention
