"""CPU checks of the op wrappers' argument validation (deepinfer_sm80.ops.cache / .index):
bad inputs raise errors that name the argument, good inputs reach the extension op with the
arguments it expects. The CUDA device check is relaxed to accept CPU tensors and the
extension is replaced by a recorder; the kernels themselves are tested in tests/gpu."""

from __future__ import annotations

import pytest
import torch

from deepinfer_sm80.ops import _checks as C
from deepinfer_sm80.ops import cache as ops_cache
from deepinfer_sm80.ops import index as ops_index


class _Recorder:
    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name):
        def op(*args):
            self.calls.append((name, args))
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
