"""Shared set-up of the tests that run Triton kernels under the interpreter on CPU
(TRITON_INTERPRET=1, set by the caller before triton is imported).

Triton 3.6's interpreter converts shape-[1] arrays with ``int()``, which numpy >= 2.4
rejects; ``patch_index`` makes interpreter tensors convert through their first element.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def patch_index() -> None:
    import triton.runtime.interpreter as ti

    orig = ti._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    ti._patch_lang_tensor = patched


def run_interpreted(script: Path, timeout: int) -> str:
    """Run ``script`` (a test file whose ``__main__`` does the work) in a subprocess under the
    interpreter; skip without triton/torch; fail on a non-zero exit. Returns its stdout."""
    import pytest

    pytest.importorskip("triton", reason="triton is not installed (make venv-torch installs it)")
    pytest.importorskip("torch")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
