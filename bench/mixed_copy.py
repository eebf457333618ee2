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
  ceiling on the H200 (2026-11-30, ``python bench/mixed_copy.py``), the figure to hold the
  gather's 85% target against.

Imports torch and triton only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common import Timing, graph_time, rotation_count


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
    t = graph_time(calls, min_calls=4, replays=replays)
    a, b = bufs[0]
    if not (torch.equal(b[:, :rw], a) and not bool(b[:, rw:].any())):
        raise RuntimeError("widen_rows check failed: dst != [src, 0]")
    del bufs
    return t


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


def chunk_mix_time(total_bytes: int, read_chunks: int, write_chunks: int, *, chunk_words: int = 256,
                   num_warps: int = 4, replays: int = 30) -> Timing:
    """Graph-replayed time of a copy-like kernel moving about ``total_bytes`` with the
    read:write ratio read_chunks:write_chunks, every access a full 16-byte-aligned vector
    (a second measurement of the mix's ceiling, free of the row kernel's masked 584-byte
    reads). Inputs rotated past twice the L2."""
    per_prog = (read_chunks + write_chunks) * chunk_words * 4
    progs = max(1, total_bytes // per_prog)
    sets = max(2, rotation_count(progs * per_prog))
    bufs = [(torch.randint(-2**31, 2**31 - 1, (progs * read_chunks * chunk_words,), dtype=torch.int32,
                           device="cuda"),
             torch.empty(progs * write_chunks * chunk_words, dtype=torch.int32, device="cuda"))
            for _ in range(sets)]
    calls = [(lambda a=a, b=b: _chunk_mix[(progs,)](a, b, progs, RCH=read_chunks, WCH=write_chunks,
                                                   CH=chunk_words, num_warps=num_warps))
             for a, b in bufs]
    t = graph_time(calls, min_calls=4, replays=replays)
    del bufs
    return t


def chunk_mix_best(total_bytes: int, read_chunks: int = 9, write_chunks: int = 16,
                   shapes=((512, 2), (1024, 4), (512, 4))) -> tuple[Timing, int, str]:
    """Fastest of a few (chunk int32 words, warps) shapes: (timing, bytes moved, shape)."""
    best = None
    for cw, nw in shapes:
        t = chunk_mix_time(total_bytes, read_chunks, write_chunks, chunk_words=cw, num_warps=nw)
        per_prog = (read_chunks + write_chunks) * cw * 4
        moved = max(1, total_bytes // per_prog) * per_prog
        rate = moved / t.median_us
        if best is None or rate > best[0]:
            best = (rate, t, moved, f"{cw * 4} B chunks, {nw} warps")
    return best[1], best[2], best[3]


if __name__ == "__main__":  # sweep: the gather's mix (584:1024 ~ 9:16) and 1:1, 79 MB
    import common

    common.require_cuda()
    common.warm_gpu(1.0)
    ceil = common.copy_bandwidth()["gbps_read_plus_write"]
    total = 49152 * (584 + 1024)
    print(f"copy ceiling {ceil:.0f} GB/s; {total / 1e6:.1f} MB per call")
    t = widen_rows_time(49152, 584, 1024)
    print(f"rows 584->1024 (bench_cache's row): {t.median_us:.2f} us = "
          f"{100 * total / (t.median_us * 1e3) / ceil:.1f}% of copy")
    for rch, wch in ((9, 16), (1, 1)):
        for cw in (256, 512, 1024):
            for nw in (2, 4, 8):
                t = chunk_mix_time(total, rch, wch, chunk_words=cw, num_warps=nw)
                moved = (total // ((rch + wch) * cw * 4)) * (rch + wch) * cw * 4
                print(f"chunks {rch}:{wch} x {cw * 4} B, {nw} warps: {t.median_us:.2f} us = "
                      f"{100 * moved / (t.median_us * 1e3) / ceil:.1f}% of copy", flush=True)
