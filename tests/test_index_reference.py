"""CPU checks of the index-op references (deepinfer_sm80.reference.index) on hand-worked
cases."""
import pytest

torch = pytest.importorskip("torch")

from deepinfer_sm80.reference import index as RI  # noqa: E402


def test_global_topk_hand_worked():
    topk = torch.tensor([[0, 5, -1, 9], [3, -1, -1, 4], [1, 2, 3, 4]], dtype=torch.int32)
    req = torch.tensor([0, 1, 1], dtype=torch.int32)
    table = torch.tensor([[7, 3, 11], [5, 9, 2]], dtype=torch.int32)
    valid = torch.tensor([True, True, False])
    g, lens = RI.compute_global_topk_indices_and_lens(topk, req, table, 4, valid)
    # bs=4: l -> table[req, l//4]*4 + l%4
    assert g.tolist() == [[28, 13, -1, 45], [23, -1, -1, 36], [21, 22, 23, 36]]
    assert lens.tolist() == [3, 2, 0]


def test_global_topk_counts_whole_row_and_guards():
    topk = torch.tensor([[-1, 2, -1, 100]], dtype=torch.int32)  # 100 // 4 = 25: no column
    g, lens = RI.compute_global_topk_indices_and_lens(
        topk, torch.tensor([0], dtype=torch.int32), torch.tensor([[1, 2]], dtype=torch.int32),
        4, torch.tensor([True]))
    assert g.tolist() == [[-1, 6, -1, -1]] and lens.tolist() == [2]


def test_combine_width():
    assert RI.combined_width(512, 128) == 640
    assert RI.combined_width(0, 128) == 128
    assert RI.combined_width(512, 128, 100) == 768


def test_combine_hand_worked():
    # two requests; W=4, ratio=2, topk=3, M=100, N=50
    T = 5
    topk = torch.arange(T * 4, dtype=torch.int32).reshape(T, 4) + 1000
    qsl = torch.tensor([10, 12, 15], dtype=torch.int32)  # rebased: [0, 2, 5]
    seq = torch.tensor([6, 3], dtype=torch.int32)
    gat = torch.tensor([4, 3], dtype=torch.int32)
    idx, lens = RI.combine_topk_swa_indices(topk, qsl, seq, gat, 4, 2, 3, 100, 50)
    assert idx.shape == (T, 128)
    # request 0: qlen 2, seq 6 -> positions 4, 5; gather_start = 2
    # t=0: pos 4: k = min(5//2, 3) = 2; swa_start = max(4-3, 0) = 1, swa_len = 4
    assert idx[0, :6].tolist() == [1000, 1001, 50 + 1 - 2, 50, 51, 52]
    assert lens[0].item() == 6
    # t=1: pos 5: k = 3; swa_start = 2, swa_len 4
    assert idx[1, :7].tolist() == [1004, 1005, 1006, 50, 51, 52, 53] and lens[1].item() == 7
    # request 1 (b=1): qlen 3, seq 3 -> positions 0,1,2; gather_start 0; b*M = 100
    # t=2: pos 0: k = 0; swa [0, 0] -> 150
    assert idx[2, :2].tolist() == [150, -1] and lens[2].item() == 1
    # t=3: pos 1: k = 1 -> topk[3,0] + 100; swa 0..1
    assert idx[3, :4].tolist() == [1112, 150, 151, -1] and lens[3].item() == 3
    # t=4: pos 2: k = 1; swa 0..2
    assert idx[4, :5].tolist() == [1116, 150, 151, 152, -1] and lens[4].item() == 4
    assert bool((idx[:, 7:] == -1).all())


def test_combine_out_and_uncovered_rows():
    T = 4
    topk = torch.zeros(T, 8, dtype=torch.int32)
    idx = torch.full((T, 128), 77, dtype=torch.int32)
    lens = torch.full((T,), 55, dtype=torch.int32)
    qsl = torch.tensor([0, 2], dtype=torch.int32)  # rows 2, 3 belong to no request
    RI.combine_topk_swa_indices(topk, qsl, torch.tensor([2], dtype=torch.int32),
                                torch.tensor([2], dtype=torch.int32), 4, 1, 0, 0, 0,
                                out=(idx, lens))
    assert idx[0, :2].tolist() == [0, -1] and idx[1, :3].tolist() == [0, 1, -1]
    assert bool((idx[2:] == -1).all())
    assert lens.tolist() == [1, 2, 55, 55]


