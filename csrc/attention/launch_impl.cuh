// SPDX-License-Identifier: Apache-2.0
// Launch helper shared by the decode (fp8) and prefill (bf16) instantiation files; each
// of them maps a TileConfigId to its configurations itself.
#pragma once

#include <cuda_runtime.h>

#include "config_sm80.h"
#include "config_sm86.h"
#include "sparse_mla_kernel.cuh"

namespace deepinfer_sm80::attention {

template <class Cfg, bool kFp8, int kGroups = 1, bool kRawScores = false>
cudaError_t launch_cfg(const SparseMlaParams& p, cudaStream_t stream) {
  constexpr int smem = Cfg::template Layout<kFp8, kGroups>::total;
  auto kernel = sparse_mla_kernel<Cfg, kFp8, kGroups, kRawScores>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const long long groups = (p.num_heads + Cfg::HG * kGroups - 1) / (Cfg::HG * kGroups);
  // decode: every token num_splits blocks; prefill: whole_tokens one block, the rest num_splits
  const long long per_group =
      kFp8 ? static_cast<long long>(p.num_tokens) * p.num_splits
           : p.whole_tokens + static_cast<long long>(p.num_tokens - p.whole_tokens) * p.num_splits;
  const long long blocks = per_group * groups;
  if (blocks == 0) return cudaSuccess;
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(blocks), Cfg::NTHREADS * kGroups, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace deepinfer_sm80::attention
