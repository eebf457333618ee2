"""Input builders and byte comparisons shared by the writer tests (CPU
interpreter run and GPU run).  Imports nothing but torch."""

from __future__ import annotations

from types import SimpleNamespace

import torch

FP8_DS_MLA_ENTRY = 584


def page_stride(kv_block_size: int, entry: int) -> int:
    raw = kv_block_size * entry
    return ((raw + 575) // 576) * 576 if entry == FP8_DS_MLA_ENTRY else raw


def make_compressor_case(ratio: int, head: int, seq_lens, *, seed: int = 0,
                         device: str = "cpu", pad_rows: int = 2, score_scale: float = 2.0,
                         first_pos=None):
    """Random saved states + metadata laid out the way vLLM lays them out:
    per-request block tables into a shared state cache (block size 4 for C4,
    8 for C128), one prefill chunk covering positions [first, seq_len) per
    request, compressed-cache slots at (pos // ratio) in the request's pages,
    and ``pad_rows`` CUDA-graph padding rows (slot -1) at the end."""
    g = torch.Generator().manual_seed(seed)
    overlap = ratio == 4
    state_width = (2 if overlap else 1) * head
    sbs = 4 if ratio == 4 else 8
    nreq = len(seq_lens)
    nblk = [(s + sbs - 1) // sbs for s in seq_lens]
    total = sum(nblk) + 3
    state = torch.randn(total, sbs, 2 * state_width, generator=g)
    state[..., state_width:] *= score_scale
    perm = torch.randperm(total, generator=g)
    bt = torch.zeros(nreq, max(nblk) + 1, dtype=torch.int32)
    k = 0
    for r in range(nreq):
        for b in range(nblk[r]):
            bt[r, b] = perm[k]
            k += 1
    first_pos = first_pos or [0] * nreq
    pos = torch.cat([torch.arange(f, s) for f, s in zip(first_pos, seq_lens)]).long()
    t2r = torch.cat([torch.full((s - f,), r) for r, (f, s) in enumerate(zip(first_pos, seq_lens))]).int()
    n = pos.numel()
    slot = torch.arange(n).long()
    kvbs = 256 // ratio if head == 512 else 256 // ratio
    entry = FP8_DS_MLA_ENTRY if head == 512 else 132
    pages_per_req = max((s // ratio) // kvbs + 1 for s in seq_lens)
    npages = nreq * pages_per_req + 1
    kv_page_perm = torch.randperm(npages, generator=g)
    kvslot = torch.full((n,), -1, dtype=torch.long)
    for t in range(n):
        p = int(pos[t])
        if (p + 1) % ratio == 0:
            r = int(t2r[t])
            c = p // ratio
            page = int(kv_page_perm[r * pages_per_req + c // kvbs])
            kvslot[t] = page * kvbs + c % kvbs
    # CUDA-graph padding rows: slot -1 everywhere, positions that look like
    # boundaries so a writer that ignored the slot would publish garbage.
    if pad_rows:
        pos = torch.cat([pos, torch.full((pad_rows,), ratio - 1, dtype=torch.long)])
        t2r = torch.cat([t2r, torch.zeros(pad_rows, dtype=torch.int32)])
        slot = torch.cat([slot, torch.full((pad_rows,), -1, dtype=torch.long)])
        kvslot = torch.cat([kvslot, torch.full((pad_rows,), -1, dtype=torch.long)])
    stride = page_stride(kvbs, entry)
    raw = torch.zeros(npages, stride, dtype=torch.uint8)
    cs = torch.randn(8192, 64, generator=g)
    w = (1 + 0.2 * torch.randn(head, generator=g)).to(torch.bfloat16)
    d = torch.device(device)
    raw = raw.to(d)
    kv_cache = raw.as_strided((npages, kvbs, entry), (stride, entry, 1))
    args = dict(
        state_cache=state.to(d), token_to_req_indices=t2r.to(d), positions=pos.to(d),
        slot_mapping=slot.to(d), block_table=bt.to(d), block_size=sbs,
        cos_sin_cache=cs.to(d), kv_cache=kv_cache, kv_slot_mapping=kvslot.to(d),
        compress_ratio=ratio, rms_norm_weight=w.to(d), rms_norm_eps=1e-6, head_dim=head,
    )
    return SimpleNamespace(args=args, raw=raw, state_width=state_width, overlap=overlap,
                           kvbs=kvbs, entry=entry, stride=stride)


def call_sm80_store(case):
    from deepinfer_sm80.triton_writers import compress_norm_rope_store_sm80

    a = case.args
    head = a["head_dim"]
    compress_norm_rope_store_sm80(
        a["state_cache"], a["slot_mapping"].shape[0], a["token_to_req_indices"],
        a["positions"], a["slot_mapping"], a["block_table"], a["block_size"],
        case.state_width, a["cos_sin_cache"], a["kv_cache"],
        SimpleNamespace(slot_mapping=a["kv_slot_mapping"]),
        head_dim=head, compress_ratio=a["compress_ratio"], overlap=case.overlap,
        rms_norm_weight=a["rms_norm_weight"], rms_norm_eps=a["rms_norm_eps"],
        quant_block=64 if head == 512 else 128, token_stride=576 if head == 512 else 128,
        scale_dim=8 if head == 512 else 4,
    )


def entry_regions(case):
    """Byte masks over a flat page for (fp8 codes, scales, bf16 rope) of the
    written entries."""
    a = case.args
    kvbs = case.kvbs
    head = a["head_dim"]
    kvslot = a["kv_slot_mapping"].cpu()
    slot = a["slot_mapping"].cpu()
    pos = a["positions"].cpu()
    ratio = a["compress_ratio"]
    npages, stride = case.raw.shape
    codes = torch.zeros(npages, stride, dtype=torch.bool)
    scales = torch.zeros_like(codes)
    rope = torch.zeros_like(codes)
    for t in range(kvslot.shape[0]):
        if slot[t] < 0 or kvslot[t] < 0 or (int(pos[t]) + 1) % ratio:
            continue
        page, i = divmod(int(kvslot[t]), kvbs)
        if head == 512:
            codes[page, i * 576:i * 576 + 448] = True
            rope[page, i * 576 + 448:i * 576 + 576] = True
            scales[page, kvbs * 576 + i * 8:kvbs * 576 + i * 8 + 8] = True
        else:
            codes[page, i * 128:(i + 1) * 128] = True
            scales[page, kvbs * 128 + i * 4:kvbs * 128 + i * 4 + 4] = True
    return codes, scales, rope


def compare_fp8_bytes(got: torch.Tensor, want: torch.Tensor, case):
    """Summary of a byte comparison: exact fraction per region and the largest
    e4m3 code step where codes differ."""
    got, want = got.cpu(), want.cpu()
    codes, scales, rope = entry_regions(case)
    out = {"untouched_equal": bool(torch.equal(got[~(codes | scales | rope)],
                                               want[~(codes | scales | rope)]))}
    gc, wc = got[codes].long(), want[codes].long()
    out["codes"] = int(codes.sum())
    out["codes_exact"] = float((gc == wc).float().mean()) if gc.numel() else 1.0
    same_sign = ((gc ^ wc) & 0x80) == 0
    step = torch.where(same_sign, (gc & 0x7F) - (wc & 0x7F), torch.full_like(gc, 99)).abs()
    out["codes_max_step"] = int(step.max()) if gc.numel() else 0
    out["scales_exact"] = float((got[scales] == want[scales]).float().mean()) if scales.any() else 1.0
    if rope.any():
        gr = got[rope].view(-1, 2).contiguous().view(torch.bfloat16).float()
        wr = want[rope].view(-1, 2).contiguous().view(torch.bfloat16).float()
        out["rope_exact"] = float((gr == wr).float().mean())
        ulp = wr.abs().clamp(min=1e-30) * 2.0**-7
        out["rope_max_ulps"] = float(((gr - wr).abs() / ulp).max())
    return out
