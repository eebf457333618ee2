"""`deepinfer apply` / check / status against a synthetic upstream (CPU, no network)."""
from __future__ import annotations

import json
import os

import pytest

from deepinfer import apply as ap
from deepinfer import manifest as mf
from deepinfer import source
from deepinfer.export import export
from deepinfer.console import DeepinferError
from deepinfer.gittree import BASE_REF, GitTree
from deepinfer.patchset import PIN_MODULE_TREE_PATH, load_patchset, pin_module_text
from tool_synth import (VERSION, SynthProject, edit_line, git, make_patch, sha256,
                        write_tarball)

SDIST = source.SourceSpec("sdist")


@pytest.fixture
def synth(tmp_path, monkeypatch):
    s = SynthProject(tmp_path, monkeypatch)
    s.add_patches(s.standard_series())
    return s


def _apply(s, **kw):
    return ap.apply(VERSION, kw.pop("spec", SDIST), root=s.root, **kw)


def test_apply_builds_base_patches_overlay(synth):
    res = _apply(synth)
    assert res.changed
    t = GitTree(synth.tree)
    commits = t.commits(f"{BASE_REF}..HEAD")
    assert [c.subject for c in commits] == ["Patch alpha line 5", "Patch beta line 20",
                                            "Patch alpha line 6 + new file",
                                            f"deepinfer-sm80 overlay for vLLM {VERSION}"]
    assert "Deepinfer-Overlay: " in commits[-1].message
    # base commit = pristine upstream, generated files included (even though .gitignore'd)
    base_files = t.ls_tree(BASE_REF)
    assert "vllm.egg-info/PKG-INFO" in base_files and "vllm/_version.py" in base_files
    assert (synth.tree / "vllm/alpha.py").read_text().splitlines()[4:6] == \
        ["alpha PATCHED 5", "alpha PATCHED 6"]
    assert (synth.tree / "vllm/new_file.py").read_text() == "NEW = 1\n"
    assert (synth.tree / "vllm/sm80_extra.py").read_text() == "EXTRA = True\n"
    assert (synth.tree / "deepinfer_sm80/__init__.py").is_file()
    assert (synth.tree / "csrc/deepinfer_sm80/common/x.cuh").read_text() == "// header\n"
    # the pin module is generated from this set's pin.toml, inside the overlay commit
    pin_module = synth.tree / PIN_MODULE_TREE_PATH
    assert pin_module.read_text() == pin_module_text(load_patchset(VERSION, synth.root).pin)
    assert f"PINNED_VLLM_VERSION = '{VERSION}'" in pin_module.read_text()
    assert git(synth.tree, "log", "-1", "--format=%s", "--", PIN_MODULE_TREE_PATH).strip() \
        == f"deepinfer-sm80 overlay for vLLM {VERSION}"
    assert os.readlink(synth.build / "vllm") == f"vllm-{VERSION}"
    # patch authorship preserved by git am
    assert git(synth.tree, "log", "-1", "--format=%an %ad", "--date=iso-strict",
               commits[0].sha).strip() == "Patch Author 2026-03-01T10:00:00+00:00"
    st = ap.status(VERSION, SDIST, root=synth.root)
    assert st.clean and not st.differing and not st.dirty
    assert [c.status for c in st.checks] == ["clean"] * 3
    assert not list(synth.build.glob(".vllm-*tmp*"))


def test_apply_is_deterministic(synth, tmp_path):
    head1 = _apply(synth).state["head"]
    ap.clean(build=synth.build)
    assert not synth.build.exists()
    head2 = _apply(synth).state["head"]
    assert head1 == head2


def test_reapply_is_noop(synth, capsys):
    _apply(synth)
    head = GitTree(synth.tree).rev_parse("HEAD")
    inode = (synth.tree / "vllm/alpha.py").stat().st_ino
    res = _apply(synth)
    assert not res.changed
    assert "nothing to do" in capsys.readouterr().out
    assert GitTree(synth.tree).rev_parse("HEAD") == head
    assert (synth.tree / "vllm/alpha.py").stat().st_ino == inode


