"""Build the ``deepinfer_sm80._C`` extension and check kernel resources.

* :func:`build` compiles every ``csrc/**/*.cu`` (nvcc, no torch headers) and
  ``csrc/**/*.cpp`` (torch-facing, torch's headers) into ONE shared library ``_C.so`` with
  a generated ninja file (objects are named by their path under ``csrc/``, so equal file
  names in different directories do not collide; relative ``#include``s keep working), for
  the requested architectures plus PTX of the highest one, and copies it into each target
  package directory (``<dir>/deepinfer_sm80/_C.so``). The library registers its ops with
  ``TORCH_LIBRARY_FRAGMENT(deepinfer_sm80, ...)``; ``deepinfer_sm80._ext`` loads it.
* :func:`build_check` compiles every ``.cu`` for sm_80 and sm_86 with ``-Xptxas -v``
  (nvcc only, no torch), prints registers / static shared memory / stack / spills per
  kernel and fails on any spill outside :data:`SPILL_ALLOWLIST`. When torch's headers are
  importable it also syntax-checks the torch-facing ``csrc/api/*.cpp``.

CLI: ``deepinfer build|build-check`` or ``python -m deepinfer.build build|check``
(the latter needs no ``rich``, for GPU boxes with a bare Python).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

try:  # the CLI's error type and console; plain fallbacks where rich is not installed
    from .console import DeepinferError, info, warn
except ImportError:  # pragma: no cover - exercised on bare GPU boxes
    class DeepinferError(Exception):  # type: ignore[no-redef]
        def __init__(self, message: str, hint: str | None = None,
                     details: list[str] | None = None, exit_code: int = 1):
            super().__init__(message)
            self.message, self.hint, self.details = message, hint, list(details or [])
            self.exit_code = exit_code

        def __str__(self) -> str:
            return "\n".join([self.message, *self.details]
                             + ([f"hint: {self.hint}"] if self.hint else []))

    def info(msg: str) -> None:  # type: ignore[no-redef]
        print(msg, flush=True)

    def warn(msg: str) -> None:  # type: ignore[no-redef]
        print(f"warning: {msg}", file=sys.stderr, flush=True)

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
PACKAGE = "deepinfer_sm80"
LIB_NAME = "_C.so"

# Kernels allowed to spill (demangled-name substrings). Empty: no kernel may spill.
SPILL_ALLOWLIST: tuple[str, ...] = ()

CUDA_STD = "c++17"


# --------------------------------------------------------------------------------------
# toolchain
# --------------------------------------------------------------------------------------
def find_nvcc() -> Path | None:
    """nvcc from $CUDA_HOME / $CUDA_PATH, else PATH (None when absent)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return Path(home) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    return Path(found) if found else None


def cuda_home(nvcc: Path) -> Path:
    """The toolkit root of `nvcc` (follows wrapper scripts via `nvcc --dryrun`'s TOP=)."""
    home = nvcc.resolve().parent.parent
    if (home / "include" / "cuda_runtime.h").is_file():
        return home
    try:
        res = subprocess.run([str(nvcc), "--dryrun", "-c", "-x", "cu", os.devnull],
                             capture_output=True, text=True, timeout=60)
        m = re.search(r"TOP=(\S+)", res.stdout + res.stderr)
        if m:
            return Path(m.group(1).strip('"')).resolve()
    except (OSError, subprocess.SubprocessError):
        pass
    return home


def parse_archs(spec: str | list[str]) -> list[str]:
    """'8.0 8.6' / '80;86' / 'sm_80,8.6+PTX' -> ['80', '86'] (sorted, unique)."""
    items = spec.replace(";", " ").replace(",", " ").split() if isinstance(spec, str) else spec
    out = set()
    for it in items:
        a = it.strip().lower().removeprefix("sm_").removeprefix("compute_").removesuffix("+ptx")
        a = a.replace(".", "")
        if not re.fullmatch(r"\d{2,3}", a):
            raise DeepinferError(f"bad CUDA architecture {it!r}",
                                 hint="use compute capabilities like ARCHS=\"8.0 8.6\"")
        out.add(a)
    if not out:
        raise DeepinferError("no CUDA architecture given", hint='e.g. ARCHS="8.0 8.6"')
    return sorted(out, key=int)


