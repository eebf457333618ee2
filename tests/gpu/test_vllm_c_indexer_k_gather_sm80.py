"""The SM80 indexer's prefill gathers each chunk's K rows and scales with vLLM's compiled
``cp_gather_indexer_k_quant_cache`` (``csrc/cache_kernels.cu``), then scores them with our
kernels. Run here as SM80 code (``tests/vllm_c_ops.py``, source ``indexer_k_gather``):

- the SM80 build against the SM90 build, bit for bit (needs a 9.0+ GPU, skipped on an A100
  with the reason);
- the SM80 build against the layout, bit for bit: a block of the indexer cache holds
  ``block_size`` rows of ``head_dim`` FP8 bytes, then ``block_size`` fp32 scales; token t of
  request r (its block from the block table) lands in row ``cu_seq_lens[r] + t`` of the
  outputs, as the 4 scale bytes the indexer reads as one fp32; rows past ``cu_seq_lens[-1]``
  (the output may be an allocation upper bound) are left untouched.

Fresh random inputs per run (the seed is printed); outputs poisoned.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import vllm_c_ops  # noqa: E402

DEV = "cuda"
HEAD_DIM, SCALE_BYTES = 128, 4  # V4/V4.1 indexer: 128 dims, one fp32 scale per row


@pytest.fixture(scope="module")
def libs():
    return vllm_c_ops.load_for_tests("indexer_k_gather")


# name: (sequence lengths, block size, extra output rows)
CASES = {
    "one-request": ([1000], 64, 0),
    "chunk-of-four": ([300, 1, 64, 2049], 64, 37),
    "short": ([5, 3], 64, 0),
    "many": ([17] * 40, 64, 5),
    "block-128": ([700, 129], 128, 0),  # V4.1's compressed / indexer block on SM80
}


def _inputs(case: str, g: torch.Generator) -> dict:
    lens, bs, extra = CASES[case]
    need = sum(-(-n // bs) for n in lens)
    nb = need + 7
    perm = torch.randperm(nb, generator=g)
    max_blocks = max(-(-n // bs) for n in lens) + 2
    bt = torch.full((len(lens), max_blocks), -1, dtype=torch.int32)
    used = 0
    for r, n in enumerate(lens):
        k = -(-n // bs)
        bt[r, :k] = perm[used:used + k].to(torch.int32)
        used += k
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    cache = torch.randint(0, 256, (nb, bs, HEAD_DIM + SCALE_BYTES), dtype=torch.uint8,
                          generator=g)
    t = int(cu[-1]) + extra
    poison_k = torch.randint(0, 256, (t, HEAD_DIM), dtype=torch.uint8, generator=g)
    poison_s = torch.randint(0, 256, (t, SCALE_BYTES), dtype=torch.uint8, generator=g)
    return dict(cache=cache, bt=bt, cu=cu, lens=lens, bs=bs, pk=poison_k, ps=poison_s)


def _run(lib, d):
    k, s = d["pk"].to(DEV), d["ps"].to(DEV)
    lib.cp_gather_indexer_k_quant_cache(d["cache"].to(DEV), k, s, d["bt"].to(DEV),
                                        d["cu"].to(DEV))
    torch.cuda.synchronize()
    return k.cpu(), s.cpu()


def _reference(d):
    k, s = d["pk"].clone(), d["ps"].clone()
    bs = d["bs"]
    flat = d["cache"].view(d["cache"].size(0), -1)  # a block: [bs x 128 codes][bs x 4 scales]
    for r, n in enumerate(d["lens"]):
        for t in range(n):
            blk = flat[int(d["bt"][r, t // bs])]
            row = int(d["cu"][r]) + t
            k[row] = blk[(t % bs) * HEAD_DIM:(t % bs + 1) * HEAD_DIM]
            s[row] = blk[bs * HEAD_DIM + (t % bs) * SCALE_BYTES:
                         bs * HEAD_DIM + (t % bs + 1) * SCALE_BYTES]
    return k, s


@pytest.mark.parametrize("case", sorted(CASES))
def test_sm80_build_against_layout(libs, case, rng):
    d = _inputs(case, rng)
    k, s = _run(libs["sm80"], d)
    wk, ws = _reference(d)
    assert torch.equal(k, wk), f"{int((k != wk).any(dim=1).sum())} K rows differ"
    assert torch.equal(s, ws), f"{int((s != ws).any(dim=1).sum())} scale rows differ"


@pytest.mark.parametrize("case", sorted(CASES))
def test_sm80_build_equals_sm90_build(libs, case, rng):
    if "sm90" not in libs:
        pytest.skip("the SM90 build needs a 9.0+ GPU (this one is "
                    f"{torch.cuda.get_device_capability()})")
    d = _inputs(case, rng)
    a, b = _run(libs["sm80"], d), _run(libs["sm90"], d)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
