"""DeepSeek-V4's mHC kernels (TileLang) as SM80 code on a GPU, against float64 references.

Every DeepSeek-V4 / V4.1 decoder layer on a CUDA device runs vLLM's TileLang mHC kernels
(``vllm/model_executor/kernels/mhc/tilelang.py``: the pre block with the fused attention /
FFN RMSNorm, the fused post + pre between sublayers, the post block and the model's
``hc_head``). No patch of ours touches them; they must compile and compute correctly for
SM80. Here vLLM's own wrappers run with

* the platform reporting capability 8.0 (so PDL, which needs 9.0, is off, and every
  capability-based dispatch takes its SM80 branch),
* TileLang's target forced to ``arch sm_80`` (set ``TILELANG_DEFAULT_TARGET`` to
  ``{"kind": "cuda", "arch": "sm_80", "code": ["sm_90"]}`` on an H100/H200: SM80 code
  generation, compiled from compute_80 to the device's machine code, as our extension is),
* the split-k grid sized for 108 SMs (an A100),

and each output is compared with a float64 reference written here from the kernels'
semantics (tolerances: vLLM's own for these kernels, bf16 outputs 1.6e-2 + 1e-2 |ref|).

Needs a CUDA GPU, ``tilelang`` (vLLM 0.33.0 pins 0.1.12) and the vLLM tree
(``bench/upstream_import.py`` finds it); skips with the reason otherwise.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)
pytest.importorskip("tilelang", reason="needs tilelang (vLLM 0.33.0 pins tilelang==0.1.12)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

import mhc_sm80  # noqa: E402
import upstream_import  # noqa: E402

pytestmark = pytest.mark.gpu

A100_SMS = mhc_sm80.A100_SMS
HC = 4
EPS = 1e-6
POST_ALPHA = 2.0
SINKHORN = 20
BF16_TOL = dict(atol=1.6e-2, rtol=1e-2)
MIX_TOL = dict(atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def mhc():
    """vLLM's wrappers and kernels module under the capability-8.0 platform with the A100's
    SM count (bench/mhc_sm80.py); both stand-ins are undone afterwards: later tests in this
    process (make gpu-test runs tests/gpu in one) see the real device."""
    if not mhc_sm80.target_is_sm80():
        pytest.skip('set TILELANG_DEFAULT_TARGET={"kind": "cuda", "arch": "sm_80", "code": '
                    '["sm_<this device>"]} to run the SM80 code path (scripts/device/mhc.sh)')
    platform = mhc_sm80.sm80_mhc(A100_SMS)
    try:
        wrappers, kernels = platform.__enter__()
    except (upstream_import.UpstreamImportError, ImportError) as e:
        pytest.skip(f"vLLM tree not importable: {e}")
    try:
        assert kernels.ENABLE_PDL is False
        yield wrappers, kernels
    finally:
        platform.__exit__(None, None, None)
    compiled = mhc_sm80.compiled_targets(kernels)
    print("tilelang kernels compiled:", json.dumps(sorted({n for n, _ in compiled})))
    assert compiled and all('"arch":"sm_80"' in t.replace(" ", "") for _, t in compiled), compiled


# ---------------------------------------------------------------------------
# float64 references
# ---------------------------------------------------------------------------
def _mixes(x: torch.Tensor, fn: torch.Tensor, rms_eps: float) -> torch.Tensor:
    """x [T, K] float64, fn [M, K] -> RMS-normalised projections [T, M]."""
    return (x @ fn.t()) * torch.rsqrt(x.square().mean(-1, keepdim=True) + rms_eps)


def _rmsnorm_bf16_input(v: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the bf16-rounded activation (as the fused kernels write it) times w."""
    vb = v.to(torch.bfloat16).double()
    return vb * torch.rsqrt(vb.square().mean(-1, keepdim=True) + eps) * w.double()


