"""SM80 drop-ins for upstream's sparse-attention index ops (vLLM 0.33.0
``vllm/models/deepseek_v4/common/ops/cache_utils.py``): same arguments, same results.

* :func:`compute_global_topk_indices_and_lens`
* :func:`combine_topk_swa_indices` - writes every element of the combined index row
  (the -1 fill is part of the kernel, not a separate ``fill_``).

Semantics are those of :mod:`deepinfer_sm80.reference.index`. ``sm_count`` (keyword) sizes
the grid (0/None: the device's).
"""

from __future__ import annotations

import torch

from deepinfer_sm80.ops import _checks as C


def _ops():
    from deepinfer_sm80 import _ext  # loads _C, or raises ImportError saying how to build it

    return _ext.ops()

TOPK_ALIGNMENT = 128


def _topk_rows(topk_indices: torch.Tensor) -> torch.Tensor:
    """Checked int32 [num_tokens, topk] CUDA tensor with a contiguous last dimension."""
    C.cuda_tensor(topk_indices, "topk_indices")
    C.dtype(topk_indices, "topk_indices", torch.int32)
    C.dim(topk_indices, "topk_indices", 2, "[num_tokens, topk]")
    return topk_indices if topk_indices.stride(1) == 1 else topk_indices.contiguous()


def compute_global_topk_indices_and_lens(topk_indices: torch.Tensor,
                                         token_to_req_indices: torch.Tensor,
                                         block_table: torch.Tensor, block_size: int,
                                         is_valid_token: torch.Tensor, *,
                                         sm_count: int | None = None
                                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Local top-k indices -> global cache slots (-1 for l < 0) and per-token counts."""
    topk_indices = _topk_rows(topk_indices)
    dev, T = topk_indices.device, topk_indices.size(0)
    C.vector(token_to_req_indices, "token_to_req_indices", dev, torch.int32, T)
    C.cuda_tensor(block_table, "block_table", dev)
    C.dtype(block_table, "block_table", torch.int32)
    C.dim(block_table, "block_table", 2, "[num_reqs, max_blocks_per_seq]")
    C.vector(is_valid_token, "is_valid_token", dev, torch.bool, T)
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    out = torch.empty_like(topk_indices, memory_format=torch.contiguous_format)
    lens = torch.empty(T, dtype=torch.int32, device=dev)
    _ops().compute_global_topk_indices_and_lens(out, lens, topk_indices,
                                                   token_to_req_indices, block_table,
                                                   block_size, is_valid_token, sm_count or 0)
    return out, lens


def combine_topk_swa_indices(topk_indices: torch.Tensor, query_start_loc: torch.Tensor,
                             seq_lens: torch.Tensor, gather_lens: torch.Tensor,
                             window_size: int, compress_ratio: int, topk: int, M: int, N: int,
                             out: tuple[torch.Tensor, torch.Tensor] | None = None,
                             left_visible: torch.Tensor | None = None,
                             right_visible: torch.Tensor | None = None,
                             max_image_tokens: int = 0, *,
                             sm_count: int | None = None, v41: bool = False
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate each query token's top-k compressed indices with its SWA window.
    ``v41``: DeepSeek-V4.1's copy of the op (``deepseek_v41/common/ops/cache_utils.py``): the
    window starts no earlier than the gathered buffer (SWA bounded replay), -1 and out-of-pool
    top-k entries stay -1, ratio 0 is an SWA-only layer; no image visibility
    (:func:`deepinfer_sm80.reference.index.combine_topk_swa_indices`)."""
    topk_indices = _topk_rows(topk_indices)
    dev, T = topk_indices.device, topk_indices.size(0)
    if not 0 <= topk <= topk_indices.size(1):
        raise ValueError(f"topk={topk} must be in [0, topk_indices.shape[1]="
                         f"{topk_indices.size(1)}]")
    if window_size < 1 or compress_ratio < (0 if v41 else 1) or max_image_tokens < 0:
        raise ValueError("window_size and compress_ratio must be >= 1 (v41: compress_ratio "
                         ">= 0) and max_image_tokens >= 0")
    if v41 and (left_visible is not None or right_visible is not None or max_image_tokens):
        raise ValueError("v41 (DeepSeek-V4.1's combine) has no image visibility "
                         "(left_visible, right_visible, max_image_tokens)")
    C.vector(seq_lens, "seq_lens", dev, torch.int32)
    R = seq_lens.size(0)
    C.vector(gather_lens, "gather_lens", dev, torch.int32, R)
    C.vector(query_start_loc, "query_start_loc", dev, torch.int32, R + 1)
    if (left_visible is None) != (right_visible is None):
        raise ValueError("left_visible and right_visible must be given together")
    if left_visible is not None:
        for name, t in (("left_visible", left_visible), ("right_visible", right_visible)):
            C.vector(t, name, dev, torch.int32, T)
    width = ((topk + window_size + max_image_tokens + TOPK_ALIGNMENT - 1)
             // TOPK_ALIGNMENT * TOPK_ALIGNMENT)
    if out is None:
        idx = torch.empty((T, width), dtype=torch.int32, device=dev)
        lens = torch.empty(T, dtype=torch.int32, device=dev)
    else:
        idx, lens = out
        C.cuda_tensor(idx, "out[0] (combined indices)", dev)
        C.dtype(idx, "out[0] (combined indices)", torch.int32)
        C.dim(idx, "out[0] (combined indices)", 2, "[num_tokens, width]")
        if idx.size(0) != T or idx.stride(1) != 1:
            raise ValueError(f"out[0] must be [{T}, width] with a contiguous last dim, got "
                             f"{tuple(idx.shape)} strides {idx.stride()}")
        C.vector(lens, "out[1] (combined lens)", dev, torch.int32, T)
    if not v41:  # (the call of builds before the flag, too)
        _ops().combine_topk_swa_indices(idx, lens, topk_indices, query_start_loc, seq_lens,
                                           gather_lens, window_size, compress_ratio, topk, M, N,
                                           left_visible, right_visible, max_image_tokens,
                                           sm_count or 0)
        return idx, lens
    if not _takes_v41():
        raise RuntimeError("the loaded deepinfer_sm80 extension predates DeepSeek-V4.1's "
                           "combine (v41=True): rebuild it (make build)")
    _ops().combine_topk_swa_indices(idx, lens, topk_indices, query_start_loc, seq_lens,
                                       gather_lens, window_size, compress_ratio, topk, M, N,
                                       None, None, 0, sm_count or 0, True)
    return idx, lens


def _takes_v41() -> bool:
    """Whether the loaded extension's combine has the v41 flag (a build older than it not)."""
    from deepinfer_sm80.ops.indexer import op_takes

    return op_takes("combine_topk_swa_indices", "v41")
