"""CPU side of tests/gpu/test_vllm_c_*_sm80.py: the vLLM sources that those tests run as SM80
code (the SWA writer, the hash-layer MoE router, the indexer K gather, the MoE path's SwiGLU
with clamp and expert grouping) build as this project's test
libraries (``tests/vllm_c_ops.py``) for sm_80/86 without spills, and the harnesses' restated
host glue still matches the upstream wrappers they stand in for. Skips without nvcc or an
applied tree."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import vllm_c_marlin
import vllm_c_ops
from deepinfer import bundle


def _tree(source: str) -> Path:
    tree = vllm_c_ops.find_tree(source)
    if tree is None:
        pytest.skip("no applied vLLM tree (make apply) with " + vllm_c_ops.SOURCES[source].path)
    return tree


def _src(source: str) -> vllm_c_ops.UpstreamSource:
    """The source's layout in the tree under test (DEEPINFER_VLLM_TREE or the pin's)."""
    return vllm_c_ops.layout(source, _tree(source))


def _text(source: str) -> str:
    return (_tree(source) / _src(source).path).read_text()


def _wrappers(source: str) -> str:
    """The upstream torch-op wrappers, whitespace collapsed: the file from its first wrapper
    on, or the layout's separate wrapper file."""
    src = _src(source)
    if src.wrappers:
        return re.sub(r"\s+", " ", (_tree(source) / src.wrappers).read_text())
    text = _text(source)
    return re.sub(r"\s+", " ", text[src.cut.search(text).start():])


def test_bundle_carries_what_the_harnesses_compile():
    want = {f for name in vllm_c_ops.SOURCES for s in vllm_c_ops.layouts(name)
            for f in (s.path, *s.headers, *s.units, *([s.wrappers] if s.wrappers else []))}
    assert set(bundle.VLLM_CSRC) == want | set(vllm_c_marlin.FILES)


#: Sources cut early in a long file: the kernels the harness launches must be in the half.
KEEPS = {"silu_clamp": ("act_and_mul_kernel", "silu_kernel", "packed_silu_kernel"),
         "moe_align": ("moe_align_block_size_kernel", "count_and_sort_expert_tokens_kernel",
                       "moe_align_block_size_small_batch_expert_kernel")}


@pytest.mark.parametrize("source", sorted(vllm_c_ops.SOURCES))
def test_kernel_half_is_cut_before_the_wrappers(source):
    text, src = _text(source), _src(source)
    half = vllm_c_ops.upstream_text(_tree(source), source, src)
    assert "torch::stable::Tensor" not in half
    assert "torch/csrc/stable" not in half
    if src.extract:  # one kernel: its signature to its last brace
        assert half.startswith("template") and half.rstrip().endswith("}")
        assert half.count("{") == half.count("}") and "__global__" in half
    elif source in KEEPS:  # a file with many ops, cut after the kernels the harness uses
        for name in KEEPS[source]:
            assert name in half, name
    else:
        assert len(half) > len(text) // 2
    if src.cut is None:  # a header without wrappers, and the units that instantiate it
        for unit in src.units:
            assert unit in half
        assert f'#include "{Path(src.path).name}"' not in half
        return
    first = src.cut.search(text).group(0)
    with pytest.raises(vllm_c_ops.VllmCError, match="cut"):
        vllm_c_ops.kernel_half(text.replace(first, "void x("), source, src)


