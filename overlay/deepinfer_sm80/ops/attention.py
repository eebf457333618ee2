# SPDX-License-Identifier: Apache-2.0
"""SM80 sparse MLA attention: drop-ins for upstream's FlashMLA calls in
``vllm/models/deepseek_v4/nvidia/flashmla.py``.

* :func:`flash_mla_with_kvcache` - the decode call (FP8 ``fp8_ds_mla`` paged caches: the
  sliding-window cache plus the compressed "extra" cache, one softmax over both lists).
* :func:`flash_mla_sparse_fwd` - the prefill call (bf16 workspace rows, one index list).

Semantics are those of :mod:`deepinfer_sm80.reference.attention`. Heads are taken as they
come (no padding to 64/128). Imports nothing but torch and the built extension.
"""

from __future__ import annotations

import torch

__all__ = [
    "flash_mla_with_kvcache",
    "flash_mla_sparse_fwd",
    "sparse_mla_decode",
    "sparse_mla_plan",
]

HEAD_DIM = 512


def _ops():
    try:  # the package loader builds the error message for a missing extension
        from deepinfer_sm80 import _ext  # noqa: F401
    except ImportError:
        pass
    ns = torch.ops.deepinfer_sm80
    try:
        ns.sparse_mla_decode
    except (AttributeError, RuntimeError) as e:
        raise RuntimeError(
            "deepinfer_sm80 sparse MLA ops are not registered: build the extension "
            "(`make build`) or load it with torch.ops.load_library(<path to _C.so>)"
        ) from e
    return ns


def _rows_ok(t: torch.Tensor) -> bool:
    """16-byte aligned rows: last dim contiguous, other strides multiples of 8 elements."""
    if t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    return all(t.stride(d) % 8 == 0 or t.size(d) <= 1 for d in range(t.dim() - 1))


def _int32(x: torch.Tensor | None, name: str) -> torch.Tensor | None:
    if x is None:
        return None
    if x.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {x.dtype}")
    return x if x.stride(-1) == 1 else x.contiguous()


