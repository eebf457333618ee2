"""The Ampere attention adapter on metadata made by vLLM's own builders (CPU, SM80 mocked).

tests/vllm_attention_check.py lays batches out as vLLM's model runner does (decodes
first, CUDA-graph padding requests and padded tokens, per-group block tables as wide as
max_model_len with stale ids past each request), builds the metadata with the builders
vLLM picks for the Ampere layer (``DeepseekSparseSWAAmpereMetadataBuilder`` for the SWA
group, the compressed group's ``DeepseekV4FlashMLAMetadataBuilder``; Triton interpreter)
and runs ``DeepseekV4AmpereSparseAttention.forward_mqa`` of the working copy's overlay on
it. Every real token must match the float64 oracle (relative error <= 2e-2), every case
must reach the adapter in the layout vLLM really produces, and the negative controls (one
metadata value off) must be reported as failures.

Layouts the hand-made metadata of tests/layer_cases.py and ampere_v41_adapter_check.py
does not have, and which are covered here: SWA decode indices [tokens, 1, width]
(3-D); C128A decode indices as a [tokens, 1, width] column slice of a buffer as wide as
max_model_len // 128 rounded up to 128, whose width follows the batch's longest context
from step to step; padded tokens counted in num_decode_tokens (zero lengths); DSpark's
non-causal block indices (width 192 for window 128 + 5 draft tokens); prefill gather
lengths and vLLM's area-bounded prefill chunk plan.
Tree: the applied build/vllm-<version> (`make apply`), else skipped with the reason."""

import pytest

import vllm_builder_check as checks

TOL = 2e-2

#: Negative controls: the check must report these as failed (by the oracle, not a crash).
CONTROLS = ("control_c128_len_short", "control_c4_token_to_req", "control_swa_len_short",
            "control_prefill_gather_len")

#: case -> (num_decodes, num_decode_tokens, num_prefills, num_prefill_tokens) per step.
SPLITS = {
    "c128_decode_two_widths": [(3, 3, 0, 0), (3, 3, 0, 0)],
    "c128_decode_next2_padded": [(4, 8, 0, 0)],
    "swa_decode_next2_padded": [(4, 8, 0, 0)],
    "swa_decode_next6_padded": [(4, 24, 0, 0)],
    "swa_decode_next6_variable": [(3, 15, 0, 0)],
    "c4_decode_next6_padded": [(3, 18, 0, 0)],
    "c4_decode_next2": [(3, 6, 0, 0)],
    "c128_decode_next6_variable": [(3, 15, 0, 0)],
    "dspark_noncausal_swa": [(4, 20, 0, 0)],
    "swa_prefill": [(0, 0, 2, 77)],
    "c4_prefill": [(0, 0, 2, 61)],
    "c128_prefill": [(0, 0, 2, 52)],
    "swa_mixed": [(2, 4, 2, 77)],
    "c4_mixed": [(2, 4, 3, 91)],
    "c128_mixed": [(2, 4, 2, 52)],
}


@pytest.fixture(scope="module")
def results():
    return checks.run_check("vllm_attention_check.py", checks.applied_tree())


#: The random batches of vllm_attention_check.fuzz_cases (names only: their split is whatever
#: vLLM's builders make of them).
FUZZ = [f"fuzz_{i:02d}" for i in range(10)]


def test_every_case_ran(results):
    assert sorted(results) == sorted(list(SPLITS) + list(CONTROLS) + FUZZ)


@pytest.mark.parametrize("case", FUZZ)
def test_random_batches_match_the_oracle(results, case):
    """Random compositions of decodes (0-7 draft tokens, short ones among them), prefills
    (with and without chunking) and padding requests, SWA-only, C4A and C128A: every real
    token within TOL of the float64 oracle, padded rows finite. (Shared with the GPU
    variant.)"""
    check_fuzz_case(results, case)


def check_fuzz_case(results, case):
    r = results[case]
    assert "error" not in r, r
    assert r["ok"] and r["max_rel_err"] <= TOL, r
    for step in r["steps"]:
        assert not step["bad_tokens"] and step["tokens"] > 0, step
        assert (step["num_decode_tokens"] + step["num_prefill_tokens"]
                == step["tokens"] + step["padded_tokens"]), step
        assert step["padded_rows_finite"], step


