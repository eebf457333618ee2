"""Shared memory of Triton kernels compiled ahead of time, against the GPU's per-block limit.

Triton compiles for any target without a GPU, but only its launcher compares a kernel's
``metadata.shared`` with the device's opt-in limit (``cudaDevAttrMaxSharedMemoryPerBlockOptin``)
and raises ``OutOfResources`` at the first launch. A kernel that compiles for sm_86 can
therefore still fail on an RTX 3090 / A6000 (99 KB), and the H200 that runs the GPU tests
(227 KB) never shows it. The AOT compile checks use this module to fail such a kernel on the
CPU, naming its shared memory and the limit."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

#: Opt-in shared memory per block in bytes, by compute capability (major * 10 + minor): what
#: Triton's launcher checks against. A100/A800 163 KB, GA10x / AD10x 99 KB, H100/H200 and
#: B200 227 KB.
SHARED_OPTIN_BYTES = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024,
                      90: 227 * 1024, 100: 227 * 1024}


def over_limit(compiled: Any, cap: int) -> str | None:
    """A message when ``compiled`` (a Triton ``CompiledKernel``) needs more shared memory than
    a capability ``cap`` GPU gives one block, else None (also for capabilities not listed)."""
    limit = SHARED_OPTIN_BYTES.get(int(cap))
    shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    if limit is None or shared <= limit:
        return None
    name = getattr(compiled.metadata, "name", "?")
    return (f"OutOfResources: {name} needs {shared} bytes of shared memory, sm_{cap} gives a "
            f"block {limit}")


@contextlib.contextmanager
def recording() -> Iterator[list[Any]]:
    """Every Triton ``CompiledKernel`` made (compiled or loaded from Triton's cache) while the
    block runs."""
    from triton.compiler import compiler

    made: list[Any] = []
    init = compiler.CompiledKernel.__init__

    def record(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    compiler.CompiledKernel.__init__ = record
    try:
        yield made
    finally:
        compiler.CompiledKernel.__init__ = init
