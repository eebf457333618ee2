"""Runs the SM80 Triton writers in Triton's CPU interpreter against the torch
references and prints one JSON line of results.  Started by
tests/test_writers_reference.py in a subprocess with TRITON_INTERPRET=1 (the
flag must be set before the kernels are defined)."""

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "overlay"))
sys.path.insert(0, HERE)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from deepinfer_sm80.reference import writers as R  # noqa: E402
from deepinfer_sm80.triton_writers.fp8 import (  # noqa: E402
    bf16_rne, e4m3_decode, e4m3_encode, ue8m0_from_scale)
from deepinfer_sm80.triton_writers.indexer_q import indexer_q_rope_quant  # noqa: E402
from writer_cases import call_sm80_store, compare_fp8_bytes, make_compressor_case  # noqa: E402


@triton.jit
def _enc(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    m = o < n
    tl.store(y + o, e4m3_encode(tl.load(x + o, mask=m, other=0.0)), mask=m)


@triton.jit
def _dec(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    m = o < n
    tl.store(y + o, e4m3_decode(tl.load(x + o, mask=m, other=0)), mask=m)


@triton.jit
def _ue(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    m = o < n
    ue, _ = ue8m0_from_scale(tl.load(x + o, mask=m, other=1.0))
    tl.store(y + o, ue, mask=m)


@triton.jit
def _bf(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    m = o < n
    tl.store(y + o, bf16_rne(tl.load(x + o, mask=m, other=0.0)), mask=m)


def codec_inputs():
    tab = R.e4m3_decode_table()
    fin = tab[~tab.isnan()].float()
    vals = torch.sort(fin.unique())[0]
    mids = (vals[1:] + vals[:-1]) / 2
    g = torch.Generator().manual_seed(1)
    x = torch.cat([fin, mids, torch.randn(20000, generator=g) * 100,
                   torch.randn(4000, generator=g) * 1e-3,
                   torch.tensor([float("inf"), -float("inf"), 500.0, -460.0, 464.0, -464.0,
                                 1e-30, -0.0, 0.0, 2.0**-10, 3 * 2.0**-10])]).float()
    up = torch.nextafter(x, torch.full_like(x, 1e9))
    dn = torch.nextafter(x, torch.full_like(x, -1e9))
    return torch.cat([x, up, dn, torch.tensor([float("nan")])])


def run_codecs(res):
    x = codec_inputs()
    y = torch.empty(x.numel(), dtype=torch.uint8)
    _enc[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), B=1024)
    ref = R.e4m3_encode_ref(x)
    res["encode_mismatch"] = int((y != ref).sum())
    res["encode_count"] = x.numel()
    codes = torch.arange(256, dtype=torch.uint8)
    d = torch.empty(256)
    _dec[(1,)](codes, d, 256, B=256)
    tab = R.e4m3_decode_table()
    finite = ~tab.isnan()
    res["decode_mismatch"] = int((d.double()[finite] != tab[finite]).sum()
                                 + (torch.signbit(d[finite]) != torch.signbit(tab[finite])).sum()
                                 + (~d[~finite].isnan()).sum())
    g = torch.Generator().manual_seed(2)
    s = torch.cat([torch.pow(2.0, torch.arange(-20, 20).float()),
                   torch.rand(5000, generator=g) * 10,
                   torch.rand(5000, generator=g) * 1e-3 + 1e-4]).float()
    s = torch.cat([s, torch.nextafter(s, torch.full_like(s, 1e9)),
                   torch.nextafter(s, torch.zeros_like(s))])
    ue = torch.empty(s.numel(), dtype=torch.int32)
    _ue[(triton.cdiv(s.numel(), 1024),)](s, ue, s.numel(), B=1024)
    res["ue8m0_mismatch"] = int((ue.long() != R.ue8m0_exponent_ref(s)).sum())
    xb = torch.randn(50000, generator=g) * 3
    yb = torch.empty_like(xb)
    _bf[(triton.cdiv(xb.numel(), 1024),)](xb, yb, xb.numel(), B=1024)
    res["bf16_mismatch"] = int((yb != xb.bfloat16().float()).sum())


def run_store(res, name, ratio, head, seq_lens, first_pos=None):
    case = make_compressor_case(ratio, head, seq_lens, seed=ratio + head, first_pos=first_pos)
    ref_fn = R.compressor_store_ref if head == 512 else R.indexer_store_ref
    want = ref_fn(**case.args)
    want = want[0] if head == 512 else want
    call_sm80_store(case)
    res[name] = compare_fp8_bytes(case.raw, want, case)


def run_index_q(res):
    g = torch.Generator().manual_seed(3)
    T, H, D = 7, 8, 128
    q = (torch.randn(T, H, D, generator=g) * 2).to(torch.bfloat16)
    q[0, 0] *= 1e-5  # a head whose amax is below the 1e-4 floor
    pos = torch.randint(0, 4000, (T,), generator=g)
    cs = torch.randn(4096, 64, generator=g)
    w = torch.randn(T, H, generator=g).to(torch.bfloat16)
    got_q, got_w = indexer_q_rope_quant(pos, q, cs, w, D**-0.5, H**-0.5)
    codes, w_ref, _ = R.indexer_q_ref(pos, q, cs, w, D**-0.5, H**-0.5)
    gq = got_q.view(torch.uint8)
    res["index_q"] = {
        "codes_exact": float((gq == codes).float().mean()),
        "weights_exact": bool(torch.equal(got_w, w_ref)),
    }


def run_indexer_fused(res):
    """The fused Triton indexer scorer (prefill flat + decode paged) on
    dyadic data whose fp32 scores are exact: top-k sets equal the oracle's."""
    from deepinfer_sm80.ampere import indexer as I
    from indexer_cases import dyadic_fp8, dyadic_weights, k_scales, logits64

    g = torch.Generator().manual_seed(4)
    T, H, D, N, K = 6, 64, 128, 150, 32
    qc, q64 = dyadic_fp8((T, H, D), g)
    kc, k64 = dyadic_fp8((N, D), g)
    w64 = dyadic_weights((T, H), g)
    ks64 = k_scales(N, g)
    ks = torch.tensor([0, 0, 0, 70, 70, 70])
    ke = torch.tensor([20, 45, 70, 100, 130, 150])
    out = torch.full((T, K), -7, dtype=torch.int32)
    I.prefill_topk(qc, w64.float(), kc, ks64.float(), ks, ke, K, out, scorer="triton",
                   tile_budget=64 * 8 * T)
    L = logits64(q64, w64, k64, ks64)
    cols = torch.arange(N).unsqueeze(0)
    valid = (cols >= ks.unsqueeze(1)) & (cols < ke.unsqueeze(1))
    want = I.reference_topk_sets(L, valid, K)
    ok = all({j + int(ks[t]) for j in out[t].tolist() if j >= 0} == want[t] for t in range(T))
    ok &= all(sum(j >= 0 for j in out[t].tolist()) == min(K, int(valid[t].sum()))
              for t in range(T))
    res["indexer_fused_prefill_sets_equal"] = bool(ok)
    # decode, paged, 2 requests x next_n 2, padded page stride
    B, NN, bs, nb = 2, 2, 16, 9
    codes, vals = dyadic_fp8((nb, bs, D), g)
    sc = k_scales(nb * bs, g).view(nb, bs)
    stride = bs * 132 + 64
    raw = torch.zeros(nb, stride, dtype=torch.uint8)
    raw[:, : bs * D] = codes.view(nb, -1)
    raw[:, bs * D: bs * 132] = sc.float().contiguous().view(torch.uint8).view(nb, -1)
    pages = raw.as_strided((nb, bs, 132), (stride, 132, 1))
    bt = torch.tensor([[3, 7, 1, 0], [5, 2, 8, -1]], dtype=torch.int32)
    ctx = torch.tensor([[50, 51], [30, 31]], dtype=torch.int32)
    qd, qd64 = dyadic_fp8((B, NN, H, D), g)
    wd64 = dyadic_weights((B * NN, H), g)
    outd = torch.full((B * NN, K), -7, dtype=torch.int32)
    I.decode_topk(qd, wd64.float(), pages, ctx, bt, bs, K, outd, scorer="triton",
                  pages_per_tile=1)
    ok = True
    for b in range(B):
        kv = torch.cat([vals[int(p)] if p >= 0 else torch.zeros(bs, D, dtype=torch.float64)
                        for p in bt[b]])
        kscale = torch.cat([sc[int(p)] if p >= 0 else torch.ones(bs, dtype=torch.float64)
                            for p in bt[b]])
        Ld = logits64(qd64[b], wd64[b * NN:(b + 1) * NN], kv, kscale)
        vd = torch.arange(kv.shape[0]).unsqueeze(0) < ctx[b].unsqueeze(1)
        wantd = I.reference_topk_sets(Ld, vd, K)
        for i in range(NN):
            ok &= {j for j in outd[b * NN + i].tolist() if j >= 0} == wantd[i]
    res["indexer_fused_decode_sets_equal"] = bool(ok)


def run_inverse_rope(res):
    from deepinfer_sm80.ampere import o_proj as O

    g = torch.Generator().manual_seed(9)
    T, Hp, H, D = 5, 16, 8, 512
    o_pad = torch.randn(T, Hp, D, generator=g).to(torch.bfloat16)
    o = o_pad[:, :H]  # the live heads of the padded buffer (strided)
    pos = torch.randint(0, 100, (T,), generator=g)
    cs = torch.randn(100, 64, generator=g)
    out = torch.empty(T, H * D, dtype=torch.bfloat16)
    O._triton_inverse_rope()[(T, H)](o, o.stride(0), o.stride(1), pos, cs, cs.stride(0), out,
                                     out.stride(0), H, D=D, NOPE=448, HALF=32)
    ref = O.inverse_rope_bf16(o, pos, cs, 448).reshape(T, H * D)
    res["inverse_rope_equal"] = bool(torch.equal(out, ref))


def main():
    res = {}
    run_inverse_rope(res)
    run_indexer_fused(res)
    run_codecs(res)
    run_store(res, "c4", 4, 512, [3, 21, 45], first_pos=[0, 0, 9])
    run_store(res, "c128", 128, 512, [256, 130])
    run_store(res, "indexer_c4", 4, 128, [3, 21, 45], first_pos=[0, 0, 9])
    run_index_q(res)
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
