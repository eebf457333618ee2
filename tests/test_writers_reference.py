"""CPU checks of the SM80 FP8 writers and their torch references.

* The references' codecs against torch's own float8 conversion and hand cases.
* Every shipped Triton writer run in Triton's CPU interpreter (subprocess with
  TRITON_INTERPRET=1) against the references: byte-exact.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "overlay"))
from deepinfer_sm80.reference import writers as R

HERE = os.path.dirname(os.path.abspath(__file__))


def test_e4m3_ref_matches_torch_in_range():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(100000, generator=g) * 50, torch.randn(10000, generator=g) * 1e-3,
                   R.e4m3_decode_table()[:0x7F].float()]).clamp(-448, 448)
    assert torch.equal(R.e4m3_encode_ref(x), x.to(torch.float8_e4m3fn).view(torch.uint8))


@pytest.mark.parametrize("value,code", [
    (1.0625, 0x38),  # tie between 1.0 (even) and 1.125 -> 1.0
    (1.1875, 0x3A),  # tie between 1.125 and 1.25 (even) -> 1.25
    (464.0, 0x7E), (1e4, 0x7E), (float("inf"), 0x7E), (-1e4, 0xFE),  # satfinite
    (2.0**-10, 0x00),  # tie between 0 and 2^-9 -> 0
    (3 * 2.0**-10, 0x02),  # tie between 2^-9 and 2^-8 -> 2^-8 (even)
    (-0.0, 0x80), (float("nan"), 0x7F),
])
def test_e4m3_ref_cases(value, code):
    assert int(R.e4m3_encode_ref(torch.tensor([value]))[0]) == code


def test_e4m3_decode_table_roundtrip():
    tab = R.e4m3_decode_table()
    codes = torch.arange(256)
    ok = ~tab.isnan()
    assert torch.equal(R.e4m3_encode_ref(tab[ok]), codes[ok].to(torch.uint8))
    assert int(ok.sum()) == 254 and tab[ok].abs().max() == 448.0


def test_ue8m0_ref_exact_at_powers_of_two():
    s = torch.pow(2.0, torch.arange(-30, 30, dtype=torch.float64))
    assert torch.equal(R.ue8m0_exponent_ref(s), torch.arange(-30, 30) + 127)
    up = torch.nextafter(s.float(), torch.full_like(s.float(), 1e30))
    assert torch.equal(R.ue8m0_exponent_ref(up), torch.arange(-30, 30) + 128)


def test_quant_group_floor_and_scale():
    yb = torch.zeros(2, 64, dtype=torch.float64)
    yb[1, 5] = 448.0 * 2.0**-3
    codes, ue = R.quant_group_ue8m0(yb)
    # all-zero group: scale floored at 1e-4 -> ceil(log2(1e-4)) = -13 -> 114
    assert int(ue[0]) == 114 and int(codes[0].max()) == 0
    # exact power of two boundary: scale 2^-3 -> byte 124, value -> 448 (0x7E)
    assert int(ue[1]) == 124 and int(codes[1, 5]) == 0x7E


def test_fp8_ds_mla_entry_roundtrip():
    g = torch.Generator().manual_seed(5)
    y = torch.randn(512, generator=g, dtype=torch.float64)
    cos, sin = torch.ones(32, dtype=torch.float64), torch.zeros(32, dtype=torch.float64)
    codes, sb, rope = R.fp8_ds_mla_entry_ref(y, cos, sin)
    page = torch.zeros(64 * 584 + 64, dtype=torch.uint8)
    value, sb = R.fp8_ds_mla_entry_bytes(codes, sb, rope, 64)
    page[3 * 576:4 * 576] = value
    page[64 * 576 + 3 * 8:64 * 576 + 4 * 8] = sb
    back = R.fp8_ds_mla_dequant_ref(page, 64, 3)
    rel = ((back[:448] - y[:448]).abs() / y[:448].abs().max()).max()
    assert rel < 2.0**-3  # e4m3 has a 3-bit mantissa
    assert torch.equal(back[448:], y[448:].float().bfloat16().double())


@pytest.fixture(scope="module")
def interp_results():
    pytest.importorskip("triton", reason="triton is not installed (make venv-torch)")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "writers_interp_check.py")],
                          capture_output=True, text=True, env=env, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_interp_codecs_exact(interp_results):
    r = interp_results
    assert r["encode_count"] > 70000
    assert r["encode_mismatch"] == 0
    assert r["decode_mismatch"] == 0
    assert r["ue8m0_mismatch"] == 0
    assert r["bf16_mismatch"] == 0


@pytest.mark.parametrize("name", ["c4", "c128", "indexer_c4"])
def test_interp_compressor_store_bytes_exact(interp_results, name):
    r = interp_results[name]
    assert r["codes"] > 0
    assert r["untouched_equal"], "writer touched bytes outside the boundary entries"
    assert r["codes_exact"] == 1.0 and r["scales_exact"] == 1.0
    if "rope_exact" in r:
        assert r["rope_exact"] == 1.0


def test_interp_index_q_exact(interp_results):
    r = interp_results["index_q"]
    assert r["codes_exact"] == 1.0 and r["weights_exact"]


def test_interp_fused_indexer_scorer_sets(interp_results):
    assert interp_results["indexer_fused_prefill_sets_equal"]
    assert interp_results["indexer_fused_decode_sets_equal"]


def test_interp_inverse_rope_kernel(interp_results):
    assert interp_results["inverse_rope_equal"]
