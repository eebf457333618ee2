"""DeepSeek-V4.1's two-level (candidate) selection in the SM80 indexer on a GPU: the same
exact-arithmetic checks as tests/test_ampere_indexer.py, here through the fused Triton
scorer (``indexer_triton``, SM80 code) that CUDA tensors take, against the float64 oracle."""
from __future__ import annotations

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

_ROOT = pathlib.Path(__file__).resolve().parents[2]
for _p in (_ROOT / "overlay", _ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import indexer_cases as IC  # noqa: E402


@pytest.mark.parametrize("row_chunk", [256, 4])
def test_prefill_candidate_write_matches_oracle(row_chunk):
    IC.check_prefill_candidate_write("cuda", row_chunk)


@pytest.mark.parametrize("row_chunk", [256, 4])
def test_prefill_candidate_mask_matches_oracle(row_chunk):
    IC.check_prefill_candidate_mask("cuda", row_chunk)


@pytest.mark.parametrize("write", [True, False])
def test_decode_candidates_match_oracle(write):
    IC.check_decode_candidates("cuda", write)


@pytest.mark.parametrize("budget", [1, 600])  # 3 chunks of one request; 2 + 1 requests
def test_decode_candidate_source_in_request_chunks_matches_oracle(budget):
    IC.check_decode_candidates("cuda", True, candidate_budget=budget)


def test_decode_candidate_chain_cuda_graph_replay_equals_eager():
    """The candidate-source layer's write and a later layer's mask in one captured CUDA graph
    (vLLM captures every layer of a decode step), replayed on fresh queries: bit-equal to eager
    on the same inputs, and to the float64 oracle."""
    dev = "cuda"
    g = torch.Generator().manual_seed(11)
    case = IC.decode_case(g, dev)
    rows = case.B * case.NN

    def fresh(seed):
        gs = torch.Generator().manual_seed(seed)
        a, b = IC.decode_queries(case, gs), IC.decode_queries(case, gs)
        return a, b

    (qa_c, _, wa64), (qb_c, _, wb64) = fresh(12)
    qa, wa = qa_c.to(dev), wa64.float().to(dev)
    qb, wb = qb_c.to(dev), wb64.float().to(dev)
    blocks = torch.full((rows, case.nblk), -7, dtype=torch.int32, device=dev)
    out_a = torch.full((rows, case.K), -7, dtype=torch.int32, device=dev)
    out_b = torch.full_like(out_a, -7)

    def step():
        IC.run_decode_candidates(case, qa, wa, out_a, blocks, write=True)
        IC.run_decode_candidates(case, qb, wb, out_b, blocks, write=False)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # Triton JIT and first allocations outside the capture
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (13, 14):
        (qa_c, qa64, wa64), (qb_c, qb64, wb64) = fresh(seed)
        qa.copy_(qa_c.to(dev)), wa.copy_(wa64.float().to(dev))
        qb.copy_(qb_c.to(dev)), wb.copy_(wb64.float().to(dev))
        for t in (blocks, out_a, out_b):
            t.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        got = blocks.cpu(), out_a.cpu(), out_b.cpu()
        e_blocks = torch.full_like(blocks, -7)
        e_a, e_b = torch.full_like(out_a, -7), torch.full_like(out_b, -7)
        IC.run_decode_candidates(case, qa_c.to(dev), wa64.float().to(dev), e_a, e_blocks, True)
        IC.run_decode_candidates(case, qb_c.to(dev), wb64.float().to(dev), e_b, e_blocks, False)
        torch.cuda.synchronize()
        for x, y in zip(got, (e_blocks.cpu(), e_a.cpu(), e_b.cpu())):
            assert torch.equal(x, y)
        assert (got[0] >= 0).any() and (got[2] >= 0).any()
        IC.check_decode_rows(case, qa64, wa64, got[1], got[0], write=True)
        IC.check_decode_rows(case, qb64, wb64, got[2], got[0], write=False)
