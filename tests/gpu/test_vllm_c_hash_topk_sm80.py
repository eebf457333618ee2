"""DeepSeek-V4's hash-layer MoE router, vLLM's compiled ``topk_hash_softplus_sqrt``
(``csrc/moe/topk_softplus_sqrt_kernels.cu``, its V4 kernel ``dsv4HashTopkSoftplusSqrt``),
run as SM80 code (``tests/vllm_c_ops.py``, source ``dsv4_hash_topk``).

V4's first MoE layers route each token by a token -> 6 experts table; on SM8x they reach this
kernel through ``fused_topk_bias`` (the fp32 logits of 256 or 384 experts, top-6,
renormalised). Its launcher sets the PDL launch attribute whatever the device; the harness
reports any launch error. Checked here, on fresh random inputs (the seed is printed):

- the SM80 build against the SM90 build, bit for bit (weights and expert ids; needs a 9.0+
  GPU, skipped on an A100 with the reason);
- the SM80 build against the semantics, in float64: text tokens take ``tid2eid[token]`` in
  table order with weights sqrt(softplus(logit)), renormalised and scaled; padding rows get
  expert -1 and weight 0; with the vision bias, image tokens (five sentinel ids) take the
  top-6 of sqrt(softplus) + ``bias_vl`` instead.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import vllm_c_ops  # noqa: E402

DEV = "cuda"
VOCAB = 129280
SENTINEL = 128000  # image sentinel ids: SENTINEL .. SENTINEL + 4


@pytest.fixture(scope="module")
def libs():
    return vllm_c_ops.load_for_tests("dsv4_hash_topk")


# name: (tokens, experts, table dtype, with padding rows, with vision bias, scale)
CASES = {
    "flash-decode": (8, 256, torch.int32, False, False, 1.5),
    "flash-prefill-padded": (3000, 256, torch.int32, True, False, 1.5),
    "pro-decode": (6, 384, torch.int32, True, False, 2.5),
    "pro-prefill": (1029, 384, torch.int32, False, False, 2.5),
    "int64-table": (77, 256, torch.int64, True, False, 1.0),
    "vision-flash": (500, 256, torch.int32, True, True, 1.5),
    "vision-pro": (400, 384, torch.int64, False, True, 2.5),
}


def _inputs(case: str, g: torch.Generator) -> dict:
    t, e, dt, padding, vision, scale = CASES[case]
    gating = torch.randn(t, e, generator=g) * 4
    gating[: min(t, 3), :5] = torch.tensor([-40.0, 25.0, 0.0, -0.0, 19.99])  # both softplus forms
    tid2eid = torch.randint(0, e, (VOCAB, 6), generator=g).to(dt)
    ids = torch.randint(0, VOCAB, (t,), generator=g)
    if vision:
        img = torch.rand(t, generator=g) < 0.4
        ids[img] = SENTINEL + torch.randint(0, 5, (int(img.sum()),), generator=g)
        ids[: min(t, 2)] = torch.tensor([SENTINEL + 5, SENTINEL - 1])[: min(t, 2)]  # not image
    pad = (torch.rand(t, generator=g) < 0.1) if padding else None
    bias_vl = (torch.rand(e, generator=g) - 0.5) if vision else None
    return dict(gating=gating, tid2eid=tid2eid, ids=ids.to(dt), pad=pad, bias_vl=bias_vl,
                scale=scale, e=e)


def _run(lib, d):
    def dev(x):
        return None if x is None else x.to(DEV)

    w, i = lib.topk_hash_softplus_sqrt(
        dev(d["gating"]), dev(d["tid2eid"]), dev(d["ids"]), routed_scaling_factor=d["scale"],
        is_padding=dev(d["pad"]), bias_vl=dev(d["bias_vl"]),
        image_sentinel_lo=SENTINEL if d["bias_vl"] is not None else 0)
    torch.cuda.synchronize()
    return w.cpu(), i.cpu().to(torch.int64)


def _sqrt_softplus(gating: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's weight sqrt(max(x, 0) + log(1 + exp(-|x|))) in float64, with the fp32
    rounding of 1 + exp(-|x|) it performs, and a bound on the kernel's error: ``__logf``
    is off by up to ~3.6e-7 absolute on [1, 2] (CUDA guide: 2^-21.41), ``__expf`` and the
    fp32 sum add ~1e-7; sqrt turns an error dv into at most min(sqrt(dv), dv / (2 sqrt(v)))
    (an argument below the error may come out negative: NaN, which the kernel maps to 0)."""
    x = gating.double()
    one_plus = (1.0 + torch.exp(-x.abs())).float().double()
    v = x.clamp(min=0) + torch.log(one_plus)
    w = torch.sqrt(v)
    dv = 5e-7 + 2e-7 * v
    dw = torch.minimum(torch.sqrt(dv), dv / (2 * torch.sqrt(v).clamp(min=1e-30)))
    return w, dw


