"""CPU side of tests/gpu/test_vllm_c_marlin_sm80.py: the Marlin sources of the applied tree
still have the shape tests/vllm_c_marlin.py takes them in (the cuts before the torch-op
wrappers, the generator's instantiations and selector, the op schemas), the host glue that
tests/vllm_c_marlin.py and tests/vllm_c/marlin_harness.cu restate still matches upstream's
wrappers, and the harness plus one instantiation compile for sm_80 / sm_86.
Skips without an applied tree, jinja2 (the generator's) or nvcc."""
from __future__ import annotations

import re
import shutil

import pytest
import vllm_c_marlin
from vllm_c_ops import VllmCError


@pytest.fixture(scope="module")
def tree():
    t = vllm_c_marlin.find_tree()
    if t is None:
        pytest.skip("no applied vLLM tree with the Marlin sources (make apply)")
    return t


@pytest.fixture(scope="module")
def generated(tree):
    pytest.importorskip("jinja2", reason="the tree's generate_kernels.py needs jinja2")
    return vllm_c_marlin.generate(tree)


def test_moe_family_generates_its_fp4_instantiations(tree, generated):
    units, selector = vllm_c_marlin.generate(tree, "moe")
    # e2m1: MXFP4 (e8m0, group 32) and NVFP4 (e4m3, group 16), 15 each; e4m3: 45 as dense
    assert len(units) == 75
    assert "kFE2M1f" in selector and "s_type == vllm::kFE8M0fnu" in selector
    assert "b_type == vllm::kFE4M3fn" in selector
    half = vllm_c_marlin.moe_half(tree)
    assert "void marlin_mm(" in half and "torch::stable::Tensor" not in half


def test_selector_keeps_exactly_the_built_instantiations(generated):
    units, selector = generated
    # 5 m-block sizes x 3 thread configs x 3 groupings (channel, group 128, MXFP8's e8m0 32)
    assert len(units) == 45
    entries = re.findall(r"^(if|else if) \(", selector, re.M)
    assert entries[0] == "if" and set(entries[1:]) == {"else if"}
    assert len(entries) == len(units)
    assert "kFE8M0fnu" in selector and "group_blocks == 8" in selector
    assert "kFloat16" not in selector and "kFE2M1f" not in selector
    for text in units.values():
        assert text.count("template __global__ void Marlin<") == 1


def test_cuts_leave_no_wrapper(tree):
    gemm, repack = vllm_c_marlin.gemm_half(tree), vllm_c_marlin.repack_half(tree)
    for half in (gemm, repack):
        assert "torch::stable::Tensor" not in half.split("#else", 1)[-1]
        assert "torch/csrc/stable" not in half
        assert "STABLE_TORCH_LIBRARY_IMPL" not in half
    assert "void marlin_mm(" in gemm and "determine_exec_config(" in gemm
    opened = len(re.findall(r"^\s*#\s*if", gemm, re.M))
    assert opened == len(re.findall(r"^\s*#\s*endif", gemm, re.M))
    assert "gptq_marlin_repack_kernel" in repack and "CALL_IF" not in repack


def test_a_moved_wrapper_is_reported(tree):
    text = (tree / vllm_c_marlin.MARLIN / "marlin.cu").read_text()
    with pytest.raises(VllmCError, match="upstream moved"):
        vllm_c_marlin._cut(text.replace("torch::stable::Tensor marlin_gemm(", "void x("),
                           vllm_c_marlin.GEMM_CUT, "marlin.cu", True)


def test_schemas_are_the_trees(tree):
    schemas = vllm_c_marlin.op_schemas(tree)
    assert schemas["marlin_gemm"].startswith("marlin_gemm(Tensor a, Tensor? c_or_none,")
    assert schemas["marlin_gemm"].endswith("-> Tensor")
    a8 = "-DDEEPINFER_MARLIN_REPACK_A8=1" in vllm_c_marlin.layout_defines(tree)
    assert ("int num_bits, bool is_a_8bit" in schemas["gptq_marlin_repack"]) == a8
    assert ("Tensor? a_scales" in schemas["marlin_gemm"]) == (
        "-DDEEPINFER_MARLIN_A_SCALES=1" in vllm_c_marlin.layout_defines(tree))