def sparse_mla_decode(
    q: torch.Tensor,
    swa_cache: torch.Tensor,
    swa_indices: torch.Tensor,
    swa_lens: torch.Tensor | None,
    extra_cache: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    extra_lens: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    *,
    num_sms: int = 0,
    smem_cap: int = 0,
    num_splits: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode over FP8 paged caches; ``q`` is ``[tokens, 1, heads, 512]``.

    ``swa_indices`` / ``extra_indices`` are ``[tokens, (1,) topk]`` int32 slot ids
    (``block * block_size + offset``, -1 = unused) with optional ``[tokens]`` lengths.
    ``num_sms`` (0 = the device's), ``smem_cap`` (0 = the device's per-block limit; 99 KB
    selects the SM86 configurations) and ``num_splits`` (0 = automatic) are tuning and test
    knobs. Returns ``(out [tokens, 1, heads, 512] bf16, lse [tokens, heads, 1] fp32)``."""
    if q.dim() != 4 or q.shape[1] != 1 or q.shape[3] != HEAD_DIM:
        raise ValueError(f"q must be [tokens, 1, heads, {HEAD_DIM}], got {tuple(q.shape)}")
    if q.dtype != torch.bfloat16:
        raise TypeError(f"q must be bfloat16, got {q.dtype}")
    if (extra_cache is None) != (extra_indices is None):
        raise ValueError("extra_cache and extra_indices must be given together")
    t, _, h, _ = q.shape
    if not _rows_ok(q):
        q = q.contiguous()
    target = out
    if out is None or not _rows_ok(out):
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = torch.empty(t, h, 1, dtype=torch.float32, device=q.device)
    sink = None if attn_sink is None else attn_sink.float().contiguous()
    _ops().sparse_mla_decode(
        q, swa_cache, _int32(swa_indices, "swa_indices"), _int32(swa_lens, "swa_lens"),
        extra_cache, _int32(extra_indices, "extra_indices"), _int32(extra_lens, "extra_lens"),
        sink, float(scale), out, lse, num_sms, smem_cap, num_splits)
    if target is not None and target is not out:
        target.copy_(out)
        out = target
    return out, lse


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata=None,
    num_splits=None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream-compatible sparse FP8 decode: ``q [b, s_q, h, 512]``, ``indices
    [b, s_q, topk]``, lengths per batch row. Returns ``(out, lse [b, h, s_q])``.

    ``block_table``, ``cache_seqlens``, ``tile_scheduler_metadata`` and ``num_splits`` are
    accepted for signature compatibility and ignored (sparse mode needs none of them)."""
    if indices is None:
        raise NotImplementedError("only sparse decode (indices given) is implemented for SM80")
    if not is_fp8_kvcache:
        raise ValueError("sparse decode reads the FP8 fp8_ds_mla cache: pass is_fp8_kvcache=True")
    if causal:
        raise ValueError("causal must be False for sparse attention")
    if head_dim_v != HEAD_DIM:
        raise ValueError(f"head_dim_v must be {HEAD_DIM}, got {head_dim_v}")
    b, s_q, h, d = q.shape
    scale = softmax_scale if softmax_scale is not None else d**-0.5

    def rows(x, per_batch):
        if x is None:
            return None
        if per_batch:  # one length per batch row, shared by its s_q query rows
            return x.reshape(b).repeat_interleave(s_q) if s_q > 1 else x.reshape(b)
        return x.reshape(b * s_q, x.shape[-1])

    q2 = q.reshape(b * s_q, 1, h, d)
    out2 = None if out is None else out.view(b * s_q, 1, h, d)
    o, lse = sparse_mla_decode(
        q2, k_cache, rows(indices, False), rows(topk_length, True), extra_k_cache,
        rows(extra_indices_in_kvcache, False), rows(extra_topk_length, True), attn_sink, scale,
        out2)
    if out is None:
        out = o.view(b, s_q, h, d)
    lse = lse.view(b, s_q, h).transpose(1, 2)
    return out, lse


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = HEAD_DIM,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    smem_cap: int = 0,
    num_sms: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upstream-compatible sparse prefill: ``q [T, h, 512]``, ``kv [s_kv, 1, 512]`` bf16,
    ``indices [T, 1, topk]`` int32 (invalid: < 0 or >= s_kv), ``topk_length [T]``.
    Returns ``(out [T, h, 512] bf16, max_logits [T, h], lse [T, h])`` (natural log).

    ``smem_cap`` / ``num_sms`` (0 = the device's) emulate a smaller GPU: the tile
    configuration follows the cap, the split of the last partial wave's tokens the SM count."""
    if d_v != HEAD_DIM:
        raise ValueError(f"d_v must be {HEAD_DIM}, got {d_v}")
    if q.dim() != 3 or q.shape[-1] != HEAD_DIM or q.dtype != torch.bfloat16:
        raise ValueError(f"q must be bfloat16 [T, heads, {HEAD_DIM}], got {q.dtype} {tuple(q.shape)}")
    if kv.dtype != torch.bfloat16:
        raise TypeError(f"kv must be bfloat16, got {kv.dtype}")
    t, h, _ = q.shape
    if not _rows_ok(q):
        q = q.contiguous()
    if not _rows_ok(kv):
        kv = kv.contiguous()
    target = out
    if out is None or not _rows_ok(out):
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    max_logits = torch.empty(t, h, dtype=torch.float32, device=q.device)
    lse = torch.empty(t, h, dtype=torch.float32, device=q.device)
    sink = None if attn_sink is None else attn_sink.float().contiguous()
    _ops().sparse_mla_prefill(
        q, kv, _int32(indices, "indices"), _int32(topk_length, "topk_length"), sink,
        float(sm_scale), out, max_logits, lse, smem_cap,
        # by keyword and only when set: an extension built before the argument existed
        # (a same-run A/B's base build) still takes the call
        **({"num_sms": num_sms} if num_sms else {}))
    if target is not None and target is not out:
        target.copy_(out)
        out = target
    return out, max_logits, lse


def sparse_mla_plan(
    num_tokens: int, num_heads: int, capacity: int, fp8: bool, num_sms: int = 0, smem_cap: int = 0
) -> dict:
    """The tile configuration and split count a call would use on this device: decode
    splits every token's key list ``splits`` ways (``split_tokens`` = all tokens when
    ``splits`` > 1), prefill only the ``split_tokens`` tokens of its last partial wave."""
    hg, bk, threads, smem, splits, split_tokens = _ops().sparse_mla_plan(
        num_tokens, num_heads, capacity, fp8, num_sms, smem_cap)
    return {"heads_per_block": hg, "keys_per_tile": bk, "threads": threads,
            "smem_bytes": smem, "splits": splits, "split_tokens": split_tokens}
