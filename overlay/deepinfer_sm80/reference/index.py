"""Torch references of the sparse-attention index ops (vLLM 0.33.0
``vllm/models/deepseek_v4/common/ops/cache_utils.py``), written from the semantics.

All index arithmetic wraps to int32 like the upstream Triton kernels. Where the upstream
kernels would read out of bounds these references (and the SM80 kernels) produce -1:
a request index outside ``block_table`` or a block column beyond its width; combine never
writes past a row's width.
"""

from __future__ import annotations

import torch

TOPK_ALIGNMENT = 128  # upstream _SPARSE_PREFILL_TOPK_ALIGNMENT


def _wrap32(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.int64)
    return (((x + 2**31) % 2**32) - 2**31).to(torch.int32)


def compute_global_topk_indices_and_lens(topk_indices: torch.Tensor,
                                         token_to_req_indices: torch.Tensor,
                                         block_table: torch.Tensor, block_size: int,
                                         is_valid_token: torch.Tensor
                                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """global[t, j] = block_table[req[t], l // bs] * bs + l % bs for l = topk[t, j] >= 0
    else -1; lens[t] = #{j: topk[t, j] >= 0} for valid tokens, else 0."""
    l = topk_indices.to(torch.int64)
    T, K = l.shape
    req = token_to_req_indices.to(torch.int64)[:T].unsqueeze(1).expand(T, K)
    valid = l >= 0
    blk = torch.div(torch.where(valid, l, 0), block_size, rounding_mode="floor")
    ok = valid & (req >= 0) & (req < block_table.size(0)) & (blk < block_table.size(1))
    phys = block_table.to(torch.int64)[torch.where(ok, req, 0), torch.where(ok, blk, 0)]
    slot = _wrap32(phys * block_size + (l - blk * block_size))
    out = torch.where(ok, slot, torch.full_like(slot, -1))
    lens = valid.sum(dim=1).to(torch.int32)
    lens = torch.where(is_valid_token[:T].to(torch.bool), lens, torch.zeros_like(lens))
    return out, lens


def _div_trunc(a: int, b: int) -> int:
    """a / b rounded toward zero (int32 division in the kernels; Python's // floors)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def combined_width(topk: int, window_size: int, max_image_tokens: int = 0) -> int:
    w = topk + window_size + max_image_tokens
    return (w + TOPK_ALIGNMENT - 1) // TOPK_ALIGNMENT * TOPK_ALIGNMENT


def combine_topk_swa_indices(topk_indices: torch.Tensor, query_start_loc: torch.Tensor,
                             seq_lens: torch.Tensor, gather_lens: torch.Tensor,
                             window_size: int, compress_ratio: int, topk: int, M: int, N: int,
                             out: tuple[torch.Tensor, torch.Tensor] | None = None,
                             left_visible: torch.Tensor | None = None,
                             right_visible: torch.Tensor | None = None,
                             max_image_tokens: int = 0, *, v41: bool = False
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query token t of request b (rows query_start_loc[b]-q0 .. [b+1]-q0):
    pos = seq_len - query_len + (t - query_start); k = min((pos + 1) // ratio, topk);
    idx[t, :k] = topk[t, :k] + b * M; then the window
    idx[t, k + j] = b * M + N + swa_start + j - (seq_len - gather_len), j < swa_len
    (at most W * ceil((W + image) / W) of them, never past the row);
    lens[t] = k + swa_len; every other element is -1. Rows outside every request keep
    their lens. (// truncates toward zero, as the kernels' int32 division.)

    ``v41``: DeepSeek-V4.1's copy (vLLM 0.33.0 ``deepseek_v41/common/ops/cache_utils.py``),
    no image: k = max(min((pos + 1) // ratio, topk), 0) (0 for ratio 0);
    swa_start = max(pos - (W - 1), 0, seq_len - gather_len) (the gathered buffer starts at the
    request's replay start: SWA bounded replay), swa_len = max(pos - swa_start + 1, 0); a top-k
    entry outside [0, N) is -1 instead of topk + b * M."""
    if v41 and (left_visible is not None or right_visible is not None or max_image_tokens):
        raise ValueError("v41 (DeepSeek-V4.1's combine) has no image visibility")
    T = topk_indices.size(0)
    has_image = left_visible is not None
    image = max_image_tokens if has_image else 0
    width = combined_width(topk, window_size, max_image_tokens)
    if out is None:
        idx = torch.full((T, width), -1, dtype=torch.int32, device=topk_indices.device)
        lens = torch.empty(T, dtype=torch.int32, device=topk_indices.device)
    else:
        idx, lens = out
        idx.fill_(-1)
        width = idx.size(1)
    qsl = query_start_loc.to(torch.int64).cpu()
    q0 = int(qsl[0]) if qsl.numel() else 0
    W = window_size
    extent = (W + image + W - 1) // W * W
    tk = topk_indices.to(torch.int64).cpu()
    for b in range(seq_lens.size(0)):
        qs, qe = int(qsl[b]) - q0, int(qsl[b + 1]) - q0
        seq_len, gather_len = int(seq_lens[b]), int(gather_lens[b])
        start_pos = seq_len - (qe - qs)
        for t in range(max(qs, 0), min(qe, T)):
            pos = start_pos + (t - qs)
            k = min(_div_trunc(pos + 1, compress_ratio), topk) if compress_ratio else 0
            left = int(left_visible[t]) if has_image else 0
            right = int(right_visible[t]) if has_image else 0
            left_add = max(left - (W - 1), 0)
            swa_start = max(pos - (W - 1) - left_add, 0)
            swa_len = pos + right - swa_start + 1
            if v41:
                k = max(k, 0)
                swa_start = max(swa_start, seq_len - gather_len)
                swa_len = max(pos - swa_start + 1, 0)
            kc = min(max(k, 0), width)
            n_swa = min(max(min(swa_len, extent), 0), width - kc)
            row = torch.full((width,), -1, dtype=torch.int64)
            row[:kc] = tk[t, :kc] + b * M
            if v41:  # a failed (-1) or out-of-pool candidate stays -1
                row[:kc] = torch.where((tk[t, :kc] >= 0) & (tk[t, :kc] < N), row[:kc], -1)
            row[kc:kc + n_swa] = (b * M + N + swa_start - (seq_len - gather_len)
                                  + torch.arange(n_swa))
            idx[t] = _wrap32(row).to(idx.device)
            lens[t] = k + swa_len
    return idx, lens
