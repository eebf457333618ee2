"""CPU checks of the op wrappers' argument validation (deepinfer_sm80.ops.cache / .index /
.indexer, and
the attention wrappers' arguments to the op):
bad inputs raise errors that name the argument, good inputs reach the extension op with the
arguments it expects. The CUDA device check is relaxed to accept CPU tensors and the
extension is replaced by a recorder; the kernels themselves are tested in tests/gpu."""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.ops import _checks as C
from deepinfer_sm80.ops import cache as ops_cache
from deepinfer_sm80.ops import index as ops_index
from deepinfer_sm80.ops import indexer as ops_indexer


class _Recorder:
    """Stands in for the extension: records (name, args, kwargs); sparse_mla_plan answers
    like the extension (a 6-entry plan)."""

    def __init__(self):
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name):
        def op(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if name == "sparse_mla_plan":
                return [64, 32, 256, 157952, 20, 4]
        return op


@pytest.fixture()
def rec(monkeypatch):
    real = C.cuda_tensor

    def cuda_tensor(t, name, device=None):  # CPU tensors stand in for CUDA ones here
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if device is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device} but the other inputs are on {device}")

    assert real is not cuda_tensor
    monkeypatch.setattr(C, "cuda_tensor", cuda_tensor)
    r = _Recorder()
    monkeypatch.setattr(ops_cache, "_ops", lambda: r)
    monkeypatch.setattr(ops_index, "_ops", lambda: r)
    monkeypatch.setattr(ops_indexer, "_ops", lambda: r)
    return r


def _i32(*vals):
    return torch.tensor(vals, dtype=torch.int32)


def _combine_args(T=4, R=1):
    return dict(topk_indices=torch.zeros(T, 8, dtype=torch.int32),
                query_start_loc=_i32(0, T), seq_lens=_i32(T + 10), gather_lens=_i32(T + 3),
                window_size=4, compress_ratio=4, topk=8, M=100, N=50)


def test_combine_valid_reaches_op(rec):
    idx, lens = ops_index.combine_topk_swa_indices(**_combine_args())
    assert rec.calls and rec.calls[0][0] == "combine_topk_swa_indices"
    assert idx.shape == (4, 128) and lens.shape == (4,)


@pytest.mark.parametrize("arg,value,match", [
    ("seq_lens", torch.zeros(1, dtype=torch.int64), "seq_lens must be torch.int32"),
    ("gather_lens", _i32(), "gather_lens has 0 entries, needs at least 1"),
    ("query_start_loc", _i32(0), "query_start_loc has 1 entries, needs at least 2"),
    ("query_start_loc", torch.zeros(2, 2, dtype=torch.int32)[:, 0], "contiguous 1-D"),
    ("topk_indices", torch.zeros(4, dtype=torch.int32), r"topk_indices must be \[num_tokens, topk\]"),
    ("topk", 9, "topk=9 must be in"),
])
def test_combine_rejects(rec, arg, value, match):
    kw = _combine_args()
    kw[arg] = value
    with pytest.raises((ValueError, TypeError), match=match):
        ops_index.combine_topk_swa_indices(**kw)
    assert not rec.calls


def test_combine_v41_reaches_op_with_its_flag(rec, monkeypatch):
    """v41=True (DeepSeek-V4.1's combine) passes the flag last, takes ratio 0, refuses images;
    an extension built before the flag is refused with how to fix it, not called without it."""
    monkeypatch.setattr(ops_index, "_takes_v41", lambda: True)
    kw = _combine_args()
    ops_index.combine_topk_swa_indices(**kw, v41=True)
    ops_index.combine_topk_swa_indices(**{**kw, "compress_ratio": 0}, v41=True)
    assert [c[1][-1] for c in rec.calls] == [True, True] and rec.calls[1][1][7] == 0
    with pytest.raises(ValueError, match="no image visibility"):
        ops_index.combine_topk_swa_indices(**kw, max_image_tokens=16, v41=True)
    with pytest.raises(ValueError, match="compress_ratio must be >= 1"):
        ops_index.combine_topk_swa_indices(**{**kw, "compress_ratio": 0})
    monkeypatch.setattr(ops_index, "_takes_v41", lambda: False)
    with pytest.raises(RuntimeError, match="make build"):
        ops_index.combine_topk_swa_indices(**kw, v41=True)
    assert len(rec.calls) == 2


