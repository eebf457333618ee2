// SPDX-License-Identifier: Apache-2.0
// Prefill: keys read as bf16 rows of the gathered workspace (cp.async into the tile).
#include "../../common/env_knob.h"
#include "../launch_impl.cuh"

namespace deepinfer_sm80::attention {

// 64 heads: two 32-head groups over shared key stages (CfgH64x2, kH64PrefillGroups);
// $DEEPINFER_ATTN_PREFILL_GROUPS=1 (benchmark knob) runs the one-group 8-warp CfgH64 instead.
static bool prefill_two_groups() {
  static const bool v = knob_int("DEEPINFER_ATTN_PREFILL_GROUPS", 0) != 1;
  return v;
}

cudaError_t launch_prefill(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream) {
  switch (id) {
    case TileConfigId::kH64:
      if (prefill_two_groups()) return launch_cfg<CfgH64x2, false, kH64PrefillGroups>(p, stream);
      return launch_cfg<CfgH64, false>(p, stream);
    case TileConfigId::kH32: return launch_cfg<CfgH32, false>(p, stream);
    case TileConfigId::kH16: return launch_cfg<CfgH16, false>(p, stream);
    case TileConfigId::kH8: return launch_cfg<CfgH8, false>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace deepinfer_sm80::attention
