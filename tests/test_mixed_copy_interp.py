"""CPU check of the reference copies of bench/mixed_copy.py (the rows that docs/benchmarks.md
sets next to the gather: the chunked 9:16 copy and the record -> row copy of the gather's own
traffic). Triton's interpreter (TRITON_INTERPRET=1) runs each kernel on CPU tensors and the
module's own torch checks must pass: a reference copy that does not move what it claims to
would make its percentage meaningless. Fresh random inputs every run.

The interpreter flag must be set before kernels are defined, so the test re-runs this file as
a script in a subprocess (numpy >= 2.4 workaround: tests/triton_interp.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _script() -> int:  # runs under TRITON_INTERPRET=1
    sys.path.insert(0, str(HERE))
    from triton_interp import patch_index

    patch_index()
    sys.path.insert(0, str(HERE.parent / "bench"))
    import mixed_copy

    # chunked copy: 3 programs of 9 read + 16 written chunks of 64 words; 2 : 3 of 16 words
    mixed_copy.chunk_mix_time(3 * 25 * 64 * 4, 9, 16, chunk_words=64, device="cpu")
    mixed_copy.chunk_mix_time(5 * 5 * 16 * 4, 2, 3, chunk_words=16, device="cpu")
    # records -> rows: a partial last program, several pages, random and linear page order
    mixed_copy.records_copy_time(150, per_prog=8, block_size=64, device="cpu")
    mixed_copy.records_copy_time(37, per_prog=16, block_size=16, page_bytes=16 * 584 + 64,
                                 shuffle=False, device="cpu")
    # the diagnostics: no scale-word read; no block table (linear pages)
    mixed_copy.records_copy_time(150, per_prog=8, block_size=64, scale=False, device="cpu")
    mixed_copy.records_copy_time(70, per_prog=64, block_size=64, use_bt=False, device="cpu")
    # one [E, 256] tile per program
    mixed_copy.records_copy_time(150, per_prog=16, block_size=64, wide=True, device="cpu")
    # the faithful record -> row copy: a partial last program, 16-entry pages
    mixed_copy.records_widen_time(150, per_prog=8, block_size=64, device="cpu")
    mixed_copy.records_widen_time(37, per_prog=16, block_size=16, page_bytes=16 * 584 + 64, device="cpu")
    # the chunked copy with its reads in cache pages: random, linear, linear without lookup
    mixed_copy.chunk_pages_time(3 * 16, block_size=16, page_bytes=16 * 584 + 64, chunk_words=128,
                                device="cpu")
    mixed_copy.chunk_pages_time(2 * 16, block_size=16, page_bytes=16 * 584 + 64, chunk_words=128,
                                shuffle=False, device="cpu")
    mixed_copy.chunk_pages_time(2 * 16, block_size=16, page_bytes=16 * 584 + 64, chunk_words=128,
                                use_bt=False, device="cpu")
    # smaller programs: 8 and 16 parts per page (the gather's four-record tile)
    mixed_copy.chunk_pages_time(2 * 16, block_size=16, page_bytes=16 * 584 + 64, chunk_words=32,
                                parts=8, device="cpu")
    mixed_copy.chunk_pages_time(3 * 64, block_size=64, page_bytes=64 * 584 + 64, chunk_words=64,
                                parts=16, device="cpu")
    print("RESULT ok")
    return 0


sys.path.insert(0, str(HERE))


def test_reference_copies_under_interpreter():
    from triton_interp import run_interpreted

    assert "RESULT ok" in run_interpreted(Path(__file__).resolve(), timeout=600)


if __name__ == "__main__":
    sys.exit(_script())
