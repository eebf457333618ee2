"""Loads the compiled extension ``deepinfer_sm80._C`` (torch custom ops).

The library registers its ops under ``torch.ops.deepinfer_sm80`` when loaded. It is
looked up, in order, at

1. ``$DEEPINFER_SM80_EXT`` (or ``$DEEPINFER_SM80_LIB``; path to a ``.so``), if set;
2. ``_C*.so`` next to this file (where ``make build`` puts it).

Importing this module loads the library once, or raises ImportError saying how to build
it. ``load()`` does the same and returns the path it loaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

from deepinfer_sm80._ext_paths import candidates as _candidates
from deepinfer_sm80._ext_paths import override as _override

_loaded: Path | None = None


def load() -> Path:
    """Load the extension (idempotent) and return its path."""
    global _loaded
    if _loaded is not None:
        return _loaded
    cands = [p for p in _candidates() if p.is_file()]
    if not cands:
        where = _override() or str(Path(__file__).resolve().parent)
        raise ImportError(
            f"deepinfer_sm80._C is not built (looked in {where}). Build it on a machine "
            "with CUDA and a CUDA build of torch: `make build ARCHS=\"8.0 8.6\"` "
            "(or `make build BUILD_DIR=overlay` for an in-repo build), or point "
            "DEEPINFER_SM80_EXT at a built _C.so."
        )
    try:
        torch.ops.load_library(str(cands[0]))
    except OSError as e:
        raise ImportError(
            f"failed to load {cands[0]}: {e}. The extension must be built against the "
            f"installed torch ({torch.__version__}); rebuild it with `make build`."
        ) from e
    _loaded = cands[0]
    return _loaded


def ops():
    """``torch.ops.deepinfer_sm80`` after loading the extension."""
    load()
    return torch.ops.deepinfer_sm80


load()
