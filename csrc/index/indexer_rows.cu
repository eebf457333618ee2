// The lightning indexer's prefill scorer with K shared across rows (SM80+, no FP8 instructions):
//
//   logit[row, c] = k_scale[c] * sum_h relu(q[row, h] . k[c]) * w[row, h]
//
// over the flat prefill workspace (column c: 128 e4m3 codes at k_codes + c * k_stride, scale
// k_scales[c]), written as the int64 keys of deepinfer_sm80.ampere.indexer.order_keys. The
// contract, the arithmetic and the keys are those of indexer_keys.cu's flat mode, bit for bit
// (the same MMA steps in the same order, the same epilogue order); only the work split differs.
//
// Why a second kernel. indexer_keys.cu gives each warp one row: the row's Q fragments live in
// registers (128 of them for 64 heads) and every K tile is decoded again for every row. In
// prefill every row of a chunk reads the same workspace, so here a block takes kR rows (8 where
// their fp16 Q fits the shared-memory cap, else 4 or 2):
// - Q of the block's rows is decoded once into shared memory as fp16 (value x 2^-8, exact), in
//   the permuted order of indexer_keys.cu, so that `ldmatrix` hands lane (g, t) exactly the B
//   fragment indexer_keys.cu decodes in registers. 16-byte chunks of a head's 256-byte row are
//   swizzled by head & 7, so the eight row addresses of each 8x8 matrix hit distinct banks.
// - A warp takes 32 columns at a time (two 16-column M tiles), loads their codes straight into
//   registers (lane (g, t): bytes [32t, 32t + 32) of columns g, g + 8, g + 16, g + 24; the next
//   pair's loads are issued before this pair's math), decodes the A fragments once and runs
//   them against the B fragments of every head of each of the kR rows. Each B fragment serves
//   two MMAs (the two M tiles).
// - Heads go in groups of up to four head tiles (32 heads): eight independent accumulator
//   chains, folded into the row's sums (relu x weight, head tiles in order) when the group ends.
//   With one group per row (16 or 32 heads) the rows are software-pipelined: a row's MMAs are
//   issued next to the previous row's fold (two accumulator sets; -8% at 32 heads on the H200).
// Deterministic: every reduction has a fixed order.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/detail/sm80_ptx.cuh"
#include "common/env_knob.h"
#include "common/fp8_e4m3.cuh"
#include "index/index_kernels.h"
#include "index/indexer_keys_common.cuh"

namespace deepinfer_sm80 {
namespace {

using attention::ptx::ldmatrix_x4;
using attention::ptx::mma_f16_16816;
using attention::ptx::smem_u32;
using indexer_keys::kD;
using indexer_keys::kF16x2NaN;
using indexer_keys::clamp_cols;
using indexer_keys::kKeyMin;
using indexer_keys::order_key;
using indexer_keys::visible_chunk;

constexpr int kWarps = 8;           // warps per block
constexpr int kPairCols = 32;       // columns a warp takes at a time (two M tiles)
constexpr int kHeadRowBytes = kD * 2;  // a head's 128 fp16 values in shared memory

// One head group of one row against a warp's 32-column pair: zero acc, then the 8 MMA steps of
// each of its kG head tiles and both M tiles (acc[n][m]: columns 16m + g (0, 1) and 16m + g + 8
// (2, 3), heads 8 n + 2t, + 1 of the group). q_group: this lane's ldmatrix row address of the
// group's first head tile (see the kernel); a: the pair's A fragments.
template <int kG>
__device__ __forceinline__ void mma_group(float (&acc)[kG][2][4], const uint32_t (&a)[2][8][4], uint32_t q_group,
                                          int lm, int li) {
#pragma unroll
  for (int n = 0; n < kG; ++n)
#pragma unroll
    for (int m = 0; m < 2; ++m) acc[n][m][0] = acc[n][m][1] = acc[n][m][2] = acc[n][m][3] = 0.0f;
#pragma unroll
  for (int s2 = 0; s2 < 4; ++s2) {
    uint32_t b[kG][4];
#pragma unroll
    for (int n = 0; n < kG; ++n) {
      const int chunk = 4 * s2 + lm;  // 16-byte chunk (step 2 s2 + lm / 2, half lm % 2)
      ldmatrix_x4(q_group + n * 8 * kHeadRowBytes + ((chunk ^ li) << 4), b[n][0], b[n][1], b[n][2], b[n][3]);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int n = 0; n < kG; ++n) {
#pragma unroll
        for (int m = 0; m < 2; ++m) mma_f16_16816(acc[n][m], a[m][2 * s2 + e], b[n][2 * e], b[n][2 * e + 1]);
      }
    }
  }
}

// Fold a head group (first head tile n0) into a row's sums: per M tile, two partial sums per
// column (even and odd head tiles), relu x weight in head-tile order, as indexer_keys.cu.
// wr: the row's weights (x 2^16) in shared memory.
template <int kG>
__device__ __forceinline__ void fold_group(const float (&acc)[kG][2][4], const float* wr, int n0, int t,
                                           float (&pg)[2][2], float (&ph)[2][2]) {
#pragma unroll
  for (int n = 0; n < kG; ++n) {
    const int nt = n0 + n;
    const float2 wv = *reinterpret_cast<const float2*>(wr + 8 * nt + 2 * t);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      pg[m][nt & 1] += fmaxf(acc[n][m][0], 0.0f) * wv.x;
      ph[m][nt & 1] += fmaxf(acc[n][m][2], 0.0f) * wv.x;
      pg[m][nt & 1] += fmaxf(acc[n][m][1], 0.0f) * wv.y;
      ph[m][nt & 1] += fmaxf(acc[n][m][3], 0.0f) * wv.y;
    }
  }
}

