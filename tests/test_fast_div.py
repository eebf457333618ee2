"""Host check of the launch-time fast division (csrc/common/fast_div.h) that the index combine
kernel uses for `(pos + 1) / compress_ratio`: compiled with nvcc and run on the CPU against the
C division (tests/native/fast_div_check.cpp: every non-negative int32 for six divisors, every
divisor up to 4096 on edge ranges, random pairs)."""

from __future__ import annotations

import pytest

from deepinfer.build import find_nvcc
from native_check import run_native_check

NVCC = find_nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (the check compiles csrc/common/fast_div.h)")
def test_fast_div_matches_c_division(tmp_path):
    assert run_native_check(NVCC, "fast_div_check.cpp", tmp_path) > 6 * 2**31
