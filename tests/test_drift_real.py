"""Real data: the vLLM 0.33.0 patch set against the 0.32.0 and 0.31.0 sdists (network on
first use, cached afterwards).

The statuses asserted here were checked by hand against the unpacked sdists and against
git itself (`git apply --check`, then `git am --3way` on a repository holding the 0.33.0
files + the series, and the 0.32.0 / 0.31.0 files):

- `_select_dsv4_attn_cls` is at line 537 of 0.33.0's nvidia/model.py, 1013 in 0.32.0 and
  1146 in 0.31.0: its hunks are exact matches moved by +476 / +609 lines;
- cache_utils.py's import hunk: 0.32.0 lacks the `get_compress_ratios` import line that
  the hunk's leading context has, so it applies only with 2 context lines ignored (git:
  needs 3-way);
- sparse_attn_indexer.py: upstream 0.32.0 inserted `self._cp_kv_cache_interleave_size`
  right above the `has_deep_gemm()` check the patch rewrites, and its import block lacks
  the `mqa_logits_*` names next to the removed `has_deep_gemm,` (git: CONFLICT);
- attention.py: 0.32.0 has the indexer warm-up inline under `enable_jit_warmup` where
  0.33.0 calls `_register_q_quant_warmup()` (git: CONFLICT);
- indexer.py (0.31.0): the `has_deep_gemm()` block of the decode metadata path does not
  exist there at all (git: CONFLICT), so upstream's side of the conflict is empty.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from deepinfer import drift, rebase, source
from deepinfer.patchset import load_patchset

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.network


def _have(version: str) -> None:
    if not (source.cache_dir() / f"vllm-{version}.tar.gz").is_file():
        try:
            from deepinfer import upstream
            upstream.release_pin(version, load_patchset("0.33.0", ROOT).pin)
        except Exception as exc:
            pytest.skip(f"vLLM {version} sdist not cached and the index is unreachable: {exc}")


@pytest.fixture(scope="module")
def reports():
    out = {}
    for v in ("0.32.0", "0.31.0"):
        _have(v)
        out[v] = drift.build_report("0.33.0", v, ROOT)
    return out


def hunks(report: dict, path: str) -> list[dict]:
    found = [h for p in report["patches"] for f in p["files"] if f["path"] == path
             for h in f["hunks"]]
    assert found, f"no hunk of the series touches {path} any more; update this test"
    return found


def by_section(report: dict, path: str, text: str) -> list[dict]:
    hs = [h for h in hunks(report, path) if text in h["header"]]
    assert hs, f"no hunk of {path} with {text!r} in its header; update this test"
    return hs


def test_moved_function_is_an_offset(reports):
    for v, delta in (("0.32.0", 476), ("0.31.0", 609)):
        for h in by_section(reports[v], "vllm/models/deepseek_v4/nvidia/model.py",
                            "_select_dsv4_attn_cls"):
            assert (h["status"], h["offset"]) == ("offset", delta), (v, h)


def test_missing_context_line_is_fuzz(reports):
    for v in ("0.32.0", "0.31.0"):
        (h,) = by_section(reports[v], "vllm/models/deepseek_v4/common/ops/cache_utils.py",
                          "jit_warmup_triton_helper")
        assert (h["status"], h["fuzz"]) == ("fuzz", 2), (v, h)


def test_conflicts_name_what_upstream_has(reports):
    r = reports["0.32.0"]
    path = "vllm/model_executor/layers/sparse_attn_indexer.py"
    (imp,) = by_section(r, path, "from vllm.triton_utils import")
    assert imp["status"] == "conflict" and imp["upstream_now"] == ["    has_deep_gemm,"]
    (init,) = by_section(r, path, "class SparseAttnIndexer")
    assert init["status"] == "conflict"
    assert "        self._cp_kv_cache_interleave_size: int | None = None" in init["upstream_now"]
    warm = [h for h in by_section(r, "vllm/models/deepseek_v4/attention.py",
                                  "class DeepseekV4Indexer") if h["status"] == "conflict"]
    assert len(warm) == 1 and warm[0]["target_line"] == 1055
    assert warm[0]["upstream_now"] == ["            from vllm.utils.import_utils import has_cutedsl"]
    by_name = {p["name"]: p["status"] for p in r["patches"]}
    assert "conflict" in by_name.values()
    assert r["summary"]["clean"] is False


def test_removed_block_conflict_says_so(reports):
    h = [h for h in by_section(reports["0.31.0"], "vllm/v1/attention/backends/mla/indexer.py",
                               "DeepseekV32IndexerMetadataBuilder") if h["status"] == "conflict"]
    assert len(h) == 1 and h[0]["upstream_now"][0].startswith("(nothing: upstream no longer")


def test_overlay_checked_against_both(reports):
    for v in ("0.32.0", "0.31.0"):
        paths = {o["path"] for o in reports[v]["overlay"]}
        assert any(p.startswith("vllm/") and p.endswith(".py") for p in paths)
        assert all(o["status"] in ("ok", "vanished-symbol", "collision", "upstream-changed",
                                   "upstream-missing") for o in reports[v]["overlay"])


def test_rebase_to_0_32_0_stops_at_a_named_conflict(tmp_path, monkeypatch, capsys):
    """`make rebase TO=0.32.0` on a copy of the repository: it stops at the first
    conflicting patch with the file, hunk, upstream's text and the next steps."""
    _have("0.32.0")
    root = tmp_path / "root"
    for sub in ("patches", "overlay", "csrc"):
        if (ROOT / sub).is_dir():
            shutil.copytree(ROOT / sub, root / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tools").mkdir()
    monkeypatch.setenv("DEEPINFER_ROOT", str(root))
    monkeypatch.delenv("DEEPINFER_BUILD_DIR", raising=False)
    ps = load_patchset("0.33.0", ROOT)
    expected = None
    for p in drift.build_report("0.33.0", "0.32.0", ROOT)["patches"]:
        if p["status"] == "conflict":
            expected = p
            break
    assert expected is not None
    rc = rebase.start("0.32.0", "0.33.0", root=root)
    out = capsys.readouterr().out
    assert rc == rebase.EXIT_CONFLICT
    idx = ps.series.index(expected["name"]) + 1
    assert f"patch {expected['name']} ({idx} of {len(ps.series)})" in out
    bad = [f["path"] for f in expected["files"] if f["status"] == "conflict"]
    assert any(f"file {b}" in out for b in bad)
    assert "make rebase-continue TO=0.32.0" in out and "has there now" in out
    assert not (root / "patches" / "vllm-0.32.0").exists()
