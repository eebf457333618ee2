"""Import upstream vLLM kernels (Triton/Python) from a source tree, without vLLM installed.

Used on an offline GPU box (torch + triton, no vLLM, no network) to run upstream's kernels
as baselines in the same process as ours. Steps (see shared offline-gpu-notes):

1. the tree's root (the folder holding ``vllm/``) goes on ``sys.path``;
2. a minimal ``vllm-<version>.dist-info/METADATA`` goes on ``sys.path`` (vLLM reads its
   own distribution version; without it platform detection fails and Triton is disabled);
3. ``vllm._C_stable_libtorch`` (compiled, imported by ``vllm/platforms/cuda.py``) is
   registered as an empty module when no real one is importable;
4. the parent packages of the requested module are registered as empty packages whose
   ``__path__`` points at their folders, so their ``__init__.py`` (which pull in
   quantization/MoE modules calling compiled ops) are not executed.

Whatever the import chain still needs beyond that must be installed; the GPU bundle ships
those few packages as wheels (``tools/deepinfer/bundle.py``). A missing one produces an
error naming the package.

The tree is, in order: the ``tree`` argument, ``$DEEPINFER_VLLM_TREE``, the applied tree
``build/vllm-<version>`` of this checkout, ``vllm-tree/`` next to this folder (GPU bundle).

CLI (a diagnostic for GPU boxes): ``python bench/upstream_import.py [--tree DIR]
[--module NAME ...]`` prints what imported and from where.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
import tempfile
import types
from pathlib import Path

# The patch set whose applied tree is looked for: $VLLM (the Makefile exports it, so
# `make bench VLLM=0.34.0` finds build/vllm-0.34.0), else the pin.
DEFAULT_VERSION = os.environ.get("VLLM") or "0.33.0"
CACHE_UTILS = "vllm.models.deepseek_v4.common.ops.cache_utils"

_REPO = Path(__file__).resolve().parents[1]

# dependency module -> distribution to install, for the error message
_DIST_OF = {"zmq": "pyzmq", "yaml": "pyyaml", "google": "protobuf", "cbor2": "cbor2"}


class UpstreamImportError(RuntimeError):
    """Upstream's module could not be imported; the message says what to do."""


def candidate_trees(version: str = DEFAULT_VERSION) -> list[Path]:
    out = []
    env = os.environ.get("DEEPINFER_VLLM_TREE")
    if env:
        out.append(Path(env))
    out.append(_REPO / "build" / f"vllm-{version}")
    out.append(_REPO / "vllm-tree")
    return out


def find_tree(tree: str | os.PathLike | None = None, version: str = DEFAULT_VERSION) -> Path:
    """The vLLM source tree to import from (a folder that holds ``vllm/``)."""
    cands = [Path(tree)] if tree is not None else candidate_trees(version)
    for cand in cands:
        if (cand / "vllm" / "__init__.py").is_file():
            return cand.resolve()
    tried = ", ".join(str(c) for c in cands)
    raise UpstreamImportError(
        f"no vLLM source tree found (tried: {tried}). Run `make apply` to create "
        f"build/vllm-{version}, or point DEEPINFER_VLLM_TREE at an unpacked vLLM sdist.")


def tree_version(tree: Path) -> str | None:
    """The version written in the tree's ``vllm/_version.py`` (sdists carry it)."""
    vf = tree / "vllm" / "_version.py"
    if vf.is_file():
        m = re.search(r"""^__version__\s*=\s*version\s*=\s*['"]([^'"]+)['"]""",
                      vf.read_text(), re.M)
        if m:
            return m.group(1)
    return None


def _ensure_dist_info(version: str) -> Path:
    """Put a minimal ``vllm-<version>.dist-info`` on ``sys.path`` (once per process)."""
    for entry in sys.path:
        if (Path(entry) / f"vllm-{version}.dist-info" / "METADATA").is_file():
            return Path(entry)
    root = Path(tempfile.mkdtemp(prefix="deepinfer-vllm-meta-"))
    info = root / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    sys.path.insert(0, str(root))
    return root


