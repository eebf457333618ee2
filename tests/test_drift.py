"""Drift report against synthetic upstreams: one crafted case per status."""
from __future__ import annotations

import json

import pytest

from deepinfer import drift, hunkstatus as hs
from test_drift_synth import BASE_VERSION, edit_line, numbered

FILES = {f"vllm/{n}.py": numbered(n) for n in
         ("clean", "offset", "fuzz", "threeway", "conflict", "renamed", "deleted",
          "done", "merged")}
FILES["vllm/lib.py"] = ("class Base:\n    pass\n\n\nclass OldBase:\n    pass\n\n\n"
                        "def helper():\n    return 1\n\n\ndef gone():\n    return 2\n")
FILES["vllm/repl.py"] = "VALUE = 1\n"


def _build(synth):
    p = synth(FILES)
    p.add_patch("clean: change line 20", {"vllm/clean.py": edit_line(FILES["vllm/clean.py"], 20, "PATCHED")})
    p.add_patch("offset", {"vllm/offset.py": edit_line(FILES["vllm/offset.py"], 20, "PATCHED")})
    p.add_patch("fuzz", {"vllm/fuzz.py": edit_line(FILES["vllm/fuzz.py"], 20, "PATCHED")})
    two = edit_line(edit_line(FILES["vllm/threeway.py"], 20, "PATCHED A"), 24, "PATCHED B")
    p.add_patch("three-way", {"vllm/threeway.py": two})
    p.add_patch("conflict", {"vllm/conflict.py": edit_line(FILES["vllm/conflict.py"], 20, "OURS")})
    p.add_patch("renamed", {"vllm/renamed.py": edit_line(FILES["vllm/renamed.py"], 20, "PATCHED")})
    p.add_patch("deleted", {"vllm/deleted.py": edit_line(FILES["vllm/deleted.py"], 20, "PATCHED")})
    done = edit_line(FILES["vllm/done.py"], 20, "PATCHED")
    p.add_patch("already applied", {"vllm/done.py": done})
    p.add_patch("merged", {"vllm/merged.py": edit_line(FILES["vllm/merged.py"], 20, "PATCHED")})
    p.add_patch("new file", {"vllm/brand_new.py": "x = 1\n"})
    p.add_overlay("vllm/newmod.py", "NEW = 1\n")
    p.add_overlay("vllm/repl.py", "VALUE = 2\n")
    p.add_overlay("vllm/uses.py",
                  "import vllm.lib as L\nfrom vllm.lib import Base, helper\n\n\n"
                  "class X(Base):\n    pass\n\n\nclass Y(L.OldBase):\n    pass\n\n\n"
                  "helper()\nL.gone()\n")
    p.add_overlay("deepinfer_sm80/ok.py", "from vllm.lib import Base\n")
    target = {
        "vllm/offset.py": "".join(f"inserted {i}\n" for i in range(5)) + FILES["vllm/offset.py"],
        "vllm/fuzz.py": edit_line(FILES["vllm/fuzz.py"], 17, "upstream edit 17"),
        "vllm/threeway.py": edit_line(FILES["vllm/threeway.py"], 22, "upstream edit 22"),
        "vllm/conflict.py": edit_line(FILES["vllm/conflict.py"], 20, "THEIRS"),
        "vllm/renamed.py": None,
        "vllm/moved/elsewhere.py": edit_line(FILES["vllm/renamed.py"], 3, "upstream edit 3"),
        "vllm/deleted.py": None,
        "vllm/done.py": done,
        "vllm/merged.py": edit_line(edit_line(FILES["vllm/merged.py"], 20, "PATCHED"), 18, "up 18"),
        "vllm/newmod.py": "UPSTREAM = 1\n",
        "vllm/repl.py": "VALUE = 1\nOTHER = 3\n",
        "vllm/lib.py": "class Base:\n    pass\n",
    }
    p.add_target("1.1.0", target)
    return p


