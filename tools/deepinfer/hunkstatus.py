"""Where does each hunk of a patch land in a different upstream file? (pure logic)

Statuses, per hunk (see docs/drift.md):

- ``clean``            the pre-image matches at the hunk's own line number
- ``offset``           the pre-image matches exactly ``offset`` lines away
- ``fuzz``             matches only with ``fuzz`` outer context lines ignored (GNU patch -F)
- ``three-way``        no textual match, but a 3-way merge against the pinned pre-image is clean
- ``conflict``         the 3-way merge conflicts (``upstream_now`` holds what upstream has there)
- ``file-missing``     the file is gone upstream (``renamed_to`` names a detected new path)
- ``already-applied``  the hunk reverse-applies: the target already is the patched text
- ``merged-upstream``  the 3-way merge is a no-op: the target already contains the change

Files are handled as lists of lines that keep their ``\\n`` (bytes decoded with
``surrogateescape``, so nothing is ever lost or normalised).
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

CLEAN, OFFSET, FUZZ, THREE_WAY, CONFLICT = "clean", "offset", "fuzz", "three-way", "conflict"
FILE_MISSING, ALREADY, MERGED = "file-missing", "already-applied", "merged-upstream"
STATUSES = (CLEAN, OFFSET, FUZZ, THREE_WAY, CONFLICT, FILE_MISSING, ALREADY, MERGED)
#: statuses under which `git am` (without --3way) applies the hunk as it is
EXACT_OK = (CLEAN, OFFSET)
MAX_FUZZ = 2
UPSTREAM_NOW_LINES = 12

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")


# --------------------------------------------------------------------------- text
def decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def split_lines(text: str) -> list[str]:
    """Split on ``\\n`` only (``str.splitlines`` would also split on ``\\r``, ``\\x0c`` ...)."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# --------------------------------------------------------------------------- parsing
@dataclass
class Hunk:
    index: int  # 1-based within its file
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str
    lines: list[tuple[str, str]]  # (' ' | '-' | '+', text with its newline)

    @property
    def header(self) -> str:
        h = f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@"
        return f"{h} {self.section}" if self.section else h

    @property
    def pre(self) -> list[str]:
        return [t for k, t in self.lines if k != "+"]

    @property
    def post(self) -> list[str]:
        return [t for k, t in self.lines if k != "-"]

    def trimmed(self, fuzz: int) -> tuple[list[str], list[str], int]:
        """pre/post with up to ``fuzz`` context lines dropped at each end; also the
        number of leading lines dropped."""
        lead = 0
        while lead < fuzz and lead < len(self.lines) and self.lines[lead][0] == " ":
            lead += 1
        trail = 0
        while (trail < fuzz and trail < len(self.lines) - lead
               and self.lines[len(self.lines) - 1 - trail][0] == " "):
            trail += 1
        body = self.lines[lead:len(self.lines) - trail]
        return ([t for k, t in body if k != "+"], [t for k, t in body if k != "-"], lead)


@dataclass
class FileDiff:
    old_path: str | None  # None: file created
    new_path: str | None  # None: file deleted
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False
    old_blob: str | None = None
    new_blob: str | None = None

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"

    @property
    def is_new(self) -> bool:
        return self.old_path is None

    @property
    def is_deleted(self) -> bool:
        return self.new_path is None


