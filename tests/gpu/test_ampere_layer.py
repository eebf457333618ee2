"""The Ampere attention layer step on a GPU, driven the way vLLM drives it,
against a float64 torch oracle of the layer's math.

Real per-layer dimensions: head 512 = 448 + 64, window 128, index top-k 512,
indexer 64 x 128, compress ratios 4 and 128 (and SWA-only), 64 local heads
and the 8-heads-per-GPU (TP8) split; prefill in chunks of 4 requests; decode
with 1 and 6 query tokens per request plus CUDA-graph padding rows.  Kernels:
``deepinfer_sm80.ops`` where the extension is built, portable otherwise (the
choice is printed).  Also: indexer top-k sets vs the oracle's (ties broken by
lower index), the decode step under CUDA-graph capture/replay vs eager, and
the output projection with ``wo_a`` dequantised before any repacking.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]
for _p in (ROOT / "overlay", ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import layer_cases as C  # noqa: E402
from deepinfer_sm80.ampere import layer as L  # noqa: E402
from deepinfer_sm80.ampere import o_proj as O  # noqa: E402

pytestmark = pytest.mark.gpu

OPS = L.resolve_ops("cuda", prefer_portable=os.environ.get("AMPERE_PORTABLE") == "1")
print("ampere ops:", json.dumps(OPS.source))


def _log(name, d):
    print(name, json.dumps(d))
    path = os.environ.get("LAYER_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{name} {json.dumps(d)}\n")


DECODE = [
    (4, [3000, 2100, 700, 4100]),
    (128, [3000, 300, 1100]),
    (1, [500, 90, 130]),
]


@pytest.mark.parametrize("heads", [64, 8])
@pytest.mark.parametrize("next_n", [1, 6, 8])
@pytest.mark.parametrize("ratio,seq_lens", DECODE)
def test_decode_step(ratio, seq_lens, next_n, heads):
    w = C.build_world(ratio=ratio, seq_lens=seq_lens, heads=heads, device="cuda",
                      seed=100 + ratio + heads)
    md = C.decode_metadata(w, next_n)
    g = torch.Generator().manual_seed(next_n + heads)
    q, iq, iw = C.make_queries(w, md.tok_pos + [0, 0], g)
    out, topk = C.run_decode(w, md, OPS, q, iq, iw)
    torch.cuda.synchronize()
    worst, mism, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    _log(f"decode ratio={ratio} next_n={next_n} heads={heads}",
         {"max_rel_err": worst, "indexer_set_mismatch": mism, "tokens": n})
    assert n == len(seq_lens) * next_n
    assert worst <= 2e-2
    assert torch.isfinite(out.float()).all()


PREFILL = [
    (4, [3000, 2200, 600, 2600, 900], [300, 64, 200, 700, 33]),
    (128, [3000, 700, 260], [500, 700, 2]),
    (1, [700, 150, 129, 40, 300], [200, 5, 129, 40, 1]),
]


@pytest.mark.parametrize("heads", [64, 8])
@pytest.mark.parametrize("ratio,seq_lens,qlens", PREFILL)
def test_prefill_chunks(ratio, seq_lens, qlens, heads):
    w = C.build_world(ratio=ratio, seq_lens=seq_lens, heads=heads, device="cuda",
                      seed=200 + ratio + heads)
    md = C.prefill_metadata(w, qlens)
    g = torch.Generator().manual_seed(heads)
    q, iq, iw = C.make_queries(w, md.tok_pos, g)
    out, topk = C.run_prefill(w, md, OPS, L.Workspace(), q, iq, iw)
    torch.cuda.synchronize()
    worst, mism, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    _log(f"prefill ratio={ratio} heads={heads}",
         {"max_rel_err": worst, "indexer_set_mismatch": mism, "tokens": n})
    assert worst <= 2e-2


V41_DECODE = [(1, [3000, 700, 1300]), (2, [4100, 2100, 90])]
V41_PREFILL = [(1, [1700, 150, 600], [300, 150, 33]), (2, [3000, 260, 129], [700, 2, 129])]


@pytest.mark.parametrize("heads", [64, 8])
@pytest.mark.parametrize("next_n", [1, 6, 8])
@pytest.mark.parametrize("ratio,seq_lens", V41_DECODE)
def test_v41_decode_step(ratio, seq_lens, next_n, heads):
    """DeepSeek-V4.1's ratios 1 and 2 (compressed region, supplied top-k) on SM80 code."""
    w = C.build_world(ratio=ratio, seq_lens=seq_lens, heads=heads, device="cuda",
                      seed=300 + ratio + heads, v41=True)
    md = C.decode_metadata(w, next_n)
    g = torch.Generator().manual_seed(next_n + heads + 1)
    q, iq, iw = C.make_queries(w, md.tok_pos + [0, 0], g)
    topk = C.v41_topk(w, md.tok_pos + [0, 0], g)
    out, _ = C.run_decode(w, md, OPS, q, iq, iw, topk_buf=topk)
    torch.cuda.synchronize()
    worst, _, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    _log(f"v41 decode ratio={ratio} next_n={next_n} heads={heads}",
         {"max_rel_err": worst, "tokens": n})
    assert n == len(seq_lens) * next_n
    assert worst <= 2e-2
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("heads", [64, 8])
@pytest.mark.parametrize("ratio,seq_lens,qlens", V41_PREFILL)
def test_v41_prefill_chunks(ratio, seq_lens, qlens, heads):
    w = C.build_world(ratio=ratio, seq_lens=seq_lens, heads=heads, device="cuda",
                      seed=400 + ratio + heads, v41=True)
    md = C.prefill_metadata(w, qlens)
    g = torch.Generator().manual_seed(heads + 2)
    q, iq, iw = C.make_queries(w, md.tok_pos, g)
    topk = C.v41_topk(w, md.tok_pos, g)
    out, _ = C.run_prefill(w, md, OPS, L.Workspace(), q, iq, iw, topk=topk)
    torch.cuda.synchronize()
    worst, _, n = C.check_against_oracle(w, md, q, iq, iw, out, topk)
    _log(f"v41 prefill ratio={ratio} heads={heads}", {"max_rel_err": worst, "tokens": n})
    assert worst <= 2e-2