def test_changed_input_rebuilds(synth):
    _apply(synth)
    (synth.root / "overlay/vllm/sm80_extra.py").write_text("EXTRA = 2\n")
    st = ap.status(VERSION, SDIST, root=synth.root)
    assert not st.clean and st.differing == ["vllm/sm80_extra.py"]
    res = _apply(synth)
    assert res.changed
    assert (synth.tree / "vllm/sm80_extra.py").read_text() == "EXTRA = 2\n"
    assert ap.status(VERSION, SDIST, root=synth.root).clean


def _failing_series(s):
    f = s.files
    bad1 = make_patch(dict(f, **{"vllm/alpha.py": edit_line(f["vllm/alpha.py"], 10, "moved")}),
                      {"vllm/alpha.py": edit_line(edit_line(f["vllm/alpha.py"], 10, "moved"),
                                                  11, "alpha CHANGED 11")},
                      "Needs an upstream line that is not there")
    good = make_patch(f, {"vllm/beta.py": edit_line(f["vllm/beta.py"], 3, "beta ok")}, "Good")
    bad2 = make_patch(dict(f, **{"vllm/gone.py": "x\n"}), {"vllm/gone.py": "y\n"},
                      "Touches a file upstream removed")
    return [("bad-alpha.patch", bad1), ("good.patch", good), ("bad-gone.patch", bad2)]


def test_dry_run_reports_every_failing_patch(synth):
    synth.add_patches(_failing_series(synth))
    with pytest.raises(DeepinferError) as ei:
        ap.check(VERSION, SDIST, root=synth.root)
    text = str(ei.value)
    assert "2 of 3 patches do not apply" in text
    assert "bad-alpha.patch" in text and "bad-gone.patch" in text
    assert "good.patch" not in text.split("hint:")[0]
    assert "file: vllm/alpha.py" in text and "hunk: @@ -8,7 +8,7 @@" in text
    # what the patch expects vs what upstream has at that place
    assert "-moved" in text and "+alpha line 10" in text
    assert "vllm/gone.py" in text and "does not exist upstream" in text
    assert "make export" in ei.value.hint
    # the dry run leaves nothing behind
    assert not synth.tree.exists()
    assert not [p for p in synth.build.iterdir() if not p.name.endswith(".lock")]


def test_failing_patch_leaves_existing_tree_untouched(synth):
    _apply(synth)
    head = GitTree(synth.tree).rev_parse("HEAD")
    synth.add_patches(_failing_series(synth))
    with pytest.raises(DeepinferError, match="do not apply"):
        _apply(synth)
    assert GitTree(synth.tree).rev_parse("HEAD") == head
    assert (synth.tree / "vllm/alpha.py").read_text().splitlines()[4] == "alpha PATCHED 5"
    assert not list(synth.build.glob(".vllm-*"))[1:]  # only the lock file may remain


def test_needs_3way_is_applied_and_reported(synth):
    """A patch whose context moved (lines inserted above) applies via offset or 3-way."""
    f = synth.files
    shifted = dict(f, **{"vllm/gamma.py": "inserted\n" * 3 + f["vllm/gamma.py"]})
    p = make_patch(shifted, {"vllm/gamma.py": edit_line(shifted["vllm/gamma.py"], 18, "G!")},
                   "Patch gamma made on a shifted file")
    synth.add_patches([("gamma.patch", p)])
    res = _apply(synth)
    assert res.checks[0].status in ("clean", "3-way")
    assert "G!" in (synth.tree / "vllm/gamma.py").read_text()