def _unquote(p: str) -> str:
    p = p.strip()
    if p.startswith('"') and p.endswith('"'):
        raw = p[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        p = raw.encode("latin-1").decode("utf-8", "surrogateescape")
    return p


def _strip_prefix(p: str) -> str | None:
    p = _unquote(p.split("\t")[0])
    if p == "/dev/null":
        return None
    return p[2:] if p[:2] in ("a/", "b/") else p


def parse_patch(text: str) -> list[FileDiff]:
    """Parse the file diffs of a git-style unified diff or ``format-patch`` mbox."""
    lines = split_lines(text)
    files: list[FileDiff] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i].rstrip("\n")
        if not line.startswith("diff --git "):
            i += 1
            continue
        m = re.match(r'diff --git ("(?:[^"\\]|\\.)*"|\S+) ("(?:[^"\\]|\\.)*"|\S+)$', line)
        a = _strip_prefix(m.group(1)) if m else None
        b = _strip_prefix(m.group(2)) if m else None
        fd = FileDiff(old_path=a, new_path=b)
        i += 1
        while i < n and not lines[i].startswith(("diff --git ", "@@ ")):
            h = lines[i].rstrip("\n")
            if h.startswith("new file mode"):
                fd.old_path = None
            elif h.startswith("deleted file mode"):
                fd.new_path = None
            elif h.startswith("rename from "):
                fd.old_path = _unquote(h[len("rename from "):])
            elif h.startswith("rename to "):
                fd.new_path = _unquote(h[len("rename to "):])
            elif h.startswith("index "):
                ids = h.split()[1].split("..")
                if len(ids) == 2:
                    fd.old_blob, fd.new_blob = ids
            elif h.startswith("--- "):
                fd.old_path = _strip_prefix(h[4:])
            elif h.startswith("+++ "):
                fd.new_path = _strip_prefix(h[4:])
            elif h.startswith(("Binary files ", "GIT binary patch")):
                fd.binary = True
            i += 1
        while i < n and lines[i].startswith("@@ "):
            m = _HUNK_RE.match(lines[i].rstrip("\n"))
            if not m:
                raise ValueError(f"{fd.path}: malformed hunk header {lines[i]!r}")
            os_, ns = int(m.group(1)), int(m.group(3))
            ol = 1 if m.group(2) is None else int(m.group(2))
            nl = 1 if m.group(4) is None else int(m.group(4))
            hk = Hunk(len(fd.hunks) + 1, os_, ol, ns, nl, m.group(5).strip(), [])
            i += 1
            old_left, new_left = ol, nl
            while i < n and (old_left > 0 or new_left > 0 or lines[i].startswith("\\")):
                raw = lines[i]
                tag = raw[:1]
                if tag == "\\":  # "\ No newline at end of file": previous line has none
                    if hk.lines:
                        k, t = hk.lines[-1]
                        hk.lines[-1] = (k, t[:-1] if t.endswith("\n") else t)
                    i += 1
                    continue
                if raw in ("\n", ""):  # context line whose single space was stripped
                    tag, body = " ", "\n"
                elif tag in " -+":
                    body = raw[1:]
                else:
                    raise ValueError(f"{fd.path}: hunk {hk.index} ({hk.header}) is truncated")
                hk.lines.append((tag, body))
                if tag in " -":
                    old_left -= 1
                if tag in " +":
                    new_left -= 1
                i += 1
            fd.hunks.append(hk)
        files.append(fd)
    return files


# --------------------------------------------------------------------------- matching
def find_block(lines: list[str], block: list[str], expected: int, lo: int = 0) -> int | None:
    """Start index >= lo of ``block`` in ``lines`` closest to ``expected`` (ties: earlier)."""
    if not block:
        return max(lo, min(expected, len(lines)))
    first, size = block[0], len(block)
    best = None
    for idx in range(lo, len(lines) - size + 1):
        if lines[idx] == first and lines[idx:idx + size] == block:
            if best is None or abs(idx - expected) < abs(best - expected):
                best = idx
            elif idx > expected:
                break
    return best


def merge_file(ours: list[str], base: list[str], theirs: list[str]) -> tuple[list[str], int]:
    """3-way merge by ``git merge-file`` (diff3 markers); returns (lines, conflicts)."""
    with tempfile.TemporaryDirectory(prefix="deepinfer-merge-") as tmp:
        paths = []
        for name, content in (("ours", ours), ("base", base), ("theirs", theirs)):
            p = os.path.join(tmp, name)
            with open(p, "wb") as f:
                f.write(encode("".join(content)))
            paths.append(p)
        r = subprocess.run(
            ["git", "merge-file", "-p", "--diff3", "-L", "upstream", "-L", "pinned",
             "-L", "patch", *paths], capture_output=True)
    if r.returncode < 0 or r.returncode > 127:
        raise RuntimeError(f"git merge-file failed: {decode(r.stderr)}")
    return split_lines(decode(r.stdout)), r.returncode


def first_conflict(merged: list[str]) -> tuple[int, list[str]]:
    """(1-based line, upstream side) of the first conflict block of a diff3 merge.  When
    upstream's side is empty (it removed those lines) the lines just around the block are
    returned instead, marked as such."""
    start = end = None
    ours: list[str] = []
    for idx, line in enumerate(merged):
        if start is None and line.startswith("<<<<<<< upstream"):
            start = idx
        elif start is not None and end is None and line.startswith(("||||||| ", "=======")):
            end = idx
        elif start is not None and end is None:
            ours.append(line)
        elif end is not None and line.startswith(">>>>>>> patch"):
            if not ours:
                ours = (["(nothing: upstream no longer has the lines this hunk changes; "
                         "around that place it has:)\n"] + merged[max(0, start - 3):start]
                        + ["(...)\n"] + merged[idx + 1:idx + 4])
            break
    return (start + 1 if start is not None else 0), ours


