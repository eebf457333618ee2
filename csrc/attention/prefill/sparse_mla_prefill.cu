// SPDX-License-Identifier: Apache-2.0
// Prefill: keys read as bf16 rows of the gathered workspace (cp.async into the tile).
#include <cstdlib>

#include "../launch_impl.cuh"

namespace deepinfer_sm80::attention {

// 64 heads: two 32-head groups over shared key stages (CfgH64x2, kH64PrefillGroups);
// $DEEPINFER_ATTN_PREFILL_GROUPS=1 (benchmark knob) runs the one-group 8-warp CfgH64 instead.
static bool prefill_two_groups() {
  static const bool v = [] {
    const char* e = std::getenv("DEEPINFER_ATTN_PREFILL_GROUPS");
    return e == nullptr || std::atoi(e) != 1;
  }();
  return v;
}

// Persistent grid (sms x blocks per SM, each block running every gridDim-th token): the next
// token's Q and first key tiles load under the current token's last tile, where one block per
// token paid them in its prologue (~4,400 of ~80,000 cycles per 64-head block on the H200,
// bench/phase_clocks.py). $DEEPINFER_ATTN_PERSISTENT=0 (benchmark knob): one block per token.
static bool prefill_persistent() {
  static const bool v = [] {
    const char* e = std::getenv("DEEPINFER_ATTN_PERSISTENT");
    return e == nullptr || std::atoi(e) != 0;
  }();
  return v;
}

cudaError_t launch_prefill(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream, int sms,
                           int smem_cap) {
  if (!prefill_persistent()) sms = 0;
#ifdef DEEPINFER_AB_OLD
  sms = 0;
#endif
  if (id == TileConfigId::kH64 && prefill_two_groups()) {
    return launch_cfg<CfgH64x2, false, kH64PrefillGroups>(p, stream, sms, smem_cap);
  }
  return launch_dispatch<false>(p, id, stream, sms, smem_cap);
}

}  // namespace deepinfer_sm80::attention
