"""CPU tests of the oracles that tests/vllm_marlin_check.py judges vLLM's Marlin path with
(the GPU side: tests/gpu/test_vllm_c_marlin_sm80.py): the e4m3 and e2m1 decoders over every
code, the random-code generator, the SwiGLU-with-clamp reference, and the
moe_align_block_size contract check, which must flag each kind of broken alignment."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import vllm_marlin_check as check  # noqa: E402


def test_e4m3_decoder_over_all_256_codes():
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    ours = check.e4m3_to_float(codes)
    torch_says = codes.view(torch.float8_e4m3fn).double()
    nan = torch_says.isnan()
    assert nan.sum() == 2 and not ours[~nan].isnan().any()
    assert torch.equal(ours[~nan], torch_says[~nan])
    assert ours[0x7E] == 448 and ours[0x01] == 2.0 ** -9 and ours[0x80] == 0


def test_e2m1_decoder_over_all_256_packed_bytes():
    def one(nibble):  # sign | 2 exponent bits (bias 1) | 1 mantissa bit; exponent 0: subnormal
        s, e, m = nibble >> 3, (nibble >> 1) & 3, nibble & 1
        v = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
        return -v if s else v

    packed = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(256, 1)
    ours = check.e2m1_to_float(packed, 2)
    want = torch.tensor([[one(b & 0xF), one(b >> 4)] for b in range(256)], dtype=torch.float64)
    assert torch.equal(ours, want)


def test_random_codes_cover_every_code_but_nan():
    g = torch.Generator().manual_seed(0)
    seen = set(check.random_codes(g, 64, 1024).flatten().tolist())
    assert 0x7F not in seen and 0xFF not in seen and len(seen) == 254


def test_silu_clamp_reference():
    x = torch.tensor([[20.0, -1.0, 20.0, 30.0], [0.0, 1.0, 2.0, -30.0]])
    out = check.silu_clamp_reference(x, 10.0)
    silu = lambda v: v / (1 + torch.exp(torch.tensor(-v)))  # noqa: E731
    want = torch.tensor([[silu(10.0) * 10.0, silu(-1.0) * 10.0],
                         [silu(0.0) * 2.0, silu(1.0) * -10.0]])
    assert torch.allclose(out, want)


def _aligned(topk_ids, num_experts, block):
    """A correct alignment, built the plain way: rows grouped by expert, padded."""
    flat = topk_ids.flatten()
    ids, experts = [], []
    for e in range(num_experts):
        rows = torch.nonzero(flat == e).flatten().tolist()
        if not rows:
            continue
        pad = -len(rows) % block
        ids += rows[::-1] + [flat.numel()] * pad  # any order inside a group is allowed
        experts += [e] * ((len(rows) + pad) // block)
    return (torch.tensor(ids + [flat.numel()] * 7, dtype=torch.int32),
            torch.tensor(experts + [-1] * 3, dtype=torch.int32),
            torch.tensor([len(ids)], dtype=torch.int32))


def test_moe_alignment_check_accepts_a_correct_one_and_flags_each_fault():
    g = torch.Generator().manual_seed(1)
    e, block = 8, 4
    topk = torch.stack([torch.randperm(e, generator=g)[:3] for _ in range(11)])
    sid, eid, tot = _aligned(topk, e, block)
    assert check.check_moe_alignment(topk, e, block, sid, eid, tot) == []

    second = int((eid == eid[0]).sum()) * block  # where the second expert's rows start
    swapped = sid.clone()
    swapped[0], swapped[second] = sid[second].item(), sid[0].item()  # rows of two experts
    assert check.check_moe_alignment(topk, e, block, swapped, eid, tot)
    bad_pad = sid.clone()
    bad_pad[bad_pad == topk.numel()] = 0
    assert check.check_moe_alignment(topk, e, block, bad_pad, eid, tot)
    bad_expert = eid.clone()
    bad_expert[0] = (bad_expert[0] + 1) % e
    assert check.check_moe_alignment(topk, e, block, sid, bad_expert, tot)
    assert check.check_moe_alignment(topk, e, block, sid, eid, tot + block)
