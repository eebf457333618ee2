"""Every git operation of the tool, on one repository (an applied vLLM tree).

Commands run through GitPython (``repo.git.<cmd>``) with a fixed environment: no system
or global git config (so a user's ``diff.noprefix``, ``format.*`` or hooks cannot change
what is written), a fixed committer identity, and automatic gc off. Commit ids made by
this module are therefore reproducible: the same inputs give the same commits.

Failures raise :class:`GitOpError` (a :class:`deepinfer.console.DeepinferError`) carrying
git's stderr.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import git

from .console import DeepinferError

#: Fixed identity and date for the commits the tool itself makes (base, overlay).
TOOL_NAME = "deepinfer-sm80"
TOOL_EMAIL = "deepinfer-sm80@invalid"
FIXED_DATE = "946684800 +0000"  # 2000-01-01: commit ids depend on content only

BASE_REF = "refs/deepinfer/base"
#: Trailer that marks the overlay commit (export skips it, status finds it).
OVERLAY_TRAILER = "Deepinfer-Overlay"
BRANCH = "deepinfer"


class GitOpError(DeepinferError):
    """A git command failed; ``stderr`` holds git's message."""

    def __init__(self, message: str, stderr: str = "", **kw):
        super().__init__(message, **kw)
        self.stderr = stderr


def _base_env() -> dict[str, str]:
    return {
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_COMMITTER_NAME": TOOL_NAME,
        "GIT_COMMITTER_EMAIL": TOOL_EMAIL,
        "LC_ALL": "C",
    }


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    subject: str
    message: str  # full message (subject, blank line, body)


@dataclass(frozen=True)
class StatusEntry:
    code: str  # two-letter porcelain code, e.g. " M", "??", "D "
    path: str


def _check_gitpython() -> None:
    import inspect
    if "strip_newline_in_stdout" not in inspect.signature(git.Git.execute).parameters:
        raise DeepinferError(f"GitPython {git.__version__} is too old (its Git.execute lacks "
                             "strip_newline_in_stdout, needed for byte-exact patch export)",
                             hint="upgrade it: .venv/bin/pip install -U gitpython (tested: 3.2.1)")


