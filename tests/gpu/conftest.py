"""GPU test setup: every test here needs a CUDA device and skips (with the reason) when
there is none. The `ext` fixture loads the built extension `deepinfer_sm80._C`
($DEEPINFER_SM80_EXT / $DEEPINFER_SM80_LIB or overlay/deepinfer_sm80/_C*.so); on a CUDA
machine a missing build is an error, not a skip."""
import os

import pytest

try:
    import torch

    _HAVE_CUDA = torch.cuda.is_available()
    _WHY = "needs a CUDA GPU (torch.cuda.is_available() is False)"
except ImportError:  # pragma: no cover
    _HAVE_CUDA = False
    _WHY = "needs torch with CUDA (torch is not installed)"


def pytest_collection_modifyitems(config, items):
    if _HAVE_CUDA:
        return
    skip = pytest.mark.skip(reason=_WHY)
    for item in items:
        if "/tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ext():
    """torch.ops.deepinfer_sm80 with the extension loaded."""
    if not _HAVE_CUDA:
        pytest.skip(_WHY)
    from deepinfer_sm80 import _ext

    _ext.load()
    return torch.ops.deepinfer_sm80


@pytest.fixture
def rng():
    """A CPU generator on a fresh random seed, printed so that a failure can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return torch.Generator(device="cpu").manual_seed(seed)
