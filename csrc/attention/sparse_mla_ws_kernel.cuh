// SPDX-License-Identifier: Apache-2.0
// Warp-specialised 64-head sparse MLA prefill (bf16 keys, one block = one token x 64 heads,
// whole key list; WsPrefillCfg in ws_config.h).
//
//   score warps 0..3: warp w owns heads (w & 1) * 32 .. +31 over head dims (w >> 1) * 256
//     .. +255, with those Q values in registers as m16n8k16 B fragments (128 registers);
//     per tile: S^T = K Q^T in two passes of 16 keys (ldmatrix of K only), stored (times
//     scale * log2 e; -inf for invalid keys) into score buffer j % 2, one slice per dim
//     half. They also copy the key tiles, two ahead (4 threads per 1 KB row), after their
//     score MMA, in time they would otherwise wait for the PV warps.
//   PV warps 4..11: the online softmax over the two slices (4 threads per head), P (bf16),
//     the rescale of O^T and O^T += V^T P^T (warp p: head dims 64p .. 64p+63, all 64 heads).
//
// The score warps work one tile ahead of the PV warps (three key stages, two score buffers,
// two P buffers), so the score MMA of tile j+1 runs next to the PV MMA of tile j. Named
// barriers, producer arrive / consumer sync:
//   kBarScFull + b    scores b written (and their key tile visible)
//                                       score warps arrive, PV warps sync          (384)
//   kBarScEmpty + b   scores b consumed PV warps arrive, score warps sync          (384)
//   kBarKvEmpty + s   stage s free      PV warps arrive after their PV MMA, score warps
//                                       sync before copying the next tile into it  (384)
//   kBarPv            the PV warps among themselves (P / alpha written)            (256)
//   kBarScore         the score warps among themselves (a tile's copies landed)    (128)
#pragma once

#include <cstdint>
#include <cstdio>
#include <cuda_bf16.h>

#include "detail/sm80_ptx.cuh"
#include "params.h"
#include "ws_config.h"

namespace deepinfer_sm80::attention {

// Register budget (384 threads: at most 168 per thread). Score warps: one accumulator set
// (WS_CH = 2, even / odd k-steps, spills 84 bytes); PV warps: two head-dim m-tiles of V^T
// fragments at a time (WS_PV_DH = 4 spills the softmax sums). ptxas sm_80: 0 spills.
#ifndef WS_PV_DH
#define WS_PV_DH 2
#endif
#ifndef WS_CH
#define WS_CH 1
#endif
// Measurement build only (-DDEEPINFER_ATTN_PHASE_CLOCKS, bench/phase_clocks.py): warp 0 (a
// score warp) and warp 4 (a PV warp) of a few blocks add up clock64() deltas per phase and
// print them with the keys of the two-group kernel's line. Score warp: wait = key stage
// landed, deq = score buffer free, score = the MMAs and the score stores. PV warp: wait =
// its copies landed, deq = scores ready, score = softmax, bar1 = the PV warps' barrier,
// softmax = the next copies' issue, bar2 = rescale, pv = the PV MMA.
#ifdef DEEPINFER_ATTN_PHASE_CLOCKS
#define WS_MARK(k)                                     \
  do {                                                 \
    const unsigned now_ = static_cast<unsigned>(clock());  \
    ph_cyc[k] += now_ - ph_t;                          \
    ph_t = now_;                                       \
  } while (0)
#else
#define WS_MARK(k) \
  do {             \
  } while (0)
#endif

namespace ws {
constexpr int kBarKvEmpty = 1;  // + stage (3)
constexpr int kBarScFull = 4;   // + score buffer (2)
constexpr int kBarScEmpty = 6;  // + score buffer (2)
constexpr int kBarPv = 8;
constexpr int kBarScore = 9;

__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * 1024 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint32_t ldg_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ int list_len(const KeySource& s, int tok) {
  if (s.indices == nullptr) return 0;
  if (s.lens == nullptr) return s.topk;
  int n = s.lens[tok];
  return n < 0 ? 0 : (n > s.topk ? s.topk : n);
}
}  // namespace ws

__global__ void __launch_bounds__(WsPrefillCfg::NTHREADS, 1) sparse_mla_ws_prefill_kernel(const SparseMlaParams p) {
  using C = WsPrefillCfg;
  using L = WsPrefillCfg::Layout;
  constexpr int HG = C::HG, BK = C::BK, STAGES = C::STAGES;
  constexpr int NALL = C::NTHREADS, NPV = C::P_THREADS;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2 = 0.6931471805599453f;

  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s_base = ptx::smem_u32(smem);
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int mi = lane >> 3, r7 = lane & 7;

  const int groups = (p.num_heads + HG - 1) / HG;
  const int hgi = blockIdx.x % groups;
  const int tok = blockIdx.x / groups;
  const int head0 = hgi * HG;
  const int len0 = ws::list_len(p.src[0], tok);
  const int len1 = p.num_sources > 1 ? ws::list_len(p.src[1], tok) : 0;
  const int n_keys = len0 + len1;
  const int num_tiles = (n_keys + BK - 1) / BK;

#ifdef DEEPINFER_ATTN_PHASE_CLOCKS
  unsigned ph_cyc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 32-bit: fewer registers than clock64
  const long long ph_start = clock64();
  unsigned ph_t = static_cast<unsigned>(ph_start);
  unsigned long long ph_ns0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ph_ns0));
  auto ph_print = [&](long long epi0) {
    if (lane == 0 && (warp == 0 || warp == C::S_WARPS) && blockIdx.x % 997 == 5) {
      const long long now = clock64();
      unsigned long long ph_ns1;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ph_ns1));
      printf("PHASE HG=64 fp8=0 ws=1 blk=%d grp=0 warp=%d tiles=%d total=%lld ns=%lld pro=%lld wait=%lld "
             "deq=%lld score=%lld bar1=%lld softmax=%lld bar2=%lld pv=%lld epi=%lld\n",
             blockIdx.x, warp, num_tiles, now - ph_start, static_cast<long long>(ph_ns1 - ph_ns0), (long long)ph_cyc[7],
             (long long)ph_cyc[0], (long long)ph_cyc[1], (long long)ph_cyc[2], (long long)ph_cyc[3],
             (long long)ph_cyc[4], (long long)ph_cyc[5], (long long)ph_cyc[6], now - epi0);
    }
  };
