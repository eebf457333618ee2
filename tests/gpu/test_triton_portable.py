"""Portable Triton gather (software e4m3) on a GPU: bit-exact against the torch reference
(``deepinfer_sm80.reference.cache``) and against upstream's Triton kernel when a vLLM tree
is available, on fresh random inputs, with outputs poisoned before every run."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)
pytest.importorskip("triton", reason="needs triton")

ROOT = pathlib.Path(__file__).resolve().parents[2]
for _p in (ROOT / "overlay", ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from deepinfer_sm80.triton_portable import dequantize_and_gather_k_cache as portable_gather  # noqa: E402

pytestmark = pytest.mark.gpu

ENTRY, DATA = 584, 576
POISON = -0x0001  # int16 0xFFFF: a bf16 NaN no correct lane produces (NaN codes excluded)


def _seed() -> int:
    s = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    print(f"seed={s}")
    return s


def _stride(bs: int) -> int:
    return -(-(bs * ENTRY) // DATA) * DATA


def _cache(nb: int, bs: int, g: torch.Generator, nan_codes: bool = False) -> torch.Tensor:
    c = torch.randint(0, 256, (nb, _stride(bs)), dtype=torch.uint8, device="cuda", generator=g)
    d = c[:, : bs * DATA].view(nb, bs, DATA)
    if not nan_codes:
        f = d[:, :, :448]
        f.sub_(((f & 0x7F) == 0x7F).to(torch.uint8))
    rope = torch.randn(nb, bs, 64, device="cuda", generator=g).to(torch.bfloat16)
    d[:, :, 448:].copy_(rope.view(torch.uint8).view(nb, bs, 128))
    s = c[:, bs * DATA: bs * ENTRY].view(nb, bs, 8)
    s[:, :, :7] = torch.randint(100, 150, (nb, bs, 7), dtype=torch.uint8, device="cuda", generator=g)
    s[:, :, 7] = 0
    return c


def _naive(out, k_cache, seq_lens, gather_lens, block_table, bs, offset):
    """Independent per-entry oracle written from the semantics (small cases only)."""
    out = out.clone()
    f8 = torch.float8_e4m3fn
    for r in range(seq_lens.shape[0]):
        s = int(seq_lens[r])
        g = s if gather_lens is None else int(gather_lens[r])
        for i in range(g):
            pos = s - g + i
            page = k_cache[int(block_table[r, pos // bs])]
            slot = pos % bs
            e = page[slot * DATA:(slot + 1) * DATA]
            sc = page[bs * DATA + slot * 8: bs * DATA + slot * 8 + 7].to(torch.float64)
            vals = e[:448].view(f8).to(torch.float64).view(7, 64) * torch.exp2(sc - 127)[:, None]
            out[r, offset + i, :448] = vals.reshape(448).to(torch.bfloat16)
            out[r, offset + i, 448:] = e[448:].view(torch.bfloat16)
    return out


def _reference():
    try:
        from deepinfer_sm80.reference import cache as ref
    except ImportError as e:  # the reference is a required part of the package
        pytest.fail(f"deepinfer_sm80.reference.cache is missing: {e}")
    return ref.dequantize_and_gather_k_cache


def _run_ref(out, *args):
    """Run the reference on a copy of the poisoned buffer; returns the result."""
    ref = _reference()
    o = out.clone()
    res = ref(o, *args)
    return res if isinstance(res, torch.Tensor) else o


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    ai, bi = a.view(torch.int16), b.view(torch.int16)
    bad = (ai != bi).nonzero()
    assert bad.numel() == 0, (f"{bad.shape[0]} lanes differ; first at {bad[0].tolist()}: "
                              f"{a[tuple(bad[0])].item()} vs {b[tuple(bad[0])].item()}")


def _case(reqs, seq, glen, bs, offset, extra_rows, g, strided=False):
    """Inputs for one case; ``seq``/``glen`` per request (glen None -> gather_lens None)."""
    bpr = [max(1, -(-s // bs)) for s in seq]
    nb = sum(bpr) + 3
    cache = _cache(nb, bs, g)
    perm = torch.randperm(nb, device="cuda", generator=g).to(torch.int32)
    width = max(bpr) + 2
    table = torch.randint(0, nb, (reqs, width), dtype=torch.int32, device="cuda", generator=g)
    k = 0
    for r in range(reqs):
        table[r, : bpr[r]] = perm[k:k + bpr[r]]
        k += bpr[r]
    if strided:  # same logical table, every other column of a wider buffer
        wide = torch.randint(0, nb, (reqs, 2 * width), dtype=torch.int32, device="cuda", generator=g)
        wide[:, ::2] = table
        table = wide[:, ::2]
        assert not table.is_contiguous()
    seq_t = torch.tensor(seq, dtype=torch.int32, device="cuda")
    gl_t = None if glen is None else torch.tensor(glen, dtype=torch.int32, device="cuda")
    rows = offset + max(seq) + extra_rows
    out = torch.full((reqs, rows, 512), 0, dtype=torch.int16, device="cuda").fill_(POISON)
    return out.view(torch.bfloat16), (cache, seq_t, gl_t, table, bs, offset)


CASES = {
    # name: (seq_lens, gather_lens or None, block_size, offset, strided block table)
    "swa_partial_gather": ([300, 65, 1], [130, 65, 1], 64, 17, False),
    "compressed_full": ([1000, 64, 1, 127], None, 64, 0, False),
    "seq_len_zero": ([0, 5, 0], [0, 5, 0], 64, 3, False),
    "c128_block2": ([41, 3], None, 2, 5, False),
    "strided_block_table": ([200, 90], [150, 90], 64, 0, True),
    "last_partial_block_256": ([700], [700], 256, 1, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_portable_gather_matches_reference(name):
    seq, glen, bs, offset, strided = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(_seed())
    out, args = _case(len(seq), seq, glen, bs, offset, 5, g, strided)
    expect = _run_ref(out, *args)
    got = out.clone()
    portable_gather(got, *args)
    torch.cuda.synchronize()
    _bits_equal(got, expect)
    # and the independent naive oracle (also proves untouched rows keep the poison)
    _bits_equal(got, _naive(out, *args))
    written = sum(glen if glen is not None else seq)
    assert int((got.view(torch.int16) != POISON).any(-1).sum()) == written


def test_portable_gather_nan_codes():
    """e4m3 NaN codes (0x7F/0xFF) decode to NaN; everything else stays exact."""
    g = torch.Generator(device="cuda").manual_seed(_seed())
    out, args = _case(2, [100, 64], None, 64, 0, 0, g)
    cache = _cache(args[0].shape[0], 64, g, nan_codes=True)
    args = (cache,) + args[1:]
    got = out.clone()
    portable_gather(got, *args)
    exp = _naive(out, *args)
    nan_g, nan_e = got.isnan(), exp.isnan()
    assert torch.equal(nan_g, nan_e) and int(nan_e.sum()) > 0
    _bits_equal(torch.where(nan_g, 0, got), torch.where(nan_e, 0, exp))


def test_portable_gather_64bit_offsets():
    """A cache larger than 2^31 bytes, entries read from its last pages."""
    bs = 64
    stride = _stride(bs)
    nb = (2**31) // stride + 64
    g = torch.Generator(device="cuda").manual_seed(_seed())
    try:
        cache = torch.empty((nb, stride), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory for a > 2 GiB cache")
    tail = _cache(8, bs, g)
    cache[-8:] = tail
    table = torch.arange(nb - 8, nb, dtype=torch.int32, device="cuda").flip(0).view(1, 8)
    seq = torch.tensor([8 * bs - 5], dtype=torch.int32, device="cuda")
    out = torch.full((1, 8 * bs, 512), POISON, dtype=torch.int16, device="cuda").view(torch.bfloat16)
    got = out.clone()
    portable_gather(got, cache, seq, None, table, bs, 0)
    # same entries through a small cache with remapped page ids
    small_table = torch.arange(8, dtype=torch.int32, device="cuda").flip(0).view(1, 8)
    exp = _naive(out, tail, seq, None, small_table, bs, 0)
    _bits_equal(got, exp)
    assert cache.numel() > 2**31


def test_portable_gather_matches_upstream():
    """Same inputs through upstream vLLM 0.33.0's Triton kernel (needs SM89+ and a tree)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("upstream's kernel uses fp8e4nv, which needs SM89+")
    import upstream_import

    try:
        mod = upstream_import.import_upstream(upstream_import.CACHE_UTILS)
    except upstream_import.UpstreamImportError as e:
        pytest.skip(f"upstream vLLM tree not importable: {e}")
    kern = mod._DEQUANTIZE_AND_GATHER_K_CACHE_KERNEL
    g = torch.Generator(device="cuda").manual_seed(_seed())
    for seq, glen, bs, offset in (([3000, 1, 64], [200, 1, 64], 64, 9), ([4097, 70], None, 64, 0),
                                  ([90, 7], None, 2, 3)):
        out, args = _case(len(seq), seq, glen, bs, offset, 3, g)
        a, b = out.clone(), out.clone()
        portable_gather(a, *args)
        kern(b, *args, use_fnuz=False)
        torch.cuda.synchronize()
        _bits_equal(a, b)


def test_portable_gather_rejects_bad_inputs():
    g = torch.Generator(device="cuda").manual_seed(_seed())
    out, (cache, seq, gl, table, bs, off) = _case(1, [10], None, 64, 0, 0, g)
    with pytest.raises(ValueError, match="int32"):
        portable_gather(out, cache, seq.long(), gl, table, bs, off)
    with pytest.raises(ValueError, match="bfloat16"):
        portable_gather(out.float(), cache, seq, gl, table, bs, off)
    with pytest.raises(NotImplementedError, match="fnuz"):
        portable_gather(out, cache, seq, gl, table, bs, off, use_fnuz=True)