def test_combine_non_contiguous_topk_is_copied(rec):
    kw = _combine_args()
    kw["topk_indices"] = torch.zeros(8, 4, dtype=torch.int32).t()  # stride(1) != 1
    ops_index.combine_topk_swa_indices(**kw)
    assert rec.calls[0][1][2].stride(1) == 1


def test_global_topk_valid_and_rejects(rec):
    topk = torch.zeros(3, 8, dtype=torch.int32)
    t2r, table, valid = _i32(0, 0, 0), torch.zeros(1, 4, dtype=torch.int32), torch.ones(3, dtype=torch.bool)
    out, lens = ops_index.compute_global_topk_indices_and_lens(topk, t2r, table, 64, valid)
    assert out.shape == (3, 8) and lens.shape == (3,)
    with pytest.raises(ValueError, match="is_valid_token has 2 entries, needs at least 3"):
        ops_index.compute_global_topk_indices_and_lens(topk, t2r, table, 64, valid[:2])
    with pytest.raises(TypeError, match="token_to_req_indices must be torch.int32"):
        ops_index.compute_global_topk_indices_and_lens(topk, t2r.long(), table, 64, valid)
    assert len(rec.calls) == 1


def test_gather_and_insert_validation(rec):
    cache = torch.zeros(2, 64 * 584, dtype=torch.uint8)
    out = torch.zeros(1, 8, 512, dtype=torch.bfloat16)
    table = torch.zeros(1, 2, dtype=torch.int32)
    ops_cache.dequantize_and_gather_k_cache(out, cache, _i32(8), None, table, 64, 0)
    ops_cache.dequantize_and_gather_k_cache(out, cache, _i32(8), _i32(4), table, 64, 0)
    with pytest.raises(ValueError, match="gather_lens has 0 entries, needs at least 1"):
        ops_cache.dequantize_and_gather_k_cache(out, cache, _i32(8), _i32(), table, 64, 0)
    with pytest.raises(TypeError, match="seq_lens must be torch.int32"):
        ops_cache.dequantize_and_gather_k_cache(out, cache, _i32(8).long(), None, table, 64, 0)
    k = torch.zeros(4, 512, dtype=torch.bfloat16)
    ops_cache.quantize_and_insert_k_cache(k, cache, torch.arange(4), 64)
    with pytest.raises(TypeError, match="slot_mapping must be torch.int64"):
        ops_cache.quantize_and_insert_k_cache(k, cache, torch.arange(4, dtype=torch.int32), 64)
    assert [c[0] for c in rec.calls] == ["dequantize_and_gather_k_cache"] * 2 + ["quantize_and_insert_k_cache"]


