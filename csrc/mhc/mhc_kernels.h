// SPDX-License-Identifier: Apache-2.0
// mHC (manifold-constrained hyper-connections) kernels for SM80/SM86 (no torch headers).
//
// hc_prenorm_gemm: the projection of vLLM's mHC pre block (vllm/model_executor/kernels/mhc/
// tilelang.py `_hc_prenorm_gemm_outputs`): for each token t and K-split s,
//   out[s, t, n]  = sum_{k in split s} x[t, k] * fn[n, k]      (n < 24, fp32)
//   sqrsum[s, t]  = sum_{k in split s} x[t, k]^2               (fp32)
// with x [T, K] bf16 (K = hc_mult * hidden) and fn [24, K] fp32. vLLM's consumers (the
// TileLang big-fuse kernels) sum the splits. The products run on mma.sync bf16 tensor cores
// with fn split into two bf16 terms (hi = bf16(fn), lo = bf16(fn - hi)): x is bf16 already,
// so each product carries fn to 16 mantissa bits (relative error <= 2^-17 per element, finer
// than DeepGEMM's TF32 GEMM that upstream uses on SM90+, coarser than fp32 FMA).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_limits.h"

namespace deepinfer_sm80 {
namespace mhc {

constexpr int kPrenormN = 24;          // outputs per token: hc_mult * (2 + hc_mult), hc_mult 4
constexpr int kPrenormBM = 64;         // tokens per block (4 warps x 16 rows)
constexpr int kPrenormBK = 64;         // K per pipeline stage
constexpr int kPrenormMaxSplits = 256; // K splits at most (and at most K / kPrenormBK)

struct PrenormGemmParams {
  const void* x = nullptr;   // [T, K] bf16, rows contiguous, row stride x_stride (elements)
  const float* fn = nullptr; // [24, K] fp32, contiguous
  float* out = nullptr;      // [n_splits, T, 24] fp32, contiguous
  float* sqrsum = nullptr;   // [n_splits, T] fp32, contiguous
  int64_t x_stride = 0;
  int num_tokens = 0;
  int k = 0;                 // K, a multiple of kPrenormBK
  int n_splits = 1;          // 1 .. K / kPrenormBK; split s: K tiles [s*n/S, (s+1)*n/S)
};

// Launches over a (ceil(T / 64), n_splits) grid. The grid follows the work; `lim` only
// bounds shared memory (the caller picks n_splits from the SM count).
void launch_prenorm_gemm(const PrenormGemmParams& p, const DeviceLimits& lim,
                         cudaStream_t stream);

}  // namespace mhc
}  // namespace deepinfer_sm80