def mix_coefficients(proj, fn, scale, base, hc):
    """The pre block's coefficients from its projection input ``proj`` [T, K]:
    (pre [T, hc], post [T, hc], comb [T, hc, hc], Sinkhorn-normalised), float64."""
    T = proj.shape[0]
    m = _mixes(proj.double(), fn.double(), EPS)
    s, b = scale.double(), base.double()
    pre = torch.sigmoid(m[:, :hc] * s[0] + b[:hc]) + EPS
    post = torch.sigmoid(m[:, hc:2 * hc] * s[1] + b[hc:2 * hc]) * POST_ALPHA
    comb = torch.softmax(m[:, 2 * hc:].view(T, hc, hc) * s[2] + b[2 * hc:].view(hc, hc), -1) + EPS
    comb = comb / (comb.sum(-2, keepdim=True) + EPS)
    for _ in range(SINKHORN - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + EPS)
        comb = comb / (comb.sum(-2, keepdim=True) + EPS)
    return pre, post, comb


def pre_ref(residual, fn, scale, base, norm_weight=None, norm_eps=EPS):
    """mHC pre block: (post_mix [T, hc, 1], comb_mix [T, hc, hc], layer_input [T, H])."""
    T, hc, H = residual.shape
    x = residual.double()  # bf16 input, or a float64 residual not rounded yet
    pre, post, comb = mix_coefficients(x.reshape(T, hc * H), fn, scale, base, hc)
    li = (pre.unsqueeze(-1) * x).sum(1)
    if norm_weight is not None:
        li = _rmsnorm_bf16_input(li, norm_weight, norm_eps)
    return post.unsqueeze(-1), comb, li


def post_ref(x, residual, post_mix, comb_mix):
    """mHC post block: residual stream j = sum_i comb[i, j] residual_i + post_j x."""
    mixed = torch.einsum("tij,tih->tjh", comb_mix.double(), residual.double())
    return mixed + post_mix.double().reshape(*post_mix.shape[:2], 1) * x.double().unsqueeze(1)


def hc_head_ref(residual, fn, scale, base):
    T, hc, H = residual.shape
    x = residual.double()
    m = _mixes(x.reshape(T, hc * H), fn.double(), EPS)
    pre = torch.sigmoid(m * scale.double() + base.double()) + EPS
    return (pre.unsqueeze(-1) * x).sum(1)


def _close(name, got, ref, tol):
    ok = torch.isclose(got.double(), ref, **tol)
    bad = int((~ok).sum())
    err = float((got.double() - ref).norm() / ref.norm().clamp(min=1e-30))
    print(f"{name}: rel_err={err:.2e} outside_tol={bad}/{ok.numel()}")
    assert torch.isfinite(got).all(), name
    assert bad == 0, f"{name}: {bad} of {ok.numel()} elements outside {tol}, rel err {err:.2e}"


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------
def _weights(H, g, fn_scale=2e-3):
    hc3 = HC * (2 + HC)
    fn = torch.randn(hc3, HC * H, generator=g) * fn_scale
    scale = torch.rand(3, generator=g) * 0.5 + 0.5
    base = torch.randn(hc3, generator=g) * 0.1
    norm_w = (torch.rand(H, generator=g) + 0.5).to(torch.bfloat16)
    return [t.cuda() for t in (fn, scale, base)] + [norm_w.cuda()]


def _residual(T, H, g):
    return torch.randn(T, HC, H, generator=g).to(torch.bfloat16).cuda()


def _mixes_in(T, g):
    """A post_mix / comb_mix pair as the previous pre block leaves them."""
    post = (torch.rand(T, HC, 1, generator=g) * POST_ALPHA).cuda()
    comb = torch.softmax(torch.randn(T, HC, HC, generator=g), -1).cuda()
    return post, comb


