// The lightning indexer's paged decode scorer for SM80+ (no DeepGEMM, no FP8 instructions):
//
//   logit[row, c] = k_scale[c] * sum_h relu(q[row, h] . k[c]) * w[row, h]
//
// over the indexer cache pages ([bs x 128 e4m3 codes][bs x fp32 scales] per page, column c
// of a row in page block_table[req, c / bs], slot c % bs), written as the int64 top-k keys of
// deepinfer_sm80.ampere.indexer.order_keys (score descending, then column ascending; columns
// outside [lo, hi) get INT64_MIN). Same contract as the Triton scorer
// (overlay/deepinfer_sm80/ampere/indexer_triton.py, PAGED and EMIT_KEYS).
//
// Arithmetic. An e4m3 code placed in the fp16 layout (sign to bit 15, its 7 magnitude bits to
// bits 13..7) is the code's value times 2^-8 exactly, subnormals included (fp16 has one more
// exponent bit and 7 more mantissa bits than e4m3), so codes become fp16 MMA operands with
// three integer instructions per two codes and no multiply. Products of two such values are
// exact in fp32 (at most 8 significant bits, at least 2^-34); the tensor cores accumulate the
// 128-term dot product in fp32 (mma.sync.m16n8k16 f16 -> f32), and the sum is scaled back by
// 2^16 (exact). A NaN code (0x7F / 0xFF) poisons what it would poison in the Triton scorer: a
// K column with one is NaN for every head, a Q head with one is NaN for every column; relu is
// fmaxf (NaN -> 0, as Triton's maximum).
//
// Layout. One block per (row, chunk of columns); warp w owns heads [16w, 16w + 16) (M side of
// the MMA), the columns are the N side, 8 per MMA. The dot product's 128 positions are
// permuted the same way for Q and K so that lane (g, t) of a warp holds bytes
// [32t, 32t + 32) of its head / column row: step s of the 8 MMA steps takes bytes
// 32t + 4s .. 32t + 4s + 3 (logical k 2t, 2t+1, 2t+8, 2t+9). The block streams its columns'
// code rows (128 bytes each) through a 4-stage cp.async ring of 32 columns (rows XOR-swizzled
// in 16-byte units by column, so that the 2 x 16-byte reads of a quarter-warp hit distinct
// banks); every warp reads the stage from shared memory. Each warp reduces its 16 heads per
// column with shuffles into a shared per-warp array; the block then sums the warps in order,
// applies the column scale and writes the keys. Deterministic: the reduction order is fixed.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/detail/sm80_ptx.cuh"
#include "index/index_kernels.h"

