"""The real patch set against the real vLLM 0.33.0 sdist.

Marked ``network``: it uses the sdist in the per-user cache when present and downloads it
(through pip's configured index) otherwise. Runs in a temporary project root (a copy of
``patches/vllm-0.33.0`` with links to ``overlay/`` and ``csrc/``) so the checkout's own
``build/`` and patch files are never touched.
"""
from __future__ import annotations

import py_compile
import shutil

import pytest

from deepinfer import apply as ap
from deepinfer import export as ex
from deepinfer import source
from deepinfer.gittree import BASE_REF, GitTree
from deepinfer.patchset import load_patchset, project_root

pytestmark = pytest.mark.network
VERSION = "0.33.0"


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    real = project_root()
    root = tmp_path_factory.mktemp("real-root")
    shutil.copytree(real / "patches" / f"vllm-{VERSION}", root / "patches" / f"vllm-{VERSION}")
    for d in ("overlay", "csrc"):
        if (real / d).is_dir():
            (root / d).symlink_to(real / d)
    mp = pytest.MonkeyPatch()
    mp.setenv("DEEPINFER_ROOT", str(root))
    mp.delenv("DEEPINFER_BUILD_DIR", raising=False)
    res = ap.apply(VERSION, source.SourceSpec("sdist"), root=root)
    yield root, res
    mp.undo()


def test_real_series_applies(applied):
    root, res = applied
    ps = load_patchset(VERSION, root)
    t = GitTree(res.tree)
    subjects = [c.subject for c in t.commits(f"{BASE_REF}..HEAD")]
    assert len(subjects) == len(ps.series) + 1
    assert [p["name"] for p in res.state["patches"]] == ps.series
    assert res.state["upstream_commit"] == "g4ba787ec9"
    assert ap.status(VERSION, source.SourceSpec("sdist"), root=root).clean
    # upstream's version stays upstream's (plugins branch on it)
    assert source.read_version_file(res.tree) == ("0.33.0", "g4ba787ec9")


def test_changed_python_files_compile(applied, tmp_path):
    _, res = applied
    t = GitTree(res.tree)
    changed = [p for p in t.changed_paths(BASE_REF, "HEAD") if p.endswith(".py")]
    assert changed, "the patch set changes no Python file?"
    for rel in changed:
        py_compile.compile(str(res.tree / rel), cfile=str(tmp_path / "x.pyc"), doraise=True)


def test_export_round_trip_is_byte_identical(applied):
    root, _ = applied
    pdir = root / "patches" / f"vllm-{VERSION}"
    before = {p.name: p.read_bytes() for p in pdir.iterdir()}
    result = ex.export(VERSION, root=root)
    assert set(result.values()) == {"unchanged"}, result
    assert {p.name: p.read_bytes() for p in pdir.iterdir()} == before
