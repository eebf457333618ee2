"""The Ampere indexer adapter on metadata made by vLLM's own builder (CPU, SM80 mocked).

``DeepseekV32IndexerMetadataBuilder.build`` (v1/attention/backends/mla/indexer.py) lays a
decode step out differently below SM90: without DeepGEMM it flattens next_n > 2 into one
row per token (per-token lengths as a [tokens, 1] column, the block table repeated per
token), keeps next_n <= 2 native ([B, next_n] lengths) and pads CUDA-graph padding
requests through ``pack_seq``. tests/vllm_indexer_decode_check.py builds each layout with
vLLM's code (Triton interpreter) and runs the adapter's ``_forward`` on it; here every
token's top-k (V4.1: candidate rows, or the top-k masked to them) must equal the float64
oracle, and each layout must reach the scorer in the shape it is fastest in: a uniform
flattened decode regrouped to [requests, next_n] (each request's K read once for its rows),
anything else as vLLM laid it out. Prefills too: vLLM's prefill chunks (query slices of one
long request that reuse its gathered K, several requests in separate chunks, decodes then
prefills) through the adapter's K gather (a torch stand-in for vLLM's compiled gather, whose
layout tests/gpu/test_vllm_c_indexer_k_gather_sm80.py checks on the GPU) and prefill_topk.

Until this test, the regrouping was checked only on hand-made metadata with 1-D lengths;
vLLM's are [tokens, 1], so the regrouping never ran in vLLM (found 2026-12-03).
Tree: the applied build/vllm-<version> (`make apply`), else skipped with the reason."""

import pytest

import vllm_builder_check as checks

#: case -> ((rows, next_n) of the single decode_topk call or None, or a list of the calls'
#: shapes where the call runs in request chunks (each chunk a call of its own), whether vLLM
#: flattened the decode, the row counts of the prefill_topk calls: one per prefill chunk).
EXPECTED = {
    "flat_uniform_c4": ([3, 6], True, []),
    "flat_uniform_c4_k7": ([2, 8], True, []),
    "v41_flat_uniform_c1_mask_k7": ([3, 8], True, []),
    "flat_variable_c4": ([15, 1], True, []),
    "flat_padded_c4": ([12, 1], True, []),
    "native2_c4": ([3, 2], False, []),
    "native2_padded_c4": ([3, 2], False, []),
    "plain_c4": ([4, 1], False, []),
    "draft_update_c4": ([4, 1], False, []),
    "v41_flat_uniform_c2_write": ([4, 4], True, []),
    "v41_flat_uniform_c1_mask": ([3, 4], True, []),
    "v41_flat_variable_c2_mask": ([10, 1], True, []),
    "prefill_c4": (None, False, [340]),
    # 1 MB of logits: one request's 400 queries x 1,000 compressed positions in two query
    # slices (the second reuses the first's gathered K); two requests in two chunks
    "prefill_query_split_c4": (None, False, [262, 138]),
    "prefill_two_chunks_c4": (None, False, [200, 300]),
    "mixed_c4": ([2, 2], False, [104]),
    "v41_mixed_c2_mask": ([2, 2], False, [30]),
    "v41_prefill_c1_write": (None, False, [117]),
    # a 1-token request first: the uniform split makes the next_n 2 requests prefills
    "short_first_mixed_c4": ([1, 1], False, [42]),
    "v41_short_first_mixed_c2_write": ([1, 1], False, [32]),
    "v41_short_first_mixed_c2_mask": ([1, 1], False, [32]),
    "v41_native2_padded_c2_write": ([3, 2], False, []),
    "v41_native2_padded_c1_mask": ([3, 2], False, []),
    # the candidate source one request a chunk: the adapter's call, then one per request
    "v41_flat_uniform_c2_write_chunks": ([[4, 4]] + [[1, 4]] * 4, True, []),
    "v41_native2_padded_c2_write_chunks": ([[3, 2]] + [[1, 2]] * 3, False, []),
    # the split without require_uniform: decode lengths [1, 2] as [2, 2] padded rows
    "nonuniform_mixed_c4": ([2, 2], False, [40]),
    "v41_nonuniform_mixed_c2_write": ([2, 2], False, [30]),
    "v41_nonuniform_mixed_c2_mask": ([2, 2], False, [30]),
}


@pytest.fixture(scope="module")
def results():
    return checks.run_check("vllm_indexer_decode_check.py", checks.applied_tree())


#: The random batches of vllm_indexer_decode_check.fuzz_cases (names only: their shapes are
#: whatever vLLM's builder makes of them).
FUZZ = [f"fuzz_{i:02d}" for i in range(12)]


def test_every_case_ran(results):
    assert sorted(results) == sorted(list(EXPECTED) + FUZZ)


@pytest.mark.parametrize("case", FUZZ)
def test_random_batches_match_the_oracle(results, case):
    """Random compositions of decodes (0-7 draft tokens, short ones among them), prefills
    (vLLM's chunks and query slices) and padding requests, V4 and V4.1: every token's top-k
    (or candidate row) equal to the float64 oracle, every token written, rows past the batch
    -1. (Shared with the GPU variant.)"""
    check_fuzz_case(results, case)


def check_fuzz_case(results, case):
    r = results[case]
    assert "error" not in r, r
    b = r["builder"]
    assert r["ok"] and not r["bad_rows"], r
    assert r["rows"] == b["num_decode_tokens"] + sum(r["prefill_calls"]) > 0, r


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_topk_matches_oracle_in_the_fast_shape(results, case):
    check_case(results, case)


