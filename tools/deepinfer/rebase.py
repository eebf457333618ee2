"""``deepinfer rebase --to <version>`` / ``rebase --continue``: move a patch set to
another vLLM release.

``build/rebase-<to>/`` is a git repository holding

- ``refs/deepinfer/old-base``: the pinned upstream of the current set, and
  ``refs/deepinfer/old-tip``: that base with the current series applied (so every
  pre-image blob a ``git am --3way`` needs is in the object database);
- ``refs/deepinfer/base``: the target release's pristine tree (a child of old-base, so
  ``git diff refs/deepinfer/old-base refs/deepinfer/base`` is upstream's change);
- branch ``rebase``: the series re-applied onto the target with ``git am --3way``.

A patch whose change upstream already has becomes empty and is dropped (reported). On a
conflict the tool stops, leaves the tree for hand resolution and prints what to do; ``make
rebase-continue TO=<to>`` then runs ``git am --continue`` and carries on.  When every patch
is in, ``patches/vllm-<to>/`` is written (pin, series, freshly exported patches, overlay
manifest against the target's blobs) and a ``git range-diff`` of old vs new series is
printed.  An existing ``patches/vllm-<to>/`` is only replaced with ``force``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.table import Table

from . import hunkstatus as hs
from . import source, upstream
from .console import DeepinferError, console, info, report_error, warn
from .gittree import BASE_REF, GitOpError, GitTree
from .patchset import (OverlayManifest, ManifestEntry, PatchSet, load_patchset, overlay_files,
                       patch_dir, project_root, write_manifest, write_series)

OLD_BASE, OLD_TIP = "refs/deepinfer/old-base", "refs/deepinfer/old-tip"
BRANCH = "rebase"
STATE = "deepinfer-rebase.json"
AM_ARGS = ["am", "--3way", "--keep", "--keep-cr", "--no-scissors", "--whitespace=nowarn",
           "--committer-date-is-author-date"]
EXIT_CONFLICT = 4


def work_dir(root: Path, to: str) -> Path:
    env = os.environ.get("DEEPINFER_BUILD_DIR")
    return (Path(env) if env else root / "build") / f"rebase-{to}"


def _rel(p: Path) -> str:
    try:
        return os.path.relpath(p)
    except ValueError:
        return str(p)


def _state_path(work: Path) -> Path:
    return work / ".git" / STATE


def _load_state(work: Path, to: str) -> dict:
    p = _state_path(work)
    if not p.is_file():
        raise DeepinferError(f"no rebase to {to} in progress ({_rel(work)} has no {STATE})",
                             hint=f"start one with `make rebase TO={to}`")
    return json.loads(p.read_text())


def _save_state(work: Path, state: dict) -> None:
    _state_path(work).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def _am_in_progress(work: Path) -> bool:
    return (work / ".git" / "rebase-apply").is_dir()


def _clear_worktree(work: Path) -> None:
    for entry in work.iterdir():
        if entry.name != ".git":
            source.remove_tree(entry)


# --------------------------------------------------------------------------- start
def start(to: str, from_version: str, force: bool = False, spec_value: str | None = None,
          root: Path | None = None) -> int:
    root = root or project_root()
    ps = load_patchset(from_version, root)
    dest = patch_dir(to, root)
    if dest.exists() and not force:
        raise DeepinferError(f"{_rel(dest)} already exists; rebase does not overwrite it",
                             hint="compare with it, or re-run with FORCE=1 to replace it")
    work = work_dir(root, to)
    if work.exists():
        if _am_in_progress(work) and not force:
            raise DeepinferError(
                f"a rebase to {to} is in progress in {_rel(work)}",
                hint=f"finish it (resolve, git add, `make rebase-continue TO={to}`), or "
                     f"start over with FORCE=1")
        source.remove_tree(work)
    spec = source.SourceSpec.parse(spec_value or os.environ.get("SOURCE"),
                                   os.environ.get("GIT_URL"))
    if spec.kind == "path":
        raise DeepinferError("rebase fetches both releases itself; SOURCE=path is not "
                             "supported here", hint="use SOURCE=sdist (default) or SOURCE=git")
    target_pin = upstream.release_pin(to, ps.pin) if spec.kind == "sdist" else \
        ps.pin.__class__(**{**ps.pin.__dict__, "version": to, "commit_short": "", "commit": "",
                            "git_tag": f"v{to}"})
    work.parent.mkdir(parents=True, exist_ok=True)
    info(f"rebase: vLLM {from_version} set ({len(ps.series)} patches) onto {to} in {_rel(work)}")
    src_old = source.materialize(spec, ps.pin, work)
    tree = GitTree.init(work)
    old_base = tree.commit_all(f"vLLM {from_version} pristine upstream\n\nSource: "
                               f"{src_old.label}\nUpstream commit: {src_old.commit}\n")
    tree.update_ref(OLD_BASE, old_base)
    for p in ps.patch_paths:
        try:
            tree.am(p, threeway=True)
        except GitOpError as exc:
            raise DeepinferError(f"{p.name} does not apply to its own pin {from_version}",
                                 details=exc.details, hint=f"fix the set first: make check "
                                                           f"VLLM={from_version}")
    tree.update_ref(OLD_TIP, tree.rev_parse("HEAD"))
    tree.run("checkout", "-q", "-B", BRANCH, old_base)
    tree.run("rm", "-r", "-q", "--cached", ".")
    _clear_worktree(work)
    src_new = source.materialize(spec, target_pin, work)
    new_base = tree.commit_all(f"vLLM {to} pristine upstream\n\nSource: {src_new.label}\n"
                               f"Upstream commit: {src_new.commit}\n")
    tree.update_ref(BASE_REF, new_base)
    version, commit = source.read_version_file(work, ps.pin.package)
    state = {
        "from": from_version, "to": to, "force": force,
        "target": {"package": target_pin.package, "version": to,
                   "commit_short": commit or "", "sdist_sha256": target_pin.sdist_sha256,
                   "git_url": target_pin.git_url, "git_tag": f"v{to}",
                   "source": src_new.label},
        "series": list(ps.series), "next": 0, "applied": [], "dropped": [],
        "head_before": new_base,
    }
    _save_state(work, state)
    return _run_series(tree, work, state, ps, root)


# --------------------------------------------------------------------------- loop
def _run_series(tree: GitTree, work: Path, state: dict, ps: PatchSet, root: Path) -> int:
    while state["next"] < len(state["series"]):
        name = state["series"][state["next"]]
        state["head_before"] = tree.rev_parse("HEAD")
        _save_state(work, state)
        try:
            tree.run(*AM_ARGS, str((ps.directory / name).resolve()))
        except GitOpError as exc:
            if _am_in_progress(work) and _patch_is_empty(tree, exc):
                tree.run("am", "--skip")
                state["dropped"].append(name)
                warn(f"{name}: upstream {state['to']} already has this change; dropped "
                     "from the new series")
            else:
                _save_state(work, state)
                _print_conflict(tree, work, state, ps, exc.stderr)
                return EXIT_CONFLICT
        else:
            if tree.rev_parse("HEAD") == state["head_before"]:
                state["dropped"].append(name)
                warn(f"{name}: upstream {state['to']} already has this change; dropped "
                     "from the new series")
            else:
                state["applied"].append(name)
        state["next"] += 1
        _save_state(work, state)
    return _finish(tree, work, state, ps, root)


def _patch_is_empty(tree: GitTree, exc: GitOpError) -> bool:
    if "Patch is empty" in exc.stderr or "patch is empty" in exc.stderr.lower():
        return True
    # 3-way applied without conflicts but to no change: nothing staged, nothing unmerged
    unmerged = tree.run("diff", "--name-only", "--diff-filter=U")
    staged = tree.run("diff", "--cached", "--name-only")
    return not unmerged and not staged and "No changes" in exc.stderr


def _conflict_regions(text: str) -> list[tuple[int, list[str]]]:
    """(line, upstream side) of each conflict block in a file with merge markers."""
    out, cur, line0, side = [], None, 0, None
    for i, ln in enumerate(text.split("\n"), 1):
        if ln.startswith("<<<<<<< "):
            cur, line0, side = [], i, "ours"
        elif cur is not None and ln.startswith(("||||||| ", "=======")) and side == "ours":
            side = "other"
        elif cur is not None and ln.startswith(">>>>>>> "):
            out.append((line0, cur))
            cur = None
        elif cur is not None and side == "ours":
            cur.append(ln)
    return out


def _print_conflict(tree: GitTree, work: Path, state: dict, ps: PatchSet, stderr: str) -> None:
    name = state["series"][state["next"]]
    to = state["to"]
    files = [p for p in tree.run("diff", "--name-only", "--diff-filter=U").split("\n") if p]
    fds = {fd.old_path or fd.new_path: fd for fd in
           hs.parse_patch(hs.decode((ps.directory / name).read_bytes()))}
    console.print(f"[bold red]conflict:[/] patch {name} ({state['next'] + 1} of "
                  f"{len(state['series'])}) does not apply to vLLM {to}", soft_wrap=True)
    if not files:
        console.print(stderr.strip(), markup=False, soft_wrap=True)
    for path in files:
        # which hunk: re-run the hunk analysis against what the target has now
        fd = fds.get(path)
        hunks = ""
        if fd is not None:
            now = tree.run("show", f"HEAD:{path}", binary=True, strip=False) \
                if path in tree.ls_tree("HEAD") else None
            pre = None
            if fd.old_blob and not set(fd.old_blob) <= {"0"}:
                try:
                    pre = tree.run("cat-file", "blob", fd.old_blob, binary=True, strip=False)
                except GitOpError:
                    pre = None
            fr, _ = hs.check_file(fd, hs.split_lines(hs.decode(now)) if now is not None else None,
                                  hs.split_lines(hs.decode(pre)) if pre is not None else None)
            bad = [h for h in fr.hunks if h.status in (hs.CONFLICT, hs.FILE_MISSING)]
            hunks = ", ".join(f"hunk #{h.index} `{h.header}`" for h in bad)
        console.print(f"  file {path}" + (f": {hunks}" if hunks else ""), soft_wrap=True)
        try:
            text = (work / path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        for line, ours in _conflict_regions(text)[:5]:
            console.print(f"    line {line}: upstream {to} has there now:", soft_wrap=True)
            for ln in ours[:hs.UPSTREAM_NOW_LINES]:
                console.print("      " + ln, markup=False, soft_wrap=True)
    w = _rel(work)
    console.print(
        "\n[bold]What to do next:[/]\n"
        f"  1. edit the conflicted file(s) in {w}/ (search for '<<<<<<<'), keeping upstream's\n"
        "     change and re-doing the patch's intent on top of it;\n"
        f"  2. git -C {w} add <file>...   (mark them resolved);\n"
        f"  3. make rebase-continue TO={to}   (commits this patch, applies the rest, exports).\n"
        f"  To drop this patch instead: git -C {w} am --skip, then step 3.\n"
        f"  To give up: make rebase TO={to} FORCE=1 starts over.", soft_wrap=True)


# --------------------------------------------------------------------------- continue
def continue_(to: str, root: Path | None = None) -> int:
    root = root or project_root()
    work = work_dir(root, to)
    state = _load_state(work, to)
    ps = load_patchset(state["from"], root)
    tree = GitTree(work)
    if state["next"] >= len(state["series"]):
        return _finish(tree, work, state, ps, root)
    name = state["series"][state["next"]]
    if _am_in_progress(work):
        unmerged = [p for p in tree.run("diff", "--name-only", "--diff-filter=U").split("\n") if p]
        marked = [p for p in tree.run("diff", "--name-only").split("\n") if p
                  and "<<<<<<< " in (work / p).read_text(errors="replace")] \
            if not unmerged else []
        if unmerged or marked:
            raise DeepinferError(
                f"patch {name} still has unresolved files in {_rel(work)}",
                details=[f"  {p}" for p in unmerged + marked],
                hint=f"resolve them, `git -C {_rel(work)} add` each, then "
                     f"`make rebase-continue TO={to}` again")
        try:
            tree.run("am", "--continue")
        except GitOpError as exc:
            raise DeepinferError(f"git am --continue failed for {name}", details=exc.details,
                                 hint=f"if the resolution leaves nothing to change, drop the "
                                      f"patch: git -C {_rel(work)} am --skip; then "
                                      f"`make rebase-continue TO={to}`")
    head = tree.rev_parse("HEAD")
    if head != state["head_before"]:
        state["applied"].append(name)
        info(f"{name}: resolved and committed")
    else:
        state["dropped"].append(name)
        warn(f"{name}: skipped; it is left out of the new series")
    state["next"] += 1
    _save_state(work, state)
    return _run_series(tree, work, state, ps, root)


# --------------------------------------------------------------------------- finish
def _pin_text(t: dict) -> str:
    q = lambda s: json.dumps(s)  # TOML basic strings == JSON strings for these values
    return (
        "# Upstream vLLM release this patch set applies to. Read by tools/deepinfer/patchset.py.\n"
        "# Written by `make rebase`; commit_short and sdist_sha256 were verified there.\n"
        f"package = {q(t['package'])}\nversion = {q(t['version'])}\n\n"
        "# The commit as recorded in the sdist's vllm/_version.py.\n"
        f"commit_short = {q(t['commit_short'])}\n\n"
        "# Full 40-character commit id: fill in once verified against the upstream repository.\n"
        'commit = ""\n\n'
        f"git_url = {q(t['git_url'])}\ngit_tag = {q(t['git_tag'])}\n\n"
        f"# sha256 of the published {t['package']}-{t['version']}.tar.gz\n"
        f"sdist_sha256 = {q(t['sdist_sha256'])}\n")


def _manifest(tree: GitTree, root: Path, state: dict, old_ps: PatchSet
              ) -> tuple[OverlayManifest, list[str]]:
    from .patchset import read_manifest
    blobs = tree.ls_tree(BASE_REF)
    old_blobs = tree.ls_tree(OLD_BASE)
    old = read_manifest(old_ps.manifest_path)
    old_rows = old.by_path() if old else {}
    entries, notes = [], []
    for f in overlay_files(root):
        blob = blobs.get(f.tree_path)
        prev = old_rows.get(f.tree_path)
        was = prev.upstream_blob if prev and prev.kind == "replace" else old_blobs.get(f.tree_path)
        if blob is None:
            entries.append(ManifestEntry(f.tree_path, f.rel_source, "new"))
            if was:
                notes.append(f"{f.tree_path}: upstream {state['to']} no longer has it; the "
                             "overlay now adds it as a new file")
        else:
            entries.append(ManifestEntry(f.tree_path, f.rel_source, "replace", blob))
            if not was:
                notes.append(f"{f.tree_path}: upstream {state['to']} now has this path; the "
                             "overlay replaces upstream's file (review: git -C "
                             f"{_rel(tree.path)} show {BASE_REF}:{f.tree_path})")
            elif was != blob:
                notes.append(f"{f.tree_path}: upstream changed it ({was[:12]} -> {blob[:12]}); "
                             f"port the change: git -C {_rel(tree.path)} diff {was} {blob}")
    pkg_commit = state["target"]["commit_short"]
    return OverlayManifest(state["to"], pkg_commit, entries), notes


def _range_diff(tree: GitTree) -> list[tuple[str, str, str, str]]:
    """(old #, marker, new #, subject) per patch from ``git range-diff``."""
    out = tree.run("range-diff", "--no-color", "-s", f"{OLD_BASE}..{OLD_TIP}",
                   f"{BASE_REF}..HEAD")
    rows = []
    for ln in out.split("\n"):
        parts = ln.split(None, 5)
        # "1:  abcdef = 1:  123456 subject" / "1:  abcdef < -:  ------- subject"
        if len(parts) >= 5 and parts[0].endswith(":") and parts[2] in ("=", "!", "<", ">"):
            rows.append((parts[0].rstrip(":"), parts[2], parts[3].rstrip(":"),
                         parts[5] if len(parts) > 5 else ""))
    return rows


def _print_changed_bodies(tree: GitTree, max_lines: int = 60) -> None:
    """For every patch marked ``!`` by range-diff, its diff-of-diffs (truncated)."""
    out = tree.run("range-diff", "--no-color", f"{OLD_BASE}..{OLD_TIP}", f"{BASE_REF}..HEAD",
                   strip=False)
    section: list[str] = []
    sections: list[list[str]] = []
    for ln in out.split("\n"):
        parts = ln.split(None, 3)
        if len(parts) >= 3 and parts[0].endswith(":") and parts[2] in ("=", "!", "<", ">"):
            section = [ln]
            sections.append(section)
        elif section:
            section.append(ln)
    for sec in sections:
        if sec[0].split(None, 3)[2] != "!":
            continue
        body = [ln for ln in sec[1:] if ln.strip()]
        console.print(sec[0], markup=False, soft_wrap=True)
        for ln in body[:max_lines]:
            console.print(ln, markup=False, soft_wrap=True)
        if len(body) > max_lines:
            console.print(f"    ... {len(body) - max_lines} more lines", soft_wrap=True)


def _finish(tree: GitTree, work: Path, state: dict, ps: PatchSet, root: Path) -> int:
    from .export import exported_patches
    to = state["to"]
    dest = patch_dir(to, root)
    if dest.exists() and not state.get("force"):
        raise DeepinferError(f"{_rel(dest)} appeared meanwhile; not overwriting it",
                             hint=f"move it away, or run `make rebase TO={to} FORCE=1`")
    base = tree.rev_parse(BASE_REF)
    names, files = exported_patches(tree, base, ps, None)
    manifest, notes = _manifest(tree, root, state, ps)
    staging = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    source.remove_tree(staging)
    staging.mkdir(parents=True)
    try:
        (staging / "pin.toml").write_text(_pin_text(state["target"]), encoding="utf-8")
        for n in names:
            (staging / n).write_bytes(files[n])
        old_series = ps.series_path.read_text(encoding="utf-8") if ps.series_path.exists() else ""
        header = [ln for ln in old_series.splitlines() if ln.startswith("#")]
        if header:
            (staging / "series").write_text("\n".join(header) + "\n", encoding="utf-8")
        write_series(staging / "series", names)
        write_manifest(staging / "overlay.toml", manifest)
        if dest.exists():
            source.remove_tree(dest)
        os.rename(staging, dest)
    except BaseException:
        source.remove_tree(staging)
        raise
    table = Table(title=f"rebase {state['from']} -> {to}: old vs new series (git range-diff)")
    for col in ("old", "", "new", "patch"):
        table.add_column(col)
    meaning = {"=": "[green]= same change[/]", "!": "[yellow]! changed[/]",
               "<": "[red]< dropped[/]", ">": "[cyan]> new[/]"}
    for old_n, mark, new_n, subj in _range_diff(tree):
        table.add_row(old_n, meaning[mark], new_n, subj)
    console.print(table)
    _print_changed_bodies(tree)
    for n in state["dropped"]:
        warn(f"{n} was dropped (its change is upstream in {to}, or you skipped it)")
    for note in notes:
        warn("overlay: " + note)
    info(f"[green]wrote {_rel(dest)}[/]: {len(names)} patches, pin, series, overlay.toml. "
         f"Full per-patch diff: git -C {_rel(work)} range-diff {OLD_BASE}..{OLD_TIP} "
         f"{BASE_REF}..HEAD. Next: make apply VLLM={to}")
    return 0


# --------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", required=True, help="target vLLM release, e.g. 0.34.0")
    p.add_argument("--vllm", default=None, help="patch set to move (default $VLLM or 0.33.0)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing patches/vllm-<to>/ or an unfinished rebase")
    p.add_argument("--continue", dest="cont", action="store_true",
                   help="after resolving a conflict: git am --continue, then the rest")


def run(args: argparse.Namespace) -> int:
    to = args.to
    if args.cont:
        return continue_(to)
    version = args.vllm or os.environ.get("VLLM") or "0.33.0"
    force = args.force or os.environ.get("FORCE") == "1"
    return start(to, version, force)


def register(sub) -> None:
    p = sub.add_parser("rebase", help="move the patch set onto another vLLM release")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="deepinfer rebase", description=__doc__.splitlines()[0])
    add_arguments(p)
    try:
        return run(p.parse_args(argv))
    except DeepinferError as exc:
        report_error(exc)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
