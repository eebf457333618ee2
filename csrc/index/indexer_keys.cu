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
// Layout. Heads on the N side of the MMA (8 per tile), columns on the M side (16 per tile):
// one warp holds the B fragments of every head of its row (heads / 8 tiles x 8 steps x 2
// registers, decoded once) and streams 16-column tiles of the row's K through its own 4-stage
// cp.async ring in shared memory (2 KB of codes + 64 B of scales per tile), so each K byte is
// decoded once and every column's head sum stays in the warp: in-thread over the head tiles,
// then two shuffles over the quad. The dot product's 128 positions are permuted the same way
// for Q and K so that lane (g, t) holds bytes [32t, 32t + 32) of its head / column row: step s
// of the 8 MMA steps takes bytes 32t + 4s .. 32t + 4s + 3 (logical k 2t, 2t+1, 2t+8, 2t+9).
// Tile rows are swizzled in 16-byte units by the column's parity, so that the 16-byte reads of
// a quarter-warp hit distinct banks. A block is 4 such warps on one row, taking the column
// tiles of its chunk in turn. Deterministic: every reduction has a fixed order.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/detail/sm80_ptx.cuh"
#include "common/env_knob.h"
#include "common/fp8_e4m3.cuh"
#include "common/vec.cuh"
#include "index/index_kernels.h"
#include "index/indexer_keys_common.cuh"

