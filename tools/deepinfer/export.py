"""``deepinfer export``: regenerate the patch files from an applied tree's commits.

Every commit between ``refs/deepinfer/base`` and ``HEAD`` except the overlay commit
becomes one patch file, in commit order, written with
``git format-patch --full-index --zero-commit --no-signature --keep-subject --no-stat``
(deterministic: author, date and message come from the commit, which ``git am``
preserves, so apply-then-export reproduces the patch files byte for byte).

File names: a commit keeps the file it was applied from (recorded by apply, else matched
by subject); a new commit gets a name made from its subject. Missing DEP-3 trailers
(``Origin``, ``Forwarded``, ``Last-Update``) are added to the message. The series file is
rewritten; patch files that were in the old series and are no longer exported are
removed. Commits that change overlay-managed files are refused: those files are edited in
this repository's ``overlay/`` and ``csrc/``.
"""
from __future__ import annotations

import email
import email.header
import re
from pathlib import Path

from rich.table import Table

from .apply import _rel, build_root, read_state, tree_dir
from .console import DeepinferError, console, info, warn
from .gittree import BASE_REF, OVERLAY_TRAILER, CommitInfo, GitTree
from .patchset import (PatchSet, load_patchset, overlay_files, project_root, read_series,
                       write_series)

DEP3_KEYS = ("Origin", "Forwarded", "Last-Update")
DEFAULT_ORIGIN = "vendor, DeepInfer-SM80"
DEFAULT_FORWARDED = "no"
_KNOWN_TRAILERS = {k.lower() for k in DEP3_KEYS} | {
    "signed-off-by", "co-authored-by", "reviewed-by", "bug", "applied-upstream", "author"}


def is_overlay_commit(c: CommitInfo) -> bool:
    return re.search(rf"^{OVERLAY_TRAILER}: ", c.message, re.M) is not None


def slug(subject: str, limit: int = 60) -> str:
    """File-name stem from a subject (like ``git format-patch``, without the number)."""
    s = re.sub(r"[^A-Za-z0-9._]+", "-", subject).strip("-.").lower()
    s = re.sub(r"\.{2,}", ".", s)
    return (s[:limit].rstrip("-.") or "patch")


def patch_subject(data: bytes) -> str:
    """Decoded, unfolded ``Subject:`` of an mbox patch."""
    msg = email.message_from_bytes(data.split(b"\n\n", 1)[0] + b"\n\n")
    raw = msg.get("Subject", "")
    text = str(email.header.make_header(email.header.decode_header(raw)))
    return re.sub(r"\s*\n\s*", " ", text).strip()


def _split_mbox(data: bytes) -> tuple[bytes, bytes]:
    """(headers + message, diff part) of a format-patch mbox without diffstat."""
    m = re.search(rb"^(?:---\n|diff --git )", data, re.M)
    return (data, b"") if m is None else (data[:m.start()], data[m.start():])


def add_dep3_trailers(data: bytes, commit_date: str) -> tuple[bytes, list[str]]:
    """Append missing DEP-3 trailers to the message of an mbox patch.

    Returns the new bytes and the keys added (empty list = unchanged).
    """
    head, diff = _split_mbox(data)
    header_end = head.find(b"\n\n")
    if header_end < 0:
        return data, []
    message = head[header_end + 2:].decode("utf-8")
    present = {k for k in DEP3_KEYS if re.search(rf"^{k}:", message, re.M | re.I)}
    missing = [k for k in DEP3_KEYS if k not in present]
    if not missing:
        return data, []
    values = {"Origin": DEFAULT_ORIGIN, "Forwarded": DEFAULT_FORWARDED,
              "Last-Update": commit_date}
    body = message.rstrip("\n")
    paragraphs = body.split("\n\n") if body else []
    last = paragraphs[-1] if paragraphs else ""
    is_trailer_block = _is_trailer_block(last) and (
        len(paragraphs) > 1 or all(ln.split(":", 1)[0].lower() in _KNOWN_TRAILERS
                                   for ln in last.strip().split("\n")))
    new_lines = "\n".join(f"{k}: {values[k]}" for k in missing)
    body = body + ("\n" if is_trailer_block else "\n\n") + new_lines if body else new_lines
    out = head[:header_end + 2] + (body + "\n\n").encode("utf-8") + diff
    return out, missing


def _is_trailer_block(paragraph: str) -> bool:
    lines = paragraph.strip().split("\n")
    return bool(paragraph.strip()) and all(re.match(r"^[A-Za-z0-9-]+: ", ln) for ln in lines)


def _message_body(c: CommitInfo) -> str:
    """Message without subject and final trailer block (what says why the patch exists)."""
    rest = c.message.split("\n", 1)[1].strip() if "\n" in c.message else ""
    paragraphs = [p for p in rest.split("\n\n") if p.strip()]
    if paragraphs and _is_trailer_block(paragraphs[-1]):
        paragraphs.pop()
    return "\n\n".join(paragraphs)


