"""``deepinfer apply`` / ``check`` / ``status`` / ``clean``: build and inspect patched trees.

An applied tree ``build/vllm-<version>/`` is a git repository with

1. a base commit holding the pristine upstream tree (ref ``refs/deepinfer/base``);
2. one commit per patch of the series (``git am --3way``, subject = the patch's subject);
3. one overlay commit: ``overlay/**`` onto the tree root, ``csrc/**`` to
   ``csrc/deepinfer_sm80/``, and the files generated from the set's pin
   (``vllm/deepinfer_sm80_pin.py``) (message trailer ``Deepinfer-Overlay:``).

Before anything is built the whole series is checked in a scratch index and every failing
patch is reported (patch, hunk, file, what the patch expects and what upstream has there).
The new tree is built in a staging directory next to the target and renamed into place
only when complete, so an interrupted apply leaves the previous tree or nothing. The
inputs' fingerprint is stored in ``.git/deepinfer-state.json``: unchanged inputs make
apply a no-op. A tree with uncommitted edits, or commits not yet exported, is refused
unless ``force``.
"""
from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import unidiff
from rich.table import Table

from . import gittree as g
from . import source
from .console import DeepinferError, console, info, warn
from .gittree import BASE_REF, OVERLAY_TRAILER, GitTree
from .patchset import (CSRC_TREE_PREFIX, GeneratedFile, OverlayFile, PatchSet,
                       check_generated_paths, generated_files, inputs_fingerprint,
                       load_patchset, overlay_files, project_root, read_manifest)

STATE_FILE = "deepinfer-state.json"
STATE_FORMAT = 1


# --------------------------------------------------------------------------- paths

def build_root(root: Path | None = None) -> Path:
    """``$DEEPINFER_BUILD_DIR`` or ``<repo>/build``."""
    env = os.environ.get("DEEPINFER_BUILD_DIR")
    return Path(env).resolve() if env else (root or project_root()) / "build"


def tree_dir(version: str, build: Path) -> Path:
    return build / f"vllm-{version}"


def _rel(p: Path) -> str:
    try:
        return os.path.relpath(p)
    except ValueError:
        return str(p)


# --------------------------------------------------------------------------- state

def read_state(tree: Path) -> dict | None:
    """The state record of an applied tree, or None when the tree was not made by us."""
    f = tree / ".git" / STATE_FILE
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("format") == STATE_FORMAT else None


def write_state(tree: Path, state: dict) -> None:
    f = tree / ".git" / STATE_FILE
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, f)


# --------------------------------------------------------------------------- series check

@dataclass
class PatchFailure:
    """Why one patch does not apply, in terms a maintainer can act on."""

    reason: str
    file: str = ""
    hunk: str = ""
    expected: list[str] = field(default_factory=list)
    actual: list[str] = field(default_factory=list)
    stderr: str = ""

    def render(self) -> list[str]:
        lines = [f"    {self.reason}"]
        if self.file:
            lines.append(f"    file: {self.file}")
        if self.hunk:
            lines.append(f"    hunk: {self.hunk}")
        if self.expected or self.actual:
            diff = list(difflib.unified_diff(
                [l.rstrip("\n") for l in self.expected], [l.rstrip("\n") for l in self.actual],
                "patch expects", "upstream has", lineterm="", n=2))
            lines += ["    " + d for d in diff[:40]]
            if len(diff) > 40:
                lines.append(f"    ... ({len(diff) - 40} more diff lines)")
        elif self.stderr and not self.file:
            lines += ["    " + s for s in self.stderr.splitlines()[:10]]
        return lines


@dataclass
class PatchCheck:
    name: str
    status: str  # "clean", "3-way", "failed"
    failure: PatchFailure | None = None


_RE_FAILED = re.compile(r"^error: patch failed: (.+):(\d+)$", re.M)
_RE_MISSING = re.compile(r"^error: (.+): (?:does not exist in index|No such file or directory)$",
                         re.M)
_RE_EXISTS = re.compile(r"^error: (.+): already exists in (?:index|working directory)$", re.M)
_RE_CORRUPT = re.compile(r"^(?:error|fatal): (corrupt patch at line \d+|.*(?:no valid patches|"
                         r"unrecognized input).*)$", re.M)


def _find_hunk(patch_text: str, path: str, line: int):
    try:
        ps = unidiff.PatchSet(patch_text)
    except unidiff.UnidiffParseError:
        return None
    for pf in ps:
        if path in (pf.path, pf.source_file.removeprefix("a/"), pf.target_file.removeprefix("b/")):
            for h in pf:
                if h.source_start == line:
                    return h
            return pf[0] if len(pf) else None
    return None


