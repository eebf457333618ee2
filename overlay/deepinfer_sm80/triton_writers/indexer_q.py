"""Index-Q RoPE + per-(token, head) UE8M0 FP8 quantisation for SM80.

Semantics of upstream's ``fused_indexer_q_rope_quant`` FP8 path
(common/ops/fused_indexer_q.py): GPT-J RoPE in fp32 on the last 64 of the
128 dims, rounded to bf16; the NoPE dims pass through; scale =
2^ceil(log2(max(amax, 1e-4) / 448)) with an exact integer ceil-log2; codes =
e4m3(x / scale) in software; ``weights_out = w * scale * softmax_scale *
head_scale``.  The FP8 output is a uint8 buffer returned as a
``float8_e4m3fn`` view (a storage type only: nothing on SM80 computes in it).
"""

import torch
import triton
import triton.language as tl

from .fp8 import bf16_rne, e4m3_encode, ue8m0_from_scale, ue8m0_to_scale


@triton.jit
def _indexer_q_rope_quant_kernel(
    pos_ptr,
    q_ptr,
    q_stride0,
    q_stride1,
    cs_ptr,
    cs_stride,
    out_ptr,
    out_stride0,
    out_stride1,
    w_ptr,
    w_stride,
    w_out_ptr,
    w_out_stride,
    softmax_scale,
    head_scale,
    HEAD_DIM: tl.constexpr,
    HALF_ROT: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    NOPE: tl.constexpr = HEAD_DIM - 2 * HALF_ROT
    pos = tl.load(pos_ptr + tok)
    j = tl.arange(0, HALF_ROT)
    cos_v = tl.load(cs_ptr + pos * cs_stride + j).to(tl.float32)
    sin_v = tl.load(cs_ptr + pos * cs_stride + HALF_ROT + j).to(tl.float32)
    base = q_ptr + tok * q_stride0 + head * q_stride1
    xe = tl.load(base + NOPE + 2 * j).to(tl.float32)
    xo = tl.load(base + NOPE + 2 * j + 1).to(tl.float32)
    re = bf16_rne(xe * cos_v - xo * sin_v)
    ro = bf16_rne(xo * cos_v + xe * sin_v)
    amax = tl.maximum(tl.max(tl.abs(re), axis=0), tl.max(tl.abs(ro), axis=0))
    if NOPE > 0:
        k = tl.arange(0, NOPE)
        xn = tl.load(base + k).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(xn), axis=0))
    ue, inv_scale = ue8m0_from_scale(tl.div_rn(tl.maximum(amax, 1.0e-4), 448.0))
    scale = ue8m0_to_scale(ue)
    obase = out_ptr + tok * out_stride0 + head * out_stride1
    if NOPE > 0:
        tl.store(obase + k, e4m3_encode(xn * inv_scale))
    tl.store(obase + NOPE + 2 * j, e4m3_encode(re * inv_scale))
    tl.store(obase + NOPE + 2 * j + 1, e4m3_encode(ro * inv_scale))
    w = tl.load(w_ptr + tok * w_stride + head).to(tl.float32)
    w = w * scale
    w = w * softmax_scale
    w = w * head_scale
    tl.store(w_out_ptr + tok * w_out_stride + head, w)


def indexer_q_rope_quant(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    index_q_cos_sin_cache: torch.Tensor,
    index_weights: torch.Tensor,
    index_weights_softmax_scale: float,
    index_weights_head_scale: float,
    use_fp4: bool = False,
    weights_out_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
    weights_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for upstream ``fused_indexer_q_rope_quant`` (FP8 path only).

    Returns ``(q_fp8 [T, H, D] float8_e4m3fn view of uint8, weights_out
    [T, H] fp32)``.  ``out`` (uint8) / ``weights_out`` may be persistent
    buffers (CUDA-graph capture)."""
    if use_fp4:
        raise NotImplementedError(
            "The MXFP4 indexer cache needs SM100; SM80 keeps the FP8 indexer")
    if weights_out_dtype != torch.float32:
        raise ValueError("the FP8 indexer path produces fp32 weights")
    if positions.dim() != 1 or index_q.dim() != 3 or index_q_cos_sin_cache.dim() != 2:
        raise ValueError("expected positions [T], index_q [T, H, D], cos_sin [P, rope]")
    T, H, D = index_q.shape
    rope = index_q_cos_sin_cache.shape[1]
    if index_q.stride(-1) != 1 or index_q_cos_sin_cache.stride(-1) != 1:
        raise ValueError("index_q and cos_sin_cache need a unit last stride")
    if out is None:
        out = torch.empty((T, H, D), dtype=torch.uint8, device=index_q.device)
    if weights_out is None:
        weights_out = torch.empty((T, H), dtype=torch.float32, device=index_q.device)
    if T > 0:
        _indexer_q_rope_quant_kernel[(T, H)](
            positions,
            index_q,
            index_q.stride(0),
            index_q.stride(1),
            index_q_cos_sin_cache,
            index_q_cos_sin_cache.stride(0),
            out,
            out.stride(0),
            out.stride(1),
            index_weights,
            index_weights.stride(0),
            weights_out,
            weights_out.stride(0),
            index_weights_softmax_scale,
            index_weights_head_scale,
            HEAD_DIM=D,
            HALF_ROT=rope // 2,
            num_warps=1,
        )
    return out.view(torch.float8_e4m3fn), weights_out
