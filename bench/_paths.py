"""Puts the checkout's (or GPU bundle's) ``overlay/`` on ``sys.path``.

Every benchmark script imports it first, so that it runs as ``python bench/NAME.py`` without
installing anything: ``deepinfer_sm80`` (the op API and the built extension) comes from
``overlay/``. The shared harness (``common``, ``upstream_import``) and the other scripts need
nothing: Python puts the running script's folder, ``bench/``, first on the path, which is also
how ``import _paths  # noqa: F401`` finds this file.
"""
from __future__ import annotations

import sys
from pathlib import Path

_OVERLAY = str(Path(__file__).resolve().parents[1] / "overlay")
if _OVERLAY not in sys.path:
    sys.path.insert(0, _OVERLAY)


def add_tests() -> None:
    """Also put ``tests/`` on ``sys.path``: for the scripts that drive vLLM's own Python
    through the vLLM-level check modules there (``tests/vllm_marlin_check.py``)."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
