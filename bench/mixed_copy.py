"""Copy ceiling for an asymmetric read:write mix (bench_cache's gather rows).

A gather of V4 cache records reads 584 bytes and writes 1024 bytes per entry (1 : 1.75),
while the copy ceiling (``common.copy_bandwidth``) and the same-bytes copy read and write
equal amounts. ``widen_rows_time`` times a Triton kernel that does nothing but that mix
over contiguous rows: row r of ``src`` (``read_words`` int32) is written to row r of
``dst`` (``write_words`` int32) followed by zeros. No gather, no decode: what the memory
system gives this traffic mix at this size, graph-replayed like the kernels.

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
