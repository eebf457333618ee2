"""Copies with an asymmetric read:write mix (reference rows of bench_cache's gather).

A gather of V4 cache records reads 584 bytes and writes 1024 bytes per entry (1 : 1.75),
while the copy ceiling (``common.copy_bandwidth``) and the same-bytes copy read and write
equal amounts. Two copies with that mix, graph-replayed like the kernels, no gather, no
decode:

- ``widen_rows_time``: contiguous rows, row r of ``src`` (584 bytes, masked loads) written
  to row r of ``dst`` (1024 bytes) followed by zeros. A simple kernel, not a ceiling: it
  reaches about 83% of the copy ceiling on the H200.
- ``chunk_mix_time`` / ``chunk_mix_best``: 16-byte-aligned chunks, 9 read per 16 written
  (0.5625 against the gather's 0.570), no masks; its best shapes reach 85-88% of the copy
  ceiling on the H200 (2026-11-30, ``python bench/mixed_copy.py``).
- ``records_copy_time``: the gather's exact traffic without the decode: 584-byte V4 records
  (576 data bytes + the 8-byte scale word from the page's scale region) of a paged cache,
  pages in random or linear order, -> 1 KB rows, every access an unmasked tile of 16-byte
  vectors; 79-82% of the copy ceiling on the H200 (``python bench/mixed_copy.py --records``).
  ``--records-diag`` also times it without the scale-word read and without the block table
  (linear pages): 80.8% at best with random pages, 83.8% linear with neither (2026-11-30
  15:37 UTC, docs/kernels-cache-index.md). Not a faithful bound for the gather: 448 of each
  row's 1024 bytes are constants, stored without waiting for any load; the gather's own
  kernel without its decode reaches 75-77% (same-run A/Bs, 2026-11-30 15:48 and 16:09 UTC).
- ``chunk_pages_time``: the chunked 9:16 copy with its reads in the benchmark's cache pages
  (half a page's data region per program, pages random or linear): 85-86% with random pages
  (``--records-diag``, 2026-11-30 15:39 UTC). The page placement alone does not cap the
  gather's traffic; the record -> row shape does.

The percentages above were taken at 4 calls per graph replay; since 2026-11-30 20:12 UTC
every copy here is timed at ``common.CALLS_PER_REPLAY`` (20), like the kernels it is compared
with, which adds 2-3 points at 79 MB per call (docs/kernels-cache-index.md, "Current record").

Imports torch and triton only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common import CALLS_PER_REPLAY, Timing, graph_time, rotation_count


@triton.jit
def _widen_rows(src, dst, rows, READ: tl.constexpr, WRITE: tl.constexpr, BM: tl.constexpr):
    r = tl.program_id(0) * BM + tl.arange(0, BM)[:, None]
    c = tl.arange(0, WRITE)[None, :]
    in_rows = r < rows
    v = tl.load(src + r.to(tl.int64) * READ + c, mask=in_rows & (c < READ), other=0)
    tl.store(dst + r.to(tl.int64) * WRITE + c, v, mask=in_rows)


def widen_rows_time(rows: int, read_bytes: int, write_bytes: int, *, min_sets: int = 2,
                    replays: int = 30) -> Timing:
    """Graph-replayed time of reading ``rows x read_bytes`` and writing ``rows x
    write_bytes`` (contiguous), with input sets rotated past twice the L2 like the kernels'
    inputs. Both sizes must be multiples of 4; write_bytes / 4 a power of two."""
    rw, ww = read_bytes // 4, write_bytes // 4
    if rw * 4 != read_bytes or ww * 4 != write_bytes or ww & (ww - 1) or rw > ww:
        raise ValueError("widen_rows_time: sizes must be int32 words, write a power of two >= read")
    sets = max(min_sets, rotation_count(rows * (read_bytes + write_bytes)))
    bufs = [(torch.randint(-2**31, 2**31 - 1, (rows, rw), dtype=torch.int32, device="cuda"),
             torch.empty(rows, ww, dtype=torch.int32, device="cuda")) for _ in range(sets)]
    bm = 8
    grid = (triton.cdiv(rows, bm),)
    calls = [(lambda a=a, b=b: _widen_rows[grid](a, b, rows, READ=rw, WRITE=ww, BM=bm, num_warps=4))
             for a, b in bufs]
    t = graph_time(calls, min_calls=CALLS_PER_REPLAY, replays=replays)
    a, b = bufs[0]
    if not (torch.equal(b[:, :rw], a) and not bool(b[:, rw:].any())):
        raise RuntimeError("widen_rows check failed: dst != [src, 0]")
    del bufs
    return t


def _time_checked(calls, device: str, replays: int) -> Timing | None:
    """Graph-replayed time of the (already checked) calls; None off the GPU (interpreter)."""
    return graph_time(calls, min_calls=CALLS_PER_REPLAY, replays=replays) if device == "cuda" else None


def _check_chunk_xor(read: torch.Tensor, dst: torch.Tensor, write_chunks: int, what: str) -> None:
    """The chunked copies' output: program p's write chunk i = XOR of its read chunks
    ``read[p]`` ([programs, read chunks, words]) + i."""
    acc = read[:, 0].clone()
    for i in range(1, read.size(1)):
        acc ^= read[:, i]
    want = acc[:, None, :] + torch.arange(write_chunks, dtype=torch.int32, device=read.device)[None, :, None]
    if not torch.equal(dst.view(read.size(0), write_chunks, read.size(2)), want):
        raise RuntimeError(f"{what} check failed")


@triton.jit
def _chunk_mix(src, dst, n_prog, RCH: tl.constexpr, WCH: tl.constexpr, CH: tl.constexpr):
    # program p reads RCH chunks of CH int32 and writes WCH chunks (contiguous, 16-byte
    # aligned, no masks): the read:write mix RCH:WCH without any row structure
    p = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, CH)
    acc = tl.zeros([CH], dtype=tl.int32)
    for i in tl.static_range(RCH):
        acc ^= tl.load(src + (p * RCH + i) * CH + c)
    for i in tl.static_range(WCH):
        tl.store(dst + (p * WCH + i) * CH + c, acc + i)


def chunk_mix_bytes(total_bytes: int, read_chunks: int, write_chunks: int, chunk_words: int) -> int:
    """Bytes the chunked copy moves for ``total_bytes`` (whole programs only, at least one)."""
    per_prog = (read_chunks + write_chunks) * chunk_words * 4
    return max(1, total_bytes // per_prog) * per_prog


def chunk_mix_time(total_bytes: int, read_chunks: int, write_chunks: int, *, chunk_words: int = 256,
                   num_warps: int = 4, replays: int = 30, device: str = "cuda") -> Timing | None:
    """Graph-replayed time of a copy-like kernel moving about ``total_bytes`` with the
    read:write ratio read_chunks:write_chunks, every access a full 16-byte-aligned vector
    (free of the row kernel's masked 584-byte reads). Output checked against torch (every
    written chunk = XOR of the program's read chunks + its index) before timing; inputs
    rotated past twice the L2. ``device="cpu"`` (Triton's interpreter): the check only."""
    moved = chunk_mix_bytes(total_bytes, read_chunks, write_chunks, chunk_words)
    progs = moved // ((read_chunks + write_chunks) * chunk_words * 4)
    sets = max(2, rotation_count(moved)) if device == "cuda" else 1
    bufs = [(torch.randint(-2**31, 2**31 - 1, (progs * read_chunks * chunk_words,), dtype=torch.int32,
                           device=device),
             torch.empty(progs * write_chunks * chunk_words, dtype=torch.int32, device=device))
            for _ in range(sets)]
    calls = [(lambda a=a, b=b: _chunk_mix[(progs,)](a, b, progs, RCH=read_chunks, WCH=write_chunks,
                                                   CH=chunk_words, num_warps=num_warps))
             for a, b in bufs]
    calls[0]()
    src, dst = bufs[0]
    _check_chunk_xor(src.view(progs, read_chunks, chunk_words), dst, write_chunks, "chunk_mix")
    return _time_checked(calls, device, replays)


def chunk_mix_best(total_bytes: int, read_chunks: int = 9, write_chunks: int = 16,
                   shapes=((512, 2), (1024, 4), (512, 4))) -> tuple[Timing, int, str]:
    """Fastest of a few (chunk int32 words, warps) shapes: (timing, bytes moved, shape)."""
    best = None
    for cw, nw in shapes:
        t = chunk_mix_time(total_bytes, read_chunks, write_chunks, chunk_words=cw, num_warps=nw)
        moved = chunk_mix_bytes(total_bytes, read_chunks, write_chunks, cw)
        rate = moved / t.median_us
        if best is None or rate > best[0]:
            best = (rate, t, moved, f"{cw * 4} B chunks, {nw} warps")
    return best[1], best[2], best[3]


def _paged_sets(pages: int, words: int, shuffle: bool, dst_shape: tuple, moved: int,
                device: str) -> list:
    """Input sets of the paged copies: (cache of ``pages`` pages of ``words`` random int32,
    block table (a random permutation when ``shuffle``, else linear), empty int32 dst), as many
    as rotate past twice the L2 on CUDA (``moved`` bytes per call), one on the CPU."""
    sets = max(2, rotation_count(moved)) if device == "cuda" else 1
    out = []
    for _ in range(sets):
        cache = torch.randint(-2**31, 2**31 - 1, (pages * words,), dtype=torch.int32, device=device)
        bt = (torch.randperm(pages, device=device) if shuffle else torch.arange(pages, device=device)).to(torch.int32)
        out.append((cache, bt, torch.empty(dst_shape, dtype=torch.int32, device=device)))
    return out


@triton.jit
def _chunk_pages(src, bt, dst, PAGE_WORDS: tl.constexpr, PART_WORDS: tl.constexpr, PARTS: tl.constexpr,
                 RCH: tl.constexpr, WCH: tl.constexpr, CH: tl.constexpr, BT: tl.constexpr):
    # the chunked 9:16 copy with its reads in cache pages: program p reads part p % PARTS of
    # the data region of page bt[p // PARTS] (BT) or page p // PARTS (linear, no lookup), as
    # RCH chunks of CH int32, and writes WCH chunks contiguously
    p = tl.program_id(0).to(tl.int64)
    if BT:
        page = tl.load(bt + p // PARTS).to(tl.int64)
    else:
        page = p // PARTS
    base = page * PAGE_WORDS + (p % PARTS) * PART_WORDS
    c = tl.arange(0, CH)
    acc = tl.zeros([CH], dtype=tl.int32)
    for i in tl.static_range(RCH):
        acc ^= tl.load(src + base + i * CH + c)
    for i in tl.static_range(WCH):
        tl.store(dst + (p * WCH + i) * CH + c, acc + i)


def chunk_pages_time(entries: int, *, shuffle: bool = True, use_bt: bool = True, chunk_words: int = 512,
                     num_warps: int = 2, block_size: int = 64, page_bytes: int = 37440, parts: int = 2,
                     replays: int = 30, device: str = "cuda") -> tuple[Timing | None, int]:
    """(graph-replayed time, bytes moved) of the chunked 9:16 copy whose reads are the data regions of
    ``entries / block_size`` cache pages (``page_bytes`` apart, in random order when
    ``shuffle``; ``use_bt=False``: linear, no block-table load) and whose writes are
    contiguous: the read:write mix and the page placement of the gather, without its
    record granularity. Each page's data region (block_size x 576 bytes) is read by
    ``parts`` programs of 9 chunks each (``parts = 16`` at 64-entry pages: four records'
    bytes per program, the gather's tile); the writes are 16 chunks per program (1.78 : 1,
    the gather's 1.75). Checked against torch before timing; ``device="cpu"``: the check
    only (time None)."""
    if not use_bt:
        shuffle = False
    part = block_size * 144 // parts
    if part * parts != block_size * 144 or part % chunk_words or part // chunk_words != 9:
        raise ValueError("chunk_pages_time: a page's part must be 9 chunks")
    words = page_bytes // 4
    pages = -(-entries // block_size)
    progs = parts * pages
    moved = progs * (9 + 16) * chunk_words * 4
    bufs = _paged_sets(pages, words, shuffle, (progs * 16 * chunk_words,), moved, device)
    calls = [(lambda a=a, b=b, d=d: _chunk_pages[(progs,)](a, b, d, PAGE_WORDS=words, PART_WORDS=part,
                                                       PARTS=parts, RCH=9, WCH=16, CH=chunk_words, BT=use_bt,
                                                       num_warps=num_warps))
             for a, b, d in bufs]
    calls[0]()
    src, bt, dst = bufs[0]
    pieces = src.view(pages, words)[bt.long(), : parts * part].reshape(progs, 9, chunk_words)
    _check_chunk_xor(pieces, dst, 16, "chunk_pages")
    return _time_checked(calls, device, replays), moved


@triton.jit
def _records_to_rows(cache, bt, dst, n, PAGE_WORDS: tl.constexpr, BS: tl.constexpr,
                     E: tl.constexpr, SCALE: tl.constexpr, BT: tl.constexpr):
    # the gather's exact traffic without its decode: entry e's 576-byte record (words
    # 0..143 at page_base + (e % BS) * 144, page = bt[e // BS]) and its 8-byte scale word
    # (page_base + BS * 144 + (e % BS) * 2) -> a 1 KB row: the record's words, zeros, and
    # the scale's first word in the last 16 words. Every access an unmasked power-of-two
    # tile of whole 16-byte vectors (the rows of E entries). Diagnostics: SCALE=False skips
    # the scale-word read (the last 16 words are zeros); BT=False takes page e // BS
    # directly (no block-table load: linear pages, no dependent round trip).
    e = tl.program_id(0) * E + tl.arange(0, E)[:, None]
    ok = e < n
    if BT:
        page = tl.load(bt + e // BS, mask=ok, other=0).to(tl.int64)
    else:
        page = (e // BS).to(tl.int64)
    rec = page * PAGE_WORDS + (e % BS) * 144
    c128 = tl.arange(0, 128)[None, :]
    c64 = tl.arange(0, 64)[None, :]
    c32 = tl.arange(0, 32)[None, :]
    c16 = tl.arange(0, 16)[None, :]
    a = tl.load(cache + rec + c128, mask=ok, other=0)
    b = tl.load(cache + rec + 128 + c16, mask=ok, other=0)
    if SCALE:
        s0 = tl.load(cache + page * PAGE_WORDS + BS * 144 + (e % BS) * 2, mask=ok, other=0)
    else:
        s0 = tl.zeros([E, 1], dtype=tl.int32)
    row = dst + e.to(tl.int64) * 256
    tl.store(row + c128, a, mask=ok)
    tl.store(row + 128 + c16, b, mask=ok)
    tl.store(row + 144 + c64, tl.zeros([E, 64], dtype=tl.int32), mask=ok)
    tl.store(row + 208 + c32, tl.zeros([E, 32], dtype=tl.int32), mask=ok)
    tl.store(row + 240 + c16, tl.zeros([E, 16], dtype=tl.int32) + s0, mask=ok)


@triton.jit
def _records_to_rows_wide(cache, bt, dst, n, PAGE_WORDS: tl.constexpr, BS: tl.constexpr,
                          E: tl.constexpr):
    # _records_to_rows with one tile per row: E records read as one [E, 256] tile masked to
    # the record's 144 words (16-word aligned, so still whole 16-byte vectors), the 1 KB
    # rows written as one [E, 256] tile (E KB contiguous per program): the same bytes, one
    # load and one store instruction stream instead of two and five
    e = tl.program_id(0) * E + tl.arange(0, E)[:, None]
    ok = e < n
    page = tl.load(bt + e // BS, mask=ok, other=0).to(tl.int64)
    rec = page * PAGE_WORDS + (e % BS) * 144
    c = tl.arange(0, 256)[None, :]
    v = tl.load(cache + rec + c, mask=ok & (c < 144), other=0)
    s0 = tl.load(cache + page * PAGE_WORDS + BS * 144 + (e % BS) * 2, mask=ok, other=0)
    v = tl.where(c >= 240, s0, v)
    tl.store(dst + e.to(tl.int64) * 256 + c, v, mask=ok)


@triton.jit
def _records_widen(cache, bt, dst, n, PAGE_WORDS: tl.constexpr, BS: tl.constexpr, E: tl.constexpr):
    # a faithful record -> row copy (every written byte comes from a load), shaped like the
    # gather: the 448 NoPE bytes widened to 448 16-bit slots (byte k -> slot k, zero high
    # byte, XOR the low 16 bits of the record's first scale word: the decode's data flow
    # without its arithmetic), the 128 RoPE bytes copied to the row's last 128 bytes.
    e = tl.program_id(0) * E + tl.arange(0, E)[:, None]
    ok = e < n
    page = tl.load(bt + e // BS, mask=ok, other=0).to(tl.int64)
    rec = page * PAGE_WORDS + (e % BS) * 144
    c128 = tl.arange(0, 128)[None, :]
    c32 = tl.arange(0, 32)[None, :]
    w = tl.load(cache + rec + c128, mask=ok, other=0)  # words 0..111 NoPE, 112..127 RoPE
    rope = tl.load(cache + rec + 112 + c32, mask=ok, other=0)
    s0 = tl.load(cache + page * PAGE_WORDS + BS * 144 + (e % BS) * 2, mask=ok, other=0)
    k = (s0 & 0xFFFF) * 0x10001  # the 16-bit key in both halves
    lo = ((w & 0xFF) | ((w & 0xFF00) << 8)) ^ k
    hi = (((w >> 16) & 0xFF) | ((w >> 8) & 0xFF0000)) ^ k
    wide = tl.reshape(tl.join(lo, hi), [E, 256])  # word j -> row words 2j, 2j + 1
    row = dst + e.to(tl.int64) * 256
    c256 = tl.arange(0, 256)[None, :]
    tl.store(row + c256, wide, mask=ok & (c256 < 224))
    tl.store(row + 224 + c32, rope, mask=ok)


def records_widen_time(entries: int, *, per_prog: int = 8, num_warps: int = 2, block_size: int = 64,
                       page_bytes: int = 37440, replays: int = 30,
                       device: str = "cuda") -> Timing | None:
    """Graph-replayed time of ``_records_widen`` (random pages): the gather's exact bytes
    (584-byte record and scale word -> 1 KB row), every output byte computed from loaded
    bytes as in the decode (NoPE widened 1 -> 2 bytes and keyed by the scale word, RoPE
    copied). Checked against torch before timing; ``device="cpu"``: the check only."""
    words = page_bytes // 4
    pages = -(-entries // block_size)
    bufs = _paged_sets(pages, words, True, (entries, 256), entries * (584 + 1024), device)
    grid = (-(-entries // per_prog),)
    calls = [(lambda c=c, b=b, d=d: _records_widen[grid](c, b, d, entries, PAGE_WORDS=words, BS=block_size,
                                                        E=per_prog, num_warps=num_warps))
             for c, b, d in bufs]
    cache, bt, dst = bufs[0]
    calls[0]()
    e = torch.arange(entries, device=device)
    pg = bt.long()[e // block_size]
    base = pg * words + (e % block_size) * 144
    rec = cache[base[:, None] + torch.arange(144, device=device)]
    nope = rec[:, :112].contiguous().view(torch.uint8).view(entries, 448).to(torch.int32)
    key = cache[pg * words + block_size * 144 + (e % block_size) * 2] & 0xFFFF
    slots = nope ^ key[:, None]  # 448 16-bit slots
    want_nope = (slots[:, 0::2] | (slots[:, 1::2] << 16)).to(torch.int32)
    if not (torch.equal(dst[:, :224], want_nope) and torch.equal(dst[:, 224:], rec[:, 112:])):
        raise RuntimeError("records_widen check failed")
    return _time_checked(calls, device, replays)


def records_copy_time(entries: int, *, shuffle: bool = True, per_prog: int = 8, num_warps: int = 2,
                      block_size: int = 64, page_bytes: int = 37440, replays: int = 30,
                      device: str = "cuda", scale: bool = True, use_bt: bool = True,
                      wide: bool = False) -> Timing | None:
    """Graph-replayed time of the gather's traffic (584 bytes of a V4 record from a paged
    cache -> a 1 KB row) with no decode: pages in random (``shuffle``) or linear order.
    Checked against torch before timing; inputs rotated past twice the L2. ``device="cpu"``
    (Triton's interpreter): the check only. Diagnostics: ``scale=False`` leaves out the
    scale-word read, ``use_bt=False`` the block table (pages linear, computed);
    ``wide=True``: one [E, 256] load tile and one store tile per program
    (``_records_to_rows_wide``; with the scale read and the block table)."""
    if not use_bt:
        shuffle = False
    words = page_bytes // 4
    pages = -(-entries // block_size)
    bufs = _paged_sets(pages, words, shuffle, (entries, 256), entries * (584 + 1024), device)
    grid = (-(-entries // per_prog),)
    if wide:
        scale, use_bt = True, True
        calls = [(lambda c=c, b=b, d=d: _records_to_rows_wide[grid](c, b, d, entries, PAGE_WORDS=words,
                                                                   BS=block_size, E=per_prog,
                                                                   num_warps=num_warps))
                 for c, b, d in bufs]
    else:
        calls = [(lambda c=c, b=b, d=d: _records_to_rows[grid](c, b, d, entries, PAGE_WORDS=words,
                                                              BS=block_size, E=per_prog, SCALE=scale,
                                                              BT=use_bt, num_warps=num_warps))
                 for c, b, d in bufs]
    cache, bt, dst = bufs[0]
    calls[0]()
    e = torch.arange(entries, device=device)
    base = bt.long()[e // block_size] * words + (e % block_size) * 144
    want = cache[base[:, None] + torch.arange(144, device=device)]
    scale0 = cache[bt.long()[e // block_size] * words + block_size * 144 + (e % block_size) * 2]
    if not scale:
        scale0 = torch.zeros_like(scale0)
    if not (torch.equal(dst[:, :144], want) and not bool(dst[:, 144:240].any())
            and torch.equal(dst[:, 240:], scale0[:, None].expand(-1, 16))):
        raise RuntimeError("records_to_rows check failed")
    return _time_checked(calls, device, replays)


if __name__ == "__main__":
    # python bench/mixed_copy.py [--records | --records-diag | --widen | --parts]: the gather's
    # mix (584:1024 ~ 9:16) and 1:1 in chunks, 79 MB; --records: the gather's own record -> row
    # traffic without the decode; --records-diag, --widen, --parts: the 2026-11-30 diagnostics
    import sys

    import common

    common.require_cuda()
    common.warm_gpu(1.0)
    ceil = common.copy_bandwidth()["gbps_read_plus_write"]
    total = 49152 * (584 + 1024)
    print(f"copy ceiling {ceil:.0f} GB/s; {total / 1e6:.1f} MB per call")

    def show(what: str, t: Timing, nbytes: int) -> None:
        print(f"{what}: {t.median_us:.2f} us = {100 * nbytes / (t.median_us * 1e3) / ceil:.1f}% of copy",
              flush=True)

    show("rows 584->1024 (bench_cache's row)", widen_rows_time(49152, 584, 1024), total)
    if "--widen" in sys.argv:
        # the faithful record -> row copy next to the chunked copy from cache pages and the
        # record copy whose rows are partly constant (the 2026-11-30 diagnostics)
        show("chunks 9:16 read from cache pages, random pages, 2048 B chunks, 2 warps",
             *chunk_pages_time(49152, num_warps=2))
        show("records -> rows, random pages (448 B of each row constant), 8 per program, 2 warps",
             records_copy_time(49152, per_prog=8, num_warps=2), total)
        for e, nw in ((4, 1), (8, 1), (8, 2), (16, 2), (16, 4), (32, 4), (32, 8), (64, 8)):
            show(f"records -> rows, faithful (widened NoPE, keyed by the scale word), random pages, "
                 f"{e} per program, {nw} warps", records_widen_time(49152, per_prog=e, num_warps=nw), total)
        sys.exit(0)
    if "--parts" in sys.argv:
        # the chunked copy from random cache pages by program size, down to the gather's tile
        # (16 parts of a 64-entry page = four records' 2304 bytes per program), next to the
        # faithful record copy; at 49,152 entries (where 1.5-6k programs fit on the GPU at
        # once) and at 4x and 16x that (where they do not)
        for n in (49152, 4 * 49152, 16 * 49152):
            small = n == 49152
            chunks = ((2, 512, 2), (4, 256, 1), (4, 256, 2), (8, 128, 1), (16, 64, 1)) if small else \
                ((2, 512, 2), (4, 256, 1), (16, 64, 1))
            for parts, cw, nw in chunks:
                show(f"{n} entries: chunks 9:16 read from random cache pages, {parts} programs per page "
                     f"({9 * cw * 4} B read each), {nw} warps",
                     *chunk_pages_time(n, parts=parts, chunk_words=cw, num_warps=nw))
            for e, nw in ((4, 1), (8, 1), (16, 1), (32, 1), (16, 2), (32, 2)) if small else ((4, 1),):
                show(f"{n} entries: records -> rows, faithful, random pages, {e} per program, {nw} warps",
                     records_widen_time(n, per_prog=e, num_warps=nw), n * (584 + 1024))
        sys.exit(0)
    if "--records-diag" in sys.argv:
        # which part of the record traffic costs: the scale-word stream, the block-table
        # indirection, the program size (64 = one whole page per program)
        t, moved, how = chunk_mix_best(total)
        show(f"chunks 9:16 best ({how})", t, moved)
        for nw in (2, 4):
            for shuffle, use_bt, what in ((True, True, "random pages"), (False, True, "linear pages"),
                                          (False, False, "linear, no block table")):
                show(f"chunks 9:16 read from cache pages, {what}, 2048 B chunks, {nw} warps",
                     *chunk_pages_time(49152, shuffle=shuffle, use_bt=use_bt, num_warps=nw))
        for e, nw in ((8, 2), (16, 2), (32, 2), (32, 4), (64, 4)):
            show(f"records -> rows, random pages, one [E, 256] tile, {e} per program, {nw} warps",
                 records_copy_time(49152, per_prog=e, num_warps=nw, wide=True), total)
        for e, nw in ((8, 2), (32, 8), (64, 4), (64, 8)):
            for shuffle, scale, use_bt, what in ((True, True, True, "random pages"),
                                                 (True, False, True, "random pages, no scale read"),
                                                 (False, True, False, "linear pages, no block table"),
                                                 (False, False, False, "linear, no block table, no scale")):
                show(f"records -> rows, {what}, {e} per program, {nw} warps",
                     records_copy_time(49152, shuffle=shuffle, per_prog=e, num_warps=nw, scale=scale,
                                       use_bt=use_bt), total)
        sys.exit(0)
    if "--records" in sys.argv:
        t, moved, how = chunk_mix_best(total)
        show(f"chunks 9:16 best ({how})", t, moved)
        for shuffle in (True, False):
            for e, nw in ((4, 1), (8, 2), (16, 4), (32, 4), (32, 8)):
                show(f"records -> rows, pages {'random' if shuffle else 'linear'}, {e} per program, {nw} warps",
                     records_copy_time(49152, shuffle=shuffle, per_prog=e, num_warps=nw), total)
        sys.exit(0)
    for rch, wch in ((9, 16), (1, 1)):
        for cw in (256, 512, 1024):
            for nw in (2, 4, 8):
                show(f"chunks {rch}:{wch} x {cw * 4} B, {nw} warps",
                     chunk_mix_time(total, rch, wch, chunk_words=cw, num_warps=nw),
                     chunk_mix_bytes(total, rch, wch, cw))
