# SPDX-License-Identifier: Apache-2.0
"""CPU checks of the sparse MLA attention references (the oracles of the GPU tests).

Each reference is compared with an independent, deliberately naive per-query loop and with
closed-form identities (sink factor, lonely queries), on fresh random inputs."""

from __future__ import annotations

import math
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

_OVERLAY = pathlib.Path(__file__).resolve().parents[1] / "overlay"
if str(_OVERLAY) not in sys.path:
    sys.path.insert(0, str(_OVERLAY))

from deepinfer_sm80.reference import attention as ref  # noqa: E402

SCALE = 512**-0.5


def _fresh_seed() -> int:
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(
        int.from_bytes(__import__("os").urandom(4), "little"))).item())
    torch.manual_seed(seed)
    return seed


def _make_cache(num_blocks: int, block_size: int, pad: int = 64) -> torch.Tensor:
    """A paged cache whose block stride exceeds block_size*584 (as upstream pads it)."""
    stride = block_size * ref.RECORD_BYTES + pad
    storage = torch.randint(0, 256, (num_blocks * stride,), dtype=torch.uint8)
    return torch.as_strided(storage, (num_blocks, block_size, ref.RECORD_BYTES), (stride, ref.RECORD_BYTES, 1))


def test_e4m3_decode_all_codes():
    codes = torch.arange(256, dtype=torch.uint8)
    mine = ref.decode_e4m3(codes)
    theirs = codes.view(torch.float8_e4m3fn).to(torch.float64)
    nan = torch.isnan(theirs)
    assert torch.equal(torch.isnan(mine), nan)
    assert nan.sum() == 2
    assert torch.equal(mine[~nan], theirs[~nan])


