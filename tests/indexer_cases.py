"""Indexer inputs whose fp32 scoring is exact (dyadic, low-precision values),
so the float64 oracle's top-k sets, ties included, must be matched exactly.
Imports nothing but torch."""

from types import SimpleNamespace

import torch

from deepinfer_sm80.ampere import indexer as I
from deepinfer_sm80.reference.writers import e4m3_encode_ref


def dyadic_fp8(shape, g, lo=-2, hi=2):
    """e4m3 codes of values m * 2^e, m in [-8, 8], e in [lo, hi]: products and
    sums of these stay exact in fp32."""
    m = torch.randint(-8, 9, shape, generator=g).double()
    e = torch.randint(lo, hi + 1, shape, generator=g).double()
    return e4m3_encode_ref(m * torch.pow(2.0, e)), m * torch.pow(2.0, e)


def dyadic_weights(shape, g):
    return (torch.randint(-4, 5, shape, generator=g).double() * 0.25)


def k_scales(n, g):
    return torch.pow(2.0, torch.randint(-2, 3, (n,), generator=g).double())


def dyadic_indexer_pages(nb, bs, D, g):
    """``nb`` indexer pages of ``bs`` entries (``bs * D`` e4m3 codes, then ``bs`` fp32 scales)
    with dyadic codes and scales: (pages uint8 [nb, bs * (D + 4)], float64 values
    [nb, bs, D], scales [nb, bs])."""
    codes, kvals = dyadic_fp8((nb, bs, D), g)
    sc = k_scales(nb * bs, g).view(nb, bs)
    pages = torch.zeros(nb, bs * (D + 4), dtype=torch.uint8)
    pages[:, : bs * D] = codes.view(nb, -1)
    pages[:, bs * D:] = sc.float().contiguous().view(torch.uint8).view(nb, -1)
    return pages, kvals, sc


def no_nan_codes(codes, fill=0x3C):
    """e4m3 codes (uint8) with every NaN code (0x7F / 0xFF) replaced by ``fill``, in place."""
    codes[(codes & 0x7F) == 0x7F] = fill
    return codes


def random_indexer_pages(nb, bs, D, g, nan=True):
    """``nb`` indexer pages of ``bs`` entries with full-range random codes (NaN codes only with
    ``nan``) and fp32 scales in [0.25, 1.25): uint8 [nb, bs * (D + 4)], on the CPU."""
    pages = torch.randint(0, 256, (nb, bs * (D + 4)), generator=g, dtype=torch.uint8)
    if not nan:
        no_nan_codes(pages[:, : bs * D])
    pages[:, bs * D:] = (torch.rand(nb, bs, generator=g) + 0.25).contiguous().view(torch.uint8).view(nb, -1)
    return pages


def logits64(q64, w64, k64, ks64):
    """q [T, H, D], w [T, H], k [N, D], ks [N] (float64) -> [T, N]."""
    s = torch.einsum("thd,nd->thn", q64, k64).clamp(min=0)
    return (s * w64.unsqueeze(-1)).sum(1) * ks64



