"""Name an upstream to compare against: a release on the package index, a git commit, or
a directory, and open it as a :class:`~deepinfer.snapshot.Snapshot`.

``AGAINST`` forms: ``latest`` / empty (newest final release on pip's configured index),
``0.32.0`` (a release: its sdist), ``path:DIR`` (an unpacked tree), anything else is a git
revision (commit, tag, branch) fetched from ``GIT_URL`` or the pin's ``git_url``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path

from . import snapshot, source
from .console import DeepinferError
from .patchset import Pin

_VERSION_LIKE = re.compile(r"^\d+(\.\d+)+((a|b|rc|\.post|\.dev)\d+)?$")
_FINAL = re.compile(r"^\d+(\.\d+)+(\.post\d+)?$")


def _vkey(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def sdist_versions(package: str, cfg: source.IndexConfig | None = None,
                   timeout: float = 30.0) -> list[str]:
    """Versions with a published sdist on pip's configured indexes (and find-links)."""
    cfg = cfg or source.pip_index_config()
    pat = re.compile(rf"^{re.escape(package)}-(.+)\.tar\.gz$", re.I)
    found: set[str] = set()
    errors: list[str] = []
    for index in cfg.index_urls:
        page = index.rstrip("/") + "/" + source._normalize(package) + "/"
        try:
            body, ctype = source._fetch(page, timeout)
        except (OSError, urllib.error.URLError) as exc:
            errors.append(f"{page}: {getattr(exc, 'reason', exc)}")
            continue
        names: list[str] = []
        if "json" in ctype:
            names = [f.get("filename", "") for f in json.loads(body).get("files", [])]
        else:
            p = source._AnchorParser()
            p.feed(body.decode("utf-8", errors="replace"))
            names = [urllib.parse.unquote(Path(urllib.parse.urlsplit(h).path).name)
                     for h, _ in p.links]
        for n in names:
            m = pat.match(n)
            if m:
                found.add(m.group(1))
    for loc in cfg.find_links:
        d = Path(loc[len("file://"):] if loc.startswith("file://") else loc)
        if d.is_dir():
            for f in d.glob(f"{package}-*.tar.gz"):
                m = pat.match(f.name)
                if m:
                    found.add(m.group(1))
    if not found and errors:
        raise DeepinferError(f"cannot list {package} releases on the package index",
                             details=[f"  {e}" for e in errors],
                             hint="check network access / PIP_INDEX_URL, or name the "
                                  "version explicitly (AGAINST=0.32.0 with a cached sdist)")
    return sorted(found, key=_vkey)


def latest_release(package: str = "vllm") -> str:
    finals = [v for v in sdist_versions(package) if _FINAL.match(v)]
    if not finals:
        raise DeepinferError(f"no final release of {package} with an sdist on the index")
    return finals[-1]


@dataclass
class Upstream:
    kind: str            # sdist | git | path
    ref: str             # version, revision or directory
    label: str           # short name used in file names and reports ("0.32.0", "4ba787ec9")
    pin: Pin | None      # for kind sdist: the pin-like record with the verified sha256
    git_repo: Path | None = None
    commit: str = ""


def _version_of(data: bytes | None) -> tuple[str | None, str | None]:
    if data is None:
        return None, None
    text = data.decode("utf-8", "replace")
    v, c = source._VERSION_RE.search(text), source._COMMIT_RE.search(text)
    return (v.group(1) if v else None), (c.group(1) if c else None)


def release_pin(version: str, base: Pin) -> Pin:
    """A pin for release ``version``: the sha256 of a cached sdist, else the sha256 the
    index publishes (a file from a find-links directory is hashed)."""
    stub = replace(base, version=version, commit_short="", commit="", sdist_sha256="0" * 64,
                   git_tag=f"v{version}")
    cached = source.cache_dir() / stub.sdist_filename
    if cached.is_file():
        return replace(stub, sdist_sha256=source.sha256_file(cached))
    link = source.find_sdist(stub)
    sha = link.sha256
    if not sha and link.url.startswith("file:"):
        sha = source.sha256_file(Path(urllib.parse.unquote(urllib.parse.urlsplit(link.url).path)))
    if not sha:
        raise DeepinferError(f"{link.origin} publishes no sha256 for {stub.sdist_filename}",
                             hint="download it yourself, check it, and put it into "
                                  f"{source.cache_dir()}")
    return replace(stub, sdist_sha256=sha.lower())