def diagnose(tree: GitTree, index: Path, patch: bytes, stderr: str) -> PatchFailure:
    """Turn ``git apply`` stderr into a :class:`PatchFailure` (hunk, file, both texts)."""
    m = _RE_FAILED.search(stderr)
    if m:
        path, line = m.group(1), int(m.group(2))
        hunk = _find_hunk(patch.decode("utf-8", errors="replace"), path, line)
        current = tree.show_index_file(index, path)
        if hunk is None or current is None:
            return PatchFailure(f"hunk at line {line} does not apply", path, stderr=stderr)
        expected = [l.value for l in hunk if l.is_context or l.is_removed]
        cur_lines = current.decode("utf-8", errors="replace").splitlines(keepends=True)
        start = max(hunk.source_start - 1, 0)
        actual = cur_lines[start:start + max(len(expected), 1)]
        header = (f"@@ -{hunk.source_start},{hunk.source_length} "
                  f"+{hunk.target_start},{hunk.target_length} @@ {hunk.section_header}").rstrip()
        return PatchFailure(f"hunk does not match upstream at line {line}", path, header,
                            expected, actual, stderr)
    m = _RE_MISSING.search(stderr)
    if m:
        return PatchFailure("the file the patch changes does not exist upstream "
                            "(moved or removed?)", m.group(1), stderr=stderr)
    m = _RE_EXISTS.search(stderr)
    if m:
        return PatchFailure("the patch creates a file that already exists upstream",
                            m.group(1), stderr=stderr)
    m = _RE_CORRUPT.search(stderr)
    if m:
        return PatchFailure(f"the patch file is malformed: {m.group(1)}", stderr=stderr)
    return PatchFailure("git apply failed", stderr=stderr)


@contextlib.contextmanager
def scratch_index(tree: GitTree, rev: str):
    """A temporary index file holding ``rev``'s tree (removed afterwards)."""
    idx = tree.git_dir / f"deepinfer-scratch-{os.getpid()}-{time.monotonic_ns()}.index"
    tree.read_tree_into(idx, rev)
    try:
        yield idx
    finally:
        idx.unlink(missing_ok=True)
        Path(str(idx) + ".lock").unlink(missing_ok=True)


def is_generated(path: str, package: str = "vllm") -> bool:
    """Files the sdist build generates (committed in the base, never patched)."""
    parts = path.split("/")
    return (any(p.endswith(".egg-info") for p in parts[:-1]) or parts[-1] == "PKG-INFO"
            or path == f"{package}/_version.py")


def patch_paths(data: bytes) -> list[str]:
    """Paths a patch touches (old and new names), from its ``diff --git`` headers."""
    paths = []
    for m in re.finditer(rb"^diff --git a/(\S+) b/(\S+)$", data, re.M):
        for p in (m.group(1), m.group(2)):
            s = p.decode("utf-8", errors="replace")
            if s not in paths:
                paths.append(s)
    return paths


def check_series_in_index(tree: GitTree, index: Path, ps: PatchSet) -> list[PatchCheck]:
    """Apply the series to a scratch index; a failing patch is skipped, the rest go on.

    Each patch is tried plainly, then with ``--3way``. Later patches are checked on top
    of the ones that applied, so every independent failure is found in one run.
    """
    results = []
    for path in ps.patch_paths:
        data = path.read_bytes()
        generated = [p for p in patch_paths(data) if is_generated(p, ps.pin.package)]
        if generated:
            results.append(PatchCheck(path.name, "failed", PatchFailure(
                "changes generated files, which are never patched (they come from the "
                "sdist build)", ", ".join(generated))))
            continue
        ok, err = tree.apply_check(data, index, apply=True)
        if ok:
            results.append(PatchCheck(path.name, "clean"))
            continue
        ok3, _ = tree.apply_check(data, index, threeway=True, apply=True)
        if ok3:
            results.append(PatchCheck(path.name, "3-way"))
            continue
        results.append(PatchCheck(path.name, "failed", diagnose(tree, index, data, err)))
    return results


def add_overlay_to_index(tree: GitTree, index: Path, overlay: list[OverlayFile],
                         generated: list[GeneratedFile]) -> None:
    blobs = g.hash_objects(tree, [f.source for f in overlay])
    entries = [("100755" if f.executable else "100644", b, f.tree_path)
               for f, b in zip(overlay, blobs)]
    entries += [("100644", g.hash_data(tree, f.data), f.tree_path) for f in generated]
    g.index_add_blobs(tree, index, entries)


def expected_tree(tree: GitTree, base: str, ps: PatchSet,
                  overlay: list[OverlayFile]) -> tuple[str | None, list[PatchCheck]]:
    """Tree id of base + series + overlay computed in a scratch index (None on failure)."""
    with scratch_index(tree, base) as idx:
        checks = check_series_in_index(tree, idx, ps)
        if any(c.status == "failed" for c in checks):
            return None, checks
        add_overlay_to_index(tree, idx, overlay, generated_files(ps))
        return g.write_tree(tree, idx), checks


