"""Fetch and verify upstream vLLM sources.

Three kinds of source, all verified against the pin (:class:`deepinfer.patchset.Pin`):

``sdist`` (default)
    ``<package>-<version>.tar.gz`` from the package index that pip is configured to use
    (``PIP_INDEX_URL`` / ``pip config`` / pip's built-in default, read through pip's own
    option parser; extra index URLs and find-links directories are searched too). Looked
    up through the PEP 691 JSON simple API, falling back to PEP 503 HTML. The download is
    checked against ``sdist_sha256`` and cached per user (:func:`cache_dir`), so a second
    apply downloads nothing. The unpacked ``vllm/_version.py`` must carry the pinned
    version and commit.
``git`` (``GIT_URL`` optional, default the pin's ``git_url``)
    The pinned commit (or the release tag, checked against the pinned short id) fetched
    into a per-user bare cache repository.
``path:DIR``
    An unpacked tree, verified through its ``_version.py`` (or its git ``HEAD``).

Tar extraction rejects absolute member names, ``..`` components, links whose target
leaves the destination, and device/fifo members, before anything is written.
"""
from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .console import DeepinferError, console
from .patchset import Pin

CHUNK = 1 << 20
_JSON_TYPE = "application/vnd.pypi.simple.v1+json"
_ACCEPT = f"{_JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"


# --------------------------------------------------------------------------- cache

