"""DeepSeek-V4.1's candidate step through the extension's kernels (csrc/index/candidate_blocks.cu,
``deepinfer_sm80.ops.indexer.candidate_block_keys`` / ``candidate_mask``, and the row top-k up to
k = 2048), which ``decode_topk`` takes on CUDA: the ops against torch references written from
their semantics (bit-exact, columns past each row's context neither read nor written), and
``decode_topk`` with the kernels against its torch form (``$DEEPINFER_CANDIDATE_KERNEL=0``) on
the same inputs, bit-exact in the indices and the written blocks: block tables as wide as
max_model_len, rows with no context, contexts ending inside a block, several column tiles,
speculative rows of one request, listed blocks that are -1, repeated or past the context; and
``prefill_topk`` likewise (rows starting anywhere in the workspace: blocks spanning tiles). The
float64 oracle checks of the kernel path are in test_ampere_indexer_gpu.py (its cases take the
kernels on a GPU)."""
from __future__ import annotations

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

_ROOT = pathlib.Path(__file__).resolve().parents[2]
for _p in (_ROOT / "overlay", _ROOT / "tests", _ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from deepinfer_sm80.ampere import indexer as I  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402

DEV = "cuda"
POISON = 0x5A5A5A5A5A5A5A5A


@pytest.fixture(autouse=True)
def _built(ext):
    assert OI.candidate_available(), "this tree's build must have the candidate ops"
    return ext


def _tile_keys(g, rows, n, col0, hi, neg_inf_frac=0.0):
    """Keys [rows, n] of columns col0.. as the scorer leaves them with fill=False: valid keys
    (some with score -inf) in [0, hi), POISON past it (never to be read)."""
    s = torch.randn(rows, n, generator=g)
    s[torch.rand(rows, n, generator=g) < neg_inf_frac] = float("-inf")
    cols = col0 + torch.arange(n).unsqueeze(0)
    keys = I.order_keys(s, cols, torch.ones(rows, n, dtype=torch.bool))
    keys[cols >= hi.view(-1, 1)] = POISON
    return keys


def _ref_block_keys(keys, hi, col0, bs):
    """{(r, b): key} for every visible block of the tile, from the semantics."""
    want = {}
    low = (1 << 32) - 1
    for r in range(keys.shape[0]):
        h = int(hi[r])
        end = min(col0 + keys.shape[1], h)
        for b in range(col0 // bs, -(-end // bs) if end > col0 else col0 // bs):
            c0, c1 = b * bs, min(b * bs + bs, h)
            m = max(int(x) for x in keys[r, c0 - col0:c1 - col0])
            if c1 == h:
                key = (0x7F800000 << 32) | (low - b)
            elif I.key_scores(torch.tensor([m])).item() == float("-inf"):
                key = I.INT64_MIN
            else:
                key = ((m >> 32) << 32) | (low - b)
            want[(r, b)] = key
    return want


@pytest.mark.parametrize("bs", [8, 1, 16])
def test_block_keys_match_the_semantics(rng, bs):
    rows, col0, n = 6, 512, 1024
    hi = torch.tensor([0, 300, 512, 517, 1100, 1536], dtype=torch.int32)
    keys = _tile_keys(rng, rows, n, col0, hi, neg_inf_frac=0.02)
    keys[4, 16:40] = I.order_keys(torch.full((1, 24), float("-inf")),
                                  col0 + 16 + torch.arange(24).unsqueeze(0),
                                  torch.ones(1, 24, dtype=torch.bool))  # whole blocks at -inf
    nb = (col0 + n) // bs
    best = torch.full((rows, nb + 3), POISON, dtype=torch.int64, device=DEV)
    vis = torch.full((rows + 1,), -7, dtype=torch.int32, device=DEV)
    OI.candidate_block_keys(keys.to(DEV), hi=hi.to(DEV), col0=col0, n_cols=n, block_size=bs,
                            best=best, visible_blocks=vis)
    got = best.cpu()
    assert vis.cpu().tolist() == [-(-int(h) // bs) for h in hi] + [-7]
    want = _ref_block_keys(keys, hi, col0, bs)
    assert want  # some visible blocks
    for r in range(rows):
        for b in range(nb + 3):
            exp = want.get((r, b), POISON)  # blocks outside the tile or the context: untouched
            assert int(got[r, b]) == exp, (r, b)


@pytest.mark.parametrize("bs", [8, 3])
def test_mask_matches_the_semantics(rng, bs):
    rows, col0, n, K = 5, 4095 // bs * bs, 9000 // bs * bs, 40
    hi = torch.tensor([0, col0 + 5, col0 + 4100, col0 + n, 1 << 30], dtype=torch.int32)
    keys = _tile_keys(rng, rows, n, col0, hi)
    blocks = torch.randint(col0 // bs - 20, (col0 + n) // bs + 20, (rows, K), generator=rng,
                           dtype=torch.int32)
    blocks[:, :5] = -1
    blocks[:, 5:10] = blocks[:, 10:15]  # repeated
    blocks[3, 15:] = torch.arange(col0 // bs, col0 // bs + K - 15, dtype=torch.int32)
    got = keys.to(DEV)
    OI.candidate_mask(got, hi=hi.to(DEV), col0=col0, n_cols=n, block_size=bs,
                      blocks=blocks.to(DEV))
    cols = col0 + torch.arange(n).unsqueeze(0)
    listed = torch.zeros(rows, (col0 + n) // bs + 40, dtype=torch.bool)
    for r in range(rows):
        for b in blocks[r].tolist():
            if 0 <= b < listed.shape[1]:
                listed[r, b] = True
    keep = listed.gather(1, (cols // bs).expand(rows, -1))
    visible = cols < hi.view(-1, 1).to(torch.int64)
    want = torch.where(visible & ~keep, torch.full_like(keys, I.INT64_MIN), keys)
    assert torch.equal(got.cpu(), want)  # past the context: POISON left as it was


def _ref_prefill_blocks(keys, lo, hi, col0, bs, nb):
    """best [rows, nb] as the merge over a prefill's tiles leaves it, from the semantics: the
    blocks of local positions c - lo, INT64_MIN where no visible column is in ``keys``."""
    low = (1 << 32) - 1
    rows, n = keys.shape
    want = torch.full((rows, nb), I.INT64_MIN, dtype=torch.int64)
    for r in range(rows):
        hl = int(hi[r]) - int(lo[r])
        for c in range(max(col0, int(lo[r])), min(col0 + n, int(hi[r]))):
            b = (c - int(lo[r])) // bs
            m = int(keys[r, c - col0])
            if b == (hl - 1) // bs:
                key = (0x7F800000 << 32) | (low - b)
            elif I.key_scores(torch.tensor([m])).item() == float("-inf"):
                key = I.INT64_MIN
            else:
                key = ((m >> 32) << 32) | (low - b)
            want[r, b] = max(int(want[r, b]), key)
    return want


@pytest.mark.parametrize("bs", [8, 5])
def test_prefill_block_keys_merge_over_tiles(rng, bs):
    """Rows seeing [lo, hi) of a flat workspace; blocks start at each row's lo, so they span the
    column tiles; each tile's keys merge by max into best (which starts at INT64_MIN)."""
    lo = torch.tensor([0, 3, 100, 250, 7, 40], dtype=torch.int32)
    hi = torch.tensor([0, 200, 101, 700, 650, 39], dtype=torch.int32)
    n_all, tile = 704, 96
    keys_all = _tile_keys(rng, 6, n_all, 0, hi, neg_inf_frac=0.05)
    keys_all[torch.arange(n_all).unsqueeze(0) < lo.view(-1, 1)] = POISON
    nb = -(-int((hi - lo).clamp(min=0).max()) // bs)
    best = torch.full((6, nb), I.INT64_MIN, dtype=torch.int64, device=DEV)
    vis = torch.full((6,), -7, dtype=torch.int32, device=DEV)
    for t0 in range(0, n_all, tile):
        t1 = min(n_all, t0 + tile)
        OI.candidate_block_keys(keys_all[:, t0:t1].contiguous().to(DEV), hi=hi.to(DEV), lo=lo.to(DEV),
                                col0=t0, n_cols=t1 - t0, block_size=bs, best=best, merge=True,
                                visible_blocks=vis)
    assert torch.equal(best.cpu(), _ref_prefill_blocks(keys_all, lo, hi, 0, bs, nb))
    assert vis.cpu().tolist() == [max(0, -(-(int(h) - int(l)) // bs)) for l, h in zip(lo, hi)]


def test_prefill_mask_with_lo(rng):
    bs, col0, n = 8, 96, 300
    lo = torch.tensor([0, 100, 97, 390, 5], dtype=torch.int32)
    hi = torch.tensor([400, 390, 250, 500, 5], dtype=torch.int32)
    keys = _tile_keys(rng, 5, n, col0, hi)
    blocks = torch.randint(-1, 50, (5, 12), generator=rng, dtype=torch.int32)
    got = keys.to(DEV)
    OI.candidate_mask(got, hi=hi.to(DEV), lo=lo.to(DEV), col0=col0, n_cols=n, block_size=bs,
                      blocks=blocks.to(DEV))
    cols = col0 + torch.arange(n).unsqueeze(0)
    local = cols - lo.view(-1, 1)
    listed = torch.zeros(5, 64, dtype=torch.bool)
    for r in range(5):
        for b in blocks[r].tolist():
            if b >= 0:
                listed[r, b] = True
    keep = listed.gather(1, (local.clamp(min=0) // bs).clamp(max=63))
    visible = (cols >= lo.view(-1, 1)) & (cols < hi.view(-1, 1))
    want = torch.where(visible & ~keep, torch.full_like(keys, I.INT64_MIN), keys)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("row_chunk,budget", [(256, 1 << 25), (64, 1 << 15)])
def test_prefill_topk_kernels_equal_the_torch_form(rng, monkeypatch, row_chunk, budget):
    """prefill_topk as the candidate source and as a masking layer, kernels against the torch
    form: the last T tokens of a request (row t sees [0, (4 Nk - T + t + 1) // 4)), plus rows of
    other requests starting later in the workspace, several row chunks and column tiles."""
    from bench_indexer_prefill import make_k, make_q

    g = torch.Generator(device=DEV).manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    T, nk, H, topk, cbs, K = 300, 3000, 32, 512, 8, 96
    k, ks = make_k(nk, g)
    q, w = make_q(T, H, g)
    t = torch.arange(T, device=DEV)
    ke = ((4 * 2000 - T + t + 1) // 4).to(torch.int32)
    kss = torch.zeros(T, dtype=torch.int32, device=DEV)
    kss[200:] = 2000  # a second request's rows: columns [2000, 2000 + ...)
    ke[200:] = 2000 + (t[200:] - 199) * 9
    ke[250] = 2000  # a row seeing nothing
    results = {}
    for kernel in ("1", "0"):
        monkeypatch.setenv("DEEPINFER_CANDIDATE_KERNEL", kernel)
        blocks = torch.full((T, K), -7, dtype=torch.int32, device=DEV)
        out_w = torch.full((T, topk), -7, dtype=torch.int32, device=DEV)
        I.prefill_topk(q, w, k, ks, kss, ke, topk, out_w, scorer="cuda", row_chunk=row_chunk,
                       tile_budget=budget, candidates=I.CandidateStep(blocks, cbs, write=True))
        listed = blocks.clone()
        listed[:, 1::5] = -1
        out_m = torch.full((T, topk), -7, dtype=torch.int32, device=DEV)
        I.prefill_topk(q, w, k, ks, kss, ke, topk, out_m, scorer="cuda", row_chunk=row_chunk,
                       tile_budget=budget, candidates=I.CandidateStep(listed, cbs, write=False))
        results[kernel] = (out_w.cpu(), blocks.cpu(), out_m.cpu())
    for a, b in zip(results["1"], results["0"]):
        assert torch.equal(a, b)
    out_w, blocks, out_m = results["1"]
    assert bool(((out_m >= 0).sum(1) < (out_w >= 0).sum(1)).any())  # the mask removed positions
    assert blocks[250].eq(-1).all() and blocks[0, 0] == (int(ke[0]) - 1) // cbs


def test_bad_arguments_raise():
    keys = torch.zeros(2, 64, dtype=torch.int64, device=DEV)
    hi = torch.zeros(2, dtype=torch.int32, device=DEV)
    best = torch.zeros(2, 8, dtype=torch.int64, device=DEV)
    blocks = torch.zeros(2, 4, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="must hold whole blocks"):
        OI.candidate_block_keys(keys, hi=hi, col0=4, n_cols=60, block_size=8, best=best)
    with pytest.raises(ValueError, match="must hold whole blocks"):
        OI.candidate_block_keys(keys, hi=hi, col0=0, n_cols=64, block_size=8, best=best, lo=hi)
    with pytest.raises(ValueError, match="best must be"):
        OI.candidate_block_keys(keys, hi=hi, col0=0, n_cols=64, block_size=4, best=best)
    with pytest.raises(TypeError, match="blocks must be torch.int32"):
        OI.candidate_mask(keys, hi=hi, col0=0, n_cols=64, block_size=8, blocks=blocks.long())
    with pytest.raises(ValueError, match="hi must be"):
        OI.candidate_mask(keys, hi=hi[:1], col0=0, n_cols=64, block_size=8, blocks=blocks)
    with pytest.raises(ValueError, match="n_cols <= keys"):
        OI.candidate_mask(keys, hi=hi, col0=0, n_cols=72, block_size=8, blocks=blocks)
    # the ops' own checks (a caller that skips the wrapper)
    with pytest.raises(RuntimeError, match="must hold whole blocks"):
        torch.ops.deepinfer_sm80.candidate_block_keys(best, keys, hi, 4, 60, 8)
    with pytest.raises(RuntimeError, match="lo must be"):
        torch.ops.deepinfer_sm80.candidate_mask(keys, blocks, hi, 0, 64, 8, hi[:1])
    with pytest.raises(RuntimeError, match="best must be int64"):
        torch.ops.deepinfer_sm80.candidate_block_keys(best[:, :4], keys, hi, 0, 64, 8)


def _decode_set(g, B, NN, ctx, width, H=32):
    """A decode batch as bench_indexer_keys.make_set builds it, with per-row contexts ``ctx``
    [B, NN] and a block table ``width`` positions wide (page 0 past each context)."""
    from bench_indexer_keys import BS, make_set

    s = make_set(B, NN, int(ctx.max()), H, g)
    bt = torch.zeros(B, width // BS, dtype=torch.int32, device=DEV)
    bt[:, : s["bt"].shape[1]] = s["bt"]
    s["bt"] = bt
    s["lens"] = ctx.to(torch.int32).to(DEV)
    return s, BS


def _run(monkeypatch, s, B, NN, H, bs_page, K, blocks, cbs, write, kernel, **kw):
    monkeypatch.setenv("DEEPINFER_CANDIDATE_KERNEL", kernel)
    out = torch.full((B * NN + 1, K + 2), -7, dtype=torch.int32, device=DEV)
    I.decode_topk(s["q"].view(B, NN, H, -1), s["w"], s["pages"], s["lens"], s["bt"], bs_page, K,
                  out, scorer="cuda", candidates=I.CandidateStep(blocks, cbs, write=write), **kw)
    torch.cuda.synchronize()
    return out.cpu()


# (requests, rows per request, contexts, block-table width, tile budget or None, candidate
# block size, candidate blocks per row)
DECODE_CASES = [
    (4, 1, [2048, 0, 1, 700], 262144, None, 8, 2048),     # vLLM's width at max_model_len 1M
    (1, 6, [4090, 4091, 4092, 4093, 4094, 4095], 262144, None, 8, 2048),  # DSpark rows
    (3, 1, [9000, 5, 8192], 16384, 1 << 17, 8, 64),       # several column tiles, few blocks
    (2, 2, [300, 301, 64, 63], 1024, None, 16, 8),        # the oracle tests' shapes
]


@pytest.mark.parametrize("B,NN,ctx,width,budget,cbs,K", DECODE_CASES)
def test_decode_topk_kernels_equal_the_torch_form(rng, monkeypatch, B, NN, ctx, width, budget, cbs, K):
    H, topk = 32, 512
    g = torch.Generator(device=DEV).manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    ctx_t = torch.tensor(ctx).view(B, NN)
    s, bs_page = _decode_set(g, B, NN, ctx_t, width, H)
    kw = {"tile_budget": budget} if budget else {}
    rows = B * NN
    results = {}
    for kernel in ("1", "0"):
        blocks = torch.full((rows, K), -7, dtype=torch.int32, device=DEV)
        out_w = _run(monkeypatch, s, B, NN, H, bs_page, topk, blocks, cbs, True, kernel, **kw)
        listed = blocks.clone()
        listed[:, 1::7] = -1                             # holes
        listed[:, 2::7] = listed[:, 3::7]                # repeats
        listed[:, 4::11] = (ctx_t.view(-1, 1).to(DEV) // cbs + 3).to(torch.int32)  # past the context
        out_m = _run(monkeypatch, s, B, NN, H, bs_page, topk, listed, cbs, False, kernel, **kw)
        results[kernel] = (out_w, blocks.cpu(), out_m)
    for a, b in zip(results["1"], results["0"]):
        assert torch.equal(a, b)
    out_w, blocks, out_m = results["1"]
    assert bool((out_w[rows:] == -7).all()) and bool((out_w[:, topk:] == -7).all())
    for r in range(rows):  # what the write must hold, whatever the form
        c = int(ctx_t.view(-1)[r])
        nvis = -(-c // cbs)
        assert blocks[r, : min(nvis, K)].ge(0).all() and blocks[r, min(nvis, K):].eq(-1).all()
        if c:
            assert int(blocks[r, 0]) == (c - 1) // cbs  # the newest block pinned first
    masked = (out_m[:rows] >= 0).sum(1) < (out_w[:rows] >= 0).sum(1)
    assert bool(masked.any()) or K * cbs >= max(ctx)  # the mask removed positions somewhere


@pytest.mark.parametrize("B,NN,ctx,budget", [
    (4, 1, [2048, 0, 1, 700], 1),                          # a chunk per request
    (3, 6, [4090 + i for i in range(6)] + [1, 2, 3, 4, 5, 6] + [300 + i for i in range(6)],
     2 * 6 * 32768 * 8),                                   # DSpark rows: 2 + 1 requests
])
def test_decode_candidate_source_in_request_chunks_equals_one_pass(rng, monkeypatch, B, NN, ctx,
                                                                    budget):
    """The candidate source over vLLM's 1M-wide block table, in chunks of requests (a small
    ``candidate_budget``) and in one pass: the same top-k and the same written blocks, bit for
    bit, on the kernels' path (the chunked rows of ``out`` past the batch untouched)."""
    H, topk, K, cbs, width = 32, 512, 2048, 8, 262144
    g = torch.Generator(device=DEV).manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    s, bs_page = _decode_set(g, B, NN, torch.tensor(ctx).view(B, NN), width, H)
    got = []
    for kw in ({"candidate_budget": budget}, {}):
        blocks = torch.full((B * NN, K), -7, dtype=torch.int32, device=DEV)
        out = _run(monkeypatch, s, B, NN, H, bs_page, topk, blocks, cbs, True, "1", **kw)
        got.append((out, blocks.cpu()))
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    assert bool((got[0][0][B * NN:] == -7).all())


def test_decode_topk_takes_the_kernels_on_a_wide_table(monkeypatch):
    """The kernel path is what runs (not a silent fallback): the torch form's full-width
    buffers are not allocated (CandidateStep.kernels), and the fill is skipped."""
    g = torch.Generator(device=DEV).manual_seed(5)
    s, bs_page = _decode_set(g, 2, 1, torch.tensor([[100], [4000]]), 262144)
    seen = []
    orig = I.CandidateStep.begin

    def spy(self, *a, **kw):
        orig(self, *a, **kw)
        seen.append(self.kernels)
    monkeypatch.setattr(I.CandidateStep, "begin", spy)
    blocks = torch.full((2, 2048), -7, dtype=torch.int32, device=DEV)
    _run(monkeypatch, s, 2, 1, 32, bs_page, 512, blocks, 8, True, "1")
    _run(monkeypatch, s, 2, 1, 32, bs_page, 512, blocks, 8, True, "0")
    assert seen == [True, False]
