"""Host-side checks of the sparse MLA launch planning (csrc/attention/plan.h: tile
configuration per shared-memory cap, narrowing of head groups for small decode grids, split
counts), compiled with nvcc and run on the CPU: tests/native/attention_plan_check.cpp."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deepinfer.build import find_nvcc

ROOT = Path(__file__).resolve().parents[1]
NVCC = find_nvcc()

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (the check compiles csrc/attention/plan.h)")


@needs_nvcc
def test_attention_plan_host_checks(tmp_path):
    exe = tmp_path / "plan_check"
    src = ROOT / "tests" / "native" / "attention_plan_check.cpp"
    res = subprocess.run([str(NVCC), "-std=c++17", "-O1", f"-I{ROOT / 'csrc'}", str(src), "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.startswith("OK"), run.stdout + run.stderr
    assert int(run.stdout.split()[1]) >= 35