def test_restated_glue_matches_the_upstream_wrappers(tree):
    """What MarlinLib and the harness restate, as upstream's wrappers still say it."""
    marlin = re.sub(r"\s+", " ", (tree / vllm_c_marlin.MARLIN / "marlin.cu").read_text())
    wrapper = marlin[marlin.rfind("torch::stable::Tensor marlin_gemm("):]
    for said in (
            "int max_m_block_size = (size_m + 16 - 1) / 16 * 16;",
            "max_m_block_size = min(max_m_block_size, 64);",
            "sms * max_m_block_size * MARLIN_NAMESPACE_NAME::max_thread_n;",
            "group_size = size_k / num_groups;",
            "int thread_k = -1;", "int thread_n = -1;",
            "if (size_m == 0) return c;",
            "} else if (b_type_id == vllm::kFE4M3fn.id() && b_scales.scalar_type() == "
            "torch::headeronly::ScalarType::Float8_e8m0fnu) { s_type_id = vllm::kFE8M0fnu.id();",
            "size_m, size_n, size_k, a.stride(0), workspace.mutable_data_ptr(), a_type, b_type, "
            "c_type, s_type, has_bias, has_zp, num_groups, group_size, device_index, "
            "get_current_cuda_stream(device_index), thread_k, thread_n, sms, use_atomic_add, "
            "use_fp32_reduce, is_zp_float);"):
        assert said in wrapper, said
    repack = (tree / vllm_c_marlin.MARLIN / "gptq_marlin_repack.cu").read_text()
    repack = re.sub(r"\s+", " ", repack.replace("\\\n", " "))  # macro line breaks too
    a8 = "-DDEEPINFER_MARLIN_REPACK_A8=1" in vllm_c_marlin.layout_defines(tree)
    for said in ("<<<blocks, marlin::repack_threads, max_shared_mem, stream>>>( "
                 "b_q_weight_ptr, out_ptr, size_k, size_n);",
                 "{size_k / marlin::tile_size, size_n * marlin::tile_size / pack_factor}",
                 "CALL_IF(4, false) CALL_IF(8, false) CALL_IF(4, true) CALL_IF(8, true)" if a8
                 else "CALL_IF(4) CALL_IF(8) else {"):
        assert said in repack, said


def test_restated_moe_glue_matches_the_upstream_wrapper(tree):
    ops = re.sub(r"\s+", " ", (tree / vllm_c_marlin.MOE / "ops.cu").read_text())
    wrapper = ops[ops.find("torch::stable::Tensor moe_wna16_marlin_gemm("):]
    for said in (
            "(long)size_n * sorted_token_ids.size(0), (long)sms * 4 * moe_block_size * "
            "MARLIN_NAMESPACE_NAME::max_thread_n);",
            "if (moe_block_size == 8) max_c_tmp_size *= 2;",
            "if (use_fp32_reduce && !use_atomic_add) {",
            "int num_experts = b_q_weight.size(0);",
            "num_groups = b_scales.size(1);", "group_size = size_k / num_groups;",
            "max_n_tiles * (int)(sorted_token_ids.size(0) / moe_block_size), sms * 4);",
            "topk_weights.mutable_data_ptr(), moe_block_size, num_experts, top_k, "
            "mul_topk_weights, size_m, size_n, size_k, workspace.mutable_data_ptr(), a_type, "
            "b_type, c_type, s_type, has_bias, has_zp, group_size, dev, "
            "get_current_cuda_stream(dev), thread_k, thread_n, sms, blocks_per_sm, "
            "use_atomic_add, use_fp32_reduce, is_zp_float);"):
        assert said in wrapper, said


@pytest.mark.parametrize("family", sorted(vllm_c_marlin.FAMILIES))
def test_harness_and_an_instantiation_compile_for_ampere(tree, generated, tmp_path, family):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    pytest.importorskip("torch")
    lines = vllm_c_marlin.compile_check(tree, tmp_path, family=family)
    assert any("sm_80" in ln for ln in lines) and any("sm_86" in ln for ln in lines)
    assert any("6MarlinIL" in ln for ln in lines)
