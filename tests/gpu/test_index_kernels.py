"""GPU tests of the index kernels, bit-exact against deepinfer_sm80.reference.index on
fresh random inputs (outputs poisoned first; combine's -1 fill is the kernel's own)."""
import os

import pytest

torch = pytest.importorskip("torch")

from deepinfer_sm80.ops import index as OI  # noqa: E402
from deepinfer_sm80.reference import index as RI  # noqa: E402

DEV = "cuda"


def _gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return torch.Generator().manual_seed(seed)


def _i32(*shape, lo, hi, g):
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int32)


# ------------------------------------------------------------- global top-k indices
@pytest.mark.parametrize("T,K,bs", [(1, 512, 64), (1001, 512, 64), (333, 130, 2), (77, 2048, 1)])
def test_global_topk_bit_exact(ext, T, K, bs):
    g = _gen()
    R, maxb = 5, 300
    wide = _i32(R, 2 * maxb, lo=0, hi=2**20, g=g)
    table = wide[:, ::2]  # non-contiguous block table (the reference's CPU view)
    table_dev = wide.to(DEV)[:, ::2]  # the same view made on the device
    assert table_dev.stride() == (2 * maxb, 2)
    topk = _i32(T, K, lo=-1, hi=maxb * bs, g=g)
    topk[torch.rand(T, K, generator=g) < 0.2] = -1
    topk[0, :] = -1 if T > 1 else topk[0, :]
    req = _i32(T, lo=0, hi=R, g=g)
    valid = torch.rand(T, generator=g) < 0.8
    want_idx, want_lens = RI.compute_global_topk_indices_and_lens(topk, req, table, bs, valid)
    got_idx, got_lens = OI.compute_global_topk_indices_and_lens(
        topk.to(DEV), req.to(DEV), table_dev, bs, valid.to(DEV))
    assert torch.equal(got_idx.cpu(), want_idx)
    assert torch.equal(got_lens.cpu(), want_lens)


def test_global_topk_wrap_guards_and_strided_input(ext):
    g = _gen()
    T, K, bs = 50, 64, 256
    table = torch.full((2, 4), 2**24, dtype=torch.int32)  # 2^24 * 256 wraps int32
    table[1] = _i32(4, lo=0, hi=100, g=g)
    src = _i32(T, 2 * K, lo=-1, hi=6 * bs, g=g)  # some columns beyond the table (>= 4 * bs)
    topk = src[:, ::2]  # strided last dim: the wrapper makes it contiguous
    req = _i32(T, lo=-1, hi=3, g=g)  # -1 and 2 are out of range
    valid = torch.ones(T, dtype=torch.bool)
    want = RI.compute_global_topk_indices_and_lens(topk, req, table, bs, valid)
    got = OI.compute_global_topk_indices_and_lens(topk.to(DEV), req.to(DEV), table.to(DEV), bs,
                                                  valid.to(DEV))
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


def test_global_topk_empty(ext):
    e = torch.empty(0, 512, dtype=torch.int32, device=DEV)
    idx, lens = OI.compute_global_topk_indices_and_lens(
        e, torch.empty(0, dtype=torch.int32, device=DEV),
        torch.zeros(1, 4, dtype=torch.int32, device=DEV), 64,
        torch.empty(0, dtype=torch.bool, device=DEV))
    assert idx.shape == (0, 512) and lens.shape == (0,)


# ------------------------------------------------------------- combine top-k + SWA
def _requests(T_used, R, g, min_prefix=0):
    cuts = torch.sort(torch.randperm(T_used - 1, generator=g)[: R - 1] + 1).values
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([T_used])])
    qlen = bounds[1:] - bounds[:-1]
    prefix = torch.randint(min_prefix, 5000, (R,), generator=g)
    seq = (qlen + prefix).to(torch.int32)
    # SWA gather: qlen + min(prefix, W - 1) like sparse_swa.py; clamp to seq
    return bounds.to(torch.int32), seq, qlen


