"""``python -m deepinfer_sm80.doctor`` on a GPU with the built extension: no error, the
library's code runs on this GPU, the ops are registered, and the smoke run (KV-cache writer
and gather on fresh random rows against the torch reference) is bit-exact. On a 9.x GPU with
``--force-sm80``, as the rest of the GPU suite runs the SM80 code there."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_doctor_passes_on_this_gpu(ext, monkeypatch):
    from deepinfer_sm80 import doctor

    # (its vLLM check would import a vllm package into this process, where later test files
    # import upstream's from the tree: the CLI test below runs it in a process of its own)
    monkeypatch.setattr(doctor, "_vllm", lambda report: None)
    report = doctor.run(force_sm80=True)
    print(report.text())
    levels = {f.topic: f.level for f in report.findings}
    assert report.ok, report.text()
    assert levels["smoke run"] == "ok" and levels["ops"] == "ok"
    assert levels["extension code"] in ("ok", "warn")  # warn: PTX compiled at load


def test_doctor_cli_exit_status(ext):
    path = os.pathsep.join(p for p in (str(ROOT / "overlay"), os.environ.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-m", "deepinfer_sm80.doctor", "--force-sm80", "--json"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 0, out.stdout + out.stderr
    assert '"ok": true' in out.stdout