def cache_root() -> Path:
    """Per-user cache: ``$DEEPINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/deepinfer-sm80``,
    else ``~/.cache/deepinfer-sm80``."""
    env = os.environ.get("DEEPINFER_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "deepinfer-sm80"


def cache_dir() -> Path:
    """Directory holding downloaded sdists (``<cache_root>/sdists``)."""
    return cache_root() / "sdists"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- pip config

@dataclass(frozen=True)
class IndexConfig:
    """Where pip would look for packages, as pip itself resolves it."""

    index_url: str | None
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    no_index: bool = False

    @property
    def index_urls(self) -> list[str]:
        if self.no_index:
            return []
        return ([self.index_url] if self.index_url else []) + list(self.extra_index_urls)


def pip_index_config() -> IndexConfig:
    """Resolve pip's configured indexes at run time.

    Uses pip's own option parser for ``pip download`` (which applies ``PIP_*`` environment
    variables, every pip config file and pip's built-in default index), so the result is
    what ``pip download`` would use. If pip's internals cannot be imported, falls back to
    ``PIP_INDEX_URL`` / ``PIP_EXTRA_INDEX_URL`` / ``PIP_FIND_LINKS``.
    """
    try:
        from pip._internal.commands import create_command  # noqa: PLC0415
        opts, _ = create_command("download").parse_args([])
        return IndexConfig(opts.index_url, list(opts.extra_index_urls or []),
                           list(opts.find_links or []), bool(opts.no_index))
    except Exception as exc:  # pip missing or its internals changed
        env_index = os.environ.get("PIP_INDEX_URL")
        extras = os.environ.get("PIP_EXTRA_INDEX_URL", "").split()
        links = os.environ.get("PIP_FIND_LINKS", "").split()
        if not (env_index or extras or links):
            raise DeepinferError(
                f"cannot read pip's configuration ({exc.__class__.__name__}: {exc})",
                hint="install pip in this Python, or set PIP_INDEX_URL to your package index")
        return IndexConfig(env_index, extras, links)


# --------------------------------------------------------------------------- index lookup

@dataclass(frozen=True)
class SdistLink:
    url: str
    sha256: str | None  # as published by the index (None when it gives none)
    origin: str          # index URL or find-links location it came from


class _AnchorParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (href, text)
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def _normalize(name: str) -> str:
    """PEP 503 project-name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_simple_json(body: bytes, base_url: str, filename: str) -> SdistLink | None:
    """Find ``filename`` in a PEP 691 JSON project page."""
    data = json.loads(body.decode("utf-8"))
    for f in data.get("files", []):
        if f.get("filename") == filename:
            return SdistLink(urllib.parse.urljoin(base_url, f["url"]),
                             (f.get("hashes") or {}).get("sha256"), base_url)
    return None


def parse_simple_html(body: bytes, base_url: str, filename: str) -> SdistLink | None:
    """Find ``filename`` in a PEP 503 HTML project page (or a find-links page)."""
    p = _AnchorParser()
    p.feed(body.decode("utf-8", errors="replace"))
    for href, text in p.links:
        url = urllib.parse.urljoin(base_url, href)
        parsed = urllib.parse.urlsplit(url)
        name = urllib.parse.unquote(PurePosixPath(parsed.path).name)
        if name == filename or text == filename:
            frag = urllib.parse.parse_qs(parsed.fragment)
            sha = (frag.get("sha256") or [None])[0]
            return SdistLink(urllib.parse.urlunsplit(parsed._replace(fragment="")), sha, base_url)
    return None


def _fetch(url: str, timeout: float) -> tuple[bytes, str]:
    """GET ``url`` (http(s) or file); returns (body, content type). file:// directories
    are read through their ``index.html``."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file():
            raise FileNotFoundError(str(path))
        return path.read_bytes(), "text/html"
    req = urllib.request.Request(url, headers={"Accept": _ACCEPT,
                                               "User-Agent": "deepinfer-sm80"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


def find_sdist(pin: Pin, cfg: IndexConfig | None = None, timeout: float = 60.0) -> SdistLink:
    """Locate the pinned sdist: find-links directories first, then each index in pip's order.

    Raises :class:`DeepinferError` listing every location tried when none has the file.
    """
    cfg = cfg or pip_index_config()
    filename = pin.sdist_filename
    tried: list[str] = []
    for loc in cfg.find_links:
        p = Path(urllib.request.url2pathname(urllib.parse.urlsplit(loc).path)) \
            if loc.startswith("file:") else Path(loc)
        if p.is_dir():
            if (p / filename).is_file():
                return SdistLink((p / filename).resolve().as_uri(), None, loc)
            tried.append(f"{loc}: no {filename}")
        elif "://" in loc:  # a find-links HTML page
            try:
                body, _ = _fetch(loc, timeout)
                link = parse_simple_html(body, loc, filename)
                if link:
                    return link
                tried.append(f"{loc}: no {filename}")
            except (OSError, urllib.error.URLError) as exc:
                tried.append(f"{loc}: {exc}")
    for index in cfg.index_urls:
        page = index.rstrip("/") + "/" + _normalize(pin.package) + "/"
        try:
            body, ctype = _fetch(page, timeout)
        except urllib.error.HTTPError as exc:
            tried.append(f"{page}: HTTP {exc.code}")
            continue
        except (OSError, urllib.error.URLError) as exc:
            tried.append(f"{page}: {getattr(exc, 'reason', exc)}")
            continue
        try:
            if _JSON_TYPE in ctype:
                link = parse_simple_json(body, page, filename)
            else:
                link = parse_simple_html(body, page, filename)
        except (ValueError, KeyError) as exc:
            tried.append(f"{page}: unreadable index page ({exc})")
            continue
        if link:
            return link
        tried.append(f"{page}: no {filename}")
    if not tried:
        tried.append("pip is configured with no index (--no-index) and no find-links")
    raise DeepinferError(f"could not find {filename} on any configured package index",
                         details=[f"  tried {t}" for t in tried],
                         hint="check PIP_INDEX_URL / `pip config list`, or use SOURCE=git or "
                              "SOURCE=path:DIR")


# --------------------------------------------------------------------------- download

def sha_mismatch_error(what: str, expected: str, actual: str, hint: str) -> DeepinferError:
    return DeepinferError(f"sha256 mismatch for {what}",
                          details=[f"  expected {expected}", f"  actual   {actual}"], hint=hint)


def download(link: SdistLink, dest: Path, expected_sha256: str, timeout: float = 180.0) -> Path:
    """Download ``link`` to ``dest`` with a progress bar, verifying sha256 while streaming.

    The file appears at ``dest`` only when its digest matches; a mismatch removes the
    partial file and raises naming both digests.
    """
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TimeRemainingColumn, TransferSpeedColumn)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f"{dest.name}.part-{os.getpid()}")
    h = hashlib.sha256()
    req = urllib.request.Request(link.url, headers={"User-Agent": "deepinfer-sm80"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                          DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                          console=console, transient=False) as prog:
                task = prog.add_task(f"download {dest.name}", total=total)
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
                    h.update(chunk)
                    prog.update(task, advance=len(chunk))
    except (OSError, urllib.error.URLError) as exc:
        part.unlink(missing_ok=True)
        raise DeepinferError(f"download of {link.url} failed: {getattr(exc, 'reason', exc)}",
                             hint="check network access to the package index, or use "
                                  "SOURCE=path:DIR with an unpacked sdist")
    actual = h.hexdigest()
    if actual != expected_sha256:
        part.unlink(missing_ok=True)
        raise sha_mismatch_error(f"{dest.name} downloaded from {link.url}", expected_sha256,
                                 actual, "the index serves a different file than the pin "
                                 "expects; check sdist_sha256 in pin.toml")
    os.replace(part, dest)
    return dest


def ensure_sdist(pin: Pin, cfg: IndexConfig | None = None) -> Path:
    """Return the path of the verified, cached sdist, downloading it when needed."""
    path = cache_dir() / pin.sdist_filename
    if path.is_file():
        actual = sha256_file(path)
        if actual != pin.sdist_sha256:
            raise sha_mismatch_error(f"cached {path}", pin.sdist_sha256, actual,
                                     f"if pin.toml is right, the cached file is damaged: "
                                     f"delete it (rm {path}) and run again to download it")
        return path
    link = find_sdist(pin, cfg)
    if link.sha256 and link.sha256.lower() != pin.sdist_sha256:
        raise sha_mismatch_error(f"{pin.sdist_filename} as listed by {link.origin}",
                                 pin.sdist_sha256, link.sha256.lower(),
                                 "the index publishes a different file than the pin expects; "
                                 "check sdist_sha256 in pin.toml")
    if link.url.startswith("file:"):
        src = Path(urllib.request.url2pathname(urllib.parse.urlsplit(link.url).path))
        actual = sha256_file(src)
        if actual != pin.sdist_sha256:
            raise sha_mismatch_error(str(src), pin.sdist_sha256, actual,
                                     "check sdist_sha256 in pin.toml")
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.part-{os.getpid()}")
        shutil.copyfile(src, part)
        os.replace(part, path)
        return path
    return download(link, path, pin.sdist_sha256)


# --------------------------------------------------------------------------- tar

def _member_error(tar: Path, name: str, why: str) -> DeepinferError:
    return DeepinferError(f"refusing to extract {tar.name}: member {name!r} {why}",
                          hint="the archive is malformed or malicious; nothing was written "
                               "outside the staging directory")


def _check_relative(name: str) -> PurePosixPath:
    """Normalized relative path, or raise ValueError for absolute / ``..`` / empty names."""
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise ValueError("has an absolute path")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError("contains '..'")
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _inside(rel: str) -> bool:
    """True when a relative posix path, normalized lexically, stays inside its root."""
    depth = 0
    for part in rel.split("/"):
        if part in ("", "."):
            continue
        depth += -1 if part == ".." else 1
        if depth < 0:
            return False
    return True


def _within(path: str, root: Path) -> bool:
    root_s = str(root)
    return path == root_s or path.startswith(root_s.rstrip(os.sep) + os.sep)


def _copy_member(m: tarfile.TarInfo, name: str, linkname: str) -> tarfile.TarInfo:
    import copy
    m2 = copy.copy(m)
    m2.name, m2.linkname = name, linkname
    return m2


def safe_extract(tar_path: Path, dest: Path, strip_prefix: str | None = None) -> int:
    """Extract a (gzip) tarball into ``dest`` safely; returns the number of members.

    ``strip_prefix``: a top-level directory every member must live under; it is removed
    from the extracted paths. Each member is checked before it is written: absolute names,
    ``..`` components, symlinks or hard links whose target leaves ``dest``, and
    device/fifo members raise :class:`DeepinferError`. A truncated or corrupt archive
    raises too. Files already written stay in ``dest``: extract into a staging directory
    and discard it on error.
    """
    dest.mkdir(parents=True, exist_ok=True)
    dest_real = Path(os.path.realpath(dest))
    data_filter = getattr(tarfile, "data_filter", None)
    count = 0
    try:
        with tarfile.open(tar_path, "r:*") as tf:
            for m in tf:
                try:
                    rel = _check_relative(m.name)
                except ValueError as exc:
                    raise _member_error(tar_path, m.name, str(exc))
                if strip_prefix:
                    if rel.parts[:1] != (strip_prefix,):
                        raise _member_error(tar_path, m.name, f"is outside {strip_prefix}/")
                    if len(rel.parts) == 1:
                        continue  # the top directory itself
                    rel = PurePosixPath(*rel.parts[1:])
                if m.isdev() or m.isfifo():
                    raise _member_error(tar_path, m.name, "is a device or fifo")
                linkname = m.linkname
                if m.issym():
                    if linkname.startswith("/") or not _inside(str(rel.parent / linkname)):
                        raise _member_error(tar_path, m.name,
                                            f"is a symlink to {linkname!r}, outside the target")
                elif m.islnk():
                    try:
                        lrel = _check_relative(linkname)
                    except ValueError as exc:
                        raise _member_error(tar_path, m.name, f"is a hard link that {exc}")
                    if strip_prefix:
                        if lrel.parts[:1] != (strip_prefix,):
                            raise _member_error(tar_path, m.name, "is a hard link outside "
                                                f"{strip_prefix}/")
                        lrel = PurePosixPath(*lrel.parts[1:])
                    linkname = str(lrel)
                elif not (m.isfile() or m.isdir()):
                    raise _member_error(tar_path, m.name, "has an unsupported type")
                # on-disk check (links already extracted may point elsewhere than the
                # lexical path suggests): the parent directory, and a symlink's target,
                # must resolve inside dest
                parent = os.path.realpath(dest_real / str(rel.parent))
                if not _within(parent, dest_real):
                    raise _member_error(tar_path, m.name, "would be written through a link "
                                        "outside the target")
                if m.issym() and not _within(os.path.realpath(os.path.join(parent, linkname)),
                                             dest_real):
                    raise _member_error(tar_path, m.name,
                                        f"is a symlink to {linkname!r}, outside the target")
                if hasattr(m, "replace"):
                    m = m.replace(name=str(rel), linkname=linkname, deep=False)
                else:  # Python < 3.11.4
                    m = _copy_member(m, str(rel), linkname)
                if data_filter is not None:
                    try:  # second, independent check (resolves links on disk)
                        m = data_filter(m, str(dest))
                    except tarfile.FilterError as exc:
                        raise _member_error(tar_path, m.name, str(exc))
                    tf.extract(m, dest, set_attrs=True, filter="fully_trusted")
                else:
                    tf.extract(m, str(dest), set_attrs=True)
                count += 1
    except DeepinferError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DeepinferError(f"{tar_path} is not a readable tarball ({exc.__class__.__name__}: "
                             f"{exc})", hint=f"if it is a cached download, delete it "
                                            f"(rm {tar_path}) and run again")
    return count


# --------------------------------------------------------------------------- verification

_VERSION_RE = re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.M)
_COMMIT_RE = re.compile(r"^__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['\"]([^'\"]+)['\"]", re.M)


def read_version_file(tree: Path, package: str = "vllm") -> tuple[str | None, str | None]:
    """(version, commit id) from ``<tree>/<package>/_version.py``; (None, None) if absent."""
    p = tree / package / "_version.py"
    if not p.is_file():
        return None, None
    text = p.read_text(encoding="utf-8", errors="replace")
    v, c = _VERSION_RE.search(text), _COMMIT_RE.search(text)
    return (v.group(1) if v else None), (c.group(1) if c else None)


def verify_version_file(tree: Path, pin: Pin, origin: str) -> str:
    """Check ``_version.py`` against the pin; returns the commit id it records."""
    version, commit = read_version_file(tree, pin.package)
    vf = f"{pin.package}/_version.py"
    if version is None and commit is None:
        raise DeepinferError(f"{origin}: {vf} is missing, so the upstream commit cannot be "
                             "verified", hint="use the published sdist or a git checkout")
    if version != pin.version:
        raise DeepinferError(f"{origin}: {vf} says version {version!r}, pin expects "
                             f"{pin.version!r}")
    if not commit or not pin.commit_matches(commit):
        raise DeepinferError(f"{origin}: {vf} says commit {commit!r}, pin expects "
                             f"{pin.commit or pin.commit_short!r}")
    return commit


# --------------------------------------------------------------------------- materialize

@dataclass(frozen=True)
class SourceSpec:
    """Parsed ``SOURCE=`` value: kind ``sdist``, ``git`` or ``path``."""

    kind: str
    path: Path | None = None
    git_url: str | None = None

    @staticmethod
    def parse(value: str | None, git_url: str | None = None) -> "SourceSpec":
        value = (value or "sdist").strip()
        if value == "sdist":
            return SourceSpec("sdist")
        if value == "git":
            return SourceSpec("git", git_url=git_url or None)
        if value.startswith("path:") and len(value) > 5:
            return SourceSpec("path", path=Path(value[5:]).expanduser().resolve())
        raise DeepinferError(f"unknown SOURCE={value!r}",
                             hint="use SOURCE=sdist (default), SOURCE=git [GIT_URL=...] or "
                                  "SOURCE=path:DIR")


@dataclass(frozen=True)
class SourceInfo:
    """What :func:`materialize` put into the staging directory."""

    kind: str
    description: str   # stable identity of the input (goes into the fingerprint)
    commit: str         # upstream commit as verified (short or full)
    label: str          # for people; no local paths for sdist/git (it goes into the
                        # base commit message, whose id must not depend on the machine)


def _git(*args: str, cwd: Path | None = None) -> str:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0")
    r = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise DeepinferError(f"git {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout.strip()


def _fetch_git(pin: Pin, url: str, dest: Path) -> str:
    """Check the pinned commit out into ``dest`` from a per-user bare cache; returns it.

    Only that commit is fetched (``--depth=1``): the base tree is all a 3-way apply needs.
    """
    cache = cache_root() / "git" / f"{pin.package}.git"
    if not cache.is_dir():
        cache.parent.mkdir(parents=True, exist_ok=True)
        _git("init", "-q", "--bare", str(cache))
    want = pin.commit or None
    commit = None
    if want:
        try:
            commit = _git("rev-parse", "-q", "--verify", f"{want}^{{commit}}", cwd=cache)
        except DeepinferError:
            commit = None
    if commit is None:
        console.print(f"fetching {pin.git_tag} from {url}")
        ref = want or f"refs/tags/{pin.git_tag}"
        try:
            _git("fetch", "-q", "--no-tags", "--depth=1", url,
                 f"+{ref}:refs/deepinfer/fetched/{pin.version}" if not want else want,
                 cwd=cache)
        except DeepinferError as exc:
            raise DeepinferError(f"cannot fetch {ref} from {url}", details=[exc.message],
                                 hint="set GIT_URL to a reachable clone of vLLM (a local path "
                                      "works offline)")
        commit = _git("rev-parse", (want or f"refs/deepinfer/fetched/{pin.version}")
                      + "^{commit}", cwd=cache)
    if not pin.commit_matches(commit):
        raise DeepinferError(f"{url} {pin.git_tag} is commit {commit}, pin expects "
                             f"{pin.commit or pin.commit_short}",
                             hint="the tag moved or GIT_URL points at another repository")
    dest.mkdir(parents=True, exist_ok=True)
    _git(f"--git-dir={cache}", f"--work-tree={dest}", "checkout", "-f", commit, "--", ".")
    # the checkout wrote an index into the cache; it is not needed
    (cache / "index").unlink(missing_ok=True)
    return commit


def _tree_stat_digest(root: Path) -> str:
    """Cheap identity of a directory: sorted paths with size, mtime and mode."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            st = os.lstat(os.path.join(dirpath, name))
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\n".encode())
    return h.hexdigest()


def _copy_path_source(src: Path, dest: Path) -> None:
    def ignore(d, names):
        return {n for n in names if n in (".git", "__pycache__")}
    for p in src.rglob("*"):
        if p.is_symlink():
            target = os.path.realpath(p)
            if os.path.commonpath([target, str(src)]) != str(src):
                raise DeepinferError(f"{p} is a symlink to {target}, outside {src}")
    shutil.copytree(src, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)


def describe(spec: SourceSpec, pin: Pin) -> str:
    """Stable identity of a source's content (cheap; used for the no-op check)."""
    # the pinned commit is part of the identity: a cached base made under another pin
    # must not skip the commit verification
    if spec.kind == "sdist":
        return f"sdist:{pin.sdist_sha256}:{pin.commit_short}:{pin.commit}"
    if spec.kind == "git":
        return f"git:{pin.git_tag}:{pin.commit_short}:{pin.commit}"
    assert spec.path is not None
    return f"path:{spec.path}:{_tree_stat_digest(spec.path)}"


def materialize(spec: SourceSpec, pin: Pin, dest: Path) -> SourceInfo:
    """Put the verified pristine upstream tree into ``dest`` (which must not exist or be
    empty). Raises :class:`DeepinferError` on any verification failure."""
    if spec.kind == "sdist":
        sdist = ensure_sdist(pin)
        safe_extract(sdist, dest, strip_prefix=f"{pin.package}-{pin.version}")
        commit = verify_version_file(dest, pin, f"sdist {sdist.name}")
        return SourceInfo("sdist", describe(spec, pin), commit,
                          f"sdist {sdist.name} sha256:{pin.sdist_sha256}")
    if spec.kind == "git":
        url = spec.git_url or pin.git_url
        if not url:
            raise DeepinferError("SOURCE=git needs a git URL", hint="set GIT_URL= or git_url "
                                 "in pin.toml")
        commit = _fetch_git(pin, url, dest)
        return SourceInfo("git", describe(spec, pin), commit, f"git {pin.git_tag} {commit}")
    assert spec.path is not None
    src = spec.path
    if not src.is_dir():
        raise DeepinferError(f"SOURCE=path:{src}: not a directory")
    desc = describe(spec, pin)
    version, commit = read_version_file(src, pin.package)
    if version is None and (src / ".git").exists():
        commit = _git("rev-parse", "HEAD", cwd=src)
        if not pin.commit_matches(commit):
            raise DeepinferError(f"SOURCE=path:{src}: HEAD is {commit}, pin expects "
                                 f"{pin.commit or pin.commit_short}")
    else:
        commit = verify_version_file(src, pin, f"SOURCE=path:{src}")
    _copy_path_source(src, dest)
    return SourceInfo("path", desc, commit, f"path {src}")


def remove_tree(path: Path) -> None:
    """rm -rf: tolerates files vanishing meanwhile and read-only entries (git objects)."""
    def onerror(func, p, exc_info):
        exc = exc_info[1]
        if isinstance(exc, FileNotFoundError):
            return
        if func in (os.unlink, os.remove, os.rmdir) and isinstance(exc, PermissionError):
            try:
                os.chmod(os.path.dirname(p), stat.S_IRWXU)
                func(p)
                return
            except OSError:
                pass
        raise exc
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, onerror=onerror)
