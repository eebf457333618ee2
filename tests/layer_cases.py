"""A DeepSeek-V4 attention layer's caches and metadata, laid out the way vLLM
lays them out, with real per-layer dimensions (head 512 = 448 + 64, window
128, index top-k 512, indexer 64 heads x 128, compress ratios 4 / 128), and a
float64 oracle of the layer's attention step.  Shared by the CPU smoke test
and tests/gpu/test_ampere_layer.py.  Imports nothing but torch and
deepinfer_sm80.

``build_world(..., v41=True)`` lays out a DeepSeek-V4.1 layer instead: ratio
1 or 2 with a compressed region (pages of 128 // ratio entries, the kernel
block of 128 tokens V4.1 uses below family 90) whose entries are chosen by a
request-local top-k that the caller supplies (V4.1's indexer lives in another
layer and publishes into a shared buffer): ``v41_topk`` draws one.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from deepinfer_sm80.ampere import indexer as I
from deepinfer_sm80.reference.attention import pack_fp8_ds_mla, read_fp8_ds_mla_rows

HEAD = 512
WINDOW = 128
TOPK = 512
IDX_HEADS = 64
IDX_DIM = 128
SWA_BS = 64  # tokens per SWA page
TOKENS_PER_PAGE = 256  # compressed / indexer pages cover 256 tokens


def page_stride(entries: int) -> int:
    return ((entries * 584 + 575) // 576) * 576


def _paged(nreq, per_req_entries, bs, g, device, fill):
    """Allocate pages for each request (random page order), fill entries
    0..n-1 with ``fill(n) -> rows`` and return (cache view, block table, rows)."""
    pages = [max(1, -(-n // bs)) for n in per_req_entries]
    total = sum(pages) + 2
    perm = torch.randperm(total, generator=g)
    bt = torch.full((nreq, max(pages) + 1), 0, dtype=torch.int32)
    k = 0
    for r in range(nreq):
        for p in range(pages[r]):
            bt[r, p] = perm[k]
            k += 1
    return bt, total


V41_KERNEL_BLOCK = 128  # tokens per compressed page of a V4.1 layer below family 90


def build_world(*, ratio: int, seq_lens: list[int], heads: int, device, seed: int = 0,
                v41: bool = False):
    """Caches holding every position < seq_len of each request."""
    g = torch.Generator().manual_seed(seed)
    dev = torch.device(device)
    nreq = len(seq_lens)
    w = SimpleNamespace(ratio=ratio, seq_lens=seq_lens, heads=heads, device=dev, nreq=nreq,
                        v41=v41, compressed=ratio > 1 or (v41 and ratio >= 1))
    # SWA cache (64 tokens per page, padded page stride)
    w.swa_bt, npages = _paged(nreq, seq_lens, SWA_BS, g, dev, None)
    stride = page_stride(SWA_BS)
    w.swa_raw = torch.zeros(npages, stride, dtype=torch.uint8, device=dev)
    w.swa_cache = w.swa_raw.as_strided((npages, SWA_BS, 584), (stride, 584, 1))
    for r, L in enumerate(seq_lens):
        pos = torch.arange(L)
        slots = w.swa_bt[r, pos // SWA_BS].long() * SWA_BS + pos % SWA_BS
        kv = torch.randn(L, HEAD, generator=g) * 1.5
        pack_fp8_ds_mla(kv.to(dev), slots.to(dev), w.swa_cache)
    w.swa_bt = w.swa_bt.to(dev)
    if w.compressed:
        cbs = (V41_KERNEL_BLOCK if v41 else TOKENS_PER_PAGE) // ratio
        w.cbs = cbs
        ncomp = [L // ratio for L in seq_lens]
        w.c_bt, npages = _paged(nreq, ncomp, cbs, g, dev, None)
        stride = page_stride(cbs)
        w.c_raw = torch.zeros(npages, stride, dtype=torch.uint8, device=dev)
        w.c_cache = w.c_raw.as_strided((npages, cbs, 584), (stride, 584, 1))
        for r, n in enumerate(ncomp):
            if n == 0:
                continue
            c = torch.arange(n)
            slots = w.c_bt[r, c // cbs].long() * cbs + c % cbs
            pack_fp8_ds_mla((torch.randn(n, HEAD, generator=g) * 1.5).to(dev), slots.to(dev),
                            w.c_cache)
        w.c_bt = w.c_bt.to(dev)
    if ratio == 4 and not v41:
        # indexer cache: 132-byte entries, 64 per page: [64*128 e4m3][64*4 fp32]
        ibs = TOKENS_PER_PAGE // ratio
        w.ibs = ibs
        npages = w.c_raw.shape[0]
        codes = torch.randint(0, 256, (npages, ibs, IDX_DIM), generator=g, dtype=torch.int32)
        codes = codes.to(torch.uint8)
        codes = torch.where((codes & 0x7F) >= 0x60, codes & 0xBF, codes)  # |x| < 16, no NaN
        scales = torch.pow(2.0, torch.randint(-4, 0, (npages, ibs), generator=g).float())
        raw = torch.zeros(npages, ibs * (IDX_DIM + 4), dtype=torch.uint8)
        raw[:, : ibs * IDX_DIM] = codes.view(npages, -1)
        raw[:, ibs * IDX_DIM:] = scales.contiguous().view(torch.uint8).view(npages, -1)
        w.idx_raw = raw.to(dev)
        w.idx_cache = w.idx_raw.view(npages, ibs, IDX_DIM + 4)
        w.idx_bt = w.c_bt  # the indexer shares the compressed layer's block table
    sink = torch.randn(heads, generator=g) + 6.0  # comparable to the sum of exp(logits)
    w.padded_heads = heads
    w.attn_sink = sink.to(dev)
    w.scale = HEAD**-0.5
    return w


def make_queries(w, positions: list[int], g, real_heads: int | None = None):
    T = len(positions)
    q = (torch.randn(T, w.heads, HEAD, generator=g) * 0.5).to(torch.bfloat16)
    iq = torch.randint(0, 256, (T, IDX_HEADS, IDX_DIM), generator=g, dtype=torch.int32)
    iq = iq.to(torch.uint8)
    iq = torch.where((iq & 0x7F) >= 0x58, iq & 0xBF, iq)
    iw = torch.randn(T, IDX_HEADS, generator=g) * 0.1
    return q.to(w.device), iq.to(w.device), iw.to(w.device)


# ---------------------------------------------------------------------------
# float64 oracle
# ---------------------------------------------------------------------------
def oracle_indexer_topk(w, r: int, pos: int, iq: torch.Tensor, iw: torch.Tensor) -> list[int]:
    """Request-local compressed indices selected for a token at ``pos``."""
    n = (pos + 1) // w.ratio
    if n == 0:
        return []
    c = torch.arange(n, device=w.device)
    page = w.idx_bt[r, c // w.ibs].long()
    off = c % w.ibs
    codes, scales = I.split_indexer_pages(w.idx_raw, w.ibs, IDX_DIM)
    k = I.dequant_fp8(codes[page, off]).double()
    ks = scales[page, off].double()
    q = I.dequant_fp8(iq).double()
    s = (q @ k.t()).clamp(min=0)  # [H, n]
    logits = (s * iw.double().unsqueeze(1)).sum(0) * ks
    vals = logits.tolist()
    order = sorted(range(n), key=lambda j: (-vals[j], j))
    return order[:TOPK]


def oracle_token(w, r: int, pos: int, q: torch.Tensor, compressed: list[int],
                 floor: int = 0) -> torch.Tensor:
    """float64 attention output [H, 512] of one query token; the window starts at ``floor``
    or later (a V4.1 request's gathered window after a prefix-cache hit: SWA bounded replay)."""
    lo = max(0, pos - WINDOW + 1, floor)
    p = torch.arange(lo, pos + 1, device=w.device)
    slots = w.swa_bt[r, p // SWA_BS].long() * SWA_BS + p % SWA_BS
    rows = read_fp8_ds_mla_rows(w.swa_cache, slots, torch.float64)
    if compressed:
        c = torch.tensor(compressed, device=w.device)
        cs = w.c_bt[r, c // w.cbs].long() * w.cbs + c % w.cbs
        rows = torch.cat([rows, read_fp8_ds_mla_rows(w.c_cache, cs, torch.float64)])
    s = (q.double() @ rows.t()) * w.scale  # [H, K]
    m = s.amax(1, keepdim=True)
    e = torch.exp(s - m)
    den = e.sum(1) + torch.exp(w.attn_sink.double() - m.squeeze(1))
    return (e @ rows) / den.unsqueeze(1)


def v41_topk(w, positions: list[int], g: torch.Generator, holes: float = 0.0) -> torch.Tensor:
    """A V4.1 indexer's output for these tokens: per token, up to TOPK distinct
    request-local compressed indices below (pos + 1) // ratio in random order, -1 after.
    ``holes``: that fraction of them -1 instead (failed candidates: a masked indexer of the
    two-level selection can select fewer than (pos + 1) // ratio)."""
    out = torch.full((len(positions), TOPK), -1, dtype=torch.int32)
    for t, p in enumerate(positions):
        n = (p + 1) // w.ratio
        pick = torch.randperm(n, generator=g)[:TOPK].int()
        if holes:
            pick[torch.rand(pick.numel(), generator=g) < holes] = -1
        out[t, : pick.numel()] = pick
    return out.to(w.device)


def oracle_compressed(w, r, pos, iq_t, iw_t, topk_row=None):
    if w.v41:
        return [int(j) for j in topk_row.tolist() if j >= 0]
    if w.ratio == 1:
        return []
    if w.ratio == 4:
        return oracle_indexer_topk(w, r, pos, iq_t, iw_t)
    return list(range((pos + 1) // w.ratio))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm().clamp(min=1e-30))


# ---------------------------------------------------------------------------
# Metadata as vLLM builds it
# ---------------------------------------------------------------------------
def decode_metadata(w, next_n: int, pad_rows: int = 2, seq_lens: list[int] | None = None):
    """next_n query tokens per request at the end of each sequence, then
    ``pad_rows`` CUDA-graph padding rows. ``seq_lens``: shorter sequences than the world's
    (e.g. vLLM's capture-time dummy batch, where each context is just the query)."""
    dev = w.device
    seq_lens = list(w.seq_lens) if seq_lens is None else seq_lens
    tok_req, tok_pos = [], []
    for r, L in enumerate(seq_lens):
        for i in range(next_n):
            tok_req.append(r)
            tok_pos.append(L - next_n + i)
    T = len(tok_req)
    swa_idx = torch.full((T + pad_rows, WINDOW), -1, dtype=torch.int32)
    swa_len = torch.zeros(T + pad_rows, dtype=torch.int32)
    bt = w.swa_bt.cpu()
    for t, (r, p) in enumerate(zip(tok_req, tok_pos)):
        lo = max(0, p - WINDOW + 1)
        ps = torch.arange(lo, p + 1)
        swa_idx[t, : ps.numel()] = (bt[r, ps // SWA_BS].long() * SWA_BS + ps % SWA_BS).int()
        swa_len[t] = ps.numel()
    md = SimpleNamespace(
        T=T, tok_req=tok_req, tok_pos=tok_pos, next_n=next_n,
        token_to_req=torch.tensor(tok_req + [0] * pad_rows, dtype=torch.int32, device=dev),
        positions=torch.tensor(tok_pos + [0] * pad_rows, dtype=torch.int64, device=dev),
        is_valid=torch.tensor([True] * T + [False] * pad_rows, device=dev),
        # vLLM's SWA decode indices are [tokens, 1, window] (tests/test_vllm_attention_sm80.py)
        swa_indices=swa_idx.view(T + pad_rows, 1, WINDOW).to(dev), swa_lens=swa_len.to(dev),
    )
    if w.ratio == 4:
        md.ctx = torch.tensor([[(L - next_n + i + 1) // 4 for i in range(next_n)]
                               for L in seq_lens], dtype=torch.int32, device=dev)
    if w.ratio == 128:
        width = max(128, -(-max((p + 1) // 128 for p in tok_pos) // 128) * 128)
        gi = torch.full((T + pad_rows, width), -1, dtype=torch.int32)
        gl = torch.zeros(T + pad_rows, dtype=torch.int32)
        cbt = w.c_bt.cpu()
        for t, (r, p) in enumerate(zip(tok_req, tok_pos)):
            n = (p + 1) // 128
            c = torch.arange(n)
            gi[t, :n] = (cbt[r, c // w.cbs].long() * w.cbs + c % w.cbs).int()
            gl[t] = n
        # As vLLM passes them (sparse_mla.py's build): a [tokens, 1, width] column slice of a
        # buffer as wide as max_model_len // 128, here 256 columns wider, holding stale slot
        # ids past the width (a read past it reads another entry)
        g = torch.Generator().manual_seed(T * 131 + width)
        wide = torch.randint(0, w.c_cache.shape[0] * w.cbs, (T + pad_rows, width + 256),
                             generator=g, dtype=torch.int32)
        wide[:, :width] = gi
        md.c128_global, md.c128_lens = wide.to(dev)[:, None, :width], gl.to(dev)
    return md


def prefill_metadata(w, query_lens: list[int], replay_starts: list[int] | None = None):
    """One prefill chunk per request: the last ``query_lens[r]`` positions. ``replay_starts``:
    a V4.1 request's replay start after a prefix-cache hit (vLLM's ComputePrefillMetadataKernel,
    v1/attention/backends/mla/sparse_swa.py): its gather length leaves out the context below
    it, and the window of a query token starts no earlier than the gathered buffer."""
    dev = w.device
    seq = w.seq_lens
    tok_req, tok_pos = [], []
    for r, (L, ql) in enumerate(zip(seq, query_lens)):
        for p in range(L - ql, L):
            tok_req.append(r)
            tok_pos.append(p)
    qsl = [0]
    for ql in query_lens:
        qsl.append(qsl[-1] + ql)
    replay = replay_starts or [0] * len(seq)
    gather = [ql + min(max(L - ql - rs, 0), WINDOW - 1)
              for L, ql, rs in zip(seq, query_lens, replay)]
    md = SimpleNamespace(
        swa_floor=[L - gl for L, gl in zip(seq, gather)],  # the gathered window's first position
        T=len(tok_req), tok_req=tok_req, tok_pos=tok_pos, query_lens=query_lens,
        seq_lens=torch.tensor(seq, dtype=torch.int32, device=dev),
        gather_lens=torch.tensor(gather, dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
        query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
        positions=torch.tensor(tok_pos, dtype=torch.int64, device=dev),
    )
    if w.ratio == 4:
        # indexer prefill: compressed K of each request gathered contiguously
        ncomp = [L // 4 for L in seq]
        offs = [0]
        for n in ncomp:
            offs.append(offs[-1] + n)
        codes, scales = I.split_indexer_pages(w.idx_raw, w.ibs, IDX_DIM)
        kq, ksc = [], []
        for r, n in enumerate(ncomp):
            c = torch.arange(n, device=dev)
            page = w.idx_bt[r, c // w.ibs].long()
            kq.append(codes[page, c % w.ibs])
            ksc.append(scales[page, c % w.ibs])
        md.k_fp8 = torch.cat(kq)
        md.k_scale = torch.cat(ksc)
        md.ks = torch.tensor([offs[r] for r in tok_req], dtype=torch.int32, device=dev)
        md.ke = torch.tensor([offs[r] + (p + 1) // 4 for r, p in zip(tok_req, tok_pos)],
                             dtype=torch.int32, device=dev)
    if w.ratio == 128:
        width = max(128, -(-max((p + 1) // 128 for p in tok_pos) // 128) * 128)
        loc = torch.full((md.T, width), -1, dtype=torch.int32)
        for t, p in enumerate(tok_pos):
            n = (p + 1) // 128
            loc[t, :n] = torch.arange(n, dtype=torch.int32)
        md.c128_local = loc.to(dev)
    return md


def is_close_to_tie(w, r, pos, iq, iw, got: set[int], want: set[int]) -> bool:
    """True when a set difference is explained by fp32-vs-fp64 near-ties at
    the k-th score (relative gap below 1e-5)."""
    if got == want:
        return True
    n = (pos + 1) // w.ratio
    c = torch.arange(n, device=w.device)
    page = w.idx_bt[r, c // w.ibs].long()
    codes, scales = I.split_indexer_pages(w.idx_raw, w.ibs, IDX_DIM)
    k = I.dequant_fp8(codes[page, c % w.ibs]).double()
    ks = scales[page, c % w.ibs].double()
    s = (I.dequant_fp8(iq).double() @ k.t()).clamp(min=0)
    logits = (s * iw.double().unsqueeze(1)).sum(0) * ks
    diff = got ^ want
    kth = sorted(logits.tolist(), reverse=True)[TOPK - 1]
    scale = max(1e-30, float(logits.abs().max()))
    return all(abs(float(logits[j]) - kth) / scale < 1e-5 for j in diff)


# ---------------------------------------------------------------------------
# Drivers: the layer's attention step as the Ampere class runs it
# ---------------------------------------------------------------------------
def run_decode(w, md, ops, q, iq, iw, out=None, topk_buf=None):
    from deepinfer_sm80.ampere.layer import forward_decode

    out = torch.empty_like(q) if out is None else out
    kwargs = {}
    if w.v41:  # ratios 1 and 2: the supplied top-k through the global-index path
        kwargs = dict(topk_local=topk_buf, token_to_req_indices=md.token_to_req,
                      block_table=w.c_bt, compressed_block_size=w.cbs,
                      is_valid_token=md.is_valid, compressed_path="topk")
    elif w.ratio == 4:
        if topk_buf is None:
            topk_buf = torch.full((q.shape[0], TOPK), -1, dtype=torch.int32, device=q.device)
        B, nn = w.nreq, md.next_n
        I.decode_topk(iq[: md.T].view(B, nn, IDX_HEADS, IDX_DIM), iw[: md.T], w.idx_raw, md.ctx,
                      w.idx_bt, w.ibs, TOPK, topk_buf)
        kwargs = dict(topk_local=topk_buf, token_to_req_indices=md.token_to_req,
                      block_table=w.c_bt, compressed_block_size=w.cbs,
                      is_valid_token=md.is_valid)
    elif w.ratio == 128:
        kwargs = dict(c128_global_indices=md.c128_global, c128_lens=md.c128_lens)
    forward_decode(ops, q=q, swa_cache=w.swa_cache,
                   compressed_cache=w.c_cache if w.compressed else None,
                   swa_indices=md.swa_indices, swa_lens=md.swa_lens, compress_ratio=w.ratio,
                   scale=w.scale, attn_sink=w.attn_sink, out=out, **kwargs)
    return out, topk_buf


def run_prefill(w, md, ops, ws, q, iq, iw, topk=None):
    """``topk``: a V4.1 world's supplied request-local top-k rows, one per token."""
    from deepinfer_sm80.ampere.layer import forward_prefill, plan_prefill_chunks

    out = torch.zeros_like(q)
    if w.v41:
        assert topk is not None
    elif w.ratio == 4:
        topk = torch.full((md.T, TOPK), -1, dtype=torch.int32, device=q.device)
        I.prefill_topk(iq, iw, md.k_fp8, md.k_scale, md.ks, md.ke, TOPK, topk)
    elif w.ratio == 128:
        topk = md.c128_local
    plan = plan_prefill_chunks(list(w.seq_lens), w.ratio, WINDOW, chunk_size=4,
                               max_query_lens=md.query_lens, swa_only=not w.compressed)
    forward_prefill(ops, ws, q=q, out=out, swa_cache=w.swa_cache,
                    compressed_cache=w.c_cache if w.compressed else None,
                    seq_lens=md.seq_lens, gather_lens=md.gather_lens,
                    query_start_loc=md.query_start_loc,
                    query_start_loc_cpu=md.query_start_loc_cpu, swa_block_table=w.swa_bt,
                    swa_block_size=SWA_BS,
                    compressed_block_table=w.c_bt if w.compressed else None,
                    compressed_block_size=w.cbs if w.compressed else None,
                    topk_indices=topk, compress_ratio=w.ratio, window_size=WINDOW,
                    scale=w.scale, attn_sink=w.attn_sink, chunk_plan=plan, max_tokens=md.T,
                    swa_only=not w.compressed, v41=w.v41)
    return out, topk


def check_against_oracle(w, md, q, iq, iw, out, topk, topk_rows_local=True):
    """Per valid token: indexer set (C4) equals the oracle's (up to fp32
    near-ties) and the output's relative error vs the float64 oracle.
    Returns (max relative error, number of set mismatches, number of tokens)."""
    worst = 0.0
    mismatches = 0
    for t in range(md.T):
        r, p = md.tok_req[t], md.tok_pos[t]
        comp = oracle_compressed(w, r, p, iq[t], iw[t], topk[t] if w.v41 else None)
        if w.ratio == 4 and not w.v41:
            got = {int(j) for j in topk[t].tolist() if j >= 0}
            if got != set(comp):
                mismatches += 1
                assert is_close_to_tie(w, r, p, iq[t], iw[t], got, set(comp)), (t, p)
                comp = sorted(got)  # attend what was selected (near-tie swap)
        floors = getattr(md, "swa_floor", None)
        ref = oracle_token(w, r, p, q[t], comp, floors[r] if floors else 0)
        worst = max(worst, rel_err(out[t], ref))
    return worst, mismatches, md.T


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("math",)]
del math