class GitTree:
    """A git repository holding an applied tree (or a scratch repository)."""

    def __init__(self, path: Path):
        _check_gitpython()
        self.path = Path(path)
        try:
            self.repo = git.Repo(self.path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise DeepinferError(f"{self.path} is not a git repository")

    # ---------------------------------------------------------------- plumbing
    @property
    def git_dir(self) -> Path:
        return Path(self.repo.git_dir)

    def run(self, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None,
            strip: bool = True, binary: bool = False) -> str | bytes:
        """Run ``git <args>`` in the tree; returns stdout (str, or bytes when ``binary``)."""
        full_env = _base_env()
        if env:
            full_env.update(env)
        try:
            out = self.repo.git.execute(
                ["git", *args], env=full_env, istream=None if stdin is None else _Stdin(stdin),
                strip_newline_in_stdout=strip, stdout_as_string=not binary,
                with_extended_output=False)
        except git.GitCommandError as exc:
            stderr = exc.stderr if isinstance(exc.stderr, str) else str(exc.stderr)
            stderr = stderr.strip().removeprefix("stderr:").strip().strip("'").strip()
            raise GitOpError(f"git {' '.join(args[:3])} failed in {self.path}",
                             stderr=stderr, details=[stderr] if stderr else [])
        return out

    # ---------------------------------------------------------------- create
    @classmethod
    def init(cls, path: Path) -> "GitTree":
        """``git init`` a directory (it may already hold files) with the tool's settings."""
        path.mkdir(parents=True, exist_ok=True)
        git.Repo.init(path, initial_branch=BRANCH) if _supports_initial_branch() \
            else git.Repo.init(path)
        t = cls(path)
        for key, val in (("gc.auto", "0"), ("core.autocrlf", "false"),
                         ("core.fileMode", "true"), ("am.threeWay", "false"),
                         ("commit.gpgSign", "false"), ("core.hooksPath", os.devnull)):
            t.run("config", key, val)
        if not _supports_initial_branch():
            t.run("symbolic-ref", "HEAD", f"refs/heads/{BRANCH}")
        return t

    def commit_all(self, message: str, author: tuple[str, str] | None = None,
                   date: str = FIXED_DATE, force_add: bool = True) -> str:
        """Stage everything (ignored files too when ``force_add``) and commit; returns the sha."""
        self.run("add", "-A", *(["--force"] if force_add else []), ".")
        return self.commit_index(message, author, date)

    def add_paths(self, paths: list[str], force: bool = True) -> None:
        """Stage the given paths (given on stdin, so any number of them)."""
        if not paths:
            return
        data = b"\0".join(p.encode() for p in paths) + b"\0"
        self.run("add", *(["--force"] if force else []), "--pathspec-from-file=-",
                 "--pathspec-file-nul", stdin=data)

    def commit_index(self, message: str, author: tuple[str, str] | None = None,
                     date: str = FIXED_DATE) -> str:
        name, email = author or (TOOL_NAME, TOOL_EMAIL)
        env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
               "GIT_COMMITTER_DATE": date}
        self.run("commit", "-q", "--no-verify", "--allow-empty", "--cleanup=verbatim",
                 "-F", "-", env=env, stdin=message.encode())
        return self.rev_parse("HEAD")

    def update_ref(self, ref: str, sha: str) -> None:
        self.run("update-ref", ref, sha)

    def rev_parse(self, rev: str) -> str:
        return self.run("rev-parse", "--verify", "-q", rev + "^{commit}")

    def try_rev_parse(self, rev: str) -> str | None:
        try:
            return self.rev_parse(rev)
        except GitOpError:
            return None

    # ---------------------------------------------------------------- patches
    def am(self, patch: Path, threeway: bool = True) -> str:
        """``git am`` one mbox patch (subject kept verbatim; committer date = author date).

        On failure the am session is aborted (tree back to the previous commit) and
        :class:`GitOpError` is raised with git's stderr.
        """
        args = ["am", "-q", "--keep", "--keep-cr", "--no-scissors", "--whitespace=nowarn",
                "--committer-date-is-author-date"]
        if threeway:
            args.append("--3way")
        try:
            self.run(*args, str(patch.resolve()))
        except GitOpError:
            try:
                self.run("am", "--abort")
            except GitOpError:
                pass
            raise
        return self.rev_parse("HEAD")

    def apply_check(self, patch: bytes, index_file: Path, threeway: bool = False,
                    apply: bool = False) -> tuple[bool, str]:
        """Try a patch against a scratch index (the work tree is never touched).

        ``apply=False`` only checks; ``apply=True`` also updates the scratch index (and
        writes the resulting blobs). Returns (ok, git's stderr).
        """
        args = ["apply", "--cached"]
        if not apply:
            args.append("--check")
        if threeway:
            args.append("--3way")
        try:
            self.run(*args, "-", env={"GIT_INDEX_FILE": str(index_file)}, stdin=patch)
            return True, ""
        except GitOpError as exc:
            return False, exc.stderr

    def read_tree_into(self, index_file: Path, rev: str) -> None:
        """Make ``index_file`` a scratch index holding ``rev``'s tree."""
        self.run("read-tree", rev, env={"GIT_INDEX_FILE": str(index_file)})

    def show_index_file(self, index_file: Path, path: str) -> bytes | None:
        """Content of ``path`` in a scratch index, or None when it is not there."""
        try:
            return self.run("show", f":{path}", env={"GIT_INDEX_FILE": str(index_file)},
                            binary=True, strip=False)
        except GitOpError:
            return None

    def format_patch(self, sha: str) -> bytes:
        """Deterministic mbox for one commit (full index, zero commit id, no signature,
        subject kept, no diffstat)."""
        return self.run("format-patch", "--stdout", "--full-index", "--zero-commit",
                        "--no-signature", "--keep-subject", "--no-stat", "--no-color",
                        "--encode-email-headers", "-1", sha, binary=True, strip=False)

    # ---------------------------------------------------------------- inspect
    def commits(self, rev_range: str) -> list[CommitInfo]:
        """Commits in ``rev_range``, oldest first."""
        out = self.run("log", "--reverse", "--format=%H%x00%B%x00%x01", rev_range, strip=False)
        result = []
        for rec in out.split("\x01"):
            rec = rec.lstrip("\n")
            if not rec:
                continue
            sha, msg, _ = rec.split("\x00", 2)
            result.append(CommitInfo(sha, msg.split("\n", 1)[0], msg))
        return result

    def message(self, rev: str) -> str:
        return self.run("log", "-1", "--format=%B", rev, strip=False)

    def status(self) -> list[StatusEntry]:
        """Uncommitted changes: modified, staged, deleted and untracked (not ignored) files."""
        out = self.run("status", "--porcelain=v1", "-z", "--untracked-files=all",
                       "--no-renames", strip=False)
        entries = []
        for rec in out.split("\0"):
            if rec:
                entries.append(StatusEntry(rec[:2], rec[3:]))
        return entries

    def changed_paths(self, a: str, b: str) -> list[str]:
        """Paths that differ between two revisions."""
        out = self.run("diff", "--name-only", "-z", "--no-renames", a, b, strip=False)
        return [p for p in out.split("\0") if p]

    def commit_paths(self, sha: str) -> list[str]:
        """Paths a commit changes relative to its first parent."""
        return self.changed_paths(f"{sha}^", sha)

    def ls_tree(self, rev: str) -> dict[str, str]:
        """``{path: blob id}`` of every file in ``rev``."""
        out = self.run("ls-tree", "-r", "-z", "--full-tree", rev, strip=False)
        result = {}
        for rec in out.split("\0"):
            if rec:
                meta, path = rec.split("\t", 1)
                result[path] = meta.split()[2]
        return result

    def hash_file(self, path: Path) -> str:
        """Blob id ``path``'s content would have (``git hash-object``)."""
        return self.run("hash-object", "--no-filters", str(path))

    def diff_binary(self, rev: str, index_file: Path | None = None) -> bytes:
        """``git diff --cached --binary rev`` (using a scratch index when given)."""
        env = {"GIT_INDEX_FILE": str(index_file)} if index_file else None
        return self.run("diff", "--cached", "--binary", "--full-index", rev, env=env,
                        binary=True, strip=False)


