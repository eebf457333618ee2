"""``deepinfer manifest``: (re)generate ``patches/vllm-<version>/overlay.toml``.

For every overlay file it records whether the file is new or replaces an upstream file,
and for a replacement the upstream blob id (at the pinned base) it was written against, so
a later upstream change to that file is detected (``make apply`` / ``make check`` compare
it, the drift report shows the upstream delta). In a git checkout only committed (tracked)
overlay files are listed, so work in progress does not leak into it.
"""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from . import source
from .apply import _base_for, _rel, build_root
from .console import info
from .gittree import BASE_REF
from .patchset import (ManifestEntry, OverlayManifest, load_patchset, overlay_files,
                       project_root, read_manifest, write_manifest)


def _tracked_files(root: Path) -> set[str] | None:
    """Files git tracks under overlay/ and csrc/, or None when root is not a checkout."""
    r = subprocess.run(["git", "ls-files", "-z", "--", "overlay", "csrc"], cwd=root,
                       capture_output=True)
    if r.returncode:
        return None
    return {p.decode() for p in r.stdout.split(b"\0") if p}


def build_manifest(version: str, spec: source.SourceSpec, root: Path | None = None,
                   build: Path | None = None) -> OverlayManifest:
    """Compute the manifest from the overlay and the pinned base (no file written)."""
    root = root or project_root()
    build = build or build_root(root)
    ps = load_patchset(version, root)
    with contextlib.ExitStack() as stack:
        t = _base_for(version, spec, ps, build, stack)
        blobs = t.ls_tree(t.rev_parse(BASE_REF))
    entries = []
    tracked = _tracked_files(root)
    for f in overlay_files(root):
        if tracked is not None and f.rel_source not in tracked:
            continue  # work in progress: not part of the committed overlay yet
        up = blobs.get(f.tree_path)
        entries.append(ManifestEntry(f.tree_path, f.rel_source, "replace" if up else "new",
                                     up or ""))
    return OverlayManifest(ps.pin.version, ps.pin.commit_short, entries)


def manifest(version: str, spec: source.SourceSpec, root: Path | None = None,
             build: Path | None = None) -> Path:
    """Write ``overlay.toml``; prints what changed against the previous one."""
    root = root or project_root()
    ps = load_patchset(version, root)
    new = build_manifest(version, spec, root, build)
    old = read_manifest(ps.manifest_path)
    write_manifest(ps.manifest_path, new)
    old_rows = old.by_path() if old else {}
    n_rep = sum(1 for e in new.entries if e.kind == "replace")
    info(f"wrote {_rel(ps.manifest_path)}: {len(new.entries)} files "
         f"({len(new.entries) - n_rep} new, {n_rep} replacing upstream files)")
    for e in new.entries:
        prev = old_rows.get(e.path)
        if prev is None:
            info(f"  + {e.path} ({e.kind})")
        elif prev != e:
            info(f"  ~ {e.path}: {prev.kind} {prev.upstream_blob[:12]} -> "
                 f"{e.kind} {e.upstream_blob[:12]}")
    for p in sorted(set(old_rows) - {e.path for e in new.entries}):
        info(f"  - {p}")
    return ps.manifest_path