def _args(fn, scale, base):
    return (fn, scale, base, EPS, EPS, EPS, POST_ALPHA, SINKHORN)


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fused_norm", [True, False])
@pytest.mark.parametrize("T", [1, 8, 33, 128, 1000])
@pytest.mark.parametrize("H", [4096, 7168])
def test_mhc_pre(mhc, H, T, fused_norm):
    wrappers, _ = mhc
    g = torch.Generator().manual_seed(H + T + fused_norm)
    fn, scale, base, norm_w = _weights(H, g)
    res = _residual(T, H, g)
    nw = norm_w if fused_norm else None
    post, comb, li = wrappers.mhc_pre_tilelang(res, *_args(fn, scale, base), norm_weight=nw,
                                               norm_eps=EPS)
    torch.cuda.synchronize()
    rp, rc, rl = pre_ref(res, fn, scale, base, nw)
    _close(f"pre H={H} T={T} norm={fused_norm} post_mix", post, rp, MIX_TOL)
    _close(f"pre H={H} T={T} norm={fused_norm} comb_mix", comb, rc, MIX_TOL)
    _close(f"pre H={H} T={T} norm={fused_norm} layer_input", li, rl, BF16_TOL)


@pytest.mark.parametrize("T", [1, 100, 1000])
def test_projection_route(mhc, T):
    """Patch 9: with deepinfer_sm80 built, vLLM's pre-block projection below 9.0 runs our
    kernel with DeepGEMM's split count for the A100's 108 SMs, and gives exactly what our op
    gives for that count (the pre-block tests around this one then check the whole block
    against float64 through it). An unpatched tree skips."""
    wrappers, kernels = mhc
    try:
        from vllm.model_executor.kernels.mhc import ampere_prenorm
    except ImportError:
        pytest.skip("the tree has no patch 9 (vllm/model_executor/kernels/mhc/ampere_prenorm.py)")
    from deepinfer_sm80.ops import mhc as op

    H = 4096
    K = HC * H
    assert ampere_prenorm.ampere_prenorm_gemm_serves(K, 24), "the SM80 kernel does not serve"
    g = torch.Generator().manual_seed(70 + T)
    fn = _weights(H, g)[0]
    x = _residual(T, H, g).view(T, K)
    out, sq = wrappers._hc_prenorm_gemm_outputs(x, fn, hidden_size=H, hc_mult=HC)
    splits = kernels.compute_num_split(64, K, -(-T // 64))
    assert splits == op.choose_splits(T, K, A100_SMS) and out.shape == (splits, T, 24)
    want_out, want_sq = op.hc_prenorm_gemm(x, fn, n_splits=splits)
    assert torch.equal(out, want_out) and torch.equal(sq, want_sq)


@pytest.mark.parametrize("T", [1, 8, 128])
def test_mhc_pre_broadcast_first_layer(mhc, T):
    """The first layer's pre block on the (T, H) embedding broadcast to hc streams, with the
    broadcast projection the model derives at load time (fn summed over the streams)."""
    wrappers, _ = mhc
    H = 4096
    g = torch.Generator().manual_seed(50 + T)
    fn, scale, base, norm_w = _weights(H, g)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16).cuda()
    fn_b = fn.view(-1, HC, H).sum(dim=1)
    res, post, comb, li = wrappers.mhc_pre_broadcast_tilelang(
        x, *_args(fn, scale, base), norm_weight=norm_w, norm_eps=EPS, fn_broadcast=fn_b)
    torch.cuda.synchronize()
    full = x.unsqueeze(1).expand(T, HC, H)
    assert torch.equal(res.reshape(T, HC, H), full)
    rp, rc, rl = pre_ref(full, fn, scale, base, norm_w)
    _close(f"broadcast T={T} post_mix", post, rp, MIX_TOL)
    _close(f"broadcast T={T} comb_mix", comb, rc, MIX_TOL)
    _close(f"broadcast T={T} layer_input", li, rl, BF16_TOL)


@pytest.mark.parametrize("T", [1, 8, 128, 1000])
@pytest.mark.parametrize("H", [4096, 7168])
def test_mhc_post(mhc, H, T):
    wrappers, _ = mhc
    g = torch.Generator().manual_seed(70 + H + T)
    res = _residual(T, H, g)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16).cuda()
    post, comb = _mixes_in(T, g)
    out = wrappers.mhc_post_tilelang(x, res, post, comb)
    torch.cuda.synchronize()
    _close(f"post H={H} T={T}", out, post_ref(x, res, post, comb), BF16_TOL)


