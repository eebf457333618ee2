// SPDX-License-Identifier: Apache-2.0
// Prefill: keys read as bf16 rows of the gathered workspace (cp.async into the tile).
#include <cstdlib>

#include "../launch_impl.cuh"
#include "../sparse_mla_ws_kernel.cuh"

namespace deepinfer_sm80::attention {

// 64 heads: the warp-specialised tile (WsPrefillCfg, sparse_mla_ws_kernel.cuh);
// $DEEPINFER_ATTN_PREFILL_WS=0 (A/B knob) runs the two 32-head groups over shared key stages
// (CfgH64x2, kH64PrefillGroups) instead, which also serve split launches.
static bool prefill_ws() {
  static const bool v = [] {
    const char* e = std::getenv("DEEPINFER_ATTN_PREFILL_WS");
    return e == nullptr || std::atoi(e) != 0;
  }();
  return v;
}

static cudaError_t launch_ws(const SparseMlaParams& p, cudaStream_t stream) {
  constexpr int smem = WsPrefillCfg::Layout::total;
  cudaError_t err = cudaFuncSetAttribute(sparse_mla_ws_prefill_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const long long groups = (p.num_heads + WsPrefillCfg::HG - 1) / WsPrefillCfg::HG;
  const long long blocks = static_cast<long long>(p.num_tokens) * groups;
  if (blocks == 0) return cudaSuccess;
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  sparse_mla_ws_prefill_kernel<<<static_cast<unsigned>(blocks), WsPrefillCfg::NTHREADS, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_prefill(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream) {
  switch (id) {
    case TileConfigId::kH64:
      if (prefill_ws() && p.num_splits == 1) return launch_ws(p, stream);
      return launch_cfg<CfgH64x2, false, kH64PrefillGroups>(p, stream);
    case TileConfigId::kH32: return launch_cfg<CfgH32, false>(p, stream);
    case TileConfigId::kH16: return launch_cfg<CfgH16, false>(p, stream);
    case TileConfigId::kH8: return launch_cfg<CfgH8, false>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace deepinfer_sm80::attention