def test_row_topk_wrappers(rec):
    """row_topk_keys / row_topk_indices: int64 keys [rows, n], 1 <= k <= 2048 (1024 in builds
    without the candidate ops), out int64 /
    int32 [>= rows, >= k] with a contiguous last dim (rows may be strided), else no call."""
    keys = torch.zeros(3, 10, dtype=torch.int64)
    ops_indexer.row_topk_keys(keys, 4)
    wide = torch.zeros(5, 8, dtype=torch.int32)
    assert ops_indexer.row_topk_indices(keys, 4, out=wide[1:4]) is not None
    assert [c[0] for c in rec.calls] == ["row_topk_keys", "row_topk_indices"]
    assert rec.calls[1][1][0].stride() == (8, 1) and rec.calls[1][1][2] == 4
    bad = [(dict(out=torch.zeros(3, 4, dtype=torch.int64)), TypeError, "out must be torch.int32"),
           (dict(out=torch.zeros(2, 4, dtype=torch.int32)), ValueError, r"out must be \[>= 3, >= 4\]"),
           (dict(out=torch.zeros(3, 3, dtype=torch.int32)), ValueError, r"out must be \[>= 3, >= 4\]"),
           (dict(out=torch.zeros(8, 3, dtype=torch.int32).t()), ValueError, "contiguous last dim"),
           (dict(out=torch.zeros(3, 4, 1, dtype=torch.int32)), ValueError, "out must be"),
           (dict(k=0), ValueError, "k must be in"), (dict(k=2049), ValueError, "k must be in"),
           (dict(keys=keys.int()), TypeError, "keys must be torch.int64")]
    for kw, exc, match in bad:
        args = dict(keys=keys, k=4, out=torch.zeros(3, 4, dtype=torch.int32)) | kw
        with pytest.raises(exc, match=match):
            ops_indexer.row_topk_indices(args["keys"], args["k"], out=args["out"])
    assert len(rec.calls) == 2


def test_row_topk_window_arguments(rec):
    """The window: hi (and lo) int32 [>= rows] contiguous, lo only with hi, 0 <= prefix <= n;
    they reach the op in its order (out, keys, k, lo, hi, col0, prefix), else no call."""
    keys = torch.zeros(3, 10, dtype=torch.int64)
    out = torch.zeros(3, 4, dtype=torch.int32)
    hi, lo = _i32(5, 6, 7), _i32(0, 1, 2)
    ops_indexer.row_topk_indices(keys, 4, out=out, lo=lo, hi=hi, col0=100, prefix=4)
    ops_indexer.row_topk_keys(keys, 4, hi=_i32(1, 2, 3, 4))
    ops_indexer.row_topk_keys(keys, 4)
    (_, a1, _), (_, a2, _), (_, a3, _) = rec.calls
    assert a1[3] is lo and a1[4] is hi and a1[5:] == (100, 4)
    assert a2[3] is None and a2[4].shape == (4,) and a2[5:] == (0, 0)
    assert len(a3) == 3  # no window: the op's three arguments
    bad = [(dict(lo=lo), ValueError, "lo needs hi"),
           (dict(hi=_i32(1, 2)), ValueError, r"hi must be a contiguous int32 \[>= rows\]"),
           (dict(hi=torch.tensor([1, 2, 3])), TypeError, "hi must be torch.int32"),
           (dict(hi=_i32(1, 2, 3, 4, 5, 6)[::2]), ValueError, "hi must be a contiguous"),
           (dict(hi=hi, lo=_i32(0, 1)), ValueError, "lo must be a contiguous"),
           (dict(hi=hi, prefix=11), ValueError, r"prefix must be in \[0, n = 10\]"),
           (dict(hi=hi, prefix=-1), ValueError, "prefix must be in"),
           (dict(best=torch.zeros(3, 4, dtype=torch.int64)), ValueError, "best needs hi"),
           (dict(hi=hi, prefix=2, best=torch.zeros(3, 4, dtype=torch.int64)), ValueError,
            "best needs hi and prefix = 0"),
           (dict(hi=hi, best=torch.zeros(3, 4, dtype=torch.int32)), TypeError, "best must be torch.int64"),
           (dict(hi=hi, best=torch.zeros(2, 4, dtype=torch.int64)), ValueError, r"best must be int64 \[>= 3, m\]"),
           (dict(hi=hi, best=torch.zeros(8, 3, dtype=torch.int64).t()), ValueError, "contiguous last dim")]
    for kw, exc, match in bad:
        with pytest.raises(exc, match=match):
            ops_indexer.row_topk_indices(keys, 4, out=out, **kw)
    assert len(rec.calls) == 3
    best = torch.zeros(3, 6, dtype=torch.int64)
    ops_indexer.row_topk_keys(keys, 4, hi=hi, col0=7, best=best)
    assert rec.calls[3][1][3:] == (None, hi, 7, 0, best)


