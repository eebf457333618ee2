"""CPU checks of the E4M3 / UE8M0 torch references (deepinfer_sm80.reference.fp8), the
oracles of the GPU kernels. Oracles here: torch's float8_e4m3fn conversions (exact for
in-range values), the format definition worked by hand, and the saturation rules of
__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)."""
import math

import pytest

torch = pytest.importorskip("torch")

from deepinfer_sm80.reference import fp8 as F  # noqa: E402

ALL = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def test_decode_all_codes_match_torch():
    got = F.e4m3_to_float(ALL)
    want = ALL.view(torch.float8_e4m3fn).to(torch.float32)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert nan.sum() == 2 and bool(nan[0x7F]) and bool(nan[0xFF])
    assert torch.equal(_bits(got[~nan]), _bits(want[~nan]))  # incl. -0.0 at 0x80


@pytest.mark.parametrize("code,value", [
    (0x00, 0.0), (0x01, 2.0**-9), (0x07, 7 * 2.0**-9), (0x08, 2.0**-6), (0x38, 1.0),
    (0x3F, 1.875), (0x40, 2.0), (0x7E, 448.0), (0xFE, -448.0), (0xB8, -1.0), (0x81, -2.0**-9),
])
def test_decode_hand_worked(code, value):
    assert F.e4m3_to_float(torch.tensor([code], dtype=torch.uint8)).item() == value


def test_encode_roundtrips_every_finite_code():
    finite = ALL[(ALL & 0x7F) != 0x7F]
    assert torch.equal(F.float_to_e4m3_satfinite(F.e4m3_to_float(finite)), finite)


def test_encode_random_in_range_matches_torch():
    g = torch.Generator().manual_seed(1234)
    parts = [torch.randn(200_000, generator=g) * s for s in (1e-3, 0.05, 1.0, 30.0, 150.0)]
    x = torch.cat(parts)
    x = x[x.abs() <= 448.0]
    assert torch.equal(F.float_to_e4m3_satfinite(x),
                       x.to(torch.float8_e4m3fn).view(torch.uint8))


def test_encode_ties_go_to_even():
    vals = F.e4m3_to_float(torch.arange(0x7E, dtype=torch.int32).to(torch.uint8)).double()
    nxt = F.e4m3_to_float(torch.arange(1, 0x7F, dtype=torch.int32).to(torch.uint8)).double()
    mid = ((vals + nxt) / 2).float()  # exactly representable midpoints
    assert torch.equal(mid.double(), (vals + nxt) / 2)
    codes = F.float_to_e4m3_satfinite(mid).long()
    lo = torch.arange(0x7E)
    want = torch.where(lo % 2 == 0, lo, lo + 1)
    assert torch.equal(codes, want)
    assert torch.equal(F.float_to_e4m3_satfinite(-mid).long(), want | 0x80)
    # hand-worked: 2^-10 (half the smallest subnormal) -> 0, 3*2^-10 -> 2*2^-9 (even)
    t = torch.tensor([2.0**-10, 3 * 2.0**-10, 1.0625, 1.1875, 2.0**-10 * 1.0001])
    assert F.float_to_e4m3_satfinite(t).tolist() == [0x00, 0x02, 0x38, 0x3A, 0x01]


def test_encode_subnormals_and_zero_sign():
    x = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 2.0**-9, -5 * 2.0**-9, 2.0**-6 * 0.99])
    assert F.float_to_e4m3_satfinite(x).tolist() == [0x00, 0x80, 0x00, 0x80, 0x01, 0x85, 0x08]


def test_encode_saturation_and_nan():
    x = torch.tensor([448.0, 449.0, 464.0, math.nextafter(464.0, 1e9), 480.0, 1e30,
                      math.inf, -464.0, -465.0, -math.inf, math.nan, -math.nan])
    got = F.float_to_e4m3_satfinite(x).tolist()
    assert got == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0xFE, 0x7F, 0x7F]


def test_ue8m0_decode_round_trip():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    v = F.ue8m0_to_float(b)
    assert v[0].item() == 0.0 and math.isinf(v[255].item())
    for i in range(1, 255):
        assert v[i].item() == math.ldexp(1.0, i - 127)
    # bit pattern is byte << 23
    assert torch.equal(_bits(v[1:255]), torch.arange(1, 255, dtype=torch.int32) << 23)
    # encode(448 * 2^e) -> e exactly, and the value just above moves one up
    for byte in range(105, 247):  # 448 * 2^120 (byte 247) overflows fp32; see extremes test
        e = byte - 127
        a = torch.tensor([math.ldexp(448.0, e)], dtype=torch.float32)
        sb, inv = F.ue8m0_encode_absmax(a)
        assert sb.item() == byte and inv.item() == math.ldexp(1.0, -e)
        if byte < 246:
            up = torch.nextafter(a, torch.tensor([math.inf]))
            assert F.ue8m0_encode_absmax(up)[0].item() == byte + 1


def test_ue8m0_floor_and_extremes():
    a = torch.tensor([0.0, 1e-9, 1e-4, 0.0448, 0.04481, 1.0, 3.3e38, math.inf])
    sb, inv = F.ue8m0_encode_absmax(a)
    # 1e-4/448 = 2^-22.06 -> e = -22 (byte 105); 0.0448 = 448 * 1e-4 -> 2^-13.3 -> -13
    assert sb.tolist() == [105, 105, 105, 114, 114, 119, 247, 255]
    assert inv[-1].item() == 0.0 and inv[0].item() == 2.0**22


def test_quantize_groups_hand_worked():
    # one group: absmax 3 -> e = ceil(log2(3/448)) = -7 -> values * 128
    x = torch.zeros(64)
    x[0], x[1], x[2], x[3] = 3.0, -1.0, 0.01, float("nan")
    codes, sb = F.quantize_groups(x)
    assert sb.tolist() == [120]
    # 3*128 = 384 -> 0x7C; -128 -> 0xF0; 1.28 -> nearest 1.25 (0x3A); NaN -> -448 (0xFE)
    assert codes[:4].tolist() == [0x7C, 0xF0, 0x3A, 0xFE]
    assert F.dequantize_groups(codes[:64].reshape(1, 64), sb.reshape(1, 1))[0, :3].tolist() \
        == [3.0, -1.0, 1.25 / 128]
