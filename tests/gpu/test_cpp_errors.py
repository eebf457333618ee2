"""A failed argument check inside the extension's C++ ops (TORCH_CHECK) must reach Python as a
RuntimeError naming the problem, not crash the process. Until 2026-12-01 every one of them was
a segfault on the H200 box: its compiler linked a static libstdc++ into _C.so, whose
never-initialised iostreams crashed while formatting the message (tools/deepinfer/build.py,
runtime_libstdcxx). The Python wrappers validate first, so these cases call torch.ops directly;
each runs in a subprocess, so a crash fails its case instead of ending the session."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

PRE = """
import torch
from deepinfer_sm80 import _ext
_ext.load()
ops = torch.ops.deepinfer_sm80
d = "cuda"
i32 = lambda n: torch.zeros(n, dtype=torch.int32, device=d)
"""

CASES = {
    "k must be in": "ops.row_topk_keys(torch.empty(2, 4, dtype=torch.int64, device=d), "
                    "torch.zeros(2, 8, dtype=torch.int64, device=d), 0)",
    "heads must be 16, 32 or 64": (
        "ops.indexer_paged_keys(torch.empty(2, 64, dtype=torch.int64, device=d), "
        "torch.zeros(2, 8, 128, dtype=torch.uint8, device=d), torch.zeros(2, 8, device=d), "
        "torch.zeros(2, 64 * 132, dtype=torch.uint8, device=d), "
        "torch.zeros(1, 2, dtype=torch.int32, device=d), i32(2), i32(2), i32(2), 0, 64, 64)"),
    "k_codes rows must be 16-byte aligned": (
        "ops.indexer_flat_keys(torch.empty(2, 64, dtype=torch.int64, device=d), "
        "torch.zeros(2, 16, 128, dtype=torch.uint8, device=d), torch.zeros(2, 16, device=d), "
        "torch.zeros(64, 136, dtype=torch.uint8, device=d)[:, :128], torch.ones(64, device=d), "
        "i32(2), i32(2), 0, 64)"),
    "must be a CUDA tensor": (
        "ops.row_topk_keys(torch.empty(2, 4, dtype=torch.int64, device=d), "
        "torch.zeros(2, 8, dtype=torch.int64), 4)"),  # keys on the CPU
}


@pytest.fixture(autouse=True)
def _built(ext):
    return ext


@pytest.mark.parametrize("message", list(CASES))
def test_failed_check_raises_runtime_error(message):
    code = PRE + f"""
try:
    {CASES[message]}
    print("NO ERROR")
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, f"the process died (rc {r.returncode}): {r.stderr[-800:]}"
    assert r.stdout.startswith("RuntimeError:") and message in r.stdout, r.stdout + r.stderr[-400:]