def failures_error(checks: list[PatchCheck], ps: PatchSet) -> DeepinferError:
    failed = [c for c in checks if c.status == "failed"]
    details = []
    pdir = _rel(ps.directory)
    for c in failed:
        details.append(f"  {c.name}")
        details += c.failure.render() if c.failure else []
        where = f" ({c.failure.file})" if c.failure and c.failure.file else ""
        details.append(f"    fix: edit {pdir}/{c.name}{where} to match, or remove it from "
                       f"{pdir}/series and redo it in the tree (see hint)")
    return DeepinferError(
        f"{len(failed)} of {len(checks)} patches do not apply to vLLM {ps.pin.version}; "
        "nothing was changed", details=details,
        hint=f"refresh each failing patch: edit {pdir}/<patch> so the hunk matches the "
             f"upstream text shown, or drop it from {pdir}/series, run `make apply`, redo "
             f"the change in build/vllm-{ps.pin.version}, commit it there and run "
             "`make export` (docs/patch-workflow.md)")


# --------------------------------------------------------------------------- overlay manifest

def overlay_conflicts(ps: PatchSet, overlay: list[OverlayFile]) -> list[str]:
    """Warnings for patches that change files the overlay replaces (the overlay commit
    would silently overwrite the patch's change)."""
    paths = {f.tree_path: f.rel_source for f in overlay}
    out = []
    for p in ps.patch_paths:
        hit = [x for x in patch_paths(p.read_bytes()) if x in paths]
        if hit:
            out.append(f"{p.name} changes {', '.join(hit)}, which the overlay replaces "
                       f"({', '.join(paths[h] for h in hit)}); the patch's change there is lost")
    return out


def check_manifest(ps: PatchSet, overlay: list[OverlayFile], base_blobs: dict[str, str],
                   tree_rel: str) -> list[str]:
    """Compare the overlay with ``overlay.toml`` and the pinned base.

    Returns warnings (missing or stale entries); raises for contradictions: a file the
    manifest calls new that exists upstream, or a replacement written against another
    upstream blob than the base has.
    """
    manifest = read_manifest(ps.manifest_path)
    warnings: list[str] = []
    if manifest is None:
        if overlay:
            warnings.append(f"{_rel(ps.manifest_path)} does not exist; run `make manifest`")
        return warnings
    rows = manifest.by_path()
    errors = []
    unlisted = []
    for f in overlay:
        row = rows.pop(f.tree_path, None)
        upstream = base_blobs.get(f.tree_path)
        if row is None:
            unlisted.append(f.rel_source)
        elif row.kind == "new" and upstream is not None:
            errors.append(f"  {f.rel_source}: manifest says new, but upstream has "
                          f"{f.tree_path} (blob {upstream})")
        elif row.kind == "replace" and upstream is None:
            errors.append(f"  {f.rel_source}: replaces {f.tree_path}, which upstream no "
                          "longer has")
        elif row.kind == "replace" and upstream != row.upstream_blob:
            errors.append(f"  {f.rel_source}: written against upstream blob "
                          f"{row.upstream_blob}, upstream now has {upstream}; see what "
                          f"changed: git -C {tree_rel} diff {row.upstream_blob} {upstream}")
    if unlisted:
        warnings.append(f"overlay files not in {_rel(ps.manifest_path)}: "
                        + ", ".join(unlisted) + "; run `make manifest`")
    if rows:
        warnings.append(f"{_rel(ps.manifest_path)} lists files the overlay no longer has: "
                        + ", ".join(sorted(rows)) + "; run `make manifest`")
    if errors:
        raise DeepinferError("the overlay does not match the pinned upstream", details=errors,
                             hint="review the upstream change, update the overlay file, then "
                                  "record the new base with `make manifest`")
    return warnings


# --------------------------------------------------------------------------- tree state

@dataclass
class TreeProblems:
    dirty: list[str] = field(default_factory=list)        # "M path", "?? path", ...
    commits: list[str] = field(default_factory=list)      # commits not made by apply
    unexported: bool = False                              # commits differ from patch files
    # paths whose committed content no patch or overlay file has (e.g. amended into the
    # overlay commit, which export skips), and the tree id the inputs would produce
    unsaved_paths: list[str] = field(default_factory=list)
    expected: str | None = None
    apply_head: str | None = None                         # HEAD as apply left it

    def __bool__(self) -> bool:
        return bool(self.dirty) or self.unexported