// A row's key of column lc (this lane's column of the pair; lanes (g, t) of a quad sum their
// partials): INT64_MIN outside the row's window [win.x, win.y), else order_key of the scaled
// score, position (col0 + lc) - win.z.
__device__ __forceinline__ void store_row_key(const float (&pg)[2][2], const float (&ph)[2][2], int t, int lc,
                                              int ncols, const int4 win, float sc, int64_t col0, int64_t* out) {
  float v[4] = {pg[0][0] + pg[0][1], ph[0][0] + ph[0][1], pg[1][0] + pg[1][1], ph[1][0] + ph[1][1]};
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] += __shfl_xor_sync(0xFFFFFFFFu, v[k], 1);
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] += __shfl_xor_sync(0xFFFFFFFFu, v[k], 2);
  if (lc < ncols) {
    int64_t key = kKeyMin;
    if (lc >= win.x && lc < win.y) {
      const float x = t == 0 ? v[0] : t == 1 ? v[1] : t == 2 ? v[2] : v[3];
      key = order_key(x * sc, col0 + lc - win.z);
    }
    out[lc] = key;
  }
}

template <int NT, int kR, bool kPaged>
constexpr int smem_bytes() {
  // fp16 Q rows + weights + row windows (+ paged: a chunk's page ids)
  return kR * 8 * NT * (kHeadRowBytes + 4) + kR * 16 + (kPaged ? 4 * kIndexerKeysMaxPages : 0);
}

