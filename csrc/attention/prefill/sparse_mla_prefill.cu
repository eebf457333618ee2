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

cudaError_t launch_prefill(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream) {
  if (id == TileConfigId::kH64 && prefill_two_groups()) {
    return launch_cfg<CfgH64x2, false, kH64PrefillGroups>(p, stream);
  }
  return launch_dispatch<false>(p, id, stream);
}

}  // namespace deepinfer_sm80::attention
