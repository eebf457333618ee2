"""Source acquisition: pip's index configuration, PEP 691/503 lookup, download + sha256,
cache, safe tar extraction (CPU; a local HTTP server stands in for the package index)."""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import tarfile
import threading
from pathlib import Path

import pytest

from deepinfer import source
from deepinfer.console import DeepinferError
from deepinfer.patchset import load_pin
from tool_synth import VERSION, SynthProject, sha256


# ------------------------------------------------------------------ pip configuration

def test_pip_index_config_follows_pip(monkeypatch, tmp_path):
    cfg_file = tmp_path / "pip.conf"
    cfg_file.write_text("[global]\nindex-url = https://cfg.example/simple\n"
                        "extra-index-url = https://extra.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(cfg_file))
    for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(k, raising=False)
    cfg = source.pip_index_config()
    assert cfg.index_url == "https://cfg.example/simple"
    assert "https://extra.example/simple" in cfg.extra_index_urls
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.example/simple")
    assert source.pip_index_config().index_url == "https://env.example/simple"


def test_pip_default_index_comes_from_pip(monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(k, raising=False)
    from pip._internal.models.index import PyPI
    assert source.pip_index_config().index_urls == [PyPI.simple_url]


# ------------------------------------------------------------------ index pages

def test_parse_simple_html_and_json():
    html = (b'<html><body><a href="../../files/vllm-1.0.0.tar.gz#sha256=' + b"ab" * 32 +
            b'">vllm-1.0.0.tar.gz</a><a href="x/vllm-1.0.0-py3-none-any.whl">w</a></body>')
    link = source.parse_simple_html(html, "https://idx.example/simple/vllm/", "vllm-1.0.0.tar.gz")
    assert link.url == "https://idx.example/files/vllm-1.0.0.tar.gz"
    assert link.sha256 == "ab" * 32
    doc = {"meta": {"api-version": "1.0"}, "name": "vllm", "files": [
        {"filename": "vllm-1.0.0.tar.gz", "url": "https://f.example/v.tgz",
         "hashes": {"sha256": "cd" * 32}}]}
    link = source.parse_simple_json(json.dumps(doc).encode(), "https://idx/simple/vllm/",
                                    "vllm-1.0.0.tar.gz")
    assert link.url == "https://f.example/v.tgz" and link.sha256 == "cd" * 32
    assert source.parse_simple_json(json.dumps(doc).encode(), "u", "other.tar.gz") is None


class _Index:
    """A tiny package index: PEP 691 JSON when asked for it, PEP 503 HTML otherwise."""

    def __init__(self, sdist: Path, json_api: bool = True, advertised_sha: str | None = None):
        self.sdist, self.json_api = sdist, json_api
        self.sha = advertised_sha or sha256(sdist)
        self.requests: list[tuple[str, str]] = []
        idx = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                idx.requests.append((self.path, self.headers.get("Accept", "")))
                name = idx.sdist.name
                if self.path == "/simple/vllm/":
                    if idx.json_api and "vnd.pypi.simple.v1+json" in self.headers.get("Accept", ""):
                        body = json.dumps({"meta": {"api-version": "1.0"}, "name": "vllm",
                                           "files": [{"filename": name,
                                                      "url": f"/files/{name}",
                                                      "hashes": {"sha256": idx.sha}}]}).encode()
                        ctype = "application/vnd.pypi.simple.v1+json"
                    else:
                        body = f'<a href="/files/{name}#sha256={idx.sha}">{name}</a>'.encode()
                        ctype = "text/html"
                elif self.path == f"/files/{name}":
                    body, ctype = idx.sdist.read_bytes(), "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def synth(tmp_path, monkeypatch):
    return SynthProject(tmp_path, monkeypatch)


@pytest.mark.parametrize("json_api", [True, False])
def test_download_via_index_then_cache(synth, monkeypatch, json_api):
    original = synth.sdist.read_bytes()
    served = synth.tmp / "served" / synth.sdist.name
    served.parent.mkdir()
    served.write_bytes(original)
    synth.sdist.unlink()  # cold cache
    index = _Index(served, json_api=json_api)
    try:
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        pin = load_pin(synth.pdir / "pin.toml")
        path = source.ensure_sdist(pin)
        assert path == synth.cache / "sdists" / synth.sdist.name
        assert path.read_bytes() == original
        assert index.requests[0][0] == "/simple/vllm/"
        assert "application/vnd.pypi.simple.v1+json" in index.requests[0][1]
        n = len(index.requests)
        assert source.ensure_sdist(pin) == path  # warm cache: no request at all
        assert len(index.requests) == n
    finally:
        index.close()


def test_download_sha_mismatch_keeps_cache_empty(synth, monkeypatch):
    served = synth.tmp / "served" / synth.sdist.name
    served.parent.mkdir()
    served.write_bytes(b"not the pinned file")
    synth.sdist.unlink()
    index = _Index(served, advertised_sha=hashlib.sha256(b"not the pinned file").hexdigest())
    try:
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        pin = load_pin(synth.pdir / "pin.toml")
        with pytest.raises(DeepinferError) as ei:
            source.ensure_sdist(pin)
        text = str(ei.value)
        assert pin.sdist_sha256 in text
        assert hashlib.sha256(b"not the pinned file").hexdigest() in text
        # the index lies about the hash too: the download itself must be checked
        index.sha = pin.sdist_sha256
        with pytest.raises(DeepinferError, match="sha256 mismatch") as ei:
            source.ensure_sdist(pin)
        assert hashlib.sha256(b"not the pinned file").hexdigest() in str(ei.value)
        assert list((synth.cache / "sdists").iterdir()) == []
    finally:
        index.close()


def test_not_found_lists_locations(synth, monkeypatch):
    synth.sdist.unlink()
    empty = synth.tmp / "simple"
    empty.mkdir()
    monkeypatch.setenv("PIP_INDEX_URL", empty.as_uri())
    with pytest.raises(DeepinferError, match="could not find vllm-1.0.0.tar.gz") as ei:
        source.ensure_sdist(load_pin(synth.pdir / "pin.toml"))
    assert empty.as_uri() in str(ei.value)


def test_file_index_and_find_links(synth, monkeypatch):
    data = synth.sdist.read_bytes()
    links = synth.tmp / "wheels"
    links.mkdir()
    (links / synth.sdist.name).write_bytes(data)
    synth.sdist.unlink()
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    path = source.ensure_sdist(load_pin(synth.pdir / "pin.toml"))
    assert path.read_bytes() == data


def test_corrupted_cache_file_is_reported(synth):
    synth.sdist.write_bytes(b"garbage")
    with pytest.raises(DeepinferError, match="cached") as ei:
        source.ensure_sdist(load_pin(synth.pdir / "pin.toml"))
    assert "rm " in ei.value.hint and hashlib.sha256(b"garbage").hexdigest() in str(ei.value)


# ------------------------------------------------------------------ safe extraction

def _tar(path: Path, members: list[tarfile.TarInfo], data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for m in members:
            if m.isfile():
                m.size = len(data)
                tf.addfile(m, io.BytesIO(data))
            else:
                tf.addfile(m)
    return path


def _member(name, type_=tarfile.REGTYPE, linkname=""):
    m = tarfile.TarInfo(name)
    m.type, m.linkname, m.mode = type_, linkname, 0o644
    return m


@pytest.mark.parametrize("members,why", [
    ([_member("/etc/evil")], "absolute path"),
    ([_member("pkg-1/../../evil")], "'..'"),
    ([_member("pkg-1/ok"), _member("pkg-1/link", tarfile.SYMTYPE, "../../outside")],
     "outside the target"),
    ([_member("pkg-1/link", tarfile.SYMTYPE, "/etc/passwd")], "outside the target"),
    ([_member("pkg-1/a/b", tarfile.SYMTYPE, "../../..")], "outside the target"),
    ([_member("pkg-1/hard", tarfile.LNKTYPE, "../outside")], "hard link"),
    ([_member("pkg-1/dev", tarfile.CHRTYPE)], "device"),
    ([_member("other/file")], "outside pkg-1/"),
])
def test_safe_extract_rejects_escapes(tmp_path, members, why):
    tarball = _tar(tmp_path / "bad.tar.gz", members)
    dest = tmp_path / "sub" / "dest"
    with pytest.raises(DeepinferError) as ei:
        source.safe_extract(tarball, dest, strip_prefix="pkg-1")
    assert why in str(ei.value)
    assert not (tmp_path / "sub" / "outside").exists()
    assert not (tmp_path / "evil").exists() and not (tmp_path / "sub" / "evil").exists()


@pytest.mark.parametrize("stdlib_filter", [True, False])
def test_safe_extract_symlink_chain_cannot_escape(tmp_path, monkeypatch, stdlib_filter):
    """a/l -> .. points at the root (inside). a/l/l2 -> .. looks inside lexically
    (a/l/.. = a) but resolves on disk to the root's parent; the on-disk check must stop it
    before a/l/l2/escaped is written outside. Checked with and without tarfile's own
    data filter (absent before Python 3.11.4)."""
    if not stdlib_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    members = [_member("pkg-1/a", tarfile.DIRTYPE), _member("pkg-1/a/l", tarfile.SYMTYPE, ".."),
               _member("pkg-1/a/l/l2", tarfile.SYMTYPE, ".."),
               _member("pkg-1/a/l/l2/escaped")]
    members[0].mode = 0o755
    tarball = _tar(tmp_path / "chain.tar.gz", members)
    (tmp_path / "box").mkdir()
    with pytest.raises(DeepinferError, match="outside"):
        source.safe_extract(tarball, tmp_path / "box" / "dest", strip_prefix="pkg-1")
    assert not (tmp_path / "box" / "escaped").exists()
    assert not (tmp_path / "box" / "l2").exists()


def test_safe_extract_accepts_inner_links(tmp_path):
    members = [_member("pkg-1/d", tarfile.DIRTYPE), _member("pkg-1/d/f"),
               _member("pkg-1/d/rel", tarfile.SYMTYPE, "f"),
               _member("pkg-1/up", tarfile.SYMTYPE, "d/f"),
               _member("pkg-1/hard", tarfile.LNKTYPE, "pkg-1/d/f")]
    for m in members:
        if m.isdir():
            m.mode = 0o755
    tarball = _tar(tmp_path / "ok.tar.gz", members)
    dest = tmp_path / "dest"
    assert source.safe_extract(tarball, dest, strip_prefix="pkg-1") == 5
    assert (dest / "d/rel").read_bytes() == b"x" and os.readlink(dest / "up") == "d/f"
    assert (dest / "hard").read_bytes() == b"x"


def test_verify_version_file(tmp_path, synth):
    pin = load_pin(synth.pdir / "pin.toml")
    (tmp_path / "vllm").mkdir()
    with pytest.raises(DeepinferError, match="missing"):
        source.verify_version_file(tmp_path, pin, "t")
    (tmp_path / "vllm/_version.py").write_text(
        f"__version__ = version = '{VERSION}'\n__commit_id__ = commit_id = 'gabc1234de'\n")
    assert source.verify_version_file(tmp_path, pin, "t") == "gabc1234de"
    (tmp_path / "vllm/_version.py").write_text(
        f"__version__ = version = '{VERSION}'\n__commit_id__ = commit_id = 'gabc0000'\n")
    with pytest.raises(DeepinferError, match="pin expects"):
        source.verify_version_file(tmp_path, pin, "t")


def test_real_pin_is_consistent():
    from deepinfer.patchset import load_patchset
    ps = load_patchset("0.33.0")
    assert ps.pin.sdist_filename == "vllm-0.33.0.tar.gz"
    assert ps.pin.commit_matches("g4ba787ec9") and not ps.pin.commit_matches("g4ba787ec8")
    assert ps.pin.commit == ""  # full id unknown offline (see pin.toml)
