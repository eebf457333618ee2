"""The vLLM-facing Ampere adapters against a vLLM source tree (CPU): padded
heads hit a ``_C`` instantiation, the backend reports capability 8 only, the
SWA builder never allocates FlashMLA's tile scheduler, ``wo_a`` is captured
(dequantised) before a repack destroys it, the o_proj matches float64, and
the compressor store writes the same bytes as the reference (Triton
interpreter).  Runs in a subprocess with the tree first on sys.path; skips
with the reason when no tree or vLLM's Python dependencies are missing.
Tree: $DEEPINFER_VLLM_TREE, else the applied build/vllm-0.33.0; interpreter:
$DEEPINFER_VLLM_PYTHON, else this one."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tree():
    for cand in (os.environ.get("DEEPINFER_VLLM_TREE"), ROOT / "build" / "vllm-0.33.0"):
        if cand and (pathlib.Path(cand) / "vllm" / "__init__.py").is_file():
            return pathlib.Path(cand)
    return None


@pytest.fixture(scope="module")
def results():
    pytest.importorskip("triton", reason="triton is not installed (make venv-torch)")
    tree = _tree()
    if tree is None:
        pytest.skip("no vLLM tree: set DEEPINFER_VLLM_TREE or run `make apply`")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=str(tree))
    python = os.environ.get("DEEPINFER_VLLM_PYTHON", sys.executable)
    proc = subprocess.run([python, str(ROOT / "tests" / "ampere_adapters_check.py")],
                          capture_output=True, text=True, env=env, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    m = re.search(r"No module named '([^']+)'", proc.stderr)
    if not lines and m and not m.group(1).startswith(("vllm", "deepinfer_sm80")):
        pytest.skip(f"vLLM's Python dependency '{m.group(1)}' is not installed for {python} "
                    "(set DEEPINFER_VLLM_PYTHON to an interpreter that has them)")
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_padded_heads_hit_c_instantiations(results):
    assert results["padded_heads"] == {"1": 8, "8": 8, "9": 16, "16": 16, "33": 64, "64": 64,
                                       "65": 128, "128": 128}
    assert results["padded_129_raises"]


def test_backend_reports_capability_8_only(results):
    assert results["backend_caps"] == {"8.0": True, "8.6": True, "9.0": False, "10.0": False,
                                       "12.0": False}


def test_swa_builder_has_no_tile_scheduler(results):
    assert results["swa_builder"] == "DeepseekSparseSWAAmpereMetadataBuilder"
    assert results["tile_scheduler_all_none"]
    assert {"swaonly", "c4a", "c128a"} <= set(results["tile_scheduler_keys"])
    assert results["indexer_cls"] == "DeepseekV4AmpereIndexer"


def test_wo_a_captured_before_repack(results):
    assert results["wo_a_captured_exact"] and results["repacked_weight_freed"]
    assert results["o_proj_rel_err"] <= 2e-2


@pytest.mark.parametrize("ratio", [4, 128])
def test_compressor_store_bytes(results, ratio):
    r = results[f"compressor_c{ratio}"]
    assert r["codes"] > 0 and r["untouched_equal"]
    assert r["codes_exact"] == 1.0 and r["scales_exact"] == 1.0 and r["rope_exact"] == 1.0


def test_indexer_adapter_decode_sets(results):
    assert results["indexer_decode_adapter"]