@pytest.mark.parametrize("case", sorted(SPLITS))
def test_every_token_matches_the_oracle(results, case):
    """Each real token's output against the float64 oracle, in vLLM's own split."""
    check_case(results, case)


@pytest.mark.parametrize("case", CONTROLS)
def test_the_check_can_fail(results, case):
    """One length or request of the builders' metadata off by one: the oracle
    comparison (not a crash) reports the affected token."""
    check_control(results, case)


def check_case(results, case):
    """Every real token of every step within TOL of the oracle, vLLM's split of the step
    as :data:`SPLITS` says, padded rows finite. (Shared with the GPU variant.)"""
    r = results[case]
    assert "error" not in r, r
    assert r["ok"] and r["max_rel_err"] <= TOL, r
    for step, want in zip(r["steps"], SPLITS[case], strict=True):
        assert not step["bad_tokens"] and step["tokens"] > 0, step
        got = (step["num_decodes"], step["num_decode_tokens"], step["num_prefills"],
               step["num_prefill_tokens"])
        assert got == want, step
        assert step["padded_rows_finite"], step


def check_control(results, case):
    """A negative control reported failed by the oracle comparison, not by an error.
    (Shared with the GPU variant.)"""
    r = results[case]
    assert "error" not in r, r
    assert not r["ok"] and r["max_rel_err"] > TOL, r
    assert any(step["bad_tokens"] for step in r["steps"]), r