def test_candidate_wrappers(rec):
    """candidate_block_keys / candidate_mask (DeepSeek-V4.1's candidate step on a decode tile):
    int64 keys [rows, >= n_cols] with a contiguous last dim, hi int32 [>= rows], col0 and n_cols
    multiples of block_size for block keys without merge (a decode); best int64
    [>= rows, >= ceil((col0 + n_cols) / block_size)] (no lo), blocks int32
    [>= rows, K], visible_blocks int32 [>= rows]; they reach the ops in their order, else no
    call."""
    keys = torch.zeros(3, 64, dtype=torch.int64)
    hi = _i32(5, 6, 7)
    best = torch.zeros(3, 24, dtype=torch.int64)
    blocks = torch.zeros(4, 5, dtype=torch.int32)
    vis = torch.zeros(3, dtype=torch.int32)
    ops_indexer.candidate_block_keys(keys, hi=hi, col0=128, n_cols=64, block_size=8, best=best,
                                     visible_blocks=vis)
    ops_indexer.candidate_mask(keys[:, :32], hi=hi, col0=16, n_cols=32, block_size=16, blocks=blocks)
    (n1, a1, _), (n2, a2, _) = rec.calls
    assert n1 == "candidate_block_keys" and a1[0] is best and a1[2] is hi and a1[3:6] == (128, 64, 8)
    assert a1[6] is vis
    assert n2 == "candidate_mask" and a2[1] is blocks and a2[3:] == (16, 32, 16, None)
    assert a1[7:] == (None, False)
    with pytest.raises(ValueError, match="must hold whole blocks"):
        ops_indexer.candidate_block_keys(keys, hi=hi, col0=4, n_cols=60, block_size=8, best=best)
    with pytest.raises(ValueError, match="must hold whole blocks"):
        ops_indexer.candidate_block_keys(keys, hi=hi, col0=0, n_cols=64, block_size=8, best=best, lo=hi)
    ops_indexer.candidate_block_keys(keys, hi=hi, lo=hi, col0=4, n_cols=60, block_size=8,
                                     best=best[:, :1], merge=True)  # a prefill tile
    ops_indexer.candidate_mask(keys, hi=hi, lo=hi, col0=4, n_cols=60, block_size=8, blocks=blocks)
    (_, a3, _), (_, a4, _) = rec.calls[2:]
    assert a3[7] is hi and a3[8] is True and a4[6] is hi and a4[3:6] == (4, 60, 8)
    del rec.calls[2:]
    bad_keys = [(dict(n_cols=72), ValueError, r"n_cols <= keys.shape\[1\] = 64"),
                (dict(col0=-8), ValueError, "start at >= 0"),
                (dict(block_size=0), ValueError, "block_size must be >= 1"),
                (dict(keys=keys.int()), TypeError, "keys must be torch.int64"),
                (dict(keys=torch.zeros(64, 3, dtype=torch.int64).t()), ValueError, "contiguous last dim"),
                (dict(hi=_i32(1, 2)), ValueError, r"hi must be a contiguous int32 \[>= rows\]"),
                (dict(lo=_i32(1, 2), merge=True), ValueError, r"lo must be a contiguous int32")]
    for kw, exc, match in bad_keys:
        args = dict(keys=keys, hi=hi, col0=0, n_cols=64, block_size=8) | kw
        k = args.pop("keys")
        with pytest.raises(exc, match=match):
            ops_indexer.candidate_block_keys(k, best=best, **args)
        args.pop("merge", None)
        with pytest.raises(exc, match=match):
            ops_indexer.candidate_mask(k, blocks=blocks, **args)
    kw = dict(hi=hi, col0=0, n_cols=64, block_size=8)
    for b, exc, match in [(torch.zeros(3, 7, dtype=torch.int64), ValueError, r"best must be int64 \[>= 3, >= 8\]"),
                          (torch.zeros(2, 8, dtype=torch.int64), ValueError, "best must be int64"),
                          (best.int(), TypeError, "best must be torch.int64")]:
        with pytest.raises(exc, match=match):
            ops_indexer.candidate_block_keys(keys, best=b, **kw)
    with pytest.raises(ValueError, match="visible_blocks must be a contiguous int32"):
        ops_indexer.candidate_block_keys(keys, best=best, visible_blocks=vis[:2], **kw)
    for b, exc, match in [(blocks.long(), TypeError, "blocks must be torch.int32"),
                          (blocks[:2], ValueError, r"blocks must be int32 \[>= 3, K\]"),
                          (torch.zeros(8, 4, dtype=torch.int32).t(), ValueError, "contiguous last dim")]:
        with pytest.raises(exc, match=match):
            ops_indexer.candidate_mask(keys, blocks=b, **kw)
    assert len(rec.calls) == 2


