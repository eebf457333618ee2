"""Long harness probes started in the background when collection ends, so that they overlap
the rest of the suite.

TileLang's mHC compile probes (tests/test_gates_sm80.py) take about 18 of the CPU suite's
36 minutes on CI's 2 cores, each in one single-threaded subprocess. A test module opts in by
defining ``background_probe_spec(item) -> (capabilities, probes, env, timeout) | None``. When
the session's collection ends, :func:`start` makes the trees of
``vllm_cpu_harness.prepare_trees`` (in the main thread, before any test) and runs every
selected item's probe, one at a time, in a worker thread (one core; the suite keeps the
other); the opted-in tests run last (:func:`last`). A test takes its probe's result with
:func:`result`, waiting if it is not done yet; an error in the probe is raised there, in the
test. Nothing starts when no opted-in test is selected, or when the harness's skip conditions
hold (the test then skips itself, as before).

$DEEPINFER_BACKGROUND_PROBES=0 turns this off: each test runs its probe when it runs."""
from __future__ import annotations

import concurrent.futures
import contextlib
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import vllm_cpu_harness as harness

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_FUTURES: dict[tuple, concurrent.futures.Future] = {}
_ROOT: Path | None = None  # the trees the worker made, removed at the end of the session


def _key(capabilities: list[str], probes: tuple[str, ...], env: dict[str, str]) -> tuple:
    return tuple(capabilities), tuple(probes), tuple(sorted(env.items()))


class _TmpFactory:
    """The part of pytest's tmp_path_factory that prepare_trees uses."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))


def _spec(item: Any) -> tuple | None:
    spec_fn = getattr(getattr(item, "module", None), "background_probe_spec", None)
    return spec_fn(item) if spec_fn is not None else None


def last(items: list) -> list:
    """``items`` with the opted-in ones moved to the end, both parts in their order
    (pytest_collection_modifyitems)."""
    if os.environ.get("DEEPINFER_BACKGROUND_PROBES", "1") == "0":
        return list(items)
    flags = [_spec(it) is not None for it in items]
    return [it for it, f in zip(items, flags) if not f] + [it for it, f in zip(items, flags) if f]


def start(session: Any) -> None:
    """Start the opted-in probes of the session's selected items (pytest_collection_finish)."""
    global _POOL, _ROOT
    if os.environ.get("DEEPINFER_BACKGROUND_PROBES", "1") == "0" or _POOL is not None:
        return
    specs = [spec for spec in map(_spec, session.items) if spec is not None]
    if not specs or harness.missing_dependencies():
        return
    # the environment as collection left it: tests that run meanwhile may monkeypatch theirs
    environ = dict(os.environ)
    _ROOT = root = Path(tempfile.mkdtemp(prefix="deepinfer-background-probes-"))
    # the trees now, in this (the only) thread, before any test runs; its messages would
    # otherwise land in whichever test is capturing output at the time
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            trees = harness.prepare_trees(_TmpFactory(root))
    except Exception:  # noqa: BLE001 - the tests' own fixture reports it
        return
    _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe")
    for capabilities, probes, env, timeout in specs:
        key = _key(capabilities, probes, env)
        if key not in _FUTURES:
            # a subprocess with its output captured: the worker thread prints nothing, so no
            # test's captured output can receive any of it
            _FUTURES[key] = _POOL.submit(harness.run_probes, trees["patched"], list(capabilities),
                                         probes=tuple(probes), timeout=timeout, env=dict(env),
                                         environ=environ)


def result(trees: dict[str, Path], capabilities: list[str], probes: tuple[str, ...],
           env: dict[str, str], timeout: float) -> dict[str, Any]:
    """The probe's result: from the background run when one was started for it (waiting for
    it), else run now against ``trees``."""
    fut = _FUTURES.get(_key(capabilities, probes, env))
    if fut is None:
        return harness.run_probes(trees["patched"], capabilities, probes=probes,
                                  timeout=timeout, env=env)
    # the probes ahead of it in the queue may still be running: wait for them as well
    return fut.result(timeout=timeout * (1 + len(_FUTURES)))


def stop() -> None:
    """At the end of the session (pytest_sessionfinish): cancel what has not started, wait for
    a running probe, remove the worker's trees."""
    global _POOL, _ROOT
    if _POOL is not None:
        _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL = None
    if _ROOT is not None:
        shutil.rmtree(_ROOT, ignore_errors=True)
        _ROOT = None
