"""Export round trip over every patch set in patches/: `apply` then `export` must give
the patch files back byte for byte (and the series unchanged). Uses the real pinned sdists
(network on first use, cached afterwards)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from deepinfer import apply as apply_mod, export as export_mod, source
from deepinfer.patchset import load_patchset

ROOT = Path(__file__).resolve().parents[1]
SETS = sorted(p.name[len("vllm-"):] for p in (ROOT / "patches").glob("vllm-*")
              if (p / "pin.toml").is_file())


@pytest.mark.network
@pytest.mark.parametrize("version", SETS)
def test_apply_then_export_is_zero_diff(version, tmp_path, monkeypatch):
    root = tmp_path / "root"
    for sub in ("patches", "overlay", "csrc"):
        if (ROOT / sub).is_dir():
            shutil.copytree(ROOT / sub, root / sub,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    (root / "tools").mkdir()
    monkeypatch.setenv("DEEPINFER_ROOT", str(root))
    monkeypatch.setenv("DEEPINFER_BUILD_DIR", str(tmp_path / "build"))
    pdir = root / "patches" / f"vllm-{version}"
    before = {p.name: p.read_bytes() for p in sorted(pdir.iterdir())}
    try:
        source.ensure_sdist(load_patchset(version, root).pin)
    except Exception as exc:  # offline and not cached
        pytest.skip(f"sdist of vLLM {version} not available: {exc}")
    apply_mod.apply(version, source.SourceSpec("sdist"), root=root)
    export_mod.export(version, root=root)
    after = {p.name: p.read_bytes() for p in sorted(pdir.iterdir())}
    changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    assert not changed, f"export after apply changed {changed} in patches/vllm-{version}"