namespace deepinfer_sm80 {
namespace {

using attention::ptx::cp_async_16;
using attention::ptx::cp_async_commit;
using attention::ptx::cp_async_wait;
using attention::ptx::smem_u32;

constexpr int kD = 128;                          // index head dim (bytes per code row)
constexpr int kStageCols = 32;                   // columns per pipeline stage
constexpr int kStages = 4;                       // cp.async ring depth
constexpr int kStageBytes = kStageCols * kD;     // 4 KB
constexpr int kRingBytes = kStages * kStageBytes;
constexpr int64_t kKeyMin = INT64_MIN;

__device__ __forceinline__ uint32_t prmt_sext(uint32_t a, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(d) : "r"(a), "r"(selector));
  return d;
}

// Codes 0,1 (lo) and 2,3 (hi) of a word as fp16x2, each the code's value times 2^-8: the
// prmt sign-extends each code into a 16-bit half (s..s s eeee mmm); shifted left by 7, bit 15
// is the sign and bits 13..7 the magnitude; bit 14 (a sign copy) and the low half's bits that
// crossed into the high half are masked off.
__device__ __forceinline__ uint32_t e4m3x2_lo_f16x2(uint32_t w) {
  return (prmt_sext(w, 0x9180u) << 7) & 0xBF80BF80u;
}
__device__ __forceinline__ uint32_t e4m3x2_hi_f16x2(uint32_t w) {
  return (prmt_sext(w, 0xB3A2u) << 7) & 0xBF80BF80u;
}

// Nonzero if any byte of the words folded in is a NaN code (low 7 bits all set).
__device__ __forceinline__ uint32_t nan_fold(uint32_t acc, uint32_t w) {
  return acc | ((w & 0x7F7F7F7Fu) + 0x01010101u);
}
__device__ __forceinline__ bool nan_any(uint32_t acc) { return (acc & 0x80808080u) != 0u; }

constexpr uint32_t kF16x2NaN = 0x7E007E00u;

__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 lds128(const uint8_t* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// The page holding global column `col` of request `req` (nullptr: outside the block table,
// a negative or out-of-range page id) and the column's slot in it.
__device__ __forceinline__ const uint8_t* column_page(const IndexerKeysParams& p, int req, int col,
                                                      int& slot) {
  const int blk = fast_div(col, p.bs_div);
  slot = col - blk * p.block_size;
  if (blk >= p.max_blocks) return nullptr;
  const int64_t phys = p.block_table[static_cast<int64_t>(req) * p.bt_stride0 +
                                     static_cast<int64_t>(blk) * p.bt_stride1];
  if (phys < 0 || phys >= p.num_pages) return nullptr;
  return p.pages + phys * p.page_stride;
}

__device__ __forceinline__ int64_t order_key(float x, int64_t local) {
  if (x != x) x = -__int_as_float(0x7F800000);  // NaN -> -inf
  if (x == 0.0f) x = 0.0f;                        // -0 -> +0
  const int32_t bits = __float_as_int(x);
  const int64_t ordered = bits < 0 ? static_cast<int64_t>(bits ^ 0x7FFFFFFF) : bits;
  return ordered * (int64_t{1} << 32) + (int64_t{0xFFFFFFFF} - local);
}

template <int W>
__global__ void __launch_bounds__(W * 32)
indexer_keys_kernel(const IndexerKeysParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* ring = smem;
  float* scales = reinterpret_cast<float*>(smem + kRingBytes);  // [chunk]
  float* red = scales + p.chunk;                                // [W][chunk]

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int row = blockIdx.x;
  const int c_begin = blockIdx.y * p.chunk;  // first column of the chunk, local to the call
  const int ncols = min(p.chunk, p.n_cols - c_begin);
  int64_t* out = p.out + static_cast<int64_t>(row) * p.out_stride0 + c_begin;

  const int req = p.row_req[row];
  const int lo = p.lo[row];
  const int hi = p.hi[row];
  const int64_t base = static_cast<int64_t>(p.col0) + c_begin;  // global column of the chunk
  // visible columns of the chunk, chunk-local: [v0, v1)
  const int64_t lo_rel = static_cast<int64_t>(lo) - base, hi_rel = static_cast<int64_t>(hi) - base;
  const int v0 = static_cast<int>(lo_rel > 0 ? lo_rel : 0);
  const int v1 = static_cast<int>(hi_rel < ncols ? hi_rel : ncols);
  if (req < 0 || req >= p.num_reqs || v0 >= v1) {
    for (int i = tid; i < ncols; i += W * 32) out[i] = kKeyMin;
    return;
  }
  const int s_first = v0 / kStageCols;
  const int s_end = (v1 + kStageCols - 1) / kStageCols;

  // Stage s (chunk columns [32s, 32s + 32)) into ring slot `slot`: 256 16-byte pieces.
  auto load_stage = [&](int s, int slot) {
    uint8_t* dst_stage = ring + slot * kStageBytes;
#pragma unroll 1
    for (int i = tid; i < kStageCols * (kD / 16); i += W * 32) {
      const int c = i >> 3;
      const int part = i & 7;
      const int lc = s * kStageCols + c;
      const void* src = p.pages;
      int bytes = 0;
      if (lc >= v0 && lc < v1) {
        int slot_in_page;
        const uint8_t* page = column_page(p, req, static_cast<int>(base + lc), slot_in_page);
        if (page != nullptr) {
          src = page + static_cast<int64_t>(slot_in_page) * kD + part * 16;
          bytes = 16;
        }
      }
      cp_async_16(smem_u32(dst_stage + c * kD + ((part ^ (c & 7)) << 4)), src, bytes);
    }
  };

#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    if (s_first + k < s_end) load_stage(s_first + k, (s_first + k) % kStages);
    cp_async_commit();
  }

  // column scales of the visible columns (0 elsewhere; never read there)
  for (int i = v0 + tid; i < v1; i += W * 32) {
    int slot_in_page;
    const uint8_t* page = column_page(p, req, static_cast<int>(base + i), slot_in_page);
    scales[i] = page != nullptr
                    ? __ldg(reinterpret_cast<const float*>(page + static_cast<int64_t>(p.block_size) * kD) +
                            slot_in_page)
                    : 0.0f;
  }

  // Q fragments of heads h0 = 16w + g and h1 = h0 + 8, bytes [32t, 32t + 32) of each
  uint32_t qa[8][4];
  float w0, w1;
  {
    const int h0 = warp * 16 + g;
    const uint8_t* q0 = p.q + (static_cast<int64_t>(row) * p.heads + h0) * kD + 32 * t;
    const uint8_t* q1 = q0 + 8 * kD;
    uint32_t a[8], b[8];
    const uint4 a0 = __ldg(reinterpret_cast<const uint4*>(q0));
    const uint4 a1 = __ldg(reinterpret_cast<const uint4*>(q0 + 16));
    const uint4 b0 = __ldg(reinterpret_cast<const uint4*>(q1));
    const uint4 b1 = __ldg(reinterpret_cast<const uint4*>(q1 + 16));
    a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
    a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
    b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w;
    b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
    uint32_t na = 0, nb = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      na = nan_fold(na, a[s]);
      nb = nan_fold(nb, b[s]);
    }
    // a NaN code anywhere in a head's row makes its dot products NaN (the whole row of the
    // head is spread over the 4 lanes of the quad)
    na |= __shfl_xor_sync(0xFFFFFFFFu, na, 1);
    na |= __shfl_xor_sync(0xFFFFFFFFu, na, 2);
    nb |= __shfl_xor_sync(0xFFFFFFFFu, nb, 1);
    nb |= __shfl_xor_sync(0xFFFFFFFFu, nb, 2);
    const bool a_nan = nan_any(na), b_nan = nan_any(nb);
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      qa[s][0] = a_nan ? kF16x2NaN : e4m3x2_lo_f16x2(a[s]);
      qa[s][1] = b_nan ? kF16x2NaN : e4m3x2_lo_f16x2(b[s]);
      qa[s][2] = a_nan ? kF16x2NaN : e4m3x2_hi_f16x2(a[s]);
      qa[s][3] = b_nan ? kF16x2NaN : e4m3x2_hi_f16x2(b[s]);
    }
    w0 = __ldg(p.w + static_cast<int64_t>(row) * p.heads + h0);
    w1 = __ldg(p.w + static_cast<int64_t>(row) * p.heads + h0 + 8);
  }

  float* red_w = red + warp * p.chunk;
