"""Torch reference of the mHC pre block's projection (vLLM 0.33.0
``vllm/model_executor/kernels/mhc/tilelang.py`` ``_hc_prenorm_gemm_outputs``), written from
the semantics, and the arithmetic of this project's SM80 kernel (``csrc/mhc/prenorm_gemm.cu``)
in torch, so that the tolerances of its tests can be checked on the CPU.

For x [T, K] bf16 and fn [24, K] fp32, split into ``n_splits`` ranges of whole 64-column
tiles of K (:func:`split_bounds`):
    out[s, t, n] = sum_{k in range s} x[t, k] * fn[n, k]
    sqrsum[s, t] = sum_{k in range s} x[t, k] ** 2
vLLM's consumers (the mHC big-fuse kernels) add the splits up.
"""

from __future__ import annotations

import torch

#: relative Frobenius error of ``out`` against float64 that the kernel must stay within:
#: the hi/lo split carries fn to 16 mantissa bits (~2.5e-6 for random data) and fp32
#: accumulation adds about as much (the kernel sums each 64-column tile's mma steps apart,
#: since mma.sync's own accumulation truncates: one chain over K modelled at 5e-5 - 9e-5);
#: one bf16 term alone (~1.7e-3) or TF32 (~2e-4) fails it
OUT_REL_TOL = 2e-5
#: per-token relative error of ``sqrsum`` (exact squares, fp32 sums of positive terms)
SQRSUM_REL_TOL = 2e-5


def split_bounds(k: int, n_splits: int, block_k: int = 64) -> list[tuple[int, int]]:
    """The K range of each split, in whole ``block_k`` tiles: split s takes tiles
    [s * n // S, (s + 1) * n // S) of the n = K / block_k tiles (one range when S = 1)."""
    if n_splits == 1:
        return [(0, k)]
    if k % block_k or not 1 <= n_splits <= k // block_k:
        raise ValueError(f"{n_splits} splits of K = {k} need K a multiple of {block_k} and "
                         f"at most K / {block_k} splits")
    n = k // block_k
    return [(s * n // n_splits * block_k, (s + 1) * n // n_splits * block_k)
            for s in range(n_splits)]


def hc_prenorm_gemm(x: torch.Tensor, fn: torch.Tensor, n_splits: int = 1
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [n_splits, T, N], sqrsum [n_splits, T]) in float64."""
    T, K = x.shape
    if fn.shape[1] != K:
        raise ValueError(f"fn {tuple(fn.shape)} does not fit x {tuple(x.shape)}")
    xd, fd = x.double(), fn.double()
    outs, sqs = [], []
    for a, b in split_bounds(K, n_splits):
        outs.append(xd[:, a:b] @ fd[:, a:b].t())
        sqs.append(xd[:, a:b].square().sum(-1))
    return torch.stack(outs), torch.stack(sqs)


def split_bf16(fn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's two bf16 terms of an fp32 tensor: hi = bf16(fn), lo = bf16(fn - hi)
    (round to nearest even both times; fn - hi is exact in fp32)."""
    f = fn.float()
    hi = f.to(torch.bfloat16)
    lo = (f - hi.float()).to(torch.bfloat16)
    return hi, lo


def kernel_products(x: torch.Tensor, fn: torch.Tensor, n_splits: int = 1, *,
                    terms: int = 2) -> torch.Tensor:
    """``out`` as the kernel forms it, up to the order of fp32 accumulation: x times the
    first ``terms`` bf16 terms of fn (2: the kernel; 1: a kernel that dropped lo), summed in
    float64."""
    hi, lo = split_bf16(fn)
    approx = hi.double() + (lo.double() if terms == 2 else 0.0)
    return hc_prenorm_gemm(x, approx, n_splits)[0]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64."""
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp(min=1e-300))


def sqrsum_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest per-element relative error of sqrsum (0 where both are 0)."""
    got, want = got.double(), want.double()
    return float(((got - want).abs() / want.abs().clamp(min=1e-300)).max()) if want.numel() else 0.0
