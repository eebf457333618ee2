// compute_global_topk_indices_and_lens for SM80+: one warp per token row, 16-byte loads
// and stores when the rows allow it, a warp reduction for the valid count.
#include <cuda_runtime.h>

#include "common/vec.cuh"
#include "index/index_kernels.h"

namespace deepinfer_sm80 {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

struct RowCtx {
  const int32_t* bt_row;  // nullptr when the request index is out of range
  int64_t bt_stride1;
  int max_blocks;
  int block_size;
};

// Local index -> global slot (int32 arithmetic, wrapping like the upstream kernel).
__device__ __forceinline__ int32_t map_slot(const RowCtx& c, int32_t l) {
  if (l < 0) return -1;
  const int32_t blk = l / c.block_size;
  if (c.bt_row == nullptr || blk >= c.max_blocks) return -1;
  const int32_t phys = c.bt_row[blk * c.bt_stride1];
  return static_cast<int32_t>(static_cast<uint32_t>(phys) * static_cast<uint32_t>(c.block_size) +
                              static_cast<uint32_t>(l - blk * c.block_size));
}

template <bool kVec4>
__global__ void __launch_bounds__(kThreads) global_topk_kernel(const GlobalTopkParams p) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * kWarpsPerBlock;
  for (int t = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5); t < p.num_tokens; t += nwarps) {
    const int req = p.token_to_req[t];
    RowCtx c;
    c.bt_row = (req >= 0 && req < p.num_reqs)
                   ? p.block_table + static_cast<int64_t>(req) * p.bt_stride0
                   : nullptr;
    c.bt_stride1 = p.bt_stride1;
    c.max_blocks = p.max_blocks;
    c.block_size = p.block_size;
    const int32_t* src = p.topk + static_cast<int64_t>(t) * p.topk_stride0;
    int32_t* dst = p.global_idx + static_cast<int64_t>(t) * p.global_stride0;
    int count = 0;
    if (kVec4) {
      for (int j = lane * 4; j < p.k; j += 128) {
        const int4 l = *reinterpret_cast<const int4*>(src + j);
        count += (l.x >= 0) + (l.y >= 0) + (l.z >= 0) + (l.w >= 0);
        const int4 g = make_int4(map_slot(c, l.x), map_slot(c, l.y), map_slot(c, l.z),
                                 map_slot(c, l.w));
        *reinterpret_cast<int4*>(dst + j) = g;
      }
    } else {
      for (int j = lane; j < p.k; j += 32) {
        const int32_t l = src[j];
        count += (l >= 0);
        dst[j] = map_slot(c, l);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(0xFFFFFFFFu, count, o);
    if (lane == 0) p.lens[t] = p.is_valid_token[t] ? count : 0;
  }
}

}  // namespace

void launch_global_topk(const GlobalTopkParams& p, const DeviceLimits& lim, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  const int blocks = lim.grid_blocks(p.num_tokens, kWarpsPerBlock, 8);
  if (p.vec4) {
    global_topk_kernel<true><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    global_topk_kernel<false><<<blocks, kThreads, 0, stream>>>(p);
  }
}

}  // namespace deepinfer_sm80
