"""Shared parts of the checks that run vLLM's own metadata builders into the Ampere adapters
(tests/vllm_indexer_decode_check.py, vllm_attention_check.py, vllm_v41_attention_check.py)
and of their pytest wrappers.

In the check (a subprocess): :func:`arg_parser`, :func:`boot` (the tree under the CUDA
platform mocked to a capability, the working copy's overlay modules over the tree's copies,
vLLM's workspace manager), :func:`run_cases` (one ``RESULT {json}`` line, a failing case
reported with where it failed), :func:`with_env`, :func:`require_extension_ops`,
:func:`dummy_reqs`.
In the wrapper: :func:`applied_tree`, :func:`gpu_tree` and :func:`run_check`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import triton_interp  # noqa: E402
import vllm_cpu_harness as harness  # noqa: E402

# ------------------------------------------------------------------------------- the check


def arg_parser(doc: str) -> argparse.ArgumentParser:
    """--tree, --capability, --overlay, --case (repeatable)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True)
    ap.add_argument("--capability", default="8.0")
    ap.add_argument("--overlay", type=Path, default=ROOT / "overlay",
                    help="overlay root to test (default: the working copy's)")
    ap.add_argument("--case", action="append", default=[])
    return ap


def load_overlay(overlay: Path, modname: str):
    """Import ``<overlay>/<modname as path>.py`` under ``modname``; where the overlay has no
    such file (a GPU bundle ships the tree's copy only), the tree's module."""
    import importlib
    import importlib.util

    path = overlay / (modname.replace(".", "/") + ".py")
    if not path.is_file():
        return importlib.import_module(modname)
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


def boot(tree: Path, overlay: Path, capability: str, modules: tuple[str, ...],
         device: str = "cpu"):
    """Import the tree under the mocked platform, then the overlay's kernels package and
    ``modules`` (in order) over the tree's copies (``make apply`` need not be rerun after an
    overlay edit); start vLLM's workspace manager on ``device``. Returns the last module."""
    import torch

    triton_interp.patch_index()
    harness._boot(tree.resolve(), None)
    sys.path.insert(0, str(overlay.resolve()))
    for name in [n for n in sys.modules if n.split(".")[0] == "deepinfer_sm80"]:
        del sys.modules[name]
    mod = None
    for name in modules:
        mod = load_overlay(overlay.resolve(), name)
    harness._CAPABILITY[:] = [int(x) for x in capability.split(".")]
    harness._reset_capability_state()
    from vllm.v1.worker import workspace

    workspace.init_workspace_manager(torch.device(device))
    if device == "cpu":
        # Growing the workspace calls torch.accelerator.empty_cache(), which raises without
        # an accelerator; releasing cached device memory has no CPU meaning.
        torch.accelerator.empty_cache = lambda: None
    return mod


def require_extension_ops(ops, device: str) -> None:
    """On CUDA: every step of ``ops`` (deepinfer_sm80.ampere.layer.AmpereOps) is this
    project's CUDA extension op (``deepinfer_sm80.ops.*``), not a portable fallback, which
    ``resolve_ops`` takes silently where the extension does not load. Nothing on the CPU."""
    if device != "cpu":
        other = {k: v for k, v in ops.source.items() if not v.startswith("deepinfer_sm80.ops.")}
        assert not other, f"not the CUDA extension's ops on {device}: {other}"


def dummy_reqs(nreq: int, ntok: int) -> list[tuple[int, int]]:
    """The batch vLLM's model runner (V2) captures a FULL CUDA graph with
    (``InputBatch.make_dummy``): ``ntok // nreq`` tokens per request, one more for the last
    ``ntok % nreq``; seq_len = query length. As ``[(seq_len, query_len)]``."""
    base, extra = divmod(ntok, nreq)
    return [(x, x) for x in [base] * (nreq - extra) + [base + 1] * extra]


def random_step(rnd, k: int, *, max_seq: int, max_decodes: int, max_prefills: int,
                prefill_q: int, budget: int, prefill=None) -> tuple[list[tuple], int]:
    """One random batch for the fuzz cases of the vLLM-level checks, as ``(requests, padded
    tokens)`` in the order vLLM's model runner lays it out: up to ``max_decodes`` decodes
    (most of them the full 1 + ``k`` tokens, some shorter), then up to ``max_prefills``
    prefills of ``k`` + 2 to ``prefill_q`` tokens within ``budget`` tokens, fresh (up to
    ``max_seq`` tokens of context) or as ``prefill(q)`` makes them where it returns a request;
    CUDA-graph padding requests (0, 0) and their padded tokens only after a decode-only batch.
    ``rnd``: a ``random.Random``."""
    reqs: list[tuple] = []
    tokens = 0
    for _ in range(rnd.randint(0, max_decodes)):
        q = k + 1 if rnd.random() < 0.8 else rnd.randint(1, k + 1)
        reqs.append((rnd.randint(q, max_seq), q))
        tokens += q
    prefills = rnd.randint(0 if reqs else 1, max_prefills)
    for _ in range(prefills):
        q = rnd.randint(k + 2, max(k + 2, min(prefill_q, budget - tokens)))
        reqs.append((prefill(q) if prefill else None) or (rnd.randint(q, max_seq), q))
        tokens += q
    pad = 0
    if not prefills and rnd.random() < 0.5:
        extra = rnd.randint(1, 2)
        reqs += [(0, 0)] * extra
        pad = extra * (k + 1)
    return reqs, pad


