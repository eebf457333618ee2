"""The project's own overlay manifests (``patches/vllm-<ver>/overlay.toml``) list exactly the
overlay files (``overlay/**`` and ``csrc/**``), so `make apply` / `make check` print no "run
`make manifest`" warning. Until 2026-12-01 four files added that morning (the indexer's CUDA
scorer and top-k) were missing and every apply warned; nothing failed."""
from __future__ import annotations

import pytest

from deepinfer.patchset import load_patchset, overlay_files, project_root, read_manifest

VERSIONS = sorted(p.name.removeprefix("vllm-") for p in (project_root() / "patches").glob("vllm-*")
                  if p.is_dir())


@pytest.mark.parametrize("version", VERSIONS)
def test_manifest_lists_exactly_the_overlay(version):
    ps = load_patchset(version)
    manifest = read_manifest(ps.manifest_path)
    assert manifest is not None, f"{ps.manifest_path} is missing: run `make manifest VLLM={version}`"
    listed = set(manifest.by_path())
    present = {f.tree_path for f in overlay_files()}
    assert not present - listed, (f"overlay files missing from {ps.manifest_path}: "
                                  f"{sorted(present - listed)}; run `make manifest VLLM={version}`")
    assert not listed - present, (f"{ps.manifest_path} lists files the overlay no longer has: "
                                  f"{sorted(listed - present)}; run `make manifest VLLM={version}`")


def test_there_is_a_pinned_version():
    assert VERSIONS, "no patches/vllm-* directory"