def _statuses(report):
    return {e["subject"]: (e["status"], e["files"]) for e in report["patches"]}


def test_each_hunk_status(synth):
    p = _build(synth)
    report = drift.build_report(BASE_VERSION, "1.1.0", p.root)
    st = _statuses(report)
    assert st["clean: change line 20"][0] == "clean"
    status, files = st["offset"]
    assert status == "offset" and files[0]["hunks"][0]["offset"] == 5
    assert files[0]["hunks"][0]["target_line"] == 17 + 5
    status, files = st["fuzz"]
    assert status == "fuzz" and files[0]["hunks"][0]["fuzz"] == 1
    assert st["three-way"][0] == "three-way"
    status, files = st["conflict"]
    h = files[0]["hunks"][0]
    assert status == "conflict" and h["upstream_now"] == ["THEIRS"]
    assert h["target_line"] is not None
    status, files = st["renamed"]
    assert status == "file-missing" and files[0]["renamed_to"] == "vllm/moved/elsewhere.py"
    assert files[0]["hunks"][0]["at_new_path"] == "clean"
    status, files = st["deleted"]
    assert status == "file-missing" and files[0]["renamed_to"] is None
    assert st["already applied"][0] == "already-applied"
    assert st["merged"][0] == "merged-upstream"
    assert st["new file"][0] == "clean"
    assert report["summary"]["clean"] is False


def test_overlay_findings(synth):
    p = _build(synth)
    report = drift.build_report(BASE_VERSION, "1.1.0", p.root)
    ov = {o["path"]: o for o in report["overlay"]}
    assert ov["vllm/newmod.py"]["status"] == "collision"
    assert ov["vllm/newmod.py"]["kind"] == "new"
    assert ov["vllm/repl.py"]["status"] == "upstream-changed"
    assert "+OTHER = 3" in ov["vllm/repl.py"]["upstream_diff"]
    uses = ov["vllm/uses.py"]
    assert uses["status"] == "vanished-symbol"
    symbols = {(f["kind"], f["symbol"]) for f in uses["findings"]}
    assert ("import", "vllm.lib.helper") in symbols
    assert ("call", "vllm.lib.helper") in symbols
    assert ("call", "vllm.lib.gone") in symbols
    assert ("base-class", "vllm.lib.OldBase") in symbols
    assert not any(s[1] == "vllm.lib.Base" for s in symbols)  # still there
    assert ov["deepinfer_sm80/ok.py"]["status"] == "ok"


def test_clean_set_is_clean_and_strict_exit(synth, capsys):
    p = synth({"vllm/a.py": numbered("a")})
    p.add_patch("a", {"vllm/a.py": edit_line(numbered("a"), 5, "X")})
    p.add_target("1.1.0", {"vllm/a.py": "head\n" + numbered("a")})
    assert drift.main(["--vllm", BASE_VERSION, "--against", "1.1.0", "--strict"]) == 0
    p.add_target("1.2.0", {"vllm/a.py": edit_line(numbered("a"), 5, "Y")})
    assert drift.main(["--vllm", BASE_VERSION, "--against", "1.2.0", "--strict"]) == 3
    assert drift.main(["--vllm", BASE_VERSION, "--against", "1.2.0"]) == 0
    out = capsys.readouterr().out
    assert "conflict" in out and "0001-a.patch" in out and "vllm/a.py" in out


def test_report_files_are_stable(synth):
    p = _build(synth)
    args = ["--vllm", BASE_VERSION, "--against", "1.1.0"]
    assert drift.main(args) == 0
    jpath = p.root / "build" / "drift" / f"{BASE_VERSION}-to-1.1.0.json"
    first = jpath.read_bytes()
    md1 = jpath.with_suffix(".md").read_bytes()
    assert drift.main(args) == 0
    assert jpath.read_bytes() == first and jpath.with_suffix(".md").read_bytes() == md1
    data = json.loads(first)
    assert data["schema"] == drift.SCHEMA
    assert list(data) == sorted(data)
    assert "## What upstream has where hunks fail" in md1.decode()


