"""vLLM's Marlin kernels, which run every FP8-block linear of DeepSeek-V4, V4.1's MXFP8
linears and the MXFP4 routed experts on capability 8.x (vLLM's own choice, no patch of ours),
run here as SM80 code under vLLM's own Python, against float64 oracles
(tests/vllm_marlin_check.py; the libraries: tests/vllm_c_marlin.py).

- The builds: every bf16 x FP8 (dense) and bf16 x FP4 (MoE) instantiation vLLM generates for
  arch 8.0 compiles from compute_80 (spills, upstream's, are printed).
- Each V4 / V4.1 linear shape and scale form, and the MXFP4 experts through
  ``fused_marlin_moe`` with V4's swiglu clamp, at 1, 5, 64 and 300 tokens, with the host code
  told the A100's limits and, separately, the A6000's: within 1e-2 of float64 (bf16 output).
- The two small compiled ops between the experts' GEMMs (``silu_and_mul_with_clamp``,
  ``moe_align_block_size``), built from the tree too, against their documented contracts.
- The controls (scales loaded in a wrong layout, gate and up swapped) are reported as
  failures.

Needs vLLM's pure-Python dependencies and the tree's Marlin sources (the GPU bundle carries
them); skips naming what is missing."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import vllm_builder_check as checks  # noqa: E402
import vllm_c_marlin  # noqa: E402
import vllm_marlin_check as cases  # noqa: E402


@pytest.fixture(scope="module", params=sorted(vllm_c_marlin.FAMILIES))
def built(request):
    """(family, library path): the dense GEMM and the MoE GEMM."""
    return request.param, vllm_c_marlin.build(checks.gpu_tree(), family=request.param)


@pytest.fixture(scope="module", params=["a100", "a6000"])
def results(request):
    return checks.gpu_results("vllm_marlin_check.py", "--limits", request.param)


def test_every_instantiation_builds(built):
    """Every generated instantiation compiled (one ptxas report each). Spills are upstream's
    and printed, not judged: some of Marlin's configurations spill a few bytes from
    compute_80 PTX, as they do in vLLM's own build."""
    family, lib_path = built
    units, _ = vllm_c_marlin.generate(checks.gpu_tree(), family)
    report = vllm_c_marlin.ptxas_report(lib_path)
    marlin = [ln for ln in report if "Function properties" in ln and "6MarlinIL" in ln]
    assert len(marlin) == len(units) >= 30, report[:5]
    log = (lib_path.parent / "build.log").read_text().splitlines()
    spills = [ln.strip() for ln in log if "spill" in ln and not ln.strip().endswith(
        "0 bytes spill stores, 0 bytes spill loads")]
    print(f"{family}: {len(units)} Marlin instantiations; {len(spills)} with spills: {spills}")


@pytest.mark.parametrize("case", [c for c in cases.CASES if c not in cases.CONTROLS])
def test_case_matches_its_oracle(results, case):
    r = results[case]
    runs = r.get("runs", [])
    if runs and "rel_err" in runs[0]:
        print(f"{case}: seed {r.get('seed')}, rel err by tokens "
              f"{[(run['m'], round(run['rel_err'], 6)) for run in runs]}")
    else:
        print(f"{case}: seed {r.get('seed')}, {runs}")
    assert r["ok"], r


@pytest.mark.parametrize("case", cases.CONTROLS)
def test_the_check_can_fail(results, case):
    r = results[case]
    assert "error" not in r, r
    assert not r["ok"], r
    worst = max(run["rel_err"] for run in r["runs"])
    print(f"{case}: rel err up to {worst:.3f}")
    assert worst > 10 * cases.REL_TOL
