"""Build tooling checks (tools/deepinfer/build.py) and the host-side FP8 codec check.

* parsing of ptxas output, architecture and gencode handling (pure Python);
* `build-check` on the real csrc/ (needs nvcc; skips without it): every kernel compiles
  for sm_80 / sm_86 without spills, and csrc/api/*.cpp passes a syntax check;
* scripts/device/gather_timeline.cu compiles (it includes the gather kernel source) and the
  shipped gather holds none of its timeline hooks (needs nvcc);
* tests/native/fp8_codec_check.cu compiled for the host: the csrc/common codecs against
  the software path of __nv_cvt_float_to_fp8 from cuda_fp8.hpp over a stride of all 2^32
  float bit patterns (needs nvcc).
"""
import shutil
import subprocess
from pathlib import Path

import pytest

from deepinfer import build as B
from deepinfer.console import DeepinferError
from native_check import run_native_check

NVCC = B.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit absent)")

PTXAS_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN3foo6kernelEv' for 'sm_80'
ptxas info    : Function properties for _ZN3foo6kernelEv
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_Z3barv' for 'sm_86'
ptxas info    : Function properties for _Z3barv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 380 bytes cmem[0]
"""


def test_parse_ptxas():
    ks = B.parse_ptxas(PTXAS_SAMPLE, "x.cu")
    assert [(k.kernel, k.arch) for k in ks] == [("_ZN3foo6kernelEv", "sm_80"),
                                                ("_Z3barv", "sm_86")]
    a, b = ks
    assert (a.registers, a.smem, a.stack, a.spill_stores, a.spill_loads) == (255, 2048, 16, 8, 4)
    assert a.spills and not b.spills and b.registers == 32 and b.smem == 0


def test_parse_archs_and_gencode():
    assert B.parse_archs("8.0 8.6") == ["80", "86"]
    assert B.parse_archs("86;8.0,sm_80 8.6+PTX") == ["80", "86"]
    with pytest.raises(DeepinferError):
        B.parse_archs("eight")
    flags = B.gencode_flags(["80", "86"], True, ["compute_80:sm_90"])
    assert flags == ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_86,code=sm_86",
                     "-gencode=arch=compute_86,code=compute_86",
                     "-gencode=arch=compute_80,code=sm_90"]
    with pytest.raises(DeepinferError):
        B.gencode_flags(["80"], True, ["sm_90"])


def test_short_name():
    assert B.short_name("void deepinfer_sm80::(anonymous namespace)::k<true>(int, float)") \
        == "void k<true>"
    assert B.short_name("deepinfer_sm80::gather(deepinfer_sm80::P)") == "gather"


def test_build_without_target_explains(tmp_path):
    with pytest.raises(DeepinferError) as e:
        B.build(["80"], [])
    assert "make apply" in (e.value.hint or "")


def test_ninja_file_names_objects_by_path(tmp_path):
    csrc = tmp_path / "csrc"
    (csrc / "a").mkdir(parents=True)
    (csrc / "b").mkdir()
    (csrc / "a" / "k.cu").write_text("")
    (csrc / "b" / "k.cu").write_text("")
    (csrc / "b" / "api.cpp").write_text("")
    tf = B.TorchFlags(["/inc"], ["/lib"], 1, "13.0")
    lib = B.write_ninja(tmp_path / "bd", ["80", "86"], ["compute_80:sm_90"], csrc=csrc, tf=tf,
                        nvcc=Path("/usr/local/cuda/bin/nvcc"))
    text = (tmp_path / "bd" / "build.ninja").read_text()
    assert "build obj/a__k.cu.o: nvcc" in text and "build obj/b__k.cu.o: nvcc" in text
    assert "build obj/b__api.cpp.o: cxx" in text
    assert "code=compute_86" in text and "code=sm_90" in text
    assert lib.name == "_C.so"


@needs_nvcc
def test_build_check_real_sources_no_spills():
    kernels = B.build_check(["80", "86"])
    names = {k.name for k in kernels}
    for want in ("gather_k_kernel", "insert_k_kernel", "combine_kernel<true, false>",
                 "global_topk_kernel<true>"):
        assert any(want in n for n in names), (want, names)
    assert not any(k.spills for k in kernels)
    assert {k.arch for k in kernels} == {"sm_80", "sm_86"}
    # The 8-head attention tiles (bf16 prefill, fp8 decode in-block and raw-scores) run two
    # blocks of 256 threads per A100 SM (docs/attention.md): at most 65,536 / 512 = 128
    # registers per thread, or the second block silently stops fitting.
    h8 = [k for k in kernels if "sparse_mla_kernel" in k.name and "TileConfig<8," in k.name]
    assert len(h8) >= 3 * 2, [k.name for k in kernels if "sparse_mla" in k.name]
    assert all(k.registers <= 128 for k in h8), [(k.name, k.arch, k.registers) for k in h8]


@needs_nvcc
def test_fp8_codecs_match_cuda_fp8_host_path(tmp_path):
    assert run_native_check(NVCC, "fp8_codec_check.cu", tmp_path, "997", timeout=600) > 4_000_000


@needs_nvcc
def test_gather_timeline_harness_compiles_and_hooks_stay_out(tmp_path):
    """scripts/device/gather_timeline.cu includes csrc/cache/gather_k.cu itself, so a change to
    the gather's internals can break it: both of its builds (timeline marks and timing) must
    compile for sm_80; and the shipped gather's PTX must hold no timeline code."""
    repo = Path(__file__).resolve().parents[1]
    src = repo / "scripts" / "device" / "gather_timeline.cu"
    for extra in ([], ["-DGTL_NO_MARKS"]):
        out = tmp_path / f"gtl{len(extra)}.o"
        r = subprocess.run([str(NVCC), "-O1", "-std=c++17", f"-I{repo / 'csrc'}", "-arch=sm_80",
                            *extra, "-c", "-o", str(out), str(src)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and out.exists(), r.stderr[-3000:]
    ptx = tmp_path / "gather_k.ptx"
    r = subprocess.run([str(NVCC), "-std=c++17", f"-I{repo / 'csrc'}", "-arch=sm_80", "-ptx",
                        "-o", str(ptx), str(repo / "csrc" / "cache" / "gather_k.cu")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    text = ptx.read_text()
    assert "gather_k_warp_kernel" in text and "globaltimer" not in text


def test_link_names_torchs_shared_libstdcxx(tmp_path):
    """The link line carries the libstdc++ torch runs with, so that a compiler whose -lstdc++
    finds only libstdc++.a cannot put a second libstdc++ into _C.so (runtime_libstdcxx)."""
    maps = ("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
            "7f02-7f03 r-xp 0 08:01 2 /opt/x/lib/libstdc++.so.6.0.33\n"
            "7f04-7f05 r-xp 0 08:01 3 /opt/x/lib/libstdc++fs.a.so.bak\n")
    assert B.runtime_libstdcxx(maps) == "/opt/x/lib/libstdc++.so.6.0.33"
    assert B.runtime_libstdcxx("7f00-7f01 r-xp 0 08:01 1 /lib/libc.so.6\n") is None
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "k.cu").write_text("")
    for lib, want in (("/opt/x/lib/libstdc++.so.6", True), (None, False)):
        tf = B.TorchFlags(["/inc"], ["/lib"], 1, "13.0", lib)
        B.write_ninja(tmp_path / "bd", ["80"], [], csrc=csrc, tf=tf, nvcc=Path("/usr/local/cuda/bin/nvcc"))
        ld = [ln for ln in (tmp_path / "bd" / "build.ninja").read_text().splitlines()
              if ln.startswith("ldflags =")][0]
        assert ("libstdc++.so.6" in ld) == want
        if want:
            assert ld.index("-lcudart") < ld.index("/opt/x/lib/libstdc++.so.6")


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("readelf") is None,
                    reason="needs g++ and readelf")
def test_static_libstdcxx_copy_is_detected(tmp_path):
    """carries_own_libstdcxx tells a library with its own static libstdc++ (what made every
    failed TORCH_CHECK a segfault on the H200 box) from one that needs the shared one."""
    src = tmp_path / "s.cpp"
    src.write_text('#include <sstream>\n#include <string>\n'
                   'std::string f(long x) { std::ostringstream o; o << x; return o.str(); }\n')
    for flags, want in (([], False), (["-static-libstdc++"], True)):
        lib = tmp_path / f"s{len(flags)}.so"
        r = subprocess.run(["g++", "-O1", "-shared", "-fPIC", *flags, str(src), "-o", str(lib)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"g++ cannot link this way here: {r.stderr[-200:]}")
        assert B.carries_own_libstdcxx(lib) is want, flags


@needs_nvcc
def test_api_syntax_checks_are_kept_until_csrc_or_the_compiler_changes(tmp_path, monkeypatch,
                                                                       capfd):
    """The csrc/api syntax checks (10-13 s each against torch's headers) go through the
    build-check cache too: a second run runs no compiler; an edit under csrc/ or another
    compiler runs them again; a failing check is reported every time, never kept."""
    pytest.importorskip("torch", reason="the api syntax check needs torch's headers")
    csrc = tmp_path / "csrc"
    (csrc / "k").mkdir(parents=True)
    (csrc / "api").mkdir()
    (csrc / "k" / "a.cu").write_text("__global__ void a(float* p) { p[0] = 1.0f; }\n")
    (csrc / "api" / "x.cpp").write_text("int x() { return 1; }\n")
    log = tmp_path / "cxx.log"
    cxx = tmp_path / "cxx"
    cxx.write_text(f'#!/bin/sh\n[ "$1" = --version ] || echo "$@" >> {log}\nexec c++ "$@"\n')
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setattr(B, "BUILD_CHECK_CACHE", tmp_path / "cache")

    def run():
        B.build_check(["80"], csrc=csrc)
        out = capfd.readouterr()
        return len(log.read_text().splitlines()) if log.exists() else 0, out.out + out.err

    calls, out = run()
    assert calls == 1 and "syntax check against torch headers: ok" in out
    assert "passed before" not in out
    calls, out = run()
    assert calls == 1 and "1 of 1 passed before" in out
    (csrc / "k" / "a.cu").write_text("__global__ void a(float* p) { p[0] = 2.0f; }\n")
    assert run()[0] == 2
    cxx2 = tmp_path / "cxx2"
    cxx2.write_text(cxx.read_text())
    cxx2.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx2))
    assert run()[0] == 3
    (csrc / "api" / "x.cpp").write_text("int x() { return y; }\n")
    for want in (4, 5):
        with pytest.raises(DeepinferError, match="1 api error"):
            B.build_check(["80"], csrc=csrc)
        assert len(log.read_text().splitlines()) == want
    # a $CXX that names no program: an api error naming it, not a traceback
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-cxx"))
    with pytest.raises(DeepinferError, match="1 api error") as err:
        B.build_check(["80"], csrc=csrc)
    assert any("cannot run the C++ compiler" in d and "no-such-cxx" in d
               for d in err.value.details), err.value.details


@needs_nvcc
def test_build_check_reuses_results_until_a_source_or_header_changes(tmp_path, monkeypatch, capfd):
    """The build-check cache (CI runs build-check twice: in this suite and as `make
    build-check`): a second run compiles nothing and reports the same kernels; editing a
    header included by the kernel invalidates it; a compile error is reported, never kept."""
    csrc = tmp_path / "csrc"
    (csrc / "k").mkdir(parents=True)
    (csrc / "k" / "n.h").write_text("#define N 4\n")
    (csrc / "k" / "a.cu").write_text('#include "k/n.h"\n__global__ void a(float* p) '
                                     "{ float v[N]; for (int i = 0; i < N; ++i) v[i] = p[i];"
                                     " p[0] = v[N - 1]; }\n")
    monkeypatch.setattr(B, "BUILD_CHECK_CACHE", tmp_path / "cache")
    calls = []
    real = B.compile_for_resources
    monkeypatch.setattr(B, "compile_for_resources", lambda *a, **k: calls.append(a[0]) or real(*a, **k))

    def run():
        ks = B.build_check(["80"], csrc=csrc, check_api=False)
        out = capfd.readouterr()
        return sorted((k.name, k.arch, k.registers, k.stack) for k in ks), out.out + out.err

    first, log1 = run()
    assert len(calls) == 1 and first and "from" not in log1.split("build-check ok")[-1]
    second, log2 = run()
    assert len(calls) == 1 and second == first and "1 of the files' results from" in log2
    (csrc / "k" / "n.h").write_text("#define N 8\n")
    run()
    assert len(calls) == 2
    (csrc / "k" / "a.cu").write_text("__global__ void a(float* p) { p[0] = q; }\n")
    for _ in range(2):
        with pytest.raises(DeepinferError, match="compile error"):
            run()
    assert len(calls) == 4
    monkeypatch.setenv("DEEPINFER_BUILD_CHECK_CACHE", "0")
    (csrc / "k" / "a.cu").write_text("__global__ void a(float* p) { p[0] = 1.0f; }\n")
    run()
    run()
    assert len(calls) == 6