// Rows row0 .. row0 + G - 1 of the call (G = kR, or p.group_rows <= kR in paged mode; rows past
// p.rows take no part), columns [c_begin, c_begin + chunk) of the call; kWarps warps, one
// block per SM (the registers: 238 at 64 heads). Paged mode: the block's rows are taken in runs of equal row_req (one
// run when the rows of a request are contiguous and blocks are aligned to them, as decode_topk
// lays them out); each run streams its request's pages.
template <int NT, int kR, bool kPaged>
__global__ void __launch_bounds__(kWarps * 32, 1)
indexer_rows_kernel(const IndexerKeysParams p) {
  constexpr int kHeads = 8 * NT;
  constexpr int kGroup = NT < 4 ? NT : 4;  // head tiles per accumulator group
  constexpr int kSteps = NT / kGroup;      // head groups per row: 2 at 64 heads, else 1
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sq = smem;                                                // [kR][heads][256 B]
  float* sw = reinterpret_cast<float*>(smem + kR * kHeads * kHeadRowBytes);  // [kR][heads]
  int4* swin = reinterpret_cast<int4*>(sw + kR * kHeads);  // [kR]: v0, v1, lo, req of each row
  int32_t* spage = reinterpret_cast<int32_t*>(swin + kR);  // paged: the run's page ids

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int group = kPaged ? p.group_rows : kR;
  const int row0 = blockIdx.x * group;
  const int live = min(group, p.rows - row0);

  // Each row's visible columns of the call [V0, V1), its lo and (paged) its request. A vLLM
  // decode's block table spans max_model_len and a row only its context, so the union [U0, U1)
  // of the block's rows' visible columns, not the call's columns, is spread over the
  // gridDim.y blocks of the row group; each block also writes INT64_MIN for every row over the
  // columns of its own range [y * chunk, (y + 1) * chunk) of the call outside the union.
  if (tid < live) {
    const int lo = p.lo[row0 + tid];
    const int v0 = clamp_cols(static_cast<int64_t>(lo) - p.col0, 0, p.n_cols);
    const int v1 = clamp_cols(static_cast<int64_t>(p.hi[row0 + tid]) - p.col0, v0, p.n_cols);
    swin[tid] = make_int4(v0, v1, lo, kPaged ? p.row_req[row0 + tid] : 0);
  }

  __syncthreads();  // the windows are in shared memory
  int U0 = p.n_cols, U1 = 0;
  for (int r = 0; r < live; ++r) {
    const int4 win = swin[r];
    if (win.x < win.y) {
      U0 = min(U0, win.x);
      U1 = max(U1, win.y);
    }
  }
  if (p.fill) {  // [a, e) minus [U0, U1): [a, f) and [g, e)
    const int a = blockIdx.y * p.chunk, e = min(a + p.chunk, p.n_cols);
    const int f = min(e, U0), g = max(max(a, U1), f);
    for (int r = 0; r < live; ++r) {
      int64_t* out = p.out + static_cast<int64_t>(row0 + r) * p.out_stride0;
      for (int c = a + tid; c < f; c += kWarps * 32) out[c] = kKeyMin;
      for (int c = g + tid; c < e; c += kWarps * 32) out[c] = kKeyMin;
    }
  }
  const int cv = visible_chunk(U1 > U0 ? U1 - U0 : 0, gridDim.y, kPairCols, p.chunk);
  const int64_t c_first = static_cast<int64_t>(U0) + static_cast<int64_t>(blockIdx.y) * cv;
  if (c_first >= U1) return;  // before Q: the column tiles past every row's context are cheap
  const int c_begin = static_cast<int>(c_first);  // first column of the block, local to the call
  const int ncols = min(cv, U1 - c_begin);
  const int64_t base = static_cast<int64_t>(p.col0) + c_begin;  // global column of the block
  // Q of the block's rows as fp16 (x 2^-8) in the order lane (g, t) reads its B fragments: the
  // 16-byte chunk (s, half) of a head row holds, for t = 0..3, codes 32t + 4s + 2 half + {0, 1}.
  // A NaN code anywhere in a head's row makes element 0 NaN: every dot product of the head.
  for (int i = tid; i < live * kHeads; i += kWarps * 32) {
    const int r = i / kHeads, h = i - r * kHeads;
    uint8_t* dst = sq + static_cast<int64_t>(i) * kHeadRowBytes;
    uint32_t w[32];
    const uint4* src = reinterpret_cast<const uint4*>(p.q + (static_cast<int64_t>(row0 + r) * p.heads + h) * kD);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint4 v = __ldg(src + k);
      w[4 * k] = v.x; w[4 * k + 1] = v.y; w[4 * k + 2] = v.z; w[4 * k + 3] = v.w;
    }
    uint32_t nf = 0;
#pragma unroll
    for (int k = 0; k < 32; ++k) nf = e4m3_nan_fold(nf, w[k]);
#pragma unroll
    for (int s = 0; s < 8; ++s) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint4 c;
        c.x = half ? e4m3x2_hi_to_f16x2_m8(w[s]) : e4m3x2_lo_to_f16x2_m8(w[s]);
        c.y = half ? e4m3x2_hi_to_f16x2_m8(w[8 + s]) : e4m3x2_lo_to_f16x2_m8(w[8 + s]);
        c.z = half ? e4m3x2_hi_to_f16x2_m8(w[16 + s]) : e4m3x2_lo_to_f16x2_m8(w[16 + s]);
        c.w = half ? e4m3x2_hi_to_f16x2_m8(w[24 + s]) : e4m3x2_lo_to_f16x2_m8(w[24 + s]);
        if (s == 0 && half == 0 && e4m3_nan_any(nf)) c.x = kF16x2NaN;
        *reinterpret_cast<uint4*>(dst + (((2 * s + half) ^ (h & 7)) << 4)) = c;
      }
    }
    sw[i] = p.w[static_cast<int64_t>(row0 + r) * p.heads + h] * 65536.0f;
  }
  __syncthreads();  // every thread has read the call-local windows; Q is in shared memory
  if (tid < live) {  // block-local windows [v0, v1) (empty when v0 >= v1)
    const int4 win = swin[tid];
    swin[tid] = make_int4(max(win.x - c_begin, 0), min(win.y - c_begin, ncols), win.z, win.w);
  }
  __syncthreads();

  // ldmatrix row address of this lane for head tile n, steps (2 s2, 2 s2 + 1): matrix
  // m = lane / 8 (step 2 s2 + m / 2, half m % 2), head row 8n + lane % 8
  const int lm = lane >> 3, li = lane & 7;
  const uint32_t q_lane = smem_u32(sq) + li * kHeadRowBytes;

