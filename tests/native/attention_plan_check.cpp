// Host-side checks of the sparse MLA launch planning (csrc/attention/plan.h): the
// configurations' shared memory, the shared-memory caps of SM80 (163 KB) and SM86 (99 KB),
// the narrowing of head groups for small decode grids and the split counts.
// Built with nvcc and run by tests/test_attention_plan.py; prints "OK <checks>" or the
// failed checks and exits non-zero.
#include <cstdio>

#include "attention/plan.h"

using namespace deepinfer_sm80::attention;

static int g_checks = 0, g_failed = 0;

#define CHECK(cond)                                                        \
  do {                                                                     \
    ++g_checks;                                                            \
    if (!(cond)) {                                                         \
      ++g_failed;                                                          \
      std::printf("FAILED line %d: %s\n", __LINE__, #cond);                \
    }                                                                      \
  } while (0)

static int heads_of(TileConfigId id) { return plan::info(id, true).heads_per_block; }

static TileConfigId widest(int64_t heads, bool fp8, int cap) {
  TileConfigId id = TileConfigId::kH8;
  if (!plan::widest_config(heads, fp8, cap, &id)) return static_cast<TileConfigId>(-1);
  return id;
}

int main() {
  const int sm80 = kSmemCapSm80, sm86 = kSmemCapSm86;
  // shared memory of each configuration (docs/attention.md table)
  // 64-head prefill: two 32-head groups of 4 warps over shared key stages
  CHECK(plan::info(TileConfigId::kH64, false).smem_bytes == 157952);
  CHECK(plan::info(TileConfigId::kH64, false).heads_per_block == 64);
  CHECK(plan::info(TileConfigId::kH64, false).threads == 256);
  CHECK(plan::info(TileConfigId::kH64, true).smem_bytes == 160256);
  CHECK(plan::info(TileConfigId::kH32, false).smem_bytes == 121984);
  CHECK(plan::info(TileConfigId::kH32, true).smem_bytes == 126592);
  CHECK(plan::info(TileConfigId::kH16, false).smem_bytes == 95936);
  CHECK(plan::info(TileConfigId::kH16, true).smem_bytes == 100544);
  CHECK(plan::info(TileConfigId::kH8, false).smem_bytes == 77280);
  CHECK(plan::info(TileConfigId::kH8, true).smem_bytes == 81888);
  // 8-head tiles keep two resident blocks per A100 SM (164 KB per SM, 1 KB reserved per block)
  CHECK(2 * (plan::info(TileConfigId::kH8, true).smem_bytes + 1024) <= 164 * 1024);
  for (TileConfigId id : {TileConfigId::kH64, TileConfigId::kH32, TileConfigId::kH16, TileConfigId::kH8}) {
    CHECK(plan::info(id, true).threads == 256 && plan::info(id, true).keys_per_tile == 32);
  }
  // widest configuration per cap: SM80 runs 64-head tiles, SM86 at most 16
  CHECK(widest(64, true, sm80) == TileConfigId::kH64);
  CHECK(widest(128, false, sm80) == TileConfigId::kH64);
  CHECK(widest(32, true, sm80) == TileConfigId::kH32);
  CHECK(widest(16, true, sm80) == TileConfigId::kH16);
  CHECK(widest(8, true, sm80) == TileConfigId::kH8);
  CHECK(widest(64, true, sm86) == TileConfigId::kH16);
  CHECK(widest(64, false, sm86) == TileConfigId::kH16);
  CHECK(widest(8, true, sm86) == TileConfigId::kH8);
  CHECK(widest(64, true, 64 * 1024) == static_cast<TileConfigId>(-1));  // nothing fits
  // decode narrowing (640 keys: 20 tiles): batch 1 with 64 heads -> 16-head groups on 108
  // and 132 SMs; a batch whose 64-head grid fills half the SMs keeps 64-head blocks
  CHECK(plan::decode_config(TileConfigId::kH64, 1, 64, 640, 108, true) == TileConfigId::kH16);
  CHECK(plan::decode_config(TileConfigId::kH64, 1, 64, 640, 132, true) == TileConfigId::kH16);
  CHECK(plan::decode_config(TileConfigId::kH64, 4, 64, 640, 108, true) == TileConfigId::kH64);
  CHECK(plan::decode_config(TileConfigId::kH64, 128, 64, 640, 108, true) == TileConfigId::kH64);
  CHECK(plan::decode_config(TileConfigId::kH64, 1, 64, 640, 108, false) == TileConfigId::kH64);
  CHECK(plan::decode_config(TileConfigId::kH8, 1, 8, 640, 108, true) == TileConfigId::kH8);
  CHECK(plan::decode_config(TileConfigId::kH16, 1, 64, 640, 84, true) == TileConfigId::kH16);
  CHECK(heads_of(plan::decode_config(TileConfigId::kH64, 1, 128, 640, 108, true)) == 32);
  // split counts: one tile per split for a lone token, one split for a full batch
  const LaunchInfo h16 = plan::info(TileConfigId::kH16, true);
  const LaunchInfo h64 = plan::info(TileConfigId::kH64, true);
  const LaunchInfo h8 = plan::info(TileConfigId::kH8, true);
  CHECK(plan::decode_splits(1, 4, 640, h16, 108, sm80) == 20);
  CHECK(plan::decode_splits(1, 1, 640, h8, 108, sm80) == 20);
  CHECK(plan::decode_splits(128, 1, 640, h64, 132, sm80) == 1);  // 128 blocks: one wave
  // 128 tokens on 108 SMs: 2 waves of 20 tiles (cost 44) lose to 4 splits of 5 tiles in 5
  // waves (cost 5 x 7 + 1 = 36)
  CHECK(plan::decode_splits(128, 1, 640, h64, 108, sm80) == 4);
  CHECK(plan::decode_splits(1, 1, 32, h8, 108, sm80) == 1);   // one tile: nothing to split
  CHECK(plan::decode_splits(0, 1, 640, h8, 108, sm80) == 1);
  const int s32 = plan::decode_splits(32, 1, 640, h64, 108, sm80);
  CHECK(s32 >= 2 && s32 <= 4);  // 32 tokens on 108 SMs: a few splits, one wave
  CHECK(plan::decode_splits(1, 1, 100000, h8, 108, sm80) <= plan::kMaxSplits);
  // prefill tail: the tokens of the last partial wave run split (4,096 tokens of 64 heads on
  // 132 SMs: 31 full waves + 4 tokens, those as 20 one-tile splits)
  const LaunchInfo p64 = plan::info(TileConfigId::kH64, false);
  const LaunchInfo p8 = plan::info(TileConfigId::kH8, false);
  CHECK(plan::resident_blocks(p64, sm80) == 1 && plan::resident_blocks(p8, sm80) == 2);
  plan::PrefillTail pt = plan::prefill_tail(4096, 1, 640, p64, 132, sm80);
  CHECK(pt.tokens == 4 && pt.splits == 20);
  pt = plan::prefill_tail(4092, 1, 640, p64, 132, sm80);  // whole waves: nothing to split
  CHECK(pt.tokens == 0 && pt.splits == 1);
  // 108 SMs: 37 waves + 100 tokens; two splits each would need two more waves
  pt = plan::prefill_tail(4096, 1, 640, p64, 108, sm80);
  CHECK(pt.tokens == 0 && pt.splits == 1);
  pt = plan::prefill_tail(40, 1, 640, p64, 16, sm80);  // 2 waves + 8 tokens: 2 splits, one wave
  CHECK(pt.tokens == 8 && pt.splits == 2);
  pt = plan::prefill_tail(4096, 2, 640, p64, 132, sm80);  // 128 heads: 8 blocks of 4 tokens over
  CHECK(pt.tokens == 4 && pt.splits == 10);               // 80 of the 132 SMs, 2 tiles each
  // 8 heads: 2 blocks per SM, never split (a partial last wave runs one block per SM)
  pt = plan::prefill_tail(4096, 1, 640, p8, 132, sm80);
  CHECK(pt.tokens == 0 && pt.splits == 1);
  pt = plan::prefill_tail(40, 1, 640, p8, 16, sm80);
  CHECK(pt.tokens == 0 && pt.splits == 1);
  // the SM86 cap: 16-head tiles (95,936 B) fill an SM
  const LaunchInfo p16 = plan::info(TileConfigId::kH16, false);
  CHECK(plan::resident_blocks(p16, sm86) == 1);
  pt = plan::prefill_tail(40, 4, 640, p16, 16, sm86);  // 160 blocks = 10 waves: nothing left
  CHECK(pt.tokens == 0 && pt.splits == 1);
  pt = plan::prefill_tail(41, 4, 640, p16, 16, sm86);  // 164 blocks: 1 token's 4 groups left
  CHECK(pt.tokens == 1 && pt.splits > 1);
  pt = plan::prefill_tail(3, 1, 640, p64, 132, sm80);  // few tokens: split to fill the GPU
  CHECK(pt.tokens == 3 && pt.splits > 1);
  pt = plan::prefill_tail(0, 1, 640, p64, 132, sm80);
  CHECK(pt.tokens == 0 && pt.splits == 1);
  pt = plan::prefill_tail(5, 1, 32, p64, 132, sm80);  // one tile: nothing to split
  CHECK(pt.tokens == 0 && pt.splits == 1);
  // key tiles of a list: at least one
  CHECK(plan::tiles(640, p64) == 20);
  CHECK(plan::tiles(33, p64) == 2);
  CHECK(plan::tiles(0, p64) == 1);
  // keys per split: whole tiles, equal for every split
  CHECK(plan::keys_per_split(640, 20, p64) == 32);  // the H200 tail: one tile each
  CHECK(plan::keys_per_split(640, 10, p64) == 64);
  CHECK(plan::keys_per_split(640, 3, p64) == 224);  // 20 tiles: 7 + 7 + 6
  CHECK(plan::keys_per_split(640, 1, p64) == 640);
  CHECK(plan::keys_per_split(0, 1, p64) == 32);     // an empty list still gets one tile
  if (g_failed) {
    std::printf("%d of %d checks failed\n", g_failed, g_checks);
    return 1;
  }
  std::printf("OK %d\n", g_checks);
  return 0;
}