#endif
  float* s_scores = reinterpret_cast<float*>(smem + L::scores);
  int* s_valid = reinterpret_cast<int*>(smem + L::valid);
  float* s_alpha = reinterpret_cast<float*>(smem + L::alpha);

  if (warp < C::S_WARPS) {
    // ======================= score warps =======================
    const int stid = threadIdx.x;  // 0..127
    // loader: 4 threads per key row, 16 of its 64 chunks each (chunks lq + 4i)
    const int lr = stid >> 2, lq = stid & 3;
    int nidx = -1;  // index of this thread's row of the next tile to issue
    auto fetch_row = [&](int j) {
      const int k = j * BK + lr;
      int idx = -1;
      if (k < n_keys) {
        const bool second = k >= len0;
        const int32_t* ind = second ? p.src[1].indices : p.src[0].indices;
        const int64_t istride = second ? p.src[1].indices_stride : p.src[0].indices_stride;
        idx = ind[tok * istride + (second ? k - len0 : k)];
      }
      nidx = idx;
    };
    auto issue_tile = [&](int j) {
      const int st = j % STAGES;
      const bool second = j * BK + lr >= len0;
      const uint8_t* base = second ? p.src[1].base : p.src[0].base;
      const int64_t rows = second ? p.src[1].num_rows : p.src[0].num_rows;
      const int64_t rstride = second ? p.src[1].row_stride : p.src[0].row_stride;
      const bool ok = nidx >= 0 && nidx < rows;
      const uint8_t* row = base + static_cast<int64_t>(ok ? nidx : 0) * rstride + lq * 16;
      const uint8_t* zero_src = p.src[0].base;  // never read: zero-fill copies
      // chunk c = lq + 4i lands at (c ^ (lr & 7)) = 8 (i >> 1) + ((lq + 4 (i & 1)) ^ (lr & 7))
      const uint32_t dst = s_base + L::kv + st * C::kTileBytes + lr * 1024;
      const uint32_t d0 = dst + ((lq ^ (lr & 7)) << 4), d1 = dst + (((lq + 4) ^ (lr & 7)) << 4);
#pragma unroll
      for (int i = 0; i < 16; ++i)
        ptx::cp_async_16(((i & 1) ? d1 : d0) + (i >> 1) * 128, ok ? row + i * 64 : zero_src, ok ? 16 : 0);
      if (lq == 0) s_valid[st * BK + lr] = ok;
    };
    if (num_tiles > 0) {
      fetch_row(0);
      issue_tile(0);
    }
    ptx::cp_async_commit();
    if (num_tiles > 1) {
      fetch_row(1);
      issue_tile(1);
    }
    ptx::cp_async_commit();
    if (num_tiles > 2) fetch_row(2);

    const int hh = warp & 1, ksl = warp >> 1;
    // Q^T as B fragments: qf[ks][n] = {Q[h][d0 + 2t, +1], Q[h][d0 + 8 + 2t, +1]} with
    // h = head0 + hh*32 + n*8 + g and d0 = ksl*256 + ks*16 (zero past the head count)
    uint32_t qf[16][4][2];
    {
      const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q) + static_cast<int64_t>(tok) * p.q_stride_tok;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int h = head0 + hh * 32 + n * 8 + g;
        const bool ok = h < p.num_heads;
        const __nv_bfloat16* qr = q + static_cast<int64_t>(ok ? h : 0) * p.q_stride_head + ksl * 256 + 2 * t;
#pragma unroll
        for (int ks = 0; ks < 16; ++ks) {
          qf[ks][n][0] = ok ? ws::ldg_u32(qr + ks * 16) : 0u;
          qf[ks][n][1] = ok ? ws::ldg_u32(qr + ks * 16 + 8) : 0u;
        }
      }
    }
    // ldmatrix rows have (row & 7) == r7: the swizzled chunk of k-step ks (16 dims) of this
    // slice is ksl*32 + (ks >> 2)*8 + ((2*(ks & 3) + (mi >> 1)) ^ r7)
    uint32_t a_off[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      a_off[u] = ((mi & 1) * 8 + r7) * 1024 + ksl * 512 + ((((2 * u) + (mi >> 1)) ^ r7) << 4);
    const float sl = p.scale_log2;
    WS_MARK(7);
    for (int j = 0; j < num_tiles; ++j) {
      const int st = j % STAGES, sb = j & 1;
      // tile j landed: this thread's copies, then every score thread's (the PV warps see the
      // tile through kBarScFull below)
      if (j + 1 < num_tiles) {
        ptx::cp_async_wait<1>();
      } else {
        ptx::cp_async_wait<0>();
      }
      ptx::bar_sync(ws::kBarScore, C::S_WARPS * 32);
      WS_MARK(0);
      if (j >= 2) ptx::bar_sync(ws::kBarScEmpty + sb, NALL);
      WS_MARK(1);
      const uint32_t kt = s_base + L::kv + st * C::kTileBytes;
      float* sbuf = s_scores + (sb * C::KSPLIT + ksl) * BK * C::S_STRIDE;
      const int* valid = s_valid + st * BK;
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        float acc[WS_CH][4][4];  // WS_CH == 2: even / odd k-steps, 8 independent accumulators
#pragma unroll
        for (int c = 0; c < WS_CH; ++c)
#pragma unroll
          for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[c][n][e] = 0.f;
        const uint32_t kp = kt + pass * 16 * 1024;
#pragma unroll
        for (int ks = 0; ks < 16; ++ks) {
          uint32_t af[4];
          ptx::ldmatrix_x4(kp + a_off[ks & 3] + (ks >> 2) * 128, af[0], af[1], af[2], af[3]);
#pragma unroll
          for (int n = 0; n < 4; ++n) ptx::mma_bf16_16816(acc[(ks & 1) % WS_CH][n], af, qf[ks][n][0], qf[ks][n][1]);
        }
        // scores times scale * log2 e; an invalid key's are -inf in the first slice (the
        // softmax adds the slices)
        const int row = pass * 16 + g;
        const float sc0 = (ksl == 0 && !valid[row]) ? -INFINITY : sl;
        const float sc1 = (ksl == 0 && !valid[row + 8]) ? -INFINITY : sl;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int col = hh * 32 + n * 8 + 2 * t;
          float v[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) v[e] = acc[0][n][e] + (WS_CH > 1 ? acc[WS_CH - 1][n][e] : 0.f);
          // -inf * 0 would be NaN: an invalid key is a zero-filled row, so its sums are 0
          *reinterpret_cast<float2*>(sbuf + row * C::S_STRIDE + col) =
              sc0 == -INFINITY ? make_float2(-INFINITY, -INFINITY) : make_float2(v[0] * sc0, v[1] * sc0);
          *reinterpret_cast<float2*>(sbuf + (row + 8) * C::S_STRIDE + col) =
              sc1 == -INFINITY ? make_float2(-INFINITY, -INFINITY) : make_float2(v[2] * sc1, v[3] * sc1);
        }
      }
      ptx::bar_arrive(ws::kBarScFull + sb, NALL);
      WS_MARK(2);
      // stage (j+2)%3 held tile j-1: wait for the PV warps to leave it, then copy tile j+2
      if (j + 2 < num_tiles) {
        if (j >= 1) ptx::bar_sync(ws::kBarKvEmpty + (j + 2) % STAGES, NALL);
        WS_MARK(3);
        issue_tile(j + 2);
        if (j + 3 < num_tiles) fetch_row(j + 3);
      }
      ptx::cp_async_commit();
      WS_MARK(4);
    }