def check_case(results, case):
    """Every token's top-k (or candidate row) equal to the oracle, every token written, and
    the scorer called in the expected shapes. (Shared with the GPU variant.)"""
    r = results[case]
    assert "error" not in r, r
    shape, flattened, prefill_rows = EXPECTED[case]
    b = r["builder"]
    assert b["use_flattening"] == flattened, b
    assert r["ok"] and not r["bad_rows"], r
    assert r["rows"] == b["num_decode_tokens"] + sum(prefill_rows) > 0, r
    calls = shape if shape and isinstance(shape[0], list) else ([shape] if shape else [])
    assert r["calls"] == calls, r
    assert r["prefill_calls"] == prefill_rows, r


def test_a_query_split_prefill_gathers_once(results):
    """vLLM's second query slice of one request reuses the first slice's gathered K
    (``skip_kv_gather``); separate requests gather each."""
    assert results["prefill_query_split_c4"]["builder"]["prefill_chunks"] == [
        [0, 262, False], [262, 400, True]]
    assert results["prefill_two_chunks_c4"]["builder"]["prefill_chunks"] == [
        [0, 200, False], [200, 500, False]]
    assert results["mixed_c4"]["builder"]["prefill_chunks"] == [[4, 108, False]]


def test_the_flattened_lengths_are_a_column(results):
    """The layout the regrouping must recognise, as vLLM builds it: per-token lengths
    [tokens, 1], one block-table row per token, marked uniform."""
    b = results["flat_uniform_c4"]["builder"]
    assert b["seq_lens_shape"] == [18, 1] and b["block_table_shape"][0] == 18
    assert b["decode_is_uniform"] and not b["requires_padding"]
    assert results["flat_variable_c4"]["builder"]["decode_is_uniform"] is False
    assert results["native2_padded_c4"]["builder"]["requires_padding"] is True


def test_below_sm90_a_decode_batch_is_uniform_or_padded_at_its_end(results):
    """vLLM's split keeps a decode batch uniform below SM90 (no flattening for next_n <= 2,
    no varlen kernel): a 1-token request ahead of 2-token ones leaves them to the prefill, so
    the padded path sees only CUDA-graph padding requests at the end."""
    b = results["short_first_mixed_c4"]["builder"]
    assert (b["num_decodes"], b["num_decode_tokens"], b["requires_padding"]) == (1, 1, False)
    b = results["v41_native2_padded_c2_write"]["builder"]
    assert (b["num_decodes"], b["num_decode_tokens"], b["requires_padding"]) == (3, 4, True)


def test_a_padded_decode_keeps_token_rows_and_spares_the_prefill_rows(results):
    """Decode lengths [1, 2] padded to [2, 2] rows, then a prefill whose first token is row 3
    (what vLLM's builder makes with ``require_uniform=False``): every decode and prefill
    token's top-k, and V4.1's candidate rows (written by the source, read by a masking
    layer), are token t's in row t. Upstream's decode slices both buffers in the packed
    order, over the prefill's row 3; the adapter's packed temporaries avoid that (without
    them this check fails on rows 1-3)."""
    for case in ("nonuniform_mixed_c4", "v41_nonuniform_mixed_c2_write",
                 "v41_nonuniform_mixed_c2_mask"):
        b = results[case]["builder"]
        assert b["requires_padding"] and b["num_decode_tokens"] == 3, b
        assert b["prefill_chunks"][0][0] == 3, b
        check_case(results, case)


# ------------------------------------------------------------- FULL CUDA-graph decode

#: the check's GRAPH_CASES -> replayed steps; the control replays without rebuilding.
GRAPH_STEPS = {"graph_flat_c4": 3, "graph_native2_c4": 2, "graph_plain_c4": 2,
               "graph_v41_flat_c2_write": 2}
GRAPH_CONTROLS = ("control_graph_no_rebuild",)


@pytest.fixture(scope="module")
def graph_results():
    return checks.run_check("vllm_indexer_decode_check.py", checks.applied_tree(), "--graph")


def check_graph_case(results, case, *, graph: bool):
    """Captured with vLLM's dummy batch (uniform: flattened by vLLM's uniform kernel, the
    adapter's regrouping baked into the graph), replayed over rebuilt metadata, padded
    replays included (vLLM's variable path into the same buffers): every token's top-k
    (V4.1: its candidate blocks) equals the oracle, rows past the batch hold -1. ``graph``:
    a real CUDA graph (GPU) or the CPU's emulation. (Shared with the GPU variant.)"""
    r = results[case]
    assert "error" not in r, r
    assert r["graph"] is graph and r["ok"], r
    assert len(r["steps"]) == 1 + GRAPH_STEPS[case], r
    for step in r["steps"]:
        assert not step["bad_rows"] and step["tokens"] > 0 and step["rows_past_batch_fill"], step
    b = r["builder"]
    assert b["capture_uniform"] and b["replay_uniform"][0], b
    assert not all(b["replay_uniform"]), b  # a padded replay: vLLM's other path


def check_graph_control(results, case):
    """Replaying without rebuilding fails the oracle on the replayed step only."""
    r = results[case]
    assert "error" not in r, r
    capture, replay = r["steps"]
    assert not capture["bad_rows"] and replay["bad_rows"] and not r["ok"], r


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
    assert len(r["steps"]) >= 3, r  # the capture and 2-3 replays
    for step in r["steps"]:
        assert not step["bad_rows"] and step["tokens"] > 0 and step["rows_past_batch_fill"], step


@pytest.mark.parametrize("case", sorted(GRAPH_STEPS))
def test_graph_replays_match_the_oracle(graph_results, case):
    """CPU: the replay emulated; the GPU variant replays a real CUDA graph."""
    check_graph_case(graph_results, case, graph=False)


@pytest.mark.parametrize("case", GRAPH_CONTROLS)
def test_graph_replay_without_rebuild_fails(graph_results, case):
    check_graph_control(graph_results, case)