def test_insert_harness_glue_matches_upstream_wrappers():
    """The SWA writer's two wrappers still launch what insert_harness.cu launches: the bf16
    dispatcher for the fused op, the zero-head instantiation for the packed KV-only op."""
    flat = _wrappers("dsv4_insert")
    assert ("launchFusedDeepseekV4Templated<scalar_t, 0, false, false>( nullptr, nullptr, input, "
            "cache, slots, positions, cos_sin, 0.0f, num_tokens, num_tokens, 0,") in flat
    args = re.search(r"launchFusedDeepseekV4QNormRopeKVRopeQuantInsert<qkv_scalar_t>\((.*?)\);",
                     flat).group(1)
    names = [re.sub(r".*?(\w+)\W*$", r"\1", a.split("(")[-1]) for a in args.split(",")]
    assert names[-8:] == ["num_heads_q_padded", "cache_block_size_i", "kv_block_stride",
                          "apply_q_norm", "kv_mxfp8", "apply_q_rope", "is_q_interleaved",
                          "stream"]


def test_hash_topk_harness_glue_matches_upstream_wrapper():
    """With a hash table, the wrapper calls the launcher with use_hash=true and the table's
    index type, as hash_topk_harness.cu does; the launcher then takes the V4 kernel for fp32
    logits, top-6, renormalised, 256 or 384 experts."""
    flat = _wrappers("dsv4_hash_topk")
    assert ("bias_ptr, true, input_ids.value().const_data_ptr<int>(), "
            "tid2eid.value().const_data_ptr<int>(), stream, is_padding_ptr, bias_vl_ptr, "
            "image_sentinel_lo);") in flat
    half = re.sub(r"\s+", " ", vllm_c_ops.upstream_text(_tree("dsv4_hash_topk"), "dsv4_hash_topk",
                                                       _src("dsv4_hash_topk")))
    assert ("if (use_hash && topk == 6 && renormalize && (num_experts == 256 || num_experts == "
            "384)) { launchDsv4HashTopk<IndType, HashIndType>(") in half


def test_indexer_k_gather_glue_matches_upstream_wrapper():
    """The op's launch, as indexer_k_gather_harness.cu restates it: block (8, Y) with Y by
    the token count, grid (tokens / Y, head_dim / 128), and the arguments in this order."""
    flat = re.sub(r"\s+", " ", _text("indexer_k_gather"))
    macro = flat[flat.index("#define CALL_CP_GATHER_INDEXER_K_QUANT_CACHE"):]
    assert ("<<<dim3((num_tokens + BLOCK_Y_SIZE - 1) / BLOCK_Y_SIZE, \\ (head_dim + 8 * "
            "vec_size - 1) / (8 * vec_size)), \\ dim3(8, BLOCK_Y_SIZE), 0, stream>>>(") in macro
    assert ("block_table.const_data_ptr<int32_t>(), \\ cu_seq_lens.const_data_ptr<int32_t>(), "
            "batch_size, dst_k.stride(0), \\ dst_k.size(1), kv_cache.stride(0), "
            "kv_cache.stride(1), \\ kv_cache.size(1), block_table.size(1), num_tokens, \\ "
            "quant_block_size);") in macro
    body = flat[flat.index("void cp_gather_indexer_k_quant_cache("):]
    assert ("if (num_tokens < 32) { CALL_CP_GATHER_INDEXER_K_QUANT_CACHE(1); } else if "
            "(num_tokens < 64) { CALL_CP_GATHER_INDEXER_K_QUANT_CACHE(2); } else if (num_tokens "
            "< 128) { CALL_CP_GATHER_INDEXER_K_QUANT_CACHE(4); } else if (num_tokens < 256) { "
            "CALL_CP_GATHER_INDEXER_K_QUANT_CACHE(8); } else if (num_tokens < 512) { "
            "CALL_CP_GATHER_INDEXER_K_QUANT_CACHE(16); } else { "
            "CALL_CP_GATHER_INDEXER_K_QUANT_CACHE(32); }") in body


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("source", sorted(vllm_c_ops.SOURCES))
def test_sm80_build_without_spills(source, tmp_path):
    lib = vllm_c_ops.build("sm80", source, _tree(source), tmp_path)
    report = vllm_c_ops.ptxas_report(lib)
    entries = [ln for ln in report if "Compiling entry" in ln]
    assert any("for 'sm_80'" in ln for ln in entries), report[:5]
    assert any("for 'sm_86'" in ln for ln in entries), report[:5]
    spills = [ln for ln in report if re.search(r"[1-9]\d* bytes spill", ln)]
    assert not spills, spills[:5]


