"""Shared pytest setup: every test imports the tool (`tools/`) and the kernel package
(`overlay/`) straight from the checkout, installed or not, and the helper modules in
`tests/` (such as `vllm_c_ops`) from any test folder."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _sub in ("tools", "overlay", "tests"):
    _p = str(ROOT / _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)
