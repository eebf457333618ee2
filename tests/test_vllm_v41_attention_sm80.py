"""The Ampere DeepSeek-V4.1 attention adapter on metadata made by vLLM's own builders (CPU,
SM80 mocked), with SWA bounded replay on.

tests/vllm_v41_attention_check.py derives each prefix-cache hit's replay start with vLLM's
scheduler (``Scheduler._mark_prefix_replay`` with the SWA spec's ``prefix_replay_tokens``),
hands it to the SWA builder as the V2 model state does (``ReplayAttnMetadata``), pads the
replayed tokens' compressed-group slots with the model state's kernel, builds the metadata
with the builders vLLM picks for the V4.1 Ampere layer (``DeepseekSparseSWAAmpereV41
MetadataBuilder``, V4.1's ``DeepseekV4FlashMLAMetadataBuilder`` for the kv-source layer's
compressed group; Triton interpreter) and runs ``DeepseekV41AmpereSparseAttention
.forward_mqa`` of the working copy's overlay on it. Every real token must match the float64
oracle (relative error <= 2e-2; the window of a replaying request starts no earlier than its
replay start), and the negative controls must be reported as failures: one metadata value
off, the replay start not handed to the builder, and V4's combine (``v41=False``) in the
adapter's prefill call.

What vLLM's metadata looks like here and the hand-made metadata of
tests/ampere_v41_adapter_check.py / layer_cases.prefill_metadata does not have: replay
starts at hit - 128 on a block-aligned hit, the first step after a hit starting its query
exactly at the replay start (gather_len == query_len), later chunks of the same prefill
keeping it (gather_len = query_len + min(prefix - replay_start, 127)), a short replaying
chunk classified as a decode (the replay start then bounds ``decode_swa_lens``: 1, 2, 3),
SWA pages of 32 tokens, compressed pages of 128 tokens (the Ampere backend's kernel block),
the replayed tokens' compressed-group slots padded to -1 and vLLM's area-bounded chunk plan.
Tree: the applied build/vllm-<version> (`make apply`), else skipped with the reason."""

import pytest

import vllm_builder_check as checks

TOL = 2e-2

#: Negative controls: the check must report these as failed (by the oracle, not a crash).
CONTROLS = ("control_gather_len", "control_swa_len", "control_token_to_req",
            "control_no_replay_start", "control_v4_combine_first_chunk",
            "control_v4_combine_later_chunk")
#: The controls that break the replay (no replay start, V4's combine): exactly the tokens
#: whose window reaches below their replay start fail.
REPLAY_CONTROLS = ("control_no_replay_start", "control_v4_combine_first_chunk",
                   "control_v4_combine_later_chunk")

#: case -> (num_decodes, num_decode_tokens, num_prefills, num_prefill_tokens) per step.
SPLITS = {
    "r0_decode_next1": [(3, 3, 0, 0)],
    "r2_decode_next2_padded": [(4, 8, 0, 0)],
    "r1_decode_next6_padded": [(4, 24, 0, 0)],
    "r2_decode_next6_variable": [(3, 15, 0, 0)],
    "r0_decode_next6_padded": [(3, 18, 0, 0)],
    "r0_prefill_replay": [(0, 0, 3, 280)],
    "r1_prefill_replay": [(0, 0, 3, 184)],
    "r2_prefill_replay": [(0, 0, 3, 280)],
    "r2_prefill_replay_chunks": [(0, 0, 2, 102), (0, 0, 3, 216)],
    "r0_prefill_replay_chunks": [(0, 0, 1, 40), (0, 0, 2, 146)],
    "r2_mixed_replay": [(2, 4, 3, 209)],
    "r0_mixed_replay_decode_split": [(2, 9, 2, 304)],
    "r2_mixed_replay_decode_split": [(2, 9, 2, 184)],
}


@pytest.fixture(scope="module")
def results():
    return checks.run_check("vllm_v41_attention_check.py", checks.applied_tree())


#: The random batches of vllm_v41_attention_check.fuzz_cases (names only: their split is
#: whatever vLLM's builders make of them).
FUZZ = [f"fuzz_{i:02d}" for i in range(10)]


def test_every_case_ran(results):
    assert sorted(results) == sorted(list(SPLITS) + list(CONTROLS) + FUZZ)


