"""Upper bounds of the device memory the SM80 indexer takes beyond its inputs and outputs.

vLLM sizes the KV cache from a profiling forward pass (no attention metadata): memory a layer
takes later, outside CUDA graphs, beyond the peak of that pass comes out of the cache budget
(``gpu_memory_utilization``) or ends in an out-of-memory error. Upstream's indexer allocates a
dummy of ``VLLM_SPARSE_INDEXER_MAX_LOGITS_MB`` in that pass for its logits
(``sparse_attn_indexer.py``); the Ampere adapter allocates what these functions return instead:
the temporaries of :func:`deepinfer_sm80.ampere.indexer.prefill_topk` and
:func:`~deepinfer_sm80.ampere.indexer.decode_topk` on the extension's path (CUDA scorers, row
top-k and candidate kernels), summed over every allocation a call can hold, so an over- rather
than an under-estimate. ``tests/gpu/test_indexer_memory.py`` checks them against
``torch.cuda.max_memory_allocated``.

Imports nothing but the indexer's own tiling rules (no torch tensors are made here).
"""

from __future__ import annotations

from .indexer import (DEFAULT_TILE_BUDGET, candidate_decode_requests, decode_tile_budget,
                      decode_tile_cols)

# csrc/index/row_topk.cu ``kStageMax``: a windowed row top-k without a prefix over more keys
# than this, with at most a quarter as many rows as SMs, splits each row in chunks of this many
# and takes a [rows, chunks, k] int64 workspace (csrc/api/indexer.cpp, ``row_topk``).
ROW_TOPK_STAGE_MAX = 8192


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def row_topk_split_bytes(rows: int, n: int, k: int, sm_count: int) -> int:
    """The row top-k's split workspace for ``rows`` rows of ``n`` keys (0 when it does not
    split)."""
    if n <= ROW_TOPK_STAGE_MAX or rows <= 0 or 4 * rows > sm_count:
        return 0
    return rows * _cdiv(n, ROW_TOPK_STAGE_MAX) * k * 8


def candidate_write_bytes(rows: int, columns: int, k: int, block_size: int,
                          sm_count: int) -> int:
    """DeepSeek-V4.1's candidate-source step (``CandidateStep(write=True)``, kernels): one int64
    key per (row, block) of ``columns`` positions, the visible block counts and lengths, and
    the final row top-k's split workspace."""
    nb = max(1, _cdiv(columns, block_size))
    return rows * nb * 8 + rows * (4 + 8) + row_topk_split_bytes(rows, nb, k, sm_count)


def decode_scratch_bytes(rows: int, heads: int, columns: int, block_size: int, topk: int, *,
                         sm_count: int, tile_budget: int | None = None, candidate_k: int = 0,
                         candidate_block_size: int = 0, candidate_write: bool = False,
                         next_n: int = 1, candidate_budget: int | None = None) -> int:
    """``decode_topk`` on ``rows`` query rows (``next_n`` a request) over a block table of
    ``columns`` positions (pages of ``block_size``): the column tile's key buffer, the per-row
    operands (fp32 weights, row -> request map, windows), the running best k keys (counted
    twice: the first merge's result and the in-place ones), the row top-k's split workspace;
    with ``candidate_write`` the candidate step's block keys, of one chunk of requests where
    they exceed ``candidate_budget`` (``candidate_decode_requests``: the largest of the full
    and the last chunk, with ``next_n`` rows a request or with one, as vLLM's flattened
    decodes below SM90 can come: those chunks hold up to ``next_n`` - 1 rows more). Masking layers add nothing (the kernels mask the key tile in place)
    unless the tile does not hold whole candidate blocks: then the step takes its torch form,
    whose keep mask and bool tile (masking) or per-block temporaries (writing) are counted."""
    if rows <= 0 or columns <= 0:
        return 0
    if candidate_write and candidate_block_size > 0 and candidate_k > 0:
        chunks = set()  # (rows of a chunk, rows a request)
        for nn in {max(1, next_n), 1}:
            reqs = _cdiv(rows, nn)
            per = candidate_decode_requests(reqs, nn, columns, candidate_block_size,
                                            candidate_budget)
            if per < reqs:
                chunks |= {(per * nn, nn), ((reqs - (reqs - 1) // per * per) * nn, nn)}
        if chunks:
            return max(decode_scratch_bytes(r, heads, columns, block_size, topk,
                                            sm_count=sm_count, tile_budget=tile_budget,
                                            candidate_k=candidate_k,
                                            candidate_block_size=candidate_block_size,
                                            candidate_write=True, next_n=nn,
                                            candidate_budget=candidate_budget)
                       for r, nn in chunks)
    budget = decode_tile_budget(rows) if tile_budget is None else tile_budget
    tile = min(decode_tile_cols(rows, block_size, budget), columns)
    n = rows * tile * 8 + rows * heads * 4 + rows * 4 * 3
    n += 2 * rows * topk * 8 + row_topk_split_bytes(rows, tile, topk, sm_count)
    if candidate_block_size > 0 and candidate_k > 0:
        nb = _cdiv(columns, candidate_block_size)
        torch_form = bool(tile % candidate_block_size or columns % candidate_block_size)
        if candidate_write:
            n += candidate_write_bytes(rows, columns, candidate_k, candidate_block_size, sm_count)
            if torch_form:  # its finish: scores, ids and keys of every block, as 8-byte tensors
                n += 6 * rows * nb * 8
        elif torch_form:  # the keep mask and one bool tile
            n += rows * (nb + 1) + rows * tile
    return n


def prefill_scratch_bytes(rows: int, heads: int, columns: int, topk: int, *, sm_count: int,
                          row_chunk: int = 256, tile_budget: int = DEFAULT_TILE_BUDGET,
                          row_columns: int | None = None, candidate_k: int = 0,
                          candidate_block_size: int = 0, candidate_write: bool = False) -> int:
    """``prefill_topk`` on ``rows`` query rows over a workspace of ``columns`` gathered keys,
    each row seeing at most ``row_columns`` of them (default ``columns``; a row sees its own
    request's context): the per-row operands and column spans, the key buffer shared by the
    row chunks, one chunk's running best k keys (twice) and row top-k split workspace; with
    ``candidate_write`` one chunk's block keys."""
    if rows <= 0:
        return 0
    width = columns if row_columns is None else min(columns, row_columns)
    rc = min(rows, row_chunk)
    last = rows - (rows - 1) // row_chunk * row_chunk

    def key_tile(r: int) -> int:
        return max(64, tile_budget // max(1, r * 8))

    n = rows * (2 * 8 + 2 * 4 + heads * 4)  # int64 and int32 windows, fp32 weights
    n += 6 * (rows + rc) * 8  # chunk_column_spans: int64 copies, the last chunk's padding
    n += max(rc * key_tile(rc), last * key_tile(last)) * 8
    tile = min(key_tile(rc), max(1, columns))  # a chunk's tiles span its rows' columns
    n += 2 * rc * topk * 8 + row_topk_split_bytes(rc, tile, topk, sm_count)
    if candidate_write and candidate_block_size > 0 and candidate_k > 0:
        n += candidate_write_bytes(rc, max(1, width), candidate_k, candidate_block_size,
                                   sm_count)
    return n
