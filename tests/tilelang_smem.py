"""Shared memory of TileLang kernels compiled ahead of time, against the GPU's per-block limit.

TileLang (vLLM's mHC kernels) compiles for any architecture without a GPU and never compares
a kernel's shared memory with the part's: its ``tvm_ffi`` host launcher sets the dynamic size
at launch (``cudaFuncSetAttribute``), so a kernel that compiles for sm_86 can still fail at its
first launch on an RTX 3090 / A6000 (99 KB a block), and the H200 that runs the GPU tests
(227 KB) never shows it. This module reads what the launcher will ask for from the lowered
device module: each device function's ``dyn_shared_memory_buf`` attribute, plus its static
``shared``-scope buffers. A ``JITKernel`` compiled in this process keeps that module
(``artifact.device_mod``); one loaded from TileLang's disk cache does not, and its ``prim_func``
is lowered again (TileLang's ``lower``, no nvcc: about 6 s per mHC kernel on CI's cores). The
limits are those of ``tests/triton_smem.py``."""
from __future__ import annotations

import math
from typing import Any

from triton_smem import SHARED_OPTIN_BYTES


def _static_shared(func: Any) -> int:
    """Bytes of a lowered device function's ``shared``-scope buffers (``shared.dyn`` is
    counted by the function's attribute)."""
    import tvm.tirx as tirx

    total = 0

    def visit(node: Any) -> None:
        nonlocal total
        if isinstance(node, tirx.AllocBuffer) and node.buffer.scope() == "shared":
            buf = node.buffer
            elems = math.prod(int(x) for x in buf.shape)
            total += elems * (buf.dtype.bits * buf.dtype.lanes) // 8

    tirx.stmt_functor.post_order_visit(func.body, visit)
    return total


def lowered_device_mod(prim_func: Any, target: Any) -> Any:
    """The device module of ``prim_func`` lowered for ``target`` (a TVM target or TileLang's
    target dict)."""
    import tvm
    from tilelang.engine.lower import lower

    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    with tgt:
        return lower(prim_func, target=tgt).device_mod


def shared_bytes(prim_func: Any, target: Any) -> dict[str, int]:
    """Per device function of ``prim_func`` lowered for ``target``: the bytes of shared
    memory one block takes, dynamic plus static."""
    return device_shared_bytes(lowered_device_mod(prim_func, target))


def kernel_shared_bytes(kernel: Any) -> dict[str, int]:
    """:func:`shared_bytes` of a compiled ``JITKernel``: from the device module its compile
    kept, else by lowering its ``prim_func`` again (a kernel from the disk cache)."""
    device_mod = getattr(getattr(kernel, "artifact", None), "device_mod", None)
    if device_mod is None:
        device_mod = lowered_device_mod(kernel.prim_func, kernel.target)
    return device_shared_bytes(device_mod)


def device_shared_bytes(device_mod: Any) -> dict[str, int]:
    """Per function of a lowered device module: dynamic plus static shared bytes."""
    out: dict[str, int] = {}
    for gv, func in device_mod.functions.items():
        attrs = dict(func.attrs) if func.attrs is not None else {}
        dyn = int(attrs.get("dyn_shared_memory_buf", 0))
        out[gv.name_hint] = dyn + _static_shared(func)
    return out


def over_limit(name: str, shared: int, cap: int) -> str | None:
    """A message when ``shared`` bytes exceed what a capability ``cap`` GPU gives one block,
    else None (also for capabilities not listed)."""
    limit = SHARED_OPTIN_BYTES.get(int(cap))
    if limit is None or shared <= limit:
        return None
    return (f"too much shared memory: {name} needs {shared} bytes, sm_{cap} gives a block "
            f"{limit} (the launch would fail)")