def test_silu_clamp_glue_matches_upstream_wrapper():
    """activation_harness.cu restates LAUNCH_ACTIVATION_GATE_KERNEL for silu_and_mul_clamp:
    the vector width rule, the block sizes and the template arguments (ACT_FIRST, HAS_CLAMP)."""
    text = _text("silu_clamp").replace("\\\n", " ")
    flat = re.sub(r"\s+", " ", text)
    macro = flat[flat.index("#define LAUNCH_ACTIVATION_GATE_KERNEL("):]
    for said in ("(CUDA_VERSION >= 12090 && cc_major >= 10 && num_tokens > 128) ? "
                 "vllm::VecTraits<true>::ARCH_MAX_VEC_SIZE : "
                 "vllm::VecTraits<false>::ARCH_MAX_VEC_SIZE;",
                 "int vec_size = support_vec / input.element_size();",
                 "const bool use_vec = (d % vec_size == 0);",
                 "dim3 block(std::min(d / vec_size, 1024));", "dim3 block(std::min(d, 1024));",
                 "ACT_FIRST, true, HAS_CLAMP, true><<<grid, block, 0, stream>>>(",
                 "ACT_FIRST, true, HAS_CLAMP, false><<<grid, block, 0, stream>>>(",
                 "ACT_FIRST, false, HAS_CLAMP><<<grid, block, 0, stream>>>(",
                 "d, LIMIT, ALPHA, BETA);"):
        assert said in macro, said
    body = flat[flat.index("void silu_and_mul_clamp("):]
    assert ("LAUNCH_ACTIVATION_GATE_KERNEL(vllm::silu_kernel, vllm::packed_silu_kernel, true, "
            "true, (float)limit, (float)alpha, (float)beta);") in body


def test_moe_align_glue_matches_upstream_wrapper():
    """moe_align_harness.cu restates moe_align_block_size's launch without an expert map."""
    flat = re.sub(r"\s+", " ", _text("moe_align"))
    body = flat[flat.index("void moe_align_block_size(torch::stable::Tensor topk_ids"):]
    body = body[:body.index("void batched_moe_align_block_size(")]
    for said in ("bool small_batch_expert_mode = (topk_ids.numel() < 1024) && (num_experts <= "
                 "64);",
                 "const int32_t threads = max((int32_t)num_experts, WARP_SIZE);",
                 "((threads + 1) * num_experts + (num_experts + 1)) * sizeof(int32_t);",
                 "constexpr int32_t fill_threads = 256;",
                 "small_batch_expert_kernel<<<1, fill_threads + threads, shared_mem_size, "
                 "stream>>>(",
                 "num_experts, block_size, topk_ids.numel(), sorted_token_ids.size(0), "
                 "topk_ids.size(1), has_expert_map, scatter_ptr);",
                 "size_t shared_mem_size = num_warps * experts_per_warp * sizeof(int32_t);",
                 "align_kernel<<<2, threads, shared_mem_size, stream>>>(",
                 "num_experts, padded_num_experts, experts_per_warp, block_size, "
                 "topk_ids.numel(), reinterpret_cast<int32_t*>(cumsum_buffer.mutable_data_ptr()),"
                 " sorted_token_ids.size(0), topk_ids.size(1), has_expert_map);",
                 "const int block_threads = std::min(256, (int)threads);",
                 "const int max_blocks = 65535;", "dim3 gridDims(1, actual_blocks);",
                 "sort_kernel<<<gridDims, block_threads, 0, stream>>>(",
                 "topk_ids.numel(), num_experts, sorted_token_ids.size(0), topk_ids.size(1), "
                 "has_expert_map, scatter_ptr);"):
        assert said in body, said