@pytest.mark.parametrize("case", FUZZ)
def test_random_batches_match_the_oracle(results, case):
    """Random compositions of decodes (0-7 draft tokens, short ones among them), prefills
    (fresh or after prefix-cache hits with bounded replay, with and without chunking) and
    padding requests, at V4.1's ratios 0, 1 and 2: every real token within TOL of the
    float64 oracle, padded rows finite, the builder given the replay starts. (Shared with
    the GPU variant.)"""
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
        assert step["md_replay_start"] == step["replay_start"], step


@pytest.mark.parametrize("case", sorted(SPLITS))
def test_every_token_matches_the_oracle(results, case):
    """Each real token's output against the float64 oracle, in vLLM's own split."""
    check_case(results, case)


@pytest.mark.parametrize("case", CONTROLS)
def test_the_check_can_fail(results, case):
    """One metadata value off, no replay start, or V4's combine: the oracle comparison
    (not a crash) reports the affected tokens."""
    check_control(results, case)


def check_case(results, case):
    """Every real token of every step within TOL of the oracle, vLLM's split of the step
    as :data:`SPLITS` says, padded rows finite, the builder given the model state's replay
    starts. (Shared with the GPU variant.)"""
    r = results[case]
    assert "error" not in r, r
    assert r["ok"] and r["max_rel_err"] <= TOL, r
    for step, want in zip(r["steps"], SPLITS[case], strict=True):
        assert not step["bad_tokens"] and step["tokens"] > 0, step
        got = (step["num_decodes"], step["num_decode_tokens"], step["num_prefills"],
               step["num_prefill_tokens"])
        assert got == want, step
        assert step["padded_rows_finite"], step
        # the builder got the model state's replay starts
        assert step["md_replay_start"] == step["replay_start"], step


def check_control(results, case):
    """A negative control reported failed by the oracle comparison, not by an error.
    (Shared with the GPU variant.)"""
    r = results[case]
    assert "error" not in r, r
    assert not r["ok"] and r["max_rel_err"] > TOL, r
    assert any(step["bad_tokens"] for step in r["steps"]), r


@pytest.mark.parametrize("case", REPLAY_CONTROLS)
def test_replay_controls_fail_on_the_replayed_window(results, case):
    """Without the replay start, or with V4's combine, exactly the tokens whose window
    reaches below their request's replay start go wrong."""
    for step in results[case]["steps"]:
        assert step["num_bad"] == step["bad_clamped"] == step["clamped_tokens"] > 0, step


def test_replay_starts_come_from_the_scheduler(results):
    """A block-aligned hit of 512 (256) tokens replays its last window: replay start 384
    (128), the first step's query starts there, so gather_len == query_len; a fresh
    prefill gathers query_len + min(prefix, 127) (here no prefix). A 384-token hit:
    replay start 256."""
    s = results["r2_prefill_replay"]["steps"][0]
    assert s["replay_start"] == [384, 128, 0]
    assert s["gather_lens"] == [140, 110, 30]
    assert s["clamped_tokens"] == 127 + 110
    s = results["r1_prefill_replay"]["steps"][0]
    assert s["replay_start"] == [128, 256, 0] and s["gather_lens"] == [110, 44, 30]


def test_later_chunks_keep_the_replay_start(results):
    """Chunked replaying prefills: gather_len = query_len + min(prefix - replay_start,
    127): 40 + 0, then 56 + 40 = 96 (V4's rule would give 56 + 127), 70 + 62 = 132."""
    s1, s2 = results["r2_prefill_replay_chunks"]["steps"]
    assert s1["replay_start"] == [384, 128] and s1["gather_lens"] == [40, 62]
    assert s2["replay_start"] == [384, 128, 0] and s2["gather_lens"] == [96, 132, 90]


def test_replayed_slots_are_padded_in_the_compressed_group_only(results):
    """The model state pads the replayed tokens' slots (positions [replay_start,
    replay_start + 128)) in the prefix-cacheable compressed group; the SWA group (bounded
    replay: not prefix-cacheable) keeps them, so its tokens stay valid."""
    s = results["r2_prefill_replay"]["steps"][0]
    assert s["slots_swa_padded"] == 0 and s["slots_c_padded"] == 128 + 110