#pragma unroll 1
  for (int rb = 0; rb < live;) {  // runs [rb, re) of rows with one request (flat: one run)
    int re = live;
    int req = 0;
    if constexpr (kPaged) {
      req = swin[rb].w;
      re = rb + 1;
      while (re < live && swin[re].w == req) ++re;
    }
    const bool have_req = !kPaged || (req >= 0 && req < p.num_reqs);
    int u0 = ncols, u1 = 0;  // the union of the run's visible columns
    for (int r = rb; r < re; ++r) {
      const int4 win = swin[r];
      if (win.x < win.y) {
        u0 = min(u0, win.x);
        u1 = max(u1, win.y);
      }
    }
    if (!have_req) u1 = 0;
    const int pair_first = u0 < u1 ? u0 / kPairCols : 0;
    const int pair_end = u0 < u1 ? (u1 + kPairCols - 1) / kPairCols : 0;
    for (int r = rb; r < re; ++r) {  // columns of no pair
      int64_t* out = p.out + static_cast<int64_t>(row0 + r) * p.out_stride0 + c_begin;
      for (int i = tid; i < ncols; i += kWarps * 32) {
        if (i < pair_first * kPairCols || i >= pair_end * kPairCols) out[i] = kKeyMin;
      }
    }
    const int run_begin = rb;
    rb = re;
    if (pair_first >= pair_end) continue;

    // paged: the page ids of the blocks covering the union (-1: outside the block table, a
    // negative or out-of-range page id)
    int first_blk = 0;
    if constexpr (kPaged) {
      first_blk = fast_div(static_cast<int>(base + u0), p.bs_div);
      const int n_blk = fast_div(static_cast<int>(base + u1 - 1), p.bs_div) - first_blk + 1;
      __syncthreads();  // the previous run's readers are done with spage
      for (int i = tid; i < n_blk; i += kWarps * 32) {
        const int blk = first_blk + i;
        int32_t id = -1;
        if (blk < p.max_blocks) {
          const int32_t phys = p.block_table[static_cast<int64_t>(req) * p.bt_stride0 +
                                             static_cast<int64_t>(blk) * p.bt_stride1];
          if (phys >= 0 && phys < p.num_pages) id = phys;
        }
        spage[i] = id;
      }
      __syncthreads();
    }
    // where chunk-local column lc keeps its codes (scale false, bytes 32t..) or its fp32 scale;
    // nullptr outside the union, at / past num_k (flat) or without a page (paged): scores 0
    auto column = [&](int lc, bool scale) -> const uint8_t* {
      if (lc < u0 || lc >= u1) return nullptr;
      const int64_t col = base + lc;
      if constexpr (kPaged) {
        const int blk = fast_div(static_cast<int>(col), p.bs_div);
        const int slot = static_cast<int>(col) - blk * p.block_size;
        const int32_t phys = spage[blk - first_blk];
        if (phys < 0) return nullptr;
        const uint8_t* page = p.pages + static_cast<int64_t>(phys) * p.page_stride;
        return scale ? page + static_cast<int64_t>(p.block_size) * kD + 4 * static_cast<int64_t>(slot)
                     : page + static_cast<int64_t>(slot) * kD + 32 * t;
      } else {
        if (col >= p.num_k) return nullptr;
        return scale ? reinterpret_cast<const uint8_t*>(p.k_scales + col) : p.k_codes + col * p.k_stride + 32 * t;
      }
    };
    // codes of pair j's columns g + 8q (q = 0..3), bytes [32t, 32t + 32), and the scale of
    // column `lane`
    auto load_pair = [&](int j, uint4 (&raw)[8], float& scale) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint8_t* src = column(j * kPairCols + g + 8 * q, false);
        if (src != nullptr) {
          raw[2 * q] = __ldg(reinterpret_cast<const uint4*>(src));
          raw[2 * q + 1] = __ldg(reinterpret_cast<const uint4*>(src) + 1);
        } else {
          raw[2 * q] = make_uint4(0u, 0u, 0u, 0u);
          raw[2 * q + 1] = raw[2 * q];
        }
      }
      const uint8_t* src = column(j * kPairCols + lane, true);
      scale = src != nullptr ? __ldg(reinterpret_cast<const float*>(src)) : 0.0f;
    };

    const int j0 = pair_first + warp;
    uint4 raw[8];
    float scale = 0.0f;
    if (j0 < pair_end) load_pair(j0, raw, scale);
