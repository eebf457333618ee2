"""The portable Triton kernels must compile for SM80 and SM86 (CPU-only check).

Triton compiles ahead of time for any target without a GPU, so this runs in CI. A control
kernel that uses ``tl.float8e4nv`` (what upstream's gather does) must fail for 80/86 and
compile for 90: that proves the check really targets Ampere.
"""

import pathlib
import sys

import pytest

_OVERLAY = pathlib.Path(__file__).resolve().parents[1] / "overlay"
if str(_OVERLAY) not in sys.path:
    sys.path.insert(0, str(_OVERLAY))

triton = pytest.importorskip("triton", reason="triton is not installed (make venv-torch installs it)")
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from deepinfer_sm80.triton_portable import gather  # noqa: E402

AMPERE = [80, 86]


@triton.jit
def _fp8e4nv_control(x_ptr, y_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + o)
    tl.store(y_ptr + o, x.to(tl.float8e4nv, bitcast=True).to(tl.float32))


def _compile(src, cap):
    return triton.compile(src, target=GPUTarget("cuda", cap, 32))


@pytest.mark.parametrize("cap", AMPERE)
@pytest.mark.parametrize("block_size", [64, 2, 256])
def test_portable_gather_compiles_for_ampere(cap, block_size):
    srcs = gather.aot_sources(block_size=block_size)
    assert len(srcs) == 2  # with and without gather_lens
    for src in srcs:
        compiled = _compile(src, cap)
        ptx = compiled.asm["ptx"]
        assert f".target sm_{cap}" in ptx
        assert len(compiled.asm["cubin"]) > 0
        # software decode: no FP8 conversion instruction may appear
        assert "e4m3" not in ptx and "e5m2" not in ptx
        # the kernel reads the cache and writes bf16 rows
        assert "ld.global" in ptx and "st.global" in ptx


@pytest.mark.parametrize("cap", AMPERE)
def test_control_fp8e4nv_fails_on_ampere(cap):
    src = ASTSource(fn=_fp8e4nv_control, signature={"x_ptr": "*u8", "y_ptr": "*fp32", "BLOCK": "constexpr"},
                    constexprs={"BLOCK": 128})
    with pytest.raises(Exception, match="fp8e4nv"):
        _compile(src, cap)


def test_control_fp8e4nv_compiles_on_hopper():
    src = ASTSource(fn=_fp8e4nv_control, signature={"x_ptr": "*u8", "y_ptr": "*fp32", "BLOCK": "constexpr"},
                    constexprs={"BLOCK": 128})
    assert len(_compile(src, 90).asm["cubin"]) > 0