# ---------------------------------------------------------------- attention wrappers
from deepinfer_sm80.ops import attention as ops_attn  # noqa: E402


def _prefill_inputs(t=6, h=8, topk=64):
    q = torch.zeros(t, h, 512, dtype=torch.bfloat16)
    kv = torch.zeros(100, 1, 512, dtype=torch.bfloat16)
    idx = torch.zeros(t, 1, topk, dtype=torch.int32)
    return q, kv, idx


@pytest.mark.parametrize("num_sms", [0, 108])
def test_prefill_passes_num_sms_only_when_set(monkeypatch, num_sms):
    """num_sms goes to the op by keyword and only when set, so that an extension built
    before the argument existed (a same-run A/B's base build) still takes the call."""
    r = _Recorder()
    monkeypatch.setattr(ops_attn, "_ops", lambda: r)
    q, kv, idx = _prefill_inputs()
    out, mx, lse = ops_attn.flash_mla_sparse_fwd(q, kv, idx, 0.04, smem_cap=101376, num_sms=num_sms)
    (name, args, kwargs), = r.calls
    assert name == "sparse_mla_prefill"
    assert args[-1] == 101376  # smem_cap, positional as in every build
    assert kwargs == ({"num_sms": num_sms} if num_sms else {})
    assert out.shape == q.shape and mx.shape == (6, 8) and lse.shape == (6, 8)


def test_plan_reports_split_tokens(monkeypatch):
    r = _Recorder()
    monkeypatch.setattr(ops_attn, "_ops", lambda: r)
    plan = ops_attn.sparse_mla_plan(4096, 64, 640, False, 132, 166912)
    assert plan == {"heads_per_block": 64, "keys_per_tile": 32, "threads": 256,
                    "smem_bytes": 157952, "splits": 20, "split_tokens": 4}
    assert r.calls[0][1] == (4096, 64, 640, False, 132, 166912)


def _scorer_args(rows=3, heads=32, bs=64, nb=5):
    return dict(q_u8=torch.zeros(rows, heads, 128, dtype=torch.uint8),
                w=torch.zeros(rows, heads), col0=0, n_cols=2 * bs,
                lo=torch.zeros(rows, dtype=torch.int32), hi=torch.full((rows,), 100, dtype=torch.int32),
                out=torch.empty(rows, 2 * bs, dtype=torch.int64),
                pages=torch.zeros(nb, bs, 132, dtype=torch.uint8),
                block_table=torch.zeros(2, 4, dtype=torch.int32),
                row_req=torch.zeros(rows, dtype=torch.int32), block_size=bs)


def test_indexer_scorer_valid_reaches_op_with_a_page_view(rec):
    kw = _scorer_args()
    ops_indexer.indexer_paged_keys(**kw)
    name, args, _ = rec.calls[0]
    assert name == "indexer_paged_keys"
    flat = args[3]
    assert flat.shape == (5, 64 * 132) and flat.data_ptr() == kw["pages"].data_ptr()  # no copy
    assert args[8:] == (0, 128, 64, 0, 0, 0, 0)
    ops_indexer.indexer_paged_keys(**kw, rows_per_req=6)
    assert rec.calls[1][1][-1] == 6


