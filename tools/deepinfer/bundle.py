"""``make gpu-bundle``: one archive for an offline GPU machine (torch + triton installed, no
vLLM, no network) that builds the extension there and runs ``make gpu-test`` and
``make bench``.

Contents (top folder ``deepinfer-gpu-bundle/``):

- ``Makefile``, ``mk/``, ``pyproject.toml``, ``tools/``: the project's own make targets,
  unchanged, plus ``mk/00-bundle.mk`` (``make build`` installs into ``overlay/``);
  ``setup.sh`` points them at the machine's ``python3`` (a ``.venv/bin/python`` wrapper and
  fresh venv stamps), so no virtualenv or index is needed there;
- ``csrc/``, ``overlay/deepinfer_sm80/``, ``tests/``, ``bench/``, ``docs/benchmarks.md``,
  ``scripts/``;
- ``vllm-tree/``: the Python part of the applied vLLM tree (``vllm/**/*.py`` + LICENSE),
  where ``bench/upstream_import.py`` finds upstream's kernels, and the few CUDA sources of
  it that ``tests/vllm_c_ops.py`` builds as SM80 code (``VLLM_CSRC``);
- ``wheelhouse/``: wheels of the few pure-Python packages that importing upstream's kernels
  reaches and a stock GPU image lacks, for the GPU box's Python (default CPython 3.12,
  manylinux x86_64). ``setup.sh`` installs only those whose module is missing, into
  ``.site/`` (``--no-index``);
- ``wheelhouse-vllm/`` (``--vllm-deps``, ``make gpu-bundle VLLM_DEPS=1``): :data:`VLLM_DEPS`
  resolved with their dependencies for the GPU box's Python. ``setup.sh`` installs all of them
  into ``.site-vllm/``, which only the vLLM-level checks put on their path
  (``$DEEPINFER_VLLM_DEPS``; tests/gpu/test_vllm_*_gpu.py: vLLM's own metadata builders into
  the Ampere adapters and this project's CUDA kernels); without it those checks skip;
- ``BUNDLE.json``: versions, sources, the index the wheels came from, sha256 of each wheel.

The wheels are fetched with ``pip download`` through pip's own configuration (the index is
whatever pip is configured to use; no host is named here).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .console import DeepinferError, console
from .patchset import PIN_MODULE_TREE_PATH

REPO = Path(__file__).resolve().parents[2]
TOP = "deepinfer-gpu-bundle"
SIZE_LIMIT = 60 * 10**6
DEFAULT_OUT = REPO / "dist" / "deepinfer-gpu-bundle.tar.gz"

# Package -> module it provides. Measured by importing upstream 0.33.0's cache_utils with
# only the parent packages registered as empty modules (bench/upstream_import.py): of the
# modules that chain reaches, the stock GPU image lacks only these.
WHEELS = {"pyzmq": "zmq"}

# vLLM's Python dependencies that the vLLM-level GPU checks reach (importing the applied tree
# under tests/vllm_cpu_harness.py) and the stock GPU image lacks: the nine of
# REQUIRED_MODULES that their skip message named on the device image (2026-12-03). Bounds are
# pyproject.toml's vllm-cpu-deps (vLLM 0.33.0's requirements/common.txt); a CPU test keeps
# the two in step. Resolved with their dependencies, so the set is the one pip would install.
VLLM_DEPS = ("pydantic>=2.12", "cbor2", "openai-harmony", "openai>=2.25", "pybase64",
             "cachetools", "msgspec", "fastapi>=0.133,<0.137", "partial-json-parser")
# ... and those the same import chain reaches beyond REQUIRED_MODULES (vLLM's structured
# output imports xgrammar, and llguidance through a LazyLoader that a class annotation
# resolves, at module level: found on the device image 2026-12-03), taken
# without their dependencies (xgrammar's include torch and transformers) -> module. setup.sh
# installs one only where the machine lacks the module. apache-tvm-ffi and ml_dtypes are
# xgrammar's, at the versions the CPU suite's venv resolves.
VLLM_DEPS_NO_DEPS = {"xgrammar==0.2.8": "xgrammar", "llguidance>=1.7,<1.8": "llguidance",
                     "apache-tvm-ffi==0.1.11": "tvm_ffi", "ml_dtypes==0.7.0": "ml_dtypes",
                     "uvloop": "uvloop"}

# CUDA sources of the vLLM tree that the GPU tests compile themselves (tests/vllm_c_ops.py:
# vLLM's SWA writer, the hash-layer MoE router, the indexer K gather and the headers they
# include; tests/vllm_c_marlin.py: Marlin; tests/test_vllm_c_build.py keeps the lists in
# step). Every layout of every release the patch sets pin: a file the tree lacks is left out.
VLLM_CSRC = ("csrc/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu", "csrc/type_convert.cuh",
             "csrc/dispatch_utils.h", "csrc/core/cuda_compat.h",
             "csrc/moe/topk_softplus_sqrt_kernels.cu", "csrc/cub_helpers.h",
             "csrc/cache_kernels.cu", "csrc/core/utils.hpp",
             # vLLM 0.34.0 split the router: kernel header, dispatch unit, fp32 instantiations
             "csrc/moe/topk_softplus_sqrt_kernels.cuh", "csrc/moe/topk_softplus_sqrt.cu",
             "csrc/moe/topk_softplus_sqrt_f32_int32.cu",
             "csrc/moe/topk_softplus_sqrt_f32_int64.cu",
             # vLLM's Marlin GEMM and repack, its generator and headers (tests/vllm_c_marlin.py)
             "csrc/quantization/marlin/marlin.cu", "csrc/quantization/marlin/gptq_marlin_repack.cu",
             "csrc/quantization/marlin/generate_kernels.py", "csrc/quantization/marlin/kernel.h",
             "csrc/quantization/marlin/marlin.cuh", "csrc/quantization/marlin/marlin_dtypes.cuh",
             "csrc/quantization/marlin/marlin_template.h", "csrc/quantization/marlin/dequant.h",
             "csrc/quantization/marlin/marlin_mma.h", "csrc/core/scalar_type.hpp",
             "csrc/torch_bindings.cpp",
             # vLLM's Marlin MoE GEMM (tests/vllm_c_marlin.py, family "moe")
             "csrc/moe/marlin_moe_wna16/ops.cu", "csrc/moe/marlin_moe_wna16/kernel.h",
             "csrc/moe/marlin_moe_wna16/marlin_template.h", "csrc/moe/torch_bindings.cpp",
             # the activation and the expert grouping between the experts' GEMMs
             "csrc/activation_kernels.cu", "csrc/async_util.cuh", "csrc/cuda_vec_utils.cuh",
             "csrc/moe/moe_align_sum_kernels.cu", "csrc/quantization/vectorization.cuh")

# Project paths copied into the bundle (relative to the repo root), and what to skip.
PROJECT_PATHS = ["Makefile", "mk", "pyproject.toml", "tools/deepinfer", "csrc",
                 "overlay/deepinfer_sm80", "tests", "bench", "scripts", "docs/benchmarks.md"]
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".git", "build", "results_tmp"}
SKIP_SUFFIXES = {".pyc", ".so", ".o", ".whl"}

SETUP_SH = r"""#!/usr/bin/env bash
# Prepare this unpacked bundle on an offline GPU machine: install the wheels whose module
# is missing into .site/, and point the project's make targets at this machine's python.
#   PYTHON=python3 ./setup.sh && make build && make gpu-test && make bench
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import torch, triton' || {
  echo "setup.sh: $PYTHON needs torch and triton (the bundle does not ship them)" >&2; exit 1; }
