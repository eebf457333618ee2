"""The CUDA paged decode scorer of the lightning indexer (``deepinfer_sm80.ops.indexer``,
csrc/index/indexer_keys.cu; with ``rows_per_req`` >= 1 csrc/index/indexer_rows.cu, blocks of a
request's rows sharing each K tile) on a GPU:

* exact (dyadic) inputs: keys bit-equal to the float64 oracle's and to the Triton scorer's,
  over head counts, request layouts, visible ranges, column offsets, chunk sizes, strided
  block tables and invalid pages;
* every e4m3 code pair (256 x 256) through the MMA, each at every dot-product position;
* NaN codes: the same keys as the Triton scorer (a poisoned head or column counts 0);
* random full-range codes: within fp32 accumulation error of float64;
* the rows kernel's keys bit-equal to the warp kernel's on random full-range inputs (NaN codes,
  invalid pages and requests, rows in any order, 1..8 rows per block);
* ``decode_topk`` with the CUDA scorer equal to the Triton scorer's indices, eager and under
  CUDA-graph replay on fresh queries.
Outputs are poisoned before every call."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

from deepinfer_sm80.ampere import indexer as I  # noqa: E402
from deepinfer_sm80.ops import indexer as OI  # noqa: E402

import indexer_cases as IC  # noqa: E402

from deepinfer_sm80.ampere.indexer_triton import mqa_logits_tile  # noqa: E402

DEV = "cuda"
D = 128
POISON = 0x5A5A5A5A5A5A5A5A


@pytest.fixture(autouse=True)
def _built(ext):
    """A missing build is an error here, not a skip (conftest's ``ext``)."""
    return ext


def _case(g, *, B, NN, H, bs, ctxs, nb_extra=3, bt_stride=1, bad_pages=False):
    """Dyadic paged case: pages, block table (optionally a strided view), float64 values."""
    maxb = max(1, -(-max(ctxs) // bs))
    nb = B * maxb + nb_extra
    pages, kvals, sc = IC.dyadic_indexer_pages(nb, bs, D, g)
    bt = torch.randperm(nb, generator=g)[: B * maxb].view(B, maxb).int()
    if bad_pages:  # columns past each context: page ids that must never be read
        for b in range(B):
            used = -(-ctxs[b] // bs)
            bt[b, used:] = torch.tensor([-1, nb, 1 << 30])[torch.arange(maxb - used) % 3].int()
    big = torch.full((B, maxb * bt_stride), -9, dtype=torch.int32)
    big[:, ::bt_stride] = bt
    bt_dev = big.to(DEV)[:, ::bt_stride]
    qc, qv = IC.dyadic_fp8((B * NN, H, D), g)
    w = IC.dyadic_weights((B * NN, H), g)
    return dict(pages=pages.to(DEV), bt=bt, bt_dev=bt_dev, kvals=kvals, sc=sc.double(), qc=qc,
                qv=qv, w=w, B=B, NN=NN, H=H, bs=bs, maxb=maxb)


def _oracle_keys(c, row_req, lo, hi, col0, n_cols):
    rows = c["qc"].shape[0]
    out = torch.full((rows, n_cols), I.INT64_MIN, dtype=torch.int64)
    for r in range(rows):
        b = int(row_req[r])
        cols = torch.arange(col0, col0 + n_cols)
        valid = (cols >= lo[r]) & (cols < hi[r])
        if not valid.any():
            continue
        vc = cols[valid]
        pg = c["bt"][b, vc // c["bs"]].long()
        sl = vc % c["bs"]
        k = c["kvals"][pg, sl]  # [n, D]
        ks = c["sc"][pg, sl]
        L = IC.logits64(c["qv"][r: r + 1], c["w"][r: r + 1], k, ks)[0]
        assert torch.equal(L.float().double(), L)  # the inputs keep fp32 exact
        keys = I.order_keys(L.float().unsqueeze(0), (vc - lo[r]).unsqueeze(0),
                            torch.ones(1, len(vc), dtype=torch.bool))[0]
        out[r, valid] = keys
    return out


def _run(fn, c, row_req, lo, hi, col0, n_cols, **kw):
    rows = c["qc"].shape[0]
    out = torch.full((rows, n_cols + 5), POISON, dtype=torch.int64, device=DEV)
    fn(c["qc"].to(DEV), c["w"].float().to(DEV), col0=col0, n_cols=n_cols,
       lo=lo.int().to(DEV), hi=hi.int().to(DEV), out=out, pages=c["pages"],
       block_table=c["bt_dev"], row_req=row_req.int().to(DEV), block_size=c["bs"], **kw)
    torch.cuda.synchronize()
    got = out.cpu()
    assert (got[:, n_cols:] == POISON).all(), "wrote past n_cols"
    return got[:, :n_cols]


SM86_SMEM = 101376  # 99 KB: the 4-stage ring


@pytest.mark.parametrize("rows", ["warp", "rows"])
@pytest.mark.parametrize("smem_cap", [0, SM86_SMEM])
@pytest.mark.parametrize("H", [16, 32, 64])
@pytest.mark.parametrize("NN", [1, 6, 8])
def test_exact_keys_match_oracle_and_triton(rng, H, NN, smem_cap, rows):
    bs = 64
    ctxs = [0, 1, 200, 64, 257][: 3 if NN > 1 else 5]
    B = len(ctxs)
    c = _case(rng, B=B, NN=NN, H=H, bs=bs, ctxs=ctxs)
    row_req = torch.arange(B).repeat_interleave(NN)
    # MTP rows: row i of a request sees NN - 1 - i columns fewer than its last row
    hi = torch.tensor([max(0, ctxs[b] - (NN - 1 - i)) for b in range(B) for i in range(NN)])
    lo = torch.zeros_like(hi)
    n_cols = c["maxb"] * bs
    want = _oracle_keys(c, row_req, lo, hi, 0, n_cols)
    got = _run(OI.indexer_paged_keys, c, row_req, lo, hi, 0, n_cols, smem_cap=smem_cap,
               rows_per_req=NN if rows == "rows" else 0)
    assert torch.equal(got, want)
    tri = _run(mqa_logits_tile, c, row_req, lo, hi, 0, n_cols)
    assert torch.equal(tri, want)


@pytest.mark.parametrize("rows_per_req", [0, 1, 2, 4])
@pytest.mark.parametrize("smem_cap", [0, SM86_SMEM])
@pytest.mark.parametrize("chunk", [64, 128, 0])
@pytest.mark.parametrize("bs", [64, 16, 8])
def test_offsets_windows_chunks_strided_tables(rng, chunk, bs, smem_cap, rows_per_req):
    """col0 > 0, n_cols not a multiple of 32, lo > 0, rows of one request in any order (with
    rows_per_req: blocks whose rows belong to several requests), a strided block table, pages
    past the context that are invalid ids."""
    ctxs = [300, 129, 77]
    c = _case(rng, B=3, NN=2, H=32, bs=bs, ctxs=ctxs, bt_stride=3, bad_pages=True)
    row_req = torch.tensor([2, 0, 1, 2, 0, 1])
    hi = torch.tensor([ctxs[int(b)] for b in row_req]) - torch.tensor([0, 1, 0, 3, 0, 2])
    lo = torch.tensor([5, 0, 17, 0, 64, 1])
    col0, n_cols = 3, min(c["maxb"] * bs - 3, 250)
    want = _oracle_keys(c, row_req, lo, hi, col0, n_cols)
    got = _run(OI.indexer_paged_keys, c, row_req, lo, hi, col0, n_cols, chunk=chunk,
               smem_cap=smem_cap, rows_per_req=rows_per_req)
    assert torch.equal(got, want)
    assert c["bt_dev"].stride(1) == 3  # the kernels get the strided view itself
    if chunk == 64 and smem_cap == 0 and rows_per_req == 0:  # the portable scorer too
        assert torch.equal(_run(mqa_logits_tile, c, row_req, lo, hi, col0, n_cols), want)


@pytest.mark.parametrize("rows_per_req", [0, 2])
def test_pages_beyond_2gib(rng, rows_per_req):
    """64-bit page offsets: the case's pages copied to page ids past byte 2^31 of a cache of
    more than 2^31 bytes (254,000+ pages of 8,448 bytes), the block table shifted to them:
    the same keys as the oracle's on the original ids (a 32-bit byte offset would wrap)."""
    if torch.cuda.mem_get_info()[0] < 6 * 2**30:
        pytest.skip("needs about 6 GiB of free GPU memory")
    bs = 64
    c = _case(rng, B=2, NN=2, H=32, bs=bs, ctxs=[300, 200])
    nb = c["pages"].shape[0]
    first = 2**31 // c["pages"].stride(0) + 1
    big = torch.zeros(first + nb, c["pages"].shape[1], dtype=torch.uint8, device=DEV)
    big[first:] = c["pages"]
    row_req = torch.arange(2).repeat_interleave(2)
    hi = torch.tensor([299, 300, 199, 200])
    lo = torch.zeros_like(hi)
    n_cols = c["maxb"] * bs
    want = _oracle_keys(c, row_req, lo, hi, 0, n_cols)
    shifted = dict(c, pages=big, bt_dev=(c["bt"] + first).to(DEV))
    assert int(shifted["bt_dev"].min()) * big.stride(0) >= 2**31
    got = _run(OI.indexer_paged_keys, shifted, row_req, lo, hi, 0, n_cols,
               rows_per_req=rows_per_req)
    assert torch.equal(got, want)
    if rows_per_req == 0:
        assert torch.equal(_run(mqa_logits_tile, shifted, row_req, lo, hi, 0, n_cols), want)


def _random_paged(g, *, B, NN, H, bs, ctx_max, nan=True):
    """Full-range random codes (NaN codes too), random scales, weights and block table (with
    -1, out-of-range and huge page ids past some contexts), MTP windows per row."""
    maxb = -(-ctx_max // bs)
    nb = B * maxb + 2
    pages = IC.random_indexer_pages(nb, bs, D, g, nan=nan)
    bt = torch.randperm(nb, generator=g)[: B * maxb].view(B, maxb).int()
    bt[0, maxb // 2] = -1
    if B > 1:
        bt[1, -1] = nb
    if B > 2:
        bt[2, 0] = 1 << 30
    ctx = torch.randint(0, ctx_max + 1, (B,), generator=g)
    ctx[0] = ctx_max
    hi = (ctx.view(B, 1) - torch.arange(NN).flip(0).view(1, NN)).clamp(min=0).reshape(-1)
    q = torch.randint(0, 256, (B * NN, H, D), generator=g, dtype=torch.uint8)
    w = torch.randn(B * NN, H, generator=g)
    return dict(q=q.to(DEV), w=w.to(DEV), pages=pages.to(DEV), bt=bt.to(DEV), hi=hi.int().to(DEV),
                lo=torch.zeros(B * NN, dtype=torch.int32, device=DEV), bs=bs, maxb=maxb,
                row_req=torch.arange(B).repeat_interleave(NN).int().to(DEV))


def _paged(c, **kw):
    rows = c["q"].shape[0]
    n_cols = kw.pop("n_cols", c["maxb"] * c["bs"])
    out = torch.full((rows, n_cols + 3), POISON, dtype=torch.int64, device=DEV)
    OI.indexer_paged_keys(c["q"], c["w"], col0=kw.pop("col0", 0), n_cols=n_cols, lo=c["lo"],
                          hi=c["hi"], out=out, pages=c["pages"], block_table=c["bt"],
                          row_req=kw.pop("row_req", c["row_req"]), block_size=c["bs"], **kw)
    got = out.cpu()
    assert (got[:, n_cols:] == POISON).all(), "wrote past n_cols"
    return got[:, :n_cols]


@pytest.mark.parametrize("kw", [{}, dict(chunk=64), dict(col0=37, n_cols=700),
                                dict(sm_count=108), dict(sm_count=84, smem_cap=SM86_SMEM)])
@pytest.mark.parametrize("H", [16, 32, 64])
@pytest.mark.parametrize("NN", [1, 2, 3, 6, 8])
def test_rows_kernel_equals_warp_kernel_bit_for_bit(rng, NN, H, kw):
    """decode_topk's MTP layout (NN rows per request, contiguous), random full-range inputs:
    the rows kernel (rows_per_req=NN) gives the warp kernel's keys exactly."""
    c = _random_paged(rng, B=7, NN=NN, H=H, bs=64, ctx_max=900)
    want = _paged(c, **dict(kw))
    assert (want != I.INT64_MIN).any()
    assert torch.equal(_paged(c, rows_per_req=NN, **dict(kw)), want)


def test_rows_kernel_any_row_order_and_bad_requests(rng):
    """Blocks whose rows belong to several requests (taken as runs), rows of one request not
    contiguous, and requests outside the block table (-1, num_reqs): the warp kernel's keys."""
    c = _random_paged(rng, B=5, NN=3, H=64, bs=16, ctx_max=300)
    row_req = torch.tensor([0, 0, 1, 4, 4, 2, 2, 2, -1, 3, 5, 1, 3, 0, 4], dtype=torch.int32,
                           device=DEV)
    want = _paged(c, row_req=row_req)
    for n in (1, 2, 3, 5, 8):
        assert torch.equal(_paged(c, row_req=row_req, rows_per_req=n), want), n


def test_every_code_pair_at_every_position():
    """Row r's head 0 holds Q code r at position r % 128 (other positions 0, weight 1; the
    other heads weight 0); column c holds K code c at every position, scale 1. So
    logit[r, c] = relu(e4m3(r) * e4m3(c)), exactly, 0 where either code is NaN."""
    H, bs, n = 16, 64, 256
    q = torch.zeros(n, H, D, dtype=torch.uint8)
    q[torch.arange(n), 0, torch.arange(n) % D] = torch.arange(n, dtype=torch.uint8)
    w = torch.zeros(n, H)
    w[:, 0] = 1.0
    nb = n // bs
    pages = torch.zeros(nb, bs * 132, dtype=torch.uint8)
    pages[:, : bs * D] = torch.arange(n, dtype=torch.uint8).view(nb, bs, 1).expand(nb, bs, D).reshape(nb, -1)
    pages[:, bs * D:] = torch.ones(nb, bs).view(torch.uint8).view(nb, -1)
    bt = torch.arange(nb, dtype=torch.int32).view(1, nb)
    vals = torch.arange(n, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    prod = (vals.view(n, 1) * vals.view(1, n))
    L = torch.where(prod.isnan(), 0.0, prod.clamp(min=0))
    want = I.order_keys(L.float(), torch.arange(n).unsqueeze(0), torch.ones(n, n, dtype=torch.bool))
    out = torch.full((n, n), POISON, dtype=torch.int64, device=DEV)
    OI.indexer_paged_keys(q.to(DEV), w.to(DEV), col0=0, n_cols=n,
                          lo=torch.zeros(n, dtype=torch.int32, device=DEV),
                          hi=torch.full((n,), n, dtype=torch.int32, device=DEV), out=out,
                          pages=pages.to(DEV), block_table=bt.to(DEV),
                          row_req=torch.zeros(n, dtype=torch.int32, device=DEV), block_size=bs)
    assert torch.equal(out.cpu(), want)


def test_nan_codes_match_triton(rng):
    """NaN codes in some Q heads and some K columns (dyadic values elsewhere)."""
    c = _case(rng, B=2, NN=3, H=64, bs=64, ctxs=[190, 128])
    c["qc"][1, 5, 17] = 0x7F
    c["qc"][4, 60, 100] = 0xFF
    pages = c["pages"].cpu()
    for page, slot, d in ((int(c["bt"][0, 1]), 3, 0), (int(c["bt"][1, 0]), 63, 127)):
        pages[page, slot * D + d] = 0x7F
    c["pages"] = pages.to(DEV)
    row_req = torch.arange(2).repeat_interleave(3)
    hi = torch.tensor([190, 189, 188, 128, 127, 126])
    lo = torch.zeros_like(hi)
    n_cols = c["maxb"] * 64
    got = _run(OI.indexer_paged_keys, c, row_req, lo, hi, 0, n_cols)
    tri = _run(mqa_logits_tile, c, row_req, lo, hi, 0, n_cols)
    assert torch.equal(got, tri)


@pytest.mark.parametrize("H", [32, 64])
def test_random_codes_within_fp32_error(rng, H):
    """Full-range random codes (no NaN), random fp32 scales and weights."""
    B, bs, ctx = 4, 64, 1000
    maxb = -(-ctx // bs)
    nb = B * maxb + 2
    codes = torch.randint(0, 256, (nb, bs, D), generator=rng, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C
    sc = torch.rand(nb, bs, generator=rng) + 0.25
    pages = torch.zeros(nb, bs * 132, dtype=torch.uint8)
    pages[:, : bs * D] = codes.view(nb, -1)
    pages[:, bs * D:] = sc.view(torch.uint8).view(nb, -1)
    bt = torch.randperm(nb, generator=rng)[: B * maxb].view(B, maxb).int()
    q = torch.randint(0, 256, (B, H, D), generator=rng, dtype=torch.uint8)
    q[(q & 0x7F) == 0x7F] = 0xB8
    w = torch.randn(B, H, generator=rng)
    out = torch.full((B, maxb * bs), POISON, dtype=torch.int64, device=DEV)
    hi = torch.tensor([ctx, ctx - 1, 500, 1])
    OI.indexer_paged_keys(q.to(DEV), w.to(DEV), col0=0, n_cols=maxb * bs,
                          lo=torch.zeros(B, dtype=torch.int32, device=DEV),
                          hi=hi.int().to(DEV), out=out, pages=pages.to(DEV), block_table=bt.to(DEV),
                          row_req=torch.arange(B, dtype=torch.int32, device=DEV), block_size=bs)
    got = I.key_scores(out.cpu()).double()
    qv = q.view(torch.float8_e4m3fn).double()
    kv = codes.view(torch.float8_e4m3fn).double()
    for r in range(B):
        n = int(hi[r])
        cols = torch.arange(n)
        pg = bt[r, cols // bs].long()
        k = kv[pg, cols % bs]
        s = torch.einsum("hd,nd->hn", qv[r], k)
        ref = (s.clamp(min=0) * w[r].double().unsqueeze(1)).sum(0) * sc[pg, cols % bs].double()
        bound = (torch.einsum("hd,nd->hn", qv[r].abs(), k.abs()) * w[r].double().abs().unsqueeze(1)).sum(0) \
            * sc[pg, cols % bs].double()
        err = (got[r, :n] - ref).abs()
        assert (err <= 1.5e-5 * bound + 1e-30).all(), float((err / bound.clamp(min=1e-30)).max())
        assert (out.cpu()[r, n:] == I.INT64_MIN).all()


@pytest.mark.parametrize("NN,min_work,want_rpr", [(3, None, 3), (1, 0, 1), (1, 1 << 40, 0)])
def test_decode_topk_cuda_equals_triton_and_replays_in_a_graph(rng, monkeypatch, NN, min_work, want_rpr):
    """``decode_topk`` with the CUDA scorer selects exactly what the Triton scorer selects
    (exact inputs), eagerly and replayed from a captured CUDA graph on fresh queries; with
    next_n rows per request (the rows kernel) and with one (the rows kernel or the warp kernel,
    by ``decode_rows_per_req``'s threshold, forced here either way)."""
    if min_work is not None:
        monkeypatch.setattr(I, "ROWS_KERNEL_MIN_WORK_PER_SM", min_work)
    seen = []
    real = OI.indexer_paged_keys

    def spy(*a, **kw):
        seen.append(kw.get("rows_per_req", 0))
        return real(*a, **kw)

    monkeypatch.setattr(OI, "indexer_paged_keys", spy)
    B, H, bs, K = 4, 64, 64, 40
    ctxs = [500, 63, 130, 1]
    c = _case(rng, B=B, NN=NN, H=H, bs=bs, ctxs=ctxs)
    ctx = torch.tensor(ctxs).view(B, 1) - torch.arange(NN).flip(0).view(1, NN)
    ctx = ctx.clamp(min=0).to(DEV)
    q = c["qc"].view(B, NN, H, D).to(DEV)
    w = c["w"].float().to(DEV)
    outs = {}
    for scorer in ("cuda", "triton"):
        o = torch.full((B * NN, K), -7, dtype=torch.int32, device=DEV)
        I.decode_topk(q, w, c["pages"], ctx, c["bt_dev"], bs, K, o, scorer=scorer)
        outs[scorer] = o.cpu()
    assert torch.equal(outs["cuda"], outs["triton"])
    assert (outs["cuda"] >= 0).any()
    assert seen and set(seen) == {want_rpr}, seen

    o = torch.full((B * NN, K), -7, dtype=torch.int32, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            I.decode_topk(q, w, c["pages"], ctx, c["bt_dev"], bs, K, o, scorer="cuda")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        I.decode_topk(q, w, c["pages"], ctx, c["bt_dev"], bs, K, o, scorer="cuda")
    for _ in range(2):
        qc, _ = IC.dyadic_fp8((B * NN, H, D), rng)
        q.copy_(qc.view(B, NN, H, D).to(DEV))
        w.copy_(IC.dyadic_weights((B * NN, H), rng).float().to(DEV))
        o.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        e = torch.full_like(o, -7)
        I.decode_topk(q, w, c["pages"], ctx, c["bt_dev"], bs, K, e, scorer="triton")
        assert torch.equal(o.cpu(), e.cpu())


@pytest.mark.parametrize("rows_per_req", [0, 1, 3])
def test_fill_false_writes_the_windows_the_same(rng, rows_per_req):
    """``fill=False`` (the windowed decode top-k): every column inside a row's window [lo, hi)
    is written as with the fill; the columns past the windows are left as they were (the warp
    kernel: past each row's own window) or INT64_MIN, never anything else."""
    c = _random_paged(rng, B=4, NN=3, H=64, bs=64, ctx_max=700)
    W = 64 * 64  # a block table narrower than the call: its missing pages read as no page
    full = _paged(c, n_cols=W, rows_per_req=rows_per_req)
    part = _paged(c, n_cols=W, rows_per_req=rows_per_req, fill=False)
    hi = c["hi"].cpu()
    skipped = 0
    for r in range(full.shape[0]):
        h = int(hi[r])
        assert torch.equal(part[r, :h], full[r, :h]), r
        rest = part[r, h:]
        assert bool(((rest == POISON) | (rest == I.INT64_MIN)).all()), r
        if rows_per_req == 0:
            assert bool((rest == POISON).all()), r
        skipped += int((rest == POISON).sum())
    assert skipped > 0


@pytest.mark.parametrize("NN", [2, 6])
def test_decode_topk_one_request_with_speculative_rows(rng, NN):
    """One request with MTP / DSpark rows (a single-stream speculative decode): the CUDA
    path must run (its row-to-request map was a stride-0 view for B = 1, which the scorer op
    refused until 2026-12-03) and select what the Triton scorer selects."""
    H, bs, K = 64, 64, 48
    c = _case(rng, B=1, NN=NN, H=H, bs=bs, ctxs=[700])
    ctx = (torch.tensor([[700]]) - torch.arange(NN).flip(0).view(1, NN)).to(DEV)
    q = c["qc"].view(1, NN, H, D).to(DEV)
    w = c["w"].float().to(DEV)
    outs = {}
    for scorer in ("cuda", "triton"):
        o = torch.full((NN, K), -7, dtype=torch.int32, device=DEV)
        I.decode_topk(q, w, c["pages"], ctx, c["bt_dev"], bs, K, o, scorer=scorer)
        outs[scorer] = o.cpu()
    assert torch.equal(outs["cuda"], outs["triton"]) and (outs["cuda"] >= 0).all()


@pytest.mark.parametrize("tile_budget", [None, 3 * 8 * 4096])
@pytest.mark.parametrize("NN", [1, 6])
def test_decode_topk_block_table_as_wide_as_max_model_len(rng, monkeypatch, NN, tile_budget):
    """vLLM passes the whole block table (max_model_len wide) with every decode. The indices
    must be those of a block table as wide as the longest context: with the row top-k reading
    only each row's context (the default) and reading the whole row
    (``$DEEPINFER_INDEXER_WINDOW=0``); with one column tile and with many (merges with the
    running best). The entries past each context hold stale page ids, as vLLM's model runner V2
    leaves them (it copies only a request's own blocks; gpu/block_table.py): valid pages that
    no row may read."""
    B, H, bs, K = 3, 64, 64, 512
    c = _random_paged(rng, B=B, NN=NN, H=H, bs=bs, ctx_max=3000, nan=False)
    q = c["q"].view(B, NN, H, D)
    ctx = c["hi"].view(B, NN)
    n_pages = c["pages"].shape[0]
    wide_bt = torch.randint(0, n_pages, (B, 4096), dtype=torch.int32, device=DEV)  # 262,144 columns
    wide_bt[:, : c["maxb"]] = c["bt"]
    kw = {} if tile_budget is None else dict(tile_budget=tile_budget)
    outs = []
    for bt, window in ((c["bt"], "1"), (wide_bt, "1"), (wide_bt, "0")):
        monkeypatch.setenv("DEEPINFER_INDEXER_WINDOW", window)
        o = torch.full((B * NN, K + 2), -7, dtype=torch.int32, device=DEV)
        I.decode_topk(q, c["w"], c["pages"], ctx, bt, bs, K, o, scorer="cuda", **kw)
        outs.append(o.cpu())
    assert (outs[0][:, :K] >= 0).sum() > 0 and (outs[0][:, K:] == -7).all()
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])


@pytest.mark.parametrize("NN", [1, 6])
def test_decode_topk_pages_at_vllms_padded_stride(rng, NN):
    """vLLM pads each DeepSeek-V4 cache page to 576-byte alignment (v1/kv_cache_interface.py
    ``_apply_alignment_padding``): 64 x 132 = 8,448-byte indexer pages at a stride of 8,640,
    junk in the padding. The CUDA scorer reads them through the stride: the same indices as
    the contiguous pages."""
    B, H, bs, K = 3, 64, 64, 512
    c = _random_paged(rng, B=B, NN=NN, H=H, bs=bs, ctx_max=3000, nan=False)
    pages = c["pages"]
    nb = pages.shape[0]
    padded = torch.randint(0, 256, (nb, 8640), dtype=torch.uint8, device=DEV)
    padded[:, : bs * 132] = pages.reshape(nb, -1)
    strided = padded[:, : bs * 132].view(nb, bs, 132)
    q = c["q"].view(B, NN, H, D)
    ctx = c["hi"].view(B, NN)
    outs = []
    for kv in (pages, strided):
        o = torch.full((B * NN, K), -7, dtype=torch.int32, device=DEV)
        I.decode_topk(q, c["w"], kv, ctx, c["bt"], bs, K, o, scorer="cuda")
        outs.append(o.cpu())
    assert torch.equal(outs[0], outs[1]) and (outs[0] >= 0).sum() > 0


def test_bad_arguments_raise():
    q = torch.zeros(2, 8, D, dtype=torch.uint8, device=DEV)
    args = dict(col0=0, n_cols=64, lo=torch.zeros(2, dtype=torch.int32, device=DEV),
                hi=torch.zeros(2, dtype=torch.int32, device=DEV),
                out=torch.empty(2, 64, dtype=torch.int64, device=DEV),
                pages=torch.zeros(2, 64 * 132, dtype=torch.uint8, device=DEV),
                block_table=torch.zeros(1, 2, dtype=torch.int32, device=DEV),
                row_req=torch.zeros(2, dtype=torch.int32, device=DEV), block_size=64)
    with pytest.raises(ValueError, match="heads"):
        OI.indexer_paged_keys(q, torch.zeros(2, 8, device=DEV), **args)
    q = torch.zeros(2, 16, D, dtype=torch.uint8, device=DEV)
    with pytest.raises(ValueError, match="pages hold"):
        OI.indexer_paged_keys(q, torch.zeros(2, 16, device=DEV), **dict(args, block_size=128))
    with pytest.raises(ValueError, match="chunk"):
        OI.indexer_paged_keys(q, torch.zeros(2, 16, device=DEV), chunk=96, **args)
    with pytest.raises(TypeError, match="out"):
        OI.indexer_paged_keys(q, torch.zeros(2, 16, device=DEV),
                              **dict(args, out=torch.empty(2, 64, dtype=torch.int32, device=DEV)))
