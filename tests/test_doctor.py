"""CPU checks of ``python -m deepinfer_sm80.doctor`` and of the fat-binary reader it uses
(``deepinfer_sm80.fatbin``): libraries compiled here by nvcc for known architectures, the
verdicts on capabilities, limits and library code, and whole runs with the GPU faked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "overlay"))

from deepinfer_sm80 import doctor, fatbin  # noqa: E402

KERNEL = """
__global__ void k(float* x) { x[threadIdx.x] += 1.f; }
extern "C" void launch(float* x) { k<<<1, 32>>>(x); }
"""
NVCC = shutil.which("nvcc")


def _lib(tmp_path: Path, name: str, gencodes: list[str]) -> Path:
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    out = tmp_path / name
    flags = [f"-gencode=arch=compute_{a},code={c}" for a, c in gencodes]
    subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", *flags, str(src), "-o", str(out)],
                   check=True, capture_output=True)
    return out


needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc to compile the test libraries")


@pytest.fixture(autouse=True)
def _no_vllm_import(monkeypatch):
    """The doctor's vLLM check imports ``vllm`` (here: overlay/vllm, a namespace package),
    which would stay in sys.modules for the rest of the suite; it runs in a subprocess in
    test_vllm_check_in_the_applied_tree instead."""
    monkeypatch.setattr(doctor, "_vllm", lambda report: report.add("info", "vllm", "(stubbed)"))


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if NVCC is None:
        pytest.skip("needs nvcc to compile the test libraries")
    d = tmp_path_factory.mktemp("fatbin")
    return {
        # make build ARCHS="8.0 8.6": SASS for both, PTX of the highest
        "sm80_sm86_ptx86": _lib(d, "a.so", [("80", "sm_80"), ("86", "sm_86"),
                                            ("86", "compute_86")]),
        "ptx80": _lib(d, "b.so", [("80", "compute_80")]),
        "sm90": _lib(d, "c.so", [("80", "sm_90")]),  # EXTRA_GENCODE=compute_80:sm_90
    }


@needs_nvcc
def test_fatbin_reads_the_architectures_nvcc_built(libs):
    assert fatbin.code_in_library(libs["sm80_sm86_ptx86"]) == fatbin.LibraryCode((80, 86), (86,))
    assert fatbin.code_in_library(libs["ptx80"]) == fatbin.LibraryCode((), (80,))
    assert fatbin.code_in_library(libs["sm90"]) == fatbin.LibraryCode((90,), ())


def test_fatbin_ignores_stray_magic_and_truncated_headers():
    magic = fatbin._MAGIC_BYTES
    assert fatbin.code_in_bytes(b"") == fatbin.LibraryCode((), ())
    assert fatbin.code_in_bytes(b"xx" + magic + b"\x01\x00") == fatbin.LibraryCode((), ())
    # a header claiming more bytes than there are
    head = (magic + (1).to_bytes(2, "little") + (16).to_bytes(2, "little")
            + (1 << 40).to_bytes(8, "little"))
    assert fatbin.code_in_bytes(head + bytes(64)) == fatbin.LibraryCode((), ())


def test_which_code_runs_on_a_capability():
    c = fatbin.LibraryCode((80, 86), (86,))
    assert [c.runs_on(x) for x in (75, 80, 86, 89, 90, 120)] == [
        "none", "sass", "sass", "sass", "ptx", "ptx"]
    assert fatbin.LibraryCode((80,), ()).runs_on(86) == "sass"  # minor-version compatible
    assert fatbin.LibraryCode((86,), ()).runs_on(80) == "none"  # not backwards
    assert fatbin.LibraryCode((), (80,)).runs_on(86) == "ptx"
    assert fatbin.LibraryCode((90,), ()).runs_on(100) == "none"


def _levels(report):
    return {f.topic: f.level for f in report.findings}


def test_verdicts_on_capability_limits_and_code():
    r = doctor.Report()
    assert doctor.check_capability(r, 8, 0) and doctor.check_capability(r, 8, 6)
    assert not doctor.check_capability(r, 9, 0)
    assert not doctor.check_capability(r, 7, 5)
    assert [f.level for f in r.findings] == ["ok", "ok", "info", "error"]
    for smem, level in ((163 * 1024, "ok"), (99 * 1024, "ok"), (48 * 1024, "error")):
        r = doctor.Report()
        doctor.check_limits(r, 108, smem)
        assert r.findings[0].level == level, smem
    lib = Path("_C.so")
    code = fatbin.LibraryCode((80,), (80,))
    for cap, level in ((80, "ok"), (86, "ok"), (90, "warn"), (75, "error")):
        r = doctor.Report()
        doctor.check_library_code(r, code, cap, lib)
        assert r.findings[0].level == level, cap
        if level != "ok":
            assert f'ARCHS="{cap // 10}.{cap % 10}"' in r.findings[0].fix


def test_a_missing_override_is_named(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    monkeypatch.setenv("DEEPINFER_SM80_EXT", str(tmp_path / "nowhere.so"))
    report = doctor.run(smoke=False)
    ext = next(f for f in report.findings if f.topic == "extension")
    assert ext.level == "error" and "nowhere.so, which is not a file" in ext.message


def test_run_without_a_gpu_says_what_to_do(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(doctor, "_library", lambda: None)
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "[error] extension: deepinfer_sm80/_C.so is not built" in out
    assert 'make build ARCHS="8.0 8.6"' in out
    assert "[error] cuda: torch sees no CUDA device" in out
    assert out.rstrip().endswith("result: errors above")


def _fake_gpu(monkeypatch, major, minor, sms=108, smem=163 * 1024):
    torch = pytest.importorskip("torch")
    props = types.SimpleNamespace(name=f"fake {major}.{minor}", major=major, minor=minor,
                                  multi_processor_count=sms, shared_memory_per_block_optin=smem)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)


def _fake_extension(monkeypatch, lib, ops):
    ext = types.ModuleType("deepinfer_sm80._ext")
    ext.load = lambda: lib
    monkeypatch.setitem(sys.modules, "deepinfer_sm80._ext", ext)
    monkeypatch.setattr(doctor, "_library", lambda: lib)
    monkeypatch.setattr(doctor, "_registered_ops", lambda: set(ops))


@needs_nvcc
@pytest.mark.parametrize("lib_key,cap,want", [
    ("sm80_sm86_ptx86", (8, 6), {"path": "ok", "limits": "ok", "extension code": "ok",
                                 "extension": "ok", "ops": "ok"}),
    ("ptx80", (8, 0), {"extension code": "warn", "ops": "ok"}),
    ("sm90", (8, 0), {"extension code": "error"}),
])
def test_run_with_a_faked_gpu(monkeypatch, libs, lib_key, cap, want):
    _fake_gpu(monkeypatch, *cap)
    _fake_extension(monkeypatch, libs[lib_key], doctor.REQUIRED_OPS)
    report = doctor.run(smoke=False)
    got = _levels(report)
    for topic, level in want.items():
        assert got.get(topic) == level, (topic, report.text())
    if want["extension code"] == "error":  # nothing runs: the library is not loaded
        assert "extension" not in got and not report.ok


@needs_nvcc
def test_run_names_missing_ops_and_small_shared_memory(monkeypatch, libs):
    _fake_gpu(monkeypatch, 8, 6, smem=48 * 1024)
    _fake_extension(monkeypatch, libs["sm80_sm86_ptx86"], doctor.REQUIRED_OPS[:-2])
    report = doctor.run(smoke=False)
    got = _levels(report)
    assert got["limits"] == "error" and got["ops"] == "error" and not report.ok
    ops = next(f for f in report.findings if f.topic == "ops")
    assert all(o in ops.message for o in doctor.REQUIRED_OPS[-2:])


@needs_nvcc
def test_a_hopper_gpu_keeps_upstream_unless_forced(monkeypatch, libs):
    _fake_gpu(monkeypatch, 9, 0, sms=132, smem=227 * 1024)
    _fake_extension(monkeypatch, libs["sm90"], doctor.REQUIRED_OPS)
    got = _levels(doctor.run(smoke=False))
    assert got["path"] == "info" and "limits" not in got and "ops" not in got
    assert got["extension"] == "info"  # not used there: no verdict on its code
    forced = doctor.run(smoke=False, force_sm80=True)
    assert _levels(forced)["limits"] == "ok" and forced.ok


def test_required_ops_are_registered_by_csrc():
    """Every op the doctor requires is defined by a ``TORCH_LIBRARY`` block in csrc/api."""
    import re

    text = "".join(p.read_text() for p in (ROOT / "csrc" / "api").glob("*.cpp"))
    defined = set(re.findall(r'm\.def\(\s*"([a-z_0-9]+)\(', text))
    assert set(doctor.REQUIRED_OPS) <= defined, set(doctor.REQUIRED_OPS) - defined


def test_doctor_imports_nothing_but_torch_and_the_package():
    code = ("import sys; import deepinfer_sm80.doctor, deepinfer_sm80.fatbin; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'triton', 'numpy')]; "
            "print(bad)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "overlay"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("corrupt", [False, True])
def test_smoke_run_compares_with_the_reference(monkeypatch, corrupt):
    """The smoke run's plumbing on the CPU: the extension's ops swapped for the torch
    references (so they agree) or for a writer that flips one byte (so they must not)."""
    torch = pytest.importorskip("torch")
    from deepinfer_sm80.ops import attention as oa
    from deepinfer_sm80.ops import cache as oc
    from deepinfer_sm80.reference import cache as ref

    def insert(k, cache, slots, bs):
        ref.quantize_and_insert_k_cache(k, cache, slots, bs)
        if corrupt:
            cache.view(-1)[cache.view(-1).nonzero()[0]] ^= 1

    monkeypatch.setattr(oc, "quantize_and_insert_k_cache", insert)
    monkeypatch.setattr(oc, "dequantize_and_gather_k_cache", ref.dequantize_and_gather_k_cache)
    monkeypatch.setattr(oa, "sparse_mla_plan", lambda *a: {"splits": 1})
    report = doctor.Report()
    doctor._smoke(report, torch.device("cpu"))
    smoke = next(f for f in report.findings if f.topic == "smoke run")
    assert smoke.level == ("error" if corrupt else "ok"), report.text()
    assert any(f.topic == "attention plan" for f in report.findings)


def test_vllm_check_in_the_applied_tree(tmp_path):
    """``python -m deepinfer_sm80.doctor`` with the applied tree importable: the overlay's
    identity at the pinned release (ok); with only overlay/ (no generated pin module): a
    warning that says to install the applied tree."""
    import json

    tree = ROOT / "build" / "vllm-0.33.0"
    if not (tree / "vllm" / "deepinfer_sm80_pin.py").is_file():
        pytest.skip("no applied tree (make apply)")

    def run(path):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, path)))
        r = subprocess.run([sys.executable, "-m", "deepinfer_sm80.doctor", "--json", "--no-smoke"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        got = json.loads(r.stdout)
        assert r.returncode == (0 if got["ok"] else 1)
        return next(f for f in got["findings"] if f["topic"] == "vllm")

    ok = run([ROOT / "overlay", tree])
    assert ok["level"] == "ok" and "on vLLM 0.33.0" in ok["message"], ok
    bare = run([ROOT / "overlay"])
    assert bare["level"] == "warn" and "make apply" in bare["fix"], bare