namespace deepinfer_sm80 {
namespace {

using attention::ptx::cp_async_16;
using attention::ptx::cp_async_4;
using attention::ptx::cp_async_commit;
using attention::ptx::cp_async_wait;
using attention::ptx::mma_f16_16816;
using attention::ptx::smem_u32;

using indexer_keys::kD;
using indexer_keys::kF16x2NaN;
using indexer_keys::kKeyMin;
using indexer_keys::order_key;
using indexer_keys::clamp_cols;
using indexer_keys::visible_chunk;
using indexer_keys::words8;

constexpr int kWarps = 4;                                // warps per block
constexpr int kTileCols = 16;                            // columns per MMA tile (M side)
constexpr int kTileCodeBytes = kTileCols * kD;           // 2 KB
constexpr int kTileBytes = kTileCodeBytes + kTileCols * 4;  // + the columns' fp32 scales
constexpr int kRingSmall = 4;  // ring depth per warp where two blocks of 8 stages do not fit
constexpr int kRingLarge = 8;  // (SM86's 99 KB); SM80 and SM90 take 8
constexpr int kWeightBytes = 64 * 4;                     // weights of up to 64 heads

// The page ids of the blocks covering a chunk's visible columns, read once per block into
// shared memory (-1: outside the block table, a negative or out-of-range page id), so that a
// tile's copies wait on a shared-memory read instead of a global one.
struct PageTable {
  const int32_t* ids;  // shared memory
  int first_blk;       // block-table column of ids[0]
};

// The page holding global column `col` (nullptr: none) and the column's slot in it.
__device__ __forceinline__ const uint8_t* column_page(const IndexerKeysParams& p, const PageTable& pt,
                                                      int col, int& slot) {
  const int blk = fast_div(col, p.bs_div);
  slot = col - blk * p.block_size;
  const int32_t phys = pt.ids[blk - pt.first_blk];
  return phys < 0 ? nullptr : p.pages + static_cast<int64_t>(phys) * p.page_stride;
}

// Where column lc (chunk-local; visible: [v0, v1)) keeps its 16-byte piece `part` of codes
// (scale false) or its fp32 scale (scale true); nullptr for an invisible column or no page
// (flat mode: a column at or past num_k).
template <bool kFlat>
__device__ __forceinline__ const void* column_bytes(const IndexerKeysParams& p, const PageTable& pt,
                                                    int64_t base, int v0, int v1, int lc,
                                                    bool scale, int part) {
  if (lc < v0 || lc >= v1) return nullptr;
  if constexpr (kFlat) {
    const int64_t col = base + lc;
    if (col >= p.num_k) return nullptr;
    return scale ? static_cast<const void*>(p.k_scales + col)
                 : static_cast<const void*>(p.k_codes + col * p.k_stride + part * 16);
  }
  int slot;
  const uint8_t* page = column_page(p, pt, static_cast<int>(base + lc), slot);
  if (page == nullptr) return nullptr;
  return scale ? page + static_cast<int64_t>(p.block_size) * kD + 4 * static_cast<int64_t>(slot)
               : page + static_cast<int64_t>(slot) * kD + part * 16;
}

// NT: head tiles of 8 (heads = 8 NT: 16, 32 or 64). kDiag (measurement only, wrong keys by
// design; $DEEPINFER_INDEXER_DIAG): 1 = the tile stream without decode, MMA or epilogue (a
// key from the loaded words), 2 = the math on whatever the ring holds, without the copies.
// kFlat: K from the flat workspace (IndexerKeysParams::k_codes), no page table.
// 32 heads: at most 128 registers, the four blocks per A100 SM that the ring's shared memory
// allows (the window prologue took ptxas from 125 to 132 registers, three blocks).
template <int NT, int kStages, int kDiag = 0, bool kFlat = false>
__global__ void __launch_bounds__(kWarps * 32, NT == 4 ? 4 : 1)
indexer_keys_kernel(const IndexerKeysParams p) {
  constexpr int kWarpRing = kStages * kTileBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  float* sw = reinterpret_cast<float*>(smem);  // the row's weights x 2^16
  int32_t* spage = reinterpret_cast<int32_t*>(smem + kWeightBytes + kWarps * kWarpRing);

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  uint8_t* ring = smem + kWeightBytes + warp * kWarpRing;
  const int row = blockIdx.x;
  const int req = kFlat ? 0 : p.row_req[row];
  const int lo = p.lo[row];
  const int hi = p.hi[row];
  int64_t* const row_out = p.out + static_cast<int64_t>(row) * p.out_stride0;
  // The row's visible columns of the call, [V0, V1). A vLLM decode's block table spans
  // max_model_len and a row only its context, so the visible columns, not the call's, are
  // spread over the row's gridDim.y blocks; each block also writes INT64_MIN over the invisible
  // columns of its own range [y * chunk, (y + 1) * chunk) of the call.
  const int V0 = clamp_cols(static_cast<int64_t>(lo) - p.col0, 0, p.n_cols);
  const int V1 = clamp_cols(static_cast<int64_t>(hi) - p.col0, V0, p.n_cols);
  const bool no_req = !kFlat && (req < 0 || req >= p.num_reqs);
  if (p.fill || no_req) {  // [a, e) minus [V0, V1) (all of it without a request): [a, f), [g, e)
    const int a = blockIdx.y * p.chunk, e = min(a + p.chunk, p.n_cols);
    const int f = no_req ? e : min(e, V0), g = max(max(a, V1), f);
    for (int c = a + tid; c < f; c += kWarps * 32) row_out[c] = kKeyMin;
    for (int c = g + tid; c < e; c += kWarps * 32) row_out[c] = kKeyMin;
  }
  const int cv = visible_chunk(V1 - V0, gridDim.y, kTileCols, p.chunk);
  const int64_t c_first = static_cast<int64_t>(V0) + static_cast<int64_t>(blockIdx.y) * cv;
  if (no_req || c_first >= V1) return;
  const int c_begin = static_cast<int>(c_first);  // first column of the block, local to the call
  const int ncols = min(cv, V1 - c_begin);        // all visible
  int64_t* out = row_out + c_begin;
  const int64_t base = static_cast<int64_t>(p.col0) + c_begin;  // global column of the block
  const int v0 = 0, v1 = ncols;  // visible columns, block-local
  const int tile_first = 0;
  const int tile_end = (ncols + kTileCols - 1) / kTileCols;

  // the page table of the visible columns (paged mode), and the weights
  PageTable pt;
  pt.ids = spage;
  pt.first_blk = 0;
  if constexpr (!kFlat) {
    pt.first_blk = fast_div(static_cast<int>(base + v0), p.bs_div);
    const int n_blk = fast_div(static_cast<int>(base + v1 - 1), p.bs_div) - pt.first_blk + 1;
    for (int i = tid; i < n_blk; i += kWarps * 32) {
      const int blk = pt.first_blk + i;
      int32_t id = -1;
      if (blk < p.max_blocks) {
        const int32_t phys = p.block_table[static_cast<int64_t>(req) * p.bt_stride0 +
                                           static_cast<int64_t>(blk) * p.bt_stride1];
        if (phys >= 0 && phys < p.num_pages) id = phys;
      }
      spage[i] = id;
    }
  }
  for (int h = tid; h < 8 * NT; h += kWarps * 32) {
    sw[h] = p.w[static_cast<int64_t>(row) * p.heads + h] * 65536.0f;
  }
  __syncthreads();

  // Tile j (chunk columns [16j, 16j + 16)) into ring slot `slot`: 128 16-byte pieces of codes
  // (4 per lane) and 16 4-byte scales (lanes 0-15); invisible columns are zero-filled.
  const void* no_src = kFlat ? static_cast<const void*>(p.k_codes) : static_cast<const void*>(p.pages);
  auto load_tile = [&](int j, int slot) {
    if constexpr (kDiag == 2) return;
    uint8_t* dst = ring + slot * kTileBytes;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int piece = lane + 32 * k;
      const int c = piece >> 3;
      const int part = piece & 7;
      const void* src = column_bytes<kFlat>(p, pt, base, v0, v1, j * kTileCols + c, false, part);
      cp_async_16(smem_u32(dst + c * kD + ((part ^ (c & 1)) << 4)), src ? src : no_src, src ? 16 : 0);
    }
    if (lane < kTileCols) {
      const void* src = column_bytes<kFlat>(p, pt, base, v0, v1, j * kTileCols + lane, true, 0);
      cp_async_4(smem_u32(dst + kTileCodeBytes + 4 * lane), src ? src : no_src, src ? 4 : 0);
    }
  };

