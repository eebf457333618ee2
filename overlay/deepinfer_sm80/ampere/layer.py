"""The DeepSeek-V4 sparse-MLA attention step on SM80, as vLLM drives it.

``forward_decode`` / ``forward_prefill`` are the bodies of upstream's
``DeepseekV4FlashMLAAttention._forward_decode`` / ``_forward_prefill`` with
FlashMLA replaced by this package's kernels (``deepinfer_sm80.ops``) where
they are built, and portable implementations otherwise (``resolve_ops``).
They take plain tensors and ints, so the same code runs inside vLLM (the
adapter in ``vllm/models/deepseek_v4/nvidia/ampere_sparse.py``) and in the
GPU tests without vLLM.

CUDA-graph rules kept on the decode path: no host synchronisation (no
``.item()``, ``.tolist()``, data-dependent shapes), outputs written into
caller-owned buffers, scratch from a persistent shape-keyed ``Workspace``
that refuses to grow while a graph is being captured.

Imports nothing but torch (and this package).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import portable


class Workspace:
    """Persistent buffers keyed by name, grown only outside graph capture."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
        n = math.prod(shape)
        key = (name, dtype, torch.device(device))
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < n:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"workspace '{name}' must grow to {shape} during CUDA-graph capture; "
                    "run one eager step at the largest captured batch size first")
            buf = torch.empty(max(n, 1), dtype=dtype, device=device)
            self._bufs[key] = buf
        return buf[:n].view(shape)


@dataclass
class AmpereOps:
    gather: Callable[..., Any]
    global_topk: Callable[..., Any]
    combine: Callable[..., Any]
    decode: Callable[..., Any]
    prefill: Callable[..., Any]
    source: dict[str, str]


def _cuda_op(module: str, name: str, torch_op: str):
    """``module.name`` when the extension loads and registers ``torch_op``."""
    try:
        from deepinfer_sm80 import _ext

        _ext.load()
        if not hasattr(torch.ops.deepinfer_sm80, torch_op):
            return None
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, OSError, RuntimeError):
        return None


def resolve_ops(device: torch.device | str = "cuda", prefer_portable: bool = False) -> AmpereOps:
    """Pick, per step, this package's CUDA kernel if built, else a portable one."""
    dev = torch.device(device)
    src: dict[str, str] = {}

    def pick(step, module, name, torch_op, fallback, fallback_name):
        fn = None if (prefer_portable or dev.type != "cuda") else _cuda_op(module, name, torch_op)
        if fn is not None:
            src[step] = f"{module}.{name}"
            return fn
        src[step] = fallback_name
        return fallback

    gather_fb, gather_name = portable.dequantize_and_gather_k_cache, "portable (torch)"
    if dev.type == "cuda":
        try:
            from deepinfer_sm80.triton_portable import dequantize_and_gather_k_cache as tp

            gather_fb, gather_name = tp, "triton_portable.dequantize_and_gather_k_cache"
        except ImportError:
            pass
    return AmpereOps(
        gather=pick("gather", "deepinfer_sm80.ops.cache", "dequantize_and_gather_k_cache",
                    "dequantize_and_gather_k_cache", gather_fb, gather_name),
        global_topk=pick("global_topk", "deepinfer_sm80.ops.index",
                         "compute_global_topk_indices_and_lens",
                         "compute_global_topk_indices_and_lens",
                         portable.compute_global_topk_indices_and_lens, "portable (torch)"),
        combine=pick("combine", "deepinfer_sm80.ops.index", "combine_topk_swa_indices",
                     "combine_topk_swa_indices", portable.combine_topk_swa_indices,
                     "portable (torch)"),
        decode=pick("decode", "deepinfer_sm80.ops.attention", "sparse_mla_decode",
                    "sparse_mla_decode", portable.sparse_decode, "portable (torch)"),
        prefill=pick("prefill", "deepinfer_sm80.ops.attention", "flash_mla_sparse_fwd",
                     "sparse_mla_prefill", portable.sparse_prefill, "portable (torch)"),
        source=src,
    )


def forward_decode(
    ops: AmpereOps,
    *,
    q: torch.Tensor,  # [T, Hp, 512] bf16 (padded heads)
    swa_cache: torch.Tensor,  # uint8 [nb, 64, 584] view
    compressed_cache: torch.Tensor | None,  # uint8 [nb, 256 // ratio, 584] view
    swa_indices: torch.Tensor,  # [T, W] int32 global slots
    swa_lens: torch.Tensor,  # [T] int32
    compress_ratio: int,
    scale: float,
    attn_sink: torch.Tensor,  # [Hp] fp32
    out: torch.Tensor,  # [T, Hp, 512] bf16
    topk_local: torch.Tensor | None = None,  # C4: [T, K] local indices
    token_to_req_indices: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,  # compressed-cache block table
    compressed_block_size: int | None = None,
    is_valid_token: torch.Tensor | None = None,
    c128_global_indices: torch.Tensor | None = None,  # C128: precomputed
    c128_lens: torch.Tensor | None = None,
    compressed_path: str | None = None,
) -> torch.Tensor:
    """Decode attention for ``T`` query tokens (1 + speculative per request).

    ``compressed_path`` says how the compressed entries are chosen: ``"none"``
    (sliding window only), ``"topk"`` (request-local top-k indices made global
    through the block table) or ``"precomputed"`` (global indices given). By
    default it follows DeepSeek-V4's ratios: 1 none, 4 topk, 128 precomputed.
    DeepSeek-V4.1 passes it (ratio 0 none; ratios 1 and 2 topk)."""
    T = q.shape[0]
    path = compressed_path or _v4_compressed_path(compress_ratio)
    extra_idx = extra_lens = None
    if path == "topk":
        extra_idx, extra_lens = ops.global_topk(
            topk_local[:T], token_to_req_indices[:T], block_table,
            compressed_block_size, is_valid_token[:T])
    elif path == "precomputed":
        extra_idx, extra_lens = c128_global_indices, c128_lens
    elif path != "none":
        raise ValueError(f"compressed_path must be none, topk or precomputed, got {path!r}")
    ops.decode(q.unsqueeze(1), swa_cache, swa_indices[:T], swa_lens[:T],
               compressed_cache if path != "none" else None, extra_idx, extra_lens,
               attn_sink, scale, out.unsqueeze(1))
    return out