def _register_shell(name: str, tree: Path) -> None:
    """Register package ``name`` as an empty module whose ``__path__`` is its folder."""
    existing = sys.modules.get(name)
    if existing is not None:
        return
    folder = tree / Path(*name.split("."))
    if not folder.is_dir():
        raise UpstreamImportError(f"{folder} is missing: is {tree} a vLLM source tree?")
    mod = types.ModuleType(name)
    mod.__path__ = [str(folder)]  # type: ignore[attr-defined]
    mod.__package__ = name
    mod.__file__ = None
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)


def _register_empty_extension(name: str) -> bool:
    """Register an empty module for a compiled vLLM extension unless a real one exists."""
    if name in sys.modules:
        return False
    parent, _, child = name.rpartition(".")
    try:
        if importlib.util.find_spec(name) is not None:
            return False
    except (ImportError, ValueError):
        pass
    mod = types.ModuleType(name)
    mod.__file__ = None
    sys.modules[name] = mod
    if parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return True


def prepare(tree: str | os.PathLike | None = None, version: str | None = None,
            shells: tuple[str, ...] = ("vllm",)) -> Path:
    """Make ``import vllm.<...>`` resolve to the tree without running the shells'
    ``__init__``. Returns the tree."""
    root = find_tree(tree, version or DEFAULT_VERSION)
    ver = version or tree_version(root) or DEFAULT_VERSION
    loaded = sys.modules.get("vllm")
    if loaded is not None:
        where = getattr(loaded, "__path__", [None])[0]
        if where and Path(where).resolve() != (root / "vllm").resolve():
            raise UpstreamImportError(
                f"a different vllm is already imported from {where}; import upstream "
                f"from {root} in a fresh process")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    _ensure_dist_info(ver)
    for name in shells:
        _register_shell(name, root)
    _register_empty_extension("vllm._C_stable_libtorch")
    return root


def import_upstream(module: str = CACHE_UTILS, tree: str | os.PathLike | None = None,
                    version: str | None = None) -> types.ModuleType:
    """Import ``module`` (e.g. upstream's ``cache_utils``) from the vLLM source tree.

    Every parent package of ``module`` is registered as an empty package first."""
    parts = module.split(".")
    if parts[0] != "vllm" or len(parts) < 2:
        raise UpstreamImportError(f"expected a module inside vllm, got {module!r}")
    shells = tuple(".".join(parts[:i]) for i in range(1, len(parts)))
    root = prepare(tree, version, shells)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = (e.name or "?").split(".")[0]
        if missing == "vllm":
            raise UpstreamImportError(f"{module} not found in {root}: {e}") from e
        dist = _DIST_OF.get(missing, missing)
        raise UpstreamImportError(
            f"importing upstream {module} from {root} needs the Python package "
            f"'{dist}' (module '{missing}'), which is not installed. On an offline GPU box "
            f"run the unpacked GPU bundle's `./setup.sh` (installs its wheelhouse), or "
            f"`pip install {dist}` where an index is reachable.") from e
    origin = Path(getattr(mod, "__file__", "") or "")
    if root not in origin.resolve().parents:
        raise UpstreamImportError(f"{module} was imported from {origin}, not from {root}")
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", help="vLLM source tree (folder holding vllm/)")
    ap.add_argument("--module", action="append", help=f"module to import (default {CACHE_UTILS})")
    args = ap.parse_args(argv)
    rc = 0
    for name in args.module or [CACHE_UTILS]:
        try:
            mod = import_upstream(name, args.tree)
        except UpstreamImportError as e:
            print(f"FAIL {name}: {e}")
            rc = 1
            continue
        print(f"OK   {name} <- {mod.__file__}")
    try:
        from vllm.triton_utils import HAS_TRITON  # type: ignore[import-not-found]
        print(f"vllm.triton_utils.HAS_TRITON = {HAS_TRITON}")
    except Exception as e:  # diagnostic only
        print(f"vllm.triton_utils not importable: {e!r}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