def gencode_flags(archs: list[str], ptx: bool = True, extra: list[str] = (),
                  sass: bool = True) -> list[str]:
    """SASS for each arch, PTX of the highest (forward compatibility), and extra pairs
    'compute_XX:sm_YY' (e.g. 'compute_80:sm_90' runs the SM80 code path on an H100/H200).
    sass=False, ptx=False leaves only the extra pairs (a quick build for one test GPU)."""
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs] if sass else []
    if ptx:
        top = archs[-1]
        flags.append(f"-gencode=arch=compute_{top},code=compute_{top}")
    for e in extra:
        m = re.fullmatch(r"compute_(\d+):(sm|compute)_(\d+)", e.strip())
        if not m:
            raise DeepinferError(f"bad extra gencode {e!r}", hint="use compute_80:sm_90")
        flags.append(f"-gencode=arch=compute_{m.group(1)},code={m.group(2)}_{m.group(3)}")
    return flags


def sources(csrc: Path = CSRC) -> tuple[list[Path], list[Path]]:
    """(.cu files, .cpp files) under csrc/, sorted."""
    return sorted(csrc.rglob("*.cu")), sorted(csrc.rglob("*.cpp"))


# --------------------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------------------
@dataclass
class TorchFlags:
    includes: list[str]
    lib_dirs: list[str]
    cxx11_abi: int
    cuda_version: str
    # the shared libstdc++ torch runs with (None: not found); linked explicitly, see
    # runtime_libstdcxx
    libstdcxx: str | None = None