def random_graph_steps(rnd, k: int, max_seq: int) -> list[tuple[list[tuple[int, int]], int]]:
    """2-3 replays of one random graph of 2-5 requests: each with 1 to all of them real
    (uniform decodes at 1 + ``k`` tokens, up to ``max_seq`` tokens of context), the rest
    padding requests and padded tokens (one padded shape, :func:`graph_shape`)."""
    nreq = rnd.randint(2, 5)
    steps = []
    for _ in range(rnd.randint(2, 3)):
        m = rnd.randint(1, nreq)
        reqs = [(rnd.randint(k + 1, max_seq), k + 1) for _ in range(m)] + [(0, 0)] * (nreq - m)
        steps.append((reqs, (nreq - m) * (k + 1)))
    return steps


def graph_shape(steps) -> tuple[int, int]:
    """(requests, tokens incl. padded ones) of a graph case's ``[(reqs, pad)]`` steps, which
    must all have that one padded shape (a graph replays one shape)."""
    nreq, ntok = len(steps[0][0]), sum(q for _, q in steps[0][0]) + steps[0][1]
    assert all(len(r) == nreq and sum(q for _, q in r) + p == ntok for r, p in steps), \
        "a graph replays one padded shape"
    return nreq, ntok


#: The model runner's persistent per-step inputs in the attention checks' batch namespaces.
RUNNER_FIELDS = ("qsl", "seq", "positions", "bt_swa", "slots_swa", "bt_c", "slots_c")


def rewrite_inputs(run: dict | None, b) -> dict:
    """The model runner's step: ``b``'s values written into the persistent tensors ``run``
    (taken from ``b`` when None, at capture), and ``b`` pointed at them. Returns ``run``."""
    if run is None:
        return {k: getattr(b, k) for k in RUNNER_FIELDS if hasattr(b, k)}
    for k, t in run.items():
        t.copy_(getattr(b, k))
        setattr(b, k, t)
    return run


class CapturedForward:
    """``forward(md)`` captured in a CUDA graph on ``device`` "cuda" (after the caller's
    eager warm-up); elsewhere :meth:`replay` emulates the graph by running ``forward`` on the
    captured metadata objects again, which is what a replay sees from the host side."""

    def __init__(self, forward: Callable[[Any], None], md, device: str):
        import torch

        self.forward, self.md, self.graph = forward, md, None
        if device == "cuda":
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                forward(md)

    def replay(self) -> None:
        import torch

        if self.graph is None:
            self.forward(self.md)
        else:
            self.graph.replay()
            torch.cuda.synchronize()


def run_cases(names: list[str], run: Callable[[str], dict]) -> int:
    """``run(name)`` for each case; prints ``RESULT {case: result}``, a case that raised as
    ``{"ok": False, "error", "where"}``."""
    import traceback

    res = {}
    for name in names:
        try:
            res[name] = run(name)
        except Exception as exc:  # reported per case, with where it failed
            res[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                         "where": traceback.format_exc().splitlines()[-8:]}
    print("RESULT " + json.dumps(res, sort_keys=True))
    return 0


@contextlib.contextmanager
def with_env(env: dict[str, str]) -> Iterator[None]:
    """The environment variables ``env`` set for the block, restored after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


# ----------------------------------------------------------------------------- the wrapper


def applied_tree() -> Path:
    """build/vllm-<version> of the patch set under test; pytest.skip (naming the step)
    without triton, vLLM's Python dependencies or the tree."""
    import pytest

    pytest.importorskip("triton", reason="triton is not installed (make venv-torch)")
    harness.skip_without_dependencies()
    tree = ROOT / "build" / f"vllm-{harness.VLLM_VERSION}"
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.skip(f"no applied vLLM {harness.VLLM_VERSION} tree: run `make apply`")
    return tree


def gpu_tree() -> Path:
    """The vLLM tree for a GPU variant ($DEEPINFER_VLLM_TREE, build/vllm-<version> or the
    GPU bundle's vllm-tree/); pytest.skip naming what is missing (vLLM's Python
    dependencies, the tree)."""
    import pytest

    missing = harness.missing_dependencies()
    if missing:
        pytest.skip(f"vLLM's pure-Python dependencies missing here: {', '.join(missing)}")
    sys.path.insert(0, str(ROOT / "bench"))
    from upstream_import import UpstreamImportError, find_tree

    try:
        return find_tree(version=harness.VLLM_VERSION)
    except UpstreamImportError as e:
        pytest.skip(str(e))


def gpu_results(script: str, *args: str) -> dict[str, Any]:
    """tests/<script> ``--device cuda`` on this machine's GPU against :func:`gpu_tree`."""
    return run_check(script, gpu_tree(), "--device", "cuda", *args, interpret=False,
                     timeout=600)


def run_check(script: str, tree: Path, *args: str, interpret: bool = True,
              timeout: int = 900) -> dict[str, Any]:
    """Run tests/<script> against ``tree`` (capability 8.0) in a subprocess; its RESULT line.
    ``interpret``: on the CPU, vLLM's Triton kernels in the interpreter and no CUDA device;
    else on this machine's GPU."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    pythonpath = harness.subprocess_pythonpath()  # vLLM's deps of a GPU bundle, its .site
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if interpret:
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    else:
        env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, str(HERE / script), "--tree", str(tree), "--capability", "8.0", *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=str(HERE))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])
