"""DeepSeek-V4 output projection for SM80: inverse RoPE in bf16 (no FP8
quantisation) + grouped ``wo_a`` bmm in bf16 + ``wo_b``.

Upstream's CUDA path quantises the rotated output to FP8 and calls DeepGEMM's
``fp8_einsum`` (SM90+); its fallback ``bmm`` reads ``wo_a.weight`` after
Marlin has repacked it to int32 tiles, which is garbage.  Here ``wo_a`` is
dequantised once at load time, *before* the linear method repacks it, and
kept as a bf16 ``[groups, o_lora_rank, heads_per_group * head_dim]`` tensor.

Imports nothing but torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def inverse_rope_bf16(o: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      nope_dim: int = 448, out: torch.Tensor | None = None) -> torch.Tensor:
    """Undo the GPT-J RoPE on the last dims of every head.

    ``o`` [T, H, D] bf16, ``cos_sin_cache`` [P, rope] (cos | sin halves).
    even' = e*cos + o*sin, odd' = o*cos - e*sin, in fp32, rounded to bf16.
    NoPE dims are copied unchanged."""
    T, H, D = o.shape
    rope = D - nope_dim
    if out is None:
        out = torch.empty_like(o)
    out[..., :nope_dim] = o[..., :nope_dim]
    if T == 0:
        return out
    cs = cos_sin_cache.index_select(0, positions.to(torch.long)).to(torch.float32)
    cos = cs[:, None, : rope // 2]
    sin = cs[:, None, rope // 2: rope]
    x = o[..., nope_dim:].to(torch.float32)
    e, d = x[..., 0::2], x[..., 1::2]
    r = out[..., nope_dim:]
    r[..., 0::2] = (e * cos + d * sin).to(out.dtype)
    r[..., 1::2] = (d * cos - e * sin).to(out.dtype)
    return out


def _triton_inverse_rope():
    """The Triton inverse-RoPE kernel, or None where Triton is unavailable."""
    try:
        from .o_proj_triton import inverse_rope_kernel
    except ImportError:
        return None
    return inverse_rope_kernel


_INV_ROPE = None


def inverse_rope_flat(o: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      nope_dim: int = 448) -> torch.Tensor:
    """Inverse RoPE of ``o`` [T, H, D] (any head stride) into a contiguous
    bf16 [T, H * D]; one Triton kernel on CUDA, torch elsewhere."""
    global _INV_ROPE
    T, H, D = o.shape
    if not o.is_cuda or o.dtype != torch.bfloat16 or o.stride(-1) != 1:
        return inverse_rope_bf16(o, positions, cos_sin_cache, nope_dim).reshape(T, H * D)
    if _INV_ROPE is None:
        _INV_ROPE = _triton_inverse_rope() or False
    out = torch.empty((T, H * D), dtype=o.dtype, device=o.device)
    if not _INV_ROPE:
        inverse_rope_bf16(o, positions, cos_sin_cache, nope_dim, out=out.view(T, H, D))
        return out
    if T:
        _INV_ROPE[(T, H)](o, o.stride(0), o.stride(1), positions, cos_sin_cache,
                          cos_sin_cache.stride(0), out, out.stride(0), H, D=D, NOPE=nope_dim,
                          HALF=(D - nope_dim) // 2, num_warps=4)
    return out


def grouped_wo_a(o_rot: torch.Tensor, wo_a_grouped: torch.Tensor) -> torch.Tensor:
    """``o_rot`` [T, G * hpg, D] bf16, ``wo_a_grouped`` [G, R, hpg * D] bf16 ->
    z [T, G, R] bf16 (fp32 accumulation in cuBLAS)."""
    T = o_rot.shape[0]
    G, R, K = wo_a_grouped.shape
    x = o_rot.reshape(T, G, K).transpose(0, 1)  # [G, T, K]
    z = torch.bmm(x, wo_a_grouped.transpose(1, 2))  # [G, T, R]
    return z.transpose(0, 1)


def o_proj_sm80(
    o: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    wo_a_grouped: torch.Tensor,
    wo_b: Callable[[torch.Tensor], torch.Tensor],
    *,
    nope_dim: int = 448,
) -> torch.Tensor:
    o_rot = inverse_rope_flat(o, positions, cos_sin_cache, nope_dim)
    z = grouped_wo_a(o_rot.view(o.shape), wo_a_grouped)
    return wo_b(z.reshape(z.shape[0], -1))


def dequant_weight(weight: torch.Tensor, scale: torch.Tensor | None,
                   block: tuple[int, int] | None = None) -> torch.Tensor:
    """FP8 (or bf16) linear weight [M, K] with optional scales -> fp32.

    ``scale``: scalar, per-row [M] / [M, 1], or a block grid [ceil(M/bm),
    ceil(K/bk)] (fp32 or UE8M0 ``float8_e8m0fnu``); the block size is taken
    from ``block`` or inferred from the grid."""
    w = weight.to(torch.float32)
    if scale is None:
        return w
    if scale.dtype == torch.uint8 or str(scale.dtype) == "torch.float8_e8m0fnu":
        s = torch.pow(2.0, scale.view(torch.uint8).to(torch.float32) - 127.0)
    else:
        s = scale.to(torch.float32)
    M, K = w.shape
    if s.numel() == 1:
        return w * s.reshape(())
    if s.dim() == 1 or (s.dim() == 2 and s.shape[1] == 1 and s.shape[0] == M):
        return w * s.reshape(M, 1)
    if block is None:
        block = (-(-M // s.shape[0]), -(-K // s.shape[1]))
    bm, bk = block
    s = s.repeat_interleave(bm, dim=0).repeat_interleave(bk, dim=1)[:M, :K]
    return w * s


def group_wo_a(weight_fp32: torch.Tensor, n_groups: int, o_lora_rank: int) -> torch.Tensor:
    """[G * R, hpg * D] -> contiguous bf16 [G, R, hpg * D]."""
    return weight_fp32.to(torch.bfloat16).view(n_groups, o_lora_rank, -1).contiguous()


def o_proj_reference64(o, positions, cos_sin_cache, wo_a_grouped, wo_b_weight, nope_dim=448):
    """float64 oracle: inverse RoPE, grouped projection, wo_b (no rounding)."""
    T, H, D = o.shape
    rope = D - nope_dim
    x = o.to(torch.float64).clone()
    cs = cos_sin_cache[positions.long()].to(torch.float64)
    cos, sin = cs[:, None, : rope // 2], cs[:, None, rope // 2: rope]
    e, d = x[..., nope_dim::2].clone(), x[..., nope_dim + 1::2].clone()
    x[..., nope_dim::2] = e * cos + d * sin
    x[..., nope_dim + 1::2] = d * cos - e * sin
    G, R, K = wo_a_grouped.shape
    z = torch.einsum("tgk,grk->tgr", x.reshape(T, G, K), wo_a_grouped.to(torch.float64))
    return z.reshape(T, G * R) @ wo_b_weight.to(torch.float64).t()