def test_sha256_mismatch_names_both_digests_and_creates_nothing(synth):
    wrong = "0" * 64
    synth.write_pin(wrong)
    with pytest.raises(DeepinferError) as ei:
        _apply(synth)
    text = str(ei.value)
    assert wrong in text and sha256(synth.sdist) in text
    assert not synth.tree.exists()
    assert not list(synth.build.glob(".vllm-*tmp*"))


def test_corrupted_tarball(synth):
    data = synth.sdist.read_bytes()
    synth.sdist.write_bytes(data[: len(data) // 2])
    synth.write_pin(sha256(synth.sdist))
    with pytest.raises(DeepinferError, match="not a readable tarball"):
        _apply(synth)
    assert not synth.tree.exists()
    assert not list(synth.build.glob(".vllm-*tmp*"))


def test_wrong_commit_in_version_file(synth):
    files = dict(synth.files)
    files["vllm/_version.py"] = files["vllm/_version.py"].replace("gabc1234de", "g99999999")
    write_tarball(synth.sdist, VERSION, files)
    synth.write_pin(sha256(synth.sdist))
    with pytest.raises(DeepinferError, match="says commit 'g99999999'"):
        _apply(synth)
    assert not synth.tree.exists()


def test_dirty_tree_refused_then_forced_with_backup(synth):
    _apply(synth)
    (synth.tree / "vllm/beta.py").write_text("user edit\n")
    (synth.tree / "vllm/untracked_user_file.py").write_text("mine\n")
    (synth.root / "overlay/vllm/sm80_extra.py").write_text("EXTRA = 3\n")  # inputs changed
    with pytest.raises(DeepinferError) as ei:
        _apply(synth)
    text = str(ei.value)
    assert "M vllm/beta.py" in text and "vllm/untracked_user_file.py" in text
    assert "FORCE=1" in ei.value.hint
    assert (synth.tree / "vllm/beta.py").read_text() == "user edit\n"
    st = ap.status(VERSION, SDIST, root=synth.root)
    assert not st.clean and any("beta.py" in d for d in st.dirty)
    res = _apply(synth, force=True)
    assert res.changed and ap.status(VERSION, SDIST, root=synth.root).clean
    backups = list(synth.build.glob(f"vllm-{VERSION}.force-backup-*"))
    assert len(backups) == 1 and any("saved to" in w for w in res.warnings)
    diff = (backups[0] / "uncommitted.diff").read_text()
    assert "+user edit" in diff and "+mine" in diff


def test_unexported_commit_refused(synth):
    _apply(synth)
    (synth.tree / "vllm/gamma.py").write_text("committed by user\n")
    git(synth.tree, "commit", "-qam", "User change\n\nWhy it matters.")
    with pytest.raises(DeepinferError) as ei:
        _apply(synth, force=False)
    assert "User change" in str(ei.value) and "make export" in ei.value.hint
    res = _apply(synth, force=True)  # rebuilt; the commit is saved as a patch first
    assert res.changed and (synth.tree / "vllm/gamma.py").read_text() != "committed by user\n"
    saved = list(synth.build.glob(f"vllm-{VERSION}.force-backup-*/*.patch"))
    assert len(saved) == 4  # three series patches + the user's commit
    user = [p for p in saved if "user-change" in p.name]
    assert len(user) == 1 and "+committed by user" in user[0].read_text()


def test_change_amended_into_the_overlay_commit_is_refused_not_lost(synth):
    """Export skips the overlay commit, so the patch files still match the tree's other
    commits; a change amended into the overlay commit used to be rebuilt away silently
    (seen 2026-11-30). Apply must refuse it, say how to keep it, and back it up when
    forced."""
    _apply(synth)
    tree = GitTree(synth.tree)
    apply_head = tree.rev_parse("HEAD")
    (synth.tree / "vllm/gamma.py").write_text("amended by user\n")
    git(synth.tree, "commit", "-qa", "--amend", "--no-edit")
    with pytest.raises(DeepinferError) as ei:
        _apply(synth, force=False)
    text = str(ei.value)
    assert "no patch or overlay file has" in text and "vllm/gamma.py" in text
    assert f"reset --soft {apply_head[:12]}" in ei.value.hint and "make export" in ei.value.hint
    # the hint's recipe keeps the change as a commit of its own, which export then sees
    git(synth.tree, "reset", "-q", "--soft", apply_head)
    git(synth.tree, "commit", "-qm", "User change\n\nWhy it matters.")
    with pytest.raises(DeepinferError) as ei:
        _apply(synth, force=False)
    assert "User change" in str(ei.value)
    # forced: rebuilt, and the amended change saved first
    git(synth.tree, "reset", "-q", "--soft", apply_head)
    git(synth.tree, "commit", "-q", "--amend", "--no-edit")
    res = _apply(synth, force=True)
    assert res.changed and (synth.tree / "vllm/gamma.py").read_text() != "amended by user\n"
    diffs = list(synth.build.glob(f"vllm-{VERSION}.force-backup-*/unsaved-committed.diff"))
    assert len(diffs) == 1 and "+amended by user" in diffs[0].read_text()


def test_exported_commit_with_a_changed_overlay_rebuilds(synth):
    """The normal loop (commit in the tree, `make export`) while overlay/ also changed in
    the repository: the overlay files differ from HEAD's, but that is an input change,
    not an unsaved edit; apply rebuilds."""
    _apply(synth)
    (synth.tree / "vllm/gamma.py").write_text("committed by user\n")
    git(synth.tree, "commit", "-qam", "User change\n\nWhy it matters.")
    export(VERSION, root=synth.root)
    (synth.root / "overlay/vllm/sm80_extra.py").write_text("EXTRA = 5\n")
    res = _apply(synth)
    assert res.changed
    assert (synth.tree / "vllm/gamma.py").read_text() == "committed by user\n"
    assert (synth.tree / "vllm/sm80_extra.py").read_text() == "EXTRA = 5\n"


@pytest.mark.parametrize("stage", ["source", "base", "patch", "swap"])
def test_interrupted_apply_keeps_previous_tree(synth, monkeypatch, stage):
    _apply(synth)
    head = GitTree(synth.tree).rev_parse("HEAD")
    (synth.root / "overlay/vllm/sm80_extra.py").write_text("EXTRA = 4\n")

    def boom(s):
        if s == stage:
            raise KeyboardInterrupt
    monkeypatch.setattr(ap, "_checkpoint", boom)
    with pytest.raises(KeyboardInterrupt):
        _apply(synth)
    assert GitTree(synth.tree).rev_parse("HEAD") == head
    assert (synth.tree / "vllm/sm80_extra.py").read_text() == "EXTRA = True\n"
    assert not list(synth.build.glob(".vllm-*tmp*"))
    monkeypatch.setattr(ap, "_checkpoint", lambda s: None)
    assert _apply(synth).changed


def test_interrupted_first_apply_leaves_nothing(synth, monkeypatch):
    monkeypatch.setattr(ap, "_checkpoint", lambda s: (_ for _ in ()).throw(RuntimeError(s)))
    with pytest.raises(RuntimeError):
        _apply(synth)
    assert not synth.tree.exists()
    assert not list(synth.build.glob(".vllm-*tmp*"))


def test_crash_between_renames_is_recovered(synth):
    """A kill after the old tree was moved aside, before the new one was moved in."""
    _apply(synth)
    head = GitTree(synth.tree).rev_parse("HEAD")
    os.rename(synth.tree, synth.build / f".vllm-{VERSION}.old-4242")
    (synth.build / f".vllm-{VERSION}.tmp-4242").mkdir()  # half-built staging
    res = _apply(synth)
    assert not res.changed  # previous tree restored, inputs unchanged -> no-op
    assert GitTree(synth.tree).rev_parse("HEAD") == head
    assert not list(synth.build.glob(".vllm-*.old-*")) and not list(synth.build.glob(".vllm-*tmp*"))


def test_foreign_directory_refused(synth):
    synth.tree.mkdir(parents=True)
    (synth.tree / "precious.txt").write_text("x")
    with pytest.raises(DeepinferError, match="not made by"):
        _apply(synth)
    assert (synth.tree / "precious.txt").exists()


def test_state_file_records_inputs(synth):
    _apply(synth)
    state = json.loads((synth.tree / ".git/deepinfer-state.json").read_text())
    assert state["upstream_commit"] == "gabc1234de"
    assert [p["name"] for p in state["patches"]] == ["alpha-5.patch", "beta-20.patch",
                                                     "alpha-6.patch"]
    assert len(state["fingerprint"]) == 64


# ------------------------------------------------------------------ overlay manifest

def test_manifest_records_new_and_replaced(synth, tmp_path):
    (synth.root / "overlay/vllm/replaced.py").write_text("OURS = 1\n")
    path = mf.manifest(VERSION, SDIST, root=synth.root)
    text = path.read_text()
    from deepinfer.patchset import read_manifest
    rows = read_manifest(path).by_path()
    assert rows["vllm/sm80_extra.py"].kind == "new"
    assert rows["csrc/deepinfer_sm80/common/x.cuh"].kind == "new"
    rep = rows["vllm/replaced.py"]
    assert rep.kind == "replace" and rep.source == "overlay/vllm/replaced.py"
    # the blob id of the upstream file, computed independently
    up = tmp_path / "up.py"
    up.write_text(synth.files["vllm/replaced.py"])
    assert rep.upstream_blob == git(tmp_path, "hash-object", str(up)).strip()
    assert "Do not edit" in text
    res = _apply(synth)
    assert res.changed and not res.warnings
    assert (synth.tree / "vllm/replaced.py").read_text() == "OURS = 1\n"


def test_manifest_contradictions_block_apply(synth):
    mf.manifest(VERSION, SDIST, root=synth.root)
    # an overlay file the manifest calls new now collides with upstream
    mpath = synth.pdir / "overlay.toml"
    (synth.root / "overlay/vllm/alpha.py").write_text("collide\n")
    text = mpath.read_text() + ('\n[[file]]\npath = "vllm/alpha.py"\n'
                                'source = "overlay/vllm/alpha.py"\nkind = "new"\n')
    mpath.write_text(text)
    with pytest.raises(DeepinferError, match="does not match the pinned upstream") as ei:
        _apply(synth)
    assert "manifest says new" in str(ei.value)
    # a replacement written against another upstream blob
    mpath.write_text(text.replace('kind = "new"\n', 'kind = "replace"\nupstream_blob = "'
                                  + "1" * 40 + '"\n').replace(
        'path = "vllm/sm80_extra.py"', 'path = "vllm/sm80_extra.py"'))
    with pytest.raises(DeepinferError) as ei:
        _apply(synth)
    assert "written against upstream blob 1111" in str(ei.value)
    assert not synth.tree.exists()


def test_manifest_missing_entries_warn(synth):
    mf.manifest(VERSION, SDIST, root=synth.root)
    (synth.root / "overlay/vllm/later.py").write_text("x\n")
    res = _apply(synth)
    assert any("overlay/vllm/later.py" in w and "make manifest" in w for w in res.warnings)


# ------------------------------------------------------------------ other sources

def _upstream_git_repo(s, tag_commit_files=None):
    repo = s.tmp / "upstream.git-src"
    repo.mkdir()
    git(repo, "init", "-q")
    for rel, text in (tag_commit_files or s.files).items():
        if rel in ("vllm/_version.py", "vllm.egg-info/PKG-INFO"):
            continue  # generated files are not in upstream git
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "release")
    git(repo, "tag", f"v{VERSION}")
    return repo, git(repo, "rev-parse", "HEAD").strip()


def test_git_source(synth):
    repo, sha = _upstream_git_repo(synth)
    synth.write_pin(sha256(synth.sdist), commit_short="g" + sha[:9])
    res = _apply(synth, spec=source.SourceSpec("git", git_url=str(repo)))
    assert res.changed and res.state["upstream_commit"] == sha
    assert (synth.tree / "vllm/new_file.py").exists()
    assert ap.status(VERSION, source.SourceSpec("git", git_url=str(repo)), root=synth.root).clean
    # second apply: no network/clone needed and nothing to do
    assert not _apply(synth, spec=source.SourceSpec("git", git_url=str(repo))).changed


def test_git_source_wrong_commit(synth):
    repo, sha = _upstream_git_repo(synth)
    with pytest.raises(DeepinferError, match="pin expects"):
        _apply(synth, spec=source.SourceSpec("git", git_url=str(repo)))
    assert not synth.tree.exists()


def test_path_source(synth, tmp_path):
    unpacked = tmp_path / "unpacked"
    source.safe_extract(synth.sdist, unpacked, strip_prefix=f"vllm-{VERSION}")
    spec = source.SourceSpec.parse(f"path:{unpacked}")
    res = _apply(synth, spec=spec)
    assert res.changed and ap.status(VERSION, spec, root=synth.root).clean
    (unpacked / "vllm/_version.py").write_text("__version__ = version = '9.9.9'\n")
    with pytest.raises(DeepinferError, match="says version '9.9.9'"):
        _apply(synth, spec=source.SourceSpec.parse(f"path:{unpacked}"), force=True)


def test_bad_source_value():
    with pytest.raises(DeepinferError, match="unknown SOURCE"):
        source.SourceSpec.parse("ftp:x")


def test_base_cache_is_used_and_identical(synth):
    head = _apply(synth).state["head"]
    entries = list((synth.cache / "bases").iterdir())
    assert len(entries) == 1 and (entries[0] / "base.json").is_file()
    sdist_bytes = synth.sdist.read_bytes()
    synth.sdist.unlink()  # without the cache the apply would now need the (absent) index
    ap.clean(build=synth.build)
    assert _apply(synth).state["head"] == head
    # a damaged cache entry is ignored and rebuilt from the (verified) sdist
    for pack in entries[0].glob("*.pack"):
        pack.chmod(0o644)
        pack.write_bytes(b"PACK garbage")
    synth.sdist.write_bytes(sdist_bytes)
    ap.clean(build=synth.build)
    assert _apply(synth).state["head"] == head
    ap.clean(build=synth.build)
    assert _apply(synth).state["head"] == head  # the rebuilt entry works


def test_manifest_lists_only_committed_overlay_files(synth):
    git(synth.root, "init", "-q")
    git(synth.root, "add", "overlay", "csrc")
    git(synth.root, "commit", "-qm", "overlay")
    (synth.root / "overlay/vllm/wip.py").write_text("work in progress\n")
    path = mf.manifest(VERSION, SDIST, root=synth.root)
    from deepinfer.patchset import read_manifest
    rows = read_manifest(path).by_path()
    assert "vllm/sm80_extra.py" in rows and "vllm/wip.py" not in rows


def test_patch_touching_generated_file_is_rejected(synth):
    f = synth.files
    bad = make_patch(f, {"vllm/_version.py": f["vllm/_version.py"] + "x = 1\n"},
                     "Edit the generated version file")
    bad2 = make_patch(f, {"vllm.egg-info/PKG-INFO": "Name: vllm\nVersion: 9\n"}, "Edit PKG-INFO")
    synth.add_patches([("gen.patch", bad), ("pkg.patch", bad2)] + synth.standard_series())
    with pytest.raises(DeepinferError) as ei:
        ap.check(VERSION, SDIST, root=synth.root)
    text = str(ei.value)
    assert "2 of 5 patches do not apply" in text
    assert "vllm/_version.py" in text and "vllm.egg-info/PKG-INFO" in text
    assert "generated files" in text and "fix: edit" in text


def test_overlay_file_at_the_generated_pin_module_is_refused(synth):
    """The pin module comes from pin.toml; an overlay copy of it would be a second,
    silently stale pin. Both the dry run and apply refuse it, and nothing is built."""
    stray = synth.root / "overlay" / PIN_MODULE_TREE_PATH
    stray.write_text("PINNED_VLLM_VERSION = '0.0.1'\n")
    for run in (lambda: ap.check(VERSION, SDIST, root=synth.root), lambda: _apply(synth)):
        with pytest.raises(DeepinferError) as ei:
            run()
        text = str(ei.value) + (ei.value.hint or "")
        assert f"overlay/{PIN_MODULE_TREE_PATH}" in text and "generated" in text
    assert not synth.tree.exists()


def test_changed_pin_regenerates_the_pin_module(synth):
    _apply(synth)
    full = "abc1234de" + "0" * 31
    synth.write_pin(sha256(synth.sdist), commit=full)
    res = _apply(synth)
    assert res.changed
    assert f"PINNED_VLLM_COMMIT_FULL: str | None = '{full}'" in \
        (synth.tree / PIN_MODULE_TREE_PATH).read_text()


def test_base_commit_does_not_depend_on_cache_location(synth, monkeypatch, tmp_path):
    base1 = _apply(synth).state["base"]
    other = tmp_path / "elsewhere" / "cache"
    (other / "sdists").mkdir(parents=True)
    (other / "sdists" / synth.sdist.name).write_bytes(synth.sdist.read_bytes())
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(other))
    ap.clean(build=synth.build)
    assert _apply(synth).state["base"] == base1


