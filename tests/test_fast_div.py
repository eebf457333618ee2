"""Host check of the launch-time fast division (csrc/common/fast_div.h) that the index combine
kernel uses for `(pos + 1) / compress_ratio`: compiled with nvcc and run on the CPU against the
C division (tests/native/fast_div_check.cpp: every non-negative int32 for six divisors, every
divisor up to 4096 on edge ranges, random pairs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deepinfer.build import find_nvcc

ROOT = Path(__file__).resolve().parents[1]
NVCC = find_nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (the check compiles csrc/common/fast_div.h)")
def test_fast_div_matches_c_division(tmp_path):
    exe = tmp_path / "fast_div_check"
    src = ROOT / "tests" / "native" / "fast_div_check.cpp"
    res = subprocess.run([str(NVCC), "-std=c++17", "-O2", f"-I{ROOT / 'csrc'}", str(src), "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("OK"), run.stdout + run.stderr
    assert int(run.stdout.split()[1]) > 6 * 2**31
