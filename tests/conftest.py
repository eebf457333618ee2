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

# The drift and rebase tests' synthetic-upstream fixture, for every test module.
from test_drift_synth import synth  # noqa: E402,F401


def pytest_collection_modifyitems(session, config, items):
    """Tests whose probes run in the background (tests/background_probes.py) go last, so that
    the rest of the suite runs while their probes do, instead of waiting for them."""
    import background_probes

    items[:] = background_probes.last(items)


def pytest_collection_finish(session):
    """Long probes of the selected tests start now, in the background (tests/background_probes.py)."""
    import background_probes

    background_probes.start(session)


def pytest_sessionfinish(session, exitstatus):
    import background_probes

    background_probes.stop()