  // this warp's tiles: tile_first + warp, + 4, ...
  const int j0 = tile_first + warp;
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    if (j0 + k * kWarps < tile_end) load_tile(j0 + k * kWarps, k);
    cp_async_commit();
  }

  // B fragments of every head: head 8n + g, bytes [32t, 32t + 32). A NaN code in a head's row
  // makes its dot products NaN: one NaN operand in the lane's first step does that.
  uint32_t qb[NT][8][2];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const uint8_t* qp = p.q + (static_cast<int64_t>(row) * p.heads + 8 * n + g) * kD + 32 * t;
    uint32_t w[8];
    words8(__ldg(reinterpret_cast<const uint4*>(qp)), __ldg(reinterpret_cast<const uint4*>(qp + 16)), w);
    uint32_t nf = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      nf = e4m3_nan_fold(nf, w[s]);
      qb[n][s][0] = e4m3x2_lo_to_f16x2_m8(w[s]);
      qb[n][s][1] = e4m3x2_hi_to_f16x2_m8(w[s]);
    }
    if (e4m3_nan_any(nf)) qb[n][0][0] = kF16x2NaN;
  }

  int it = 0;
#pragma unroll 1
  for (int j = j0; j < tile_end; j += kWarps, ++it) {
    // every lane is past the tile read in the previous iteration: refill its slot first,
    // then wait for this iteration's tile (kStages - 1 groups may stay in flight)
    __syncwarp();
    const int jn = j + (kStages - 1) * kWarps;
    if (jn < tile_end) load_tile(jn, (it + kStages - 1) % kStages);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();

    const uint8_t* tile = ring + (it % kStages) * kTileBytes;
    // A fragments: column g (rows 0-7 of the tile) and column g + 8, bytes [32t, 32t + 32)
    uint32_t kg[8], kh[8];
    {
      const uint8_t* rg = tile + g * kD;
      const uint8_t* rh = tile + (g + 8) * kD;
      const int sw0 = ((2 * t) ^ (g & 1)) << 4, sw1 = ((2 * t + 1) ^ (g & 1)) << 4;
      words8(ld_v4(rg + sw0), ld_v4(rg + sw1), kg);
      words8(ld_v4(rh + sw0), ld_v4(rh + sw1), kh);
    }
    if constexpr (kDiag == 1) {
      uint32_t x = 0;
#pragma unroll
      for (int s = 0; s < 8; ++s) x ^= kg[s] ^ kh[s];
      if (t < 2 && j * kTileCols + g + 8 * t < ncols) out[j * kTileCols + g + 8 * t] = x;
      continue;
    }
    uint32_t ng = 0, nh = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      ng = e4m3_nan_fold(ng, kg[s]);
      nh = e4m3_nan_fold(nh, kh[s]);
    }
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint32_t a[4] = {e4m3x2_lo_to_f16x2_m8(kg[s]), e4m3x2_lo_to_f16x2_m8(kh[s]), e4m3x2_hi_to_f16x2_m8(kg[s]),
                       e4m3x2_hi_to_f16x2_m8(kh[s])};
      if (s == 0) {  // a NaN code in a column's row makes its dot products NaN
        if (e4m3_nan_any(ng)) a[0] = kF16x2NaN;
        if (e4m3_nan_any(nh)) a[1] = kF16x2NaN;
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_f16_16816(acc[n], a, qb[n][s][0], qb[n][s][1]);
    }
    // acc[n]: columns g (0, 1) and g + 8 (2, 3), heads 8n + 2t and 8n + 2t + 1
    // two partial sums per column (even and odd head tiles): half the dependent chain
    float pg[2] = {0.0f, 0.0f}, ph[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float2 wv = *reinterpret_cast<const float2*>(sw + 8 * n + 2 * t);
      pg[n & 1] += fmaxf(acc[n][0], 0.0f) * wv.x;
      ph[n & 1] += fmaxf(acc[n][2], 0.0f) * wv.x;
      pg[n & 1] += fmaxf(acc[n][1], 0.0f) * wv.y;
      ph[n & 1] += fmaxf(acc[n][3], 0.0f) * wv.y;
    }
    float vg = pg[0] + pg[1], vh = ph[0] + ph[1];
    vg += __shfl_xor_sync(0xFFFFFFFFu, vg, 1);
    vh += __shfl_xor_sync(0xFFFFFFFFu, vh, 1);
    vg += __shfl_xor_sync(0xFFFFFFFFu, vg, 2);
    vh += __shfl_xor_sync(0xFFFFFFFFu, vh, 2);
    if (t < 2) {
      const int c = g + 8 * t;
      const int lc = j * kTileCols + c;
      if (lc < ncols) {
        int64_t key = kKeyMin;
        if (lc >= v0 && lc < v1) {
          const float sc = *reinterpret_cast<const float*>(tile + kTileCodeBytes + 4 * c);
          key = order_key((t == 0 ? vg : vh) * sc, base + lc - lo);
        }
        out[lc] = key;
      }
    }
  }
  cp_async_wait<0>();
}

