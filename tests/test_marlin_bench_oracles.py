"""CPU tests of what bench/marlin_vllm.py checks vLLM's Marlin path with before timing it
(its runs are on the GPU): the loaded weights' dequantisation (torch's e4m3 view, the block
and per-32 scale expansion) and the fp32 routed-experts reference, each against float64
computed with tests/vllm_marlin_check.py's own decoders, on small shapes. A mistake here
would let the benchmark's correctness gate pass a wrong kernel, or fail a right one."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import vllm_marlin_check as check  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("marlin_vllm", BENCH / "marlin_vllm.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def _gen(seed=1234):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("fmt,n,k", [("block", 320, 256), ("mx", 64, 128)])
def test_loaded_linear_means_what_the_format_says(bench, fmt, n, k):
    """N = 320 leaves a partial 128-row block (V4's 576-wide KV projection does too)."""
    codes, exps, w = bench.loaded_linear(_gen(), fmt, n, k)
    assert codes.dtype == torch.uint8 and tuple(codes.shape) == (n, k)
    assert not ((codes & 0x7F) == 0x7F).any()  # no NaN codes
    s64 = torch.pow(2.0, exps.double() - 127)
    if fmt == "block":
        assert tuple(exps.shape) == (-(-n // 128), k // 128)
        s64 = s64.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    else:
        assert tuple(exps.shape) == (n, k // 32)
        s64 = s64.repeat_interleave(32, 1)
    # e4m3 x 2^e is exact in fp32: bit-exact against the float64 decoder
    assert torch.equal(w.double(), check.e4m3_to_float(codes) * s64)


@pytest.mark.parametrize("weights", ["mxfp4", "fp8"])
def test_expert_reference_matches_float64(bench, weights):
    e, top_k, k, n, m = 4, 2, 256, 128, 3
    g = _gen(7)
    loaded = bench.loaded_experts(g, weights, e, k, n)
    w13, w2 = check.experts_float64(weights, loaded, k, n)
    for ex in range(e):  # the per-expert dequantisation, exactly
        d13, d2 = bench.dequant_expert(check, weights, loaded, ex, k, n)
        assert torch.equal(d13.double(), w13[ex]) and torch.equal(d2.double(), w2[ex])
    # inputs scaled so that some gate and up values pass the clamp (|h| > 10)
    x = (torch.randn((m, k), generator=g) * {"mxfp4": 12.0, "fp8": 1.5}[weights]).to(
        torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32)
    tw = torch.softmax(torch.randn((m, top_k), generator=g), -1)
    ref = check.moe_float64(x.double(), tw, ids, w13, w2)
    h = torch.stack([x[t].double() @ w13[int(ids[t, j])].T
                     for t in range(m) for j in range(top_k)])
    clamped = int((h[:, :n] > 10).sum() + (h[:, n:].abs() > 10).sum())
    got = bench.moe_reference(check, weights, loaded, x, tw, ids, k, n)
    assert bench.rel_err(got, ref) < 1e-5
    assert clamped > 0
    # the reference follows the routing: the same experts with their weights swapped differ
    assert bench.rel_err(bench.moe_reference(check, weights, loaded, x, tw,
                                             ids.flip(-1), k, n), ref) > 1e-2
