"""The CUDA flat (prefill) scorer of the lightning indexer (``deepinfer_sm80.ops.indexer.
indexer_flat_keys``, K from the gathered workspace) on a GPU, both kernels: ``rows``
(csrc/index/indexer_rows.cu, blocks of rows sharing K; the default) and ``warp``
(csrc/index/indexer_keys.cu's flat mode, a warp per row):

* the two kernels' keys bit-equal on random full-range inputs (ragged windows, row counts that
  are no multiple of a block's rows, 2, 4 and 8 rows per block, SM86's cap);

* exact (dyadic) inputs: keys bit-equal to the float64 oracle's and to the Triton scorer's flat
  mode, over head counts, ragged causal rows, column offsets, chunk sizes, the SM86 ring, a
  strided workspace and rows that reach past the workspace (never read: NaN codes there);
* random full-range codes: within fp32 accumulation error of float64;
* NaN codes: the same keys as the Triton scorer;
* ``prefill_topk`` with the CUDA scorer equal to the Triton scorer's indices and to the
  oracle's sets (exact inputs), with and without V4.1's candidate step.
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
SM86_SMEM = 101376  # 99 KB: the 4-stage ring


@pytest.fixture(autouse=True)
def _built(ext):
    """A missing build is an error here, not a skip (conftest's ``ext``)."""
    return ext


def _case(g, *, T, H, N, stride=D, tail_nan=0):
    """Dyadic flat workspace of N columns (row stride ``stride`` bytes), ``tail_nan`` extra
    rows of NaN codes after it that no call may read, queries and weights."""
    kc, kv = IC.dyadic_fp8((N, D), g)
    store = torch.full((N + tail_nan, stride), 0x7F, dtype=torch.uint8)
    store[:N, :D] = kc
    sc = IC.k_scales(N, g)
    qc, qv = IC.dyadic_fp8((T, H, D), g)
    w = IC.dyadic_weights((T, H), g)
    k_dev = store.to(DEV)[:, :D]
    return dict(k_dev=k_dev[:N], kv=kv, sc=sc, sc_dev=sc.float().to(DEV), qc=qc, qv=qv, w=w)


def _oracle_keys(c, lo, hi, col0, n_cols):
    rows = c["qc"].shape[0]
    N = c["kv"].shape[0]
    out = torch.full((rows, n_cols), I.INT64_MIN, dtype=torch.int64)
    cols = torch.arange(col0, col0 + n_cols)
    for r in range(rows):
        valid = (cols >= lo[r]) & (cols < hi[r])
        if not valid.any():
            continue
        vc = cols[valid]
        inside = vc < N
        L = torch.zeros(len(vc), dtype=torch.float64)  # columns past the workspace score 0
        if inside.any():
            ci = vc[inside]
            L[inside] = IC.logits64(c["qv"][r: r + 1], c["w"][r: r + 1], c["kv"][ci], c["sc"][ci])[0]
        assert torch.equal(L.float().double(), L)  # the inputs keep fp32 exact
        out[r, valid] = I.order_keys(L.float().unsqueeze(0), (vc - lo[r]).unsqueeze(0),
                                     torch.ones(1, len(vc), dtype=torch.bool))[0]
    return out


def _run(c, lo, hi, col0, n_cols, *, triton=False, **kw):
    rows = c["qc"].shape[0]
    out = torch.full((rows, n_cols + 5), POISON, dtype=torch.int64, device=DEV)
    args = dict(col0=col0, n_cols=n_cols, lo=lo.int().to(DEV), hi=hi.int().to(DEV), out=out)
    if triton:
        mqa_logits_tile(c["qc"].to(DEV), c["w"].float().to(DEV), k_flat=c["k_dev"],
                        k_scale=c["sc_dev"], **args)
    else:
        OI.indexer_flat_keys(c["qc"].to(DEV), c["w"].float().to(DEV), k_codes=c["k_dev"],
                             k_scale=c["sc_dev"], **args, **kw)
    torch.cuda.synchronize()
    got = out.cpu()
    assert (got[:, n_cols:] == POISON).all(), "wrote past n_cols"
    return got[:, :n_cols]


def _causal(T, N, starts, g):
    """Ragged prefill rows: requests starting at column ``starts`` (one per T / len(starts)
    rows), row i of a request seeing [start, start + its compressed length)."""
    per = -(-T // len(starts))
    lo, hi = [], []
    for t in range(T):
        s = starts[min(t // per, len(starts) - 1)]
        lo.append(s)
        hi.append(min(N, s + 1 + (t % per) * 7 + int(torch.randint(0, 3, (1,), generator=g))))
    return torch.tensor(lo), torch.tensor(hi)


KERNELS = ["rows", "warp"]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("smem_cap", [0, SM86_SMEM])
@pytest.mark.parametrize("H", [16, 32, 64])
def test_exact_keys_match_oracle_and_triton(rng, H, smem_cap, kernel):
    T, N = 24, 700
    c = _case(rng, T=T, H=H, N=N)
    lo, hi = _causal(T, N, [0, 300, 510], rng)
    hi[3] = lo[3]  # an empty row
    want = _oracle_keys(c, lo, hi, 0, N)
    got = _run(c, lo, hi, 0, N, smem_cap=smem_cap, kernel=kernel)
    assert torch.equal(got, want)
    assert torch.equal(_run(c, lo, hi, 0, N, triton=True), want)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("chunk", [64, 192, 0])
@pytest.mark.parametrize("col0", [0, 37])
def test_offsets_chunks_strided_workspace_and_its_end(rng, chunk, col0, kernel):
    """col0 > 0, n_cols not a multiple of 16, a workspace with 144-byte rows, rows whose
    visible range reaches past the workspace's end (NaN codes lie there: never read)."""
    T, N = 10, 333
    c = _case(rng, T=T, H=64, N=N, stride=144, tail_nan=40)
    lo = torch.tensor([0, 5, 40, 100, 0, 250, 300, 332, 0, 17])
    hi = torch.tensor([333, 300, 41, 360, 1, 333, 370, 340, 0, 200])
    n_cols = 350 - col0
    want = _oracle_keys(c, lo, hi, col0, n_cols)
    got = _run(c, lo, hi, col0, n_cols, chunk=chunk, kernel=kernel)
    assert torch.equal(got, want)


def test_grid_for_fewer_sms_and_many_rows(rng):
    """More rows than resident blocks (the prefill shape), the grid sized for 108 and 84 SMs."""
    T, N = 600, 2100
    c = _case(rng, T=T, H=32, N=N)
    lo, hi = _causal(T, N, [0, 1000], rng)
    want = _oracle_keys(c, lo, hi, 0, N)
    for sm, cap in ((108, 0), (84, SM86_SMEM)):
        for kernel in KERNELS:
            assert torch.equal(_run(c, lo, hi, 0, N, sm_count=sm, smem_cap=cap, kernel=kernel), want)


def test_nan_codes_match_triton(rng):
    T, N = 6, 200
    c = _case(rng, T=T, H=64, N=N)
    c["qc"][1, 5, 17] = 0x7F
    c["qc"][4, 60, 100] = 0xFF
    k = c["k_dev"].cpu()
    k[3, 0] = 0x7F
    k[150, 127] = 0xFF
    c["k_dev"] = k.to(DEV)
    lo = torch.zeros(T, dtype=torch.int64)
    hi = torch.tensor([200, 199, 160, 151, 4, 200])
    want = _run(c, lo, hi, 0, N, triton=True)
    for kernel in KERNELS:
        assert torch.equal(_run(c, lo, hi, 0, N, kernel=kernel), want)


@pytest.mark.parametrize("H", [32, 64])
def test_random_codes_within_fp32_error(rng, H):
    """Full-range random codes (no NaN), random fp32 scales and weights."""
    T, N = 8, 1500
    codes = torch.randint(0, 256, (N, D), generator=rng, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C
    sc = torch.rand(N, generator=rng) + 0.25
    q = torch.randint(0, 256, (T, H, D), generator=rng, dtype=torch.uint8)
    q[(q & 0x7F) == 0x7F] = 0xB8
    w = torch.randn(T, H, generator=rng)
    lo = torch.tensor([0, 0, 100, 700, 0, 3, 1499, 0])
    hi = torch.tensor([1500, 1000, 900, 1500, 1, 1400, 1500, 0])
    out = torch.full((T, N), POISON, dtype=torch.int64, device=DEV)
    OI.indexer_flat_keys(q.to(DEV), w.to(DEV), col0=0, n_cols=N, lo=lo.int().to(DEV),
                         hi=hi.int().to(DEV), out=out, k_codes=codes.to(DEV), k_scale=sc.to(DEV))
    got = I.key_scores(out.cpu()).double()
    qv = q.view(torch.float8_e4m3fn).double()
    kv = codes.view(torch.float8_e4m3fn).double()
    for r in range(T):
        a, b = int(lo[r]), int(hi[r])
        k = kv[a:b]
        s = torch.einsum("hd,nd->hn", qv[r], k)
        ref = (s.clamp(min=0) * w[r].double().unsqueeze(1)).sum(0) * sc[a:b].double()
        bound = (torch.einsum("hd,nd->hn", qv[r].abs(), k.abs()) * w[r].double().abs().unsqueeze(1)).sum(0) \
            * sc[a:b].double()
        err = (got[r, a:b] - ref).abs()
        assert (err <= 1.5e-5 * bound + 1e-30).all(), float((err / bound.clamp(min=1e-30)).max())
        keys = out.cpu()[r]
        assert (keys[:a] == I.INT64_MIN).all() and (keys[b:] == I.INT64_MIN).all()
        if b > a:  # the key's low word is the request-local column
            assert torch.equal(I.keys_to_indices(keys[a:b]).long(), torch.arange(b - a))


def _random_flat(g, *, T, H, N, nan=False):
    """Full-range random codes (NaN codes too if ``nan``), random scales and weights, random
    windows per row (so a block's rows see different columns): an empty row, a row seeing
    everything, rows reaching past the workspace."""
    codes = torch.randint(0, 256, (N, D), generator=g, dtype=torch.uint8)
    q = torch.randint(0, 256, (T, H, D), generator=g, dtype=torch.uint8)
    if not nan:
        codes[(codes & 0x7F) == 0x7F] = 0x3C
        q[(q & 0x7F) == 0x7F] = 0xB8
    sc = torch.rand(N, generator=g) + 0.25
    w = torch.randn(T, H, generator=g)
    lo = torch.randint(0, N // 2, (T,), generator=g)
    hi = (lo + torch.randint(0, N, (T,), generator=g)).clamp(max=N + 40)
    lo[1], hi[1] = 17, 17
    lo[2], hi[2] = 0, N + 40
    return dict(q=q.to(DEV), w=w.to(DEV), k=codes.to(DEV), sc=sc.to(DEV), lo=lo.int().to(DEV),
                hi=hi.int().to(DEV))


def _flat(c, *, kernel, col0=0, n_cols=None, **kw):
    n_cols = c["k"].shape[0] + 50 - col0 if n_cols is None else n_cols
    out = torch.full((c["q"].shape[0], n_cols + 3), POISON, dtype=torch.int64, device=DEV)
    OI.indexer_flat_keys(c["q"], c["w"], col0=col0, n_cols=n_cols, lo=c["lo"], hi=c["hi"], out=out,
                         k_codes=c["k"], k_scale=c["sc"], kernel=kernel, **kw)
    got = out.cpu()
    assert (got[:, n_cols:] == POISON).all(), "wrote past n_cols"
    return got[:, :n_cols]


# Rows per block: 8 by default; at SM86's cap 4 for 64 heads (8 for 32 and 16); at a
# 66,000-byte cap 2 for 64 heads (4 rows' fp16 Q need 66,624 B) and 4 for 32 heads
@pytest.mark.parametrize("kw", [{}, dict(chunk=64), dict(col0=45, n_cols=1111),
                                dict(sm_count=84, smem_cap=SM86_SMEM), dict(smem_cap=66000)])
@pytest.mark.parametrize("H", [16, 32, 64])
def test_rows_kernel_equals_warp_kernel_bit_for_bit(rng, H, kw):
    """Random full-range inputs (NaN codes included), 37 rows (no multiple of a block's rows):
    the kernel whose blocks share K gives the warp kernel's keys exactly."""
    c = _random_flat(rng, T=37, H=H, N=1500, nan=True)
    want = _flat(c, kernel="warp", **kw)
    assert (want != I.INT64_MIN).any()
    assert torch.equal(_flat(c, kernel="rows", **kw), want)
    assert torch.equal(_flat(c, kernel="auto", **kw), want)


_ROWS_SCRIPT = """
import sys, torch
sys.path[:0] = {paths!r}
from deepinfer_sm80.ops import indexer as OI
g = torch.Generator().manual_seed({seed})
out = {{}}
for H in (16, 32, 64):
    T, N = 29, 900
    q = torch.randint(0, 256, (T, H, 128), generator=g, dtype=torch.uint8).cuda()
    k = torch.randint(0, 256, (N, 128), generator=g, dtype=torch.uint8).cuda()
    w = torch.randn(T, H, generator=g).cuda()
    sc = (torch.rand(N, generator=g) + 0.25).cuda()
    lo = torch.randint(0, N // 2, (T,), generator=g, dtype=torch.int32).cuda()
    hi = (lo + torch.randint(0, N, (T,), generator=g, dtype=torch.int32).cuda()).clamp(max=N + 30)
    for kernel in ("warp", "rows"):
        o = torch.full((T, N + 40), 7, dtype=torch.int64, device="cuda")
        OI.indexer_flat_keys(q, w, col0=0, n_cols=N + 40, lo=lo, hi=hi, out=o, k_codes=k,
                             k_scale=sc, kernel=kernel)
        out[(H, kernel)] = o.cpu()
print(all(torch.equal(out[(H, "warp")], out[(H, "rows")]) for H in (16, 32, 64)))
"""


@pytest.mark.parametrize("most", ["2", "4"])
def test_rows_kernel_smaller_blocks(rng, most):
    """$DEEPINFER_INDEXER_ROWS (read once per process) = 2 and 4 rows per block at most (the
    default takes 8 where they fit): still the warp kernel's keys."""
    import os
    import subprocess
    import sys

    seed = int(torch.randint(0, 2**31, (1,), generator=rng))
    script = _ROWS_SCRIPT.format(paths=[p for p in sys.path if p], seed=seed)
    env = dict(os.environ, DEEPINFER_INDEXER_ROWS=most)
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "True", res.stdout


@pytest.mark.parametrize("tile_budget", [None, 4096])
@pytest.mark.parametrize("row_chunk", [7, 256])
def test_prefill_topk_cuda_equals_triton_and_oracle(rng, row_chunk, tile_budget):
    """``prefill_topk`` through the CUDA scorer: the indices the Triton scorer gives, and the
    float64 oracle's top-k set per row (exact inputs: ties broken by the lower column). The
    CUDA top-k reads only each row's window [lo, hi) of each column tile; a small
    ``tile_budget`` makes many tiles (64 columns), merged with the running best."""
    T, H, N, K = 40, 64, 900, 64
    c = _case(rng, T=T, H=H, N=N)
    lo, hi = _causal(T, N, [0, 450], rng)
    q, w = c["qc"].to(DEV), c["w"].float().to(DEV)
    outs = {}
    for scorer in ("cuda", "triton"):
        o = torch.full((T, K + 3), -7, dtype=torch.int32, device=DEV)
        kw = {} if tile_budget is None else dict(tile_budget=tile_budget)
        I.prefill_topk(q, w, c["k_dev"], c["sc_dev"], lo.to(DEV), hi.to(DEV), K, o,
                       row_chunk=row_chunk, scorer=scorer, **kw)
        outs[scorer] = o.cpu()
    assert torch.equal(outs["cuda"], outs["triton"])
    assert (outs["cuda"][:, K:] == -7).all()
    L = IC.logits64(c["qv"], c["w"], c["kv"], c["sc"])
    for t in range(T):
        a, b = int(lo[t]), int(hi[t])
        order = sorted(range(b - a), key=lambda j: (-float(L[t, a + j]), j))[:K]
        got = [int(x) for x in outs["cuda"][t, :K] if x >= 0]
        assert got == order, t


def test_prefill_candidates_through_the_cuda_scorer(rng):
    """V4.1's candidate write and mask (indexer_cases) run through prefill_topk; with 16+
    heads they take the CUDA scorer, and must equal the Triton scorer's result."""
    T, H, N, K, bs = 30, 16, 600, 24, 32
    c = _case(rng, T=T, H=H, N=N)
    lo, hi = _causal(T, N, [0, 300], rng)
    q, w = c["qc"].to(DEV), c["w"].float().to(DEV)
    res = {}
    for scorer in ("cuda", "triton"):
        blocks = torch.full((T, 4), -5, dtype=torch.int32, device=DEV)
        o = torch.full((T, K), -7, dtype=torch.int32, device=DEV)
        I.prefill_topk(q, w, c["k_dev"], c["sc_dev"], lo.to(DEV), hi.to(DEV), K, o, scorer=scorer,
                       candidates=I.CandidateStep(blocks, bs, write=True))
        o2 = torch.full((T, K), -7, dtype=torch.int32, device=DEV)
        I.prefill_topk(q, w, c["k_dev"], c["sc_dev"], lo.to(DEV), hi.to(DEV), K, o2, scorer=scorer,
                       candidates=I.CandidateStep(blocks, bs, write=False))
        res[scorer] = (blocks.cpu(), o.cpu(), o2.cpu())
    for a, b in zip(res["cuda"], res["triton"]):
        assert torch.equal(a, b)


def test_bad_arguments_raise():
    q = torch.zeros(2, 16, D, dtype=torch.uint8, device=DEV)
    w = torch.zeros(2, 16, device=DEV)
    args = dict(col0=0, n_cols=64, lo=torch.zeros(2, dtype=torch.int32, device=DEV),
                hi=torch.zeros(2, dtype=torch.int32, device=DEV),
                out=torch.empty(2, 64, dtype=torch.int64, device=DEV),
                k_codes=torch.zeros(64, D, dtype=torch.uint8, device=DEV),
                k_scale=torch.ones(64, device=DEV))
    with pytest.raises(ValueError, match="heads"):
        OI.indexer_flat_keys(torch.zeros(2, 8, D, dtype=torch.uint8, device=DEV),
                             torch.zeros(2, 8, device=DEV), **args)
    with pytest.raises(ValueError, match="k_codes"):
        OI.indexer_flat_keys(q, w, **dict(args, k_codes=torch.zeros(64, 2 * D, dtype=torch.uint8,
                                                                    device=DEV)[:, ::2]))
    with pytest.raises(ValueError, match="k_scale"):
        OI.indexer_flat_keys(q, w, **dict(args, k_scale=torch.ones(10, device=DEV)))
    with pytest.raises(TypeError, match="k_codes"):
        OI.indexer_flat_keys(q, w, **dict(args, k_codes=torch.zeros(64, D, device=DEV)))
    with pytest.raises(ValueError, match="chunk"):
        OI.indexer_flat_keys(q, w, chunk=96, **args)
    with pytest.raises(RuntimeError, match="16-byte"):  # 136-byte rows: not 16-byte aligned
        OI.indexer_flat_keys(q, w, **dict(args, k_codes=torch.zeros(64, 136, dtype=torch.uint8,
                                                                    device=DEV)[:, :D]))
    with pytest.raises(ValueError, match="scorer='cuda'"):
        I.prefill_topk(torch.zeros(2, 8, D, dtype=torch.uint8, device=DEV), torch.zeros(2, 8, device=DEV),
                       args["k_codes"], args["k_scale"], args["lo"], args["hi"], 4,
                       torch.empty(2, 4, dtype=torch.int32, device=DEV), scorer="cuda")