def inspect_tree(tree: GitTree, state: dict, ps: PatchSet) -> TreeProblems:
    """Uncommitted edits, and commits made after apply that the patch files lack."""
    probs = TreeProblems(dirty=[f"{e.code.strip() or '?'} {e.path}" for e in tree.status()])
    head = tree.try_rev_parse("HEAD")
    if head != state.get("head"):
        base = tree.try_rev_parse(BASE_REF) or state.get("base", "")
        try:
            probs.commits = [f"{c.sha[:12]} {c.subject}"
                             for c in tree.commits(f"{state.get('head')}..HEAD")]
        except DeepinferError:
            probs.commits = ["(history rewritten since apply)"]
        from .export import exported_patches  # noqa: PLC0415 (export imports apply)
        try:
            names, files = exported_patches(tree, base, ps, state)
            same = names == ps.series and all(
                (ps.directory / n).read_bytes() == files[n] for n in names)
        except DeepinferError:
            same = False
        if same:
            # Export skips the overlay commit, so the patch files can match while a commit
            # carries more (e.g. `git commit --amend` onto the overlay commit). Compare
            # HEAD's tree with what the inputs build.
            overlay = overlay_files(ps.directory.parents[1])
            want, _ = expected_tree(tree, base, ps, overlay)
            if want is not None and want != g.tree_of(tree, "HEAD"):
                diff = tree.changed_paths(want, "HEAD")
                # Overlay-managed files also differ when overlay/ or csrc/ changed in the
                # repository since apply (an input change, rebuilt on purpose): count them
                # only where HEAD differs from what apply wrote.
                managed = {f.tree_path for f in overlay}
                try:
                    edited = set(tree.changed_paths(state["head"], "HEAD"))
                except (DeepinferError, KeyError):
                    edited = set(diff)
                probs.unsaved_paths = [p for p in diff if p not in managed or p in edited]
                probs.expected = want
                probs.apply_head = state.get("head")
                same = not probs.unsaved_paths
        probs.unexported = not same
    return probs


def refuse_error(tree_path: Path, probs: TreeProblems) -> DeepinferError:
    details = []
    if probs.dirty:
        details.append(f"  uncommitted changes ({len(probs.dirty)}):")
        details += [f"    {d}" for d in probs.dirty[:200]]
        if len(probs.dirty) > 200:
            details.append(f"    ... and {len(probs.dirty) - 200} more")
    if probs.unexported:
        if probs.unsaved_paths:
            details.append("  committed changes that no patch or overlay file has (export "
                           "skips the overlay commit; were they amended into it?):")
            details += [f"    {p}" for p in probs.unsaved_paths[:200]]
            details += [f"    in {c}" for c in probs.commits]
        elif probs.commits:
            details.append("  commits not saved in the patch set:")
            details += [f"    {c}" for c in probs.commits]
        else:
            details.append("  HEAD moved since apply (commits removed or rewritten); the "
                           "tree's history no longer matches the patch files")
    hint = ("commit them and run `make export` to keep them as patches, or re-run with "
            "FORCE=1 to rebuild anyway (your changes are saved to build/vllm-<ver>."
            "force-backup-<time>/ first)")
    if probs.unsaved_paths and probs.apply_head:
        hint = (f"give them a commit of their own: `git -C {_rel(tree_path)} reset --soft "
                f"{probs.apply_head[:12]}` (HEAD as apply left it; your changes stay staged), "
                "`git commit`, then `make export`; or re-run with FORCE=1 to rebuild anyway "
                "(they are saved to build/vllm-<ver>.force-backup-<time>/ first)")
    return DeepinferError(
        f"{_rel(tree_path)} has changes that re-applying would discard", details=details,
        hint=hint)


def _backup(tree: GitTree, target: Path, state: dict, probs: TreeProblems) -> Path | None:
    """Save what a forced rebuild would discard into ``<target>.force-backup-<time>/``:
    ``uncommitted.diff`` (untracked files included), one mbox per commit between the
    base and HEAD except the overlay commit (the series' commits and the user's), and
    ``unsaved-committed.diff`` (expected tree -> HEAD) when committed changes are in no
    patch file (amended into the overlay commit)."""
    out = target.parent / f"{target.name}.force-backup-{time.strftime('%Y%m%d-%H%M%S')}"
    saved = False
    if probs.dirty:
        with scratch_index(tree, "HEAD") as idx:
            tree.run("add", "-A", ".", env={"GIT_INDEX_FILE": str(idx)})
            diff = tree.diff_binary("HEAD", idx)
        if diff.strip():
            out.mkdir(parents=True, exist_ok=True)
            (out / "uncommitted.diff").write_bytes(diff)
            saved = True
    if probs.unsaved_paths and probs.expected:
        out.mkdir(parents=True, exist_ok=True)
        (out / "unsaved-committed.diff").write_bytes(tree.run(
            "diff", "--binary", "--full-index", probs.expected, "HEAD", binary=True,
            strip=False))
        saved = True
    if probs.unexported:
        try:
            commits = tree.commits(f"{state.get('base')}..HEAD")
        except DeepinferError:
            commits = []
        for i, c in enumerate(commits, 1):
            if re.search(rf"^{OVERLAY_TRAILER}: ", c.message, re.M):
                continue
            out.mkdir(parents=True, exist_ok=True)
            stem = re.sub(r"[^A-Za-z0-9]+", "-", c.subject).strip("-").lower()[:50]
            (out / f"{i:04d}-{stem}.patch").write_bytes(tree.format_patch(c.sha))
            saved = True
    return out if saved else None


