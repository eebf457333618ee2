"""CPU checks of the mHC projection's reference and of the tolerances its GPU test applies
(overlay/deepinfer_sm80/reference/mhc.py), and of the op's host-side choices
(overlay/deepinfer_sm80/ops/mhc.py). The kernel itself runs in
tests/gpu/test_mhc_prenorm_gemm_gpu.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from deepinfer_sm80.ops import mhc as op  # noqa: E402
from deepinfer_sm80.reference import mhc as ref  # noqa: E402


def _inputs(T, K, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(torch.bfloat16)
    fn = torch.randn(24, K, generator=g) * 2e-3  # the scale of vLLM's hc_fn
    return x, fn


def test_reference_by_hand():
    x = torch.tensor([[1.0, 2.0, -1.0, 0.5]]).to(torch.bfloat16)
    fn = torch.zeros(24, 4)
    fn[0] = torch.tensor([1.0, 1.0, 1.0, 1.0])
    fn[23] = torch.tensor([0.5, 0.0, 2.0, -4.0])
    out, sq = ref.hc_prenorm_gemm(x, fn)
    assert out.shape == (1, 1, 24) and sq.shape == (1, 1)
    assert out[0, 0, 0] == 2.5 and out[0, 0, 23] == 0.5 - 2.0 - 2.0
    assert out[0, 0, 1:23].abs().sum() == 0 and sq[0, 0] == 1 + 4 + 1 + 0.25
    x = torch.cat([torch.ones(64), 2 * torch.ones(128)]).to(torch.bfloat16)[None]
    fn = torch.zeros(24, 192)
    fn[0] = 1.0
    out, sq = ref.hc_prenorm_gemm(x, fn, n_splits=2)  # tiles [0, 1) and [1, 3)
    assert out[:, 0, 0].tolist() == [64.0, 256.0] and sq[:, 0].tolist() == [64.0, 512.0]


def test_split_bounds():
    assert ref.split_bounds(4, 1) == [(0, 4)]
    assert ref.split_bounds(192, 2) == [(0, 64), (64, 192)]
    assert ref.split_bounds(16384, 6)[:2] == [(0, 42 * 64), (42 * 64, 85 * 64)]
    b = ref.split_bounds(16384, 6)
    assert b[-1][1] == 16384 and all(b[i][1] == b[i + 1][0] for i in range(5))
    with pytest.raises(ValueError):
        ref.split_bounds(128, 3)


@pytest.mark.parametrize("splits", [2, 4])
def test_splits_add_up(splits):
    x, fn = _inputs(5, 256, 1)
    out, sq = ref.hc_prenorm_gemm(x, fn)
    outs, sqs = ref.hc_prenorm_gemm(x, fn, n_splits=splits)
    assert torch.allclose(outs.sum(0), out[0], rtol=1e-12, atol=1e-15)
    assert torch.allclose(sqs.sum(0), sq[0], rtol=1e-12)


def test_split_terms_reconstruct_fp32():
    g = torch.Generator().manual_seed(3)
    f = torch.cat([torch.randn(4096, generator=g) * s for s in (1e-6, 2e-3, 1.0, 1e4)]
                  + [torch.tensor([0.0, -0.0, 1.0, -3.0, 1e-38, 3e38])])
    hi, lo = ref.split_bf16(f)
    back = hi.double() + lo.double()
    err = (back - f.double()).abs()
    normal = f.abs() >= 1e-30  # lo stays a normal bf16 number; fn of a model is ~1e-3
    assert float((err[normal] / f.double().abs()[normal]).max()) <= 2.0 ** -16
    assert float(err[~normal].max()) <= 2.0 ** -133  # below: lo's subnormal steps
    assert torch.equal(hi, f.to(torch.bfloat16))


@pytest.mark.parametrize("K", [16384, 20480, 28672])
def test_tolerance_accepts_the_kernels_arithmetic_and_rejects_one_term(K):
    x, fn = _inputs(48, K, K)
    want = ref.hc_prenorm_gemm(x, fn)[0]
    two = ref.rel_err(ref.kernel_products(x, fn), want)
    one = ref.rel_err(ref.kernel_products(x, fn, terms=1), want)
    # fp32 accumulation on the GPU adds ~1e-6; the product error must leave room for it
    assert two < ref.OUT_REL_TOL / 3, two
    assert one > 10 * ref.OUT_REL_TOL, one
    # TF32 (10-bit mantissas of both operands; upstream's DeepGEMM path on SM90+) fails too
    def tf32(t):
        b = t.float().view(torch.int32)
        return ((b + 0x1000) & ~0x1FFF).view(torch.float32)
    tf = ref.hc_prenorm_gemm(tf32(x.float()), tf32(fn))[0]
    assert ref.rel_err(tf, want) > 5 * ref.OUT_REL_TOL


@pytest.mark.parametrize("T,K,sms,want", [
    (8192, 16384, 108, 1), (4096, 16384, 108, 1), (1024, 16384, 108, 6), (1024, 16384, 132, 8),
    (64, 16384, 108, 64), (1, 16384, 108, 64), (1, 20480, 84, 80), (1, 28672, 82, 82),
    (1, 16384 + 64 * 3, 108, 64), (200, 16384, 108, 27), (65, 28672, 132, 66),
])
def test_choose_splits(T, K, sms, want):
    """vLLM's compute_num_split(64, K, ceil(T / 64)) with sm_count SMs, worked by hand."""
    got = op.choose_splits(T, K, sms)
    assert got == want
    assert 1 <= got <= K // op.BLOCK_K


def test_op_refuses_cpu_tensors_and_bad_shapes():
    x, fn = _inputs(2, 128, 5)
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        op.hc_prenorm_gemm(x, fn)
    with pytest.raises(ValueError):
        op.choose_splits(0, 128, 108)


def _rz(v64: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded toward zero."""
    y = v64.float()
    over = y.double().abs() > v64.abs()
    return torch.where(over, torch.nextafter(y, torch.zeros_like(y)), y)


def _model_mma_sums(x, fn, flush_every):
    """A model of the kernel's sums, not the hardware: each mma step adds the exact sum of its
    16 products to the accumulator rounded toward zero (mma.sync on A100-class parts, Fasi et
    al. 2021); every ``flush_every`` steps the accumulator is added to the running fp32 sum
    with round-to-nearest (the kernel: 8 steps, one 64-column tile; 0 = never)."""
    hi, lo = ref.split_bf16(fn)
    xd = x.double()
    total = torch.zeros(x.shape[0], fn.shape[0])
    part = torch.zeros_like(total)
    for k0 in range(0, x.shape[1], 64):
        for kk in range(k0, k0 + 64, 16):
            for term in (hi, lo):
                part = _rz(part.double() + xd[:, kk:kk + 16] @ term[:, kk:kk + 16].double().t())
        if flush_every:
            total = (total.double() + part.double()).float()
            part = torch.zeros_like(part)
    return total if flush_every else part


def test_per_tile_sums_keep_truncating_accumulation_within_tolerance():
    """Why the kernel adds each tile's mma steps apart (model; the GPU test measures it)."""
    x, fn = _inputs(16, 16384, 11)
    want = ref.hc_prenorm_gemm(x, fn)[0][0]
    tiles = ref.rel_err(_model_mma_sums(x, fn, 8), want)
    chain = ref.rel_err(_model_mma_sums(x, fn, 0), want)
    assert tiles < ref.OUT_REL_TOL / 3, tiles
    assert chain > tiles * 4, (chain, tiles)