#pragma unroll 1
    for (int j = j0; j < pair_end; j += kWarps) {
      uint32_t kw[4][8];  // this pair's words: column g + 8q, word s = bytes 32t + 4s .. + 3
#pragma unroll
      for (int q = 0; q < 4; ++q) indexer_keys::words8(raw[2 * q], raw[2 * q + 1], kw[q]);
      const float col_scale = scale;
      if (j + kWarps < pair_end) load_pair(j + kWarps, raw, scale);

      // A fragments of M tile m (columns 16m + g and 16m + g + 8), step s
      uint32_t a[2][8][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        uint32_t ng = 0, nh = 0;
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          ng = e4m3_nan_fold(ng, kw[2 * m][s]);
          nh = e4m3_nan_fold(nh, kw[2 * m + 1][s]);
        }
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          a[m][s][0] = e4m3x2_lo_to_f16x2_m8(kw[2 * m][s]);
          a[m][s][1] = e4m3x2_lo_to_f16x2_m8(kw[2 * m + 1][s]);
          a[m][s][2] = e4m3x2_hi_to_f16x2_m8(kw[2 * m][s]);
          a[m][s][3] = e4m3x2_hi_to_f16x2_m8(kw[2 * m + 1][s]);
        }
        if (e4m3_nan_any(ng)) a[m][0][0] = kF16x2NaN;
        if (e4m3_nan_any(nh)) a[m][0][1] = kF16x2NaN;
      }

      const int lc = j * kPairCols + g + 8 * t;  // the column this lane writes
      const float sc = __shfl_sync(0xFFFFFFFFu, col_scale, g + 8 * t);
      if constexpr (kSteps == 1) {
        // 16 or 32 heads (one head group per row): software-pipelined over the rows that see
        // the pair, two accumulator sets. A row's MMAs are issued next to the previous row's
        // fold, so that the tensor pipe has work while a warp folds (two warps per scheduler).
        // Each row's fold is unchanged: the same sums in the same order. At 64 heads this lost
        // to the plain loop below, whose two head groups per row ptxas already interleaves
        // (docs/indexer-scorer.md).
        unsigned act = 0;  // bit r - run_begin: row r sees the pair
        for (int r = run_begin; r < rb; ++r) {
          const int4 win = swin[r];
          if (j * kPairCols >= win.y || (j + 1) * kPairCols <= win.x) {
            if (lc < ncols) p.out[static_cast<int64_t>(row0 + r) * p.out_stride0 + c_begin + lc] = kKeyMin;
          } else {
            act |= 1u << (r - run_begin);
          }
        }
        auto next_row = [&]() {  // the next row that sees the pair, in order
          const int r = run_begin + __ffs(act) - 1;
          act &= act - 1;
          return r;
        };
        auto mma_row = [&](float (&acc)[kGroup][2][4], int r) {
          mma_group(acc, a, q_lane + r * kHeads * kHeadRowBytes, lm, li);
        };
        auto fold_row = [&](const float (&acc)[kGroup][2][4], int r) {
          float pg[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, ph[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
          fold_group(acc, sw + r * kHeads, 0, t, pg, ph);
          store_row_key(pg, ph, t, lc, ncols, swin[r], sc, base,
                        p.out + static_cast<int64_t>(row0 + r) * p.out_stride0 + c_begin);
        };
        if (act != 0) {
          float acc0[kGroup][2][4], acc1[kGroup][2][4];
          int ra = next_row();
          mma_row(acc0, ra);
#pragma unroll 1
          while (__popc(act) >= 2) {
            const int r1 = next_row();
            mma_row(acc1, r1);
            fold_row(acc0, ra);
            const int r2 = next_row();
            mma_row(acc0, r2);
            fold_row(acc1, r1);
            ra = r2;
          }
          if (act != 0) {
            const int r1 = next_row();
            mma_row(acc1, r1);
            fold_row(acc0, ra);
            fold_row(acc1, r1);
          } else {
            fold_row(acc0, ra);
          }
        }
      } else {
#pragma unroll 1
        for (int r = run_begin; r < rb; ++r) {
          int64_t* out = p.out + static_cast<int64_t>(row0 + r) * p.out_stride0 + c_begin;
          const int4 win = swin[r];  // v0, v1, lo of row r
          if (j * kPairCols >= win.y || (j + 1) * kPairCols <= win.x) {  // the row sees none of it
            if (lc < ncols) out[lc] = kKeyMin;
            continue;
          }
          const uint32_t q_row = q_lane + r * kHeads * kHeadRowBytes;
          const float* wr = sw + r * kHeads;
          float pg[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, ph[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
          for (int n0 = 0; n0 < NT; n0 += kGroup) {
            float acc[kGroup][2][4];
            mma_group(acc, a, q_row + n0 * 8 * kHeadRowBytes, lm, li);
            fold_group(acc, wr, n0, t, pg, ph);
          }
          store_row_key(pg, ph, t, lc, ncols, win, sc, base, out);
        }
      }
    }
  }
}

template <int NT, int kR, bool kPaged>
int resident_blocks(int smem) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, indexer_rows_kernel<NT, kR, kPaged>, kWarps * 32,
                                                    smem) != cudaSuccess ||
      n <= 0) {
    n = 1;
  }
  return n;
}