#pragma unroll 1
  for (int s = s_first; s < s_end; ++s) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    // refill the slot read in the previous iteration (every warp is past it: the barrier)
    if (s + kStages - 1 < s_end) load_stage(s + kStages - 1, (s + kStages - 1) % kStages);
    cp_async_commit();

    const uint8_t* stage = ring + (s % kStages) * kStageBytes;
#pragma unroll
    for (int nt = 0; nt < kStageCols / 8; ++nt) {
      const int c = nt * 8 + g;  // this lane's B column in the stage
      const uint8_t* crow = stage + c * kD;
      const uint4 k0 = lds128(crow + (((2 * t) ^ (c & 7)) << 4));
      const uint4 k1 = lds128(crow + (((2 * t + 1) ^ (c & 7)) << 4));
      const uint32_t kw[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
      uint32_t nk = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) nk = nan_fold(nk, kw[j]);
      nk |= __shfl_xor_sync(0xFFFFFFFFu, nk, 1);
      nk |= __shfl_xor_sync(0xFFFFFFFFu, nk, 2);
      const bool k_nan = nan_any(nk);
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t b0 = k_nan ? kF16x2NaN : e4m3x2_lo_f16x2(kw[j]);
        const uint32_t b1 = k_nan ? kF16x2NaN : e4m3x2_hi_f16x2(kw[j]);
        mma_f16_16816(acc, qa[j], b0, b1);
      }
      // acc: heads g (0, 1) and g + 8 (2, 3), columns 2t and 2t + 1 of this 8-column tile;
      // x 2^16 undoes the two 2^-8 of the operands
      float v0 = __fmul_rn(fmaxf(acc[0] * 65536.0f, 0.0f), w0) + __fmul_rn(fmaxf(acc[2] * 65536.0f, 0.0f), w1);
      float v1 = __fmul_rn(fmaxf(acc[1] * 65536.0f, 0.0f), w0) + __fmul_rn(fmaxf(acc[3] * 65536.0f, 0.0f), w1);
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) {
        v0 += __shfl_xor_sync(0xFFFFFFFFu, v0, m);
        v1 += __shfl_xor_sync(0xFFFFFFFFu, v1, m);
      }
      if (g == 0) {
        const int lc = s * kStageCols + nt * 8 + 2 * t;
        red_w[lc] = v0;
        red_w[lc + 1] = v1;
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  for (int i = tid; i < ncols; i += W * 32) {
    int64_t key = kKeyMin;
    if (i >= v0 && i < v1) {
      float sum = red[i];
#pragma unroll
      for (int w = 1; w < W; ++w) sum += red[w * p.chunk + i];
      key = order_key(sum * scales[i], base + i - lo);
    }
    out[i] = key;
  }
}