def _check_combine(ext, topk, qsl, seq, gat, W, ratio, top_k, M, N, left=None, right=None,
                   img=0, use_out=True, g=None, width=None, v41=False):
    T = topk.size(0)
    if use_out:
        w = width or RI.combined_width(top_k, W, img)
        poison = torch.randint(-2**31, 2**31 - 1, (T, w), generator=g, dtype=torch.int64).to(torch.int32)
        lens_p = torch.randint(-2**31, 2**31 - 1, (T,), generator=g, dtype=torch.int64).to(torch.int32)
        want = RI.combine_topk_swa_indices(topk, qsl, seq, gat, W, ratio, top_k, M, N,
                                           out=(poison.clone(), lens_p.clone()),
                                           left_visible=left, right_visible=right,
                                           max_image_tokens=img, v41=v41)
        out = (poison.to(DEV), lens_p.to(DEV))
    else:
        want = RI.combine_topk_swa_indices(topk, qsl, seq, gat, W, ratio, top_k, M, N,
                                           left_visible=left, right_visible=right,
                                           max_image_tokens=img, v41=v41)
        out = None
    d = (lambda t: None if t is None else t.to(DEV))
    got = OI.combine_topk_swa_indices(d(topk), d(qsl), d(seq), d(gat), W, ratio, top_k, M, N,
                                      out=out, left_visible=d(left), right_visible=d(right),
                                      max_image_tokens=img, **({"v41": True} if v41 else {}))
    assert torch.equal(got[0].cpu(), want[0])
    if use_out:
        assert torch.equal(got[1].cpu(), want[1])
    else:  # lens of rows outside every request are unspecified (torch.empty upstream)
        covered = int(qsl[-1] - qsl[0])
        assert torch.equal(got[1].cpu()[:covered], want[1][:covered])


@pytest.mark.parametrize("T,R,ratio,top_k", [(1, 1, 4, 512), (777, 3, 4, 512),
                                             (1537, 2, 128, 384), (4099, 5, 1, 0),
                                             (1536, 1, 4, 512), (2050, 1, 3, 512),
                                             (900, 2, 7, 256),
                                             # V4-Pro's top-k 1024 and a 2048: rows wider
                                             # than the 1024 columns held in registers
                                             (600, 2, 4, 1024), (130, 1, 4, 2048)])