@pytest.mark.parametrize("T", [1, 4, 7, 32, 33, 128])
@pytest.mark.parametrize("H", [4096, 7168])
def test_mhc_fused_post_pre(mhc, H, T):
    """Post of one sublayer and pre of the next (the fused kernel up to 32 tokens, post +
    split-k GEMM + pre above), with the next sublayer's RMSNorm fused. The fused kernel
    projects the new residual before rounding it to bf16, the separate kernels project the
    bf16 residual they wrote: the reference does the same."""
    wrappers, kernels = mhc
    fused = kernels.mhc_fused_post_pre_split_config(T, H, HC) is not None
    g = torch.Generator().manual_seed(90 + H + T)
    fn, scale, base, norm_w = _weights(H, g)
    res = _residual(T, H, g)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16).cuda()
    post_in, comb_in = _mixes_in(T, g)
    res_cur, post, comb, li = wrappers.mhc_fused_post_pre_tilelang(
        x, res, post_in, comb_in, *_args(fn, scale, base), n_splits=1, tile_n=1,
        norm_weight=norm_w, norm_eps=EPS)
    torch.cuda.synchronize()
    r_res = post_ref(x, res, post_in, comb_in)
    _close(f"fused H={H} T={T} residual", res_cur, r_res, BF16_TOL)
    rp, rc, rl = pre_ref(r_res if fused else res_cur, fn, scale, base, norm_w)
    print(f"fused H={H} T={T}: {'one fused kernel' if fused else 'post, GEMM, pre'}")
    _close(f"fused H={H} T={T} post_mix", post, rp, MIX_TOL)
    _close(f"fused H={H} T={T} comb_mix", comb, rc, MIX_TOL)
    _close(f"fused H={H} T={T} layer_input", li, rl, BF16_TOL)


@pytest.mark.parametrize("T", [1, 4, 8, 128, 1000])
@pytest.mark.parametrize("H", [4096, 7168])
def test_hc_head(mhc, H, T):
    wrappers, _ = mhc
    g = torch.Generator().manual_seed(110 + H + T)
    res = _residual(T, H, g)
    fn = (torch.randn(HC, HC * H, generator=g) * 2e-3).cuda()
    scale = (torch.rand(1, generator=g) * 0.5 + 0.5).cuda()
    base = (torch.randn(HC, generator=g) * 0.1).cuda()
    out = wrappers.hc_head_fused_kernel_tilelang(res, fn, scale, base, EPS, EPS)
    torch.cuda.synchronize()
    _close(f"hc_head H={H} T={T}", out, hc_head_ref(res, fn, scale, base), BF16_TOL)


# ---------------------------------------------------------------------------
# DeepSeek-V4.1: the delayed pre block (the collapse uses the pre-mix the previous sublayer
# carried in; the model's entry takes residual stream 0 and projects the (T, H) embedding)
# ---------------------------------------------------------------------------
V41_H = 5120  # DeepSeek-V4.1-Flash


def pre_delayed_ref(residual, fn, scale, base, pre_mix=None, x=None, norm_weight=None):
    """(post_mix [T, hc, 1], comb_mix, layer_input, next_pre_mix [T, hc]) in float64."""
    T, hc, H = residual.shape
    proj = residual.double().reshape(T, hc * H) if x is None else x
    pre, post, comb = mix_coefficients(proj, fn, scale, base, hc)
    li = (residual[:, 0].double() if pre_mix is None
          else (pre_mix.double().unsqueeze(-1) * residual.double()).sum(1))
    if norm_weight is not None:
        li = _rmsnorm_bf16_input(li, norm_weight, EPS)
    return post.unsqueeze(-1), comb, li, pre


