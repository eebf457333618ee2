"""Lightning-indexer scoring and top-k for SM80 (no DeepGEMM).

logits[t, j] = k_scale[j] * sum_h relu(q[t, h] . k[j]) * w[t, h]

over exactly dequantised FP8 (e4m3 -> fp32 is exact), fp32 accumulation,
processed in row chunks x column tiles so no [tokens x candidates] fp32
buffer is ever materialised.  Top-k keeps a running best-k per row across the
column tiles with a total order on (score, index): every (score, column) pair
is packed into one int64 key (order-preserving score bits high, inverted
column low), so equal scores are broken by the lower column and the selected
set does not depend on the top-k algorithm (no racy radix/atomic path).

Two entry points, both writing request-local indices (-1 = none):
* ``prefill_topk``: ragged rows over a gathered K workspace, row t sees
  columns [ks[t], ke[t]) and gets indices j - ks[t].
* ``decode_topk``: paged indexer cache (``[bs * 128 e4m3][bs * 4 fp32]`` per
  page), row (b, i) sees compressed positions [0, ctx[b, i]); static shapes
  only (no host sync), so it can run under CUDA-graph capture.

Scorers: on CUDA tensors both steps take the CUDA kernel of ``deepinfer_sm80.ops.indexer``
(decode: the paged cache; prefill: the flat workspace; 16/32/64 heads, the extension built),
else the fused Triton scorer (``indexer_triton``); on CPU torch. ``scorer=`` or
$DEEPINFER_INDEXER_SCORER (auto | cuda | triton | torch) chooses.

Imports nothing but torch (and, optionally, the Triton scorer in
``indexer_triton`` and the extension through ``deepinfer_sm80.ops.indexer``).
"""

from __future__ import annotations

import functools
import os

import torch

INT64_MIN = -(2**63)
_LOW_MASK = 0xFFFFFFFF

# Elements (rows x heads x columns) of the per-tile fp32 score buffer; for the fused scorers,
# bytes of the per-tile int64 key buffer [rows, tile].
DEFAULT_TILE_BUDGET = 1 << 25
# decode_topk's key buffer for the fused scorers, by default: wide enough for DECODE_TILE_MIN_COLS
# columns per tile, within [DEFAULT_TILE_BUDGET, DECODE_TILE_BUDGET_MAX] bytes. With a block
# table as wide as max_model_len every column tile costs a scorer launch and a merge even where
# it lies past every row's context (~4 us on an H200); at 256 rows and 1M tokens a 32 MB buffer
# made 16 tiles of 16,384 columns (docs/indexer-scorer.md, "Large batches").
DECODE_TILE_MIN_COLS = 1 << 16
DECODE_TILE_BUDGET_MAX = 1 << 27


def decode_tile_budget(rows: int) -> int:
    """decode_topk's default key-buffer bytes for ``rows`` rows (fused scorers): unchanged
    (32 MB) up to 64 rows, then 512 KB per row up to 128 MB (256 rows)."""
    return min(DECODE_TILE_BUDGET_MAX, max(DEFAULT_TILE_BUDGET, rows * DECODE_TILE_MIN_COLS * 8))


# decode_topk's candidate-source step (DeepSeek-V4.1, ``CandidateStep(write=True)``) keeps one
# int64 key per (row, candidate block) of the whole block table: 256 KB a row at 1M tokens
# (blocks of 8 compressed positions), 402 MB at 1,536 rows. Where the batch's keys would exceed
# this many bytes the decode runs in chunks of whole requests whose keys fit (at least one
# request a chunk). The chunks' key tiles widen as their rows shrink (decode_tile_budget), so
# the number of scorer launches stays about that of one pass.
CANDIDATE_DECODE_BUDGET = 1 << 26


