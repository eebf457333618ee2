"""The indexer's temporary GPU memory is bounded by its tile budgets, not by the table width.

vLLM sizes the KV cache from a profiling forward pass; memory an op takes beyond what that pass
took comes out of the cache or ends in an out-of-memory error. ``decode_topk`` sees a block
table as wide as max_model_len (262,144 compressed columns at 1M tokens) with every decode, and
``prefill_topk`` a workspace as long as the chunk's contexts. Their temporaries must stay within
the key-buffer budget (``decode_tile_budget(rows)`` / ``tile_budget``) plus per-row state that
does not grow with the columns (the running best, k keys a row), and, for DeepSeek-V4.1's
candidate step, one key per (row, candidate block). A score or key buffer as wide as the table
([rows, 262,144] int64: 537 MB at 256 rows) fails these bounds by far.

Each peak must also lie within ``deepinfer_sm80.ampere.indexer_memory``'s bound for the call,
which the vLLM adapter allocates in the profiling pass so that vLLM's KV-cache budget counts it.

Measured with ``torch.cuda.max_memory_allocated`` around a second call (the first loads the
extension and compiles); inputs and outputs are allocated before the measurement."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

from deepinfer_sm80.ampere import indexer as I  # noqa: E402
from deepinfer_sm80.ampere import indexer_memory as IM  # noqa: E402

import indexer_cases as IC  # noqa: E402

DEV = "cuda"
D, H, BS, K = 128, 64, 64, 512
WIDE_PAGES = 4096  # 262,144 columns: max_model_len 1,048,576 at compress ratio 4
SLACK = 1 << 20  # small per-call tensors (row lengths, row -> request map, int32 copies)
CBS, CAND_K = 8, 2048  # DeepSeek-V4.1's candidate blocks: 8 compressed positions, 2048 a row


@pytest.fixture(autouse=True)
def _built(ext):
    return ext


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def _peak(fn):
    """Bytes allocated above the baseline during ``fn()`` (run twice; the second measured)."""
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


@pytest.mark.parametrize("candidates", [None, "write", "mask", "mask-torch"])
@pytest.mark.parametrize("B,NN", [(1, 1), (64, 1), (256, 1), (64, 6), (384, 1), (1536, 1)])
def test_decode_topk_temporaries_within_the_tile_budget(rng, B, NN, candidates):
    """``mask-torch``: 256-position candidate blocks, which the 43,648-column tiles of 384 rows
    do not hold whole: the torch form masks the tile (in place, one bool tile more).
    ``write`` at 384 and 1,536 rows: the block keys (256 KB a row) exceed
    ``CANDIDATE_DECODE_BUDGET``, so the decode runs in chunks of 256 requests and its peak is
    one chunk's (unchunked, 1,536 rows took 402 MB of keys alone)."""
    rows, cbs = B * NN, (256 if candidates == "mask-torch" else CBS)
    total = WIDE_PAGES * BS
    pages = IC.random_indexer_pages(48, BS, D, rng, nan=False).to(DEV)
    bt = torch.randint(0, 48, (B, WIDE_PAGES), generator=rng, dtype=torch.int32).to(DEV)
    ctx = torch.randint(NN, 2049, (B,), generator=rng)
    hi = (ctx.view(B, 1) - torch.arange(NN).flip(0).view(1, NN)).to(torch.int32).to(DEV)
    q = IC.no_nan_codes(torch.randint(0, 256, (B, NN, H, D), generator=rng, dtype=torch.uint8)).to(DEV)
    w = torch.randn(rows, H, generator=rng).to(DEV)
    out = torch.full((rows, K), -7, dtype=torch.int32, device=DEV)
    blocks = torch.randint(0, max(1, 2048 // cbs), (rows, CAND_K), generator=rng, dtype=torch.int32)
    blocks[:, 0] = 0  # every row's first column is listed: every row selects something
    blocks = blocks.to(DEV)

    def call():
        step = None if candidates is None else I.CandidateStep(blocks, cbs, write=candidates == "write")
        if candidates == "mask-torch":
            tile = I.decode_tile_cols(rows, BS, I.decode_tile_budget(rows))
            assert step.kernels_fit(q, tile, total) == (tile % cbs == 0)
        I.decode_topk(q, w, pages, hi, bt, BS, K, out, scorer="cuda", candidates=step)

    peak = _peak(call)
    # the candidate source runs in chunks of requests where its keys exceed the budget
    chunk = (min(B, I.candidate_decode_requests(B, NN, total, cbs)) * NN
             if candidates == "write" else rows)
    bound = I.decode_tile_budget(chunk) + 2 * chunk * K * 8 + SLACK
    if candidates == "write":  # one key per (row, candidate block) and the visible block counts
        bound += chunk * (-(-total // cbs)) * 8 + chunk * 4
    # "mask": the candidate kernels mask the key tile in place (nothing more); the torch form
    # adds its keep mask [rows, blocks + 1] and one bool tile
    elif candidates == "mask-torch":
        bound += rows * (total // cbs + 1) + I.decode_tile_budget(rows) // 8
    assert peak <= bound, f"{peak} bytes above the inputs, bound {bound}"
    # what the vLLM adapter's profile run reserves for such a step (indexer_memory)
    cand = {} if candidates is None else dict(candidate_k=CAND_K, candidate_block_size=cbs,
                                              candidate_write=candidates == "write")
    scratch = IM.decode_scratch_bytes(rows, H, total, BS, K, sm_count=_sms(), next_n=NN, **cand)
    assert peak <= scratch + SLACK, f"{peak} bytes above the inputs, profile bound {scratch}"
    if rows * total * 8 > 4 * bound:  # (B = 1: the whole table is one tile within the budget)
        assert peak < rows * total * 8 // 2  # far from a table-wide key buffer
    got = out.cpu()
    assert (got[:, 0] >= 0).all()


@pytest.mark.parametrize("candidates", [None, "write"])
@pytest.mark.parametrize("row_chunk,tile_budget", [(256, I.DEFAULT_TILE_BUDGET), (128, 1 << 22)])
def test_prefill_topk_temporaries_within_the_tile_budget(rng, row_chunk, tile_budget, candidates):
    T, Nk, cbs = 2048, 65536, CBS
    k = IC.no_nan_codes(torch.randint(0, 256, (Nk, D), generator=rng, dtype=torch.uint8)).to(DEV)
    ks_ = (torch.rand(Nk, generator=rng) + 0.25).to(DEV)
    q = IC.no_nan_codes(torch.randint(0, 256, (T, H, D), generator=rng, dtype=torch.uint8)).to(DEV)
    w = torch.randn(T, H, generator=rng).to(DEV)
    t = torch.arange(T, device=DEV)
    lo = torch.zeros(T, dtype=torch.int32, device=DEV)
    hi = (Nk - T + t + 1).to(torch.int32)  # one request: the chunk's last T rows of Nk
    out = torch.full((T, K), -7, dtype=torch.int32, device=DEV)
    blocks = torch.full((T, CAND_K), -7, dtype=torch.int32, device=DEV)

    def call():
        step = None if candidates is None else I.CandidateStep(blocks, cbs, write=True)
        I.prefill_topk(q, w, k, ks_, lo, hi, K, out, scorer="cuda", row_chunk=row_chunk,
                       tile_budget=tile_budget, candidates=step)

    peak = _peak(call)
    bound = tile_budget + 2 * row_chunk * K * 8 + T * 8 * 2 + SLACK
    if candidates == "write":
        bound += row_chunk * (-(-Nk // cbs)) * 8 + row_chunk * 4
    assert peak <= bound, f"{peak} bytes above the inputs, bound {bound}"
    cand = {} if candidates is None else dict(candidate_k=CAND_K, candidate_block_size=cbs,
                                              candidate_write=True)
    scratch = IM.prefill_scratch_bytes(T, H, Nk, K, sm_count=_sms(), row_chunk=row_chunk,
                                       tile_budget=tile_budget, **cand)
    assert peak <= scratch + SLACK, f"{peak} bytes above the inputs, profile bound {scratch}"
    assert (out.cpu()[:, 0] >= 0).all()
