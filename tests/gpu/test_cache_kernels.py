"""GPU tests of the KV-cache kernels and the device FP8 codecs, bit-exact against the
torch references (deepinfer_sm80.reference.*), on fresh random inputs each run.

Outputs (cache bytes, gathered rows) are poisoned with random bytes first and compared
in full, so both wrong and missing writes fail. NaN outputs compare as NaN (their payload
bits differ between torch's CPU conversion and the GPU's)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from deepinfer_sm80.ops import cache as OC  # noqa: E402
from deepinfer_sm80.reference import cache as RC  # noqa: E402
from deepinfer_sm80.reference import fp8 as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEV = "cuda"


def _gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return torch.Generator(device="cpu").manual_seed(seed)


def _stride(bs):
    return (bs * 584 + 575) // 576 * 576


def _rand_k(T, g):
    """bf16 rows with per-group magnitudes from 1e-6 to 1e4 (incl. groups below the 1e-4
    floor and below 0.0448, where the upstream writers differ), zeros, exact powers of two
    at 448 * 2^e, and a few inf/NaN values."""
    x = torch.randn(T, 512, generator=g)
    mag = 10 ** (torch.rand(T, 8, generator=g) * 10 - 6)
    x = x * mag.repeat_interleave(64, dim=1)
    if T > 4:
        x[0, :64] = 0
        x[1, :64] = 448.0 * 2.0**-5
        x[1, 1] = -448.0 * 2.0**-5
        x[2, 5] = float("inf")
        x[3, 70] = float("nan")
        x[4, 130] = -float("inf")
    return x.bfloat16()


def _bits_equal_nan(a, b):
    """bf16 tensors equal bit for bit, NaN positions equal (payload ignored)."""
    an, bn = torch.isnan(a.float()), torch.isnan(b.float())
    if not torch.equal(an, bn):
        return False
    return torch.equal(a.view(torch.int16)[~an], b.view(torch.int16)[~bn])


# ---------------------------------------------------------------------------- codecs
def test_device_e4m3_encode_matches_intrinsic_and_reference(ext):
    g = _gen()
    bits = torch.randint(-2**31, 2**31 - 1, (1 << 22,), generator=g, dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32)
    special = torch.tensor([0.0, -0.0, 448.0, 464.0, -464.0, 464.00003, 480.0, float("inf"),
                            -float("inf"), float("nan"), 2.0**-10, -2.0**-10, 3 * 2.0**-10,
                            2.0**-6, 1e-45, -1e-45, 1.0625, 1.1875], dtype=torch.float32)
    normal = torch.randn(1 << 20, generator=g) * 10 ** (torch.rand(1 << 20, generator=g) * 8 - 5)
    x = torch.cat([x, special, normal]).to(DEV)
    ours = ext._fp8_codec_test(x, None, 0)
    intrinsic = ext._fp8_codec_test(x, None, 1)
    assert torch.equal(ours, intrinsic)
    assert torch.equal(ours.cpu(), F.float_to_e4m3_satfinite(x.cpu()))


def test_device_e4m3_decode_all_codes(ext):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = ext._fp8_codec_test(codes.to(DEV), None, 2).cpu()
    want = F.e4m3_to_float(codes)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))


@pytest.mark.parametrize("mode", [3, 4, 5],
                         ids=["fp32-route", "bf16-multiply-route", "bf16-two-multiply-route"])
def test_device_packed_decode_all_codes_all_scales(ext, mode):
    # every (code, scale byte) pair through one of the gather's packed decode routes (mode 3:
    # s in [1, 246], mode 4: s in [10, 134], mode 5: s in [10, 246], all without NaN codes)
    # or the scalar fallback
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256)
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat_interleave(64)
    got = ext._fp8_codec_test(codes.to(DEV), scales.to(DEV), mode).cpu()
    want = (F.e4m3_to_float(codes) * F.ue8m0_to_float(scales).repeat_interleave(4)).bfloat16()
    assert _bits_equal_nan(got, want)


def test_native_exhaustive_encode_vs_hardware_cvt():
    """All 2^32 float patterns: our encoder vs cvt.rn.satfinite.e4m3x2.f32 (sm_89+)."""
    from deepinfer.build import find_nvcc

    cc = torch.cuda.get_device_capability()
    if cc < (8, 9):
        pytest.skip(f"no FP8 conversion instruction on sm_{cc[0]}{cc[1]}")
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    exe = Path(os.environ.get("TMPDIR", "/tmp")) / "deepinfer_fp8chk"
    arch = f"sm_{cc[0]}{cc[1]}"
    res = subprocess.run([str(nvcc), "-std=c++17", "-O2", f"-arch={arch}",
                          f"-I{ROOT / 'csrc'}", str(ROOT / "tests/native/fp8_codec_check.cu"),
                          "-o", str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    run = subprocess.run([str(exe), "1", "device"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("OK 4294967296"), run.stdout


# ---------------------------------------------------------------------------- insert
@pytest.mark.parametrize("bs", [64, 16, 2])
def test_insert_bit_exact(ext, bs):
    g = _gen()
    nb = 37
    T = 3 * bs + 5 if bs > 2 else 41
    k_rows = _rand_k(T + 3, g)  # slot_mapping shorter than k (DP padding)
    # distinct slots (a slot written twice has no defined winner), incl. the very last one
    slots = torch.cat([torch.randperm(nb * bs - 1, generator=g)[: T - 1],
                       torch.tensor([nb * bs - 1])])
    slots[:-1][torch.rand(T - 1, generator=g) < 0.15] = -1
    kc = torch.randint(0, 256, (nb, _stride(bs)), generator=g, dtype=torch.int32).to(torch.uint8)
    want = kc.clone()
    RC.quantize_and_insert_k_cache(k_rows, want, slots, bs)
    got = kc.to(DEV)
    OC.quantize_and_insert_k_cache(k_rows.to(DEV), got, slots.to(DEV), bs)
    assert torch.equal(got.cpu(), want)


def test_insert_strided_rows_and_cache_view(ext):
    g = _gen()
    bs, nb, T = 64, 9, 100
    big = _rand_k(T, g)
    wide = torch.zeros(T, 1024, dtype=torch.bfloat16)
    wide[:, 256:768] = big
    k = wide.to(DEV)[:, 256:768]  # row stride 1024 elements, 16-byte aligned
    flat = torch.randint(0, 256, (nb * _stride(bs),), generator=g, dtype=torch.int32).to(torch.uint8)
    kc_view = flat.view(nb, _stride(bs))[:, : bs * 584].view(nb, bs, 584)  # upstream's 3-D view
    slots = torch.randperm(nb * bs, generator=g)[:T]
    want = flat.clone().view(nb, _stride(bs))
    RC.quantize_and_insert_k_cache(big, want, slots, bs)
    got_flat = flat.to(DEV)
    OC.quantize_and_insert_k_cache(k, got_flat.view(nb, _stride(bs))[:, : bs * 584].view(nb, bs, 584),
                                   slots.to(DEV), bs)
    assert kc_view.stride(0) == _stride(bs)
    assert torch.equal(got_flat.cpu().view(nb, _stride(bs)), want)


def test_insert_empty_and_all_skipped(ext):
    kc = torch.randint(0, 256, (3, _stride(64)), dtype=torch.int32).to(torch.uint8).to(DEV)
    before = kc.clone()
    k = torch.randn(4, 512).bfloat16().to(DEV)
    OC.quantize_and_insert_k_cache(k, kc, torch.empty(0, dtype=torch.int64, device=DEV), 64)
    OC.quantize_and_insert_k_cache(k, kc, torch.tensor([-1, -1, 3 * 64, -7], device=DEV), 64)
    assert torch.equal(kc, before)


# ---------------------------------------------------------------------------- gather
def _random_cache(nb, bs, g):
    """Random bytes everywhere: all e4m3 codes incl. NaN, all 256 scale bytes, random bf16."""
    return torch.randint(0, 256, (nb, _stride(bs)), generator=g, dtype=torch.int32).to(torch.uint8)


def _check_gather(ext, kc, seq, gat, table, bs, offset, M, g, sm_count=None):
    R = seq.size(0)
    poison = torch.randint(-2**15, 2**15 - 1, (R + 1, M, 512), generator=g,
                           dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    want = poison.clone()
    RC.dequantize_and_gather_k_cache(want, kc, seq, gat, table.cpu(), bs, offset)
    got = poison.to(DEV)
    # a table already on the device goes in as it is (a strided view stays strided: .to(DEV)
    # of a CPU view would hand the kernel a contiguous copy)
    OC.dequantize_and_gather_k_cache(got, kc.to(DEV), seq.to(DEV),
                                     None if gat is None else gat.to(DEV),
                                     table if table.is_cuda else table.to(DEV), bs,
                                     offset, sm_count=sm_count)
    assert _bits_equal_nan(got.cpu(), want)


# 48: a page size that is not a power of two (the launch-time divisor FastDivU31 off its power-of-two case)
@pytest.mark.parametrize("bs", [64, 16, 2, 1, 48])
def test_gather_bit_exact_random_bytes(ext, bs):
    g = _gen()
    nb = 300
    seq = torch.tensor([0, 1, 37 * bs + 3 if bs > 2 else 61, bs, 5], dtype=torch.int32)
    maxb = int((seq.max() + bs - 1) // bs) + 2
    table = torch.randint(0, nb, (seq.size(0), maxb), generator=g, dtype=torch.int32)
    kc = _random_cache(nb, bs, g)
    M = int(seq.max()) + 9
    _check_gather(ext, kc, seq, None, table, bs, 0, M, g)  # gather_lens None
    # one SM: the grid cap (64 waves of one-warp blocks, split over 5 requests) is below the
    # longest request's tiles at bs = 64, so some blocks walk two tiles; the rerun under
    # DEEPINFER_GATHER_WARP_WAVES=1 below makes every block walk many
    _check_gather(ext, kc, seq, None, table, bs, 0, M, g, sm_count=1)
    gat = torch.tensor([0, 1, 20, bs, 5], dtype=torch.int32)  # incl. gather_len = seq_len
    _check_gather(ext, kc, seq, gat, table, bs, 7, M, g)
    _check_gather(ext, kc, seq, gat, table, bs, 7, M, g, sm_count=1)
    _check_gather(ext, kc, seq, gat, table, bs, 7, M, g, sm_count=108)


@pytest.mark.parametrize("knob,value", [("DEEPINFER_GATHER_LAYOUT", "persistent"),
                                        ("DEEPINFER_GATHER_WARP_WAVES", "1"),
                                        ("DEEPINFER_GATHER_SMEM_PAD", "13312")])
def test_gather_layout_knobs(knob, value):
    """The gather's layout knobs (csrc/cache/gather_k.cu) are read once per process, so each
    setting reruns every gather test in a fresh process: the persistent layout instead of
    the one-warp tiles; the tile kernel's grid capped at one wave of resident blocks,
    which with sm_count=1 makes every block walk many tiles (6 blocks per request for up to
    593 tiles); and the tile blocks launched with unused shared memory (SM86 residency)."""
    if os.environ.get(knob) == value:
        pytest.skip(f"already running under {knob}={value}")
    env = dict(os.environ, **{knob: value})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
                        "-k", "gather and not layout_knobs"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"gather tests with {knob}={value}:\n{r.stdout[-4000:]}"
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]


def test_gather_strided_block_table_and_guards(ext):
    g = _gen()
    bs, nb = 64, 50
    kc = _random_cache(nb, bs, g)
    wide = torch.randint(0, nb, (3, 40), generator=g, dtype=torch.int32)
    table = wide.to(DEV)[:, 1::3]  # the view made on the device: strides (40, 3) there
    assert table.stride() == (40, 3)
    seq = torch.tensor([300, 13 * 64 - 1, 64 * 13], dtype=torch.int32)  # last one fills the table
    _check_gather(ext, kc, seq, None, table, bs, 2, 64 * 13 + 2, g)
    # out rows too short and invalid block ids: those entries are skipped, not written
    wide2 = wide.clone()
    wide2[0, 1 + 3 * 1] = nb + 5  # table2[0, 1]
    wide2[1, 1] = -3  # table2[1, 0]
    table2 = wide2.to(DEV)[:, 1::3]
    assert table2.stride() == (40, 3)
    _check_gather(ext, kc, seq, None, table2, bs, 3, 400, g)


def test_insert_then_gather_round_trip(ext):
    g = _gen()
    bs, nb, T = 64, 40, 1000
    k = _rand_k(T, g)
    k[2:5] = torch.randn(3, 512, generator=g).bfloat16()  # drop the inf/NaN rows here
    phys = torch.randperm(nb, generator=g)[: (T + bs - 1) // bs].to(torch.int32)
    slots = (phys.repeat_interleave(bs)[:T].long() * bs + torch.arange(T) % bs)
    kc = torch.zeros(nb, _stride(bs), dtype=torch.uint8, device=DEV)
    OC.quantize_and_insert_k_cache(k.to(DEV), kc, slots.to(DEV), bs)
    out = torch.full((1, T, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    OC.dequantize_and_gather_k_cache(out, kc, torch.tensor([T], dtype=torch.int32, device=DEV),
                                     None, phys[None].to(DEV), bs, 0)
    data, scales = RC.encode_records(k)
    want = RC.decode_records(data, scales)
    assert _bits_equal_nan(out[0].cpu(), want)
    assert torch.equal(out[0, :, 448:].cpu(), k[:, 448:])


def test_gather_and_insert_beyond_2gib(ext):
    """64-bit offsets: a cache of more than 2^31 bytes, entries in its last blocks."""
    bs = 64
    stride = _stride(bs)
    nb = (1 << 31) // stride + 40
    free = torch.cuda.mem_get_info()[0]
    if free < nb * stride + (1 << 30):
        pytest.skip(f"needs {nb * stride / 2**30:.1f} GiB free on the GPU")
    g = _gen()
    kc = torch.empty((nb, stride), dtype=torch.uint8, device=DEV)
    tail = _random_cache(8, bs, g)
    kc[-8:] = tail.to(DEV)
    assert kc[-1].data_ptr() - kc.data_ptr() > 2**31
    # insert into the last 8 blocks
    k = _rand_k(300, g)
    local = torch.randperm(8 * bs, generator=g)[:300]
    want_tail = tail.clone()
    RC.quantize_and_insert_k_cache(k, want_tail, local, bs)
    OC.quantize_and_insert_k_cache(k.to(DEV), kc, (local + (nb - 8) * bs).to(DEV), bs)
    assert torch.equal(kc[-8:].cpu(), want_tail)
    # gather from them through a table pointing past 2^31 bytes
    table = (torch.arange(8, dtype=torch.int32) + nb - 8)[None]
    seq = torch.tensor([8 * bs - 5], dtype=torch.int32)
    out = torch.zeros((1, 8 * bs, 512), dtype=torch.bfloat16, device=DEV)
    OC.dequantize_and_gather_k_cache(out, kc, seq.to(DEV), None, table.to(DEV), bs, 0)
    want = torch.zeros((1, 8 * bs, 512), dtype=torch.bfloat16)
    RC.dequantize_and_gather_k_cache(want, want_tail, seq, None,
                                     torch.arange(8, dtype=torch.int32)[None], bs, 0)
    assert _bits_equal_nan(out.cpu(), want)


def test_validation_errors(ext):
    kc = torch.zeros(4, _stride(64), dtype=torch.uint8, device=DEV)
    k = torch.zeros(3, 512, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(TypeError, match="k must be torch.bfloat16"):
        OC.quantize_and_insert_k_cache(k.float(), kc, torch.zeros(3, dtype=torch.int64, device=DEV))
    with pytest.raises(TypeError, match="slot_mapping must be torch.int64"):
        OC.quantize_and_insert_k_cache(k, kc, torch.zeros(3, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="needs 37376"):
        OC.quantize_and_insert_k_cache(k, kc[:, :30000], torch.zeros(3, dtype=torch.int64, device=DEV))
    with pytest.raises(ValueError, match="CUDA"):
        OC.quantize_and_insert_k_cache(k.cpu(), kc, torch.zeros(3, dtype=torch.int64, device=DEV))
    out = torch.zeros(1, 8, 512, dtype=torch.bfloat16, device=DEV)
    seq = torch.tensor([4], dtype=torch.int32, device=DEV)
    bt = torch.zeros(1, 2, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="offset"):
        OC.dequantize_and_gather_k_cache(out, kc, seq, None, bt, 64, -1)
    with pytest.raises(TypeError, match="block_table must be torch.int32"):
        OC.dequantize_and_gather_k_cache(out, kc, seq, None, bt.long(), 64, 0)
    with pytest.raises(ValueError, match="16-byte"):
        OC.dequantize_and_gather_k_cache(out[:, :, :].as_strided((1, 8, 512), (4100, 500, 1)),
                                         kc, seq, None, bt, 64, 0)
