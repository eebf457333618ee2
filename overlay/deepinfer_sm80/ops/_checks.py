"""Argument checks shared by the op wrappers: each raises a ValueError/TypeError that
names the argument and what to pass instead."""

from __future__ import annotations

import torch


def cuda_tensor(t: torch.Tensor, name: str, device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {device}")


def dtype(t: torch.Tensor, name: str, *allowed: torch.dtype) -> None:
    if t.dtype not in allowed:
        want = " or ".join(str(a) for a in allowed)
        raise TypeError(f"{name} must be {want}, got {t.dtype}")


def dim(t: torch.Tensor, name: str, n: int, what: str) -> None:
    if t.dim() != n:
        raise ValueError(f"{name} must be {what}, got shape {tuple(t.shape)}")


def contiguous_1d(t: torch.Tensor, name: str, min_len: int = 0) -> None:
    if t.dim() != 1 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D tensor, got shape "
                         f"{tuple(t.shape)} strides {t.stride()} (pass .contiguous())")
    if t.size(0) < min_len:
        raise ValueError(f"{name} has {t.size(0)} entries, needs at least {min_len}")


def vector(t: torch.Tensor, name: str, device: torch.device | None, want: torch.dtype,
           min_len: int = 0) -> None:
    """A contiguous 1-D CUDA tensor of dtype ``want`` on ``device`` with >= min_len entries."""
    cuda_tensor(t, name, device)
    dtype(t, name, want)
    contiguous_1d(t, name, min_len)


def rows16(t: torch.Tensor, name: str) -> None:
    """Last dim contiguous, other strides multiples of 16 bytes, 16-byte aligned start."""
    es = t.element_size()
    ok = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(
        t.size(d) <= 1 or (t.stride(d) * es) % 16 == 0 for d in range(t.dim() - 1))
    if not ok:
        raise ValueError(f"{name} rows must be contiguous and 16-byte aligned (strides "
                         f"{t.stride()}); pass a contiguous tensor")