@pytest.mark.parametrize("arg,value,match", [
    ("q_u8", torch.zeros(3, 8, 128, dtype=torch.uint8), "heads in"),
    ("q_u8", torch.zeros(3, 32, 64, dtype=torch.uint8), "head_dim"),
    ("q_u8", torch.zeros(3, 128, 32, dtype=torch.uint8).transpose(1, 2), "contiguous"),
    ("w", torch.zeros(3, 32, dtype=torch.float16), "weights must be torch.float32"),
    ("out", torch.empty(3, 128, dtype=torch.int32), "out must be torch.int64"),
    ("pages", torch.zeros(5, 64, 100, dtype=torch.uint8), "pages hold 6400 bytes"),
    ("pages", torch.zeros(5, 132, 64, dtype=torch.uint8).transpose(1, 2), "contiguous pages"),
    ("pages", torch.zeros(5, 64, 66, dtype=torch.float16), "must hold bytes"),
    ("row_req", torch.zeros(2, dtype=torch.int32), "row_req has 2 entries"),
    ("hi", torch.zeros(3, dtype=torch.int64), "hi must be torch.int32"),
    ("block_table", torch.zeros(8, dtype=torch.int32), "block_table must be"),
    ("chunk", 96, "chunk must be 0 or a positive multiple of 64"),
    ("col0", -1, "col0 and n_cols must be >= 0"),
    ("rows_per_req", 9, r"rows_per_req must be in \[0, 8\]"),
])
def test_indexer_scorer_rejects(rec, arg, value, match):
    kw = _scorer_args()
    kw[arg] = value
    with pytest.raises((ValueError, TypeError), match=match):
        ops_indexer.indexer_paged_keys(**kw)
    assert not rec.calls


def test_indexer_scorer_choice(monkeypatch):
    from deepinfer_sm80.ampere import indexer as I

    q = torch.zeros(1, 1, 64, 128, dtype=torch.uint8)
    pages = torch.zeros(2, 64 * 132, dtype=torch.uint8)
    assert I._use_cuda_paged("auto", q, pages) is False  # CPU tensors: never the CUDA scorer
    assert I._use_cuda_paged("triton", q, pages) is False
    with pytest.raises(ValueError, match="scorer='cuda' needs CUDA tensors"):
        I._use_cuda_paged("cuda", q, pages)
    monkeypatch.setenv("DEEPINFER_INDEXER_SCORER", "fast")
    with pytest.raises(ValueError, match="DEEPINFER_INDEXER_SCORER='fast'"):
        I._scorer_choice("auto")
    monkeypatch.setenv("DEEPINFER_INDEXER_SCORER", "triton")
    assert I._scorer_choice("auto") == "triton" and I._scorer_choice("torch") == "torch"


def _flat_args(rows=3, heads=32, nk=200):
    return dict(q_u8=torch.zeros(rows, heads, 128, dtype=torch.uint8),
                w=torch.zeros(rows, heads), col0=5, n_cols=128,
                lo=torch.zeros(rows, dtype=torch.int32), hi=torch.full((rows,), 100, dtype=torch.int32),
                out=torch.empty(rows, 128, dtype=torch.int64),
                k_codes=torch.zeros(nk, 128, dtype=torch.uint8), k_scale=torch.ones(nk, 1))


def test_indexer_flat_scorer_valid_reaches_op(rec):
    kw = _flat_args()
    kw["k_codes"] = kw["k_codes"].view(torch.float8_e4m3fn)
    ops_indexer.indexer_flat_keys(**kw, chunk=2048, sm_count=108, smem_cap=101376)
    name, args, _ = rec.calls[0]
    assert name == "indexer_flat_keys"
    k, ks = args[3], args[4]
    assert k.dtype == torch.uint8 and k.data_ptr() == kw["k_codes"].data_ptr()  # a view
    assert ks.shape == (200,) and ks.dtype == torch.float32
    assert args[7:] == (5, 128, 2048, 108, 101376, 0)
    ops_indexer.indexer_flat_keys(**kw, kernel="warp")
    ops_indexer.indexer_flat_keys(**kw, kernel="rows")
    assert [c[1][-1] for c in rec.calls[1:]] == [1, 2]


