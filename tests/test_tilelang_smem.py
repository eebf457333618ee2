"""The shared-memory check of the TileLang AOT compiles (``tests/tilelang_smem.py``) can fail:
a kernel with a 128 KB dynamic tile and a 1 KB static buffer fits an A100's 163 KB block and
not an A6000's / RTX 3090's 99 KB, which TileLang itself never checks (its host launcher asks
for the memory at the first launch). Lowering only: no nvcc, no GPU."""

import pytest

pytest.importorskip("tilelang", reason="tilelang is not installed (vLLM 0.33.0 pins 0.1.12; "
                    "`pip install -e '.[vllm-cpu-deps]'` installs it)")
import tilelang.language as T  # noqa: E402

import tilelang_smem  # noqa: E402


def _wide_copy(rows: int, cols: int):
    shape, dtype = (rows * 8, cols), "float16"

    @T.prim_func
    def wide_copy(A: T.Tensor(shape, dtype), B: T.Tensor(shape, dtype)):
        with T.Kernel(8, threads=128) as bx:
            tile = T.alloc_shared((rows, cols), "float16")
            red = T.alloc_buffer((256,), "float32", scope="shared")
            for i in T.Parallel(256):
                red[i] = 0.0
            T.copy(A[bx * rows, 0], tile)
            T.copy(tile, B[bx * rows, 0])

    return wide_copy


@pytest.mark.parametrize("arch", ["sm_80", "sm_86"])
def test_a_kernel_over_sm86s_block_limit_fails_there_and_fits_sm80(arch):
    got = tilelang_smem.shared_bytes(_wide_copy(128, 512), {"kind": "cuda", "arch": arch})
    (name, shared), = got.items()
    assert shared == 128 * 512 * 2 + 256 * 4, got  # the dynamic tile and the static buffer
    cap = int(arch[3:])
    msg = tilelang_smem.over_limit(name, shared, cap)
    if cap == 86:
        assert msg and name in msg and str(shared) in msg and "101376" in msg
    else:
        assert msg is None
    assert tilelang_smem.over_limit(name, shared, 75) is None  # no limit known: not judged


def test_a_small_kernel_fits_both():
    got = tilelang_smem.shared_bytes(_wide_copy(16, 64), {"kind": "cuda", "arch": "sm_86"})
    (name, shared), = got.items()
    assert shared == 16 * 64 * 2 + 256 * 4
    assert tilelang_smem.over_limit(name, shared, 86) is None


def test_a_compiled_kernel_reads_the_same_with_and_without_its_kept_module():
    """``kernel_shared_bytes`` takes the device module a fresh compile kept, and lowers the
    ``prim_func`` again for a kernel from TileLang's disk cache (which keeps none): the same
    bytes either way."""
    import types

    target = {"kind": "cuda", "arch": "sm_86"}
    func = _wide_copy(128, 512)
    kept = tilelang_smem.lowered_device_mod(func, target)
    fresh = types.SimpleNamespace(artifact=types.SimpleNamespace(device_mod=kept),
                                  prim_func=None, target=None)  # must not be lowered again
    cached = types.SimpleNamespace(artifact=types.SimpleNamespace(device_mod=None),
                                   prim_func=func, target=target)
    want = tilelang_smem.shared_bytes(func, target)
    assert tilelang_smem.kernel_shared_bytes(fresh) == want
    assert tilelang_smem.kernel_shared_bytes(cached) == want
    assert list(want.values()) == [128 * 512 * 2 + 256 * 4]
