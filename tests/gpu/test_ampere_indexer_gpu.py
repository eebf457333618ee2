"""DeepSeek-V4.1's two-level (candidate) selection in the SM80 indexer on a GPU: the same
exact-arithmetic checks as tests/test_ampere_indexer.py, here through the fused Triton
scorer (``indexer_triton``, SM80 code) that CUDA tensors take, against the float64 oracle."""
from __future__ import annotations

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

_ROOT = pathlib.Path(__file__).resolve().parents[2]
for _p in (_ROOT / "overlay", _ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import indexer_cases as IC  # noqa: E402


@pytest.mark.parametrize("row_chunk", [256, 4])
def test_prefill_candidate_write_matches_oracle(row_chunk):
    IC.check_prefill_candidate_write("cuda", row_chunk)


@pytest.mark.parametrize("row_chunk", [256, 4])
def test_prefill_candidate_mask_matches_oracle(row_chunk):
    IC.check_prefill_candidate_mask("cuda", row_chunk)


@pytest.mark.parametrize("write", [True, False])
def test_decode_candidates_match_oracle(write):
    IC.check_decode_candidates("cuda", write)
