"""CPU side of tests/gpu/test_vllm_c_insert_sm80.py: vLLM's SWA writer builds as this
project's test library (``tests/vllm_c_ops.py``) for both variants, without spills, and the
harness's restated host glue still matches the upstream wrappers it stands in for. Skips
without nvcc or an applied tree."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(_TESTS))
sys.path.insert(0, str(_TESTS.parent / "tools"))

import vllm_c_ops  # noqa: E402
from deepinfer import bundle  # noqa: E402


def _tree() -> Path:
    tree = vllm_c_ops.find_tree()
    if tree is None:
        pytest.skip("no applied vLLM tree (make apply) with " + vllm_c_ops.UPSTREAM_SRC)
    return tree


def test_bundle_carries_what_the_harness_compiles():
    assert set(bundle.VLLM_CSRC) == {vllm_c_ops.UPSTREAM_SRC, *vllm_c_ops.UPSTREAM_HEADERS}


def test_kernel_half_is_cut_before_the_wrappers():
    src = (_tree() / vllm_c_ops.UPSTREAM_SRC).read_text()
    half = vllm_c_ops.kernel_half(src)
    assert "launchFusedDeepseekV4QNormRopeKVRopeQuantInsert" in half
    assert "torch::stable::Tensor" not in half
    assert "torch/csrc/stable" not in half
    with pytest.raises(vllm_c_ops.VllmCError, match="CUT_MARKER"):
        vllm_c_ops.kernel_half(src.replace("void fused_deepseek_v4_kv_rope_insert(", "void x("))


def test_harness_glue_matches_upstream_wrappers():
    """The two upstream wrappers still launch what insert_harness.cu launches: the bf16
    dispatcher for the fused op, the zero-head instantiation for the packed KV-only op."""
    src = (_tree() / vllm_c_ops.UPSTREAM_SRC).read_text()
    wrappers = src[vllm_c_ops.CUT_MARKER.search(src).start():]
    flat = re.sub(r"\s+", " ", wrappers)
    assert "launchFusedDeepseekV4Templated<scalar_t, 0, false, false>( nullptr, nullptr, input, cache, slots, positions, cos_sin, 0.0f, num_tokens, num_tokens, 0," in flat
    assert "launchFusedDeepseekV4QNormRopeKVRopeQuantInsert<qkv_scalar_t>(" in flat
    args = re.search(r"launchFusedDeepseekV4QNormRopeKVRopeQuantInsert<qkv_scalar_t>\((.*?)\);",
                     flat).group(1)
    names = [re.sub(r".*?(\w+)\W*$", r"\1", a.split("(")[-1]) for a in args.split(",")]
    assert names[-8:] == ["num_heads_q_padded", "cache_block_size_i", "kv_block_stride",
                          "apply_q_norm", "kv_mxfp8", "apply_q_rope", "is_q_interleaved",
                          "stream"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("variant", sorted(vllm_c_ops.VARIANTS))
def test_builds_without_spills(variant, tmp_path):
    lib = vllm_c_ops.build(variant, _tree(), tmp_path)
    report = vllm_c_ops.ptxas_report(lib)
    entries = [ln for ln in report if "Compiling entry" in ln]
    # 5 head counts x 4 (norm, layout) + the KV-only one, two kernels each where the head
    # count is non-zero, plus the full-cache kernels: dozens per target.
    assert len(entries) >= 40, report[:5]
    spills = [ln for ln in report if re.search(r"[1-9]\d* bytes spill", ln)]
    assert not spills, spills[:5]
    if variant == "sm80":
        assert any("for 'sm_80'" in ln for ln in entries)
        assert any("for 'sm_86'" in ln for ln in entries)