@pytest.mark.parametrize("arg,value,match", [
    ("q_u8", torch.zeros(3, 8, 128, dtype=torch.uint8), "heads in"),
    ("q_u8", torch.zeros(3, 128, 32, dtype=torch.uint8).transpose(1, 2), "contiguous"),
    ("w", torch.zeros(3, 32, dtype=torch.float16), "weights must be torch.float32"),
    ("out", torch.empty(3, 128, dtype=torch.int32), "out must be torch.int64"),
    ("k_codes", torch.zeros(200, 64, dtype=torch.uint8), r"k_codes must be \[Nk, 128\]"),
    ("k_codes", torch.zeros(200, 256, dtype=torch.uint8)[:, ::2], "contiguous rows"),
    ("k_codes", torch.zeros(200, 128, dtype=torch.float16), "must hold e4m3 codes"),
    ("k_codes", torch.zeros(200 * 128, dtype=torch.uint8), "k_codes must be"),
    ("k_scale", torch.ones(199), "k_scale has 199 entries for 200"),
    ("k_scale", torch.ones(200, dtype=torch.float64), "k_scale must be torch.float32"),
    ("lo", torch.zeros(2, dtype=torch.int32), "lo has 2 entries"),
    ("chunk", 100, "chunk must be 0 or a positive multiple of 64"),
    ("n_cols", -3, "col0 and n_cols must be >= 0"),
    ("kernel", "fast", "kernel must be one of"),
])
def test_indexer_flat_scorer_rejects(rec, arg, value, match):
    kw = _flat_args()
    kw[arg] = value
    with pytest.raises((ValueError, TypeError), match=match):
        ops_indexer.indexer_flat_keys(**kw)
    assert not rec.calls


def test_indexer_flat_scorer_choice():
    from deepinfer_sm80.ampere import indexer as I

    q = torch.zeros(4, 64, 128, dtype=torch.uint8)
    k = torch.zeros(10, 128, dtype=torch.uint8)
    assert I._use_cuda_flat("auto", q, k) is False  # CPU tensors: never the CUDA scorer
    assert I._use_cuda_flat("torch", q, k) is False
    with pytest.raises(ValueError, match="scorer='cuda' needs CUDA tensors"):
        I._use_cuda_flat("cuda", q, k)


def test_op_takes_reads_the_loaded_schema(monkeypatch):
    """``op_takes`` answers from the loaded extension's schema, so an extension built before the
    row top-k's window (or the scorer's fill flag) keeps the whole-row calls instead of failing:
    here two stand-in libraries with the new and the old schemas."""
    new = torch.library.Library("dsm80_probe_new", "DEF")
    new.define("row_topk_keys(Tensor(a!) out, Tensor keys, int k, Tensor? lo=None, "
               "Tensor? hi=None, int col0=0, int prefix=0, Tensor? best=None) -> ()")
    old = torch.library.Library("dsm80_probe_old", "DEF")
    old.define("row_topk_keys(Tensor(a!) out, Tensor keys, int k) -> ()")
    for ns, want in (("dsm80_probe_new", True), ("dsm80_probe_old", False)):
        ops_indexer.op_takes.cache_clear()
        monkeypatch.setattr(ops_indexer, "_ops", lambda ns=ns: getattr(torch.ops, ns))
        assert ops_indexer.op_takes("row_topk_keys", "best") is want
        assert ops_indexer.op_takes("row_topk_keys", "keys") is True
        assert ops_indexer.op_takes("no_such_op", "keys") is False
    ops_indexer.op_takes.cache_clear()
