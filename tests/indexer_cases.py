"""Indexer inputs whose fp32 scoring is exact (dyadic, low-precision values),
so the float64 oracle's top-k sets, ties included, must be matched exactly.
Imports nothing but torch."""

import torch

from deepinfer_sm80.reference.writers import e4m3_encode_ref


def dyadic_fp8(shape, g, lo=-2, hi=2):
    """e4m3 codes of values m * 2^e, m in [-8, 8], e in [lo, hi]: products and
    sums of these stay exact in fp32."""
    m = torch.randint(-8, 9, shape, generator=g).double()
    e = torch.randint(lo, hi + 1, shape, generator=g).double()
    return e4m3_encode_ref(m * torch.pow(2.0, e)), m * torch.pow(2.0, e)


def dyadic_weights(shape, g):
    return (torch.randint(-4, 5, shape, generator=g).double() * 0.25)


def k_scales(n, g):
    return torch.pow(2.0, torch.randint(-2, 3, (n,), generator=g).double())


def logits64(q64, w64, k64, ks64):
    """q [T, H, D], w [T, H], k [N, D], ks [N] (float64) -> [T, N]."""
    s = torch.einsum("thd,nd->thn", q64, k64).clamp(min=0)
    return (s * w64.unsqueeze(-1)).sum(1) * ks64