#ifdef DEEPINFER_ATTN_PHASE_CLOCKS
    ph_print(clock64());
#endif
    return;
  }

  // ======================= PV warps =======================
  const int pw = warp - C::S_WARPS;  // 0..7: head dims 64pw .. 64pw+63
  const int ptid = threadIdx.x - C::S_WARPS * 32;

  float acc[4][8][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 8; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;

  const int sm_head = ptid / C::TPH, sm_part = ptid % C::TPH;
  float m_run = -INFINITY, l_run = 0.f, lx_run = 0.f;
  // V^T fragments: ldmatrix.trans of the key tile, row kk*16 + (mi>>1)*8 + r7, chunk
  // pw*8 + 2*dm + (mi&1)
  uint32_t v_off[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) v_off[u] = ((mi >> 1) * 8 + r7) * 1024 + pw * 128 + ((((2 * u) + (mi & 1)) ^ r7) << 4);

  WS_MARK(7);
  for (int j = 0; j < num_tiles; ++j) {
    const int st = j % STAGES, sb = j & 1;
    WS_MARK(0);
    ptx::bar_sync(ws::kBarScFull + sb, NALL);
    WS_MARK(1);
    // ---- online softmax: 4 threads per head, 8 keys each; a key's score is the sum of the
    // two slices (-inf for invalid keys)
    {
      const float* sc = s_scores + sb * C::KSPLIT * BK * C::S_STRIDE;
      constexpr int RPT = BK / C::TPH;
      float sv[RPT];
      float mx = -INFINITY;
#pragma unroll
      for (int q = 0; q < RPT; ++q) {
        const int r = sm_part + q * C::TPH;
        sv[q] = sc[r * C::S_STRIDE + sm_head] + sc[(BK + r) * C::S_STRIDE + sm_head];
        mx = fmaxf(mx, sv[q]);
      }
      if (j + 2 < num_tiles) ptx::bar_arrive(ws::kBarScEmpty + sb, NALL);
#pragma unroll
      for (int o = C::TPH / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_run, mx);
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      __nv_bfloat16* probs = reinterpret_cast<__nv_bfloat16*>(smem + L::probs) + (sb * HG + sm_head) * C::P_STRIDE;
      float sum = 0.f, sum_x = 0.f;
#pragma unroll
      for (int q = 0; q < RPT; ++q) {
        const int r = sm_part + q * C::TPH;
        const float pr = ptx::ex2(sv[q] - m_ref);
        const __nv_bfloat16 pb = __float2bfloat16_rn(pr);
        probs[r] = pb;
        sum += __bfloat162float(pb);
        sum_x += pr;
      }
#pragma unroll
      for (int o = C::TPH / 2; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
        sum_x += __shfl_xor_sync(0xffffffffu, sum_x, o);
      }
      const float alpha = (m_run == m_new) ? 1.f : ptx::ex2(m_run - m_ref);
      l_run = l_run * alpha + sum;
      lx_run = lx_run * alpha + sum_x;
      m_run = m_new;
      if (sm_part == 0) s_alpha[sb * HG + sm_head] = alpha;
    }
    WS_MARK(2);
    ptx::bar_sync(ws::kBarPv, NPV);
    WS_MARK(3);
    // ---- rescale (per group of 8 heads, skipped when no running max moved) and
    // O^T += V^T P^T
    {
      const float* al = s_alpha + sb * HG;
#pragma unroll
      for (int hn = 0; hn < 8; ++hn) {
        const float2 a2 = *reinterpret_cast<const float2*>(al + hn * 8 + 2 * t);
        if (__any_sync(0xffffffffu, (a2.x != 1.f) | (a2.y != 1.f))) {
#pragma unroll
          for (int dm = 0; dm < 4; ++dm) {
            acc[dm][hn][0] *= a2.x;
            acc[dm][hn][1] *= a2.y;
            acc[dm][hn][2] *= a2.x;
            acc[dm][hn][3] *= a2.y;
          }
        }
      }
      WS_MARK(5);
      const uint32_t kt = s_base + L::kv + st * C::kTileBytes;
      const uint32_t p_base = s_base + L::probs + sb * HG * C::P_STRIDE * 2;
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        // WS_PV_DH head-dim m-tiles per pass: the A fragments of a pass stay in registers
        // while the P fragments stream (loaded 4 / WS_PV_DH times per k-step)
#pragma unroll
        for (int d0 = 0; d0 < 4; d0 += WS_PV_DH) {
          uint32_t af[WS_PV_DH][4];
#pragma unroll
          for (int dd = 0; dd < WS_PV_DH; ++dd)
            ptx::ldmatrix_x4_trans(kt + v_off[d0 + dd] + kk * 16 * 1024, af[dd][0], af[dd][1], af[dd][2], af[dd][3]);
#pragma unroll
          for (int hn = 0; hn < 8; hn += 2) {
            const int row = (hn + (mi >> 1)) * 8 + r7;
            uint32_t b0, b1, b2, b3;
            ptx::ldmatrix_x4(p_base + (row * C::P_STRIDE + kk * 16 + (mi & 1) * 8) * 2, b0, b1, b2, b3);
#pragma unroll
            for (int dd = 0; dd < WS_PV_DH; ++dd) {
              ptx::mma_bf16_16816(acc[d0 + dd][hn], af[dd], b0, b1);
              ptx::mma_bf16_16816(acc[d0 + dd][hn + 1], af[dd], b2, b3);
            }
          }
        }
      }
    }
    // this warp is done with stage st: the score warps may refill it with tile j+3
    if (j + 3 < num_tiles) ptx::bar_arrive(ws::kBarKvEmpty + st, NALL);
    WS_MARK(6);
  }