def test_sm80_build_equals_sm90_build(libs, rng):
    if "sm90" not in libs:
        pytest.skip("the SM90 build needs a 9.0+ GPU (this one is "
                    f"{torch.cuda.get_device_capability()})")
    for case in CASES:
        d = _inputs(case, rng)
        w80, i80 = _run(libs["sm80"], d)
        w90, i90 = _run(libs["sm90"], d)
        assert torch.equal(i80, i90), case
        assert torch.equal(w80.view(torch.int32), w90.view(torch.int32)), case


@pytest.mark.parametrize("case", sorted(CASES))
def test_sm80_build_against_reference(libs, case, rng):
    d = _inputs(case, rng)
    w, ids = _run(libs["sm80"], d)
    t = d["gating"].size(0)
    vals, dvals = _sqrt_softplus(d["gating"])                      # [t, e] float64
    tok = d["ids"].to(torch.int64)
    want_ids = d["tid2eid"][tok].to(torch.int64)                    # table order
    near_tie = torch.zeros(t, dtype=torch.bool)
    if d["bias_vl"] is not None:
        image = (tok >= SENTINEL) & (tok < SENTINEL + 5)
        sels = vals + d["bias_vl"].double()
        order = torch.sort(sels, dim=1, descending=True, stable=True)
        want_ids[image] = order.indices[image, :6]
        # rows whose 6th and 7th choices are closer than the kernel's error can separate
        # are checked for their weights only
        err67 = torch.gather(dvals, 1, order.indices[:, 5:7]).sum(dim=1)
        near_tie = image & (order.values[:, 5] - order.values[:, 6] <= err67 + 1e-6)
        assert int(near_tie.sum()) <= max(2, int(image.sum()) // 20)
    pad = d["pad"] if d["pad"] is not None else torch.zeros(t, dtype=torch.bool)
    want_ids[pad] = -1
    check = ~near_tie
    assert torch.equal(ids[check], want_ids[check]), (
        f"{int((ids != want_ids).any(dim=1)[check].sum())} rows with other experts")
    # weights: w_i * scale / sum_j w_j, the error bound carried through the normalisation
    idx = want_ids.clamp(min=0)
    sel, dsel = torch.gather(vals, 1, idx), torch.gather(dvals, 1, idx)
    sel[pad], dsel[pad] = 0, 0
    tot, dtot = sel.sum(dim=1, keepdim=True), dsel.sum(dim=1, keepdim=True)
    safe = torch.where(tot > 0, tot, torch.ones_like(tot))
    want_w = sel * d["scale"] / safe
    bound = 1.5 * d["scale"] * (dsel + sel * dtot / safe) / safe + 1e-6 * want_w.abs()
    got = w.double()
    ok = (got - want_w).abs() <= bound
    ok[near_tie] = True
    assert ok.all(), (f"{int((~ok).sum())} weights off; first at "
                      f"{tuple((~ok).nonzero()[0].tolist())}: got {got[~ok][0].item()!r}, "
                      f"want {want_w[~ok][0].item()!r} +- {bound[~ok][0].item()!r}")
    assert (w[pad] == 0).all() and (ids[pad] == -1).all()
    assert not math.isnan(float(w.sum()))