def runtime_libstdcxx(maps: str | None = None) -> str | None:
    """Path of the shared libstdc++ this process has loaded (after importing torch: the one
    torch runs with), from /proc/self/maps; None where there is none or no /proc.

    The extension must link against it, not against a static libstdc++: a compiler whose
    `-lstdc++` finds only libstdc++.a (e.g. a GCC built without shared libraries, as CXX on
    the H200 box of 2026-12-01) copies its own libstdc++ into _C.so, and that copy's
    iostreams, never initialised in the process, crash the first time a TORCH_CHECK formats
    its message: every failed argument check became a segfault instead of a RuntimeError."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if re.search(r"/libstdc\+\+\.so(\.\d+)*$", path):
            return path
    return None


def torch_flags() -> TorchFlags:
    nvcc = find_nvcc()
    if nvcc is not None and not os.environ.get("CUDA_HOME"):
        os.environ["CUDA_HOME"] = str(cuda_home(nvcc))  # torch's helpers look it up
    try:
        import torch
        from torch.utils import cpp_extension as ce
    except ImportError as e:
        raise DeepinferError("torch is not importable, so the extension cannot be built",
                             hint="install a CUDA build of torch (pip install torch) "
                                  "in the Python that runs the build") from e
    if torch.version.cuda is None:
        raise DeepinferError(
            f"torch {torch.__version__} is a CPU-only build; the extension links against "
            "torch's CUDA libraries",
            hint="build on a machine with a CUDA build of torch (e.g. torch==X+cu12x); "
                 "`make build-check` compiles the kernels without torch")
    try:
        inc = ce.include_paths(device_type="cuda")
        libs = ce.library_paths(device_type="cuda")
    except TypeError:  # older torch
        inc = ce.include_paths(cuda=True)
        libs = ce.library_paths(cuda=True)
    return TorchFlags(list(inc), list(libs), int(torch._C._GLIBCXX_USE_CXX11_ABI),
                      str(torch.version.cuda), runtime_libstdcxx())


def carries_own_libstdcxx(lib: Path) -> bool | None:
    """True when ``lib`` defines libstdc++'s iostream internals without needing the shared
    libstdc++ (a static copy: see runtime_libstdcxx); None where readelf / nm are missing."""
    readelf, nm = shutil.which("readelf"), shutil.which("nm")
    if readelf is None or nm is None:
        return None
    dyn = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True)
    if dyn.returncode != 0:
        return None
    if re.search(r"NEEDED.*\[libstdc\+\+\.so", dyn.stdout):
        return False
    syms = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True)
    return "_ZNSo9_M_insert" in syms.stdout or "St8ios_base4Init" in syms.stdout


def _obj_name(src: Path, csrc: Path) -> str:
    rel = src.relative_to(csrc).as_posix()
    return "obj/" + rel.replace("/", "__") + ".o"


def _q(args: list[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in args)


def write_ninja(build_dir: Path, archs: list[str], extra_gencode: list[str],
                csrc: Path = CSRC, tf: TorchFlags | None = None,
                nvcc: Path | None = None, only_extra: bool = False) -> Path:
    """Write build_dir/build.ninja; returns the path of the library it builds."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise DeepinferError("nvcc not found", hint="put the CUDA toolkit's bin/ on PATH or "
                                                    "set CUDA_HOME")
    tf = tf or torch_flags()
    cu, cpp = sources(csrc)
    if not cu and not cpp:
        raise DeepinferError(f"no sources under {csrc}")
    home = cuda_home(nvcc)
    cxx = os.environ.get("CXX", "c++")
    common = ["-O3", f"-std={CUDA_STD}", f"-I{csrc}"]
    nvcc_flags = common + ["-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
                           *gencode_flags(archs, not only_extra, extra_gencode,
                                          sass=not only_extra)]
    py_inc = sysconfig.get_paths().get("include")
    cxx_flags = common + ["-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={tf.cxx11_abi}",
                          "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
                          *[f"-isystem{p}" for p in tf.includes],
                          f"-isystem{home / 'include'}"]
    if py_inc:
        cxx_flags.append(f"-isystem{py_inc}")
    ldflags = [*[f"-L{p}" for p in tf.lib_dirs], f"-L{home / 'lib64'}",
               "-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cpu", "-ltorch_cuda", "-lcudart"]
    if tf.libstdcxx:  # before the compiler's own -lstdc++: resolves libstdc++ to torch's
        ldflags.append(tf.libstdcxx)
    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {shlex.quote(str(nvcc))}",
        f"cxx = {shlex.quote(cxx)}",
        f"nvcc_flags = {_q(nvcc_flags)}",
        f"cxx_flags = {_q(cxx_flags)}",
        f"ldflags = {_q(ldflags)}",
        "rule nvcc",
        "  command = $nvcc $nvcc_flags -MD -MF $out.d -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = NVCC $in",
        "rule cxx",
        "  command = $cxx $cxx_flags -MMD -MF $out.d -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = CXX $in",
        "rule link",
        "  command = $cxx -shared $in -o $out $ldflags",
        "  description = LINK $out",
    ]
    objs = []
    for src in cu:
        o = _obj_name(src, csrc)
        objs.append(o)
        lines.append(f"build {o}: nvcc {src}")
    for src in cpp:
        o = _obj_name(src, csrc)
        objs.append(o)
        lines.append(f"build {o}: cxx {src}")
    lines.append(f"build {LIB_NAME}: link {' '.join(objs)}")
    lines.append(f"default {LIB_NAME}")
    build_dir.mkdir(parents=True, exist_ok=True)
    ninja = build_dir / "build.ninja"
    text = "\n".join(lines) + "\n"
    if not ninja.is_file() or ninja.read_text() != text:
        ninja.write_text(text)
    return build_dir / LIB_NAME


def default_targets(vllm: str | None = None) -> list[Path]:
    """Package parents to install into: the applied tree build/vllm-<ver>/ when it exists."""
    ver = vllm or os.environ.get("VLLM", "0.33.0")
    tree = ROOT / "build" / f"vllm-{ver}"
    return [tree] if tree.is_dir() else []