int indexer_keys_smem_bytes(int chunk, int block_size, int stages) {
  const int pages = chunk / block_size + 2;  // blocks a chunk's columns can touch
  return kWeightBytes + kWarps * stages * kTileBytes + 4 * pages;
}

int indexer_keys_chunk(int rows, int n_cols, int block_size, int resident_blocks) {
  // As many columns per block as keeps every row's blocks within one wave of resident blocks
  // (blocks that start together finish together), in 64-column steps (a tile per warp), at
  // most kIndexerKeysMaxPages pages per chunk, and at most 65535 chunks per row.
  int64_t per_row = resident_blocks / (rows > 0 ? rows : 1);
  if (per_row < 1) per_row = 1;
  int64_t chunk = (static_cast<int64_t>(n_cols) + per_row - 1) / per_row;
  const int64_t step = kIndexerKeysChunkStep;
  chunk = (chunk + step - 1) / step * step;
  const int64_t min_chunk = (static_cast<int64_t>(n_cols) + 65534) / 65535;
  if (chunk < min_chunk) chunk = (min_chunk + step - 1) / step * step;
  const int64_t max_chunk = (static_cast<int64_t>(kIndexerKeysMaxPages) - 2) * block_size / step * step;
  if (chunk > max_chunk) chunk = max_chunk;
  if (chunk < step) chunk = step;
  return static_cast<int>(chunk);
}

// Flat mode (prefill: many rows over one workspace): chunks of at least kFlatMinChunk columns,
// so that a block's four Q-fragment decodes (about two tiles' work each) stay under a tenth
// of its work, and at least kFlatWaves waves of blocks, so that the last, partial wave is a
// small share of the call on any SM count.
constexpr int kFlatMinChunk = 2048;
constexpr int kFlatWaves = 4;

