"""vLLM's own indexer decode metadata, built on the GPU, into the Ampere indexer adapter and this
project's CUDA scorer (tests/vllm_indexer_decode_check.py --device cuda).

The CPU test (tests/test_vllm_indexer_decode_sm80.py) runs the same cases with the portable
scorer and vLLM's Triton kernels in the interpreter. Here vLLM's metadata builder runs on CUDA
tensors (its Triton preparation kernels compiled for this GPU; the platform mocked to
capability 8.0, so vLLM takes its SM80 decisions: no DeepGEMM, next_n > 2 flattened) and the
adapter calls ``decode_topk`` with the CUDA scorer: every token's top-k (V4.1: candidate row,
or the top-k masked to them) must equal the float64 oracle, and the uniform DSpark batch must
reach the scorer regrouped to [requests, next_n].

Needs vLLM's pure-Python dependencies (tests/vllm_cpu_harness.REQUIRED_MODULES); skips naming
the missing ones. Tree: $DEEPINFER_VLLM_TREE, build/vllm-<version>, or the GPU bundle's
vllm-tree/."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import vllm_builder_check as checks  # noqa: E402
from test_vllm_indexer_decode_sm80 import EXPECTED, FUZZ, check_case, check_fuzz_case  # noqa: E402
import test_vllm_indexer_decode_sm80 as cpu  # noqa: E402,I001


@pytest.fixture(scope="module")
def results(ext):
    return checks.gpu_results("vllm_indexer_decode_check.py")


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_topk_on_cuda_matches_oracle_in_the_fast_shape(results, case):
    check_case(results, case)


@pytest.mark.parametrize("case", FUZZ)
def test_random_batches_on_cuda_match_the_oracle(results, case):
    check_fuzz_case(results, case)


@pytest.fixture(scope="module")
def graph_results(ext):
    """The FULL CUDA-graph cases (--graph), on a real graph; the same skips as ``results``."""
    return checks.gpu_results("vllm_indexer_decode_check.py", "--graph")


def test_graph_every_case_ran_on_cuda(graph_results):
    cpu.test_graph_every_case_ran(graph_results)


@pytest.mark.parametrize("case", sorted(cpu.GRAPH_STEPS))
def test_graph_replays_on_cuda_match_the_oracle(graph_results, case):
    cpu.check_graph_case(graph_results, case, graph=True)


@pytest.mark.parametrize("case", cpu.GRAPH_FUZZ)
def test_graph_random_replays_on_cuda_match_the_oracle(graph_results, case):
    cpu.check_graph_fuzz_case(graph_results, case, graph=True)


@pytest.mark.parametrize("case", cpu.GRAPH_CONTROLS)
def test_graph_replay_without_rebuild_fails_on_cuda(graph_results, case):
    cpu.check_graph_control(graph_results, case)