def build(archs: list[str], targets: list[Path], build_dir: Path | None = None,
          extra_gencode: list[str] = (), jobs: int | None = None,
          verbose: bool = False, only_extra: bool = False) -> list[Path]:
    """Compile the extension and copy it to <target>/deepinfer_sm80/_C.so for each target.
    Returns the installed paths."""
    if not targets:
        raise DeepinferError(
            "nowhere to install the extension: no applied tree in build/ and no target given",
            hint="run `make apply` first, or pass BUILD_DIR=overlay (in-repo) or a directory "
                 "that holds the deepinfer_sm80 package")
    build_dir = build_dir or (ROOT / "build" / "ext" / ("sm" + "_".join(archs)))
    if only_extra and not extra_gencode:
        raise DeepinferError("--only-extra needs --extra-gencode (e.g. compute_80:sm_90)")
    lib = write_ninja(build_dir, archs, list(extra_gencode), only_extra=only_extra)
    ninja = shutil.which("ninja")
    if ninja is None:
        raise DeepinferError("ninja not found", hint="pip install ninja")
    cmd = [ninja, "-C", str(build_dir)]
    jobs = jobs or int(os.environ.get("MAX_JOBS", "0") or 0)
    if jobs:
        cmd += ["-j", str(jobs)]
    if verbose:
        cmd.append("-v")
    what = (", ".join(extra_gencode) if only_extra else
            f"sm_{', sm_'.join(archs)} (+PTX compute_{archs[-1]}"
            + (f", {', '.join(extra_gencode)}" if extra_gencode else "") + ")")
    info(f"building {PACKAGE}._C for {what} in {build_dir}")
    res = subprocess.run(cmd)
    if res.returncode != 0:
        raise DeepinferError("extension build failed (compiler output above)",
                             hint=f"rerun with -v, or inspect {build_dir / 'build.ninja'}")
    if carries_own_libstdcxx(lib):
        raise DeepinferError(
            f"{lib} carries a static copy of libstdc++ (the compiler "
            f"{os.environ.get('CXX', 'c++')} linked libstdc++.a): its failed argument checks "
            "would crash the process instead of raising",
            hint="build with a compiler that links the shared libstdc++ (e.g. CXX=/usr/bin/g++), "
                 "or run the build from the Python that has torch installed (its libstdc++ is "
                 "then linked explicitly)")
    installed = []
    for t in targets:
        pkg = Path(t) / PACKAGE if Path(t).name != PACKAGE else Path(t)
        if not pkg.is_dir():
            raise DeepinferError(f"{pkg} is not a directory holding the {PACKAGE} package",
                                 hint="pass the directory that contains deepinfer_sm80/")
        dst = pkg / LIB_NAME
        tmp = dst.with_suffix(".so.tmp")
        shutil.copy2(lib, tmp)
        os.replace(tmp, dst)
        installed.append(dst)
        info(f"installed {dst}")
    return installed


# --------------------------------------------------------------------------------------
# build-check
# --------------------------------------------------------------------------------------
@dataclass
class KernelResources:
    source: str
    kernel: str  # mangled
    arch: str
    registers: int = 0
    smem: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    name: str = ""  # demangled

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(.*)")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str, source: str) -> list[KernelResources]:
    """Per-kernel resources from `nvcc -Xptxas -v` output (entry functions only)."""
    out: list[KernelResources] = []
    cur: KernelResources | None = None
    props_for: str | None = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            cur = KernelResources(source, m.group(1), m.group(2))
            out.append(cur)
            props_for = None
        elif m := _PROPS.search(line):
            props_for = m.group(1)
        elif (m := _STACK.search(line)) and cur is not None and props_for == cur.kernel:
            cur.stack, cur.spill_stores, cur.spill_loads = map(int, m.groups())
        elif (m := _USED.search(line)) and cur is not None:
            cur.registers = int(m.group(1))
            if s := _SMEM.search(m.group(2)):
                cur.smem = int(s.group(1))
    return out


def demangle(names: list[str], nvcc: Path | None) -> dict[str, str]:
    tool = None
    if nvcc is not None and (nvcc.resolve().parent / "cu++filt").is_file():
        tool = str(nvcc.resolve().parent / "cu++filt")
    elif shutil.which("c++filt"):
        tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    res = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True)
    dem = res.stdout.splitlines()
    if res.returncode != 0 or len(dem) != len(names):
        return {n: n for n in names}
    return dict(zip(names, dem))