mkdir -p .site .venv/bin
# missing_wheels LIST DIR: the wheels named in LIST ("wheel module" lines) whose module
# this machine cannot import, as DIR/wheel paths in the array `missing`
missing_wheels() {
  missing=()
  while read -r whl mod; do
    [ -n "$whl" ] || continue
    if PYTHONPATH=.site "$PYTHON" -c "import $mod" 2>/dev/null; then
      echo "setup.sh: $mod already importable, skipping $whl"
    else
      missing+=("$2/$whl")
    fi
  done < "$1"
}
missing_wheels wheelhouse/MODULES wheelhouse
if [ ${#missing[@]} -gt 0 ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target .site "${missing[@]}"
  echo "setup.sh: installed ${missing[*]} into .site/"
fi
here=$(pwd)
vllm_deps=""
if [ -d wheelhouse-vllm ]; then
  # the whole resolved set, apart from the machine's packages: only the vLLM-level checks'
  # subprocesses put it on their path ($DEEPINFER_VLLM_DEPS)
  rm -rf .site-vllm
  missing_wheels wheelhouse-vllm/MODULES wheelhouse-vllm/no-deps
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target .site-vllm \
    wheelhouse-vllm/*.whl "${missing[@]}"
  echo "setup.sh: vLLM's Python dependencies installed into .site-vllm/"
  vllm_deps="DEEPINFER_VLLM_DEPS=$here/.site-vllm; export DEEPINFER_VLLM_DEPS"
fi
py=$(command -v "$PYTHON")
cat > .venv/bin/python <<EOF
#!/bin/sh
$vllm_deps
PYTHONPATH="$here/.site:$here/tools:$here/overlay\${PYTHONPATH:+:\$PYTHONPATH}" exec "$py" "\$@"
EOF
chmod +x .venv/bin/python
touch .venv/.stamp-tool .venv/.stamp-torch
export DEEPINFER_VLLM_TREE="$here/vllm-tree"
.venv/bin/python bench/upstream_import.py --tree "$here/vllm-tree" || true
echo "setup.sh: ready (make build | gpu-test | bench)"
"""

BUNDLE_MK = """# GPU bundle only (written by tools/deepinfer/bundle.py; read before the other mk/*.mk):
# the bundle has no applied vLLM tree, so `make build` installs the extension into
# overlay/deepinfer_sm80/, where the tests and benchmarks load it.
BUILD_DIR ?= overlay
"""

README = """# DeepInfer-SM80 GPU bundle

For an offline machine with an NVIDIA GPU, CUDA's nvcc, and a python3 that has torch and
triton (no vLLM, no network needed):

    tar xzf deepinfer-gpu-bundle.tar.gz && cd deepinfer-gpu-bundle
    ./setup.sh            # installs missing wheels from wheelhouse/ into .site/
    make build            # the extension, for the GPU at hand (ARCHS="8.0 8.6" etc.)
    make gpu-test         # GPU tests
    make bench            # benchmarks -> bench/results/*.json, docs/benchmarks.md

`vllm-tree/` holds the Python files of the applied vLLM tree; upstream's kernels are
imported from there as baselines. BUNDLE.json says what went in.
"""


def _pip_index() -> str:
    """The index pip is configured to use (pip's built-in default if none is set)."""
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], text=True,
                             capture_output=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, val = line.partition("=")
        if key.strip().endswith("index-url") and not key.strip().endswith("extra-index-url"):
            return val.strip().strip("'\"")
    try:
        from pip._internal.models.index import PyPI  # type: ignore[import-not-found]

        return PyPI.simple_url
    except Exception:  # pip internals moved: say so rather than guess a host
        return "(pip's default index)"


def download_wheels(dest: Path, specs: dict[str, str], python_version: str, platforms: list[str],
                    *, deps: bool = False) -> list[Path]:
    """``pip download --only-binary=:all:`` each spec for the target Python; ``--no-deps``
    unless ``deps`` (then the resolved set with every dependency)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", *([] if deps else ["--no-deps"]),
           "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
           "-d", str(dest)]
    for p in platforms:
        cmd += ["--platform", p]
    cmd += list(specs)
    proc = subprocess.run(cmd, text=True, capture_output=True)
    if proc.returncode != 0:
        raise DeepinferError(
            f"pip download failed for {', '.join(specs)}",
            hint="check pip's index configuration (`pip config list`) and network access, "
                 "or pass --wheelhouse DIR with the wheels already downloaded",
            details=proc.stderr.strip().splitlines()[-8:])
    wheels = sorted(dest.glob("*.whl"))
    for spec in specs:
        base = _dist_name(spec)
        if not any(w.name.lower().startswith(base + "-") for w in wheels):
            raise DeepinferError(f"no wheel for {spec} in {dest} after pip download")
    return wheels


def _dist_name(spec: str) -> str:
    """Normalised distribution name of a requirement spec (as wheel file names spell it)."""
    return re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].strip().lower().replace("-", "_")


def _with_modules(wheels: list[Path], specs: dict[str, str]) -> list[tuple[Path, str]]:
    """(wheel, module) for each wheel, the module from the spec of its distribution."""
    by_dist = {_dist_name(spec): mod for spec, mod in specs.items()}
    out = []
    for w in wheels:
        mod = by_dist.get(w.name.split("-")[0].lower())
        if mod is None:
            raise DeepinferError(f"unexpected wheel {w.name}: not one of {sorted(specs)}")
        out.append((w, mod))
    return out


def _add_tree(tar: tarfile.TarFile, src: Path, arc: str, only_py: bool = False) -> int:
    n = 0
    if src.is_file():
        tar.add(src, arcname=arc, recursive=False)
        return 1
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for f in sorted(files):
            p = Path(root) / f
            if p.suffix in SKIP_SUFFIXES or (only_py and p.suffix != ".py"):
                continue
            tar.add(p, arcname=f"{arc}/{p.relative_to(src).as_posix()}", recursive=False)
            n += 1
    return n


def _add_bytes(tar: tarfile.TarFile, arc: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(arc)
    info.size = len(data)
    info.mode = mode
    info.mtime = int(_dt.datetime.now().timestamp())
    tar.addfile(info, io.BytesIO(data))


def _git_head() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], text=True,
                              capture_output=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _tree_version(tree: Path) -> str:
    """``<version> (<commit id>)`` from the tree's ``vllm/_version.py``, as it says; and the
    patch set applied to it, from the generated pin module, when there is one."""
    def field(path: Path, name: str) -> str:
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        # `name = 'x'`, `name: str = 'x'` or `name = alias = 'x'`, on one line
        m = re.search(rf"^{name}\b[^=\n]*=[ \t]*(?:\w+[ \t]*=[ \t]*)?['\"]([^'\"]*)['\"]",
                      text, re.M)
        return m.group(1) if m else "?"

    version_py = tree / "vllm" / "_version.py"
    out = f"{field(version_py, '__version__')} ({field(version_py, '__commit_id__')})"
    pin_py = tree / PIN_MODULE_TREE_PATH
    if pin_py.is_file():
        out += f", patch set vllm-{field(pin_py, 'PINNED_VLLM_VERSION')}"
    return out


def build_bundle(tree: Path, out: Path = DEFAULT_OUT, *, wheelhouse: Path | None = None,
                 python_version: str = "3.12",
                 platforms: list[str] | None = None, vllm_deps: bool = False,
                 vllm_deps_wheelhouse: Path | None = None) -> dict:
    """Write the archive; returns the manifest (also stored as BUNDLE.json inside)."""
    tree = tree.resolve()
    if not (tree / "vllm" / "__init__.py").is_file():
        raise DeepinferError(f"{tree} is not a vLLM source tree (no vllm/__init__.py)",
                             hint="run `make apply` first, or pass TREE=<unpacked vLLM sdist>")
    # glibc 2.31 and newer (Ubuntu 20.04 on; the device image is 24.04): llguidance 1.7's
    # only Linux wheel is manylinux_2_31
    platforms = platforms or ["manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
                              "manylinux_2_27_x86_64",
                              "manylinux_2_26_x86_64", "manylinux_2_17_x86_64",
                              "manylinux2014_x86_64"]
    with tempfile.TemporaryDirectory(prefix="deepinfer-bundle-") as tmp:
        if wheelhouse is None:
            wheels = download_wheels(Path(tmp) / "wh", dict.fromkeys(WHEELS, ""), python_version,
                                     platforms)
            index = _pip_index()
        else:
            wheels = sorted(Path(wheelhouse).glob("*.whl"))
            index = f"local folder {wheelhouse}"
        modules = []
        for w in wheels:
            dist = w.name.split("-")[0].lower().replace("_", "-")
            mod = WHEELS.get(dist)
            if mod is None:
                raise DeepinferError(f"unexpected wheel {w.name}: not one of {sorted(WHEELS)}")
            modules.append((w.name, mod))
        vllm_wheels: list[Path] = []
        vllm_extra: list[tuple[Path, str]] = []  # (wheel, module), no dependencies
        if vllm_deps_wheelhouse is not None:
            vllm_wheels = sorted(Path(vllm_deps_wheelhouse).glob("*.whl"))
            if not vllm_wheels:
                raise DeepinferError(f"no wheels in {vllm_deps_wheelhouse}")
            vllm_extra = _with_modules(sorted(Path(vllm_deps_wheelhouse).glob("no-deps/*.whl")),
                                       VLLM_DEPS_NO_DEPS)
        elif vllm_deps:
            vllm_wheels = download_wheels(Path(tmp) / "wh-vllm", dict.fromkeys(VLLM_DEPS, ""),
                                          python_version, platforms, deps=True)
            vllm_extra = _with_modules(
                download_wheels(Path(tmp) / "wh-vllm-nodeps", dict(VLLM_DEPS_NO_DEPS),
                                python_version, platforms), VLLM_DEPS_NO_DEPS)
        manifest = {
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "repo_commit": _git_head(),
            "vllm_tree": str(tree),
            "vllm_tree_applied": (tree / ".git").exists(),
            "vllm_version": _tree_version(tree),
            "target_python": python_version, "platforms": platforms, "index": index,
            "wheels": {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels},
            "vllm_deps_wheels": {w.name: hashlib.sha256(w.read_bytes()).hexdigest()
                                 for w in vllm_wheels + [w for w, _ in vllm_extra]},
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_suffix(out.suffix + ".part")
        with tarfile.open(part, "w:gz", compresslevel=9) as tar:
            for rel in PROJECT_PATHS:
                src = REPO / rel
                if src.exists():
                    _add_tree(tar, src, f"{TOP}/{rel}")
            nvllm = _add_tree(tar, tree / "vllm", f"{TOP}/vllm-tree/vllm", only_py=True)
            for rel in VLLM_CSRC:
                if (tree / rel).is_file():
                    tar.add(tree / rel, arcname=f"{TOP}/vllm-tree/{rel}")
            if (tree / "LICENSE").is_file():
                tar.add(tree / "LICENSE", arcname=f"{TOP}/vllm-tree/LICENSE")
            for w in wheels:
                tar.add(w, arcname=f"{TOP}/wheelhouse/{w.name}")
            for w in vllm_wheels:
                tar.add(w, arcname=f"{TOP}/wheelhouse-vllm/{w.name}")
            for w, _ in vllm_extra:
                tar.add(w, arcname=f"{TOP}/wheelhouse-vllm/no-deps/{w.name}")
            if vllm_wheels:
                _add_bytes(tar, f"{TOP}/wheelhouse-vllm/MODULES",
                           "".join(f"{w.name} {m}\n" for w, m in vllm_extra).encode())
            _add_bytes(tar, f"{TOP}/wheelhouse/MODULES",
                       "".join(f"{w} {m}\n" for w, m in modules).encode())
            _add_bytes(tar, f"{TOP}/setup.sh", SETUP_SH.encode(), 0o755)
            _add_bytes(tar, f"{TOP}/mk/00-bundle.mk", BUNDLE_MK.encode())
            _add_bytes(tar, f"{TOP}/README-bundle.md", README.encode())
            manifest["vllm_py_files"] = nvllm
            _add_bytes(tar, f"{TOP}/BUNDLE.json", (json.dumps(manifest, indent=1) + "\n").encode())
        size = part.stat().st_size
        if size >= SIZE_LIMIT:
            part.unlink()
            raise DeepinferError(f"bundle would be {size / 1e6:.1f} MB, over the 60 MB limit")
        shutil.move(part, out)
        manifest["size_bytes"] = size
        manifest["path"] = str(out)
        return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deepinfer.bundle", description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", default=os.environ.get("VLLM", "0.33.0"))
    ap.add_argument("--tree", help="vLLM source tree (default build/vllm-<version>)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--wheelhouse", help="use these wheels instead of pip download")
    ap.add_argument("--python-version", default="3.12", help="the GPU box's Python (default 3.12)")
    ap.add_argument("--vllm-deps", action="store_true",
                    help="add wheelhouse-vllm/: vLLM's Python dependencies for the vLLM-level "
                         "GPU checks (VLLM_DEPS, resolved with their dependencies)")
    ap.add_argument("--vllm-deps-wheelhouse", help="take those wheels from this folder")
    args = ap.parse_args(argv)
    tree = Path(args.tree) if args.tree else REPO / "build" / f"vllm-{args.vllm}"
    try:
        m = build_bundle(tree, Path(args.out), python_version=args.python_version,
                         wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None,
                         vllm_deps=args.vllm_deps,
                         vllm_deps_wheelhouse=(Path(args.vllm_deps_wheelhouse)
                                               if args.vllm_deps_wheelhouse else None))
    except DeepinferError as e:
        from .console import report_error

        report_error(e)
        return e.exit_code
    console.print(f"gpu-bundle: {m['path']} ({m['size_bytes'] / 1e6:.1f} MB; "
                  f"{m['vllm_py_files']} vLLM .py files from {m['vllm_tree']}; "
                  f"wheels: {', '.join(m['wheels']) or 'none'}"
                  + (f"; {len(m['vllm_deps_wheels'])} vLLM dependency wheels"
                     if m["vllm_deps_wheels"] else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