// Columns per block. A block's prologue (its rows' Q into shared memory, the first K loads)
// costs about 150 columns of its work (measured on the H200: 8 waves of 1,024-column blocks
// against one wave of 8,192-column blocks, 2026-12-02) and overlaps nothing when one block fills
// an SM, so this picks the chunk count per row group that minimises
//   waves x (chunk + kBlockOverheadCols)
// (waves of `resident` blocks; fewer blocks on a tie), in whole rounds of the block's warps
// (each takes kPairCols columns at a time; a multiple of the op's 64-column step).
constexpr int kBlockOverheadCols = 256;

int rows_chunk(int row_groups, int n_cols, int resident, int warps) {
  const int64_t step = warps * kPairCols > kIndexerKeysChunkStep ? warps * kPairCols : kIndexerKeysChunkStep;
  const int64_t groups = row_groups > 0 ? row_groups : 1;
  const int64_t slots = resident > 0 ? resident : 1;
  const int64_t units = (static_cast<int64_t>(n_cols) + step - 1) / step;
  int64_t best_units = units, best_cost = INT64_MAX;
  const int64_t max_n = units < 2 * slots ? units : 2 * slots;
  for (int64_t n = 1; n <= max_n; ++n) {
    const int64_t per = (units + n - 1) / n;       // units per chunk
    const int64_t chunks = (units + per - 1) / per;
    const int64_t waves = (groups * chunks + slots - 1) / slots;
    const int64_t cost = waves * (per * step + kBlockOverheadCols);
    if (cost < best_cost) {
      best_cost = cost;
      best_units = per;
    }
  }
  int64_t chunk = best_units * step;
  const int64_t min_chunk = (static_cast<int64_t>(n_cols) + 65534) / 65535;  // grid.y limit
  if (chunk < min_chunk) chunk = (min_chunk + step - 1) / step * step;
  return static_cast<int>(chunk);
}

