"""SM80 CUDA scorer of the lightning indexer (needs the built extension): the paged decode step
and the prefill step over the gathered workspace.

:func:`indexer_paged_keys` is the CUDA form of the Triton scorer's paged key mode
(``deepinfer_sm80.ampere.indexer_triton.mqa_logits_tile`` with ``pages=`` and an int64
``out``): for every row and the call's columns ``col0 + i`` (``0 <= i < n_cols``) it writes

    out[row, i] = order_keys(k_scale[c] * sum_h relu(q[row, h] . k[c]) * w[row, h], c - lo[row])

(``deepinfer_sm80.ampere.indexer.order_keys``: score descending, then column ascending),
INT64_MIN outside ``[lo[row], hi[row])``. Q and K are e4m3 codes decoded exactly; the dot
products accumulate in fp32 on the tensor cores (csrc/index/indexer_keys.cu). Heads must be
16, 32 or 64 (:func:`supports`).

:func:`indexer_flat_keys` is the same kernel over a flat workspace, the CUDA form of the Triton
scorer's flat key mode (``mqa_logits_tile`` with ``k_flat=`` / ``k_scale=``): column ``c`` is row
``c`` of ``k_codes`` with scale ``k_scale[c]`` (the prefill step's gathered index K).

Imports nothing but torch (and the extension when called).
"""

from __future__ import annotations

import functools

import torch

from deepinfer_sm80.ops import _checks as C

HEADS = (16, 32, 64)
HEAD_DIM = 128
CHUNK_STEP = 64


def _ops():
    from deepinfer_sm80 import _ext  # loads _C, or raises ImportError saying how to build it

    return _ext.ops()


@functools.cache
def available() -> bool:
    """True when the extension loads and has this op (asked once per process: decode calls
    it every step)."""
    try:
        return hasattr(_ops(), "indexer_paged_keys")
    except (ImportError, OSError, RuntimeError):
        return False


def supports(heads: int, head_dim: int) -> bool:
    return heads in HEADS and head_dim == HEAD_DIM