# --------------------------------------------------------------------------- statuses
@dataclass
class HunkResult:
    index: int
    header: str
    status: str
    offset: int = 0
    fuzz: int = 0
    target_line: int | None = None  # 1-based line of the hunk in the target (when located)
    detail: str = ""
    upstream_now: list[str] = field(default_factory=list)
    at_new_path: str | None = None  # status the hunk would have at a detected renamed path

    def to_json(self) -> dict:
        return {
            "index": self.index, "header": self.header, "status": self.status,
            "offset": self.offset, "fuzz": self.fuzz, "target_line": self.target_line,
            "detail": self.detail, "upstream_now": self.upstream_now,
            "at_new_path": self.at_new_path,
        }


def _excerpt(lines: list[str], start: int, count: int) -> list[str]:
    return [ln.rstrip("\n") for ln in lines[max(start, 0):max(start, 0) + count]]


def apply_exact(lines: list[str], fd: FileDiff) -> list[str] | None:
    """Apply all hunks at their exact line numbers; None when any does not match."""
    out, pos = [], 0
    for hk in fd.hunks:
        at = hk.old_start - 1 if hk.old_len else hk.old_start
        if at < pos or lines[at:at + len(hk.pre)] != hk.pre:
            return None
        out += lines[pos:at] + hk.post
        pos = at + len(hk.pre)
    return out + lines[pos:]


def check_hunks(fd: FileDiff, target: list[str], base: list[str] | None
                ) -> tuple[list[HunkResult], list[str]]:
    """Status of every hunk of ``fd`` against ``target`` (the upstream file with the
    earlier patches of the series applied as far as they went).  ``base`` is the pinned
    pre-image of this patch (3-way base); None when unknown.  Returns the results and
    the target with every hunk that could be placed applied."""
    cur = list(target)
    results: list[HunkResult] = []
    growth = 0  # lines added to `cur` by the hunks placed so far
    lo = 0
    prev_offset = 0
    for hk in fd.hunks:
        pre, post = hk.pre, hk.post
        nominal = (hk.old_start - 1 if hk.old_len else hk.old_start) + growth
        res = HunkResult(hk.index, hk.header, CLEAN)
        at = find_block(cur, pre, nominal + prev_offset, lo)
        if at is not None and (pre or at == nominal):
            res.offset = at - nominal
            res.status = CLEAN if res.offset == 0 else OFFSET
            res.target_line = at + 1
            cur[at:at + len(pre)] = post
            growth += len(post) - len(pre)
            lo = at + len(post)
            prev_offset = res.offset
            results.append(res)
            continue
        back = find_block(cur, post, nominal + prev_offset, lo)
        if back is not None and post:
            res.status, res.offset, res.target_line = ALREADY, back - nominal, back + 1
            res.detail = "the patched text is already there (reverse-applies)"
            lo = back + len(post)
            growth += len(post) - len(pre)
            results.append(res)
            continue
        placed = False
        for fz in range(1, MAX_FUZZ + 1):
            fpre, fpost, lead = hk.trimmed(fz)
            if not fpre or len(fpre) == len(pre):
                continue
            at = find_block(cur, fpre, nominal + lead + prev_offset, lo)
            if at is not None:
                res.status, res.fuzz = FUZZ, fz
                res.offset = at - lead - nominal
                res.target_line = at + 1
                res.detail = f"applies with {fz} outer context line(s) ignored"
                cur[at:at + len(fpre)] = fpost
                growth += len(fpost) - len(fpre)
                lo = at + len(fpost)
                placed = True
                break
        if placed:
            results.append(res)
            continue
        if base is None:
            res.status = CONFLICT
            res.detail = "no textual match and no pinned pre-image for a 3-way merge"
            res.upstream_now = _excerpt(cur, nominal, len(pre))
            results.append(res)
            continue
        b_at = find_block(base, pre, hk.old_start - 1 if hk.old_len else hk.old_start)
        if b_at is None:
            res.status = CONFLICT
            res.detail = ("the hunk does not match its pinned pre-image either "
                          "(patch set inconsistent with its pin)")
            res.upstream_now = _excerpt(cur, nominal, len(pre))
            results.append(res)
            continue
        theirs = base[:b_at] + post + base[b_at + len(pre):]
        merged, conflicts = merge_file(cur, base, theirs)
        if conflicts:
            line, ours = first_conflict(merged)
            res.status, res.target_line = CONFLICT, line or None
            res.upstream_now = [x.rstrip("\n") for x in ours[:UPSTREAM_NOW_LINES]]
            res.detail = "3-way merge conflicts with upstream's change"
        elif merged == cur:
            res.status = MERGED
            res.detail = "upstream already contains this change"
        else:
            res.status = THREE_WAY
            res.detail = "applies with a clean 3-way merge"
            growth += len(merged) - len(cur)
            cur = merged
        results.append(res)
    return results, cur


