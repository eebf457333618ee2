"""CPU checks of scripts/device/ab_summary.py (the table at the end of a same-run A/B)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("ab_summary", ROOT / "scripts/device/ab_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _log(path: Path, tag: str, recs: list[dict]) -> None:
    lines = ["=== noise before the JSON lines", "not json {"]
    lines += [json.dumps({**r, "tag": tag}) for r in recs]
    path.write_text("\n".join(lines) + "\n")


def test_medians_and_changes_against_base(tmp_path, capsys):
    pre = {"case": "prefill T=4096", "heads": 64}
    for rnd, (b, n, v) in enumerate([(100.0, 90.0, 120.0), (104.0, 92.0, 121.0), (102.0, 91.0, 119.0)], 1):
        _log(tmp_path / f"ab_base_{rnd}.log", "base", [{**pre, "us": b}])
        _log(tmp_path / f"ab_new_{rnd}.log", "new", [{**pre, "us": n}])
        _log(tmp_path / f"ab_pf_off_{rnd}.log", "pf_off", [{**pre, "us": v}])
    mod = _module()
    assert mod.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split("|")[3].strip(): [c.strip() for c in line.split("|")] for line in out[2:]}
    assert rows["base"][4] == "100 / 104 / 102" and rows["base"][5] == "102" and rows["base"][6] == ""
    assert rows["new"][5] == "91" and rows["new"][6] == "-10.8%"
    assert rows["pf_off"][5] == "120" and rows["pf_off"][6] == "+17.6%"  # a variant name with "_"
    assert [r.split("|")[3].strip() for r in out[2:]] == ["base", "new", "pf_off"]


def test_split_sweep_and_records_without_time(tmp_path, capsys):
    recs = [{"case": "decode B=1 rows=1", "heads": 8, "splits": s, "us": 7.0 + s} for s in (0, 1, 2)]
    recs.append({"case": "decode B=1 rows=1 kernels", "heads": 8, "kernels": [["k", 4.0]]})
    recs.append({"case": "decode B=128", "heads": 64, "splits": 1, "us": 58.0})
    _log(tmp_path / "ab_base_1.log", "base", recs)
    mod = _module()
    mod.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "splits 0" in out and "splits 1" not in out and "kernels" not in out
    assert "| decode B=128 | 64 | base | 58 |" in out  # not a sweep: no split in the name
    mod.main([str(tmp_path), "--all-splits"])
    assert "splits 2" in capsys.readouterr().out


def test_no_logs_is_an_error(tmp_path, capsys):
    assert _module().main([str(tmp_path)]) == 1
    assert "no A/B timings" in capsys.readouterr().err


def test_split_sweep_of_any_batch_keeps_splits_apart(tmp_path, capsys):
    recs = [{"case": "decode B=8 rows=1", "heads": 64, "splits": s, "us": 16.0 + s} for s in (0, 4, 10)]
    _log(tmp_path / "ab_base_1.log", "base", recs)
    mod = _module()
    mod.main([str(tmp_path), "--all-splits"])
    out = capsys.readouterr().out
    assert "| decode B=8 rows=1, splits 4 | 64 | base | 20 |" in out
    assert "| decode B=8 rows=1, splits 10 | 64 | base | 26 |" in out
