"""The mHC projection kernel (csrc/mhc/prenorm_gemm.cu, op deepinfer_sm80.ops.mhc) against
the float64 reference (deepinfer_sm80.reference.mhc) at the hidden sizes of V4-Flash (4096),
V4.1-Flash (5120) and V4-Pro (7168): fresh random inputs per run, outputs poisoned with NaN,
token counts off the 64-token block, K splits from 1 to 256 (uneven ones too), a strided x, the grid sized for
an A100, an A6000 and this GPU. Tolerances (relative to float64): reference.mhc.OUT_REL_TOL
for out, SQRSUM_REL_TOL for sqrsum; a kernel that dropped fn's lo term, or used TF32, fails
them (tests/test_mhc_prenorm_reference.py)."""
from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.ops import mhc as op
from deepinfer_sm80.reference import mhc as ref

K_SIZES = {"V4-Flash": 4 * 4096, "V4.1-Flash": 4 * 5120, "V4-Pro": 4 * 7168}


def _inputs(T, K, rng, scale=2e-3):
    x = torch.randn(T, K, generator=rng).to(torch.bfloat16)
    fn = torch.randn(24, K, generator=rng) * scale
    return x, fn


def _run_raw(ext, x, fn, splits):
    out = torch.full((splits, x.shape[0], 24), float("nan"), device="cuda")
    sq = torch.full((splits, x.shape[0]), float("nan"), device="cuda")
    ext.hc_prenorm_gemm(x, fn, out, sq)
    torch.cuda.synchronize()
    return out, sq


def _check(out, sq, x, fn, splits):
    assert torch.isfinite(out).all() and torch.isfinite(sq).all(), "unwritten (NaN) outputs"
    want_out, want_sq = ref.hc_prenorm_gemm(x.cpu(), fn.cpu(), splits)
    err, serr = ref.rel_err(out.cpu(), want_out), ref.sqrsum_rel_err(sq.cpu(), want_sq)
    print(f"T={x.shape[0]} K={x.shape[1]} splits={splits}: out rel err {err:.2e}, "
          f"sqrsum {serr:.2e}")
    assert err <= ref.OUT_REL_TOL, err
    assert serr <= ref.SQRSUM_REL_TOL, serr
    # the splits add up to the whole sum too
    assert ref.rel_err(out.sum(0).cpu(), want_out.sum(0)) <= ref.OUT_REL_TOL


@pytest.mark.parametrize("model", sorted(K_SIZES))
@pytest.mark.parametrize("T", [1, 7, 64, 65, 333])
@pytest.mark.parametrize("splits", [1, 4, 6, 64, 256])
def test_matches_float64(ext, rng, model, T, splits):
    K = K_SIZES[model]
    x, fn = _inputs(T, K, rng)
    out, sq = _run_raw(ext, x.cuda(), fn.cuda(), splits)
    _check(out, sq, x, fn, splits)


@pytest.mark.parametrize("sm_count", [108, 84, None])
@pytest.mark.parametrize("T", [1, 1024, 8192])
def test_op_with_chosen_splits(ext, rng, T, sm_count):
    K = K_SIZES["V4-Flash"]
    x, fn = _inputs(T, K, rng)
    out, sq = op.hc_prenorm_gemm(x.cuda(), fn.cuda(), sm_count=sm_count)
    sms = sm_count or torch.cuda.get_device_properties(0).multi_processor_count
    assert out.shape[0] == op.choose_splits(T, K, sms)
    _check(out, sq, x, fn, out.shape[0])


def test_strided_rows_and_large_values(ext, rng):
    K = K_SIZES["V4-Pro"]
    big = (torch.randn(100, K + 64, generator=rng) * 30).to(torch.bfloat16).cuda()
    x = big[:, 64:]  # sliced on the GPU: row stride K + 64, start 128 bytes in
    assert x.stride(0) == K + 64 and not x.is_contiguous()
    fn = torch.randn(24, K, generator=rng)
    out, sq = _run_raw(ext, x, fn.cuda(), 2)
    _check(out, sq, x.cpu(), fn, 2)


