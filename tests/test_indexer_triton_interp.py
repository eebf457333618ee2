"""CPU check of the portable Triton indexer scorer (``mqa_logits_tile``, the paged decode
form that ``decode_topk`` falls back to without the extension, for head counts the CUDA
scorer lacks, or with ``DEEPINFER_INDEXER_SCORER=triton``): Triton's interpreter runs it on
CPU tensors, and its int64 top-k keys must equal, bit for bit, keys computed from float64
logits of dyadic inputs (exact in fp32), with the block table given contiguous, as a
column-strided view (every 3rd column of a wider table) and as a row-strided view (every
2nd row). Until 2026-12-03 the kernel read the table with its row stride only, so a
column-strided table gave other pages' keys without an error (found by an audit; vLLM's
tables are column-contiguous, so no vLLM path reached it). Fresh random inputs every run.

The interpreter flag must be set before kernels are defined: the test re-runs this file as
a script in a subprocess (``triton_interp.run_interpreted``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
D = 128


def _oracle_keys(I, IC, torch, kvals, sc, bt, qv, w, row_req, lo, hi, bs, n_cols):
    rows = qv.shape[0]
    out = torch.full((rows, n_cols), I.INT64_MIN, dtype=torch.int64)
    for r in range(rows):
        cols = torch.arange(n_cols)
        valid = (cols >= lo[r]) & (cols < hi[r])
        if not valid.any():
            continue
        vc = cols[valid]
        pg = bt[int(row_req[r]), vc // bs].long()
        L = IC.logits64(qv[r: r + 1], w[r: r + 1], kvals[pg, vc % bs], sc[pg, vc % bs])[0]
        assert torch.equal(L.float().double(), L)  # exact in fp32
        out[r, valid] = I.order_keys(L.float().unsqueeze(0), (vc - lo[r]).unsqueeze(0),
                                     torch.ones(1, len(vc), dtype=torch.bool))[0]
    return out


def _script() -> int:  # runs under TRITON_INTERPRET=1
    sys.path.insert(0, str(HERE))
    from triton_interp import patch_index

    patch_index()
    import torch

    sys.path.insert(0, str(HERE.parent / "overlay"))
    import indexer_cases as IC
    from deepinfer_sm80.ampere import indexer as I
    from deepinfer_sm80.ampere.indexer_triton import mqa_logits_tile

    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    B, NN, H, bs = 3, 2, 16, 16
    ctxs = [50, 17, 64]
    maxb = -(-max(ctxs) // bs)
    nb = B * maxb + 3
    pages, kvals, sc = IC.dyadic_indexer_pages(nb, bs, D, g)
    bt = torch.randperm(nb, generator=g)[: B * maxb].view(B, maxb).int()
    qc, qv = IC.dyadic_fp8((B * NN, H, D), g)
    w = IC.dyadic_weights((B * NN, H), g)
    row_req = torch.arange(B, dtype=torch.int32).repeat_interleave(NN)
    hi = torch.tensor([ctxs[b] - (NN - 1 - i) for b in range(B) for i in range(NN)],
                      dtype=torch.int32)
    lo = torch.tensor([0, 3, 0, 0, 5, 1], dtype=torch.int32)
    n_cols = maxb * bs
    want = _oracle_keys(I, IC, torch, kvals, sc.double(), bt, qv, w, row_req, lo, hi, bs,
                        n_cols)
    wide = torch.full((B, maxb * 3), nb + 5, dtype=torch.int32)  # other columns: bad ids
    wide[:, ::3] = bt
    tall = torch.full((2 * B, maxb), nb + 5, dtype=torch.int32)
    tall[::2] = bt
    tables = {"contiguous": bt, "column_strided": wide[:, ::3], "row_strided": tall[::2]}
    res = {}
    for name, table in tables.items():
        out = torch.full((B * NN, n_cols + 3), 77, dtype=torch.int64)  # poison
        mqa_logits_tile(qc, w.float(), col0=0, n_cols=n_cols, lo=lo, hi=hi, out=out,
                        pages=pages, block_table=table, row_req=row_req, block_size=bs)
        res[name] = {"strides": list(table.stride()),
                     "equal": bool(torch.equal(out[:, :n_cols], want)),
                     "past_untouched": bool((out[:, n_cols:] == 77).all()),
                     "valid_keys": int((want != I.INT64_MIN).sum())}
    print("RESULT " + json.dumps(res))
    return 0


def test_triton_scorer_keys_exact_for_every_table_layout():
    sys.path.insert(0, str(HERE))
    from triton_interp import run_interpreted

    out = run_interpreted(Path(__file__), timeout=900)
    res = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert res["column_strided"]["strides"][1] == 3 and res["row_strided"]["strides"][0] == 2 * 4
    for name, r in res.items():
        assert r["valid_keys"] > 100, (name, r)
        assert r["equal"] and r["past_untouched"], (name, r)


if __name__ == "__main__":
    sys.exit(_script())
