// SPDX-License-Identifier: Apache-2.0
// Decode: keys read from the FP8 fp8_ds_mla paged caches (window list + compressed list),
// dequantised exactly inside the block.
#include "../launch_impl.cuh"

namespace deepinfer_sm80::attention {

cudaError_t launch_decode(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream) {
  return launch_dispatch<true>(p, id, stream);
}

}  // namespace deepinfer_sm80::attention
