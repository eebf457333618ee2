"""E4M3 (OCP ``e4m3fn``) and UE8M0 codecs in torch, written from the format definitions.

These are the oracles for ``csrc/common/fp8_e4m3.cuh`` and ``csrc/common/ue8m0.cuh``:

* :func:`e4m3_to_float` - exact decode of uint8 codes (0x7F / 0xFF -> NaN);
* :func:`float_to_e4m3_satfinite` - nearest code with ties to the even code, finite and
  infinite magnitudes beyond 448 saturate to +-448 (``|x| > 464`` saturates, 464 itself is
  the tie between 448 and 480 and goes to 448), NaN -> 0x7F, the sign of zero kept;
  i.e. ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)``;
* :func:`ue8m0_to_float` - ``2^(byte - 127)`` with byte 0 -> 0.0 and 255 -> inf;
* :func:`ue8m0_encode_absmax` - the SWA KV writer's scale (vLLM 0.33.0 CUDA ``_C`` op):
  ``exponent = ceil(log2(max(absmax, 1e-4) / 448))`` computed exactly.

The encoder works in float64 on a table of the 127 non-negative finite codes, so it shares
no code with the bit-manipulation kernels it checks.
"""

from __future__ import annotations

import math

import torch

E4M3_MAX = 448.0
UE8M0_ABSMAX_FLOOR = 1e-4  # the writer floors absmax at the fp32 value of 1e-4


def _e4m3_value(code: int) -> float:
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    mag = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -mag if code & 0x80 else mag


# value of codes 0x00..0x7E (non-negative finite), increasing with the code
_POS_VALUES = torch.tensor([_e4m3_value(c) for c in range(0x7F)], dtype=torch.float64)
_TABLE = torch.tensor([_e4m3_value(c) for c in range(256)], dtype=torch.float64)


#: float64 value of each of the 256 codes (0x7F / 0xFF -> NaN); the one decode table that
#: every reference (cache, attention, writers) uses.
E4M3_VALUES = _TABLE


_ON_DEVICE: dict[tuple[str, torch.device], torch.Tensor] = {}


def _on(name: str, table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The table on ``device``, copied there once: a reference call made under CUDA-graph
    capture (benchmark baselines) must not copy from host memory."""
    key = (name, torch.device(device))
    t = _ON_DEVICE.get(key)
    if t is None:
        t = _ON_DEVICE[key] = table.to(device)
    return t


def e4m3_values(codes: torch.Tensor) -> torch.Tensor:
    """Integer codes (any integer dtype, 0..255) -> exact float64 values."""
    return _on("values", _TABLE, codes.device)[codes.to(torch.long)]


def e4m3_to_float(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes -> float32 values (exact)."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes must be uint8, got {codes.dtype}")
    return _on("values", _TABLE, codes.device)[codes.long()].to(torch.float32)


def float_to_e4m3_satfinite(x: torch.Tensor) -> torch.Tensor:
    """float32 (or any float) -> uint8 codes, RNE, saturating to +-448, NaN -> 0x7F."""
    xd = x.detach().to(torch.float64)
    mag = xd.abs()
    sign = torch.signbit(xd)
    table = _on("positive", _POS_VALUES, x.device)
    m = torch.nan_to_num(mag, nan=0.0).clamp(max=E4M3_MAX)
    hi = torch.searchsorted(table, m, right=False).clamp(max=0x7E)  # first value >= m
    lo = (hi - 1).clamp(min=0)
    d_hi = table[hi] - m
    d_lo = m - table[lo]
    # nearest; on a tie the even code (codes are consecutive, so parity picks one)
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = torch.where(pick_hi, hi, lo)
    code = torch.where(mag > 464.0, torch.full_like(code, 0x7E), code)  # saturate (incl inf)
    code = code | torch.where(sign, 0x80, 0)
    code = torch.where(torch.isnan(xd), torch.full_like(code, 0x7F), code)
    return code.to(torch.uint8)


def ue8m0_to_float(scale_bytes: torch.Tensor) -> torch.Tensor:
    """uint8 UE8M0 bytes -> float32 2^(byte-127); byte 0 -> 0.0 (see csrc/common/ue8m0.cuh)."""
    b = scale_bytes.to(torch.int64)
    out = torch.pow(2.0, (b - 127).to(torch.float64)).to(torch.float32)
    return torch.where(b == 0, torch.zeros_like(out), out)


def ue8m0_exponent(absmax: torch.Tensor) -> torch.Tensor:
    """Smallest integer e with 448 * 2^e >= max(absmax, 1e-4) (int64; absmax NaN-free)."""
    a = torch.clamp(absmax.to(torch.float32), min=torch.tensor(UE8M0_ABSMAX_FLOOR,
                                                               dtype=torch.float32))
    ad = a.to(torch.float64)
    finite = torch.isfinite(ad)
    ad = torch.where(finite, ad, torch.ones_like(ad))
    e = torch.ceil(torch.log2(ad / E4M3_MAX)).to(torch.int64)
    # make it exact: 448 * 2^e is exactly representable in float64
    e = torch.where(E4M3_MAX * torch.pow(2.0, (e - 1).double()) >= ad, e - 1, e)
    e = torch.where(E4M3_MAX * torch.pow(2.0, e.double()) < ad, e + 1, e)
    return torch.where(finite, e, torch.full_like(e, 128))


def ue8m0_encode_absmax(absmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """absmax (float32) -> (scale byte uint8, inverse scale float32 = 2^-e).

    absmax = +inf gives byte 255 and inverse scale 0 (as exp2f(-inf) in the writer).
    """
    e = ue8m0_exponent(absmax)
    byte = torch.clamp(e + 127, 0, 255).to(torch.uint8)
    inv = torch.pow(2.0, (-e).double()).to(torch.float32)
    inv = torch.where(e >= 128, torch.zeros_like(inv), inv)
    return byte, inv


def quantize_groups(x: torch.Tensor, group: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise the last dim of a float32/bf16 tensor in groups like the SWA writer.

    Per group: absmax over the values (NaN ignored, as fmaxf does), UE8M0 scale,
    q = clamp(x * 2^-e, -448, 448) in float32 with NaN -> -448 (fmaxf(NaN, -448) = -448),
    then RNE e4m3. Returns (codes uint8 [..., n], scale bytes uint8 [..., n / group]).
    """
    xf = x.to(torch.float32)
    shape = xf.shape
    g = xf.reshape(*shape[:-1], shape[-1] // group, group)
    absv = torch.where(torch.isnan(g), torch.zeros_like(g), g.abs())
    absmax = absv.amax(dim=-1)
    byte, inv = ue8m0_encode_absmax(absmax)
    scaled = g * inv.unsqueeze(-1)  # float32 multiply, as the kernel
    scaled = torch.where(torch.isnan(scaled), torch.full_like(scaled, -E4M3_MAX),
                         scaled.clamp(-E4M3_MAX, E4M3_MAX))
    codes = float_to_e4m3_satfinite(scaled).reshape(shape)
    return codes, byte


def dequantize_groups(codes: torch.Tensor, scale_bytes: torch.Tensor,
                      group: int = 64) -> torch.Tensor:
    """codes uint8 [..., n] with one UE8M0 byte per group -> bf16 = RNE(e4m3 * scale)."""
    v = e4m3_to_float(codes)
    shape = v.shape
    v = v.reshape(*shape[:-1], shape[-1] // group, group)
    out = v * ue8m0_to_float(scale_bytes).unsqueeze(-1)  # float32 product (exact)
    return out.reshape(shape).to(torch.bfloat16)
