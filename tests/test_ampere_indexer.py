"""CPU checks of the SM80 indexer (scoring + deterministic top-k)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "overlay"))
from deepinfer_sm80.ampere import indexer as I  # noqa: E402

from indexer_cases import (check_decode_candidates, check_prefill_candidate_mask,  # noqa: E402
                           check_prefill_candidate_write, decode_candidate_chunks, decode_case,
                           dyadic_fp8, dyadic_weights, k_scales, logits64)


def test_order_keys_total_order_and_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, -0.0, 0.0, -5.0, float("nan"), 3.0]])
    cols = torch.arange(8).unsqueeze(0)
    valid = torch.ones_like(logits, dtype=torch.bool)
    valid[0, 7] = False
    keys = I.order_keys(logits, cols, valid)
    best = I.merge_topk(None, keys, 5)
    # 3.0 at 1 and 2 (lower first), then 1.0, then +0/-0 tie -> column 3 first
    assert I.keys_to_indices(best).tolist() == [[1, 2, 0, 3, 4]]
    # fewer valid than k -> -1 padding
    out = I.keys_to_indices(I.merge_topk(None, keys[:, :2], 4))
    assert out.tolist() == [[1, 0, -1, -1]]


@pytest.mark.parametrize("row_chunk,budget", [(256, 1 << 25), (3, 4096)])
def test_prefill_topk_matches_oracle_sets(row_chunk, budget):
    g = torch.Generator().manual_seed(0)
    T, H, D, N, K = 37, 8, 128, 300, 64
    qc, q64 = dyadic_fp8((T, H, D), g)
    kc, k64 = dyadic_fp8((N, D), g)
    w64 = dyadic_weights((T, H), g)
    ks64 = k_scales(N, g)
    # two requests: rows 0..19 see [0, 160) causally, rows 20.. see [160, 300)
    ks = torch.tensor([0] * 20 + [160] * 17)
    ke = torch.tensor([min(160, 100 + 3 * t) for t in range(20)] + [160 + 5 + 8 * t for t in range(17)])
    out = torch.full((T, K), -7, dtype=torch.int32)
    I.prefill_topk(qc, w64.float(), kc, ks64.float(), ks, ke, K, out, row_chunk=row_chunk, tile_budget=budget)
    L = logits64(q64, w64, k64, ks64)
    cols = torch.arange(N).unsqueeze(0)
    valid = (cols >= ks.unsqueeze(1)) & (cols < ke.unsqueeze(1))
    want = I.reference_topk_sets(L, valid, K)
    ties = 0
    for t in range(T):
        got = out[t].tolist()
        n = int(valid[t].sum())
        assert got[min(n, K):] == [-1] * (K - min(n, K))
        assert {j + int(ks[t]) for j in got if j >= 0} == want[t], t
        vals = L[t][valid[t]]
        ties += int(vals.numel() - vals.unique().numel())
    assert ties > 0  # the data really exercises tie-breaking


@pytest.mark.parametrize("T,row_chunk", [(1, 256), (255, 256), (256, 256), (257, 256), (1000, 7)])
def test_chunk_column_spans_are_each_chunks_min_and_max(T, row_chunk):
    """prefill_topk's column span per row chunk, read back in one copy: (min ks, max ke, widest
    row) of each chunk, the last (partial) chunk included; int32 or int64 bounds."""
    g = torch.Generator().manual_seed(T)
    ks = torch.randint(0, 1000, (T,), generator=g)
    ke = ks + torch.randint(-3, 50, (T,), generator=g)
    want = [(int(ks[r:r + row_chunk].min()), int(ke[r:r + row_chunk].max()),
             int((ke - ks)[r:r + row_chunk].clamp(min=0).max())) for r in range(0, T, row_chunk)]
    assert I.chunk_column_spans(ks.to(torch.int32), ke, row_chunk) == want


def test_decode_topk_reads_pages_at_vllms_padded_stride():
    """vLLM pads each DeepSeek-V4 cache page to its spec's alignment (576 B:
    ``_apply_alignment_padding``, v1/kv_cache_interface.py), so an indexer page of 64 x 132 =
    8,448 bytes sits at a stride of 8,640. The same pages at that stride (junk in the padding)
    select what the contiguous pages select."""
    g = torch.Generator().manual_seed(3)
    B, H, D, bs, K, nb = 2, 8, 128, 64, 32, 6
    codes, _ = dyadic_fp8((nb, bs, D), g)
    sc = k_scales(nb * bs, g).view(nb, bs)
    pages = torch.zeros(nb, bs * 132, dtype=torch.uint8)
    pages[:, : bs * D] = codes.view(nb, -1)
    pages[:, bs * D:] = sc.float().contiguous().view(torch.uint8).view(nb, -1)
    padded = torch.randint(0, 256, (nb, 8640), generator=g, dtype=torch.uint8)
    padded[:, : bs * 132] = pages
    strided = padded[:, : bs * 132].view(nb, bs, 132)
    assert strided.stride(0) == 8640
    bt = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    qc, _ = dyadic_fp8((B, 1, H, D), g)
    w = dyadic_weights((B, H), g).float()
    ctx = torch.tensor([150, 190])
    outs = []
    for kv in (pages.view(nb, bs, 132), strided):
        out = torch.full((B, K), -7, dtype=torch.int32)
        I.decode_topk(qc, w, kv, ctx, bt, bs, K, out, pages_per_tile=2)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and (outs[0] >= 0).sum() == B * K


@pytest.mark.parametrize("next_n", [1, 6])
def test_decode_topk_paged_matches_oracle_sets(next_n):
    g = torch.Generator().manual_seed(1)
    B, H, D, bs, K = 3, 8, 128, 64, 64
    ctx_base = [70, 200, 5]
    maxb = 5
    nb = 16
    codes, vals = dyadic_fp8((nb, bs, D), g)
    sc = k_scales(nb * bs, g).view(nb, bs)
    pages = torch.zeros(nb, bs * 132, dtype=torch.uint8)
    pages[:, : bs * D] = codes.view(nb, -1)
    pages[:, bs * D:] = sc.float().contiguous().view(torch.uint8).view(nb, -1)
    perm = torch.randperm(nb, generator=g)
    bt = perm[: B * maxb].view(B, maxb).int()
    bt[2, 1:] = -1  # unused table entries
    qc, q64 = dyadic_fp8((B, next_n, H, D), g)
    w64 = dyadic_weights((B * next_n, H), g)
    ctx = torch.tensor([[c + i for i in range(next_n)] for c in ctx_base])
    out = torch.full((B * next_n, K), -7, dtype=torch.int32)
    I.decode_topk(qc, w64.float(), pages, ctx, bt, bs, K, out, pages_per_tile=2)
    for b in range(B):
        kv64 = torch.cat([vals[int(p)] if p >= 0 else torch.zeros(bs, D, dtype=torch.float64)
                          for p in bt[b]])
        ks64 = torch.cat([sc[int(p)] if p >= 0 else torch.ones(bs, dtype=torch.float64) for p in bt[b]])
        L = logits64(q64[b], w64[b * next_n:(b + 1) * next_n], kv64, ks64)
        valid = torch.arange(kv64.shape[0]).unsqueeze(0) < ctx[b].unsqueeze(1)
        want = I.reference_topk_sets(L, valid, K)
        for i in range(next_n):
            got = out[b * next_n + i].tolist()
            assert {j for j in got if j >= 0} == want[i]
            n = int(valid[i].sum())
            assert sum(j >= 0 for j in got) == min(n, K)


def test_row_lens_forms():
    """decode_topk's per-row visible lengths: [B] or [B, next_n], any integer dtype; a
    [B, m] with m != next_n is one length L per request (its last column), and row j of the
    request sees max(L - next_n + 1 + j, 0), as vLLM's decode top-k derives per-row ends from
    (B, 1) lengths (SparseIndexerTopk._row_ends). The common forms (int32 [B, next_n], int32 [B]
    with next_n 1) are used as they are, without a copy."""
    c = torch.tensor([[5, 6], [7, 8], [9, 10]], dtype=torch.int32)
    assert I._row_lens(c, 3, 2).tolist() == [5, 6, 7, 8, 9, 10]
    assert I._row_lens(c, 3, 2).data_ptr() == c.data_ptr()
    assert I._row_lens(c.long(), 3, 2).dtype == torch.int32
    assert I._row_lens(c, 3, 4).tolist() == [3, 4, 5, 6, 5, 6, 7, 8, 7, 8, 9, 10]
    v = torch.tensor([3, 1], dtype=torch.int64)
    assert I._row_lens(v, 2, 3).tolist() == [1, 2, 3, 0, 0, 1]  # a padding request: 0
    v32 = v.int()
    assert I._row_lens(v32, 2, 1).data_ptr() == v32.data_ptr()


def test_decode_rows_per_req():
    """MTP rows (2..8 per request) share each K tile; one row per request takes the rows
    kernel once rows x columns reach the threshold per SM, the warp kernel below and past 8."""
    t = I.ROWS_KERNEL_MIN_WORK_PER_SM
    assert I.decode_rows_per_req(2, 64, 10, 132) == 2
    assert I.decode_rows_per_req(8, 8, 64, 108) == 8
    assert I.decode_rows_per_req(9, 9 * 64, 1 << 20, 108) == 0
    assert I.decode_rows_per_req(1, 1, t * 108, 108) == 1
    assert I.decode_rows_per_req(1, 1, t * 108 - 1, 108) == 0
    assert I.decode_rows_per_req(1, 64, 8192, 132) == (64 * 8192 >= t * 132)
    assert I.decode_rows_per_req(0, 64, 8192, 132) == 0


def test_decode_tile_budget():
    """The fused decode's key buffer: 32 MB up to 64 rows (tiles of 65,536+ columns), then
    65,536 columns per row up to 128 MB, so a max_model_len-wide table (262,144 columns at 1M
    tokens) is cut into at most 4 tiles up to 256 rows."""
    mb = 1 << 20
    assert I.decode_tile_budget(1) == I.decode_tile_budget(64) == 32 * mb
    assert I.decode_tile_budget(96) == 48 * mb and I.decode_tile_budget(256) == 128 * mb
    assert I.decode_tile_budget(384) == I.decode_tile_budget(1 << 14) == 128 * mb
    for rows in (1, 64, 96, 256):
        assert I.decode_tile_budget(rows) // (rows * 8) >= 1 << 16


def test_decode_topk_empty_block_table_selects_nothing():
    out = torch.full((4, 8), 5, dtype=torch.int32)
    q = torch.zeros(2, 2, 4, 128, dtype=torch.uint8)
    I.decode_topk(q, torch.ones(4, 4), torch.zeros(1, 64 * 132, dtype=torch.uint8),
                  torch.tensor([3, 4]), torch.zeros(2, 0, dtype=torch.int32), 64, 6, out)
    assert (out[:, :6] == -1).all() and (out[:, 6:] == 5).all()


# ------------------------------------------ DeepSeek-V4.1 two-level (candidate) selection
# (checks in indexer_cases.py, shared with tests/gpu/test_ampere_indexer_gpu.py)


@pytest.mark.parametrize("row_chunk", [256, 4])
def test_prefill_candidate_write_matches_oracle(row_chunk):
    check_prefill_candidate_write("cpu", row_chunk)


@pytest.mark.parametrize("row_chunk", [256, 4])
def test_prefill_candidate_mask_matches_oracle(row_chunk):
    check_prefill_candidate_mask("cpu", row_chunk)


@pytest.mark.parametrize("write", [True, False])
def test_decode_candidates_match_oracle(write):
    check_decode_candidates("cpu", write)


# decode_case: 3 requests x 2 rows over 4 pages of 64 positions, candidate blocks of 16, so
# 2 x 16 x 8 = 256 bytes of block keys a request
@pytest.mark.parametrize("budget,chunks", [(256, [(0, 2), (2, 2), (4, 2)]), (600, [(0, 4), (4, 2)]),
                                           (768, [(0, 6)]), (1, [(0, 2), (2, 2), (4, 2)])])
def test_decode_candidate_source_in_request_chunks_matches_oracle(monkeypatch, budget, chunks):
    """Where the source layer's block keys exceed the budget, decode_topk runs chunks of
    whole requests (at least one), each with its own step over its rows of the candidate
    buffer: the same blocks and top-k as the oracle's. A spy sees the chunks' steps begin."""
    assert decode_candidate_chunks(decode_case(torch.Generator().manual_seed(7), "cpu"),
                                   budget) == chunks
    seen = []
    orig = I.CandidateStep.begin

    def spy(self, r0, r1, *a, **kw):
        seen.append((self.blocks.data_ptr(), r1 - r0))
        return orig(self, r0, r1, *a, **kw)

    monkeypatch.setattr(I.CandidateStep, "begin", spy)
    check_decode_candidates("cpu", True, candidate_budget=budget)
    base = seen[0][0]
    row_bytes = 4 * 4  # int32 [rows, 4 blocks]
    assert [((p - base) // row_bytes, n) for p, n in seen] == chunks
    seen.clear()  # masking layers keep no block keys: one pass whatever the budget
    check_decode_candidates("cpu", False, candidate_budget=budget)
    assert len(seen) == 1


def test_chunked_source_bound_covers_flattened_rows():
    """The profile bound for a step with 6 rows a request holds a decode of the same rows one
    a request (vLLM flattens DSpark's decode below SM90), whose chunks can hold more rows,
    and each chunk's own bound."""
    from deepinfer_sm80.ampere import indexer_memory as IM

    kw = dict(sm_count=108, candidate_k=2048, candidate_block_size=8, candidate_write=True)
    for rows in (384, 1536, 2046):
        six = IM.decode_scratch_bytes(rows, 64, 262144, 64, 1024, next_n=6, **kw)
        one = IM.decode_scratch_bytes(rows, 64, 262144, 64, 1024, next_n=1, **kw)
        assert six >= one
        per1 = I.candidate_decode_requests(rows, 1, 262144, 8)
        assert six >= IM.decode_scratch_bytes(per1, 64, 262144, 64, 1024, **kw) > 0


def test_candidate_decode_requests():
    # V4.1 at 1M tokens: 262,144 compressed columns in blocks of 8 -> 256 KB a row
    assert I.candidate_decode_requests(1536, 1, 262144, 8) == 256
    assert I.candidate_decode_requests(256, 6, 262144, 8) == 42
    assert I.candidate_decode_requests(100, 1, 262144, 8) == 100  # 25 MB: one pass
    assert I.candidate_decode_requests(4, 8, 1 << 30, 8) == 1  # never below one request
    assert I.candidate_decode_requests(1536, 1, 32768, 8) == 1536  # 128K tokens: 48 MB
    assert I.candidate_decode_requests(10, 1, 64, 8, budget=128) == 2


def test_cuda_merges_pass_the_window_and_best_or_concatenate(monkeypatch):
    """The CUDA merges' operands (``_topk_operands``): with a window and an extension whose
    schema has it, ``keys`` plus lo / hi / col0 and ``best`` as is; without a window, with
    ``$DEEPINFER_INDEXER_WINDOW=0`` or with an older extension, ``cat([best, keys])`` alone.
    (A stand-in records the calls; the kernels are tested in tests/gpu.)"""
    from deepinfer_sm80.ops import indexer as OI

    takes = {"v": True}

    class Ext:
        @staticmethod
        def op_takes(op, arg):
            return takes["v"]

    calls, outs = [], []
    monkeypatch.setattr(I, "_cuda_indexer", lambda: Ext)
    monkeypatch.setattr(OI, "row_topk_keys", lambda keys, k, out=None, **kw: calls.append(
        ("keys", tuple(keys.shape), kw)) or outs.append(out) or keys[:, :k])
    monkeypatch.setattr(OI, "row_topk_indices", lambda keys, k, out=None, **kw: calls.append(
        ("indices", tuple(keys.shape), kw)))
    monkeypatch.delenv("DEEPINFER_INDEXER_WINDOW", raising=False)
    best = torch.zeros(2, 3, dtype=torch.int64)
    keys = torch.ones(2, 5, dtype=torch.int64)
    hi = torch.tensor([1, 2], dtype=torch.int32)
    out = torch.zeros(2, 3, dtype=torch.int32)
    I.merge_topk(best, keys, 3, True, (None, hi, 7))
    I.final_topk_into(out, None, keys, 3, True, (None, hi, 7))
    I.merge_topk(best, keys, 3, True)
    monkeypatch.setenv("DEEPINFER_INDEXER_WINDOW", "0")
    I.final_topk_into(out, best, keys, 3, True, (None, hi, 7))
    monkeypatch.delenv("DEEPINFER_INDEXER_WINDOW")
    takes["v"] = False
    I.merge_topk(best, keys, 3, True, (None, hi, 7))
    assert [(c[0], c[1], sorted(c[2])) for c in calls] == [
        ("keys", (2, 5), ["best", "col0", "hi", "lo"]), ("indices", (2, 5), ["col0", "hi", "lo"]),
        ("keys", (2, 8), []), ("indices", (2, 8), []), ("keys", (2, 8), [])]
    assert calls[0][2]["best"] is best and calls[0][2]["hi"] is hi and calls[0][2]["col0"] == 7
    # the windowed merge runs in place (out is the running best); the concatenating ones do not
    assert outs[0] is best and outs[1] is None and outs[2] is None


def test_scratch_bounds_follow_the_extension_row_topk_split_rule():
    """``indexer_memory`` (what the vLLM adapter reserves in the profile run) counts the row
    top-k's split workspace by csrc/index/row_topk.cu's rule: windows longer than kStageMax
    keys, at most a quarter as many rows as SMs."""
    import re

    from deepinfer_sm80.ampere import indexer_memory as IM

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = open(os.path.join(root, "csrc", "index", "row_topk.cu")).read()
    stage = int(re.search(r"constexpr int kStageMax = (\d+);", src).group(1))
    assert stage == IM.ROW_TOPK_STAGE_MAX
    assert "p.n <= kStageMax || p.rows <= 0 || 4 * p.rows > sm_count" in src
    s = IM.ROW_TOPK_STAGE_MAX
    assert IM.row_topk_split_bytes(27, s + 1, 512, 108) == 27 * 2 * 512 * 8
    assert IM.row_topk_split_bytes(28, s + 1, 512, 108) == 0
    assert IM.row_topk_split_bytes(1, s, 512, 108) == 0
    # a decode of one row over 262,144 positions: one tile, split in 32 chunks
    one = IM.decode_scratch_bytes(1, 64, 262144, 64, 512, sm_count=108)
    assert one >= 262144 * 8 + 32 * 512 * 8


def test_scratch_bounds_cover_the_tile_buffers_and_candidate_keys():
    """The decode bound holds the key tile decode_topk allocates ([rows, min(tile, columns)]
    int64) and the running best; the candidate-source step adds one int64 key per (row,
    block), the torch form (tiles not made of whole blocks) more; prefill holds its shared
    key buffer and one row chunk's state."""
    from deepinfer_sm80.ampere import indexer_memory as IM

    for rows in (1, 64, 256, 1536):
        tile = min(I.decode_tile_cols(rows, 64, I.decode_tile_budget(rows)), 262144)
        base = IM.decode_scratch_bytes(rows, 64, 262144, 64, 512, sm_count=108)
        assert base >= rows * tile * 8 + 2 * rows * 512 * 8
        write = IM.decode_scratch_bytes(rows, 64, 262144, 64, 512, sm_count=108, candidate_k=2048,
                                        candidate_block_size=8, candidate_write=True)
        chunk = min(rows, I.candidate_decode_requests(rows, 1, 262144, 8))  # rows of a chunk
        chunk_base = IM.decode_scratch_bytes(chunk, 64, 262144, 64, 512, sm_count=108)
        assert write - chunk_base >= chunk * 32768 * 8
        assert chunk * 32768 * 8 <= I.CANDIDATE_DECODE_BUDGET
        mask = IM.decode_scratch_bytes(rows, 64, 262144, 64, 512, sm_count=108, candidate_k=2048,
                                       candidate_block_size=8)
        assert mask == base  # the kernels mask the key tile in place
        odd = IM.decode_scratch_bytes(rows, 64, 262144, 64, 512, sm_count=108, candidate_k=2048,
                                      candidate_block_size=96)
        assert odd > base
    pre = IM.prefill_scratch_bytes(8192, 64, 1 << 22, 512, sm_count=108)
    assert pre >= I.DEFAULT_TILE_BUDGET + 2 * 256 * 512 * 8
    assert pre < 2 * I.DEFAULT_TILE_BUDGET  # one key buffer, whatever the workspace length
    cand = IM.prefill_scratch_bytes(8192, 64, 1 << 22, 512, sm_count=108, row_columns=262144,
                                    candidate_k=2048, candidate_block_size=8, candidate_write=True)
    assert cand - pre >= 256 * 32768 * 8
