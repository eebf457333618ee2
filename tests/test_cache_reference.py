"""CPU checks of the KV-cache references (deepinfer_sm80.reference.cache) on hand-worked
records: byte placement in a padded page, scales, -1 slots, gather_lens/offset, strided
block tables, untouched rows."""
import pytest

torch = pytest.importorskip("torch")

from deepinfer_sm80.reference import cache as RC  # noqa: E402

BS = 4
STRIDE = (BS * 584 + 575) // 576 * 576  # 2880: page padded to a multiple of 576


def _cache(nb=3, fill=0xAA):
    return torch.full((nb, STRIDE), fill, dtype=torch.uint8)


def _row(vals):
    k = torch.zeros(512, dtype=torch.bfloat16)
    for i, v in vals.items():
        k[i] = v
    return k


def test_insert_hand_worked_record():
    k = _row({0: 3.0, 1: -1.0, 64: 0.5, 448: 1.5, 511: -2.0}).reshape(1, 512)
    kc = _cache()
    RC.quantize_and_insert_k_cache(k, kc, torch.tensor([BS + 2]), BS)  # block 1, slot 2
    data = kc[1, 2 * 576: 3 * 576]
    scales = kc[1, BS * 576 + 2 * 8: BS * 576 + 3 * 8]
    # group 0: absmax 3 -> e = -7 (byte 120): 3*128 = 384 -> 0x7C, -128 -> 0xF0
    # group 1: absmax 0.5 -> e = ceil(log2(0.5/448)) = -9 (byte 118): 0.5*512 = 256 -> 0x78
    # groups 2..6: absmax floored at 1e-4 -> byte 105, codes 0
    assert data[0].item() == 0x7C and data[1].item() == 0xF0 and data[64].item() == 0x78
    assert int(data[2:64].sum()) == 0 and int(data[65:448].sum()) == 0
    assert scales.tolist() == [120, 118, 105, 105, 105, 105, 105, 0]
    rope = data[448:].view(torch.bfloat16)
    assert rope[0].item() == 1.5 and rope[63].item() == -2.0 and int((rope != 0).sum()) == 2
    # everything else untouched
    touched = torch.zeros_like(kc, dtype=torch.bool)
    touched[1, 2 * 576: 3 * 576] = True
    touched[1, BS * 576 + 16: BS * 576 + 24] = True
    assert bool((kc[~touched] == 0xAA).all())


def test_insert_skips_negative_and_out_of_range_slots():
    k = (torch.randn(3, 512) * 4).bfloat16()
    kc = _cache()
    before = kc.clone()
    RC.quantize_and_insert_k_cache(k, kc, torch.tensor([-1, 3 * BS, -5]), BS)
    assert torch.equal(kc, before)
    # only slot_mapping.shape[0] rows are processed (DP padding)
    RC.quantize_and_insert_k_cache(k, kc, torch.tensor([0]), BS)
    assert not torch.equal(kc[0, :576], before[0, :576])
    assert torch.equal(kc[0, 576:BS * 576], before[0, 576:BS * 576])


def test_insert_gather_round_trip_and_placement():
    g = torch.Generator().manual_seed(7)
    T = 10
    k = (torch.randn(T, 512, generator=g) * torch.logspace(-3, 2, T)[:, None]).bfloat16()
    kc = _cache(nb=4)
    phys = [2, 0, 3]  # logical block j -> physical
    slots = torch.tensor([phys[t // BS] * BS + t % BS for t in range(T)])
    RC.quantize_and_insert_k_cache(k, kc, slots, BS)
    out = torch.full((2, 16, 512), float("nan"), dtype=torch.bfloat16)
    table = torch.tensor([[9, 9, 9, 9], [9, 9, 9, 9]], dtype=torch.int32)
    table[1, :3] = torch.tensor(phys)
    seq = torch.tensor([0, T], dtype=torch.int32)
    RC.dequantize_and_gather_k_cache(out, kc, seq, None, table, BS, 3)
    assert torch.isnan(out[0].float()).all()  # seq_len 0: nothing written
    got = out[1, 3:3 + T].float()
    assert torch.isnan(out[1, :3].float()).all() and torch.isnan(out[1, 3 + T:].float()).all()
    ref = k.float()
    assert torch.equal(out[1, 3:3 + T, 448:], k[:, 448:])  # RoPE copied bit for bit
    # NoPE error within half an e4m3 ulp of the group scale (<= absmax / 16)
    for grp in range(7):
        sl = slice(64 * grp, 64 * grp + 64)
        amax = ref[:, sl].abs().amax(dim=1, keepdim=True)
        assert bool(((got[:, sl] - ref[:, sl]).abs() <= amax / 16 + 1e-30).all())


def test_gather_lens_offset_and_strided_block_table():
    g = torch.Generator().manual_seed(3)
    k = (torch.randn(12, 512, generator=g) * 2).bfloat16()
    kc = _cache(nb=3)
    RC.quantize_and_insert_k_cache(k, kc, torch.arange(12), BS)  # identity placement
    full = torch.empty((1, 12, 512), dtype=torch.bfloat16)
    ident = torch.arange(3, dtype=torch.int32).reshape(1, 3)
    RC.dequantize_and_gather_k_cache(full, kc, torch.tensor([12], dtype=torch.int32), None,
                                     ident, BS, 0)
    # strided table: every other column of a wider table
    wide = torch.full((1, 6), 99, dtype=torch.int32)
    wide[0, ::2] = torch.arange(3, dtype=torch.int32)
    strided = wide[:, ::2]
    assert strided.stride() == (6, 2)
    out = torch.full((1, 8, 512), -7.0, dtype=torch.bfloat16)
    # seq_len 11, gather the last 5: positions 6..10 -> out rows 2..6
    RC.dequantize_and_gather_k_cache(out, kc, torch.tensor([11], dtype=torch.int32),
                                     torch.tensor([5], dtype=torch.int32), strided, BS, 2)
    assert torch.equal(out[0, 2:7], full[0, 6:11])
    assert bool((out[0, :2] == -7).all()) and bool((out[0, 7:] == -7).all())


def test_gather_skips_out_of_range_rows_and_blocks():
    k = torch.ones(4, 512).bfloat16()
    kc = _cache(nb=2)
    RC.quantize_and_insert_k_cache(k, kc, torch.arange(4), BS)
    out = torch.full((1, 3, 512), -7.0, dtype=torch.bfloat16)
    table = torch.tensor([[0, 5]], dtype=torch.int32)  # block 5 does not exist
    RC.dequantize_and_gather_k_cache(out, kc, torch.tensor([6], dtype=torch.int32), None,
                                     table, BS, 0)
    # rows 0..2 (positions 0..2) in range; positions 3.. exceed out rows
    assert bool((out[0] == 1).all())
    out = torch.full((1, 8, 512), -7.0, dtype=torch.bfloat16)
    RC.dequantize_and_gather_k_cache(out, kc, torch.tensor([6], dtype=torch.int32), None,
                                     table, BS, 0)
    assert bool((out[0, :4] == 1).all()) and bool((out[0, 4:] == -7).all())