def test_later_patch_sees_earlier_ones(synth):
    """Two patches on one file: the second's context contains the first's change."""
    base = numbered("s")
    p = synth({"vllm/s.py": base})
    one = edit_line(base, 10, "FIRST")
    p.add_patch("first", {"vllm/s.py": one})
    p.add_patch("second", {"vllm/s.py": edit_line(one, 12, "SECOND")})
    p.add_target("1.1.0", {"vllm/s.py": "top\n" * 3 + base})
    report = drift.build_report(BASE_VERSION, "1.1.0", p.root)
    assert [e["status"] for e in report["patches"]] == ["offset", "offset"]
    assert [e["files"][0]["hunks"][0]["offset"] for e in report["patches"]] == [3, 3]


def test_parse_no_newline_and_counts():
    text = ("diff --git a/f b/f\nindex 1111111..2222222 100644\n--- a/f\n+++ b/f\n"
            "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n"
            "\\ No newline at end of file\n")
    (fd,) = hs.parse_patch(text)
    assert fd.hunks[0].pre == ["a\n", "b"] and fd.hunks[0].post == ["a\n", "c"]
    res, after = hs.check_hunks(fd, ["a\n", "b"], None)
    assert res[0].status == "clean" and after == ["a\n", "c"]


def test_missing_target_version_is_clear(synth, monkeypatch):
    p = synth({"vllm/a.py": numbered("a")})
    monkeypatch.setenv("PIP_INDEX_URL", (p.tmp / "noindex").as_uri())
    monkeypatch.setenv("PIP_NO_INDEX", "0")
    with pytest.raises(Exception) as ei:
        drift.build_report(BASE_VERSION, "9.9.9", p.root)
    assert "vllm-9.9.9.tar.gz" in str(ei.value)


def test_latest_release_from_configured_index(synth, monkeypatch):
    """The newest final release comes from pip's configured index (here a file:// one),
    by version order, pre-releases excluded."""
    from deepinfer import upstream
    p = synth({"vllm/a.py": numbered("a")})
    simple = p.tmp / "index" / "simple"
    (simple / "vllm").mkdir(parents=True)
    files = ["vllm-1.0.0.tar.gz", "vllm-1.10.0.tar.gz", "vllm-1.9.0.tar.gz",
             "vllm-2.0.0rc1.tar.gz", "vllm-1.10.0-py3-none-any.whl"]
    (simple / "vllm" / "index.html").write_text(
        "<html><body>" + "".join(f'<a href="../../files/{f}#sha256={"0" * 64}">{f}</a>'
                                 for f in files) + "</body></html>")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", simple.as_uri())
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    assert upstream.latest_release("vllm") == "1.10.0"


def test_against_a_git_revision(synth, monkeypatch):
    from test_drift_synth import git
    p = synth({"vllm/a.py": numbered("a")})
    p.add_patch("a", {"vllm/a.py": edit_line(numbered("a"), 5, "X")})
    repo = p.tmp / "upstream-git"
    (repo / "vllm").mkdir(parents=True)
    (repo / "vllm" / "__init__.py").write_text("")
    (repo / "vllm" / "a.py").write_text("one\ntwo\n" + numbered("a"))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "upstream")
    sha = git(repo, "rev-parse", "HEAD").strip()
    monkeypatch.setenv("GIT_URL", str(repo))
    report = drift.build_report(BASE_VERSION, sha[:10], p.root)
    assert report["to"]["kind"] == "git" and report["to"]["commit"] == sha
    assert report["to"]["label"] == sha[:12]
    hunk = report["patches"][0]["files"][0]["hunks"][0]
    assert hunk["status"] == "offset" and hunk["offset"] == 2