def test_c128a_decode_is_a_column_slice_whose_width_follows_the_context(results):
    """``c128a_global_decode_topk_indices`` as vLLM builds it below SM120: a
    [tokens, 1, width] view of a [max_num_batched_tokens, 512]-wide buffer
    (max_model_len 65536), width next_pow2(max_seq_len // 128) (at least 128): 128 for
    a 1.5k context, 256 once a 16.9k context has 132 compressed entries; lengths
    (pos + 1) // 128."""
    s1, s2 = results["c128_decode_two_widths"]["steps"]
    assert s1["c128_decode_shape"] == [3, 1, 128] and s1["c128_decode_stride"][0] == 512
    assert s2["c128_decode_shape"] == [3, 1, 256] and s2["c128_decode_stride"][0] == 512
    assert s1["c128_lens"] == [700 // 128, 300 // 128, 1500 // 128]
    assert s2["c128_lens"] == [16900 // 128, 301 // 128, 1501 // 128]


def test_padded_tokens_get_zero_lengths(results):
    """FULL-graph padding: padded tokens are decode rows with zero SWA and C128A
    lengths (their slot is -1)."""
    s = results["c128_decode_next2_padded"]["steps"][0]
    assert s["c128_lens"][6:] == [0, 0] and min(s["c128_lens"][:6]) >= 1
    assert s["swa_lens"][6:] == [0, 0] and s["swa_lens"][:6] == [128, 128, 128, 128, 128, 128]
    assert results["swa_decode_next6_padded"]["steps"][0]["swa_lens"][12:] == [0] * 12


def test_swa_decode_indices_are_3d(results):
    """vLLM's decode SWA indices are [tokens, 1, window] (hand-made ones: [tokens, window])."""
    assert results["swa_decode_next6_padded"]["steps"][0]["swa_indices_shape"] == [24, 1, 128]


def test_dspark_block_is_non_causal(results):
    """DSpark draft step (causal=False): index rows 192 wide (128 + 5 rounded to 64),
    every token of a block sees the context window plus the whole block."""
    s = results["dspark_noncausal_swa"]["steps"][0]
    assert s["decode_swa_width"] == 192 and s["swa_indices_shape"] == [20, 1, 192]
    assert s["swa_lens"] == [133] * 5 + [70] * 5 + [133] * 5 + [0] * 5


def test_prefill_chunks_follow_vllms_plan(results):
    """The adapter takes vLLM's area-bounded chunk plan: with PREFILL_CHUNK_SIZE 1 the
    C4A prefills run as three chunks (later chunks at non-zero query offsets)."""
    assert len(results["c4_mixed"]["steps"][0]["chunk_plan"]) == 3



# ------------------------------------------------------------- FULL CUDA-graph decode

#: GRAPH_CASES of the check: steps per case (capture + replays) and whether it is the
#: negative control (replayed without rebuilding the metadata).
GRAPH_STEPS = {"graph_c128_decode": 4, "graph_c4_decode_next2_padded": 4,
               "graph_swa_decode_next6_padded": 3, "graph_dspark_noncausal": 3}
GRAPH_CONTROLS = ("control_graph_no_rebuild",)


@pytest.fixture(scope="module")
def graph_results():
    return checks.run_check("vllm_attention_check.py", checks.applied_tree(), "--graph")


def check_graph_case(results, case, *, graph: bool):
    """Captured with vLLM's dummy batch and capture metadata (max_seq_len = max_model_len),
    replayed over other seq_lens, real-request counts, pages, queries and top-k rows written
    into the same tensors: every real token of every step within TOL of the oracle.
    ``graph``: a real CUDA graph (GPU) or the CPU's emulation. (Shared with the GPU
    variant.)
    """
    r = results[case]
    assert "error" not in r, r
    assert r["graph"] is graph, r
    assert r["ok"] and r["max_rel_err"] <= TOL, r
    assert len(r["steps"]) == GRAPH_STEPS[case], r
    for step in r["steps"]:
        assert not step["bad_tokens"] and step["tokens"] > 0 and step["padded_rows_finite"], step


def check_graph_control(results, case):
    """Replaying without rebuilding the metadata must fail the oracle on the replayed step
    (so the passing cases depend on vLLM's rebuild into the persistent buffers)."""
    r = results[case]
    assert "error" not in r, r
    capture, replay = r["steps"]
    assert not capture["bad_tokens"] and replay["bad_tokens"] and not r["ok"], r


def check_graph_c128_widths(results):
    """The capture's C128A top-k is as wide as max_model_len allows (512 columns at 65,536);
    the replays' builds are narrower (256, 128, 128) in the same 512-wide rows: the captured
    kernels must bound their reads by the lengths, not the width."""
    widths = [s["c128_decode_shape"] for s in results["graph_c128_decode"]["steps"]]
    assert widths == [[4, 1, 512], [4, 1, 256], [4, 1, 128], [4, 1, 128]], widths


#: The check's random graph cases (fuzz_graph_cases): 2-3 replays each.
GRAPH_FUZZ = [f"fuzz_graph_{i:02d}" for i in range(4)]


def test_graph_every_case_ran(graph_results):
    assert sorted(graph_results) == sorted(list(GRAPH_STEPS) + list(GRAPH_CONTROLS) + GRAPH_FUZZ)


@pytest.mark.parametrize("case", GRAPH_FUZZ)
def test_graph_random_replays_match_the_oracle(graph_results, case):
    """Random graph sizes, draft counts and real-request counts per replay, the rest padding:
    every step's tokens equal to the oracle."""
    check_graph_fuzz_case(graph_results, case, graph=False)


def check_graph_fuzz_case(results, case, *, graph: bool):
    r = results[case]
    assert "error" not in r, r
    assert r["graph"] is graph and r["ok"], r
    assert len(r["steps"]) >= 3 and r["max_rel_err"] <= TOL, r  # the capture, 2-3 replays
    for step in r["steps"]:
        assert not step["bad_tokens"] and step["tokens"] > 0 and step["padded_rows_finite"], step


@pytest.mark.parametrize("case", sorted(GRAPH_STEPS))
def test_graph_replays_match_the_oracle(graph_results, case):
    """CPU: the replay emulated (the captured step's metadata objects over rewritten
    buffers); the GPU variant replays a real CUDA graph."""
    check_graph_case(graph_results, case, graph=False)


@pytest.mark.parametrize("case", GRAPH_CONTROLS)
def test_graph_replay_without_rebuild_fails(graph_results, case):
    check_graph_control(graph_results, case)


def test_graph_c128a_capture_is_widest(graph_results):
    check_graph_c128_widths(graph_results)
