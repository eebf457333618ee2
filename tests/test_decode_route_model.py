"""CPU model of the gather's packed bf16 decode routes (csrc/common/fp8_e4m3.cuh).

The kernels decode an e4m3 code with UE8M0 scale byte s by placing the code's bits in the
bf16 layout (sign to bit 15, the 7 magnitude bits to bits 4..10: the code's value x 2^-120)
and multiplying in bf16:
  - one-multiply route (e4m3x4_to_bf16x4_bf16mul): x 2^(s-7), claimed exact for s in 10..134;
  - two-multiply route (e4m3x8_to_bf16x8_bf16mul2): x 2^120, then x 2^(s-127), claimed exact
    for s in 10..246.
"Exact" means the bits of "fp32 decode x 2^(s-127), rounded to bf16 (RNE)", the reference.
Torch's CPU bf16 multiply rounds the exact product (two bf16 significands fit in fp32) to
bf16 RNE, as one bf16x2 multiply of the GPU does, so these claims can be checked here over
all 65,536 (code, scale byte) pairs; the GPU test (test_device_packed_decode_all_codes_all_scales)
checks the kernels' own instructions.
"""
import pytest

torch = pytest.importorskip("torch")

from deepinfer_sm80.reference import fp8 as F  # noqa: E402

CODES = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.int64)  # no NaN


def _bf16_from_bits(bits: torch.Tensor) -> torch.Tensor:
    return (bits & 0xFFFF).to(torch.int32).to(torch.int16).view(torch.bfloat16)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16).to(torch.int64) & 0xFFFF


def _placed(codes: torch.Tensor) -> torch.Tensor:
    # prmt sign-extension of the code to 16 bits, << 4, mask 0x87F0 (one half of the kernel's word)
    sext = torch.where(codes >= 128, codes | 0xFF00, codes)
    return _bf16_from_bits((sext << 4) & 0x87F0)


def _pow2_bf16(e: int) -> torch.Tensor:
    return _bf16_from_bits(torch.tensor((e + 127) << 7))


def _reference(codes: torch.Tensor, s: int) -> torch.Tensor:
    scale = F.ue8m0_to_float(torch.tensor([s], dtype=torch.uint8))
    return (F.e4m3_to_float(codes.to(torch.uint8)) * scale).bfloat16()


def _one_multiply(codes: torch.Tensor, s: int) -> torch.Tensor:
    return _placed(codes) * _bf16_from_bits(torch.tensor((s + 120) << 7))  # 2^(s-7)


def _two_multiply(codes: torch.Tensor, s: int) -> torch.Tensor:
    return (_placed(codes) * _pow2_bf16(120)) * _bf16_from_bits(torch.tensor(s << 7))  # 2^(s-127)


def test_placed_bits_are_the_value_times_2_to_minus_120():
    got = _placed(CODES).to(torch.float64)
    want = F.e4m3_to_float(CODES.to(torch.uint8)).to(torch.float64) * 2.0**-120
    assert torch.equal(got, want)


@pytest.mark.parametrize("route,lo,hi", [(_one_multiply, 10, 134), (_two_multiply, 10, 246)],
                         ids=["one-multiply", "two-multiply"])
def test_route_exact_over_its_scale_range(route, lo, hi):
    for s in range(lo, hi + 1):
        assert torch.equal(_bits(route(CODES, s)), _bits(_reference(CODES, s))), f"scale byte {s}"


def test_one_multiply_route_fails_above_134():
    # 2^(s-7) is no finite bf16 for s >= 135: the range test in front of the route is needed
    for s in (135, 200, 246):
        assert not torch.equal(_bits(_one_multiply(CODES, s)), _bits(_reference(CODES, s)))
