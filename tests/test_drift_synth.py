"""Synthetic upstreams for the drift and rebase tests (no network, no vLLM).

``SynthProject`` lays out a project root (``patches/vllm-<ver>/`` with pin, series and
``git format-patch`` files; ``overlay/``) and a per-user cache holding sdist-like
tarballs of a "base" and of "target" upstreams, and points the tool at them through
``DEEPINFER_ROOT`` / ``DEEPINFER_CACHE_DIR``.
"""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

BASE_VERSION = "1.0.0"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}


def numbered(name: str, n: int = 40) -> str:
    return "".join(f"{name} line {i}\n" for i in range(1, n + 1))


def edit_line(text: str, lineno: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[lineno - 1] = new + "\n"
    return "".join(lines)


def git(cwd: Path, *args: str) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, **GIT_ENV})
    assert r.returncode == 0, f"git {args}: {r.stderr}"
    return r.stdout


def version_py(version: str, commit: str) -> str:
    return (f"__version__ = version = '{version}'\n"
            f"__version_tuple__ = version_tuple = {tuple(int(x) for x in version.split('.'))}\n"
            f"\n__commit_id__ = commit_id = '{commit}'\n")


def make_sdist(cache: Path, version: str, files: dict[str, str], commit: str) -> Path:
    sd = cache / "sdists"
    sd.mkdir(parents=True, exist_ok=True)
    path = sd / f"vllm-{version}.tar.gz"
    allfiles = dict(files)
    allfiles["vllm/_version.py"] = version_py(version, commit)
    allfiles.setdefault("vllm/__init__.py", "")
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in sorted(allfiles.items()):
            data = text.encode()
            ti = tarfile.TarInfo(f"vllm-{version}/{rel}")
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            tf.addfile(ti, io.BytesIO(data))
    return path


class SynthProject:
    def __init__(self, tmp: Path, monkeypatch, base_files: dict[str, str]):
        self.tmp = tmp
        self.root = tmp / "proj"
        self.cache = tmp / "cache"
        self.root.mkdir()
        (self.root / "tools").mkdir()
        self.base_files = dict(base_files)
        self.base_files.setdefault("vllm/__init__.py", "")
        self.gen = tmp / "gen"
        self.gen.mkdir()
        git(self.gen, "init", "-q")
        self._write_tree(self.gen, self.base_files)
        self._write_tree(self.gen, {"vllm/_version.py": version_py(BASE_VERSION, "gabc1234")})
        git(self.gen, "add", "-A")
        git(self.gen, "commit", "-qm", "base")
        git(self.gen, "tag", "base")
        self.sdist = make_sdist(self.cache, BASE_VERSION, self.base_files, "gabc1234")
        monkeypatch.setenv("DEEPINFER_ROOT", str(self.root))
        monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(self.cache))
        monkeypatch.delenv("VLLM", raising=False)
        self.patch_dir = self.root / "patches" / f"vllm-{BASE_VERSION}"
        self.patch_dir.mkdir(parents=True)
        sha = hashlib.sha256(self.sdist.read_bytes()).hexdigest()
        (self.patch_dir / "pin.toml").write_text(
            f'package = "vllm"\nversion = "{BASE_VERSION}"\ncommit_short = "gabc1234"\n'
            f'commit = ""\ngit_url = ""\nsdist_sha256 = "{sha}"\n')
        (self.patch_dir / "series").write_text("")

    @staticmethod
    def _write_tree(root: Path, files: dict[str, str | None]) -> None:
        for rel, text in files.items():
            p = root / rel
            if text is None:
                p.unlink()
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)

    def add_patch(self, subject: str, changes: dict[str, str | None]) -> str:
        """Commit ``changes`` on top of the previous patches and export the series."""
        self._write_tree(self.gen, changes)
        git(self.gen, "add", "-A")
        git(self.gen, "commit", "-qm", subject, "-m", f"Why: test patch {subject!r}.",
            "-m", "Origin: vendor, DeepInfer-SM80\nForwarded: no\nLast-Update: 2026-01-01")
        for old in self.patch_dir.glob("*.patch"):
            old.unlink()
        git(self.gen, "format-patch", "-q", "--full-index", "--zero-commit", "--no-signature",
            "--keep-subject", "--no-stat", "--no-color", "--encode-email-headers",
            "-o", str(self.patch_dir), "base..HEAD")
        names = sorted(p.name for p in self.patch_dir.glob("*.patch"))
        (self.patch_dir / "series").write_text("".join(n + "\n" for n in names))
        return names[-1]

    def current(self, rel: str) -> str:
        return (self.gen / rel).read_text()

    def add_overlay(self, rel: str, text: str) -> None:
        p = self.root / "overlay" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def add_target(self, version: str, files: dict[str, str | None]) -> Path:
        """A release ``version`` = base files with ``files`` applied (None deletes)."""
        tree = dict(self.base_files)
        for rel, text in files.items():
            if text is None:
                tree.pop(rel, None)
            else:
                tree[rel] = text
        return make_sdist(self.cache, version, tree, "gdef5678")


@pytest.fixture
def synth(tmp_path, monkeypatch):
    def make(base_files: dict[str, str]) -> SynthProject:
        return SynthProject(tmp_path, monkeypatch, base_files)
    return make