def test_pack_read_roundtrip_padded_stride():
    seed = _fresh_seed()
    bs, nb = 16, 5
    cache = _make_cache(nb, bs)
    flat_b = torch.as_strided(cache, (nb * cache.stride(0),), (1,)).clone()
    n = 23
    slots = torch.randperm(nb * bs)[:n]
    kv = torch.randn(n, 512) * torch.exp2(torch.randint(-6, 6, (n, 1)).float())
    ref.pack_fp8_ds_mla(kv, slots, cache)
    got = ref.read_fp8_ds_mla_rows(cache, slots)
    # independent quantisation: the group scale is a power of two >= absmax/448
    nope = kv[:, :448].double().reshape(n, 7, 64)
    e = torch.ceil(torch.log2(nope.abs().amax(-1) / 448.0))
    q8 = (nope / torch.exp2(e)[..., None]).float().to(torch.float8_e4m3fn).double()
    want = torch.cat([(q8 * torch.exp2(e)[..., None]).reshape(n, 448),
                      kv[:, 448:].to(torch.bfloat16).double()], 1)
    assert torch.equal(got, want), f"seed {seed}"
    # quantisation error is what e4m3 allows (relative 2^-4 per element, groupwise)
    assert ((got[:, :448] - kv[:, :448].double()).abs() <= nope.abs().amax(-1).repeat_interleave(64, 1) / 16).all()
    # bytes outside the written records (block padding, other slots) are untouched
    flat_a = torch.as_strided(cache, (nb * cache.stride(0),), (1,))
    changed = (flat_a != flat_b).nonzero().flatten()
    blocks = changed // cache.stride(0)
    off = changed % cache.stride(0)
    pos_data = off // 576
    in_data = off < bs * 576
    pos = torch.where(in_data, pos_data, (off - bs * 576) // 8)
    written = set((slots // bs * bs + slots % bs).tolist())
    assert set((blocks * bs + pos).tolist()) <= written
    assert (off < bs * 584).all()


def _naive_attend(q_rows, keys, sink, scale):
    """q_rows [H, D] float64, keys list of [D] float64 -> (out [H, D], lse [H])."""
    h, d = q_rows.shape
    out = torch.zeros(h, d, dtype=torch.float64)
    lse = torch.full((h,), math.inf, dtype=torch.float64)
    if not keys:
        return out, lse
    k = torch.stack(keys)
    for hh in range(h):
        s = [float(q_rows[hh] @ kk) * scale for kk in k]
        m = max(s)
        w = [math.exp(x - m) for x in s]
        z = sum(w)
        lse[hh] = m + math.log(z)
        den = z + (math.exp(float(sink[hh]) - m) if sink is not None else 0.0)
        out[hh] = sum(wi * kk for wi, kk in zip(w, k)) / den
    return out, lse


@pytest.mark.parametrize("swa_only", [False, True])
@pytest.mark.parametrize("sink_kind", ["finite", "neg_inf", "none", "pos_inf"])
def test_decode_reference_matches_naive_loop(swa_only, sink_kind):
    seed = _fresh_seed()
    t, h = 5, 3
    bs_w, bs_c = 8, 4
    cache_w = _make_cache(6, bs_w)
    cache_c = _make_cache(9, bs_c)
    nw, nc = 6 * bs_w, 9 * bs_c
    ref.pack_fp8_ds_mla(torch.randn(nw, 512), torch.arange(nw), cache_w)
    ref.pack_fp8_ds_mla(torch.randn(nc, 512), torch.arange(nc), cache_c)
    q = torch.randn(t, 1, h, 512).to(torch.bfloat16)
    wi = torch.randint(0, nw, (t, 7), dtype=torch.int32)
    wi[:, 2] = -1
    wl = torch.tensor([7, 0, 3, 1, 5], dtype=torch.int32)
    ci = torch.randint(0, nc, (t, 10), dtype=torch.int32)
    ci[:, -3:] = -1
    cl = torch.tensor([10, 0, 4, 0, 8], dtype=torch.int32)
    if swa_only:
        cl = None
    sink = {
        "finite": torch.randn(h),
        "neg_inf": torch.full((h,), -math.inf),
        "pos_inf": torch.full((h,), math.inf),
        "none": None,
    }[sink_kind]
    out, lse = ref.sparse_mla_decode_ref(
        q, cache_w, wi, wl, None if swa_only else cache_c, None if swa_only else ci, cl, sink, SCALE)
    assert out.dtype == torch.float64 and out.shape == (t, 1, h, 512) and lse.shape == (t, h, 1)
    for tt in range(t):
        keys = [ref.read_fp8_ds_mla_rows(cache_w, torch.tensor([int(s)]))[0]
                for j, s in enumerate(wi[tt].tolist()) if j < wl[tt] and s >= 0]
        if not swa_only:
            keys += [ref.read_fp8_ds_mla_rows(cache_c, torch.tensor([int(s)]))[0]
                     for j, s in enumerate(ci[tt].tolist()) if j < cl[tt] and s >= 0]
        o, l = _naive_attend(q[tt, 0].double(), keys, sink, SCALE)
        if sink_kind == "pos_inf":
            o = torch.zeros_like(o)
        torch.testing.assert_close(out[tt, 0], o, rtol=1e-12, atol=1e-12, msg=f"seed {seed} token {tt}")
        torch.testing.assert_close(lse[tt, :, 0], l, rtol=1e-12, atol=1e-12)
    # token 1 has no entry at all: zero output, lse = +inf
    assert (out[1] == 0).all() and torch.isposinf(lse[1]).all()


def test_decode_fp32_variant_close_to_fp64():
    _fresh_seed()
    t, h = 4, 8
    cache = _make_cache(4, 16)
    ref.pack_fp8_ds_mla(torch.randn(64, 512), torch.arange(64), cache)
    q = torch.randn(t, 1, h, 512).to(torch.bfloat16)
    idx = torch.randint(0, 64, (t, 40), dtype=torch.int32)
    lens = torch.full((t,), 40, dtype=torch.int32)
    sink = torch.randn(h)
    o64, l64 = ref.sparse_mla_decode_ref(q, cache, idx, lens, None, None, None, sink, SCALE)
    o32, l32 = ref.sparse_mla_decode_ref(q, cache, idx, lens, None, None, None, sink, SCALE,
                                         compute_dtype=torch.float32)
    assert o32.dtype == torch.float32
    err = (o32.double() - o64).norm() / o64.norm()
    assert 0 < err < 1e-5
    torch.testing.assert_close(l32.double(), l64, rtol=1e-5, atol=1e-5)


def test_sink_is_a_denominator_term():
    """out(sink) = out(no sink) / (1 + exp(sink - lse)) for every token and head."""
    _fresh_seed()
    t, h, s_kv = 6, 4, 50
    q = torch.randn(t, h, 512).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, 512).to(torch.bfloat16)
    idx = torch.randint(0, s_kv, (t, 1, 16), dtype=torch.int32)
    sink = torch.randn(h) * 3
    o0, _, lse0 = ref.sparse_mla_prefill_ref(q, kv, idx, None, None, SCALE)
    o1, _, lse1 = ref.sparse_mla_prefill_ref(q, kv, idx, None, sink, SCALE)
    assert torch.equal(lse0, lse1)  # the sink does not enter lse
    factor = 1.0 / (1.0 + torch.exp(sink.double()[None, :] - lse0))
    torch.testing.assert_close(o1, o0 * factor[..., None], rtol=1e-12, atol=1e-14)
    assert not torch.allclose(o1, o0)


def test_prefill_reference_matches_naive_loop():
    seed = _fresh_seed()
    t, h, s_kv, k = 7, 5, 33, 12
    q = torch.randn(t, h, 512).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, 512).to(torch.bfloat16)
    idx = torch.randint(-2, s_kv + 3, (t, 1, k), dtype=torch.int32)  # some < 0, some >= s_kv
    lens = torch.randint(0, k + 1, (t,), dtype=torch.int32)
    lens[0] = 0
    sink = torch.randn(h)
    out, mx, lse = ref.sparse_mla_prefill_ref(q, kv, idx, lens, sink, SCALE)
    for tt in range(t):
        keys = [kv[i, 0].double() for j, i in enumerate(idx[tt, 0].tolist()) if j < lens[tt] and 0 <= i < s_kv]
        o, l = _naive_attend(q[tt].double(), keys, sink, SCALE)
        torch.testing.assert_close(out[tt], o, rtol=1e-12, atol=1e-12, msg=f"seed {seed} token {tt}")
        torch.testing.assert_close(lse[tt], l, rtol=1e-12, atol=1e-12)
        if keys:
            m = torch.tensor([[float(q[tt, hh].double() @ kk) * SCALE for kk in keys] for hh in range(h)], dtype=torch.float64).amax(1)
            torch.testing.assert_close(mx[tt], m.double(), rtol=1e-12, atol=1e-12)
        else:
            assert torch.isneginf(mx[tt]).all()
    assert (out[0] == 0).all() and torch.isposinf(lse[0]).all()