def _captured_decode(w, md, rows, seed):
    """Inputs of ``md``'s decode step (queries, out, top-k buffer) and a CUDA graph of the step
    on them, captured after two eager warm-ups (Triton JIT, workspaces) on a side stream."""
    g = torch.Generator().manual_seed(seed)
    q, iq, iw = C.make_queries(w, rows, g)
    out = torch.empty_like(q)
    topk = (C.v41_topk(w, rows, g) if w.v41
            else torch.full((q.shape[0], C.TOPK), -1, dtype=torch.int32, device="cuda"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            C.run_decode(w, md, OPS, q, iq, iw, out=out, topk_buf=topk)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        C.run_decode(w, md, OPS, q, iq, iw, out=out, topk_buf=topk)
    return graph, (q, iq, iw, out, topk)


def _replay_against_eager(w, md, graph, bufs, rows, seed, check_topk):
    """Fresh queries (and V4.1 top-k) for ``rows`` copied into the graph's buffers, one replay,
    and the eager step on ``md``: the replayed output (and top-k, ``check_topk``) bit-equal to
    eager, and within bf16 level of the float64 oracle."""
    q, iq, iw, out, topk = bufs
    g = torch.Generator().manual_seed(seed)
    q2, iq2, iw2 = C.make_queries(w, rows, g)
    q.copy_(q2), iq.copy_(iq2), iw.copy_(iw2)
    topk2 = C.v41_topk(w, rows, g) if w.v41 else None
    if w.v41:
        topk.copy_(topk2)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    replayed, replayed_topk = out.clone(), topk.clone()
    eager, eager_topk = C.run_decode(w, md, OPS, q2, iq2, iw2, topk_buf=topk2)
    torch.cuda.synchronize()
    assert torch.equal(replayed[: md.T], eager[: md.T])
    if check_topk:
        assert torch.equal(replayed_topk[: md.T], eager_topk[: md.T])
    worst, _, _ = C.check_against_oracle(w, md, q2, iq2, iw2, replayed, replayed_topk)
    assert worst <= 2e-2


@pytest.mark.parametrize("v41,ratio", [(False, 4), (False, 128), (True, 1), (True, 2)])
def test_decode_cuda_graph_replay_equals_eager(v41, ratio):
    """Capture the decode step (V4: indexer top-k + index mapping + attention; V4.1: the
    supplied top-k through the global-index path + attention), replay it on fresh inputs and
    compare bit-for-bit with eager."""
    w = C.build_world(ratio=ratio, seq_lens=[3000, 2100, 700, 4100], heads=64, device="cuda",
                      seed=300 + ratio, v41=v41)
    md = C.decode_metadata(w, 6)
    rows = md.tok_pos + [0, 0]
    graph, bufs = _captured_decode(w, md, rows, 5)
    for seed in (6, 7):
        _replay_against_eager(w, md, graph, bufs, rows, seed, check_topk=ratio == 4)
    _log(f"cuda graph {'v41 ' if v41 else ''}ratio={ratio}", {"replay_equals_eager": True})


@pytest.mark.parametrize("v41,ratio", [(False, 4), (True, 2)])
def test_decode_graph_captured_on_dummy_metadata_replays_real_batches(v41, ratio):
    """vLLM captures its decode graphs on a dummy batch (each context just the query tokens,
    block tables as they are) and replays them after copying each step's metadata into the
    same buffers. Captured so, replays on the real contexts (and on a second, shorter set)
    must equal eager on those contexts: nothing derived from the metadata's contents may be
    fixed at capture (a host-side length, a grid sized from the contexts)."""
    seq = [3000, 2100, 700, 4100]
    w = C.build_world(ratio=ratio, seq_lens=seq, heads=64, device="cuda", seed=500 + ratio,
                      v41=v41)
    nn = 6
    md = C.decode_metadata(w, nn, seq_lens=[nn] * len(seq))  # capture-time dummy contexts
    graph, bufs = _captured_decode(w, md, md.tok_pos + [0, 0], 3)
    for lens, seed in ((seq, 8), ([1500, 60, 699, 2500], 9)):
        real = C.decode_metadata(w, nn, seq_lens=lens)
        for name in ("swa_indices", "swa_lens", "token_to_req", "positions", "is_valid", "ctx"):
            if hasattr(real, name):
                getattr(md, name).copy_(getattr(real, name))
        _replay_against_eager(w, real, graph, bufs, real.tok_pos + [0, 0], seed,
                              check_topk=not v41)
    _log(f"graph on dummy metadata {'v41 ' if v41 else ''}ratio={ratio}",
         {"replay_equals_eager": True})


@pytest.mark.parametrize("heads,groups", [(64, 8), (8, 1)])
def test_o_proj_bf16_from_fp8_block_weight(heads, groups):
    """Inverse RoPE (bf16, no FP8) + grouped wo_a from an FP8 block-quantised
    checkpoint weight dequantised at load + wo_b, vs float64."""
    g = torch.Generator().manual_seed(heads)
    T, D, R, hidden = 37, 512, 1024, 1024
    hpg = heads // groups
    o = (torch.randn(T, heads, D, generator=g)).to(torch.bfloat16).cuda()
    pos = torch.randint(0, 4096, (T,), generator=g).cuda()
    cs = torch.randn(4096, 64, generator=g).cuda()
    w_full = torch.randn(groups * R, hpg * D, generator=g) * 0.02
    # FP8 block-128 checkpoint weight (e4m3 + fp32 scale_inv per 128x128)
    blocks = w_full.view(groups * R // 128, 128, hpg * D // 128, 128)
    scale = blocks.abs().amax(dim=(1, 3)) / 448.0
    wq = (blocks / scale[:, None, :, None]).view(groups * R, hpg * D).to(torch.float8_e4m3fn)
    deq = O.dequant_weight(wq.cuda(), scale.cuda(), (128, 128))
    grouped = O.group_wo_a(deq, groups, R)
    wo_b = (torch.randn(hidden, groups * R, generator=g) * 0.02).to(torch.bfloat16).cuda()
    got = O.o_proj_sm80(o, pos, cs, grouped, lambda z: z @ wo_b.t())
    ref = O.o_proj_reference64(o, pos, cs, grouped, wo_b)
    err = float((got.double() - ref).norm() / ref.norm())
    _log(f"o_proj heads={heads}", {"rel_err": err})
    assert err <= 2e-2
    # the dequantised weight is the checkpoint's values (exact decode x scale)
    ref_w = wq.float().view(groups * R // 128, 128, hpg * D // 128, 128) * scale[:, None, :, None]
    assert torch.equal(deq.cpu(), ref_w.view(groups * R, hpg * D))
