// SPDX-License-Identifier: Apache-2.0
// Decode: keys read from the FP8 fp8_ds_mla paged caches (window list + compressed list),
// dequantised exactly inside the block.
#include <cstdlib>

#include "../launch_impl.cuh"

namespace deepinfer_sm80::attention {

// Configurations whose score warps read the raw records and write the PV tile themselves
// (kRawScores, detail/raw_scores.cuh), as a bit mask over TileConfigId (bit 0 kH64 .. bit 3
// kH8), used for blocks of two or more key tiles. Same-run A/B on the H200 (docs/attention.md,
// 2026-11-30 03:21 UTC, 640 keys per token, base = the in-block dequantisation): batch 128,
// 8 heads 34.5 -> 30.9 us, 32 heads 51.6 -> 48.4; 16-head blocks (forced) batch 128 x 64
// heads 159.8 -> 153.0, batch 32 43.6 -> 40.1. Not used: 64 heads (64.0 -> 67.1 us; its
// score warps hold 128 O^T registers, so no conversion tile wider than 16 keys fits) and
// one-tile blocks (batch 1 with 8 heads 7.41 -> 8.6 us: nothing to overlap). The
// $DEEPINFER_ATTN_RAW_SCORES=MASK knob (benchmarks, tests) forces the raw path for the
// configurations in MASK and the in-block one for the others, for any block size.
constexpr unsigned kRawScoresDefault = (1u << static_cast<int>(TileConfigId::kH32)) |
                                       (1u << static_cast<int>(TileConfigId::kH16)) |
                                       (1u << static_cast<int>(TileConfigId::kH8));

struct RawScoresKnob {
  bool forced;
  unsigned mask;
};

static RawScoresKnob raw_scores_knob() {
  static const RawScoresKnob v = [] {
    const char* e = std::getenv("DEEPINFER_ATTN_RAW_SCORES");
    if (e == nullptr || *e == 0) return RawScoresKnob{false, kRawScoresDefault};
    return RawScoresKnob{true, static_cast<unsigned>(std::strtoul(e, nullptr, 0))};
  }();
  return v;
}

// Keys one block may see: its split's share, or both lists' capacity.
static int block_key_capacity(const SparseMlaParams& p) {
  if (p.num_splits > 1) return p.keys_per_split;
  return p.src[0].topk + (p.num_sources > 1 ? p.src[1].topk : 0);
}

template <class Cfg, class RawCfg = Cfg>
static cudaError_t launch_fp8(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream) {
  static_assert(Cfg::template Layout<true>::total == RawCfg::template Layout<true>::total, "same layout");
  const RawScoresKnob k = raw_scores_knob();
  if ((k.mask & (1u << static_cast<int>(id))) && (k.forced || block_key_capacity(p) > Cfg::BK))
    return launch_cfg<RawCfg, true, 1, true>(p, stream);
  return launch_cfg<Cfg, true>(p, stream);
}

cudaError_t launch_decode(const SparseMlaParams& p, TileConfigId id, cudaStream_t stream) {
  switch (id) {
    case TileConfigId::kH64: return launch_fp8<CfgH64, CfgH64Raw>(p, id, stream);
    case TileConfigId::kH32: return launch_fp8<CfgH32>(p, id, stream);
    case TileConfigId::kH16: return launch_fp8<CfgH16>(p, id, stream);
    case TileConfigId::kH8: return launch_fp8<CfgH8>(p, id, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace deepinfer_sm80::attention
