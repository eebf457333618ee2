"""Drift report: how does the pinned patch set + overlay fare against another upstream?

``deepinfer drift [--vllm 0.33.0] [--against 0.32.0|latest|<git rev>|path:DIR] [--strict]``

Reads only what it needs: both sdists are streamed once each (no unpacking); the
series is simulated in memory hunk by hunk (:mod:`deepinfer.hunkstatus`), the overlay is
checked by :mod:`deepinfer.overlaycheck`.  Writes ``build/drift/<from>-to-<to>.json``
(schema in docs/drift.md) and ``.md``, prints a table, exits 0 when the report was made
(``--strict``: 3 when anything is not clean/offset/ok).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import posixpath
import re
import sys
from pathlib import Path

from . import hunkstatus as hs
from . import overlaycheck as oc
from . import upstream
from .console import DeepinferError, info, report_error, warn
from .patchset import PatchSet, load_patchset, overlay_files, project_root, read_manifest

SCHEMA = "deepinfer-drift/1"
RENAME_THRESHOLD = 0.5  # git's default rename similarity
MAX_RENAME_CANDIDATES = 300


def _lines(data: bytes | None) -> list[str] | None:
    return None if data is None else hs.split_lines(hs.decode(data))


def _subject(text: str) -> str:
    m = re.search(r"^Subject: (?:\[PATCH[^\]]*\] )?(.*(?:\n[ \t].*)*)", text, re.M)
    return re.sub(r"\s*\n[ \t]+", " ", m.group(1)).strip() if m else ""


def _similarity(a: list[str], b: list[str]) -> float:
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if sm.real_quick_ratio() < RENAME_THRESHOLD or sm.quick_ratio() < RENAME_THRESHOLD:
        return 0.0
    return sm.ratio()


def detect_rename(path: str, old: list[str] | None, base_paths: set[str], target) -> str | None:
    """New path of a file upstream moved: an added path with the same basename, or else
    with the same extension, whose content is at least 50% similar (git's default)."""
    if not old:
        return None
    name, ext = posixpath.basename(path), posixpath.splitext(path)[1]
    added = sorted(p for p in target.paths if p not in base_paths)
    same_name = [p for p in added if posixpath.basename(p) == name]
    same_ext = [p for p in added if p.endswith(ext) and p not in same_name] if ext else []
    best, best_score = None, RENAME_THRESHOLD
    for group in (same_name, same_ext[:MAX_RENAME_CANDIDATES]):
        for cand in group:
            lines = _lines(target.read(cand))
            if lines is None:
                continue
            score = _similarity(old, lines)
            if score >= best_score:
                best, best_score = cand, score + 1e-9
        if best:
            return best
    return None


def touched_paths(ps: PatchSet) -> tuple[list[tuple[str, str, list[hs.FileDiff]]], set[str]]:
    """[(patch name, text, file diffs)] in series order, and every path they touch."""
    out, paths = [], set()
    for name, p in zip(ps.series, ps.patch_paths):
        text = hs.decode(p.read_bytes())
        try:
            fds = hs.parse_patch(text)
        except ValueError as exc:
            raise DeepinferError(f"{p}: {exc}", hint="re-export the patch: make export")
        for fd in fds:
            paths.update(x for x in (fd.old_path, fd.new_path) if x)
        out.append((name, text, fds))
    return out, paths


def _want(paths: set[str]):
    names = {posixpath.basename(p) for p in paths}
    exts = {posixpath.splitext(p)[1] for p in paths} - {""}

    def want(path: str, size: int) -> bool:
        return (path in paths or path.endswith(".py") or posixpath.basename(path) in names
                or (size < 2_000_000 and posixpath.splitext(path)[1] in exts))
    return want


def simulate_series(patches, base, target) -> tuple[list[dict], dict, dict]:
    """Walk the series against ``target`` (and the pinned ``base`` for 3-way bases).
    Returns the per-patch report entries and the final file states of base and target
    (path -> bytes | None) for the files the series touched."""
    base_state: dict[str, list[str] | None] = {}
    tgt_state: dict[str, list[str] | None] = {}
    entries = []

    def cur(state, snap, path):
        return state[path] if path in state else _lines(snap.read(path)) if snap.has(path) else None

    for idx, (name, text, fds) in enumerate(patches, 1):
        files = []
        for fd in fds:
            src = fd.old_path or fd.new_path
            b_lines = cur(base_state, base, src) if not fd.is_new else None
            t_lines = cur(tgt_state, target, src)
            t_bin = target.read(src) if fd.binary else None
            fr, after = hs.check_file(fd, t_lines, b_lines, t_bin)
            if fr.status == hs.FILE_MISSING and not fd.binary:
                new = detect_rename(src, b_lines, base.paths, target)
                if new:
                    fr.renamed_to = new
                    fr.detail = f"moved upstream to {new} (content similarity >= 50%)"
                    alt, _ = hs.check_file(fd, cur(tgt_state, target, new), b_lines)
                    for h, a in zip(fr.hunks, alt.hunks):
                        h.at_new_path = a.status
                        h.detail = f"upstream moved the file to {new}; there it is {a.status}"
                else:
                    fr.detail = "deleted upstream (no similar file found under a new path)"
            if fr.status != hs.FILE_MISSING:
                if fd.old_path and fd.new_path and fd.old_path != fd.new_path:
                    tgt_state[fd.old_path] = None
                tgt_state[fd.new_path or src] = after if fd.new_path else None
            # the pinned base moves on by the same patch (it applies there by definition)
            if fd.is_new:
                base_state[src] = fd.hunks[0].post if fd.hunks else []
            elif fd.is_deleted:
                base_state[src] = None
            elif b_lines is not None and not fd.binary:
                nxt = hs.apply_exact(b_lines, fd)
                if nxt is None:
                    fr.detail = (fr.detail + "; " if fr.detail else "") + \
                        "note: does not apply exactly to its pinned base"
                else:
                    if fd.old_path != fd.new_path:
                        base_state[fd.old_path] = None
                    base_state[fd.new_path] = nxt
            files.append(fr)
        entries.append({
            "index": idx, "name": name, "subject": _subject(text),
            "status": hs.rollup([f.status for f in files]),
            "files": [f.to_json() for f in files],
        })
    enc = lambda st: {p: (hs.encode("".join(v)) if v is not None else None) for p, v in st.items()}
    return entries, enc(base_state), enc(tgt_state)


def _overlay_entries(ps: PatchSet, root: Path, base) -> tuple[list[oc.OverlayEntry], str]:
    files = overlay_files(root)
    manifest = read_manifest(ps.manifest_path)
    rows = manifest.by_path() if manifest else {}
    out = []
    for f in files:
        row = rows.get(f.tree_path)
        if row is not None:
            kind, blob = row.kind, row.upstream_blob
        else:  # no manifest row: derive from the pinned base
            data = base.read(f.tree_path) if base.has(f.tree_path) else None
            kind = "replace" if data is not None else "new"
            blob = hs.git_blob_id(data) if data is not None else ""
        out.append(oc.OverlayEntry(f.tree_path, f.rel_source, kind, blob, f.source.read_bytes()))
    return out, ("overlay.toml" if manifest else "derived from overlay/ and csrc/")


def _layered(snap, patched: dict[str, bytes | None], overlay: list[oc.OverlayEntry]):
    paths = set(snap.paths)
    for p, v in patched.items():
        (paths.add if v is not None else paths.discard)(p)
    over = {e.path: e.data for e in overlay}
    paths |= set(over)

    def read(path: str) -> bytes | None:
        if path in over:
            return over[path]
        if path in patched:
            return patched[path]
        return snap.read(path)
    return oc.TreeView(paths, read)


def build_report(version: str, against: str | None, root: Path | None = None) -> dict:
    root = root or project_root()
    ps = load_patchset(version, root)
    patches, touched = touched_paths(ps)
    base_up = upstream.Upstream("sdist", ps.pin.version, ps.pin.version, ps.pin)
    target_up = upstream.resolve(against, ps.pin)
    overlay_paths = {f.tree_path for f in overlay_files(root)}
    want = _want(touched | overlay_paths)
    base = upstream.open_snapshot(base_up, want)
    target = upstream.open_snapshot(target_up, want)
    entries, base_after, tgt_after = simulate_series(patches, base, target)
    overlay, manifest_src = _overlay_entries(ps, root, base)
    ov = oc.check_overlay(
        overlay, _layered(base, base_after, overlay), _layered(target, tgt_after, overlay),
        base.read, target.read, target.paths, ps.pin.version, target_up.label)
    hunk_counts: dict[str, int] = {}
    for e in entries:
        for f in e["files"]:
            for h in f["hunks"]:
                hunk_counts[h["status"]] = hunk_counts.get(h["status"], 0) + 1
    patch_counts: dict[str, int] = {}
    for e in entries:
        patch_counts[e["status"]] = patch_counts.get(e["status"], 0) + 1
    ov_counts: dict[str, int] = {}
    for r in ov:
        ov_counts[r.status] = ov_counts.get(r.status, 0) + 1
    clean = (all(e["status"] in hs.EXACT_OK for e in entries)
             and all(h["status"] in hs.EXACT_OK
                     for e in entries for f in e["files"] for h in f["hunks"])
             and all(r.status == oc.OK for r in ov))
    return {
        "schema": SCHEMA,
        "from": {"version": ps.pin.version, "commit": ps.pin.commit or ps.pin.commit_short,
                 "source": f"sdist {ps.pin.sdist_filename} sha256:{ps.pin.sdist_sha256}"},
        "to": {"label": target_up.label, "kind": target_up.kind, "ref": target_up.ref,
               "commit": target_up.commit,
               "source": (f"sdist {target_up.pin.sdist_filename} sha256:"
                          f"{target_up.pin.sdist_sha256}" if target_up.pin
                          else f"{target_up.kind} {target_up.ref}")},
        "series": ps.series,
        "overlay_manifest": manifest_src,
        "summary": {"patches": patch_counts, "hunks": hunk_counts, "overlay": ov_counts,
                    "clean": clean},
        "patches": entries,
        "overlay": [r.to_json() for r in ov],
    }


def report_paths(report: dict, root: Path) -> tuple[Path, Path]:
    stem = f"{report['from']['version']}-to-{report['to']['label']}"
    d = root / "build" / "drift"
    return d / f"{stem}.json", d / f"{stem}.md"


def write_report(report: dict, root: Path) -> tuple[Path, Path]:
    from .driftreport import to_markdown
    jpath, mpath = report_paths(report, root)
    jpath.parent.mkdir(parents=True, exist_ok=True)
    jpath.write_text(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                     encoding="utf-8")
    mpath.write_text(to_markdown(report), encoding="utf-8")
    return jpath, mpath


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vllm", default=None, help="patch set to check (default $VLLM or 0.33.0)")
    p.add_argument("--against", default=None,
                   help="upstream to compare with: a version, 'latest' (default), a git "
                        "revision, or path:DIR")
    p.add_argument("--strict", action="store_true",
                   help="exit 3 when anything is not clean/offset (or an overlay file not ok)")


def run(args: argparse.Namespace) -> int:
    from .driftreport import print_report
    root = project_root()
    version = args.vllm or os.environ.get("VLLM") or "0.33.0"
    report = build_report(version, args.against, root)
    jpath, mpath = write_report(report, root)
    print_report(report)
    info(f"wrote {jpath.relative_to(root)} and {mpath.relative_to(root)}")
    if args.strict and not report["summary"]["clean"]:
        warn("STRICT: the patch set does not apply as it is (see the statuses above)")
        return 3
    return 0


def register(sub) -> None:
    """Add the ``drift`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("drift", help="drift report of a patch set against another vLLM")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="deepinfer drift", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except DeepinferError as exc:
        report_error(exc)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
