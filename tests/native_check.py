"""Compile one host check of tests/native/ with nvcc (csrc/ on the include path) and run it on
the CPU. The checks print "OK <count>" on success; run_native_check returns that count."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_native_check(nvcc, name: str, tmp_path: Path, *args: str, opt: str = "-O2",
                     timeout: int = 300, flags: tuple[str, ...] = ()) -> int:
    exe = tmp_path / Path(name).stem
    src = ROOT / "tests" / "native" / name
    res = subprocess.run([str(nvcc), "-std=c++17", opt, *flags, f"-I{ROOT / 'csrc'}", str(src),
                          "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0 and run.stdout.startswith("OK"), run.stdout + run.stderr
    return int(run.stdout.split()[1])
