// Host check of csrc/common/fast_div.h against the C division (tests/test_fast_div.py).
//   exhaustive: every n in [0, 2^31) for a few divisors (the compress ratios 4 and 128 among
//               them, a non-power of two, the largest int32);
//   edges:      every divisor 1..4096 with n in [0, 2^16) and the top 2^16 values below 2^31,
//               and n = k*d - 1, k*d, k*d + 1 around multiples;
//   random:     random (d, n) pairs over the whole range.
// Prints "OK <cases>" or the first mismatch and exits 1.
#include <cstdint>
#include <cstdio>
#include <random>

#include "common/fast_div.h"

using deepinfer_sm80::fast_div;
using deepinfer_sm80::make_fast_div;

static long long cases = 0;

static bool check(int32_t n, int32_t d, const deepinfer_sm80::FastDivU31& f) {
  ++cases;
  const int32_t want = n / d;
  const int32_t got = fast_div(n, f);
  if (got != want) {
    std::printf("MISMATCH n=%d d=%d got=%d want=%d\n", n, d, got, want);
    return false;
  }
  return true;
}

int main() {
  // Exhaustive part: q = fast_div(n) must be the one q with 0 <= n - q*d < d (the definition
  // of floor division, without a division: the loop vectorises), checked in blocks of 2^20
  // without an early exit; a failing block is re-run against the C division to name the n.
  const int32_t exhaustive[] = {2, 3, 4, 7, 128, 2147483647};
  for (int32_t d : exhaustive) {
    const auto f = make_fast_div(d);
    const int64_t dd = d;
    for (int64_t base = 0; base <= 2147483647LL; base += int64_t{1} << 20) {
      uint32_t bad = 0;
      for (int32_t i = 0; i < (1 << 20); ++i) {
        const int32_t n = static_cast<int32_t>(base + i);
        const int64_t r = static_cast<int64_t>(n) - static_cast<int64_t>(fast_div(n, f)) * dd;
        bad |= static_cast<uint32_t>(r < 0) | static_cast<uint32_t>(r >= dd);
      }
      if (bad) {
        for (int32_t i = 0; i < (1 << 20); ++i)
          if (!check(static_cast<int32_t>(base + i), d, f)) return 1;
        std::printf("MISMATCH in the block from n=%lld, d=%d, not found again\n",
                    static_cast<long long>(base), d);
        return 1;
      }
    }
    cases += 2147483648LL;
  }
  for (int32_t d = 1; d <= 4096; ++d) {
    const auto f = make_fast_div(d);
    for (int32_t n = 0; n < 65536; ++n)
      if (!check(n, d, f)) return 1;
    for (int64_t n = 2147483647LL - 65535; n <= 2147483647LL; ++n)
      if (!check(static_cast<int32_t>(n), d, f)) return 1;
    for (int64_t k = 1; k * d <= 2147483647LL; k = k * 3 + 1) {
      for (int64_t e = -1; e <= 1; ++e) {
        const int64_t n = k * d + e;
        if (n >= 0 && n <= 2147483647LL && !check(static_cast<int32_t>(n), d, f)) return 1;
      }
    }
  }
  std::mt19937_64 rng(20261130);
  for (int i = 0; i < 20000000; ++i) {
    const int32_t d = static_cast<int32_t>(rng() % 2147483647ULL) + 1;
    const int32_t n = static_cast<int32_t>(rng() & 0x7FFFFFFFULL);
    if (!check(n, d, make_fast_div(d))) return 1;
  }
  std::printf("OK %lld\n", cases);
  return 0;
}
