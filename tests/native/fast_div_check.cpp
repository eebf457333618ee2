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
  const int32_t exhaustive[] = {2, 3, 4, 7, 128, 2147483647};
  for (int32_t d : exhaustive) {
    const auto f = make_fast_div(d);
    for (int64_t n = 0; n <= 2147483647LL; ++n) {
      // inline fast path for speed; the checked function is the same expression
      if (fast_div(static_cast<int32_t>(n), f) != static_cast<int32_t>(n / d)) {
        std::printf("MISMATCH n=%lld d=%d\n", static_cast<long long>(n), d);
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