def short_name(demangled: str) -> str:
    """Drop namespaces, anonymous-namespace markers and argument lists."""
    s = re.sub(r"\(anonymous namespace\)::", "", demangled)
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # cut at the argument list's '(' (outside templates)
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    s = s[:cut]
    s = re.sub(r"\bdeepinfer_sm80::", "", s)
    return s


def _resources_cmd(src: Path, archs: list[str], nvcc: Path, csrc: Path) -> list[str]:
    return [str(nvcc), f"-std={CUDA_STD}", "-O3", f"-I{csrc}", "--expt-relaxed-constexpr",
            "-Xptxas", "-v", *gencode_flags(archs, ptx=False), "-c", str(src), "-o", os.devnull]


def compile_for_resources(src: Path, archs: list[str], nvcc: Path,
                          csrc: Path = CSRC) -> tuple[list[KernelResources], str | None]:
    res = subprocess.run(_resources_cmd(src, archs, nvcc, csrc), capture_output=True, text=True)
    rel = src.relative_to(csrc).as_posix() if src.is_relative_to(csrc) else str(src)
    if res.returncode != 0:
        return [], f"{rel}: nvcc failed\n{res.stderr.strip()}"
    return parse_ptxas(res.stdout + "\n" + res.stderr, rel), None


# Results of compile_for_resources, kept by what determines them (nvcc and its version, the
# flags, the architectures, the file, every file under csrc/: a header change invalidates
# all), so that `make build-check` after the test suite's run of it (CI does both) compiles
# nothing again. $DEEPINFER_BUILD_CHECK_CACHE=0 turns it off; compile errors are not kept.
# The csrc/api syntax checks' passes are kept there too (``<key>.api-ok``), keyed also by the
# C++ compiler and torch's version and location.
BUILD_CHECK_CACHE = ROOT / "build" / "build-check"


def _csrc_digest(csrc: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(x for x in csrc.rglob("*") if x.is_file()):
        h.update(p.relative_to(csrc).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _nvcc_identity(nvcc: Path) -> str:
    res = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True)
    return f"{nvcc.resolve()}\n{res.stdout}"


def cached_compile_for_resources(src: Path, archs: list[str], nvcc: Path, csrc: Path,
                                 key_base: str, cache: Path | None
                                 ) -> tuple[list[KernelResources], str | None, bool]:
    """compile_for_resources through the cache (None: no cache); the last item says whether
    the result came from it."""
    if cache is None:
        return (*compile_for_resources(src, archs, nvcc, csrc), False)
    # the exact command (flags, architectures, file) over nvcc's identity and csrc/'s digest
    cmd = _resources_cmd(src, archs, nvcc, csrc)
    key = hashlib.sha256(json.dumps([key_base, cmd]).encode()).hexdigest()
    path = cache / f"{key}.json"
    try:
        return [KernelResources(**k) for k in json.loads(path.read_text())], None, True
    except (OSError, ValueError, TypeError):
        pass
    kernels, err = compile_for_resources(src, archs, nvcc, csrc)
    if err is None:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps([dataclasses.asdict(k) for k in kernels]))
        os.replace(tmp, path)
    return kernels, err, False


def _api_cmds(csrc: Path, nvcc: Path | None) -> tuple[list[tuple[Path, list[str]]], str] | None:
    """The csrc/api/*.cpp syntax-check commands against torch's headers, and what else their
    results depend on (the compiler's and torch's identity); None when torch is absent."""
    try:
        import torch
        from torch.utils import cpp_extension as ce
    except ImportError:
        return None
    inc = ce.include_paths()  # the CPU list: no CUDA_HOME needed; CUDA headers added below
    cuda_inc = [f"-isystem{cuda_home(nvcc) / 'include'}"] if nvcc else []
    cxx = os.environ.get("CXX", "c++")
    # CPU builds of torch ship the c10/cuda headers without their generated config.
    cmds = [(src, [cxx, f"-std={CUDA_STD}", "-fsyntax-only", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",
                   f"-I{csrc}", *[f"-isystem{p}" for p in inc], *cuda_inc, str(src)])
            for src in sorted((csrc / "api").glob("*.cpp"))]
    try:
        ver = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    except OSError:
        ver = ""
    return cmds, f"{shutil.which(cxx) or cxx}\n{ver}\ntorch {torch.__version__} {torch.__file__}"