def exported_patches(tree: GitTree, base: str, ps: PatchSet,
                     state: dict | None = None) -> tuple[list[str], dict[str, bytes]]:
    """Compute (series names, {name: patch bytes}) from ``base..HEAD`` without writing.

    Raises :class:`DeepinferError` when a commit changes overlay-managed files or two
    commits would get the same file name.
    """
    overlay_paths = {f.tree_path: f.rel_source for f in overlay_files(ps.directory.parents[1])}
    by_sha = {p["commit"]: p["name"] for p in (state or {}).get("patches", [])}
    by_subject: dict[str, list[str]] = {}
    for name in read_series(ps.series_path):
        p = ps.directory / name
        if p.is_file():
            by_subject.setdefault(patch_subject(p.read_bytes()), []).append(name)
    names: list[str] = []
    files: dict[str, bytes] = {}
    for c in tree.commits(f"{base}..HEAD"):
        if is_overlay_commit(c):
            continue
        touched = sorted(set(tree.commit_paths(c.sha)) & overlay_paths.keys())
        if touched:
            raise DeepinferError(
                f"commit {c.sha[:12]} ({c.subject!r}) changes overlay-managed files",
                details=[f"  {p}  (from {overlay_paths[p]})" for p in touched],
                hint="edit those files under overlay/ or csrc/ in this repository; drop the "
                     "change from the tree's commit (git rebase -i refs/deepinfer/base)")
        name = by_sha.get(c.sha)
        if name is None:
            cands = [n for n in by_subject.get(c.subject, []) if n not in files]
            name = cands[0] if cands else None
        if name is None or name in files:
            stem, k = slug(c.subject), 1
            name = f"{stem}.patch"
            while name in files:
                k += 1
                name = f"{stem}-{k}.patch"
        data = tree.format_patch(c.sha)
        date = tree.run("log", "-1", "--format=%cd", "--date=format:%Y-%m-%d", c.sha)
        data, _ = add_dep3_trailers(data, date)
        names.append(name)
        files[name] = data
    return names, files


def export(version: str, root: Path | None = None, build: Path | None = None) -> dict[str, str]:
    """Write the patch files and series of ``patches/vllm-<version>/`` from the tree.

    Returns ``{name: "new" | "updated" | "unchanged" | "removed"}``.
    """
    root = root or project_root()
    build = build or build_root(root)
    ps = load_patchset(version, root)
    target = tree_dir(version, build)
    state = read_state(target) if target.exists() else None
    if state is None:
        raise DeepinferError(f"{_rel(target)} is not an applied tree",
                             hint=f"run `make apply VLLM={version}` first")
    tree = GitTree(target)
    dirty = tree.status()
    if dirty:
        raise DeepinferError(f"{_rel(target)} has uncommitted changes; export takes commits "
                             "only", details=[f"  {e.code.strip()} {e.path}" for e in dirty[:50]],
                             hint=f"commit them in {_rel(target)} (git add -A && git commit), "
                                  "then run `make export` again")
    base = tree.try_rev_parse(BASE_REF)
    if base is None:
        raise DeepinferError(f"{_rel(target)} has no {BASE_REF}", hint="re-run `make apply`")
    names, files = exported_patches(tree, base, ps, state)
    for c in tree.commits(f"{base}..HEAD"):
        if not is_overlay_commit(c) and not _message_body(c):
            warn(f"commit {c.sha[:12]} ({c.subject!r}) does not say why the patch exists; "
                 "add a message body (git rebase -i refs/deepinfer/base, reword)")
    old_series = list(ps.series)
    result: dict[str, str] = {}
    for name in names:
        path = ps.directory / name
        if path.exists() and path.read_bytes() == files[name]:
            result[name] = "unchanged"
        else:
            result[name] = "updated" if path.exists() else "new"
            path.write_bytes(files[name])
    for name in old_series:
        if name not in files:
            (ps.directory / name).unlink(missing_ok=True)
            result[name] = "removed"
    if names != old_series or not ps.series_path.exists():
        write_series(ps.series_path, names)
    table = Table(title=f"export to {_rel(ps.directory)}")
    table.add_column("patch", overflow="fold")
    table.add_column("result", no_wrap=True)
    for name, res in result.items():
        color = {"unchanged": "dim", "new": "green", "updated": "yellow", "removed": "red"}[res]
        table.add_row(name, f"[{color}]{res}[/]")
    console.print(table)
    changed = sum(1 for r in result.values() if r != "unchanged")
    info(f"{len(names)} patches in series; {changed} file(s) changed"
         + ("" if not changed else "; run `make apply` to rebuild the tree from them"))
    return result
