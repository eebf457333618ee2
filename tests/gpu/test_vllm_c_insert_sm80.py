"""vLLM's own SWA writer, run as SM80 code: ``fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert``
and ``fused_deepseek_v4_kv_rope_insert`` (``csrc/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu``
of the applied tree), built by ``tests/vllm_c_ops.py``.

On SM8x every DeepSeek-V4/V4.1 attention layer calls the first op before anything of ours
runs: it writes the padded, RMS-normed, rotated Q the Ampere attention reads, and the
584-byte SWA records our gather and decode read. Built for sm_80 its e4m3 conversion is
cuda_fp8.h's software path. Checked here:

- the SM80 build (compute_80, reporting capability 8.0, so launched as on an A100) against
  the SM90 build vLLM runs on Hopper, on the same inputs, bit for bit (Q and every cache
  byte; needs a 9.0+ GPU, skipped on an A100 with the reason);
- the SM80 build against the semantics: Q within bf16 rounding of a float64 RMSNorm + GPT-J
  RoPE; the cache bytes equal to the torch record oracle (``deepinfer_sm80.reference.cache``)
  fed the rotated RoPE values the op wrote, which also shows every other byte untouched;
- the KV-only op equal to the fused op's KV half, and our extension's
  ``quantize_and_insert_k_cache`` equal to vLLM's writer on the same rows.

Fresh random inputs per run (the seed is printed); caches poisoned with random bytes.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import vllm_c_ops  # noqa: E402
from deepinfer_sm80.reference import cache as RC  # noqa: E402

DEV = "cuda"
EPS = 1e-6
MAX_POS = 8192


@pytest.fixture(scope="module")
def libs():
    return vllm_c_ops.load_for_tests("dsv4_insert")


def _cos_sin() -> torch.Tensor:
    """[MAX_POS, 64] float32: cos of the 32 frequencies, then their sin (vLLM's layout)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    ang = torch.arange(MAX_POS, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=1).float()


def _rows(n: int, width: int, g: torch.Generator, special: bool) -> torch.Tensor:
    """bf16 rows whose 64-wide groups span magnitudes 1e-6..1e4 (below the writer's 1e-4
    absmax floor, and far above 448); with ``special``, a zero group, an exact 448 * 2^-5
    group maximum, and inf / NaN values."""
    x = torch.randn(n, width, generator=g)
    mag = 10 ** (torch.rand(n, width // 64, generator=g) * 10 - 6)
    x = x * mag.repeat_interleave(64, dim=1)
    if special and n > 4:
        x[0, :64] = 0
        x[1, 64:128] = 448.0 * 2.0**-5 * torch.rand(64, generator=g)
        x[1, 70] = -448.0 * 2.0**-5
        x[2, 5] = float("inf")
        x[3, 200] = float("nan")
        x[4, 470] = -float("inf")
    return x.bfloat16()


def _stride(bs: int) -> int:
    return (bs * 584 + 575) // 576 * 576


# name: (tokens, tokens with a slot, live Q heads, padded Q heads, block size, q norm)
CASES = {
    "v4flash-tp8-decode": (6, 6, 8, 8, 64, True),       # 64 heads / TP8; 1 + 5 MTP rows
    "v4pro-tp8-decode": (12, 12, 16, 16, 64, True),     # 128 heads / TP8
    "pad-heads": (5, 5, 6, 8, 64, True),                # zero-filled pad slots
    "all-heads": (3, 3, 64, 64, 64, True),
    "dp-padding": (40, 33, 8, 8, 64, True),             # rows past slot_mapping: Q only
    "prefill-reduced-grid": (1500, 1500, 16, 16, 64, True),  # >= 1024 rows: the other kernel
    "v41-no-qnorm": (7, 7, 8, 8, 64, False),            # V4.1: qr normed before wq_b
    "block128": (64, 60, 8, 16, 128, True),
}


def _inputs(case, g, special):
    n, n_ins, h, hp, bs, norm = CASES[case]
    nb = max(4, (n_ins * 3) // bs + 2)
    q = _rows(n * h, 512, g, False).view(n, h, 512)
    kv = _rows(n, 512, g, special)
    slots = torch.randperm(nb * bs, generator=g)[:n_ins]
    if n_ins > 3:
        slots[torch.randperm(n_ins, generator=g)[: max(1, n_ins // 8)]] = -1
    pos = torch.randint(0, MAX_POS, (n,), generator=g)
    stride = _stride(bs)
    poison = torch.randint(0, 256, (nb * stride,), dtype=torch.uint8, generator=g)
    return dict(q=q, kv=kv, slots=slots, pos=pos, poison=poison, nb=nb, bs=bs, hp=hp, norm=norm,
                stride=stride)


def _run_fused(lib, d, cos_sin):
    cache = d["poison"].to(DEV).view(d["nb"], d["stride"])
    q_out = lib.qnorm_rope_kv_rope_quant_insert(
        d["q"].to(DEV), d["kv"].to(DEV), cache, d["slots"].to(DEV), d["pos"].to(DEV),
        cos_sin.to(DEV), d["hp"], EPS, d["bs"], apply_q_norm=d["norm"])
    torch.cuda.synchronize()
    return q_out.cpu(), cache.view(-1).cpu()


def _q_reference(q: torch.Tensor, pos: torch.Tensor, cos_sin: torch.Tensor, norm: bool,
                 hp: int) -> torch.Tensor:
    """float64 [n, hp, 512]: RMSNorm without weight (optional), GPT-J RoPE on dims 448..511
    (pair k rotated by cos_sin[pos, k], cos_sin[pos, 32 + k]), zero pad heads."""
    x = q.double()
    if norm:
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    x = _rope64(x, pos, cos_sin)
    out = torch.zeros(q.size(0), hp, 512, dtype=torch.float64)
    out[:, : q.size(1)] = x
    return out


def _rope64(x: torch.Tensor, pos: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """GPT-J RoPE of the last 64 dims of float64 ``x`` ([n, ..., 512]) at positions ``pos``."""
    c = cos_sin[pos].double()
    cos, sin = c[:, :32], c[:, 32:]
    shape = (x.size(0),) + (1,) * (x.dim() - 2) + (32,)
    cos, sin = cos.view(shape), sin.view(shape)
    x = x.clone()
    ev, od = x[..., 448::2].clone(), x[..., 449::2].clone()
    x[..., 448::2] = ev * cos - od * sin
    x[..., 449::2] = ev * sin + od * cos
    return x


def _assert_bf16_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Within bf16 rounding of the float64 value (2^-8 relative) plus a floor of 1e-6 of the
    row's largest magnitude (fp32 cancellation in the rotation)."""
    got = got.double()
    floor = 1e-6 * want.abs().amax(dim=-1, keepdim=True)
    bad = (got - want).abs() > want.abs() * 2.0**-8 + floor
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} elements outside bf16 "
                           f"rounding; first at {tuple(bad.nonzero()[0].tolist())}: got "
                           f"{got[bad][0].item()!r}, want {want[bad][0].item()!r}")


def _records(cache_flat: torch.Tensor, slots: torch.Tensor, bs: int, stride: int):
    """(data [n, 576], scales [n, 8]) of the given slots."""
    d_off, s_off = RC.record_offsets(slots // bs, slots % bs, bs, stride)
    data = cache_flat[d_off[:, None] + torch.arange(576)]
    scales = cache_flat[s_off[:, None] + torch.arange(8)]
    return data, scales


def test_sm80_build_reports_ampere(libs):
    assert libs["sm80"].reported_capability() == 80


@pytest.mark.parametrize("case", sorted(CASES))
def test_sm80_build_equals_sm90_build(libs, case, rng):
    if "sm90" not in libs:
        pytest.skip("the SM90 build needs a 9.0+ GPU (this one is "
                    f"{torch.cuda.get_device_capability()})")
    d = _inputs(case, rng, special=True)
    cos_sin = _cos_sin()
    q80, c80 = _run_fused(libs["sm80"], d, cos_sin)
    q90, c90 = _run_fused(libs["sm90"], d, cos_sin)
    assert torch.equal(q80.view(torch.int16), q90.view(torch.int16)), "Q differs"
    diff = (c80 != c90).nonzero().flatten()
    assert diff.numel() == 0, (f"{diff.numel()} cache bytes differ, first at byte "
                               f"{diff[:1].tolist()} (sm80 {c80[diff[:4]].tolist()}, sm90 "
                               f"{c90[diff[:4]].tolist()})")
    assert not torch.equal(c80, d["poison"]), "nothing was written"


@pytest.mark.parametrize("case", sorted(CASES))
def test_sm80_build_against_reference(libs, case, rng):
    d = _inputs(case, rng, special=False)
    cos_sin = _cos_sin()
    q_out, cache = _run_fused(libs["sm80"], d, cos_sin)
    _assert_bf16_close(q_out, _q_reference(d["q"], d["pos"], cos_sin, d["norm"], d["hp"]), "Q")
    # KV: RoPE values within bf16 rounding of float64 ...
    n_ins = d["slots"].numel()
    live = (d["slots"] >= 0).nonzero().flatten()
    slots = d["slots"][live]
    data, _ = _records(cache, slots, d["bs"], d["stride"])
    rope_got = data[:, 448:].contiguous().view(torch.bfloat16)
    rope_want = _rope64(d["kv"][:n_ins][live].double(), d["pos"][:n_ins][live], cos_sin)[:, 448:]
    _assert_bf16_close(rope_got, rope_want, "KV RoPE")
    # ... and every cache byte as the record oracle writes rows [NoPE input | those RoPE
    # values] into the poisoned cache: codes, scales, pad byte, and nothing else touched.
    rows = d["kv"][:n_ins].clone()
    rows[live, 448:] = rope_got
    want = d["poison"].clone()
    RC.quantize_and_insert_k_cache(rows, want.view(d["nb"], d["stride"]), d["slots"], d["bs"])
    diff = (cache != want).nonzero().flatten()
    assert diff.numel() == 0, (f"{diff.numel()} cache bytes differ from the record oracle, "
                               f"first at byte {diff[:1].tolist()}")


@pytest.mark.parametrize("case", ["v4flash-tp8-decode", "dp-padding", "prefill-reduced-grid",
                                  "block128"])
def test_kv_only_op_equals_fused_kv_half(libs, case, rng):
    d = _inputs(case, rng, special=True)
    cos_sin = _cos_sin()
    _, fused = _run_fused(libs["sm80"], d, cos_sin)
    flat = d["poison"].to(DEV)
    cache3 = torch.as_strided(flat, (d["nb"], d["bs"], 584), (d["stride"], 584, 1))
    libs["sm80"].kv_rope_insert(d["kv"].to(DEV), cache3, d["slots"].to(DEV), d["pos"].to(DEV),
                                cos_sin.to(DEV), d["bs"])
    torch.cuda.synchronize()
    assert torch.equal(flat.cpu(), fused)


@pytest.mark.parametrize("case", ["v4flash-tp8-decode", "prefill-reduced-grid", "block128"])
def test_our_insert_kernel_equals_vllm_writer(ext, libs, case, rng):
    """deepinfer_sm80's quantize_and_insert_k_cache, given the rows vLLM's writer quantised
    (NoPE input, RoPE as written), writes the same bytes."""
    from deepinfer_sm80.ops import cache as OC

    d = _inputs(case, rng, special=True)
    cos_sin = _cos_sin()
    _, theirs = _run_fused(libs["sm80"], d, cos_sin)
    n_ins = d["slots"].numel()
    live = (d["slots"] >= 0).nonzero().flatten()
    rows = d["kv"][:n_ins].clone()
    data, _ = _records(theirs, d["slots"][live], d["bs"], d["stride"])
    rows[live, 448:] = data[:, 448:].contiguous().view(torch.bfloat16)
    ours = d["poison"].to(DEV)
    OC.quantize_and_insert_k_cache(rows.to(DEV), ours.view(d["nb"], d["stride"]),
                                   d["slots"].to(DEV), d["bs"])
    torch.cuda.synchronize()
    diff = (ours.cpu() != theirs).nonzero().flatten()
    assert diff.numel() == 0, f"{diff.numel()} bytes differ, first at {diff[:1].tolist()}"
