"""Rebase of a synthetic patch set: clean, and stopped at a conflict then continued by
following the printed instructions."""
from __future__ import annotations

import hashlib
import re
import subprocess

from deepinfer import apply as apply_mod, export as export_mod, rebase, source
from deepinfer.patchset import load_patchset, read_manifest
from test_drift_synth import BASE_VERSION, edit_line, numbered

A, B = numbered("a"), numbered("b")


def _project(synth):
    p = synth({"vllm/a.py": A, "vllm/b.py": B, "vllm/repl.py": "X = 1\n"})
    (p.patch_dir / "series").write_text("")
    p.add_patch("first: change a", {"vllm/a.py": edit_line(A, 10, "FIRST")})
    p.add_patch("second: change b", {"vllm/b.py": edit_line(B, 20, "SECOND")})
    p.add_overlay("vllm/repl.py", "X = 2\n")
    p.add_overlay("deepinfer_sm80/new.py", "Y = 1\n")
    return p


def test_clean_rebase_writes_a_set_that_applies(synth, capsys, monkeypatch):
    p = _project(synth)
    tgt = p.add_target("1.1.0", {"vllm/a.py": "top\n" + A, "vllm/repl.py": "X = 1\nZ = 0\n"})
    assert rebase.main(["--to", "1.1.0", "--vllm", BASE_VERSION]) == 0
    out = capsys.readouterr()
    new = p.root / "patches" / "vllm-1.1.0"
    ps = load_patchset("1.1.0", p.root)
    assert ps.series == ["0001-first-change-a.patch", "0002-second-change-b.patch"]
    assert ps.pin.sdist_sha256 == hashlib.sha256(tgt.read_bytes()).hexdigest()
    assert ps.pin.commit_short == "gdef5678"
    # the offset shows in the new patch; the untouched patch is byte-identical
    assert "@@ -7,7 +7,7 @@" in (p.patch_dir / ps.series[0]).read_text()
    assert "@@ -8,7 +8,7 @@" in (new / ps.series[0]).read_text()
    assert (new / ps.series[1]).read_bytes() == (p.patch_dir / ps.series[1]).read_bytes()
    man = read_manifest(new / "overlay.toml").by_path()
    repl_blob = subprocess.run(["git", "hash-object", "--stdin"], input=b"X = 1\nZ = 0\n",
                               capture_output=True).stdout.decode().strip()
    assert man["vllm/repl.py"].kind == "replace" and man["vllm/repl.py"].upstream_blob == repl_blob
    assert man["deepinfer_sm80/new.py"].kind == "new"
    text = out.out + out.err
    assert "same change" in text and "changed" in text  # range-diff summary
    assert "upstream changed it" in text  # overlay replacement drifted
    # never overwrite without force
    assert rebase.main(["--to", "1.1.0", "--vllm", BASE_VERSION]) != 0
    assert "already exists" in capsys.readouterr().err
    # the new set applies, and export round-trips byte for byte
    res = apply_mod.apply("1.1.0", source.SourceSpec("sdist"), root=p.root)
    assert res.changed
    before = {f.name: f.read_bytes() for f in new.iterdir()}
    export_mod.export("1.1.0", root=p.root)
    assert {f.name: f.read_bytes() for f in new.iterdir()} == before


def test_conflict_stop_then_continue(synth, capsys):
    p = _project(synth)
    p.add_target("1.2.0", {"vllm/b.py": edit_line(B, 20, "UPSTREAM 20")})
    rc = rebase.main(["--to", "1.2.0", "--vllm", BASE_VERSION])
    assert rc == rebase.EXIT_CONFLICT
    out = capsys.readouterr().out
    assert "0002-second-change-b.patch" in out and "vllm/b.py" in out
    assert "hunk #1" in out and "UPSTREAM 20" in out
    assert "make rebase-continue TO=1.2.0" in out
    work = p.root / "build" / "rebase-1.2.0"
    # continuing before resolving is refused with the file named
    assert rebase.main(["--to", "1.2.0", "--continue"]) != 0
    assert "vllm/b.py" in capsys.readouterr().err
    # follow the printed instructions: edit, git add, make rebase-continue
    f = work / "vllm" / "b.py"
    text = f.read_text()
    resolved = re.sub(r"<<<<<<< [^\n]*\n.*?>>>>>>> [^\n]*\n", "UPSTREAM 20 + SECOND\n", text,
                      flags=re.S)
    f.write_text(resolved)
    m = re.search(r"git -C (\S+) add", out)
    subprocess.run(["git", "-C", str(work), "add", "vllm/b.py"], check=True)
    assert m is not None
    assert rebase.main(["--to", "1.2.0", "--continue"]) == 0
    done = capsys.readouterr().out
    assert "changed" in done and "+UPSTREAM 20 + SECOND" in done  # range-diff body shown
    ps = load_patchset("1.2.0", p.root)
    assert len(ps.series) == 2
    assert "+UPSTREAM 20 + SECOND" in (ps.directory / ps.series[1]).read_text()
    assert apply_mod.apply("1.2.0", source.SourceSpec("sdist"), root=p.root).changed


def test_patch_already_upstream_is_dropped(synth, capsys):
    p = _project(synth)
    p.add_target("1.3.0", {"vllm/a.py": edit_line(A, 10, "FIRST")})
    assert rebase.main(["--to", "1.3.0", "--vllm", BASE_VERSION]) == 0
    ps = load_patchset("1.3.0", p.root)
    assert ps.series == ["0002-second-change-b.patch"]
    assert "dropped" in capsys.readouterr().err