def test_rows_are_independent(ext, rng):
    """A token's outputs depend on its own row only (a block mixing rows would fail)."""
    K = K_SIZES["V4-Flash"]
    x, fn = _inputs(130, K, rng)
    out_a, sq_a = _run_raw(ext, x.cuda(), fn.cuda(), 1)
    x2 = x.clone()
    x2[65] = torch.randn(K, generator=rng).to(torch.bfloat16)
    out_b, sq_b = _run_raw(ext, x2.cuda(), fn.cuda(), 1)
    keep = [t for t in range(130) if t != 65]
    assert torch.equal(out_a[:, keep], out_b[:, keep]) and torch.equal(sq_a[:, keep], sq_b[:, keep])
    assert not torch.equal(out_a[:, 65], out_b[:, 65])


def test_zero_tokens(ext):
    out, sq = op.hc_prenorm_gemm(torch.empty(0, 16384, dtype=torch.bfloat16, device="cuda"),
                                 torch.randn(24, 16384, device="cuda"), n_splits=1)
    assert out.shape == (1, 0, 24) and sq.shape == (1, 0)


@pytest.mark.parametrize("what,match", [
    ("fn_shape", "fn must be"), ("k_split", "n_splits"), ("x_dtype", "x must be"),
    ("splits", "at most K"), ("out_misaligned", "8-byte aligned"),
])
def test_bad_input_is_refused(ext, what, match):
    K = 16384
    x = torch.randn(4, K, device="cuda").to(torch.bfloat16)
    fn = torch.randn(24, K, device="cuda")
    out = torch.empty(1, 4, 24, device="cuda")
    sq = torch.empty(1, 4, device="cuda")
    if what == "fn_shape":
        fn = torch.randn(23, K, device="cuda")
    elif what == "k_split":
        out, sq = torch.empty(257, 4, 24, device="cuda"), torch.empty(257, 4, device="cuda")
    elif what == "x_dtype":
        x = x.float()
    elif what == "out_misaligned":  # contiguous, but 4 bytes into its storage
        out = torch.empty(1 + 4 * 24, device="cuda")[1:].view(1, 4, 24)
    elif what == "splits":  # 16384 / 64 = 256 tiles: 200 splits fit, K = 64 x 100 does not
        x, fn = x[:, :6400].contiguous(), fn[:, :6400].contiguous()
        out, sq = torch.empty(200, 4, 24, device="cuda"), torch.empty(200, 4, device="cuda")
    with pytest.raises(RuntimeError, match=match):
        ext.hc_prenorm_gemm(x, fn, out, sq)


def test_out_variant_matches_and_checks(ext, rng):
    """``hc_prenorm_gemm_out`` (what vLLM's call sites use: caller-allocated outputs, the
    split count from ``out``) writes what ``hc_prenorm_gemm`` returns, bit for bit, and
    refuses outputs of the wrong shape before launching."""
    K = K_SIZES["V4.1-Flash"]
    x, fn = _inputs(200, K, rng)
    x, fn = x.cuda(), fn.cuda()
    want_out, want_sq = op.hc_prenorm_gemm(x, fn, n_splits=16)
    out = torch.full((16, 200, 24), float("nan"), device="cuda")
    sq = torch.full((16, 200), float("nan"), device="cuda")
    op.hc_prenorm_gemm_out(x, fn, out, sq)
    assert torch.equal(out, want_out) and torch.equal(sq, want_sq)
    with pytest.raises(ValueError, match="disagree on n_splits"):
        op.hc_prenorm_gemm_out(x, fn, out, sq[:4])
    with pytest.raises(ValueError, match="sqrsum must be a contiguous"):
        op.hc_prenorm_gemm_out(x, fn, out, torch.empty(16, 199, device="cuda"))
    with pytest.raises(ValueError, match="out must be a contiguous"):
        op.hc_prenorm_gemm_out(x, fn, out.transpose(0, 1), sq)