def _carried_pre_mix(T, g):
    return (torch.sigmoid(torch.randn(T, HC, generator=g)) + EPS).cuda()


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("entry", ["embedding", "carried"])
@pytest.mark.parametrize("T", [1, 8, 128, 1000])
def test_v41_mhc_pre_delayed(mhc, T, entry, norm):
    wrappers, _ = mhc
    H = V41_H
    g = torch.Generator().manual_seed(130 + T + 2 * norm + (entry == "carried"))
    fn, scale, base, norm_w = _weights(H, g)
    nw = norm_w if norm else None
    if entry == "embedding":
        x = torch.randn(T, H, generator=g).to(torch.bfloat16).cuda()
        res = x.unsqueeze(1).expand(T, HC, H).contiguous()
        fn_in, pre_in = fn.view(-1, HC, H).sum(dim=1).contiguous(), None
    else:
        x, res, fn_in, pre_in = None, _residual(T, H, g), fn, _carried_pre_mix(T, g)
    post, comb, li, nxt = wrappers.mhc_pre_delayed_tilelang(
        res, *_args(fn_in, scale, base), pre_mix=pre_in, x=x, norm_weight=nw, norm_eps=EPS)
    torch.cuda.synchronize()
    rp, rc, rl, rn = pre_delayed_ref(res, fn_in, scale, base, pre_in, x, nw)
    name = f"v41 pre T={T} {entry} norm={norm}"
    _close(f"{name} post_mix", post, rp, MIX_TOL)
    _close(f"{name} comb_mix", comb, rc, MIX_TOL)
    _close(f"{name} next_pre_mix", nxt, rn, MIX_TOL)
    _close(f"{name} layer_input", li, rl, BF16_TOL)


@pytest.mark.parametrize("capture_aux", [False, True])
@pytest.mark.parametrize("T", [1, 7, 32, 33, 128])
def test_v41_mhc_fused_post_pre_delayed(mhc, T, capture_aux):
    """V4.1's shifted post + pre on SM80 (overlap and Mega-mHC need family 100): post, then
    the delayed pre on the new residual with the carried pre-mix and the fused RMSNorm;
    the draft models' stream mean (aux) when asked for."""
    wrappers, kernels = mhc
    H = V41_H
    fused = kernels.mhc_fused_post_pre_split_config(T, H, HC) is not None
    g = torch.Generator().manual_seed(150 + T + capture_aux)
    fn, scale, base, norm_w = _weights(H, g)
    res = _residual(T, H, g)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16).cuda()
    post_in, comb_in = _mixes_in(T, g)
    pre_in = _carried_pre_mix(T, g)
    res_cur, post, comb, li, nxt, aux = wrappers.mhc_fused_post_pre_delayed_tilelang(
        x, res, post_in, comb_in, *_args(fn, scale, base), pre_mix=pre_in,
        norm_weight=norm_w, norm_eps=EPS, capture_aux=capture_aux)
    torch.cuda.synchronize()
    r_res = post_ref(x, res, post_in, comb_in)
    name = f"v41 fused T={T} ({'one fused kernel' if fused else 'post, GEMM, pre'})"
    _close(f"{name} residual", res_cur, r_res, BF16_TOL)
    rp, rc, rl, rn = pre_delayed_ref(r_res if fused else res_cur, fn, scale, base, pre_in,
                                     None, norm_w)
    _close(f"{name} post_mix", post, rp, MIX_TOL)
    _close(f"{name} comb_mix", comb, rc, MIX_TOL)
    _close(f"{name} next_pre_mix", nxt, rn, MIX_TOL)
    _close(f"{name} layer_input", li, rl, BF16_TOL)
    if capture_aux:
        _close(f"{name} aux", aux, r_res.mean(dim=1), BF16_TOL)
    else:
        assert aux.numel() == 0