def flat_pages(kv_cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """The indexer cache as uint8 [num_pages, page_bytes] (a view, never a copy)."""
    C.cuda_tensor(kv_cache, "kv_cache")
    if kv_cache.element_size() != 1:
        raise TypeError(f"kv_cache must hold bytes (uint8 / float8), got {kv_cache.dtype}")
    pages = kv_cache.view(torch.uint8) if kv_cache.dtype != torch.uint8 else kv_cache
    if pages.dim() < 2 or not pages[0].is_contiguous():
        raise ValueError(f"kv_cache must be [num_pages, ...] with contiguous pages, got shape "
                         f"{tuple(pages.shape)} strides {pages.stride()}")
    inner = pages[0].numel()
    if inner < block_size * (HEAD_DIM + 4):
        raise ValueError(f"kv_cache pages hold {inner} bytes, need block_size * 132 = "
                         f"{block_size * (HEAD_DIM + 4)}")
    return pages.as_strided((pages.shape[0], inner), (pages.stride(0), 1))


def _check_rows(q_u8: torch.Tensor, w: torch.Tensor,
                out: torch.Tensor) -> tuple[torch.device, int]:
    """Both scorers' checks of the query rows, their weights and the key output; returns the
    device and the row count."""
    C.cuda_tensor(q_u8, "q")
    dev = q_u8.device
    C.dtype(q_u8, "q", torch.uint8)
    C.dim(q_u8, "q", 3, "[rows, heads, 128]")
    rows, heads, d = q_u8.shape
    if not supports(heads, d):
        raise ValueError(f"q is [rows, {heads}, {d}]: the CUDA scorer takes heads in {HEADS} "
                         f"and head_dim {HEAD_DIM} (use the Triton scorer otherwise)")
    if not q_u8.is_contiguous():
        raise ValueError("q must be contiguous (pass .contiguous())")
    C.cuda_tensor(w, "weights", dev)
    C.dtype(w, "weights", torch.float32)
    C.cuda_tensor(out, "out", dev)
    C.dtype(out, "out", torch.int64)
    return dev, rows


def _check_columns(col0: int, n_cols: int, chunk: int) -> None:
    if col0 < 0 or n_cols < 0:
        raise ValueError(f"col0 and n_cols must be >= 0, got {col0}, {n_cols}")
    if chunk and (chunk % CHUNK_STEP or chunk < 0):
        raise ValueError(f"chunk must be 0 or a positive multiple of {CHUNK_STEP}, got {chunk}")


def indexer_paged_keys(q_u8: torch.Tensor, w: torch.Tensor, *, col0: int, n_cols: int,
                       lo: torch.Tensor, hi: torch.Tensor, out: torch.Tensor,
                       pages: torch.Tensor, block_table: torch.Tensor, row_req: torch.Tensor,
                       block_size: int, chunk: int = 0, sm_count: int | None = None,
                       smem_cap: int | None = None, rows_per_req: int = 0,
                       fill: bool = True) -> torch.Tensor:
    """Keys of columns [col0, col0 + n_cols) of every row into ``out`` [rows, >= n_cols]
    (int64); returns ``out``. ``q_u8`` uint8 [rows, heads, 128], ``w`` fp32 [rows, heads],
    ``pages`` the indexer cache ([num_pages, ...] bytes: block_size x 128 codes, then
    block_size fp32 scales per page), ``block_table`` int32 [reqs, max_blocks] (any strides),
    ``row_req`` / ``lo`` / ``hi`` int32 [rows]. ``chunk``: columns per block (a multiple of 64;
    0 sizes it from the SM count). ``sm_count`` / ``smem_cap``: size the grid and the ring depth
    for another part (e.g. 108 SMs, or SM86's 101376-byte shared-memory limit: a 4-stage ring
    instead of 8); 0/None: the device's. ``rows_per_req`` (1..8; 2+ for MTP / speculative decode
    rows): blocks take rows [k n, (k + 1) n) together and decode each K tile once for all of
    them (csrc/index/indexer_rows.cu); best when those rows share a request, correct in any
    order; the same keys, bit for bit. 1: that kernel with one row per block (Q in shared
    memory; faster than a warp per row once its grid covers the SMs:
    ``ampere.indexer.decode_rows_per_req``). 0: a warp per row (csrc/index/indexer_keys.cu).
    ``fill=False``: columns outside the rows' windows [lo, hi) may be left unwritten (a warp
    kernel's row: outside its window; a rows-kernel block: outside the union of its rows'
    windows), for a caller that reads only the windows (``row_topk_*(..., hi=...)``); rows
    without a valid request are written whole."""
    if not 0 <= int(rows_per_req) <= 8:
        raise ValueError(f"rows_per_req must be in [0, 8], got {rows_per_req}")
    dev, rows = _check_rows(q_u8, w, out)
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    flat = flat_pages(pages, block_size)
    if flat.device != dev:
        raise ValueError(f"kv_cache is on {flat.device} but q is on {dev}")
    C.cuda_tensor(block_table, "block_table", dev)
    C.dtype(block_table, "block_table", torch.int32)
    C.dim(block_table, "block_table", 2, "[num_reqs, max_blocks]")
    for t, name in ((row_req, "row_req"), (lo, "lo"), (hi, "hi")):
        C.vector(t, name, dev, torch.int32, rows)
    _check_columns(col0, n_cols, chunk)
    args = (out, q_u8, w, flat, block_table, row_req, lo, hi, int(col0), int(n_cols),
            int(block_size), int(chunk), int(sm_count or 0), int(smem_cap or 0), int(rows_per_req))
    if fill:  # (the call of builds before the fill flag, too)
        _ops().indexer_paged_keys(*args)
    else:
        _ops().indexer_paged_keys(*args, False)
    return out


@functools.cache
def flat_available() -> bool:
    """True when the extension loads and has the flat (prefill) scorer."""
    try:
        return hasattr(_ops(), "indexer_flat_keys")
    except (ImportError, OSError, RuntimeError):
        return False


def _codes_u8(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.element_size() != 1:
        raise TypeError(f"{name} must hold e4m3 codes (uint8 / float8_e4m3fn), got {t.dtype}")
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


FLAT_KERNELS = {"auto": 0, "warp": 1, "rows": 2}  # the op's `kernel` argument


def indexer_flat_keys(q_u8: torch.Tensor, w: torch.Tensor, *, col0: int, n_cols: int,
                      lo: torch.Tensor, hi: torch.Tensor, out: torch.Tensor,
                      k_codes: torch.Tensor, k_scale: torch.Tensor, chunk: int = 0,
                      sm_count: int | None = None, smem_cap: int | None = None,
                      kernel: str = "auto") -> torch.Tensor:
    """Keys of columns [col0, col0 + n_cols) of every row into ``out`` [rows, >= n_cols]
    (int64); returns ``out``. As :func:`indexer_paged_keys`, but K is the flat workspace:
    ``k_codes`` [Nk, 128] e4m3 codes (uint8 or float8_e4m3fn; rows contiguous, 16-byte aligned)
    and ``k_scale`` fp32 [Nk]; ``lo`` / ``hi`` int32 [rows] are global columns. Columns at or
    past Nk are never read: a visible one scores 0. ``chunk``: columns per block (a multiple
    of 64; 0: the kernel's choice, at least four waves of blocks on the SM count).
    ``kernel``: ``"rows"`` (csrc/index/indexer_rows.cu: blocks of rows share each decoded K
    tile), ``"warp"`` (indexer_keys.cu's flat mode: a warp per row) or ``"auto"`` (rows where
    two rows' fp16 Q fit the shared-memory cap, else warp); all give the same keys, bit for
    bit."""
    if kernel not in FLAT_KERNELS:
        raise ValueError(f"kernel must be one of {sorted(FLAT_KERNELS)}, got {kernel!r}")
    dev, rows = _check_rows(q_u8, w, out)
    C.cuda_tensor(k_codes, "k_codes", dev)
    k_codes = _codes_u8(k_codes, "k_codes")
    C.dim(k_codes, "k_codes", 2, "[Nk, 128]")
    if k_codes.shape[1] != HEAD_DIM or (k_codes.shape[0] > 1 and k_codes.stride(1) != 1):
        raise ValueError(f"k_codes must be [Nk, {HEAD_DIM}] with contiguous rows, got shape "
                         f"{tuple(k_codes.shape)} strides {k_codes.stride()}")
    C.cuda_tensor(k_scale, "k_scale", dev)
    C.dtype(k_scale, "k_scale", torch.float32)
    k_scale = k_scale.reshape(-1)
    if k_scale.shape[0] < k_codes.shape[0]:
        raise ValueError(f"k_scale has {k_scale.shape[0]} entries for {k_codes.shape[0]} K rows")
    for t, name in ((lo, "lo"), (hi, "hi")):
        C.vector(t, name, dev, torch.int32, rows)
    _check_columns(col0, n_cols, chunk)
    _ops().indexer_flat_keys(out, q_u8, w, k_codes, k_scale.contiguous(), lo, hi, int(col0),
                             int(n_cols), int(chunk), int(sm_count or 0), int(smem_cap or 0),
                             FLAT_KERNELS[kernel])
    return out


ROW_TOPK_MAX_K = 2048  # builds before the candidate ops: 1024 (row_topk_max_k)


@functools.cache
def _has_row_topk() -> bool:
    try:
        ops = _ops()
        return hasattr(ops, "row_topk_keys") and hasattr(ops, "row_topk_indices")
    except (ImportError, OSError, RuntimeError):
        return False


@functools.cache
def op_takes(op: str, arg: str) -> bool:
    """True when the loaded extension's ``op`` has an argument ``arg`` (a build older than the
    overlay may lack one: the row top-k's window, the scorer's ``fill``)."""
    try:
        return any(a.name == arg for a in getattr(_ops(), op).default._schema.arguments)
    except (AttributeError, ImportError, OSError, RuntimeError):
        return False


@functools.cache
def candidate_available() -> bool:
    """True when the extension has DeepSeek-V4.1's candidate-step ops (and with them the row
    top-k up to k = 2048)."""
    try:
        ops = _ops()
        return hasattr(ops, "candidate_block_keys") and hasattr(ops, "candidate_mask")
    except (ImportError, OSError, RuntimeError):
        return False


def row_topk_max_k() -> int:
    """The loaded build's largest row top-k: 2048 since the candidate ops came in (V4.1's 2048
    candidate blocks per row), 1024 before."""
    return ROW_TOPK_MAX_K if candidate_available() else 1024


def row_topk_available(k: int) -> bool:
    """True when the extension has the row top-k op and ``k`` is within its limit."""
    return 1 <= k <= row_topk_max_k() and _has_row_topk()


def _window_bound(t: torch.Tensor, name: str, keys: torch.Tensor) -> None:
    C.cuda_tensor(t, name, keys.device)
    C.dtype(t, name, torch.int32)
    if t.dim() != 1 or t.shape[0] < keys.shape[0] or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous int32 [>= rows] tensor (rows = "
                         f"{keys.shape[0]}), got shape {tuple(t.shape)} strides {t.stride()}")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes two 2-D tensors span (first to last element) intersect."""
    if a.numel() == 0 or b.numel() == 0:
        return False

    def span(t):
        last = (t.shape[0] - 1) * t.stride(0) + (t.shape[1] - 1) * t.stride(1)
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _row_topk(keys: torch.Tensor, k: int, out: torch.Tensor | None, dtype: torch.dtype,
              op: str, lo: torch.Tensor | None = None, hi: torch.Tensor | None = None,
              col0: int = 0, prefix: int = 0, best: torch.Tensor | None = None) -> torch.Tensor:
    C.cuda_tensor(keys, "keys")
    C.dtype(keys, "keys", torch.int64)
    C.dim(keys, "keys", 2, "[rows, n]")
    if not 1 <= k <= row_topk_max_k():
        raise ValueError(f"k must be in [1, {row_topk_max_k()}], got {k}")
    if keys.stride(1) != 1:
        keys = keys.contiguous()
    if out is None:
        out = torch.empty(keys.shape[0], k, dtype=dtype, device=keys.device)
    C.cuda_tensor(out, "out", keys.device)
    C.dtype(out, "out", dtype)
    C.dim(out, "out", 2, "[>= rows, >= k]")
    if out.shape[0] < keys.shape[0] or out.shape[1] < k or (out.numel() > 0 and out.stride(1) != 1):
        raise ValueError(f"out must be [>= {keys.shape[0]}, >= {k}] with a contiguous last dim, "
                         f"got shape {tuple(out.shape)} strides {out.stride()}")
    if lo is not None and hi is None:
        raise ValueError("lo needs hi (the window is [lo, hi))")
    if not 0 <= prefix <= keys.shape[1]:
        raise ValueError(f"prefix must be in [0, n = {keys.shape[1]}], got {prefix}")
    if hi is not None:
        _window_bound(hi, "hi", keys)
    if lo is not None:
        _window_bound(lo, "lo", keys)
    if best is not None:
        if hi is None or prefix:
            raise ValueError("best needs hi and prefix = 0 (it is the prefix)")
        C.cuda_tensor(best, "best", keys.device)
        C.dtype(best, "best", torch.int64)
        if best.dim() != 2 or best.shape[0] < keys.shape[0] or (best.numel() and best.stride(1) != 1):
            raise ValueError(f"best must be int64 [>= {keys.shape[0]}, m] with a contiguous last "
                             f"dim, got shape {tuple(best.shape)} strides {best.stride()}")
    # out may be best itself (a running best merged in place), nothing else it overlaps
    if _overlap(out, keys):
        raise ValueError("out must not overlap keys")
    if best is not None and _overlap(out, best) and not (
            out.data_ptr() == best.data_ptr() and out.stride(0) == best.stride(0)):
        raise ValueError("out must be best itself (the same data and row stride) or not overlap it")
    if hi is None:  # (the call of builds before the window, too)
        getattr(_ops(), op)(out, keys, int(k))
    elif best is None:
        getattr(_ops(), op)(out, keys, int(k), lo, hi, int(col0), int(prefix))
    else:
        getattr(_ops(), op)(out, keys, int(k), lo, hi, int(col0), 0, best)
    return out


def row_topk_keys(keys: torch.Tensor, k: int, out: torch.Tensor | None = None, *,
                  lo: torch.Tensor | None = None, hi: torch.Tensor | None = None,
                  col0: int = 0, prefix: int = 0, best: torch.Tensor | None = None) -> torch.Tensor:
    """The ``k`` largest int64 keys of each row, descending: equal to
    ``torch.topk(keys padded with INT64_MIN to >= k columns, k, sorted=True).values``
    (csrc/index/row_topk.cu: radix select, then a sort of the k).

    ``hi`` (and ``lo``), int32 [>= rows]: each row's visible window. The caller promises that
    key ``j >= prefix`` of row ``r``, the key of column ``col0 + j - prefix``, is INT64_MIN
    unless that column is in ``[lo[r], hi[r])`` (``lo`` None: 0), as the indexer's scorers write
    them. The kernel then reads only the first ``prefix`` keys and the window's: the same result,
    without reading a row as wide as the block table (a vLLM decode's columns span
    ``max_model_len``, its rows only their context). ``best`` [>= rows, m] (with ``hi``, no
    ``prefix``): a running best merged in front of ``keys``, which are then all window columns
    (the top-k of ``cat([best, keys])`` without the copy); ``out`` may be ``best`` itself (the
    merge in place: a row whose window is empty then writes nothing)."""
    return _row_topk(keys, k, out, torch.int64, "row_topk_keys", lo, hi, col0, prefix, best)


def row_topk_indices(keys: torch.Tensor, k: int, out: torch.Tensor | None = None, *,
                     lo: torch.Tensor | None = None, hi: torch.Tensor | None = None,
                     col0: int = 0, prefix: int = 0, best: torch.Tensor | None = None) -> torch.Tensor:
    """The same top-k as :func:`row_topk_keys`, written as the int32 column indices the keys
    carry (``deepinfer_sm80.ampere.indexer.keys_to_indices``: -1 for INT64_MIN) into the first
    ``k`` columns of each row of ``out`` [>= rows, >= k] (rows may be strided): the indexer's
    last merge and its index output in one kernel. ``lo``, ``hi``, ``col0``, ``prefix``,
    ``best``: the window, as for :func:`row_topk_keys`."""
    return _row_topk(keys, k, out, torch.int32, "row_topk_indices", lo, hi, col0, prefix, best)


def _candidate_tile(keys: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor | None, col0: int,
                    n_cols: int, block_size: int) -> None:
    C.cuda_tensor(keys, "keys")
    C.dtype(keys, "keys", torch.int64)
    C.dim(keys, "keys", 2, "[rows, n]")
    if keys.numel() and keys.stride(1) != 1:
        raise ValueError(f"keys must have a contiguous last dim, got strides {keys.stride()}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if col0 < 0 or n_cols < 0 or n_cols > keys.shape[1]:
        raise ValueError(f"columns [col0, col0 + n_cols) = [{col0}, {col0 + n_cols}) must start at "
                         f">= 0 with n_cols <= keys.shape[1] = {keys.shape[1]}")
    _window_bound(hi, "hi", keys)
    if lo is not None:
        _window_bound(lo, "lo", keys)


def candidate_block_keys(keys: torch.Tensor, *, hi: torch.Tensor, col0: int, n_cols: int,
                         block_size: int, best: torch.Tensor,
                         visible_blocks: torch.Tensor | None = None,
                         lo: torch.Tensor | None = None, merge: bool = False) -> torch.Tensor:
    """DeepSeek-V4.1's candidate-source step on one column tile (``keys`` [rows, >= n_cols] int64,
    key j of column ``col0 + j``; row r sees columns ``[lo[r], hi[r])``, ``lo`` None: 0, and its
    local position ``c - lo[r]`` is in block ``(c - lo[r]) // block_size``): for every block b
    visible in the tile, the block's largest key with its low word replaced by the inverted block
    id, INT64_MIN when its score is -inf, the score +inf for the row's newest block, goes to
    ``best[r, b]``: written (``merge`` False: a decode's tiles hold whole blocks, so no ``lo``
    and ``col0``, ``n_cols`` multiples of ``block_size``) or merged by max (``merge``: a
    prefill's blocks span tiles; ``best`` starts at INT64_MIN). Columns outside the rows'
    windows are not read, blocks past them not written. :func:`row_topk_indices` of ``best``
    with ``hi`` = the rows' visible blocks then gives the blocks
    ``deepinfer_sm80.ampere.indexer.CandidateStep`` writes (csrc/index/candidate_blocks.cu).
    ``visible_blocks`` (int32 [>= rows]): also receives that window,
    ``ceil(max(hi - lo, 0) / block_size)`` per row."""
    _candidate_tile(keys, hi, lo, col0, n_cols, block_size)
    if not merge and (lo is not None or col0 % block_size or n_cols % block_size):
        raise ValueError(f"without merge the tile must hold whole blocks: no lo, and col0 ({col0}) "
                         f"and n_cols ({n_cols}) multiples of block_size ({block_size})")
    if visible_blocks is not None:
        _window_bound(visible_blocks, "visible_blocks", keys)
    C.cuda_tensor(best, "best", keys.device)
    C.dtype(best, "best", torch.int64)
    need = 0 if lo is not None else -(-(col0 + n_cols) // block_size)
    if best.dim() != 2 or best.shape[0] < keys.shape[0] or best.shape[1] < need or (
            best.numel() and best.stride(1) != 1):
        raise ValueError(f"best must be int64 [>= {keys.shape[0]}, >= {need}] with a contiguous "
                         f"last dim, got shape {tuple(best.shape)} strides {best.stride()}")
    _ops().candidate_block_keys(best, keys, hi, int(col0), int(n_cols), int(block_size),
                                visible_blocks, lo, bool(merge))
    return best


def candidate_mask(keys: torch.Tensor, *, hi: torch.Tensor, col0: int, n_cols: int,
                   block_size: int, blocks: torch.Tensor,
                   lo: torch.Tensor | None = None) -> torch.Tensor:
    """DeepSeek-V4.1's mask step on one column tile, in place: the keys of visible columns
    (``[lo[r], hi[r])``, ``lo`` None: 0) whose block (of local positions ``c - lo[r]``) is not
    among ``blocks[r]`` (int32 [>= rows, K], -1 for none) become INT64_MIN; columns outside the
    window are not touched (csrc/index/candidate_blocks.cu)."""
    _candidate_tile(keys, hi, lo, col0, n_cols, block_size)
    C.cuda_tensor(blocks, "blocks", keys.device)
    C.dtype(blocks, "blocks", torch.int32)
    if blocks.dim() != 2 or blocks.shape[0] < keys.shape[0] or (
            blocks.shape[1] > 1 and blocks.stride(1) != 1):
        raise ValueError(f"blocks must be int32 [>= {keys.shape[0]}, K] with a contiguous last "
                         f"dim, got shape {tuple(blocks.shape)} strides {blocks.stride()}")
    _ops().candidate_mask(keys, blocks, hi, int(col0), int(n_cols), int(block_size), lo)
    return keys


__all__ = ["indexer_paged_keys", "indexer_flat_keys", "available", "flat_available", "supports",
           "flat_pages", "row_topk_keys", "row_topk_indices", "row_topk_available", "op_takes",
           "candidate_available", "candidate_block_keys", "candidate_mask", "row_topk_max_k"]