def _v4_compressed_path(compress_ratio: int) -> str:
    """DeepSeek-V4's meaning of its compress ratios (1: SWA only, 4: C4, 128: C128)."""
    if compress_ratio <= 1:
        return "none"
    return "topk" if compress_ratio == 4 else "precomputed"


def forward_prefill(
    ops: AmpereOps,
    workspace: Workspace,
    *,
    q: torch.Tensor,  # [Tp, Hp, 512] prefill tokens
    out: torch.Tensor,
    swa_cache: torch.Tensor,
    compressed_cache: torch.Tensor | None,
    seq_lens: torch.Tensor,  # [P]
    gather_lens: torch.Tensor,  # [P]
    query_start_loc: torch.Tensor,  # [P + 1] device, as vLLM has it (need not start at 0)
    query_start_loc_cpu: torch.Tensor,  # [P + 1] host
    swa_block_table: torch.Tensor,  # [P, *]
    swa_block_size: int,
    compressed_block_table: torch.Tensor | None,
    compressed_block_size: int | None,
    topk_indices: torch.Tensor | None,  # [Tp, K] local (C4) or C128 prefill indices
    compress_ratio: int,
    window_size: int,
    scale: float,
    attn_sink: torch.Tensor,
    chunk_plan: list[tuple[int, int, int, int]],
    max_tokens: int | None = None,
    swa_only: bool | None = None,
    v41: bool = False,
) -> torch.Tensor:
    """Prefill: per chunk of requests, gather compressed (offset 0) and window
    (offset N) entries into a bf16 workspace, combine indices, attend.
    ``swa_only`` defaults to DeepSeek-V4's meaning (ratio <= 1); DeepSeek-V4.1
    passes it (only ratio 0 is SWA-only there; ratio 1 has a compressed region).
    ``v41``: DeepSeek-V4.1's combine (the window clamped to the gathered buffer's
    start: its ``gather_lens`` leave out context below a request's replay start
    after a prefix-cache hit; failed top-k entries stay -1)."""
    swa_only = compress_ratio <= 1 if swa_only is None else swa_only
    top_k = 0 if swa_only else topk_indices.shape[-1]
    width = ((top_k + window_size + 127) // 128) * 128
    D = q.shape[-1]
    rows = max_tokens or q.shape[0]
    qsl = query_start_loc_cpu.tolist()
    for c0, c1, chunk_n, chunk_m in chunk_plan:
        n = c1 - c0
        kv = workspace.get("prefill_kv", (n, chunk_m, D), torch.bfloat16, q.device)
        idx_buf = workspace.get("prefill_idx", (rows, width), torch.int32, q.device)
        len_buf = workspace.get("prefill_len", (rows,), torch.int32, q.device)
        if not swa_only:
            ops.gather(kv, compressed_cache, seq_lens[c0:c1] // compress_ratio, None,
                       compressed_block_table[c0:c1], compressed_block_size, 0)
        ops.gather(kv, swa_cache, seq_lens[c0:c1], gather_lens[c0:c1], swa_block_table[c0:c1],
                   swa_block_size, chunk_n)
        t0, t1 = qsl[c0] - qsl[0], qsl[c1] - qsl[0]
        tk = topk_indices[t0:t1] if not swa_only else q.new_empty((t1 - t0, 0), dtype=torch.int32)
        idx, lens = ops.combine(tk, query_start_loc[c0:c1 + 1], seq_lens[c0:c1],
                                gather_lens[c0:c1], window_size, compress_ratio, top_k, chunk_m,
                                chunk_n, out=(idx_buf[: t1 - t0], len_buf[: t1 - t0]),
                                **({"v41": True} if v41 else {}))
        ops.prefill(q=q[t0:t1], kv=kv.view(-1, 1, D), indices=idx.unsqueeze(1), sm_scale=scale,
                    attn_sink=attn_sink, topk_length=lens, out=out[t0:t1])
    return out


def plan_prefill_chunks(seq_lens_cpu: list[int], compress_ratio: int, window_size: int,
                        chunk_size: int = 4, max_query_lens: list[int] | None = None,
                        swa_only: bool | None = None):
    """(start, end, N, M) per chunk of ``chunk_size`` requests: N = max
    compressed entries in the chunk (0 for SWA-only), M = N + window + max
    query length (the workspace rows per request). ``swa_only`` as in
    ``forward_prefill``."""
    swa_only = compress_ratio <= 1 if swa_only is None else swa_only
    plan = []
    for c0 in range(0, len(seq_lens_cpu), chunk_size):
        c1 = min(len(seq_lens_cpu), c0 + chunk_size)
        n = 0 if swa_only else max(s // compress_ratio for s in seq_lens_cpu[c0:c1])
        qmax = max(max_query_lens[c0:c1]) if max_query_lens else max(seq_lens_cpu[c0:c1])
        plan.append((c0, c1, n, n + window_size + qmax))
    return plan