def test_cli_reports_errors_without_traceback(synth, capsys):
    from deepinfer import cli
    assert cli.main(["apply", "--vllm", "9.9.9"]) == 1
    err = capsys.readouterr().err
    assert "error: no patch set for vLLM 9.9.9" in err and "Traceback" not in err
    assert cli.main(["check", "--vllm", VERSION]) == 0
    assert cli.main(["status", "--vllm", VERSION]) == 1  # no tree yet
    assert cli.main(["apply", "--vllm", VERSION]) == 0
    assert cli.main(["status", "--vllm", VERSION]) == 0
    assert "is clean" in capsys.readouterr().out


def test_patch_under_overlay_file_warns(synth):
    (synth.root / "overlay/vllm/beta.py").write_text("overlay beta\n")
    res = _apply(synth)
    assert any("beta-20.patch changes vllm/beta.py" in w for w in res.warnings)
    assert (synth.tree / "vllm/beta.py").read_text() == "overlay beta\n"


def test_rebuild_warns_about_lost_extension(synth):
    _apply(synth)
    (synth.tree / ".git/info/exclude").write_text("*.so\n")  # vLLM's .gitignore has *.so
    (synth.tree / "deepinfer_sm80/_C.abi3.so").write_bytes(b"\x7fELF")  # as `make build` does
    (synth.root / "overlay/vllm/sm80_extra.py").write_text("EXTRA = 5\n")
    res = _apply(synth)
    assert any("make build" in w and "_C.abi3.so" in w for w in res.warnings)
    assert not (synth.tree / "deepinfer_sm80/_C.abi3.so").exists()


def test_history_reset_is_refused_with_reason(synth):
    _apply(synth)
    git(synth.tree, "reset", "-q", "--hard", "refs/deepinfer/base")
    with pytest.raises(DeepinferError, match="re-applying would discard") as ei:
        _apply(synth)
    assert "HEAD moved since apply" in str(ei.value)


def test_changed_pin_commit_is_reverified_despite_base_cache(synth):
    _apply(synth)
    synth.write_pin(sha256(synth.sdist), commit_short="gfff0000")
    ap.clean(build=synth.build)
    with pytest.raises(DeepinferError, match="pin expects 'gfff0000'"):
        _apply(synth)
