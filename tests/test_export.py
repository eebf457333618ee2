"""`deepinfer export`: round trip and the commit -> patch workflow (CPU, no network)."""
from __future__ import annotations

import pytest

from deepinfer import apply as ap
from deepinfer import export as ex
from deepinfer import source
from deepinfer.console import DeepinferError
from tool_synth import VERSION, SynthProject, git

SDIST = source.SourceSpec("sdist")


@pytest.fixture
def synth(tmp_path, monkeypatch):
    s = SynthProject(tmp_path, monkeypatch)
    s.add_patches(s.standard_series())
    return s


def _snapshot(pdir):
    return {p.name: p.read_bytes() for p in sorted(pdir.iterdir())}


def test_round_trip_is_byte_identical(synth):
    before = _snapshot(synth.pdir)
    ap.apply(VERSION, SDIST, root=synth.root)
    result = ex.export(VERSION, root=synth.root)
    assert result == {"alpha-5.patch": "unchanged", "beta-20.patch": "unchanged",
                      "alpha-6.patch": "unchanged"}
    assert _snapshot(synth.pdir) == before


def test_new_commit_becomes_patch(synth):
    ap.apply(VERSION, SDIST, root=synth.root)
    (synth.tree / "vllm/gamma.py").write_text("gamma rewritten\n")
    git(synth.tree, "add", "-A")
    git(synth.tree, "commit", "-qm", "Gate gamma on SM90+\n\nBecause Ampere lacks it.")
    result = ex.export(VERSION, root=synth.root)
    assert result["gate-gamma-on-sm90.patch"] == "new"
    series = (synth.pdir / "series").read_text()
    assert series == ("# order matters\nalpha-5.patch\nbeta-20.patch\nalpha-6.patch\n"
                      "gate-gamma-on-sm90.patch\n")
    text = (synth.pdir / "gate-gamma-on-sm90.patch").read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: Gate gamma on SM90+\n" in text
    assert "Because Ampere lacks it.\n\nOrigin: vendor, DeepInfer-SM80\nForwarded: no\n" \
           "Last-Update: 2026-03-02\n" in text
    assert "index " in text and ".." in text.split("index ", 1)[1][:90]  # full index line
    # the tree rebuilt from the exported patches has the same content, and exports the same
    snap = _snapshot(synth.pdir)
    res = ap.apply(VERSION, SDIST, root=synth.root)  # commits exported -> rebuild allowed
    assert res.changed
    assert (synth.tree / "vllm/gamma.py").read_text() == "gamma rewritten\n"
    assert set(ex.export(VERSION, root=synth.root).values()) == {"unchanged"}
    assert _snapshot(synth.pdir) == snap
    assert ap.status(VERSION, SDIST, root=synth.root).clean


def test_dropped_commit_removes_patch(synth):
    ap.apply(VERSION, SDIST, root=synth.root)
    # drop "Patch beta line 20" from history (rebase onto its parent)
    t = synth.tree
    shas = git(t, "log", "--format=%H", "--reverse", "refs/deepinfer/base..HEAD").split()
    git(t, "rebase", "-q", "--onto", shas[0], shas[1])
    result = ex.export(VERSION, root=synth.root)
    assert result["beta-20.patch"] == "removed"
    assert not (synth.pdir / "beta-20.patch").exists()
    assert "beta-20.patch" not in (synth.pdir / "series").read_text()


def test_export_refuses_uncommitted(synth):
    ap.apply(VERSION, SDIST, root=synth.root)
    (synth.tree / "vllm/beta.py").write_text("x\n")
    with pytest.raises(DeepinferError, match="uncommitted") as ei:
        ex.export(VERSION, root=synth.root)
    assert "vllm/beta.py" in str(ei.value)


def test_export_refuses_overlay_edits(synth):
    ap.apply(VERSION, SDIST, root=synth.root)
    (synth.tree / "vllm/sm80_extra.py").write_text("edited in tree\n")
    git(synth.tree, "commit", "-qam", "Edit overlay file in tree\n\nWrong place.")
    with pytest.raises(DeepinferError, match="overlay-managed") as ei:
        ex.export(VERSION, root=synth.root)
    assert "overlay/vllm/sm80_extra.py" in str(ei.value)


def test_export_without_tree(synth):
    with pytest.raises(DeepinferError, match="not an applied tree"):
        ex.export(VERSION, root=synth.root)


def test_dep3_trailers_added_once():
    mbox = (b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            b"From: A <a@b>\nDate: Sun, 1 Mar 2026 10:00:00 +0000\nSubject: S\n\n"
            b"Why.\n\nSigned-off-by: A <a@b>\n\ndiff --git a/x b/x\n")
    out, added = ex.add_dep3_trailers(mbox, "2026-03-01")
    assert added == ["Origin", "Forwarded", "Last-Update"]
    assert (b"Why.\n\nSigned-off-by: A <a@b>\nOrigin: vendor, DeepInfer-SM80\nForwarded: no\n"
            b"Last-Update: 2026-03-01\n\ndiff --git") in out
    again, added2 = ex.add_dep3_trailers(out, "2027-01-01")
    assert again == out and added2 == []
    partial = mbox.replace(b"Signed-off-by: A <a@b>", b"Forwarded: https://x/pr/1")
    out3, added3 = ex.add_dep3_trailers(partial, "2026-03-01")
    assert added3 == ["Origin", "Last-Update"] and b"Forwarded: https://x/pr/1\n" in out3


def test_slug():
    assert ex.slug("Gate has_deep_gemm() on SM90+ (DeepSeek-V4)") == \
        "gate-has_deep_gemm-on-sm90-deepseek-v4"