def ensure_git_rev(url: str, rev: str, package: str = "vllm") -> tuple[Path, str]:
    """Fetch ``rev`` into the per-user bare cache repository; (repo, full commit)."""
    cache = source.cache_root() / "git" / f"{package}.git"
    if not cache.is_dir():
        cache.parent.mkdir(parents=True, exist_ok=True)
        source._git("init", "-q", "--bare", str(cache))

    def rev_parse() -> str | None:
        r = subprocess.run(["git", "-C", str(cache), "rev-parse", "-q", "--verify",
                            f"{rev}^{{commit}}"], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    commit = rev_parse()
    if commit is None:
        if not url:
            raise DeepinferError(f"{rev!r} is not a release version and no git URL is known",
                                 hint="set GIT_URL= (a local clone works offline)")
        # a full id, a tag, a branch; an abbreviated id needs the branches and tags
        attempts = [[rev], [f"+refs/tags/{rev}:refs/tags/{rev}"],
                    ["+refs/heads/*:refs/deepinfer/heads/*", "+refs/tags/*:refs/tags/*"]]
        errors = []
        for specs in attempts:
            r = subprocess.run(["git", "-C", str(cache), "fetch", "-q", "--no-tags", url, *specs],
                               capture_output=True, text=True,
                               env=dict(os.environ, GIT_TERMINAL_PROMPT="0"))
            if r.returncode:
                errors.append(r.stderr.strip())
                continue
            commit = rev_parse()
            if commit is None and len(specs) == 1 and specs[0] == rev:
                r2 = subprocess.run(["git", "-C", str(cache), "rev-parse", "FETCH_HEAD^{commit}"],
                                    capture_output=True, text=True)
                commit = r2.stdout.strip() if r2.returncode == 0 else None
            if commit:
                break
        if commit is None:
            raise DeepinferError(f"cannot find revision {rev!r} in {url}",
                                 details=[f"  {e}" for e in errors if e],
                                 hint="check the revision, or set GIT_URL to a clone that has it")
    return cache, commit


def resolve(against: str | None, base: Pin) -> Upstream:
    """Turn an ``AGAINST=`` value into an :class:`Upstream` (downloads nothing yet for git)."""
    against = (against or "").strip()
    if against in ("", "latest"):
        against = latest_release(base.package)
    if against.startswith("path:"):
        d = Path(against[5:]).expanduser().resolve()
        if not d.is_dir():
            raise DeepinferError(f"AGAINST={against}: {d} is not a directory")
        return Upstream("path", str(d), d.name, None)
    if _VERSION_LIKE.match(against):
        return Upstream("sdist", against, against, release_pin(against, base))
    url = os.environ.get("GIT_URL") or base.git_url
    repo, commit = ensure_git_rev(url, against, base.package)
    return Upstream("git", against, commit[:12], None, repo, commit)


def open_snapshot(up: Upstream, want: snapshot.Want) -> snapshot.Snapshot:
    """Read the upstream (verifying an sdist's sha256 and its ``_version.py``)."""
    if up.kind == "sdist":
        assert up.pin is not None
        tarball = source.ensure_sdist(up.pin)
        snap = snapshot.from_sdist(tarball, lambda p, s: want(p, s) or p.endswith("/_version.py"),
                                   label=up.label)
        version, commit = _version_of(snap.read(f"{up.pin.package}/_version.py"))
        if version != up.pin.version:
            raise DeepinferError(f"{tarball.name}: _version.py says version {version!r}, "
                                 f"expected {up.pin.version!r}")
        up.commit = commit or ""
        return snap
    if up.kind == "git":
        assert up.git_repo is not None
        return snapshot.from_git(up.git_repo, up.commit, want, label=up.label)
    snap = snapshot.from_dir(Path(up.ref), label=up.label)
    return snap
