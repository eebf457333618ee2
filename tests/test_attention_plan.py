"""Host-side checks of the sparse MLA launch planning (csrc/attention/plan.h: tile
configuration per shared-memory cap, narrowing of head groups for small decode grids, split
counts), compiled with nvcc and run on the CPU: tests/native/attention_plan_check.cpp."""

from __future__ import annotations

import pytest

from deepinfer.build import find_nvcc
from native_check import run_native_check

NVCC = find_nvcc()

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (the check compiles csrc/attention/plan.h)")


@needs_nvcc
def test_attention_plan_host_checks(tmp_path):
    assert run_native_check(NVCC, "attention_plan_check.cpp", tmp_path, opt="-O1", timeout=60) >= 35
