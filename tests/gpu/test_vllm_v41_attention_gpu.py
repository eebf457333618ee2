"""vLLM's own attention metadata, built on the GPU with SWA bounded replay, into the Ampere
DeepSeek-V4.1 attention adapter and this project's CUDA ops
(tests/vllm_v41_attention_check.py --device cuda).

The CPU test (tests/test_vllm_v41_attention_sm80.py) runs the same cases with the portable ops
and vLLM's Triton kernels in the interpreter. Here the world (caches, block tables), the model
runner's tensors (block tables as wide as max_model_len, slot mappings, query_start_loc,
seq_lens, positions; the host copies query_start_loc_cpu / seq_lens_cpu_upper_bound on the
CPU, as vLLM keeps them), the model state's replay starts (its slot-padding kernel compiled)
and the shared top-k buffer live on the GPU; vLLM's builders run on CUDA tensors (the platform
mocked to capability 8.0) and ``forward_mqa`` runs with the CUDA extension's ops (the check
refuses portable fallbacks). Every real token must match the float64 oracle (the window of a
replaying request from its replay start), vLLM's split, replay starts and layouts must be
those of the CPU test, and the negative controls must still be reported as failures.

Needs vLLM's pure-Python dependencies (tests/vllm_cpu_harness.REQUIRED_MODULES); skips naming
the missing ones. Tree: $DEEPINFER_VLLM_TREE, build/vllm-<version>, or the GPU bundle's
vllm-tree/."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import test_vllm_v41_attention_sm80 as cpu  # noqa: E402
import vllm_builder_check as checks  # noqa: E402

#: The CPU test's checks of what vLLM hands the adapter (replay starts, gather lengths,
#: padded slots, decode lengths, chunk plans): the same on the GPU.
LAYOUT_CHECKS = (
    cpu.test_every_case_ran,
    cpu.test_replay_starts_come_from_the_scheduler,
    cpu.test_later_chunks_keep_the_replay_start,
    cpu.test_replayed_slots_are_padded_in_the_compressed_group_only,
    cpu.test_a_short_replaying_chunk_is_a_decode_bounded_by_its_replay_start,
    cpu.test_padded_tokens_get_zero_lengths,
)


@pytest.fixture(scope="module")
def results(ext):
    return checks.gpu_results("vllm_v41_attention_check.py")


@pytest.mark.parametrize("case", sorted(cpu.SPLITS))
def test_every_token_on_cuda_matches_the_oracle(results, case):
    cpu.check_case(results, case)


@pytest.mark.parametrize("case", cpu.FUZZ)
def test_random_batches_on_cuda_match_the_oracle(results, case):
    cpu.check_fuzz_case(results, case)


@pytest.mark.parametrize("case", cpu.CONTROLS)
def test_the_check_can_fail_on_cuda(results, case):
    cpu.check_control(results, case)


@pytest.mark.parametrize("case", cpu.REPLAY_CONTROLS)
def test_replay_controls_fail_on_the_replayed_window_on_cuda(results, case):
    cpu.test_replay_controls_fail_on_the_replayed_window(results, case)


@pytest.mark.parametrize("check", LAYOUT_CHECKS, ids=lambda f: f.__name__[len("test_"):])
def test_vllms_layouts_on_cuda(results, check):
    check(results)


@pytest.fixture(scope="module")
def graph_results(ext):
    """The FULL CUDA-graph cases (--graph), on a real graph; the same skips as ``results``."""
    return checks.gpu_results("vllm_v41_attention_check.py", "--graph")


def test_graph_every_case_ran_on_cuda(graph_results):
    cpu.test_graph_every_case_ran(graph_results)


@pytest.mark.parametrize("case", cpu.GRAPH_CASES)
def test_graph_replays_on_cuda_match_the_oracle(graph_results, case):
    cpu.check_graph_case(graph_results, case, graph=True)


@pytest.mark.parametrize("case", cpu.GRAPH_FUZZ)
def test_graph_random_replays_on_cuda_match_the_oracle(graph_results, case):
    cpu.check_graph_fuzz_case(graph_results, case, graph=True)


@pytest.mark.parametrize("case", cpu.GRAPH_CONTROLS)
def test_graph_replay_without_rebuild_fails_on_cuda(graph_results, case):
    cpu.check_graph_control(graph_results, case)