class _Stdin:
    """A file-like object GitPython can hand to a subprocess as stdin."""

    def __init__(self, data: bytes):
        import tempfile
        self._f = tempfile.TemporaryFile()
        self._f.write(data)
        self._f.seek(0)

    def fileno(self) -> int:
        return self._f.fileno()

    def read(self, *a):
        return self._f.read(*a)


_INITIAL_BRANCH: bool | None = None


def _supports_initial_branch() -> bool:
    """git >= 2.28 knows ``init --initial-branch``."""
    global _INITIAL_BRANCH
    if _INITIAL_BRANCH is None:
        v = git.Git().version_info
        _INITIAL_BRANCH = tuple(v[:2]) >= (2, 28)
    return _INITIAL_BRANCH


# ---------------------------------------------------------------- bulk index helpers


def hash_data(tree: GitTree, data: bytes) -> str:
    """Write one blob from bytes (``git hash-object -w --stdin``)."""
    return tree.run("hash-object", "-w", "--no-filters", "--stdin", stdin=data)


def hash_objects(tree: GitTree, paths: list[Path]) -> list[str]:
    """Write blobs for many files at once (``git hash-object -w --stdin-paths``)."""
    if not paths:
        return []
    data = "".join(f"{p}\n" for p in paths).encode()
    out = tree.run("hash-object", "-w", "--no-filters", "--stdin-paths", stdin=data)
    return out.split("\n")


def index_add_blobs(tree: GitTree, index_file: Path,
                    entries: list[tuple[str, str, str]]) -> None:
    """Put ``(mode, blob, path)`` entries into a scratch index in one call."""
    if not entries:
        return
    data = "".join(f"{mode} {sha}\t{path}\0" for mode, sha, path in entries).encode()
    tree.run("update-index", "--add", "-z", "--index-info",
             env={"GIT_INDEX_FILE": str(index_file)}, stdin=data)


def write_tree(tree: GitTree, index_file: Path) -> str:
    """Tree id of a scratch index."""
    return tree.run("write-tree", env={"GIT_INDEX_FILE": str(index_file)})


def tree_of(tree: GitTree, rev: str) -> str:
    return tree.run("rev-parse", "--verify", "-q", rev + "^{tree}")
