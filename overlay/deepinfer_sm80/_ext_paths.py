"""Where the compiled extension ``deepinfer_sm80._C`` is looked up (no import of torch, nothing
loaded): ``$DEEPINFER_SM80_EXT`` (or ``$DEEPINFER_SM80_LIB``), else ``_C*.so`` next to this file,
where ``make build`` puts it."""

from __future__ import annotations

import os
from pathlib import Path


def override() -> str | None:
    """The path the environment names, if any."""
    return os.environ.get("DEEPINFER_SM80_EXT") or os.environ.get("DEEPINFER_SM80_LIB")


def candidates() -> list[Path]:
    env = override()
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    return sorted(here.glob("_C*.so"))
