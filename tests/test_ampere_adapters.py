"""The vLLM-facing Ampere adapters against a vLLM source tree (CPU): padded
heads hit a ``_C`` instantiation, the backend reports capability 8 only, the
SWA builder never allocates FlashMLA's tile scheduler, ``wo_a`` is captured
(dequantised) before a repack destroys it, the o_proj matches float64, and
the compressor store writes the same bytes as the reference (Triton
interpreter).  Runs in a subprocess with the tree first on sys.path; skips
with the reason when no tree or vLLM's Python dependencies are missing.
Tree: $DEEPINFER_VLLM_TREE, else the applied build/vllm-<harness.VLLM_VERSION>; interpreter:
$DEEPINFER_VLLM_PYTHON, else this one."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import vllm_cpu_harness as harness

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tree():
    version = harness.VLLM_VERSION
    for cand in (os.environ.get("DEEPINFER_VLLM_TREE"), ROOT / "build" / f"vllm-{version}"):
        if cand and (pathlib.Path(cand) / "vllm" / "__init__.py").is_file():
            return pathlib.Path(cand)
    return None


def _run_check(script: str) -> dict:
    """Run tests/<script> against the tree in a subprocess; its RESULT line as a dict."""
    pytest.importorskip("triton", reason="triton is not installed (make venv-torch)")
    tree = _tree()
    if tree is None:
        pytest.skip("no vLLM tree: set DEEPINFER_VLLM_TREE or run `make apply`")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=str(tree))
    python = os.environ.get("DEEPINFER_VLLM_PYTHON", sys.executable)
    proc = subprocess.run([python, str(ROOT / "tests" / script)],
                          capture_output=True, text=True, env=env, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    m = re.search(r"No module named '([^']+)'", proc.stderr)
    if not lines and m and not m.group(1).startswith(("vllm", "deepinfer_sm80")):
        pytest.skip(f"vLLM's Python dependency '{m.group(1)}' is not installed for {python} "
                    "(set DEEPINFER_VLLM_PYTHON to an interpreter that has them)")
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def results():
    return _run_check("ampere_adapters_check.py")


@pytest.fixture(scope="module")
def v41_results():
    return _run_check("ampere_v41_adapter_check.py")


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


# ------------------------------------------------------------------- DeepSeek-V4.1


def test_v41_backend_swa_builder_and_heads(v41_results):
    r = v41_results
    assert r["backend_name"] == "AMPERE_SPARSE_DSV41"
    assert r["backend_caps"] == {"8.0": True, "8.6": True, "9.0": False, "10.0": False,
                                 "12.0": False}
    assert r["tile_scheduler_all_none"] and {"swaonly", "c1a", "c2a"} <= set(
        r["tile_scheduler_keys"])
    assert r["padded_heads"] == {"8": 8, "16": 16, "32": 32, "64": 64}
    assert r["abstract_methods"] == []  # instantiable: every abstract hook implemented


@pytest.mark.parametrize("step", ["decode", "prefill", "prefill_replay", "mixed"])
@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_v41_forward_mqa_matches_oracle(v41_results, ratio, step):
    """The adapter's forward_mqa with vLLM-shaped V4.1 metadata (compressed cache and
    block table from the kv-source layer's prefix, top-k from the shared buffer), portable
    ops on the CPU, against the float64 oracle. prefill_replay: after prefix-cache hits
    (gather lengths from the requests' replay starts) with failed top-k candidates: V4.1's
    combine, which the adapter must ask for. mixed: decode requests first, then prefill
    requests in one batch (the adapter's slices at the split)."""
    r = v41_results[f"{step}_ratio{ratio}"]
    assert r["tokens"] > 0 and r["max_rel_err"] <= 2e-2, r
    assert (r["compressed_attended"] > 0) == (ratio > 0), r


def test_v41_indexer_is_the_ampere_scorer_with_candidates(v41_results):
    assert v41_results["indexer_cls"] == "DeepseekV41AmpereIndexer"
    assert v41_results["indexer_attn_cls"] == "AmpereSparseAttnIndexer"
    assert v41_results["indexer_candidates_write"]["ok"]
    assert v41_results["indexer_candidates_mask"]["ok"]


@pytest.mark.parametrize("mode", ["write", "mask"])
def test_indexer_regroups_a_flattened_uniform_decode(v41_results, mode):
    """Below SM90 vLLM's indexer metadata flattens a decode of next_n > 2 tokens per request
    into one row per token (per-token lengths, the block table repeated per token). A uniform
    batch goes to the scorer as [requests, next_n] again (each request's K read once for its
    rows; 11-60% of decode_topk on the H200, docs/indexer-scorer.md), a mixed one row per
    token; both equal the float64 oracle (3 requests x 2 rows here)."""
    flat = v41_results[f"indexer_candidates_{mode}_flattened"]
    mixed = v41_results[f"indexer_candidates_{mode}_flattened_mixed"]
    assert flat["ok"] and flat["rows_shape"] == [[3, 2]], flat
    assert mixed["ok"] and mixed["rows_shape"] == [[6, 1]], mixed


def test_indexer_profile_run_reserves_its_scratch(results):
    """vLLM sizes the KV cache from the profile run's peak: the Ampere indexer's profile branch
    must allocate what its steps later take (upstream allocates its logits budget there).
    The dummy covers a prefill of the profile's tokens and an eager decode of
    ``max_decode_rows`` rows (all tokens when unknown); V4.1's candidate-source layer needs
    more than V4's or a masking layer's."""
    got = results["indexer_profile"]
    for key, r in got.items():
        assert r["returns_buffer"], key
        assert r["workspace"] == [[[5 * 8 * 65536 * 4, 128], [5 * 8 * 65536 * 4, 4]]], key
        assert len(r["dummies"]) == 1, (key, r["dummies"])
        n = r["dummies"][0]
        assert n >= r["prefill_bound"] and n >= r["decode_bound"], (key, r)
        # no more than the larger step and a padded decode's packed copies (q codes and
        # weights, top-k and candidate rows): not a sum over layers or steps
        rows = int(key.split("/")[1]) or 8192
        k = 2048 if not key.startswith("None") else 0
        packed = rows * (512 * 4 + 64 * (128 + 4) + 2 * k * 4)
        assert n <= max(r["prefill_bound"], r["decode_bound"]) + packed, (key, r)
    # candidate keys, one per (row, 8-position block) of 262,144 positions: 256 KB a row, in
    # decode chunks of 256 requests (CANDIDATE_DECODE_BUDGET), so not 402 MB at 1,536 rows
    for rows in ("1536", "0"):
        write, mask, v4 = (got[f"{c}/{rows}"]["dummies"][0] for c in ("write", "mask", "None"))
        assert mask >= v4 and write >= 256 * 32768 * 8, (rows, write, mask, v4)
        # (at 8,192 decode rows a masking layer's running best outgrows one chunk's keys)
        assert rows == "0" or write > mask, (rows, write, mask, v4)
    # V4.1's source layer at 1,536 decode rows reserves less than upstream's logits dummy
    # (VLLM_SPARSE_INDEXER_MAX_LOGITS_MB, 512 MB by default)
    assert got["write/1536"]["dummies"][0] < 512 << 20
    # a step's decode rows bound the eager decode: fewer rows, less scratch
    assert got["write/1536"]["dummies"][0] < got["write/0"]["dummies"][0]
    assert got["None/1536"]["dummies"][0] <= got["None/0"]["dummies"][0]
