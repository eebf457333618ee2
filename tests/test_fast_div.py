"""Host check of the launch-time fast division (csrc/common/fast_div.h) that the index combine
kernel uses for `(pos + 1) / compress_ratio`: compiled with nvcc and run on the CPU
(tests/native/fast_div_check.cpp): every non-negative int32 for six divisors against floor
division's definition (0 <= n - q*d < d); every divisor up to 4096 on edge ranges, and random
pairs, against the C division."""

from __future__ import annotations

import pytest

from deepinfer.build import find_nvcc
from native_check import run_native_check

NVCC = find_nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (the check compiles csrc/common/fast_div.h)")
def test_fast_div_matches_c_division(tmp_path):
    # built for this CPU (it runs where it is built): the exhaustive loop vectorises
    assert run_native_check(NVCC, "fast_div_check.cpp", tmp_path, opt="-O3",
                            flags=("-Xcompiler", "-march=native")) > 6 * 2**31