def test_combine_image_visibility():
    # W=4, image width 6: one token at pos 9 sees left=7 (4 more than W-1), right=2
    topk = torch.zeros(1, 4, dtype=torch.int32)
    qsl = torch.tensor([0, 1], dtype=torch.int32)
    seq = torch.tensor([10], dtype=torch.int32)
    gat = torch.tensor([10], dtype=torch.int32)
    left = torch.tensor([7], dtype=torch.int32)
    right = torch.tensor([2], dtype=torch.int32)
    idx, lens = RI.combine_topk_swa_indices(topk, qsl, seq, gat, 4, 4, 0, 0, 0,
                                            left_visible=left, right_visible=right,
                                            max_image_tokens=6)
    # left_add = 4 -> swa_start = 9 - 3 - 4 = 2; swa_len = 9 + 2 - 2 + 1 = 10 (extent 12)
    assert idx[0, :11].tolist() == list(range(2, 12)) + [-1] and lens[0].item() == 10
    # without left/right the image width does not apply (plain causal window)
    idx2, lens2 = RI.combine_topk_swa_indices(topk, qsl, seq, gat, 4, 4, 0, 0, 0,
                                              max_image_tokens=6)
    assert idx2[0, :5].tolist() == [6, 7, 8, 9, -1] and lens2[0].item() == 4


def test_combine_v41_hand_worked():
    """DeepSeek-V4.1's combine (v41): one request after a prefix-cache hit. W=4, ratio=2,
    topk=3, M=100, N=50; seq 10, query 3 (positions 7, 8, 9), replay start 6, so vLLM's gather
    length is 3 + min(max(7 - 6, 0), 3) = 4 and the gathered buffer starts at position 6."""
    topk = torch.tensor([[5, -1, 2, 9], [1, 50, 3, 9], [-1, -1, -1, 9]], dtype=torch.int32)
    qsl = torch.tensor([0, 3], dtype=torch.int32)
    seq = torch.tensor([10], dtype=torch.int32)
    gat = torch.tensor([4], dtype=torch.int32)
    idx, lens = RI.combine_topk_swa_indices(topk, qsl, seq, gat, 4, 2, 3, 100, 50, v41=True)
    # pos 7: k = min(8 // 2, 3) = 3; -1 stays -1; V4 would start the window at 4 (before the
    # buffer: 50 + 4 - 6 = 48, a compressed row); V4.1 at max(4, 6) = 6 -> 50, len 2
    assert idx[0, :6].tolist() == [5, -1, 2, 50, 51, -1] and lens[0].item() == 5
    # pos 8: 50 is >= N (out of the pool) -> -1; window [6, 8] -> 50..52
    assert idx[1, :7].tolist() == [1, -1, 3, 50, 51, 52, -1] and lens[1].item() == 6
    # pos 9: window [6, 9] (4 = W positions)
    assert idx[2, :8].tolist() == [-1, -1, -1, 50, 51, 52, 53, -1] and lens[2].item() == 7
    v4, v4_lens = RI.combine_topk_swa_indices(topk, qsl, seq, gat, 4, 2, 3, 100, 50)
    assert v4[0, :7].tolist() == [5, -1, 2, 48, 49, 50, 51] and v4_lens[0].item() == 7
    # ratio 0 (a V4.1 SWA-only layer): no top-k part whatever topk says
    idx0, lens0 = RI.combine_topk_swa_indices(topk, qsl, seq, gat, 4, 0, 3, 100, 50, v41=True)
    assert idx0[0, :3].tolist() == [50, 51, -1] and lens0.tolist() == [2, 3, 4]
    with pytest.raises(ValueError, match="no image"):
        RI.combine_topk_swa_indices(topk, qsl, seq, gat, 4, 2, 3, 100, 50, max_image_tokens=8,
                                    v41=True)


@pytest.mark.parametrize("v41", [False, True])
def test_portable_combine_equals_the_reference(v41):
    """The portable (torch) combine that CPU runs and builds without the extension use, against
    the reference: random requests, replay gather lengths, -1 and >= N top-k entries."""
    from deepinfer_sm80.ampere import portable

    g = torch.Generator().manual_seed(5)
    qlen = torch.tensor([37, 1, 90, 12])
    seq = (qlen + torch.tensor([300, 0, 1000, 5])).int()
    prefix = seq.long() - qlen
    rs = torch.tensor([250, 0, 990, 0])
    gat = (qlen + (prefix - rs).clamp(min=0).clamp(max=127)).int() if v41 else \
        (qlen + prefix.clamp(max=127)).int()
    qsl = torch.zeros(5, dtype=torch.int32)
    qsl[1:] = torch.cumsum(qlen, 0)
    T = int(qsl[-1])
    N = 400
    topk = torch.randint(0, N, (T, 512), generator=g, dtype=torch.int32)
    if v41:
        topk[torch.rand(T, 512, generator=g) < 0.1] = -1
        topk[torch.rand(T, 512, generator=g) < 0.05] = N + 1
    for ratio in ([0, 1, 4] if v41 else [1, 4]):
        kw = {"v41": True} if v41 else {}
        want = RI.combine_topk_swa_indices(topk, qsl, seq, gat, 128, ratio, 512, 2000, N, **kw)
        got = portable.combine_topk_swa_indices(topk, qsl, seq, gat, 128, ratio, 512, 2000, N,
                                                **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), ratio
