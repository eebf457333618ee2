"""CPU run of the Ampere attention step (portable ops) against the float64
oracle: the same drivers as tests/gpu/test_ampere_layer.py, smaller batches."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "overlay"))
from deepinfer_sm80.ampere import layer as L  # noqa: E402

import layer_cases as C  # noqa: E402

OPS = L.resolve_ops("cpu")


@pytest.mark.parametrize("ratio,seq_lens,next_n", [
    (4, [2300, 700], 1), (4, [2305], 6), (128, [1000, 300], 6), (1, [200, 90], 1),
    (4, [1900, 611], 8)])  # 8 rows: DSpark's 7 draft tokens (upstream's recipe)
def test_decode_step_matches_oracle(ratio, seq_lens, next_n):
    w = C.build_world(ratio=ratio, seq_lens=seq_lens, heads=8, device="cpu", seed=ratio)
    md = C.decode_metadata(w, next_n)
    g = torch.Generator().manual_seed(7)
    q, iq, iw = C.make_queries(w, md.tok_pos + [0, 0], g)
    out, topk = C.run_decode(w, md, OPS, q, iq, iw)
    worst, mism, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    assert n == len(seq_lens) * next_n
    assert worst <= 2e-2, worst
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("ratio,seq_lens,qlens", [(4, [2200, 600], [40, 600]), (128, [700], [300]),
                                                 (1, [300, 150], [200, 5])])
def test_prefill_chunk_matches_oracle(ratio, seq_lens, qlens):
    w = C.build_world(ratio=ratio, seq_lens=seq_lens, heads=8, device="cpu", seed=10 + ratio)
    md = C.prefill_metadata(w, qlens)
    g = torch.Generator().manual_seed(8)
    q, iq, iw = C.make_queries(w, md.tok_pos, g)
    out, topk = C.run_prefill(w, md, OPS, L.Workspace(), q, iq, iw)
    worst, mism, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    assert worst <= 2e-2, worst


@pytest.mark.parametrize("ratio,seq_lens,next_n", [(1, [700, 300], 1), (2, [1500], 6),
                                                   (1, [650, 130], 8)])
def test_v41_decode_step_matches_oracle(ratio, seq_lens, next_n):
    """DeepSeek-V4.1 ratios: a compressed region at ratio 1 and 2, entries chosen by a
    supplied top-k (the global-index path with compressed_path="topk")."""
    w = C.build_world(ratio=ratio, seq_lens=seq_lens, heads=8, device="cpu", seed=20 + ratio,
                      v41=True)
    md = C.decode_metadata(w, next_n)
    g = torch.Generator().manual_seed(9)
    q, iq, iw = C.make_queries(w, md.tok_pos + [0, 0], g)
    topk = C.v41_topk(w, md.tok_pos + [0, 0], g)
    out, _ = C.run_decode(w, md, OPS, q, iq, iw, topk_buf=topk)
    worst, mism, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    assert n == len(seq_lens) * next_n
    assert worst <= 2e-2, worst
    assert any((topk[t] >= 0).sum() > 100 for t in range(n))  # compressed entries attended


@pytest.mark.parametrize("ratio,seq_lens,qlens", [(1, [900, 200], [300, 200]),
                                                 (2, [1200, 260], [64, 9])])
def test_v41_prefill_chunk_matches_oracle(ratio, seq_lens, qlens):
    w = C.build_world(ratio=ratio, seq_lens=seq_lens, heads=8, device="cpu", seed=30 + ratio,
                      v41=True)
    md = C.prefill_metadata(w, qlens)
    g = torch.Generator().manual_seed(10)
    q, iq, iw = C.make_queries(w, md.tok_pos, g)
    topk = C.v41_topk(w, md.tok_pos, g)
    out, _ = C.run_prefill(w, md, OPS, L.Workspace(), q, iq, iw, topk=topk)
    worst, mism, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    assert worst <= 2e-2, worst


@pytest.mark.parametrize("ratio", [1, 2])
def test_v41_prefill_after_a_prefix_hit_and_failed_candidates(ratio):
    """DeepSeek-V4.1's combine (``forward_prefill(v41=True)``): after a prefix-cache hit the
    request's gathered window starts at its replay start (vLLM's ``swa_bounded_replay``, on by
    default), so the first query tokens see a shorter window, not rows before the buffer
    (which V4's combine would index: the compressed region or the previous request); and a
    -1 inside a token's first (pos + 1) // ratio top-k entries (a failed candidate) is
    skipped, not read as the previous request's last row. Four requests in one chunk."""
    seq, qlens, replay = [900, 700, 520, 300], [150, 200, 60, 300], [750, 500, 400, 0]
    w = C.build_world(ratio=ratio, seq_lens=seq, heads=8, device="cpu", seed=50 + ratio, v41=True)
    md = C.prefill_metadata(w, qlens, replay_starts=replay)
    assert md.swa_floor[:3] == [750, 500, 400]  # windows cut at the replay start
    g = torch.Generator().manual_seed(11)
    q, iq, iw = C.make_queries(w, md.tok_pos, g)
    topk = C.v41_topk(w, md.tok_pos, g, holes=0.3)
    out, _ = C.run_prefill(w, md, OPS, L.Workspace(), q, iq, iw, topk=topk)
    worst, _, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    assert worst <= 2e-2, worst
