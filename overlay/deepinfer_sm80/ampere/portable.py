"""Portable torch implementations of the cache/index/attention steps, with
the signatures of upstream's functions, used where the CUDA kernels of
``deepinfer_sm80.ops`` are not built (CPU tests, a GPU box without ``_C``).
Semantics from upstream 0.33.0 (common/ops/cache_utils.py, FlashMLA calls in
nvidia/flashmla.py).  Imports nothing but torch.
"""

from __future__ import annotations

import math

import torch

from deepinfer_sm80.reference.attention import read_fp8_ds_mla_rows


def compute_global_topk_indices_and_lens(topk_indices, token_to_req_indices, block_table,
                                         block_size, is_valid_token):
    """local -> global slot (block_table[req, l // bs] * bs + l % bs), -1 for
    l < 0; lens = number of l >= 0 in the row, 0 for invalid tokens."""
    local = topk_indices.to(torch.int64)
    valid = local >= 0
    req = token_to_req_indices.to(torch.int64).unsqueeze(1)
    col = (local.clamp(min=0) // block_size).clamp(max=block_table.shape[1] - 1)
    blocks = block_table.to(torch.int64)[req.expand_as(col), col]
    glob = torch.where(valid, blocks * block_size + local.clamp(min=0) % block_size,
                       torch.full_like(local, -1))
    lens = torch.where(is_valid_token.to(torch.bool), valid.sum(1), torch.zeros_like(valid.sum(1)))
    return glob.to(topk_indices.dtype), lens.to(torch.int32)


def combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens, window_size,
                             compress_ratio, topk, M, N, out=None, left_visible=None,
                             right_visible=None, max_image_tokens=0, *, v41=False):
    """Workspace indices for one prefill chunk (causal text case).

    Token t of chunk request b (position pos): the first k = min((pos + 1) //
    ratio, topk) compressed entries at ``topk[t, :k] + b * M``, then the window
    [max(pos - W + 1, 0), pos] at ``b * M + N + p - (seq_len - gather_len)``.
    ``v41``: DeepSeek-V4.1's copy: the window starts no earlier than the gathered
    buffer (seq_len - gather_len), top-k entries outside [0, N) are -1, k >= 0,
    ratio 0 has no top-k part (deepinfer_sm80.reference.index)."""
    if left_visible is not None or right_visible is not None or max_image_tokens:
        raise NotImplementedError("portable combine supports the causal text case only")
    dev = seq_lens.device
    qsl = query_start_loc.to(torch.int64)
    qsl = qsl - qsl[0]
    T = int(qsl[-1])
    width = ((topk + window_size + max_image_tokens + 127) // 128) * 128
    if out is None:
        idx = torch.full((T, width), -1, dtype=torch.int32, device=dev)
        lens = torch.empty(T, dtype=torch.int32, device=dev)
    else:
        idx, lens = out
        idx.fill_(-1)
    if T == 0:
        return idx, lens
    qlen = qsl[1:] - qsl[:-1]
    req = torch.repeat_interleave(torch.arange(qlen.numel(), device=dev), qlen)
    local = torch.arange(T, device=dev) - qsl[:-1][req]
    sl = seq_lens.to(torch.int64)[req]
    gl = gather_lens.to(torch.int64)[req]
    pos = sl - qlen[req] + local
    j = torch.arange(width, device=dev).unsqueeze(0)
    if topk > 0 and compress_ratio > 0:
        k = torch.clamp(torch.div(pos + 1, compress_ratio, rounding_mode="trunc"), max=topk)
        raw = topk_indices[:T, :topk].to(torch.int64)
        tk = raw + (req * M).unsqueeze(1)
        if v41:  # a failed (-1) or out-of-pool candidate stays -1
            tk = torch.where((raw >= 0) & (raw < N), tk, torch.full_like(tk, -1))
        tk = torch.nn.functional.pad(tk, (0, width - topk), value=-1)
    else:
        k = torch.zeros_like(pos)
        tk = torch.full((T, width), -1, dtype=torch.int64, device=dev)
    start = torch.clamp(pos - (window_size - 1), min=0)
    if v41:  # SWA bounded replay: the gathered buffer starts at seq_len - gather_len
        k = k.clamp(min=0)
        start = torch.maximum(start, sl - gl)
        swa_len = (pos - start + 1).clamp(min=0)
    else:
        swa_len = pos - start + 1
    base = req * M + N + start - (sl - gl)
    swa = base.unsqueeze(1) + (j - k.unsqueeze(1))
    res = torch.where(j < k.unsqueeze(1), tk,
                      torch.where(j < (k + swa_len).unsqueeze(1), swa, torch.full_like(swa, -1)))
    idx[:T] = res.to(idx.dtype)
    lens[:T] = (k + swa_len).to(lens.dtype)
    return idx, lens


def dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table,
                                  block_size, offset, use_fnuz=False):
    """out[r, offset + i] = dequant(entry at position seq_len - g + i), i < g."""
    R = seq_lens.shape[0]
    sl = seq_lens.to(torch.int64)
    g = sl if gather_lens is None else gather_lens.to(torch.int64)
    for r in range(R):
        gr = int(g[r])
        if gr <= 0:
            continue
        pos = torch.arange(int(sl[r]) - gr, int(sl[r]), device=out.device)
        slots = block_table[r].to(torch.int64)[pos // block_size] * block_size + pos % block_size
        rows = read_fp8_ds_mla_rows(k_cache, slots, torch.float32)
        out[r, offset:offset + gr] = rows.to(out.dtype)


def _attend_fp32(q, rows, valid, sink, scale):
    """q [T, H, D] fp32, rows [T, K, D] fp32, valid [T, K] -> out fp32 [T, H, D]."""
    s = torch.einsum("thd,tkd->thk", q, rows) * scale
    s = s.masked_fill(~valid[:, None, :], -math.inf)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    denom = p.sum(-1)
    if sink is not None:
        denom = denom + torch.exp(sink.to(torch.float32)[None, :] - m.squeeze(-1))
    out = torch.einsum("thk,tkd->thd", p, rows) / denom.clamp(min=1e-30).unsqueeze(-1)
    return torch.where(valid.any(1)[:, None, None], out, torch.zeros_like(out))


def sparse_decode(q, swa_cache, swa_indices, swa_lens, extra_cache, extra_indices, extra_lens,
                  attn_sink, scale, out):
    """FlashMLA decode semantics: one softmax over the window list then the
    compressed list; entry valid iff index >= 0 and position < length; sink
    only in the denominator.  q [T, (1,) H, 512] bf16 -> out (same shape) bf16."""
    T, H, D = q.shape[0], q.shape[-2], q.shape[-1]
    q = q.reshape(T, H, D)
    if T == 0:
        return out
    idx = swa_indices.reshape(T, -1).to(torch.int64)
    valid = (idx >= 0) & (torch.arange(idx.shape[1], device=q.device)[None] < swa_lens.reshape(T, 1))
    rows = read_fp8_ds_mla_rows(swa_cache, idx.clamp(min=0), torch.float32)
    if extra_cache is not None and extra_indices is not None:
        e = extra_indices.reshape(T, -1).to(torch.int64)
        ev = (e >= 0) & (torch.arange(e.shape[1], device=q.device)[None] < extra_lens.reshape(T, 1))
        rows = torch.cat([rows, read_fp8_ds_mla_rows(extra_cache, e.clamp(min=0), torch.float32)], 1)
        valid = torch.cat([valid, ev], 1)
    o = _attend_fp32(q.to(torch.float32), rows, valid, attn_sink, scale)
    out.copy_(o.to(out.dtype).view(out.shape))
    return out


def sparse_prefill(q, kv, indices, sm_scale, attn_sink, topk_length, out):
    """flash_mla_sparse_fwd semantics over a bf16 workspace ``kv`` [S, 1, 512]."""
    T, H, D = q.shape
    if T == 0:
        return out
    S = kv.shape[0]
    idx = indices.reshape(T, -1).to(torch.int64)
    valid = (idx >= 0) & (idx < S)
    if topk_length is not None:
        valid &= torch.arange(idx.shape[1], device=q.device)[None] < topk_length.reshape(T, 1)
    rows = kv.reshape(S, D).to(torch.float32)[torch.where(valid, idx, 0)]
    o = _attend_fp32(q.to(torch.float32), rows, valid, attn_sink, sm_scale)
    out.copy_(o.to(out.dtype))
    return out
