// SPDX-License-Identifier: Apache-2.0
// Prefill: keys read as bf16 rows of the gathered workspace (cp.async into the tile).
#include "../launch_impl.cuh"

namespace deepinfer_sm80::attention {

cudaError_t launch_prefill(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream) {
  return launch_dispatch<false>(p, id, stream);
}

}  // namespace deepinfer_sm80::attention