def _api_check_one(src: Path, cmd: list[str], csrc: Path, key_base: str,
                   cache: Path | None) -> tuple[str | None, bool]:
    """One syntax check through the build-check cache (successes only are kept): (the error
    or None, whether the result came from the cache)."""
    path = None
    if cache is not None:
        key = hashlib.sha256(json.dumps([key_base, "api", cmd]).encode()).hexdigest()
        path = cache / f"{key}.api-ok"
        if path.is_file():
            return None, True
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:  # $CXX names no program (one word: the compiler's path or name)
        return (f"{src.relative_to(csrc)}: cannot run the C++ compiler {cmd[0]!r} ($CXX, default "
                f"c++): {exc}"), False
    if res.returncode != 0:
        return f"{src.relative_to(csrc)}:\n{res.stderr.strip()[:4000]}", False
    if path is not None:
        cache.mkdir(parents=True, exist_ok=True)
        path.write_text("ok\n")
    return None, False


def build_check(archs: list[str] = ("80", "86"), allow: tuple[str, ...] = (),
                csrc: Path = CSRC, jobs: int | None = None,
                check_api: bool = True) -> list[KernelResources]:
    """Compile every .cu for `archs` and report per-kernel resources; raise on spills
    (outside SPILL_ALLOWLIST + allow) and on compile errors."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise DeepinferError("nvcc not found: build-check skipped", exit_code=0,
                             hint="install the CUDA toolkit (nvcc) or set CUDA_HOME")
    cu, _ = sources(csrc)
    if not cu:
        raise DeepinferError(f"no .cu files under {csrc}")
    workers = jobs or max(1, os.cpu_count() or 1)
    cache = BUILD_CHECK_CACHE if os.environ.get("DEEPINFER_BUILD_CHECK_CACHE", "1") != "0" else None
    key_base = f"{_nvcc_identity(nvcc)}\n{_csrc_digest(csrc)}" if cache else ""
    api = _api_cmds(csrc, nvcc) if check_api else None
    with ThreadPoolExecutor(max_workers=workers) as ex:
        # the api syntax checks share the pool with the kernels' compiles (queued first: each
        # parses torch's headers, 10-13 s)
        api_futures = [ex.submit(_api_check_one, src, cmd, csrc,
                                 f"{key_base}\n{api[1]}", cache)
                       for src, cmd in api[0]] if api is not None else []
        results = list(ex.map(lambda s: cached_compile_for_resources(
            s, list(archs), nvcc, csrc, key_base, cache), cu))
        api_results = [f.result() for f in api_futures]
    api_errors = [e for e, _ in api_results if e] if api is not None else None
    api_reused = sum(1 for _, hit in api_results if hit)
    kernels = [k for ks, _, _ in results for k in ks]
    failures = [e for _, e, _ in results if e]
    reused = sum(1 for _, _, hit in results if hit)
    names = demangle(sorted({k.kernel for k in kernels}), nvcc)
    for k in kernels:
        k.name = short_name(names.get(k.kernel, k.kernel))
    print_table(kernels)
    allowed = SPILL_ALLOWLIST + tuple(allow)
    spills = [k for k in kernels if k.spills and not any(a in k.name for a in allowed)]
    if api_errors is None and check_api:
        info("csrc/api syntax check skipped: torch is not importable")
    elif check_api:
        info(f"csrc/api/*.cpp syntax check against torch headers: "
             f"{'ok' if not api_errors else f'{len(api_errors)} failed'}"
             + (f" ({api_reused} of {len(api_results)} passed before with the same compiler, "
                "torch and csrc/)" if api_reused else ""))
    details = failures + (api_errors or [])
    details += [f"{k.source}: {k.name} ({k.arch}) spills {k.spill_stores} B stores / "
                f"{k.spill_loads} B loads" for k in spills]
    if details:
        raise DeepinferError(
            f"build-check failed: {len(failures)} compile error(s), {len(api_errors or [])} "
            f"api error(s), {len(spills)} spilling kernel(s)", details=details,
            hint="fix the errors; a kernel that must spill goes into SPILL_ALLOWLIST in "
                 "tools/deepinfer/build.py with a comment saying why")
    info(f"build-check ok: {len(cu)} files, {len(kernels)} kernel builds, no spills"
         + (f" ({reused} of the files' results from {os.path.relpath(cache)}: same nvcc, flags and "
            "csrc/)" if reused else ""))
    return kernels


def print_table(kernels: list[KernelResources]) -> None:
    rows = [("file", "kernel", "arch", "regs", "smem B", "stack B", "spill st/ld B")]
    for k in sorted(kernels, key=lambda k: (k.source, k.name, k.arch)):
        name = k.name if len(k.name) <= 72 else k.name[:69] + "..."
        rows.append((k.source, name, k.arch, str(k.registers), str(k.smem), str(k.stack),
                     f"{k.spill_stores}/{k.spill_loads}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    print("\n".join(lines), flush=True)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------
def _add_build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--archs", default=os.environ.get("ARCHS", "8.0 8.6"),
                   help="compute capabilities, e.g. '8.0 8.6' (env ARCHS)")
    p.add_argument("--target", action="append", default=None,
                   help="directory holding the deepinfer_sm80 package to install into "
                        "(repeatable; default: the applied tree build/vllm-<ver>/); "
                        "'overlay' installs in-repo")
    p.add_argument("--extra-gencode", default=os.environ.get("EXTRA_GENCODE", ""),
                   help="extra 'compute_XX:sm_YY' pairs, e.g. compute_80:sm_90 (env "
                        "EXTRA_GENCODE)")
    p.add_argument("--only-extra", action="store_true",
                   help="compile only the --extra-gencode targets (quick build for one GPU)")
    p.add_argument("--build-dir", default=None, help="object directory (default build/ext/)")
    p.add_argument("-j", "--jobs", type=int, default=None)
    p.add_argument("-v", "--verbose", action="store_true")


def _add_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--archs", default="8.0 8.6", help="architectures to check")
    p.add_argument("--allow-spill", action="append", default=[],
                   help="kernel-name substring allowed to spill (repeatable)")
    p.add_argument("--no-api", action="store_true", help="skip the csrc/api syntax check")


def cmd_build(args) -> int:
    targets = [Path(t) if Path(t).is_absolute() else ROOT / t for t in (args.target or [])]
    if not targets:
        targets = default_targets(getattr(args, "vllm", None))
    extra = args.extra_gencode.replace(",", " ").split()
    build(parse_archs(args.archs), targets,
          Path(args.build_dir) if args.build_dir else None, extra, args.jobs, args.verbose,
          args.only_extra)
    return 0


def cmd_build_check(args) -> int:
    try:
        build_check(parse_archs(args.archs), tuple(args.allow_spill),
                    check_api=not args.no_api)
    except DeepinferError as e:
        if e.exit_code == 0:  # nvcc absent: skip, not fail
            warn(str(e))
            return 0
        raise
    return 0


def register(sub) -> None:
    p = sub.add_parser("build", help="compile the deepinfer_sm80._C extension (needs CUDA torch)")
    _add_build_args(p)
    p.set_defaults(func=cmd_build)
    p = sub.add_parser("build-check", help="per-kernel registers/smem/spills for sm_80/sm_86")
    _add_check_args(p)
    p.set_defaults(func=cmd_build_check)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepinfer.build")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build")
    _add_build_args(p)
    p.set_defaults(func=cmd_build)
    p = sub.add_parser("check")
    _add_check_args(p)
    p.set_defaults(func=cmd_build_check)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DeepinferError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