template <int W>
void launch_w(const IndexerKeysParams& p, cudaStream_t stream) {
  const int smem = indexer_keys_smem_bytes(W * 16, p.chunk);
  dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>((p.n_cols + p.chunk - 1) / p.chunk));
  indexer_keys_kernel<W><<<grid, W * 32, smem, stream>>>(p);
}

}  // namespace

int indexer_keys_smem_bytes(int heads, int chunk) {
  return kRingBytes + chunk * static_cast<int>(sizeof(float)) * (heads / 16 + 1);
}

int indexer_keys_chunk(int rows, int n_cols, const DeviceLimits& lim) {
  // about 8 blocks per SM in total, 32..512 columns per block (shared memory <= 34 KB)
  const int64_t target = static_cast<int64_t>(lim.sm_count) * 8;
  int64_t per_row = (target + rows - 1) / rows;
  if (per_row < 1) per_row = 1;
  int64_t chunk = (static_cast<int64_t>(n_cols) + per_row - 1) / per_row;
  chunk = (chunk + kStageCols - 1) / kStageCols * kStageCols;
  if (chunk < kStageCols) chunk = kStageCols;
  if (chunk > kIndexerKeysMaxChunk) chunk = kIndexerKeysMaxChunk;
  return static_cast<int>(chunk);
}

void launch_indexer_keys(const IndexerKeysParams& params, const DeviceLimits& lim, cudaStream_t stream) {
  if (params.rows <= 0 || params.n_cols <= 0) return;
  IndexerKeysParams p = params;
  p.bs_div = make_fast_div(p.block_size);
  if (p.chunk <= 0) p.chunk = indexer_keys_chunk(p.rows, p.n_cols, lim);
  switch (p.heads) {
    case 16: launch_w<1>(p, stream); break;
    case 32: launch_w<2>(p, stream); break;
    case 64: launch_w<4>(p, stream); break;
    case 128: launch_w<8>(p, stream); break;
    default: break;  // the op checks heads first
  }
}

}  // namespace deepinfer_sm80