template <int NT, int kR, bool kPaged>
void launch_nt(IndexerKeysParams p, const DeviceLimits& lim, cudaStream_t stream) {
  constexpr int smem = smem_bytes<NT, kR, kPaged>();
  auto* kernel = indexer_rows_kernel<NT, kR, kPaged>;
  static const bool opted_in = [&] {  // beyond 48 KB of dynamic shared memory
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess;
  }();
  (void)opted_in;
  if (!kPaged) p.group_rows = kR;
  const int groups = (p.rows + p.group_rows - 1) / p.group_rows;
  if (p.chunk <= 0) {
    // resident blocks per SM: what the registers allow, and the shared memory under the cap
    static const int per_sm = resident_blocks<NT, kR, kPaged>(smem);
    const int fit = lim.max_dynamic_smem / smem;
    p.chunk = rows_chunk(groups, p.n_cols, lim.sm_count * (per_sm < fit ? per_sm : fit), kWarps);
    if (kPaged) {  // at most kIndexerKeysMaxPages - 2 pages per chunk (the page-id table)
      const int64_t cap = static_cast<int64_t>(kIndexerKeysMaxPages - 2) * p.block_size /
                          kIndexerKeysChunkStep * kIndexerKeysChunkStep;
      if (p.chunk > cap) p.chunk = static_cast<int>(cap);
    }
  }
  dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>((p.n_cols + p.chunk - 1) / p.chunk));
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
}

// Rows per block (flat): the most of 8, 4, 2 whose fp16 Q fits the shared-memory cap (8 x 64
// heads: 133 KB, under SM80's 163 KB; SM86's 99 KB takes 4). Paged: the fewest of 2, 4, 8 that
// hold p.group_rows. Eight warps, one block per SM (236 registers at 64 heads). Measurement knob
// $DEEPINFER_INDEXER_ROWS = 2 | 4 | 8 (read once per process): at most that many rows (flat).
// Measured and dropped (2026-12-02, docs/indexer-scorer.md): 4-warp blocks, two per SM
// (prologues overlap, 2-3% behind 8 rows) and 2 rows in 4-warp blocks held to 3 per SM (170
// registers; 64 heads spill).
template <int NT>
void launch_rows(const IndexerKeysParams& p, const DeviceLimits& lim, cudaStream_t stream) {
  if (p.k_codes == nullptr) {
    if (p.group_rows <= 2) return launch_nt<NT, 2, true>(p, lim, stream);
    if (p.group_rows <= 4) return launch_nt<NT, 4, true>(p, lim, stream);
    return launch_nt<NT, 8, true>(p, lim, stream);
  }
  static const int most = knob_int("DEEPINFER_INDEXER_ROWS", 8);
  const int cap = lim.max_dynamic_smem;
  if (most >= 8 && smem_bytes<NT, 8, false>() <= cap) return launch_nt<NT, 8, false>(p, lim, stream);
  if (most >= 4 && smem_bytes<NT, 4, false>() <= cap) return launch_nt<NT, 4, false>(p, lim, stream);
  launch_nt<NT, 2, false>(p, lim, stream);
}

}  // namespace

int indexer_rows_smem(int heads, int group_rows, bool paged) {
  const int r = group_rows <= 2 ? 2 : group_rows <= 4 ? 4 : 8;
  return r * heads * (kHeadRowBytes + 4) + r * 16 + (paged ? 4 * kIndexerKeysMaxPages : 0);
}

bool indexer_rows_fits(int heads, const DeviceLimits& lim, int group_rows) {
  const bool paged = group_rows > 0;
  return (heads == 16 || heads == 32 || heads == 64) && group_rows <= 8 &&
         indexer_rows_smem(heads, paged ? group_rows : 2, paged) <= lim.max_dynamic_smem;
}

void launch_indexer_rows(const IndexerKeysParams& params, const DeviceLimits& lim, cudaStream_t stream) {
  if (params.rows <= 0 || params.n_cols <= 0) return;
  IndexerKeysParams p = params;
  if (p.k_codes == nullptr) p.bs_div = make_fast_div(p.block_size);
  indexer_keys::with_head_tiles(p.heads, [&](auto nt) { launch_rows<decltype(nt)::value>(p, lim, stream); });
}

}  // namespace deepinfer_sm80