def _oracle_candidates(L, n, bs, k):
    """The K best visible blocks of one row by (max score desc, block asc), the newest
    pinned first; -1 after."""
    nb = -(-n // bs)
    score = {b: max(float(L[j]) for j in range(b * bs, min(n, (b + 1) * bs))) for b in range(nb)}
    if nb:
        score[nb - 1] = float("inf")
    order = sorted(score, key=lambda b: (-score[b], b))[:k]
    return order + [-1] * (k - len(order))


def _oracle_masked_topk(L, n, blocks, bs, k):
    keep = {b for b in blocks if b >= 0}
    cols = [j for j in range(n) if j // bs in keep]
    cols.sort(key=lambda j: (-float(L[j]), j))
    return set(cols[:k])


def _prefill_case(g, dev):
    T, H, D, N = 29, 8, 128, 400
    qc, q64 = dyadic_fp8((T, H, D), g)
    kc, k64 = dyadic_fp8((N, D), g)
    w64 = dyadic_weights((T, H), g)
    ks64 = k_scales(N, g)
    ks = torch.tensor([0] * 15 + [180] * 14)
    ke = torch.tensor([min(180, 1 + 12 * t) for t in range(15)] + [180 + 3 + 15 * t for t in range(14)])
    L = logits64(q64, w64, k64, ks64)
    local = [L[t, int(ks[t]):int(ke[t])] for t in range(T)]
    return (qc.to(dev), w64.float().to(dev), kc.to(dev), ks64.float().to(dev), ks.to(dev),
            ke.to(dev), local)


def check_prefill_candidate_write(dev, row_chunk):
    g = torch.Generator().manual_seed(5)
    qc, w, kc, ksc, ks, ke, local = _prefill_case(g, dev)
    T, K, bs, nblk = qc.shape[0], 16, 8, 5
    plain = torch.full((T, K), -7, dtype=torch.int32, device=dev)
    I.prefill_topk(qc, w, kc, ksc, ks, ke, K, plain, row_chunk=row_chunk)
    cand = torch.full((T, nblk), -7, dtype=torch.int32, device=dev)
    out = torch.full((T, K), -7, dtype=torch.int32, device=dev)
    I.prefill_topk(qc, w, kc, ksc, ks, ke, K, out, row_chunk=row_chunk,
                   candidates=I.CandidateStep(cand, bs, write=True), tile_budget=8192)
    assert torch.equal(out, plain)  # the source layer's own top-k is unaffected
    cand = cand.cpu()
    for t in range(T):
        assert cand[t].tolist() == _oracle_candidates(local[t], local[t].numel(), bs, nblk), t


def check_prefill_candidate_mask(dev, row_chunk):
    g = torch.Generator().manual_seed(6)
    qc, w, kc, ksc, ks, ke, local = _prefill_case(g, dev)
    T, K, bs = qc.shape[0], 16, 8
    cand = torch.randint(-1, 40, (T, 6), generator=g, dtype=torch.int32)  # some beyond visible
    out = torch.full((T, K), -7, dtype=torch.int32, device=dev)
    I.prefill_topk(qc, w, kc, ksc, ks, ke, K, out, row_chunk=row_chunk,
                   candidates=I.CandidateStep(cand.to(dev), bs, write=False), tile_budget=8192)
    out = out.cpu()
    masked = 0
    for t in range(T):
        n = local[t].numel()
        want = _oracle_masked_topk(local[t], n, cand[t].tolist(), bs, K)
        got = {j for j in out[t].tolist() if j >= 0}
        assert got == want, t
        assert sum(j >= 0 for j in out[t].tolist()) == len(want)
        masked += len(want) < min(n, K)
    assert masked > 0  # the mask really removed positions


def decode_case(g, dev):
    """A paged decode batch (3 requests x 2 rows, 8 heads, 64-entry pages, candidate blocks
    of 16) with exact fp32 scoring; what ``decode_topk`` takes plus the float64 values the
    oracle needs."""
    B, NN, H, D, bs, nb, maxb = 3, 2, 8, 128, 64, 12, 4
    codes, vals = dyadic_fp8((nb, bs, D), g)
    sc = k_scales(nb * bs, g).view(nb, bs)
    pages = torch.zeros(nb, bs * 132, dtype=torch.uint8)
    pages[:, : bs * D] = codes.view(nb, -1)
    pages[:, bs * D:] = sc.float().contiguous().view(torch.uint8).view(nb, -1)
    bt = torch.randperm(nb, generator=g)[: B * maxb].view(B, maxb).int()
    ctx = torch.tensor([[150, 151], [40, 41], [255, 256]])
    return SimpleNamespace(B=B, NN=NN, H=H, D=D, bs=bs, K=24, nblk=4, cbs=16, vals=vals, sc=sc,
                           bt=bt, ctx=ctx, pages_dev=pages.to(dev), bt_dev=bt.to(dev),
                           ctx_dev=ctx.to(dev))


def decode_queries(case, g):
    """Fresh queries and weights for ``case``: (codes, float64 values, float64 weights)."""
    qc, q64 = dyadic_fp8((case.B, case.NN, case.H, case.D), g)
    return qc, q64, dyadic_weights((case.B * case.NN, case.H), g)


def run_decode_candidates(case, qc_dev, w_dev, out, blocks, write, candidate_budget=None):
    I.decode_topk(qc_dev, w_dev, case.pages_dev, case.ctx_dev, case.bt_dev, case.bs, case.K, out,
                  pages_per_tile=1, candidates=I.CandidateStep(blocks, case.cbs, write=write),
                  candidate_budget=candidate_budget)


def check_decode_rows(case, q64, w64, out, blocks, write):
    """``out`` / ``blocks`` (CPU) against the float64 oracle: the written candidate blocks
    and the plain top-k (write), or the top-k within the listed blocks (mask)."""
    NN = case.NN
    for b in range(case.B):
        kv64 = torch.cat([case.vals[int(p)] for p in case.bt[b]])
        ks64 = torch.cat([case.sc[int(p)] for p in case.bt[b]])
        L = logits64(q64[b], w64[b * NN:(b + 1) * NN], kv64, ks64)
        for i in range(NN):
            r, n = b * NN + i, int(case.ctx[b, i])
            if write:
                assert blocks[r].tolist() == _oracle_candidates(L[i], n, case.cbs, case.nblk), r
                want = I.reference_topk_sets(L[i:i + 1], torch.arange(L.shape[1]).unsqueeze(0) < n,
                                             case.K)[0]
            else:
                want = _oracle_masked_topk(L[i], n, blocks[r].tolist(), case.cbs, case.K)
            assert {j for j in out[r].tolist() if j >= 0} == want, r


def check_decode_candidates(dev, write, candidate_budget=None):
    """``candidate_budget``: decode_topk's bytes of candidate block keys; small ones make the
    candidate source run in chunks of requests (:func:`decode_candidate_chunks`)."""
    g = torch.Generator().manual_seed(7)
    case = decode_case(g, dev)
    qc, q64, w64 = decode_queries(case, g)
    rows = case.B * case.NN
    if write:
        cand = torch.full((rows, case.nblk), -7, dtype=torch.int32)
    else:
        cand = torch.randint(-1, 18, (rows, case.nblk), generator=g, dtype=torch.int32)
    out = torch.full((rows, case.K), -7, dtype=torch.int32, device=dev)
    cand_dev = cand.to(dev)
    run_decode_candidates(case, qc.to(dev), w64.float().to(dev), out, cand_dev, write,
                          candidate_budget)
    check_decode_rows(case, q64, w64, out.cpu(), cand_dev.cpu(), write)


def decode_candidate_chunks(case, candidate_budget):
    """The request chunks ``decode_topk`` runs ``case``'s candidate source in: [(first row,
    rows)], one entry without chunking."""
    per = I.candidate_decode_requests(case.B, case.NN, case.bt.shape[1] * case.bs, case.cbs,
                                      candidate_budget)
    return [(b0 * case.NN, (min(case.B, b0 + per) - b0) * case.NN) for b0 in range(0, case.B, per)]