# --------------------------------------------------------------------------- files
@dataclass
class FileResult:
    path: str
    status: str
    hunks: list[HunkResult] = field(default_factory=list)
    renamed_to: str | None = None
    detail: str = ""

    def to_json(self) -> dict:
        return {"path": self.path, "status": self.status, "renamed_to": self.renamed_to,
                "detail": self.detail, "hunks": [h.to_json() for h in self.hunks]}


#: how bad a status is, for rolling hunks up into a file or patch status
SEVERITY = {CLEAN: 0, OFFSET: 1, FUZZ: 2, THREE_WAY: 3, MERGED: 4, ALREADY: 4,
            FILE_MISSING: 6, CONFLICT: 7}


def rollup(statuses: list[str]) -> str:
    """One status for a file or a patch from those of its parts.  All parts already in
    the target -> already-applied / merged-upstream; a mix of "already there" with
    changes to make needs a 3-way apply (plain `git am` refuses such a patch)."""
    if not statuses:
        return CLEAN
    done = {ALREADY, MERGED}
    if all(s in done for s in statuses):
        return ALREADY if all(s == ALREADY for s in statuses) else MERGED
    worst = max(statuses, key=SEVERITY.__getitem__)
    if worst in done:
        return THREE_WAY
    return worst


def check_file(fd: FileDiff, target: list[str] | None, base: list[str] | None,
               target_binary: bytes | None = None) -> tuple[FileResult, list[str] | None]:
    """Status of one file diff.  ``target`` is None when the path does not exist in the
    target; ``base`` is the pinned pre-image (None for a created file or when unknown).
    Returns the result and the target file after the patch (None: file absent)."""
    src = fd.old_path or fd.new_path or "?"
    if fd.binary:
        blob = git_blob_id(target_binary) if target_binary is not None else None
        if blob is None and not fd.is_new:
            return FileResult(src, FILE_MISSING, detail="binary file not in the target"), None
        if fd.is_new and blob is None or blob and fd.old_blob and blob.startswith(fd.old_blob):
            return FileResult(src, CLEAN, detail="binary"), target
        if blob and fd.new_blob and blob.startswith(fd.new_blob):
            return FileResult(src, ALREADY, detail="binary, already the patched blob"), target
        return FileResult(src, CONFLICT, detail=f"binary; upstream blob is now {blob}"), target
    if fd.is_new:
        post = fd.hunks[0].post if fd.hunks else []
        hr = HunkResult(1, fd.hunks[0].header if fd.hunks else "(empty file)", CLEAN)
        if target is None:
            return FileResult(src, CLEAN, [hr]), post
        if target == post:
            hr.status, hr.detail = ALREADY, "upstream has this file with identical content"
            return FileResult(src, ALREADY, [hr]), target
        hr.status, hr.target_line = CONFLICT, 1
        hr.detail = "the patch creates this file but upstream now has a different one"
        hr.upstream_now = _excerpt(target, 0, UPSTREAM_NOW_LINES)
        return FileResult(src, CONFLICT, [hr], detail=hr.detail), target
    if target is None:
        status = ALREADY if fd.is_deleted else FILE_MISSING
        detail = ("upstream no longer has the file this patch deletes" if fd.is_deleted
                  else "upstream no longer has this file")
        hunks = [HunkResult(h.index, h.header, status, detail=detail) for h in fd.hunks]
        return FileResult(src, status, hunks, detail=detail), None
    if fd.is_deleted:
        pre = fd.hunks[0].pre if fd.hunks else []
        hr = HunkResult(1, fd.hunks[0].header if fd.hunks else "(empty file)", CLEAN)
        if target == pre:
            return FileResult(src, CLEAN, [hr]), None
        hr.status, hr.detail = CONFLICT, "the patch deletes this file but upstream changed it"
        hr.upstream_now = _excerpt(target, 0, UPSTREAM_NOW_LINES)
        return FileResult(src, CONFLICT, [hr], detail=hr.detail), target
    results, after = check_hunks(fd, target, base)
    return FileResult(src, rollup([h.status for h in results]), results), after
