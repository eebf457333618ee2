"""SM80 op for the mHC pre block's projection (vLLM's ``_hc_prenorm_gemm_outputs``):
``hc_prenorm_gemm(x, fn)`` -> (out [n_splits, T, 24], sqrsum [n_splits, T]), fp32, the
layout vLLM's mHC big-fuse kernels read (they add the splits up). Semantics and tolerances:
:mod:`deepinfer_sm80.reference.mhc`. Products on mma.sync bf16 with fn as two bf16 terms.
"""

from __future__ import annotations

import torch

from deepinfer_sm80.ops import _checks as C

N_OUT = 24        # hc_mult * (2 + hc_mult) for hc_mult 4
BLOCK_M = 64      # tokens per block (csrc/mhc/mhc_kernels.h kPrenormBM)
BLOCK_K = 64      # K per pipeline stage (kPrenormBK)
MAX_SPLITS = 256  # kPrenormMaxSplits (and at most K / BLOCK_K)


def _ops():
    from deepinfer_sm80 import _ext  # loads _C, or raises ImportError saying how to build it

    return _ext.ops()


def choose_splits(num_tokens: int, k: int, sm_count: int) -> int:
    """K splits for ``num_tokens`` tokens on ``sm_count`` SMs, by the rule of vLLM's
    ``compute_num_split(64, K, ceil(T / 64))`` (vllm/model_executor/kernels/mhc/
    tilelang_kernels.py:45, the split count of DeepGEMM's projection that vLLM's big-fuse
    kernels are compiled for): SMs per 64-token block, at most a quarter of the 64-column
    K tiles, at least 1."""
    if num_tokens <= 0 or k <= 0 or sm_count <= 0:
        raise ValueError(f"num_tokens, k and sm_count must be > 0, got {num_tokens}, {k}, {sm_count}")
    m_tiles = -(-num_tokens // BLOCK_M)
    return max(1, min(sm_count // m_tiles, (-(-k // BLOCK_K)) // 4, MAX_SPLITS))


def _check_inputs(x: torch.Tensor, fn: torch.Tensor) -> tuple[int, int]:
    C.cuda_tensor(x, "x")
    C.dtype(x, "x", torch.bfloat16)
    C.dim(x, "x", 2, "[num_tokens, K]")
    C.rows16(x, "x")
    C.cuda_tensor(fn, "fn", x.device)
    C.dtype(fn, "fn", torch.float32)
    T, K = x.shape
    if tuple(fn.shape) != (N_OUT, K):
        raise ValueError(f"fn must be [{N_OUT}, K={K}], got {tuple(fn.shape)}")
    if K % BLOCK_K or K == 0:
        raise ValueError(f"K ({K}) must be a positive multiple of {BLOCK_K}")
    return T, K


def _check_splits(n_splits: int, K: int) -> None:
    if not 1 <= n_splits <= min(MAX_SPLITS, K // BLOCK_K):
        raise ValueError(f"n_splits must be in [1, {min(MAX_SPLITS, K // BLOCK_K)}] (K / "
                         f"{BLOCK_K}, at most {MAX_SPLITS}), got {n_splits}")


def hc_prenorm_gemm(x: torch.Tensor, fn: torch.Tensor, *, n_splits: int | None = None,
                    sm_count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] bf16 (last dim contiguous), fn [24, K] fp32 -> (out, sqrsum). ``n_splits``
    (None: :func:`choose_splits` for the device's SM count, or ``sm_count``)."""
    T, K = _check_inputs(x, fn)
    if n_splits is None:
        sms = sm_count or torch.cuda.get_device_properties(x.device).multi_processor_count
        n_splits = choose_splits(max(T, 1), K, sms)
    _check_splits(n_splits, K)
    out = torch.empty(n_splits, T, N_OUT, dtype=torch.float32, device=x.device)
    sqrsum = torch.empty(n_splits, T, dtype=torch.float32, device=x.device)
    _ops().hc_prenorm_gemm(x, fn.contiguous(), out, sqrsum, sm_count or 0)
    return out, sqrsum


def hc_prenorm_gemm_out(x: torch.Tensor, fn: torch.Tensor, out: torch.Tensor,
                        sqrsum: torch.Tensor) -> None:
    """The same into caller-allocated outputs, as vLLM's call sites hand them to DeepGEMM's
    ``tf32_hc_prenorm_gemm(x, fn, out, sqrsum, n_splits)``: ``out`` [n_splits, T, 24] and
    ``sqrsum`` [n_splits, T], contiguous fp32; the split count is ``out.shape[0]``."""
    T, K = _check_inputs(x, fn)
    for t, name, shape in ((out, "out", (T, N_OUT)), (sqrsum, "sqrsum", (T,))):
        C.cuda_tensor(t, name, x.device)
        C.dtype(t, name, torch.float32)
        if t.dim() != 1 + len(shape) or tuple(t.shape[1:]) != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous [n_splits, {', '.join(map(str, shape))}] "
                             f"tensor, got {tuple(t.shape)} (contiguous={t.is_contiguous()})")
    if sqrsum.shape[0] != out.shape[0]:
        raise ValueError(f"out and sqrsum disagree on n_splits: {out.shape[0]} vs {sqrsum.shape[0]}")
    _check_splits(out.shape[0], K)
    _ops().hc_prenorm_gemm(x, fn.contiguous(), out, sqrsum, 0)
