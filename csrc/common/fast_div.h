// Floor division of non-negative int32 values by a divisor fixed for a launch: the host
// computes a multiplier once, the device divides with one multiply-high and one shift
// instead of the ~20-instruction dependent chain of a run-time integer division.
//
// Method (Granlund-Montgomery, "round up"): for d >= 2 let l = ceil(log2 d) and
// m = ceil(2^(31+l) / d). Then 0 < m*d - 2^(31+l) < d <= 2^l, so for every 0 <= n < 2^31
//   floor(n * m / 2^(31+l)) = floor(n / d),
// and m < 2^32 (d > 2^(l-1) unless d is a power of two, where m = 2^31 exactly), so
// n * m >> (31 + l) = umulhi(n, m) >> (l - 1). d = 1 returns n. Negative n are not covered:
// callers keep the C division for them. Checked exhaustively for several divisors and over
// every divisor up to 4096 on edge ranges: tests/native/fast_div_check.cpp.
#pragma once

#include <cstdint>

namespace deepinfer_sm80 {

struct FastDivU31 {
  uint32_t mul = 0;    // m (unused for d = 1)
  uint32_t shift = 0;  // l - 1
  int32_t d = 1;
};

// Host: the multiplier for divisor d >= 1.
inline FastDivU31 make_fast_div(int32_t d) {
  FastDivU31 f;
  f.d = d;
  if (d <= 1) return f;
  uint32_t l = 0;
  while ((uint64_t{1} << l) < static_cast<uint64_t>(d)) ++l;  // ceil(log2 d), 1..31
  const uint64_t num = uint64_t{1} << (31 + l);
  f.mul = static_cast<uint32_t>((num + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
  f.shift = l - 1;
  return f;
}

// floor(n / f.d) for 0 <= n < 2^31.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int32_t fast_div(int32_t n, const FastDivU31& f) {
#if defined(__CUDA_ARCH__)
  const uint32_t hi = __umulhi(static_cast<uint32_t>(n), f.mul);
#else
  const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * f.mul) >> 32);
#endif
  return f.d == 1 ? n : static_cast<int32_t>(hi >> f.shift);
}

}  // namespace deepinfer_sm80
