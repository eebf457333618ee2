"""vLLM's TileLang mHC wrappers as an Ampere GPU runs them, on any CUDA GPU (or imported on
the CPU): the platform reports capability 8.0 (PDL, which needs 9.0, off; every
capability-based dispatch takes its SM80 branch) and ``torch.cuda.get_device_properties``
reports an A100's 108 SMs (the split-k grids). TileLang's own target is the environment's:
``TILELANG_DEFAULT_TARGET`` with ``"arch": "sm_80"`` makes it generate SM80 code
(:func:`target_is_sm80`). Both stand-ins are undone on exit.

The steps are those of the GPU test's fixture (tests/gpu/test_mhc_tilelang_sm80.py ``mhc``).
Used by bench/bench_mhc.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

import torch

import upstream_import

A100_SMS = 108
WRAPPERS = "vllm.model_executor.kernels.mhc.tilelang"
KERNELS = "vllm.model_executor.kernels.mhc.tilelang_kernels"


class _SmCount:
    """torch.cuda device properties with the SM count of the emulated part."""

    def __init__(self, props: Any, sms: int) -> None:
        self._props, self.multi_processor_count = props, sms

    def __getattr__(self, name: str) -> Any:
        return getattr(self._props, name)


def target_is_sm80() -> bool:
    """``TILELANG_DEFAULT_TARGET`` asks for SM80 code generation."""
    return '"arch":"sm_80"' in os.environ.get("TILELANG_DEFAULT_TARGET", "").replace(" ", "")


def require_sm80_target() -> bool:
    """:func:`target_is_sm80`, else say on stderr what to set (the benches then exit 2)."""
    if target_is_sm80():
        return True
    print('set TILELANG_DEFAULT_TARGET={"kind": "cuda", "arch": "sm_80", "code": '
          '["sm_<this device>"]} (scripts/device/tilelang_env.sh)', file=sys.stderr)
    return False


@contextlib.contextmanager
def sm80_mhc(sm_count: int = A100_SMS, tree: str | None = None) -> Iterator[tuple[Any, Any]]:
    """(wrappers module, kernels module) of vLLM's TileLang mHC under a capability-8.0
    platform and ``sm_count`` SMs; restored on exit."""
    upstream_import.prepare(tree, shells=("vllm",))
    import vllm.platforms as platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class Sm80Platform(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(major=8, minor=0)

        @classmethod
        def is_arch_support_pdl(cls) -> bool:  # upstream asks torch for the device's major
            return cls.get_device_capability().major >= 9

    saved = platforms._current_platform
    platforms._current_platform = Sm80Platform()
    real = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda d=None: _SmCount(real(d), sm_count)
    try:
        wrappers = upstream_import.import_upstream(WRAPPERS, tree)
        kernels = upstream_import.import_upstream(KERNELS, tree)
        if kernels.ENABLE_PDL:
            raise RuntimeError("vLLM's mHC kernels enabled PDL under a capability-8.0 platform")
        yield wrappers, kernels
    finally:
        torch.cuda.get_device_properties = real
        platforms._current_platform = saved


def compiled_targets(kernels: Any) -> list[tuple[str, str]]:
    """(kernel name, TileLang target) of every kernel compiled so far."""
    return [(name, str(ck.target)) for name, obj in vars(kernels).items()
            if isinstance(getattr(obj, "_kernel_cache", None), dict)
            for ck in obj._kernel_cache.values()]