def test_combine_bit_exact(ext, T, R, ratio, top_k):
    g = _gen()
    W = 128
    T_used = T - (T // 10)  # trailing rows belong to no request
    T_used = max(T_used, R)
    qsl0, seq, qlen = _requests(T_used, R, g)
    base = 1000
    qsl = qsl0 + base  # rebased by the kernel
    gat = torch.minimum(qlen.to(torch.int32) + W - 1, seq)
    width_topk = max(top_k, 8)
    topk = _i32(T, width_topk, lo=0, hi=2**20, g=g)
    _check_combine(ext, topk, qsl, seq, gat, W, ratio, top_k, 40000, 20000, g=g)
    _check_combine(ext, topk, qsl, seq, gat, W, ratio, top_k, 40000, 20000, g=g, use_out=False)


@pytest.mark.parametrize("R", [3, 1])  # 1: the one-request kernel
def test_combine_image_visibility(ext, R):
    g = _gen()
    T, W, img = 1000, 128, 576
    qsl, seq, qlen = _requests(T, R, g)
    gat = torch.minimum(qlen.to(torch.int32) + W - 1 + img, seq)
    topk = _i32(T, 512, lo=0, hi=2**16, g=g)
    left = _i32(T, lo=0, hi=W + img, g=g)
    right = _i32(T, lo=0, hi=img // 2, g=g)
    left[torch.rand(T, generator=g) < 0.5] = 0
    right[torch.rand(T, generator=g) < 0.5] = 0
    _check_combine(ext, topk, qsl, seq, gat, W, 4, 512, 123457, 5000, left, right, img, g=g)


def test_combine_unaligned_width_and_scalar_path(ext):
    g = _gen()
    T, R = 301, 2
    qsl, seq, qlen = _requests(T, R, g)
    gat = seq.clone()
    topk = _i32(T, 130, lo=0, hi=2**16, g=g)  # 130 columns: not a multiple of 4
    # caller-provided output narrower than the default and with an odd width
    _check_combine(ext, topk, qsl, seq, gat, 64, 4, 130, 7, 3, g=g, width=197)


def test_combine_small_sequences(ext):
    g = _gen()
    # seq_len 1 and query of a single token, gather_len = seq_len
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    seq = torch.tensor([1, 1], dtype=torch.int32)
    gat = torch.tensor([1, 1], dtype=torch.int32)
    topk = _i32(4, 512, lo=0, hi=100, g=g)
    _check_combine(ext, topk, qsl, seq, gat, 128, 4, 512, 1000, 500, g=g)


def _replay_gather(seq, qlen, W, g):
    """vLLM's prefill gather lengths with SWA bounded replay (sparse_swa.py
    ComputePrefillMetadataKernel): qlen + min(max(prefix - replay_start, 0), W - 1), replay
    starts drawn in [0, prefix] (a prefix-cache hit's last window recomputed), some 0."""
    prefix = seq.to(torch.int64) - qlen
    rs = (torch.rand(prefix.shape, generator=g) * (prefix + 1)).to(torch.int64)
    rs[torch.rand(prefix.shape, generator=g) < 0.3] = 0
    return (qlen + torch.clamp(prefix - rs, min=0).clamp(max=W - 1)).to(torch.int32)


@pytest.mark.parametrize("T,R,ratio,top_k", [(777, 3, 4, 512), (1536, 1, 2, 512),
                                             (900, 5, 1, 512), (700, 4, 0, 0),
                                             (600, 2, 2, 1024)])
def test_combine_v41_bit_exact(ext, T, R, ratio, top_k):
    """DeepSeek-V4.1's combine (v41=True): gather lengths after prefix-cache hits (the window
    clamped to the gathered buffer), top-k lists with -1 holes and entries >= N (kept -1),
    ratio 0 (an SWA-only layer); the one-request kernel (R = 1) and the general one."""
    g = _gen()
    W = 128
    T_used = max(T - T // 10, R)
    qsl0, seq, qlen = _requests(T_used, R, g)
    qsl = qsl0 + 77
    gat = _replay_gather(seq, qlen, W, g)
    N = 3000
    topk = _i32(T, max(top_k, 8), lo=-1, hi=N + 200, g=g)  # some >= N
    topk[torch.rand(topk.shape, generator=g) < 0.1] = -1
    _check_combine(ext, topk, qsl, seq, gat, W, ratio, top_k, 40000, N, g=g, v41=True)
    _check_combine(ext, topk, qsl, seq, gat, W, ratio, top_k, 40000, N, g=g, v41=True,
                   use_out=False)


@pytest.mark.parametrize("v41", [False, True])
def test_combine_rows_before_their_context(ext, v41):
    """Rows whose position is negative (seq_len < query_len: vLLM's warm-up batches): k from
    int32 division (toward zero), lengths as the kernels define them; the scalar path too."""
    g = _gen()
    qsl = torch.tensor([0, 40, 100, 101], dtype=torch.int32)
    seq = torch.tensor([10, 70, 0], dtype=torch.int32)
    gat = torch.tensor([40, 60, 1], dtype=torch.int32)
    topk = _i32(101, 512, lo=0, hi=100, g=g)
    _check_combine(ext, topk, qsl, seq, gat, 128, 4, 512, 1000, 500, g=g, v41=v41)
    _check_combine(ext, topk[:, :130].contiguous(), qsl, seq, gat, 64, 3, 130, 1000, 500, g=g,
                   v41=v41, width=197)


def test_combine_validation(ext):
    t = torch.zeros(4, 16, dtype=torch.int32, device=DEV)
    q = torch.tensor([0, 4], dtype=torch.int32, device=DEV)
    s = torch.tensor([4], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="topk=512"):
        OI.combine_topk_swa_indices(t, q, s, s, 128, 4, 512, 0, 0)
    with pytest.raises(ValueError, match="together"):
        OI.combine_topk_swa_indices(t, q, s, s, 128, 4, 16, 0, 0, left_visible=s)
    with pytest.raises(TypeError, match="seq_lens must be torch.int32"):
        OI.combine_topk_swa_indices(t, q, s.long(), s, 128, 4, 16, 0, 0)
    with pytest.raises(ValueError, match="no image visibility"):
        OI.combine_topk_swa_indices(t, q, s, s, 128, 4, 16, 0, 0, max_image_tokens=64, v41=True)
    with pytest.raises(ValueError, match="compress_ratio must be >= 1"):
        OI.combine_topk_swa_indices(t, q, s, s, 128, 0, 16, 0, 0)
    with pytest.raises(RuntimeError, match="no image visibility"):  # the op's own check
        torch.ops.deepinfer_sm80.combine_topk_swa_indices(
            torch.empty(4, 256, dtype=torch.int32, device=DEV), s.new_empty(4), t, q, s, s, 128,
            4, 16, 0, 0, s.new_zeros(4), s.new_zeros(4), 64, 0, True)