def candidate_decode_requests(requests: int, next_n: int, columns: int, block_size: int,
                              budget: int | None = None) -> int:
    """Requests per chunk of a decode of ``requests`` x ``next_n`` rows over ``columns``
    positions whose candidate-source step takes blocks of ``block_size``: as many as keep the
    chunk's block keys within ``budget`` bytes (default :data:`CANDIDATE_DECODE_BUDGET`), at
    least 1, at most ``requests`` (one pass)."""
    budget = CANDIDATE_DECODE_BUDGET if budget is None else budget
    per_request = max(1, next_n) * max(1, -(-columns // max(1, block_size))) * 8
    return max(1, min(requests, budget // per_request))


def decode_tile_cols(rows: int, block_size: int, budget: int) -> int:
    """decode_topk's column tile for the fused scorers: whole pages of ``block_size`` columns,
    as many as ``budget`` bytes of int64 keys for ``rows`` rows hold (at least one page)."""
    return max(block_size, (budget // max(1, rows * 8)) // block_size * block_size)


def order_keys(logits: torch.Tensor, cols: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """int64 keys ordering (score desc, column asc); invalid -> INT64_MIN.

    ``logits`` fp32 [R, N]; ``cols`` int64 broadcastable to [R, N] (the
    index written out, < 2^32); ``valid`` bool [R, N]."""
    x = torch.nan_to_num(logits, nan=float("-inf")) + 0.0  # -0.0 -> +0.0
    bits = x.view(torch.int32).to(torch.int64)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = ordered * (1 << 32) + (_LOW_MASK - cols)
    return torch.where(valid, key, torch.full_like(key, INT64_MIN))


def key_scores(keys: torch.Tensor) -> torch.Tensor:
    """fp32 scores of ``order_keys`` keys (the inverse map); INT64_MIN -> -inf."""
    ordered = keys >> 32
    bits = torch.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered).to(torch.int32)
    return torch.where(keys == INT64_MIN, float("-inf"), bits.view(torch.float32))


class CandidateStep:
    """DeepSeek-V4.1's two-level selection for the rows of one scoring call
    (upstream ``sparse_attn_indexer.py`` :738-761 prefill, :895-921 decode; kernels
    ``select_candidate_blocks`` / ``apply_candidate_mask``). Blocks are
    ``block_size`` consecutive request-local compressed positions.

    * ``write=True`` (the candidate-source layer): after scoring, ``blocks`` [rows, K]
      receives the row's K best blocks by maximum score, the newest visible block
      pinned first, -1 after the visible ones; the row's own top-k is unaffected.
    * ``write=False`` (later indexers): the row's top-k only considers positions in
      its listed blocks.

    Ties between equal block maxima go to the lower block (upstream leaves them to
    ``torch.topk``); NaN scores count as -inf (upstream propagates them). Listed
    blocks at or beyond the row's visible length select nothing (upstream keeps its
    logits' last column for those; the source layer, seeing the same row, never
    lists one)."""

    def __init__(self, blocks: torch.Tensor, block_size: int, write: bool) -> None:
        if block_size <= 0 or blocks.dim() != 2:
            raise ValueError("candidate blocks must be [rows, K] with block_size > 0")
        self.blocks, self.block_size, self.write = blocks, block_size, write
        self.kernels = False

    def kernels_fit(self, t: torch.Tensor, tile: int | None = None, total: int | None = None) -> bool:
        """The extension's kernels can take this step (``begin(..., kernels=True)``): CUDA
        tensors, the candidate ops built (``deepinfer_sm80.ops.indexer.candidate_available``),
        int32 blocks with contiguous rows, K within the row top-k's limit, and for a decode over
        columns [0, ``total``) in tiles of ``tile``, tiles made of whole blocks; not with
        ``$DEEPINFER_CANDIDATE_KERNEL=0`` (an A/B knob: the torch form)."""
        if not _candidate_kernels_on() or not t.is_cuda:
            return False
        cuda_indexer = _cuda_indexer()
        b = self.blocks
        whole = tile is None or (tile % self.block_size == 0 and total % self.block_size == 0)
        return (cuda_indexer is not None and cuda_indexer.candidate_available() and whole
                and b.is_cuda and b.dtype == torch.int32 and (b.shape[1] <= 1 or b.stride(1) == 1)
                and (not self.write or cuda_indexer.row_topk_available(b.shape[1])))

    def begin(self, r0: int, r1: int, visible: torch.Tensor, width: int, *,
              kernels: bool = False, lo: torch.Tensor | None = None,
              hi: torch.Tensor | None = None) -> None:
        """Rows [r0, r1) seeing ``visible`` [r1 - r0] positions, at most ``width``.
        ``kernels`` (where :meth:`kernels_fit`): :meth:`tile` takes the tile's first column and
        runs the extension's candidate kernels over the rows' visible columns only, :meth:`finish`
        its row top-k over the visible blocks (the same blocks and keys as the torch form, which
        reads every column of every tile). A decode's rows see columns [0, visible); a prefill's
        see [``lo``, ``hi``) (int32 [r1 - r0], global columns; visible = hi - lo), its blocks
        spanning column tiles."""
        self.r0, self.r1 = r0, r1
        nb = max(1, -(-width // self.block_size))
        dev = visible.device
        self.kernels = kernels
        if kernels:
            self.lo = lo
            self.hi = hi if hi is not None else visible.to(torch.int32).contiguous()
            if self.write:  # a decode: every visible block written by the tile holding it;
                # a prefill: merged by max over the tiles
                self.best = (torch.empty((r1 - r0, nb), dtype=torch.int64, device=dev) if lo is None
                             else torch.full((r1 - r0, nb), INT64_MIN, dtype=torch.int64, device=dev))
                # written by every tile's kernel: ceil(visible / block_size)
                self.visible_blocks = torch.empty(r1 - r0, dtype=torch.int32, device=dev)
            return
        self.visible = visible.to(torch.int64)  # (the torch form's finish)
        if self.write:
            # best key per (row, block): the key order is the score order
            self.best = torch.full((r1 - r0, nb), INT64_MIN, dtype=torch.int64, device=dev)
        else:
            ids = self.blocks[r0:r1].to(torch.int64)
            ids = torch.where((ids >= 0) & (ids < nb), ids, nb)  # nb: a slot nothing reads
            self.keep = torch.zeros((r1 - r0, nb + 1), dtype=torch.bool, device=dev)
            self.keep.scatter_(1, ids, True)
            self.keep[:, nb] = False

    def tile(self, keys: torch.Tensor, local: torch.Tensor | None = None, *,
             col0: int | None = None) -> torch.Tensor:
        """One tile's keys -> the keys top-k merges. ``local``: the tile's request-local
        positions, [1, n] (shared by all rows) or [rows, n]; where a key is INT64_MIN
        (outside the row) the position is not read. With kernels: ``col0``, the request-local
        position of the tile's first column, instead; the keys are masked in place."""
        if self.kernels:
            from deepinfer_sm80.ops import indexer as cuda_indexer

            kw = dict(hi=self.hi, col0=int(col0), n_cols=keys.shape[1], block_size=self.block_size,
                      lo=self.lo)
            if self.write:
                cuda_indexer.candidate_block_keys(keys, best=self.best, merge=self.lo is not None,
                                                  visible_blocks=self.visible_blocks, **kw)
            else:
                cuda_indexer.candidate_mask(keys, blocks=self.blocks[self.r0:self.r1], **kw)
            return keys
        blk = local.clamp(min=0) // self.block_size
        if self.write:
            nb = self.best.shape[1]
            blk = blk.clamp(max=nb - 1).expand_as(keys)
            self.best.scatter_reduce_(1, blk, keys, "amax")
            return keys
        keep = self.keep.gather(1, blk.clamp(max=self.keep.shape[1] - 1).expand_as(keys))
        # in place (the keys are the tile's scratch): one bool tile more, not two key tiles
        return keys.masked_fill_(keep.logical_not_(), INT64_MIN)

    def finish(self) -> None:
        if not self.write:
            return
        k = self.blocks.shape[1]
        if self.kernels:  # the best k of each row's visible blocks, as block ids, -1 after
            from deepinfer_sm80.ops.indexer import row_topk_indices

            row_topk_indices(self.best, k, out=self.blocks[self.r0:self.r1], hi=self.visible_blocks)
            self.best = None  # (a prefill's next row chunk takes its own; the peak stays one)
            return
        nb = self.best.shape[1]
        newest = (self.visible - 1).clamp(min=0) // self.block_size
        has = (self.visible > 0).unsqueeze(1)
        ids = torch.arange(nb, device=self.best.device).unsqueeze(0)
        score = key_scores(self.best)
        score = torch.where(has & (ids == newest.unsqueeze(1)), float("inf"), score)
        keys = order_keys(score, ids, score > float("-inf"))
        # the extension's row top-k where it takes k (the same values: the keys are a total
        # order); torch.topk with k = 2048 took ~150 us per call on the H200 (2026-12-03)
        cuda = _candidate_kernels_on() and _cuda_row_topk("auto", keys, k)
        self.best = None
        self.blocks[self.r0:self.r1, :k] = keys_to_indices(merge_topk(None, keys, k, cuda))


def _candidate_kernels_on() -> bool:
    """The candidate step may use the extension (its kernels, its row top-k): not with
    ``$DEEPINFER_CANDIDATE_KERNEL=0`` (an A/B knob: the torch form throughout)."""
    return os.environ.get("DEEPINFER_CANDIDATE_KERNEL", "1") != "0"


def keys_to_indices(keys: torch.Tensor) -> torch.Tensor:
    idx = _LOW_MASK - (keys & _LOW_MASK)
    return torch.where(keys == INT64_MIN, torch.full_like(idx, -1), idx).to(torch.int32)


def _cuda_indexer():
    """``deepinfer_sm80.ops.indexer`` (the CUDA scorer and row top-k), or None without it."""
    try:
        from deepinfer_sm80.ops import indexer as cuda_indexer
    except ImportError:
        return None
    return cuda_indexer


def _cuda_row_topk(scorer: str, t: torch.Tensor, k: int) -> bool:
    """The extension's row top-k for ``scorer`` auto / cuda on CUDA tensors (k <= 1024)."""
    if scorer not in ("auto", "cuda") or not t.is_cuda:
        return False
    cuda_indexer = _cuda_indexer()
    return cuda_indexer is not None and cuda_indexer.row_topk_available(k)


def _windows_on() -> bool:
    """The row top-k reads only the rows' windows: not with ``$DEEPINFER_INDEXER_WINDOW=0`` (an
    A/B knob), nor with an extension built before the window (its schema lacks it), which then
    keeps reading whole rows."""
    if os.environ.get("DEEPINFER_INDEXER_WINDOW", "1") == "0":
        return False
    cuda_indexer = _cuda_indexer()
    return cuda_indexer is not None and cuda_indexer.op_takes("row_topk_keys", "best")


def _topk_operands(best: torch.Tensor | None, keys: torch.Tensor, window) -> tuple[torch.Tensor, dict]:
    """What the extension's row top-k reads for the best of ``best`` U ``keys``: ``keys`` with
    the window arguments and ``best`` as is (no concatenated copy), where ``window`` = (lo or
    None, hi, col0) is given (the visible columns [lo, hi) of each row, ``keys``' first column
    being col0; the scorers write INT64_MIN outside them) and windows are on; else
    ``cat([best, keys])``, read whole."""
    if window is not None and _windows_on():
        lo, hi, col0 = window
        kw = dict(lo=lo, hi=hi, col0=int(col0))
        if best is not None:
            kw["best"] = best
        return keys, kw
    return (keys if best is None else torch.cat([best, keys], dim=1)), {}


def merge_topk(best: torch.Tensor | None, keys: torch.Tensor, k: int,
               cuda_topk: bool = False, window=None) -> torch.Tensor:
    """Best ``k`` keys of ``best`` U ``keys`` per row (descending). ``cuda_topk``: through the
    extension's row top-k (the same values as torch.topk: the keys are a total order), reading
    only ``best`` and each row's ``window`` of ``keys`` where given (``_topk_operands``)."""
    if cuda_topk:
        from deepinfer_sm80.ops.indexer import row_topk_keys

        keys_in, kw = _topk_operands(best, keys, window)
        # in place where best is read as the prefix ([rows, k], from the last merge): a column
        # tile past every row's context then writes nothing
        out = best if "best" in kw and best.shape[1] == k else None
        return row_topk_keys(keys_in, k, out, **kw)
    cat = keys if best is None else torch.cat([best, keys], dim=1)
    if cat.shape[1] < k:
        pad = torch.full((cat.shape[0], k - cat.shape[1]), INT64_MIN, dtype=cat.dtype,
                         device=cat.device)
        cat = torch.cat([cat, pad], dim=1)
    return torch.topk(cat, k, dim=1, largest=True, sorted=True).values


def final_topk_into(out: torch.Tensor, best: torch.Tensor | None, keys: torch.Tensor, k: int,
                    cuda_topk: bool = False, window=None) -> None:
    """The last merge: ``keys_to_indices(merge_topk(best, keys, k, cuda_topk))`` into
    ``out[:, :k]`` (int32, rows aligned with ``keys``). ``cuda_topk``: one kernel, the
    extension's row top-k writing the indices itself (no int64 top-k keys, no conversion and
    copy kernels: a decode step's fixed cost) where ``out`` is int32 with contiguous rows;
    ``window`` as for :func:`merge_topk`."""
    if cuda_topk and out.dtype == torch.int32 and out.stride(1) == 1:
        from deepinfer_sm80.ops.indexer import row_topk_indices

        keys_in, kw = _topk_operands(best, keys, window)
        row_topk_indices(keys_in, k, out=out, **kw)
    else:
        out[:, :k] = keys_to_indices(merge_topk(best, keys, k))


def dequant_fp8(codes: torch.Tensor) -> torch.Tensor:
    """uint8 / float8_e4m3fn codes -> exact fp32."""
    if codes.dtype == torch.uint8:
        codes = codes.view(torch.float8_e4m3fn)
    return codes.to(torch.float32)


def score_tile(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor) -> torch.Tensor:
    """q fp32 [R, H, D], w fp32 [R, H], k fp32 [R or 1, N, D], k_scale [R or 1, N]
    -> logits fp32 [R, N].  fp32 math (no TF32)."""
    s = torch.einsum("rhd,rnd->rhn", q, k.expand(q.shape[0], -1, -1)) if k.shape[0] != q.shape[0] \
        else torch.einsum("rhd,rnd->rhn", q, k)
    s = torch.relu_(s).mul_(w.unsqueeze(-1))
    return s.sum(dim=1) * k_scale


def _use_triton(scorer: str, t: torch.Tensor) -> bool:
    if scorer == "torch":
        return False
    try:
        from . import indexer_triton  # noqa: F401
    except ImportError:
        if scorer == "triton":
            raise
        return False
    return scorer == "triton" or t.is_cuda


def _scorer_choice(scorer: str) -> str:
    """``auto`` defers to $DEEPINFER_INDEXER_SCORER (auto | cuda | triton | torch)."""
    if scorer == "auto":
        scorer = os.environ.get("DEEPINFER_INDEXER_SCORER", "auto") or "auto"
        if scorer not in ("auto", "cuda", "triton", "torch"):
            raise ValueError(f"DEEPINFER_INDEXER_SCORER={scorer!r}: use auto, cuda, triton or torch")
    return scorer


def _use_cuda_paged(scorer: str, q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """The CUDA paged scorer (``deepinfer_sm80.ops.indexer``) for ``scorer`` auto / cuda:
    CUDA tensors, 16/32/64 heads of 128, 16-byte aligned pages, the extension built."""
    if scorer not in ("auto", "cuda"):
        return False
    cuda_indexer = _cuda_indexer()
    ok = (cuda_indexer is not None and q.is_cuda and kv_cache.is_cuda
          and cuda_indexer.supports(q.shape[-2], q.shape[-1])
          and kv_cache.stride(0) * kv_cache.element_size() % 16 == 0
          and kv_cache.data_ptr() % 16 == 0 and cuda_indexer.available())
    if scorer == "cuda" and not ok:
        raise ValueError("scorer='cuda' needs CUDA tensors, heads in (16, 32, 64) of 128, "
                         "16-byte aligned pages and the built extension (make build)")
    return ok


def _use_cuda_flat(scorer: str, q: torch.Tensor, k_fp8: torch.Tensor) -> bool:
    """The CUDA flat (prefill) scorer for ``scorer`` auto / cuda: CUDA tensors, 16/32/64 heads
    of 128, a [Nk, 128] byte workspace with 16-byte aligned rows, the extension built."""
    if scorer not in ("auto", "cuda"):
        return False
    cuda_indexer = _cuda_indexer()
    ok = (cuda_indexer is not None and q.is_cuda and k_fp8.is_cuda and k_fp8.dim() == 2
          and k_fp8.element_size() == 1 and cuda_indexer.supports(q.shape[-2], q.shape[-1])
          and k_fp8.shape[1] == q.shape[-1] and k_fp8.stride(1) == 1
          and (k_fp8.shape[0] <= 1 or k_fp8.stride(0) % 16 == 0)
          and k_fp8.data_ptr() % 16 == 0 and cuda_indexer.flat_available())
    if scorer == "cuda" and not ok:
        raise ValueError("scorer='cuda' needs CUDA tensors, heads in (16, 32, 64) of 128, a "
                         "[Nk, 128] byte K workspace with 16-byte aligned rows and the built "
                         "extension (make build)")
    return ok


def _tile_cols(rows: int, heads: int, budget: int, lo: int = 64) -> int:
    return max(lo, budget // max(1, rows * heads))


def chunk_column_spans(ks: torch.Tensor, ke: torch.Tensor,
                       row_chunk: int) -> list[tuple[int, int, int]]:
    """(min ks, max ke, max(ke - ks, 0)) of each ``row_chunk`` rows, read back in one copy:
    the chunk loop used to synchronise at the top of every chunk (twice, and once more for
    V4.1's candidate step), leaving the GPU idle while the host caught up."""
    T = ks.shape[0]
    n = -(-T // row_chunk)
    pad = n * row_chunk - T
    ks64, ke64 = ks.to(torch.int64), ke.to(torch.int64)
    if pad:  # pad the last chunk with values that change none of its min / max
        ks64 = torch.cat([ks64, ks64[-1:].expand(pad)])
        ke64 = torch.cat([ke64, ke64[-1:].expand(pad)])
    lo = ks64.view(n, row_chunk).amin(1)
    hi = ke64.view(n, row_chunk).amax(1)
    width = (ke64 - ks64).clamp(min=0).view(n, row_chunk).amax(1)
    return [tuple(x) for x in torch.stack([lo, hi, width], 1).tolist()]


def prefill_topk(
    q_fp8: torch.Tensor,
    weights: torch.Tensor,
    k_fp8: torch.Tensor,
    k_scale: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    topk: int,
    out: torch.Tensor,
    *,
    row_chunk: int = 256,
    tile_budget: int = DEFAULT_TILE_BUDGET,
    scorer: str = "auto",
    candidates: CandidateStep | None = None,
) -> torch.Tensor:
    """Ragged prefill scoring + top-k into ``out`` [T, >=topk] int32.
    ``candidates``: DeepSeek-V4.1's two-level selection (rows aligned with ``out``).

    ``q_fp8`` [T, H, D] FP8 codes; ``weights`` [T, H] fp32 (q scale folded in);
    ``k_fp8`` [Nk, D] FP8 codes and ``k_scale`` [Nk] fp32 of the gathered
    workspace; row t sees columns [ks[t], ke[t])."""
    T, H, D = q_fp8.shape
    dev = q_fp8.device
    if T == 0:
        return out
    k_scale = k_scale.reshape(-1).to(torch.float32)
    ks_all = cu_seqlen_ks.to(torch.int64)
    ke_all = cu_seqlen_ke.to(torch.int64)
    scorer = _scorer_choice(scorer)
    cuda_flat = _use_cuda_flat(scorer, q_fp8, k_fp8)
    fused = cuda_flat or _use_triton(scorer, q_fp8)
    cuda_topk = fused and _cuda_row_topk(scorer, q_fp8, topk)
    if fused:
        if cuda_flat:
            from deepinfer_sm80.ops.indexer import indexer_flat_keys as score_keys
        else:
            from .indexer_triton import mqa_logits_tile as score_keys

        q_u8 = q_fp8.view(torch.uint8) if q_fp8.dtype != torch.uint8 else q_fp8
        q_u8 = q_u8.contiguous()
        k_u8 = k_fp8.view(torch.uint8) if k_fp8.dtype != torch.uint8 else k_fp8
        ks32 = cu_seqlen_ks.to(torch.int32).contiguous()
        ke32 = cu_seqlen_ke.to(torch.int32).contiguous()
        w32 = weights.to(torch.float32).contiguous()
    # V4.1's candidate step through the extension's kernels (the fused scorers' int64 keys)
    cand_kernels = fused and candidates is not None and candidates.kernels_fit(q_fp8)
    spans = chunk_column_spans(ks_all, ke_all, row_chunk)  # one device->host copy for all chunks
    if fused:  # one key buffer for every row chunk: the peak stays at tile_budget, not twice it

        def _key_tile(rows: int) -> int:
            return max(64, tile_budget // max(1, rows * 8))

        first, last = min(T, row_chunk), T - (T - 1) // row_chunk * row_chunk  # chunk rows
        key_buf = torch.empty(max(first * _key_tile(first), last * _key_tile(last)),
                              dtype=torch.int64, device=dev)
    for r0 in range(0, T, row_chunk):
        r1 = min(T, r0 + row_chunk)
        ks, ke = ks_all[r0:r1], ke_all[r0:r1]
        c0, c1, width = spans[r0 // row_chunk]
        best = None
        if candidates is not None:
            visible = (ke - ks).clamp(min=0)
            kw = dict(kernels=True, lo=ks32[r0:r1], hi=ke32[r0:r1]) if cand_kernels else {}
            candidates.begin(r0, r1, visible, max(1, width), **kw)
        if fused:
            tile = _key_tile(r1 - r0)
            buf = key_buf[: (r1 - r0) * tile].view(r1 - r0, tile)
        else:
            q = dequant_fp8(q_fp8[r0:r1])
            w = weights[r0:r1].to(torch.float32)
            tile = _tile_cols(r1 - r0, H, tile_budget)
        c_end = max(c1, c0 + 1)  # at least one tile, so that every row gets its indices
        for t0 in range(c0, c_end, tile):
            t1 = min(c_end, t0 + tile)
            if fused:
                if cuda_flat:
                    keys = score_keys(q_u8[r0:r1], w32[r0:r1], col0=t0, n_cols=t1 - t0,
                                      lo=ks32[r0:r1], hi=ke32[r0:r1], out=buf,
                                      k_codes=k_u8, k_scale=k_scale)[:, : t1 - t0]
                else:
                    keys = score_keys(q_u8[r0:r1], w32[r0:r1], col0=t0, n_cols=t1 - t0,
                                      lo=ks32[r0:r1], hi=ke32[r0:r1], out=buf,
                                      k_flat=k_u8, k_scale=k_scale)[:, : t1 - t0]
            else:
                k = dequant_fp8(k_fp8[t0:t1]).unsqueeze(0)
                logits = score_tile(q, w, k, k_scale[t0:t1].unsqueeze(0))
                cols = torch.arange(t0, t1, device=dev).unsqueeze(0)
                valid = (cols >= ks.unsqueeze(1)) & (cols < ke.unsqueeze(1))
                keys = order_keys(logits, cols - ks.unsqueeze(1), valid)
            if cand_kernels:
                keys = candidates.tile(keys, col0=t0)
            elif candidates is not None:
                local = torch.arange(t0, t1, device=dev).unsqueeze(0) - ks.unsqueeze(1)
                keys = candidates.tile(keys, local)
            # the scorers leave columns outside [ks, ke) at INT64_MIN: the top-k skips them
            win = (ks32[r0:r1], ke32[r0:r1], t0) if cuda_topk else None
            if t1 < c_end:
                best = merge_topk(best, keys, topk, cuda_topk, win)
            else:  # the chunk's last tile: its merge writes the indices
                final_topk_into(out[r0:r1], best, keys, topk, cuda_topk, win)
        if candidates is not None:
            candidates.finish()
    return out


def split_indexer_pages(kv_cache: torch.Tensor, block_size: int, head_dim: int = 128):
    """Flat pages [nb, >= bs*(D+4)] -> (codes [nb, bs, D] uint8, scales [nb, bs] fp32)."""
    nb = kv_cache.shape[0]
    flat = kv_cache.reshape(nb, -1)
    codes = flat[:, : block_size * head_dim].view(nb, block_size, head_dim)
    scales = flat[:, block_size * head_dim: block_size * (head_dim + 4)].contiguous()
    return codes, scales.view(torch.float32).view(nb, block_size)


def _row_lens(context_lens: torch.Tensor, B: int, NN: int) -> torch.Tensor:
    """int32 [B * NN]: the visible entries of each decode row, from ``context_lens`` [B, NN]
    (vLLM's per-row lengths of a native speculative decode) or [B] / [B, m], m != NN (one
    length L per request, its last column: row j then sees max(L - NN + 1 + j, 0) entries, as
    vLLM's decode top-k derives them, ``SparseIndexerTopk._row_ends`` in
    model_executor/layers/indexer_topk.py). No kernel when ``context_lens`` is int32 [B, NN],
    or [B] with NN = 1 (the common decode inputs)."""
    c = context_lens.reshape(B, -1)
    if c.shape[1] != NN:
        j = torch.arange(NN, dtype=torch.int32, device=c.device)
        c = (c[:, -1:].to(torch.int32) - NN + 1 + j).clamp_(min=0)
    c = c.reshape(B * NN)
    return c if c.dtype == torch.int32 and c.is_contiguous() else c.to(torch.int32).contiguous()


# Rows x columns per SM from which one query row per request scores faster with the rows
# kernel (one row per block) than with the warp kernel. bench/sweep_decode_scorer.py on the H200
# (2026-12-02 06:30 UTC, 32 and 64 heads, grid for its 132 SMs): the warp kernel wins up to
# 124 per SM (by 0-26%), the rows kernel from 248 (by 3-29%) at 32 and 64 heads.
ROWS_KERNEL_MIN_WORK_PER_SM = 192


def decode_rows_per_req(next_n: int, rows: int, n_cols: int, sm_count: int) -> int:
    """``rows_per_req`` for ``indexer_paged_keys`` in a decode step: ``next_n`` (2..8) makes
    blocks of a request's rows share each K tile; with one row per request the rows kernel
    (``rows_per_req=1``) beats the warp kernel once its grid covers the SMs (rows x columns
    >= ROWS_KERNEL_MIN_WORK_PER_SM x SMs), the warp kernel's many small blocks win below;
    0: the warp kernel."""
    if 2 <= next_n <= 8:
        return next_n
    if next_n == 1 and rows * n_cols >= ROWS_KERNEL_MIN_WORK_PER_SM * sm_count:
        return 1
    return 0


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _cuda_index(dev: torch.device) -> int:
    return dev.index if dev.index is not None else torch.cuda.current_device()


def decode_topk(
    q_fp8: torch.Tensor,
    weights: torch.Tensor,
    kv_cache: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    topk: int,
    out: torch.Tensor,
    *,
    pages_per_tile: int | None = None,
    tile_budget: int | None = None,
    scorer: str = "auto",
    candidates: CandidateStep | None = None,
    candidate_budget: int | None = None,
) -> torch.Tensor:
    """Paged decode scoring + top-k into ``out`` [B * next_n, >= topk] int32.
    ``candidates``: DeepSeek-V4.1's two-level selection (rows aligned with ``out``); a writing
    step whose block keys would exceed ``candidate_budget`` bytes (default
    :data:`CANDIDATE_DECODE_BUDGET`) runs in chunks of whole requests
    (:func:`candidate_decode_requests`), with the same results.
    ``tile_budget``: bytes of the column tile's key buffer (fused scorers; default
    :func:`decode_tile_budget`) or elements of its score buffer (torch form; default
    ``DEFAULT_TILE_BUDGET``).

    ``q_fp8`` [B, next_n, H, D]; ``weights`` [B * next_n, H] fp32;
    ``kv_cache`` indexer pages; ``context_lens`` [B] or [B, next_n] (number of
    visible compressed entries per row); ``block_table`` [B, maxb] int32.
    Static shapes only: safe under CUDA-graph capture."""
    B, NN, H, D = q_fp8.shape
    dev = q_fp8.device
    rows = B * NN
    if rows == 0:
        return out
    hi = _row_lens(context_lens, B, NN)
    maxb = block_table.shape[1]
    if maxb * block_size == 0:  # no cache position to select
        out[:rows, :topk] = -1
        return out
    if candidates is not None and candidates.write:
        per = candidate_decode_requests(B, NN, maxb * block_size, candidates.block_size,
                                        candidate_budget)
        if per < B:
            lens = context_lens.reshape(B, -1)
            for b0 in range(0, B, per):
                b1 = min(B, b0 + per)
                r0, r1 = b0 * NN, b1 * NN
                step = CandidateStep(candidates.blocks[r0:r1], candidates.block_size, True)
                decode_topk(q_fp8[b0:b1], weights[r0:r1], kv_cache, lens[b0:b1],
                            block_table[b0:b1], block_size, topk, out[r0:r1],
                            pages_per_tile=pages_per_tile, tile_budget=tile_budget,
                            scorer=scorer, candidates=step, candidate_budget=candidate_budget)
            return out
    best = None
    scorer = _scorer_choice(scorer)
    use_cuda = _use_cuda_paged(scorer, q_fp8, kv_cache)
    cuda_topk = use_cuda and _cuda_row_topk(scorer, q_fp8, topk)
    fused = use_cuda or _use_triton(scorer, q_fp8)
    if candidates is not None and not fused:  # (the fused scorers' step begins below)
        candidates.begin(0, rows, hi, maxb * block_size)
    if fused:
        if use_cuda:
            from deepinfer_sm80.ops.indexer import indexer_paged_keys as score_keys
        else:
            from .indexer_triton import mqa_logits_tile as score_keys

        q_u8 = (q_fp8.view(torch.uint8) if q_fp8.dtype != torch.uint8 else q_fp8)
        q_u8 = q_u8.reshape(rows, H, D)
        w32 = weights[:rows].to(torch.float32).contiguous()
        row_req = torch.arange(B, device=dev, dtype=torch.int32)
        if NN > 1:  # (contiguous: with B = 1 the reshape of the expand is a stride-0 view)
            row_req = row_req.view(B, 1).expand(B, NN).reshape(rows).contiguous()
        lo = torch.zeros(rows, dtype=torch.int32, device=dev)
        bt32 = block_table.to(torch.int32)
        total = maxb * block_size
        budget = decode_tile_budget(rows) if tile_budget is None else tile_budget
        tile = (pages_per_tile * block_size if pages_per_tile
                else decode_tile_cols(rows, block_size, budget))
        # the rows of a request (MTP / speculative tokens) share each decoded K tile; one row
        # per request takes the rows kernel too where its grid covers the SMs
        rpr = decode_rows_per_req(NN, rows, min(tile, total), _sm_count(_cuda_index(dev))) if use_cuda else 0
        rows_kw = {"rows_per_req": rpr} if rpr else {}
        # V4.1's candidate step: the extension's kernels over the visible columns where the
        # windowed top-k runs, else the torch form over whole tiles
        cand_kernels = (candidates is not None and cuda_topk and _windows_on()
                        and candidates.kernels_fit(q_fp8, tile, total))
        if candidates is not None:
            candidates.begin(0, rows, hi, total, kernels=cand_kernels)
        # the windowed top-k reads only [0, hi) of each row: the scorer need not write INT64_MIN
        # over the rest (the torch form of the candidate step reads whole rows: it keeps the fill)
        if (cuda_topk and (candidates is None or cand_kernels) and _windows_on()
                and _cuda_indexer().op_takes("indexer_paged_keys", "fill")):
            rows_kw["fill"] = False
        buf = torch.empty((rows, min(tile, total)), dtype=torch.int64, device=dev)
        for t0 in range(0, total, tile):
            t1 = min(total, t0 + tile)
            keys = score_keys(q_u8, w32, col0=t0, n_cols=t1 - t0, lo=lo, hi=hi, out=buf,
                              pages=kv_cache, block_table=bt32, row_req=row_req,
                              block_size=block_size, **rows_kw)[:, : t1 - t0]
            if cand_kernels:
                keys = candidates.tile(keys, col0=t0)
            elif candidates is not None:
                keys = candidates.tile(keys, torch.arange(t0, t1, device=dev).unsqueeze(0))
            # columns at or past a row's context are INT64_MIN (the block table spans
            # max_model_len, a row its context): the top-k reads only [0, hi)
            win = (None, hi, t0) if cuda_topk else None
            if t1 < total:
                best = merge_topk(best, keys, topk, cuda_topk, win)
            else:  # the last tile: its merge writes the indices
                final_topk_into(out[:rows], best, keys, topk, cuda_topk, win)
        if candidates is not None:
            candidates.finish()
        return out
    ctx = hi.view(B, NN).to(torch.int64)
    codes, scales = split_indexer_pages(kv_cache, block_size, D)
    q = dequant_fp8(q_fp8)  # [B, NN, H, D]
    w = weights[:rows].to(torch.float32).view(B, NN, H)
    if pages_per_tile is None:
        budget = DEFAULT_TILE_BUDGET if tile_budget is None else tile_budget
        pages_per_tile = max(1, _tile_cols(rows, H, budget, lo=block_size) // block_size)
    bt = block_table.to(torch.int64).clamp(min=0)
    for p0 in range(0, maxb, pages_per_tile):
        p1 = min(maxb, p0 + pages_per_tile)
        pages = bt[:, p0:p1]  # [B, np]
        k = dequant_fp8(codes[pages]).reshape(B, -1, D)  # [B, np*bs, D]
        ksc = scales[pages].reshape(B, -1)  # [B, np*bs]
        s = torch.einsum("bihd,bnd->bihn", q, k)
        s = torch.relu_(s).mul_(w.unsqueeze(-1)).sum(dim=2) * ksc.unsqueeze(1)
        cols = torch.arange(p0 * block_size, p1 * block_size, device=dev)
        valid = cols.view(1, 1, -1) < ctx.unsqueeze(-1)
        keys = order_keys(s.reshape(rows, -1), cols.unsqueeze(0), valid.reshape(rows, -1))
        if candidates is not None:
            keys = candidates.tile(keys, cols.unsqueeze(0))
        best = merge_topk(best, keys, topk)
    if candidates is not None:
        candidates.finish()
    out[:rows, :topk] = keys_to_indices(best)
    return out


def reference_topk_sets(logits64: torch.Tensor, valid: torch.Tensor, topk: int) -> list[set[int]]:
    """Oracle: per row, the ``topk`` valid columns by (score desc, index asc)."""
    res = []
    for r in range(logits64.shape[0]):
        cols = valid[r].nonzero().flatten().tolist()
        vals = logits64[r].tolist()
        cols.sort(key=lambda j: (-vals[j], j))
        res.append(set(cols[:topk]))
    return res