def test_a_short_replaying_chunk_is_a_decode_bounded_by_its_replay_start(results):
    """next_n 6: a 3-token replaying chunk (positions 384..386, replay start 384) is in the
    decode split; the builder's decode SWA lengths stop at the replay start."""
    for case in ("r0_mixed_replay_decode_split", "r2_mixed_replay_decode_split"):
        s = results[case]["steps"][0]
        assert s["replay_start"] == [0, 384, 384, 128]
        assert s["swa_lens"] == [128] * 6 + [1, 2, 3]
    # PREFILL_CHUNK_SIZE 1: the SWA-only layer's prefills in two chunks (area bound 640)
    assert len(results["r0_mixed_replay_decode_split"]["steps"][0]["chunk_plan"]) == 2


def test_padded_tokens_get_zero_lengths(results):
    s = results["r1_decode_next6_padded"]["steps"][0]
    assert s["swa_lens"][12:] == [0] * 12 and s["swa_lens"][:12] == [128] * 12
    assert s["swa_indices_shape"] == [24, 1, 128] and s["block_size"] == 32


# ------------------------------------------------------------- FULL CUDA-graph decode

#: the check's GRAPH_CASES (capture + two replays each) and its control.
GRAPH_CASES = ("graph_r0_decode_next1", "graph_r1_decode_next6_padded",
               "graph_r2_decode_next2_padded")
GRAPH_CONTROLS = ("control_graph_no_rebuild",)


@pytest.fixture(scope="module")
def graph_results():
    return checks.run_check("vllm_v41_attention_check.py", checks.applied_tree(), "--graph")


def check_graph_case(results, case, *, graph: bool):
    """V4.1 decode captured as vLLM captures it (its dummy batch, no replay start,
    max_seq_len = max_model_len), replayed over rebuilt metadata: every real token of every
    step within TOL of the oracle. ``graph``: a real CUDA graph (GPU) or the CPU's
    emulation. (Shared with the GPU variant.)"""
    r = results[case]
    assert "error" not in r, r
    assert r["graph"] is graph and r["ok"] and r["max_rel_err"] <= TOL, r
    assert [s["step"] for s in r["steps"]] == ["capture (eager warm-up)"] + ["replay"] * 2, r
    for step in r["steps"]:
        assert not step["bad_tokens"] and step["tokens"] > 0 and step["padded_rows_finite"], step


def check_graph_control(results, case):
    """Replaying without rebuilding fails the oracle on the replayed step only."""
    r = results[case]
    assert "error" not in r, r
    capture, replay = r["steps"]
    assert not capture["bad_tokens"] and replay["bad_tokens"] and not r["ok"], r


#: The check's random graph cases (fuzz_graph_cases): 2-3 replays each.
GRAPH_FUZZ = tuple(f"fuzz_graph_{i:02d}" for i in range(4))


def test_graph_every_case_ran(graph_results):
    assert sorted(graph_results) == sorted(GRAPH_CASES + GRAPH_CONTROLS + GRAPH_FUZZ)


@pytest.mark.parametrize("case", GRAPH_FUZZ)
def test_graph_random_replays_match_the_oracle(graph_results, case):
    """Random graph sizes, draft counts and real-request counts per replay, the rest padding:
    every real token of every step within TOL of the oracle."""
    check_graph_fuzz_case(graph_results, case, graph=False)


def check_graph_fuzz_case(results, case, *, graph: bool):
    r = results[case]
    assert "error" not in r, r
    assert r["graph"] is graph and r["ok"] and r["max_rel_err"] <= TOL, r
    assert len(r["steps"]) >= 3, r  # the capture and 2-3 replays
    for step in r["steps"]:
        assert not step["bad_tokens"] and step["tokens"] > 0 and step["padded_rows_finite"], step


@pytest.mark.parametrize("case", GRAPH_CASES)
def test_graph_replays_match_the_oracle(graph_results, case):
    """CPU: the replay emulated; the GPU variant replays a real CUDA graph."""
    check_graph_case(graph_results, case, graph=False)


@pytest.mark.parametrize("case", GRAPH_CONTROLS)
def test_graph_replay_without_rebuild_fails(graph_results, case):
    check_graph_control(graph_results, case)