# --------------------------------------------------------------------------- apply

def _checkpoint(stage: str) -> None:
    """Called between apply stages; tests replace it to simulate an interruption."""


@contextlib.contextmanager
def _lock(build: Path, version: str):
    build.mkdir(parents=True, exist_ok=True)
    lock = build / f".vllm-{version}.lock"
    with open(lock, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DeepinferError(f"another deepinfer command is working on "
                                 f"{_rel(tree_dir(version, build))}",
                                 hint="wait for it to finish")
        yield


def recover_interrupted(build: Path, version: str) -> None:
    """Undo what an interrupted apply left: stale staging dirs go, a previous tree moved
    aside comes back."""
    target = tree_dir(version, build)
    for p in build.glob(f".vllm-{version}.tmp-*"):
        source.remove_tree(p)
    olds = sorted(build.glob(f".vllm-{version}.old-*"))
    if olds and not target.exists():
        os.rename(olds[-1], target)
        warn(f"restored the previous {_rel(target)} left by an interrupted apply")
        olds = olds[:-1]
    for p in olds:
        source.remove_tree(p)


def _set_symlink(build: Path, version: str) -> None:
    link = build / "vllm"
    if link.exists() and not link.is_symlink():
        warn(f"{_rel(link)} is not a symlink; left as it is (remove it to get the "
             f"build/vllm -> vllm-{version} link)")
        return
    tmp = build / f".vllm-link-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(f"vllm-{version}", tmp)
    os.replace(tmp, link)


def _copy_overlay(overlay: list[OverlayFile], generated: list[GeneratedFile],
                  dest: Path) -> None:
    for f in [*overlay, *generated]:
        out = dest / f.tree_path
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.is_symlink() or out.is_dir():
            source.remove_tree(out)
        if isinstance(f, GeneratedFile):
            out.write_bytes(f.data)
        else:
            shutil.copy2(f.source, out)


def _overlay_message(ps: PatchSet, overlay: list[OverlayFile], fingerprint: str) -> str:
    n_csrc = sum(1 for f in overlay if f.tree_path.startswith(CSRC_TREE_PREFIX + "/"))
    return (f"deepinfer-sm80 overlay for vLLM {ps.pin.version}\n\n"
            f"{len(overlay) - n_csrc} files from overlay/ onto the tree root and {n_csrc} "
            f"from csrc/ into {CSRC_TREE_PREFIX}/.\nGenerated by `make apply`; edit the "
            f"files in the DeepInfer-SM80 repository, not here.\n\n"
            f"{OVERLAY_TRAILER}: {fingerprint[:16]}\n")


@dataclass
class ApplyResult:
    tree: Path
    changed: bool
    checks: list[PatchCheck] = field(default_factory=list)
    state: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


def apply(version: str, spec: source.SourceSpec, force: bool = False,
          root: Path | None = None, build: Path | None = None) -> ApplyResult:
    """Materialise ``build/vllm-<version>`` (see the module docstring)."""
    t0 = time.monotonic()
    root = root or project_root()
    build = build or build_root(root)
    ps = load_patchset(version, root)
    overlay = overlay_files(root)
    desc = source.describe(spec, ps.pin)
    fingerprint = inputs_fingerprint(ps, overlay, desc)
    target = tree_dir(version, build)
    with _lock(build, version):
        recover_interrupted(build, version)
        backup = None
        if target.exists():
            state = read_state(target)
            if state is None:
                if not force:
                    raise DeepinferError(f"{_rel(target)} exists but was not made by "
                                         "`deepinfer apply`",
                                         hint="move it away, or re-run with FORCE=1 to "
                                              "replace it")
            else:
                gt = GitTree(target)
                probs = inspect_tree(gt, state, ps)
                if probs and not force:
                    raise refuse_error(target, probs)
                if not probs and not probs.commits and state.get("fingerprint") == fingerprint:
                    _set_symlink(build, version)
                    info(f"[green]{_rel(target)} is up to date[/] (inputs unchanged since the "
                         "last apply); nothing to do")
                    return ApplyResult(target, False, state=state,
                                       seconds=time.monotonic() - t0)
                if probs and force:
                    backup = _backup(gt, target, state, probs)
        result = _build(ps, overlay, spec, fingerprint, target, build)
        if backup:
            result.warnings.append(f"changes of the old tree saved to {_rel(backup)}/")
    _set_symlink(build, version)
    result.seconds = time.monotonic() - t0
    return result


BASE_CACHE_FORMAT = 2


def _base_cache_dir(desc: str) -> Path:
    return source.cache_root() / "bases" / hashlib.sha256(desc.encode()).hexdigest()[:32]


def _materialize_base(ps: PatchSet, spec: source.SourceSpec,
                      staging: Path) -> tuple[GitTree, str, source.SourceInfo]:
    """Staging repository holding the base commit (pristine upstream, ``refs/deepinfer/base``).

    For sdist and git sources the base commit is also kept as one pack in the per-user
    cache (``<cache>/bases/<hash of the source identity>/``), written right after the
    source was verified; a later apply checks the commit out of that pack instead of
    unpacking and hashing ~9k files again. Set ``DEEPINFER_NO_BASE_CACHE=1`` to bypass it;
    a damaged cache entry is ignored and rebuilt.
    """
    desc = source.describe(spec, ps.pin)
    use_cache = spec.kind in ("sdist", "git") and not os.environ.get("DEEPINFER_NO_BASE_CACHE")
    cdir = _base_cache_dir(desc)
    if use_cache and (cdir / "base.json").is_file():
        try:
            meta = json.loads((cdir / "base.json").read_text())
            if meta.get("format") != BASE_CACHE_FORMAT or meta.get("source") != desc:
                raise ValueError("stale entry")
            tree = GitTree.init(staging)
            packdir = tree.git_dir / "objects" / "pack"
            for f in sorted(cdir.glob("*.pack")) + sorted(cdir.glob("*.idx")):
                try:
                    os.link(f, packdir / f.name)
                except OSError:
                    shutil.copyfile(f, packdir / f.name)
            base = meta["base"]
            tree.run("update-ref", f"refs/heads/{g.BRANCH}", base)
            tree.update_ref(BASE_REF, base)
            tree.run("read-tree", "-u", "--reset", "HEAD")
            _checkpoint("source")
            _checkpoint("base")
            return tree, base, source.SourceInfo(spec.kind, desc, meta["commit"], meta["label"])
        except (OSError, ValueError, KeyError, DeepinferError) as exc:
            warn(f"ignoring the cached base in {cdir} ({exc}); rebuilding it")
            source.remove_tree(staging)
    src = source.materialize(spec, ps.pin, staging)
    _checkpoint("source")
    tree = GitTree.init(staging)
    base = tree.commit_all(
        f"vLLM {ps.pin.version} pristine upstream\n\nSource: {src.label}\n"
        f"Upstream commit: {src.commit}\n")
    tree.update_ref(BASE_REF, base)
    _checkpoint("base")
    if use_cache:
        _write_base_cache(tree, base, src, cdir)
    return tree, base, src


def _prune_base_cache(bases: Path) -> None:
    """Drop cache entries written by another cache format (they are never read again)."""
    for entry in bases.iterdir():
        meta = entry / "base.json"
        try:
            stale = json.loads(meta.read_text()).get("format") != BASE_CACHE_FORMAT
        except (OSError, ValueError):
            stale = entry.is_dir() and not entry.name.startswith(".")
        if stale:
            source.remove_tree(entry)


def _write_base_cache(tree: GitTree, base: str, src: source.SourceInfo, cdir: Path) -> None:
    tmp = cdir.parent / f".{cdir.name}.tmp-{os.getpid()}"
    try:
        source.remove_tree(tmp)
        tmp.mkdir(parents=True)
        tree.run("-c", "pack.compression=1", "pack-objects", "--window=0", "--revs", "-q",
                 str(tmp / "base"), stdin=f"{base}\n".encode())
        (tmp / "base.json").write_text(json.dumps(
            {"format": BASE_CACHE_FORMAT, "source": src.description, "base": base,
             "commit": src.commit, "label": src.label}, indent=2) + "\n")
        source.remove_tree(cdir)
        os.rename(tmp, cdir)
        _prune_base_cache(cdir.parent)
    except (OSError, DeepinferError) as exc:
        warn(f"could not cache the base commit in {cdir}: {exc}")
    finally:
        source.remove_tree(tmp)


def _build(ps: PatchSet, overlay: list[OverlayFile], spec: source.SourceSpec,
           fingerprint: str, target: Path, build: Path) -> ApplyResult:
    staging = build / f".vllm-{ps.pin.version}.tmp-{os.getpid()}"
    try:
        tree, base, src = _materialize_base(ps, spec, staging)
        _checkpoint("base")
        base_blobs = tree.ls_tree(base)
        check_generated_paths(overlay, generated_files(ps))
        warnings = check_manifest(ps, overlay, base_blobs, _rel(target))
        warnings += overlay_conflicts(ps, overlay)
        want_tree, checks = expected_tree(tree, base, ps, overlay)
        if want_tree is None:
            raise failures_error(checks, ps)
        patches = []
        for path, chk in zip(ps.patch_paths, checks):
            try:
                sha = tree.am(path, threeway=True)
            except g.GitOpError as exc:
                raise DeepinferError(f"git am failed for {path.name} although the dry run "
                                     "passed", details=exc.details,
                                     hint="report this; nothing was changed")
            patches.append({"name": path.name, "commit": sha, "check": chk.status})
            _checkpoint("patch")
        generated = generated_files(ps)
        _copy_overlay(overlay, generated, staging)
        tree.add_paths([f.tree_path for f in [*overlay, *generated]])
        head = tree.commit_index(_overlay_message(ps, overlay, fingerprint))
        got_tree = g.tree_of(tree, head)
        if got_tree != want_tree:
            raise DeepinferError("the applied tree differs from the dry run's result "
                                 f"({got_tree} != {want_tree})", hint="report this")
        state = {"format": STATE_FORMAT, "version": ps.pin.version, "fingerprint": fingerprint,
                 "source": src.description, "source_label": src.label,
                 "upstream_commit": src.commit, "base": base, "head": head,
                 "overlay_commit": head, "overlay_files": len(overlay), "patches": patches}
        write_state(staging, state)
        _checkpoint("swap")
        old = None
        if target.exists():
            built = sorted(p.name for p in target.glob("deepinfer_sm80/*.so"))
            if built:
                warnings.append(f"the previous tree had a built extension ({', '.join(built)}); "
                                "the new tree has none: run `make build` again")
            old = build / f".vllm-{ps.pin.version}.old-{os.getpid()}"
            os.rename(target, old)
        os.rename(staging, target)
        if old is not None:
            source.remove_tree(old)
        return ApplyResult(target, True, checks, state, warnings)
    except BaseException:
        source.remove_tree(staging)
        raise


def print_summary(res: ApplyResult) -> None:
    st = res.state
    for w in res.warnings:
        warn(w)
    if not res.changed:
        return
    table = Table(title=f"{_rel(res.tree)}  (vLLM {st['version']})", show_lines=False)
    table.add_column("#", justify="right")
    table.add_column("commit", no_wrap=True)
    table.add_column("what", overflow="fold")
    table.add_column("apply", no_wrap=True)
    table.add_row("", st["base"][:12], f"base: pristine upstream ({st['source_label']})", "")
    for i, p in enumerate(st["patches"], 1):
        table.add_row(str(i), p["commit"][:12], p["name"], p["check"])
    table.add_row("", st["overlay_commit"][:12],
                  f"overlay: {st['overlay_files']} files", "")
    console.print(table)
    info(f"[green]applied[/] base + {len(st['patches'])} patches + overlay in "
         f"{res.seconds:.1f} s; build/vllm -> {res.tree.name}")


# --------------------------------------------------------------------------- check / status

def _base_for(version: str, spec: source.SourceSpec, ps: PatchSet, build: Path,
              stack: contextlib.ExitStack) -> GitTree:
    """A repository whose ``refs/deepinfer/base`` is the pinned upstream: the applied
    tree when it was made from the same source, else a temporary one."""
    target = tree_dir(version, build)
    state = read_state(target) if target.exists() else None
    if state and state.get("source") == source.describe(spec, ps.pin):
        t = GitTree(target)
        if t.try_rev_parse(BASE_REF):
            return t
    build.mkdir(parents=True, exist_ok=True)
    tmp = build / f".vllm-{version}.check-{os.getpid()}"
    stack.callback(source.remove_tree, tmp)
    source.remove_tree(tmp)
    t, _, _ = _materialize_base(ps, spec, tmp)
    return t


def check(version: str, spec: source.SourceSpec, root: Path | None = None,
          build: Path | None = None) -> list[PatchCheck]:
    """Dry run: check the series (and overlay manifest) against the pinned base; prints a
    table and raises when a patch fails. Changes no tree."""
    root = root or project_root()
    build = build or build_root(root)
    ps = load_patchset(version, root)
    overlay = overlay_files(root)
    check_generated_paths(overlay, generated_files(ps))
    with contextlib.ExitStack() as stack:
        t = _base_for(version, spec, ps, build, stack)
        base = t.rev_parse(BASE_REF)
        for w in (check_manifest(ps, overlay, t.ls_tree(base), _rel(tree_dir(version, build)))
                  + overlay_conflicts(ps, overlay)):
            warn(w)
        with scratch_index(t, base) as idx:
            checks = check_series_in_index(t, idx, ps)
    table = Table(title=f"dry run: {len(checks)} patches against vLLM {version}")
    table.add_column("#", justify="right")
    table.add_column("patch", overflow="fold")
    table.add_column("result", no_wrap=True)
    for i, c in enumerate(checks, 1):
        color = {"clean": "green", "3-way": "yellow", "failed": "red"}[c.status]
        table.add_row(str(i), c.name, f"[{color}]{c.status}[/]")
    console.print(table)
    if any(c.status == "failed" for c in checks):
        raise failures_error(checks, ps)
    info(f"[green]all {len(checks)} patches apply[/]")
    return checks


@dataclass
class TreeStatus:
    exists: bool
    clean: bool = False
    up_to_date: bool = False
    differing: list[str] = field(default_factory=list)   # committed differences
    dirty: list[str] = field(default_factory=list)       # uncommitted changes
    extra_commits: list[str] = field(default_factory=list)
    checks: list[PatchCheck] = field(default_factory=list)


def status(version: str, spec: source.SourceSpec, root: Path | None = None,
           build: Path | None = None) -> TreeStatus:
    """Is the tree exactly base + series + overlay (computed from the current inputs)?"""
    root = root or project_root()
    build = build or build_root(root)
    ps = load_patchset(version, root)
    overlay = overlay_files(root)
    target = tree_dir(version, build)
    state = read_state(target) if target.exists() else None
    if state is None:
        return TreeStatus(exists=target.exists())
    t = GitTree(target)
    base = t.try_rev_parse(BASE_REF)
    if base is None:
        return TreeStatus(exists=True, dirty=["refs/deepinfer/base is missing"])
    want, checks = expected_tree(t, base, ps, overlay)
    st = TreeStatus(exists=True, checks=checks)
    st.dirty = [f"{e.code.strip() or '?'} {e.path}" for e in t.status()]
    head = t.rev_parse("HEAD")
    if head != state.get("head"):
        with contextlib.suppress(DeepinferError):
            st.extra_commits = [f"{c.sha[:12]} {c.subject}"
                                for c in t.commits(f"{state['head']}..HEAD")]
    if want is not None:
        st.differing = t.changed_paths(want, "HEAD")
    st.up_to_date = want is not None and not st.differing
    st.clean = st.up_to_date and not st.dirty
    return st


def print_status(version: str, st: TreeStatus, build: Path) -> bool:
    target = _rel(tree_dir(version, build))
    if not st.exists:
        info(f"{target} does not exist (or was not made by deepinfer); run `make apply`")
        return False
    failed = [c for c in st.checks if c.status == "failed"]
    if failed:
        info(f"[red]the current series does not apply[/] ({', '.join(c.name for c in failed)});"
             " run `make check` for details")
    if st.clean:
        info(f"[green]{target} is clean[/]: exactly base + {len(st.checks)} patches + overlay")
        return True
    if st.differing:
        info(f"[yellow]{target} differs from base + series + overlay as they are now[/] in "
             f"{len(st.differing)} committed file(s) (changed inputs: `make apply`; commits "
             "of your own: `make export`):")
        for p in st.differing:
            info(f"  {p}")
    if st.extra_commits:
        info("commits made since apply:")
        for c in st.extra_commits:
            info(f"  {c}")
    if st.dirty:
        info(f"[yellow]uncommitted changes[/] ({len(st.dirty)}):")
        for d in st.dirty:
            info(f"  {d}")
    if st.up_to_date and not st.dirty:
        return True
    return False


def clean(root: Path | None = None, build: Path | None = None) -> None:
    """Remove the build directory (applied trees, staging leftovers, the symlink)."""
    build = build or build_root(root)
    if build.exists():
        with contextlib.ExitStack() as stack:
            for lock in sorted(build.glob(".vllm-*.lock")):
                stack.enter_context(_lock(build, lock.name[len(".vllm-"):-len(".lock")]))
            for p in sorted(build.iterdir()):
                if not p.name.endswith(".lock"):
                    source.remove_tree(p)
        source.remove_tree(build)
        info(f"removed {_rel(build)}")
    else:
        info(f"{_rel(build)} does not exist; nothing to do")


__all__ = ["apply", "check", "status", "clean", "print_summary", "print_status",
           "expected_tree", "check_series_in_index", "scratch_index", "read_state",
           "tree_dir", "build_root", "PatchCheck", "PatchFailure", "ApplyResult",
           "TreeStatus"]