int indexer_flat_chunk(int rows, int n_cols, int resident_blocks) {
  const int64_t step = kIndexerKeysChunkStep;
  const int64_t r = rows > 0 ? rows : 1;
  int64_t per_row = (static_cast<int64_t>(kFlatWaves) * resident_blocks + r - 1) / r;
  if (per_row < 1) per_row = 1;
  int64_t chunk = (static_cast<int64_t>(n_cols) + per_row - 1) / per_row;
  if (chunk < kFlatMinChunk) chunk = kFlatMinChunk;
  const int64_t min_chunk = (static_cast<int64_t>(n_cols) + 65534) / 65535;
  if (chunk < min_chunk) chunk = min_chunk;
  chunk = (chunk + step - 1) / step * step;
  const int64_t all = (static_cast<int64_t>(n_cols) + step - 1) / step * step;
  return static_cast<int>(chunk < all ? chunk : all);
}

template <int NT, int kStages, int kDiag = 0, bool kFlat = false>
int blocks_per_sm(int smem) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, indexer_keys_kernel<NT, kStages, kDiag, kFlat>, kWarps * 32, smem) !=
          cudaSuccess || n <= 0) {
    n = 1;
  }
  return n;
}

template <int NT, int kStages, int kDiag = 0, bool kFlat = false>
void launch_nt(IndexerKeysParams p, const DeviceLimits& lim, cudaStream_t stream) {
  // $DEEPINFER_INDEXER_SMEM_PAD = bytes (measurement knob): unused dynamic shared memory, so
  // that fewer blocks are resident per SM
  static const int pad = [] {
    const int b = knob_int("DEEPINFER_INDEXER_SMEM_PAD", 0);
    return b > 0 ? b : 0;
  }();
  auto* kernel = indexer_keys_kernel<NT, kStages, kDiag, kFlat>;
  static const bool opted_in = [&] {  // dynamic shared memory beyond 48 KB (the 8-stage ring)
    int dev = 0, cap = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&cap, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, cap) == cudaSuccess;
  }();
  (void)opted_in;
  if (p.chunk <= 0) {
    static const int per_sm =
        blocks_per_sm<NT, kStages, kDiag, kFlat>(indexer_keys_smem_bytes(kIndexerKeysChunkStep, 1 << 20, kStages) + pad);
    p.chunk = kFlat ? indexer_flat_chunk(p.rows, p.n_cols, lim.sm_count * per_sm)
                    : indexer_keys_chunk(p.rows, p.n_cols, p.block_size, lim.sm_count * per_sm);
  }
  const int smem = indexer_keys_smem_bytes(p.chunk, p.block_size, kStages) + pad;
  dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>((p.n_cols + p.chunk - 1) / p.chunk));
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
}

template <int NT, int kDiag = 0, bool kFlat = false>
void launch_ring(const IndexerKeysParams& p, const DeviceLimits& lim, cudaStream_t stream) {
  // 8 stages where two such blocks fit the per-block shared-memory limit (SM80 163 KB,
  // SM90 227 KB), else 4 (SM86 99 KB; an explicit cap, e.g. the op's smem_cap, counts)
  const int big = indexer_keys_smem_bytes(kIndexerKeysChunkStep, p.block_size, kRingLarge);
  if (2 * big <= lim.max_dynamic_smem) {
    launch_nt<NT, kRingLarge, kDiag, kFlat>(p, lim, stream);
  } else {
    launch_nt<NT, kRingSmall, kDiag, kFlat>(p, lim, stream);
  }
}

}  // namespace

void launch_indexer_keys(const IndexerKeysParams& params, const DeviceLimits& lim, cudaStream_t stream) {
  if (params.rows <= 0 || params.n_cols <= 0) return;
  IndexerKeysParams p = params;
  if (p.k_codes != nullptr) {  // flat mode: no pages (block_size only sizes the page table: none)
    p.block_size = 1 << 20;
    p.bs_div = make_fast_div(p.block_size);
    indexer_keys::with_head_tiles(
        p.heads, [&](auto nt) { launch_ring<decltype(nt)::value, 0, true>(p, lim, stream); });
    return;
  }
  p.bs_div = make_fast_div(p.block_size);
  static const int diag = knob_int("DEEPINFER_INDEXER_DIAG", 0);
  if (diag == 1 && p.heads == 64) return launch_ring<8, 1>(p, lim, stream);
  if (diag == 2 && p.heads == 64) return launch_ring<8, 2>(p, lim, stream);
  indexer_keys::with_head_tiles(p.heads, [&](auto nt) { launch_ring<decltype(nt)::value>(p, lim, stream); });
}

}  // namespace deepinfer_sm80