#ifdef DEEPINFER_ATTN_PHASE_CLOCKS
  const long long ph_epi0 = clock64();
#endif

  // ---- epilogue (PV warps only): out = O / (l + 2^(sink*log2e - m)), staged as bf16 rows
  // [head][dim] in the key stages (free: every copy has landed and the score warps are done).
  // The normaliser once per head, by the head's first softmax thread (s_l holds it).
  float* s_l = reinterpret_cast<float*>(smem + L::stat_l);
  if (sm_part == 0) {
    const int h = head0 + sm_head;
    float den = l_run;
    if (p.sink != nullptr && h < p.num_heads) den += exp2f(p.sink[h] * kLog2e - m_run);
    s_l[sm_head] = l_run > 0.f ? 1.f / den : 0.f;
  }
  ptx::bar_sync(ws::kBarPv, NPV);
  uint8_t* stage = smem + L::kv;
#pragma unroll
  for (int hn = 0; hn < 8; ++hn) {
    const float2 inv2 = *reinterpret_cast<const float2*>(s_l + hn * 8 + 2 * t);
    const float inv[2] = {inv2.x, inv2.y};
#pragma unroll
    for (int dm = 0; dm < 4; ++dm) {
      const int d = pw * 64 + dm * 16 + g;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hl = hn * 8 + 2 * t + (e & 1);
        const int dd = d + (e >> 1) * 8;
        *reinterpret_cast<__nv_bfloat16*>(stage + ws::swz(hl, dd >> 3) + (dd & 7) * 2) =
            __float2bfloat16_rn(acc[dm][hn][e] * inv[e & 1]);
      }
    }
  }
  ptx::bar_sync(ws::kBarPv, NPV);
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + static_cast<int64_t>(tok) * p.out_stride_tok;
  for (int i = ptid; i < HG * 64; i += NPV) {
    const int r = i >> 6, c = i & 63, h = head0 + r;
    if (h < p.num_heads)
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(h) * p.out_stride_head + c * 8) =
          *reinterpret_cast<const uint4*>(stage + ws::swz(r, c));
  }
  if (sm_part == 0 && head0 + sm_head < p.num_heads) {
    const int h = head0 + sm_head;
    if (p.lse != nullptr)
      p.lse[tok * p.lse_stride_tok + h * p.lse_stride_head] = l_run > 0.f ? (m_run + log2f(lx_run)) * kLn2 : INFINITY;
    if (p.max_logits != nullptr)
      p.max_logits[tok * p.ml_stride_tok + h * p.ml_stride_head] = l_run > 0.f ? m_run * kLn2 : -INFINITY;
  }
#ifdef DEEPINFER_ATTN_PHASE_CLOCKS
  ph_print(ph_epi0);
#endif
}

}  // namespace deepinfer_sm80::attention
