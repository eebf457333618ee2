"""Shared pytest setup: every test imports the tool (`tools/`) and the kernel package
(`overlay/`) straight from the checkout, installed or not."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _sub in ("tools", "overlay"):
    _p = str(ROOT / _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)
