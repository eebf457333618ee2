"""Puts the checkout's (or GPU bundle's) ``overlay/`` and ``bench/`` on ``sys.path``.

Every benchmark script imports it first, so that it runs as ``python bench/NAME.py`` without
installing anything: ``deepinfer_sm80`` (the op API and the built extension) comes from
``overlay/``, the shared harness (``common``, ``upstream_import``) and the other scripts from
``bench/``. ``import _paths  # noqa: F401`` itself finds this file because Python puts the
running script's folder (``bench/``) first on the path.
"""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OVERLAY = REPO / "overlay"

for _p in (str(BENCH), str(OVERLAY)):
    if _p not in sys.path:
        sys.path.insert(0, _p)
