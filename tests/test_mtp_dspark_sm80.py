"""DeepSeek-V4 MTP layer and DSpark draft on SM80/SM86: nothing left on a failing path (CPU).

The MTP layer (``nvidia/mtp.py``) and the DSpark draft (``nvidia/dspark.py``) reuse
the decoder layer, so their attention goes through ``_select_dsv4_attn_cls``; they
add their own Triton kernels (fused MTP-input RMSNorm, shared-head RMSNorm, DSpark's
non-causal sliding-window indices) and DSpark calls the ``_C`` fused
qnorm/RoPE/KV-insert op itself (``_insert_context_kv``). This test, on the applied
tree imported with a CUDA platform mocked to 8.0 and 8.6 (tests/vllm_cpu_harness.py):

1. enumerates the Triton kernels reachable from those paths: it walks the modules
   that ``mtp.py``, ``dspark.py`` and their speculators import (transitively, within
   the DeepSeek-V4 / MLA-backend / spec-decode packages), collects every
   ``JITFunction`` and every vLLM JIT-kernel owner defined there, and keeps those whose
   name the MTP/DSpark path files reference (:data:`PATH_MODULES`). Each owner's
   compile keys come from vLLM's own ``get_warmup_keys`` with the draft's dimensions
   (window 128, SWA block 64, 1..7 speculative tokens, hidden 4096, hc_mult 4), and
   each key is compiled ahead of time for the probed capability through vLLM's
   warmup path with a Triton driver that reports that target and launches nothing.
   Triton helpers are compiled inside their callers. Kernels launched bare from
   Python (the speculators' input-preparation kernels, the Gumbel sampler, the
   SWA image-visibility kernel) have no compile keys: they are compiled for the
   capability with the constexprs of their call sites (literals and module
   constants as written; run-time block sizes, integers and flags at candidate
   values, one at a time) and placeholder pointer types, and their source (with
   callees) is scanned for SM89+/SM90-only constructs (FP8 types, TMA descriptors,
   inline PTX, PDL);
2. builds the MTP layer and the DSpark draft model with linear layers, norms,
   embeddings and heads as stand-ins and records the attention class their decoder
   layers select (must be ``DeepseekV4AmpereSparseAttention``); builds that class
   for the draft layer index (sliding-window only) and runs DSpark's
   ``_insert_context_kv`` with the ``_C`` op replaced by a recorder: the padded head
   count it passes must be one the op is instantiated for (parsed from the tree's
   ``csrc`` and read off an sm_80 cubin that nvcc builds from that source), and the
   op must be built for every CUDA architecture and accept sm_80;
3. does the same for DeepSeek-V4.1's DSpark draft (``DSparkV41DraftModel``,
   ``deepseek_v41/nvidia/dspark.py``, V4.1's own decoder layer): its 3 layers select V4.1's
   Ampere attention, which, built at the draft indices, is sliding-window only, and its
   ``_insert_context_kv`` calls the KV-only ``_C`` op on the bound uint8 cache;
4. can fail: a known FP8 kernel goes through the same compile step and must fail
   with the SM89+ error, and on the pristine tree the drafts (V4's and V4.1's) select
   FlashMLA.

Marked ``network``: the applied tree comes from the vLLM sdist (cached).
"""
from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import triton_smem  # noqa: E402
import vllm_cpu_harness as harness  # noqa: E402

AMPERE_CLS = "vllm.models.deepseek_v4.nvidia.ampere_sparse.DeepseekV4AmpereSparseAttention"
V41_AMPERE_CLS = ("vllm.models.deepseek_v41.nvidia.ampere_sparse."
                  "DeepseekV41AmpereSparseAttention")

#: Where the walk starts: the two draft models and their model-runner speculators.
ENTRY_MODULES = (
    "vllm.models.deepseek_v4.nvidia.mtp",
    "vllm.models.deepseek_v4.nvidia.dspark",
    "vllm.v1.worker.gpu.spec_decode.mtp.speculator",
    "vllm.v1.worker.gpu.spec_decode.dspark.speculator",
)
#: Packages the walk follows imports into.
WALK_PREFIXES = (
    "vllm.models.deepseek_v4", "vllm.v1.worker.gpu.spec_decode",
    "vllm.model_executor.models.qwen3_dspark", "vllm.model_executor.models.deepseek_mtp",
    "vllm.v1.attention.backends.mla", "vllm.model_executor.kernels.mhc",
    "vllm.v1.worker.gpu.sample", "vllm.model_executor.layers.sparse_attn_indexer",
    "deepinfer_sm80",
)
#: Files whose code is the MTP / DSpark path itself (beyond the shared decoder layer,
#: whose kernels tests/test_gates_sm80.py compiles): a kernel is on the path when one
#: of these references it by name.
PATH_MODULES = (
    "vllm.models.deepseek_v4.nvidia.mtp",
    "vllm.models.deepseek_v4.nvidia.dspark",
    "vllm.models.deepseek_v4.common.ops.fused_mtp_input_rmsnorm",
    "vllm.model_executor.models.qwen3_dspark",
    "vllm.v1.attention.backends.mla.sparse_swa",  # draft layers are sliding-window only
    "vllm.v1.worker.gpu.spec_decode.mtp.speculator",
    "vllm.v1.worker.gpu.spec_decode.dspark.speculator",
    "vllm.v1.worker.gpu.spec_decode.dspark.utils",
    "vllm.v1.worker.gpu.spec_decode.dflash.speculator",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator",
)
#: Up to 8 query rows per request: DSpark drafts 7 tokens in upstream's DeepSeek-V4-Flash
#: recipe (recipes/models/deepseek-ai/DeepSeek-V4-Flash.yaml), MTP 1-2.
NUM_SPEC_TOKENS = (1, 2, 3, 4, 5, 6, 7)
#: Values for ``get_warmup_keys`` parameters, by name (lists: every value).
WARMUP_ARGS: dict[str, list[Any]] = {
    "window_size": [128], "block_size": [64], "num_speculative_tokens": list(NUM_SPEC_TOKENS),
    "max_image_tokens": [0],
}
#: Source patterns that only compile for SM89+ / SM90+ (or emit such PTX).
SM89_PLUS = {
    "fp8 type": r"float8e4|float8e5|fp8e4|fp8e5|float8_e4m3|float8_e5m2",
    "TMA descriptor": r"make_tensor_descriptor|_experimental_descriptor|tensor_descriptor|tma",
    "inline PTX": r"inline_asm_elementwise",
    "PDL": r"gdc_wait|gdc_launch_dependents|launch_pdl",
}


# ------------------------------------------------------------------------------ tests

C_OP_SRC = "csrc/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu"


def _c_op_facts(tree: Path) -> dict[str, Any]:
    """What the tree's csrc says about the fused qnorm/RoPE/KV-insert op: the padded
    head counts it is instantiated for, the lowest SM its host guard accepts, and
    whether CMake builds it for every CUDA architecture (8.0 and 8.6 included)."""
    src = (tree / C_OP_SRC).read_text()
    launcher = src[src.index("void launchFusedDeepseekV4QNormRopeKVRopeQuantInsert("):]
    launcher = launcher[: launcher.index("#undef DISPATCH")]
    heads = {int(n) for n in re.findall(r"^\s*DISPATCH\((\d+)\)", launcher, re.M)}
    heads |= {int(n) for n in re.findall(r"LAUNCH\((\d+),", launcher)}  # KV-only: 0
    guard = re.search(
        r"sm_version\s*>=\s*(\d+),\s*\"fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert", src)
    cmake = (tree / "CMakeLists.txt").read_text()
    block = re.search(r"set\(VLLM_STABLE_EXT_SRC\b(.*?)\)", cmake, re.S)
    all_archs = re.search(r"set_gencode_flags_for_srcs\(\s*SRCS \"\$\{VLLM_STABLE_EXT_SRC\}\"\s*"
                          r"CUDA_ARCHS \"\$\{CUDA_ARCHS\}\"\)", cmake)
    supported = re.findall(r'set\(CUDA_SUPPORTED_ARCHS "([^"]+)"\)', cmake)
    return {
        "heads": heads, "min_sm": int(guard.group(1)) if guard else None,
        "in_stable_ext": bool(block) and C_OP_SRC in block.group(1),
        "built_for_cuda_archs": bool(all_archs),
        "sm8x_supported": bool(supported) and all({"8.0", "8.6"} <= set(s.split(";"))
                                                   for s in supported),
    }


if "pytest" in sys.modules:
    import pytest

    pytestmark = pytest.mark.network
    SM8X = ("8.0", "8.6")

    @pytest.fixture(scope="module")
    def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
        harness.skip_without_dependencies()
        return harness.prepare_trees(tmp_path_factory)

    @pytest.fixture(scope="module")
    def patched(trees: dict[str, Path]) -> dict[str, dict[str, Any]]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(SM8X)) as pool:  # one process each
            futures = {cap: pool.submit(run_child, trees["patched"], cap, "kernels",
                                        "attention", "insert", "v41_attention",
                                        "v41_insert") for cap in SM8X}
            return {cap: f.result() for cap, f in futures.items()}

    @pytest.mark.parametrize("cap", SM8X)
    def test_draft_triton_kernels_compile_for_sm8x(patched, cap: str) -> None:
        got = patched[cap]["kernels"]
        assert "error" not in got, got
        owners = got["owners"]
        # the enumeration found the drafts' own kernels (not a hand-typed list)
        short = {q.rpartition(".")[2] for q in owners}
        assert {"_FUSED_MTP_INPUT_RMSNORM_KERNEL", "_MTP_SHARED_HEAD_RMSNORM_KERNEL",
                "_COMPUTE_DSPARK_NONCAUSAL_SWA_INDICES_KERNEL",
                "_COMPUTE_SWA_INDICES_AND_LENS_KERNEL"} <= short, sorted(owners)
        for qual, entry in owners.items():
            assert entry["keys"] > 0 and entry["compiled"] == entry["keys"], (qual, entry)
        dspark = next(e for q, e in owners.items() if q.endswith("NONCAUSAL_SWA_INDICES_KERNEL"))
        # 128-token window + up to 7 draft tokens, padded to the 64 alignment
        assert "index_width=192" in dspark["sample_key"], dspark
        mtp_norm = next(e for q, e in owners.items() if q.endswith("_MTP_INPUT_RMSNORM_KERNEL"))
        assert mtp_norm["keys"] == len(HIDDEN_SIZES), mtp_norm
        assert any(q.endswith("._rmsnorm_row") for q in got["helpers"]), got["helpers"]
        # kernels launched bare from the path (speculators, sampler, SWA metadata)
        bare = {q.rpartition(".")[2]: e for q, e in got["bare"].items()}
        assert {"_prepare_dflash_inputs_kernel", "_gumbel_sample_kernel",
                "_update_draft_inputs_kernel"} <= set(bare), sorted(bare)
        for name, entry in bare.items():
            assert entry["keys"] > 0 and entry["compiled"] == entry["keys"], (name, entry)
            assert entry["sm89_plus"] == [], f"{name} uses SM89+ constructs: {entry}"
        # the compile step rejects what SM80 cannot run: FP8 conversion
        for ctrl in (got["control_fp8"], got["control_fp8_bare"]):
            assert ctrl["keys"] > 0 and ctrl["compiled"] == 0, ctrl
            assert all("fp8e4nv not supported in this architecture" in f
                       for f in ctrl["failed"]), ctrl
        sm90 = got["control_fp8_bare_sm90"]
        assert sm90["keys"] > 0 and sm90["compiled"] == sm90["keys"], sm90

    @pytest.mark.parametrize("cap", SM8X)
    def test_mtp_and_dspark_layers_select_the_ampere_attention(patched, cap: str) -> None:
        got = patched[cap]["attention"]
        assert "error" not in got and "dspark_error" not in got, got
        assert got["mtp"] == [AMPERE_CLS]
        assert got["dspark"] == [AMPERE_CLS] * 3  # n_mtp_layers draft layers

    @pytest.mark.parametrize("cap", SM8X)
    def test_dspark_context_insert_uses_an_instantiated_c_op(trees, patched, cap: str) -> None:
        got = patched[cap]["insert"]
        assert "error" not in got, got
        facts = _c_op_facts(trees["patched"])
        assert facts["heads"] == {0, 8, 16, 32, 64, 128}, facts
        assert facts["min_sm"] is not None and facts["min_sm"] <= 80, facts
        assert facts["in_stable_ext"] and facts["built_for_cuda_archs"], facts
        assert facts["sm8x_supported"], facts
        # draft layers are sliding-window only; their builder has no FlashMLA planner
        assert got["compress_ratio"] == 1
        assert got["swa_builder"].endswith("DeepseekSparseSWAAmpereMetadataBuilder")
        assert got["padded_heads"] in facts["heads"] and got["padded_heads"] >= got["n_local_heads"]
        for tp, padded in got["padded_by_tp"].items():
            assert padded in facts["heads"] and padded >= 64 // int(tp), (tp, padded)
        assert got["padded_by_tp"]["8"] == 8  # TP8 keeps its 8 local heads
        [call] = got["insert_calls"]
        assert call["op"] == "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert"
        assert call["q_head_padded"] == got["padded_heads"] and call["q_heads"] <= call[
            "q_head_padded"]

    @pytest.mark.parametrize("cap", SM8X)
    def test_v41_dspark_draft_layers_select_the_v41_ampere_attention(patched, cap: str) -> None:
        """DeepSeek-V4.1's DSpark draft (``DSparkV41DraftModel``) builds V4.1's own decoder
        layers: each of its 3 draft layers selects V4.1's Ampere attention."""
        got = patched[cap]["v41_attention"]
        assert "error" not in got and "dspark_error" not in got, got
        assert got["dspark"] == [V41_AMPERE_CLS] * 3

    @pytest.mark.parametrize("cap", SM8X)
    def test_v41_dspark_context_insert_takes_the_kv_only_op(patched, cap: str) -> None:
        """V4.1's Ampere layer at the draft indices (past ``compress_ratios``: sliding
        window only, no indexer, the Ampere SWA builder), and V4.1 DSpark's
        ``_insert_context_kv`` with it: one call of the KV-only ``_C`` op over the bound
        uint8 cache (584-byte records, no FP8 scale, no MXFP8), which
        tests/gpu/test_vllm_c_insert_sm80.py runs as SM80 code
        (``test_kv_only_op_equals_fused_kv_half``)."""
        got = patched[cap]["v41_insert"]
        assert "error" not in got, got
        assert set(got["layers"]) == {"8", "9", "10"}, got["layers"]
        for idx, layer in got["layers"].items():
            assert layer["ratio"] == 0 and layer["indexer"] is None, (idx, layer)
            assert layer["compressed_from"] is None and layer["padded_heads"] == 64, (idx, layer)
        assert got["swa_builder"].endswith("DeepseekSparseSWAAmpereV41MetadataBuilder")
        assert (got["kv_mxfp8"], got["swa_bytes_per_token"]) == (False, 584)
        assert got["insert_calls"] == [{"kv": [6, 512], "cache": ["torch.uint8", [2, 64, 584]],
                                        "block_size": 64, "fp8_scale_none": True,
                                        "mxfp8": False}], got["insert_calls"]

    def test_pristine_tree_drafts_take_flashmla_on_sm80(trees) -> None:
        """The attention checks can fail: upstream's drafts, V4's and V4.1's, select FlashMLA
        on 8.0 (and the pristine tree has no V4.1 Ampere layer to build)."""
        got = run_child(trees["pristine"], "8.0", "attention", "v41_attention", "v41_insert")
        v41, v41_insert = got["v41_attention"], got["v41_insert"]
        got = got["attention"]
        assert got["mtp"] and not any(c == AMPERE_CLS for c in got["mtp"] + got["dspark"]), got
        assert all(c.endswith("DeepseekV4FlashMLAAttention") for c in got["mtp"] + got["dspark"])
        assert v41["dspark"] == ["vllm.models.deepseek_v41.nvidia.flashmla."
                                 "DeepseekV4FlashMLAAttention"] * 3, v41
        assert v41_insert.get("error") == "ImportError", v41_insert

    def test_c_insert_op_builds_for_sm80_with_every_padded_head_count(trees, patched,
                                                                       tmp_path) -> None:
        """Compile the tree's fused qnorm/RoPE/KV-insert source for sm_80 (nvcc, no GPU;
        sm_86 runs sm_80 code) and read the instantiated head counts off the cubin."""
        import shutil

        nvcc, cxxfilt = shutil.which("nvcc"), shutil.which("c++filt")
        if nvcc is None or cxxfilt is None:
            pytest.skip("needs nvcc and c++filt on PATH")
        from torch.utils.cpp_extension import include_paths

        # torch_utils.h declares a cuBLAS handle getter the op never calls; the CUDA
        # toolkit here ships no cuBLAS headers, so declare the handle type alone.
        stub = tmp_path / "include"
        stub.mkdir()
        (stub / "cublas_v2.h").write_text("typedef struct cublasContext* cublasHandle_t;\n")
        cubin = tmp_path / "insert.cubin"
        tree = trees["patched"]
        proc = subprocess.run(
            [nvcc, "-std=c++17", "-arch=sm_80", "--cubin", "-DUSE_CUDA",
             f"-I{tree / 'csrc'}", f"-I{stub}", *(f"-I{p}" for p in include_paths()),
             str(tree / C_OP_SRC), "-o", str(cubin)],
            capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        names = sorted({m.decode() for m in re.findall(rb"_Z[A-Za-z0-9_]+", cubin.read_bytes())})
        demangled = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True,
                                   text=True, check=True).stdout
        heads = {int(n) for n in re.findall(
            r"fusedDeepseekV4QNormRopeKVRopeQuantInsertKernel<c10::BFloat16, (\d+),", demangled)}
        assert heads == _c_op_facts(tree)["heads"], heads
        for cap in SM8X:
            got = patched[cap]["insert"]
            assert {got["padded_heads"], *got["padded_by_tp"].values()} <= heads

    def test_c_op_facts_can_fail(tmp_path: Path, trees) -> None:
        """The csrc parse detects a missing instantiation and an SM90-only guard."""
        for rel in (C_OP_SRC, "CMakeLists.txt"):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text((trees["patched"] / rel).read_text())
        src = tmp_path / C_OP_SRC
        text = src.read_text()
        src.write_text(text.replace("DISPATCH(8)\n", "", 1).replace(
            "sm_version >= 80,", "sm_version >= 90,", 1))
        facts = _c_op_facts(tmp_path)
        assert 8 not in facts["heads"] and facts["min_sm"] == 90, facts


# ------------------------------------------------------------------------------ child


def _imports(modname: str) -> set[str]:
    """Module names (already imported) that ``modname``'s source imports."""
    mod = sys.modules.get(modname)
    path = getattr(mod, "__file__", None)
    if not path or not path.endswith(".py"):
        return set()
    pkg = modname if path.endswith("__init__.py") else modname.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in sys.modules}


def _walk() -> list[str]:
    import importlib

    for name in ENTRY_MODULES + PATH_MODULES:
        importlib.import_module(name)
    seen: set[str] = set()
    todo = list(ENTRY_MODULES + PATH_MODULES)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(m for m in _imports(name) if m.startswith(WALK_PREFIXES))
    return sorted(seen)


def _path_sources(walked: list[str]) -> list[tuple[Any, ast.AST]]:
    """(module, syntax tree) of the path: the :data:`PATH_MODULES` files, and the
    Python functions of walked modules that they import by name (one level: e.g. the
    speculators' ``gumbel_sample``, which launches its own kernel)."""
    out = []
    for modname in PATH_MODULES:
        module = sys.modules[modname]
        tree = ast.parse(Path(module.__file__).read_text())
        out.append((module, tree))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.module not in walked:
                continue
            for alias in node.names:
                obj = getattr(sys.modules[node.module], alias.name, None)
                if inspect.isfunction(obj) and obj.__module__ in walked \
                        and obj.__module__ not in PATH_MODULES:
                    out.append((sys.modules[obj.__module__],
                                ast.parse(textwrap.dedent(inspect.getsource(obj)))))
    return out


def _names_referenced(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name)
    return names


def _inventory(modules: list[str]) -> dict[str, Any]:
    """Every Triton JITFunction and vLLM Triton kernel owner defined in ``modules``."""
    from triton.runtime.jit import JITFunction

    from vllm.model_executor.warmup.jit_warmup_triton_helper import VllmTritonJitKernel

    jits: dict[int, tuple[str, str, Any]] = {}  # id -> (qualified name, global, fn)
    owners: dict[int, tuple[str, str, Any]] = {}
    for modname in modules:
        for gname, value in vars(sys.modules[modname]).items():
            if isinstance(value, JITFunction) and value.__module__ == modname:
                jits.setdefault(id(value), (f"{modname}.{gname}", gname, value))
            elif isinstance(value, VllmTritonJitKernel) and type(value).__module__ == modname:
                owners.setdefault(id(value), (f"{modname}.{gname}", gname, value))
            elif isinstance(value, type) and value.__module__ == modname:
                for attr, inner in vars(value).items():
                    inner = inner.__func__ if isinstance(inner, staticmethod) else inner
                    if isinstance(inner, JITFunction):
                        jits.setdefault(id(inner), (f"{modname}.{gname}.{attr}", gname, inner))
    return {"jits": jits, "owners": owners}


def _kernel_of(owner: Any) -> Any:
    fn = getattr(owner, "kernel", None)
    return fn.__func__ if isinstance(fn, staticmethod) else fn


def _callees(fn: Any, by_name: dict[str, Any]) -> set[str]:
    """Names of JIT functions ``fn``'s source calls (transitively)."""
    out: set[str] = set()
    todo = [fn]
    while todo:
        f = todo.pop()
        for node in ast.walk(ast.parse(f.src if hasattr(f, "src") else inspect.getsource(f.fn))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in by_name and name not in out:
                    out.add(name)
                    todo.append(by_name[name])
    return out


#: Hidden sizes of the model configurations compiled for (V4-Flash, V4-Pro).
HIDDEN_SIZES = (4096, 7168)


def _warmup_keys(owner: Any) -> list[Any]:
    """Compile keys from vLLM's ``get_warmup_keys``; a ``vllm_config`` parameter gets
    the draft configuration at each of :data:`HIDDEN_SIZES`."""
    params = inspect.signature(owner.get_warmup_keys).parameters
    fixed, varying = {}, {}
    for name, p in params.items():
        if name == "vllm_config":
            configs = []
            for hidden in HIDDEN_SIZES:
                c = _draft_config()
                c.model_config.hf_config.hidden_size = hidden
                configs.append(c)
            varying[name] = configs
        elif name in WARMUP_ARGS:
            varying[name] = WARMUP_ARGS[name]
        elif p.default is inspect.Parameter.empty:
            raise LookupError(f"no realistic value for get_warmup_keys({name}=...)")
    keys: dict[Any, None] = {}
    for combo in itertools.product(*varying.values()):
        kwargs = {**fixed, **dict(zip(varying, combo, strict=True))}
        keys.update(dict.fromkeys(owner.get_warmup_keys(**kwargs)))
    return list(keys)


def _message(exc: BaseException) -> str:
    """The line of a compile error that says why (Triton puts it after the source)."""
    text, seen = [], set()
    while exc is not None and id(exc) not in seen:  # the cause is often the reason
        seen.add(id(exc))
        text.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    lines = [ln.strip() for ln in "\n".join(text).splitlines() if ln.strip()]
    why = [ln for ln in lines if "not supported" in ln]
    why = why or [ln for ln in lines if "Error" in ln or "error" in ln]
    return (why or lines or [""])[0]


def _compile_keys(owner: Any, keys: list[Any], capability: int) -> dict[str, Any]:
    from triton.runtime import driver

    entry: dict[str, Any] = {"keys": len(keys), "compiled": 0, "failed": []}
    saved = driver._active
    driver.set_active(harness._AotDriver(capability))
    try:
        for key in keys:
            try:
                with triton_smem.recording() as made:
                    owner.compile(key)
                over = [m for m in (triton_smem.over_limit(k, capability) for k in made) if m]
                if over:  # what Triton's launcher would raise on such a GPU
                    raise RuntimeError(over[0])
                entry["compiled"] += 1
            except Exception as exc:
                msg = _message(exc)
                entry["failed"].append(f"{key}: {type(exc).__name__}: {msg}"[:300])
    finally:
        driver._active = saved
    return entry


#: Pointer element types for bare kernels, by parameter-name fragment (first match);
#: other pointers are int32. Bare kernels have no compile keys: their arguments come
#: from vLLM's model-runner buffers, whose types these follow.
BARE_POINTER_TYPES = (("hidden", "*bf16"), ("temperature", "*fp32"), ("seed", "*i64"),
                      ("position", "*i64"), ("is_padding", "*i1"), ("is_valid", "*i1"),
                      ("slot_mapping", "*i64"))
#: Values tried for a constexpr the call site computes at run time (not a literal):
#: block sizes, integers used in arithmetic, and flags.
BLOCK_CANDIDATES = (1, 32, 256, 1024)
INT_CANDIDATES = (1, 2, 4)
FLAG_CANDIDATES = (True, False)


def _used_as_number(fn: Any, name: str) -> bool:
    """Whether the kernel uses constexpr ``name`` in arithmetic, a comparison or a
    call (else it is a flag)."""
    for node in ast.walk(ast.parse(fn.src)):
        operands = ([node.left, node.right] if isinstance(node, ast.BinOp) else
                    [node.left, *node.comparators] if isinstance(node, ast.Compare) else
                    list(node.args) if isinstance(node, ast.Call) else [])
        if any(isinstance(o, ast.Name) and o.id == name for o in operands):
            return True
    return False


def _call_site_constexprs(fn: Any, short: str, sources: list[tuple[Any, ast.AST]]
                          ) -> tuple[list[dict[str, Any]], list[str]]:
    """Constexpr bindings of ``short[grid](...)`` launches in the path modules: a
    literal keyword or a module-level constant is used as is; a value computed at run
    time is tried at each candidate (block size, integer or flag), one constexpr at a
    time around the first candidates."""
    names = [fn.arg_names[i] for i in sorted(fn.constexprs)]
    combos: list[dict[str, Any]] = []
    problems: list[str] = []
    for module, tree in sources:
        modname = module.__name__
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and getattr(node.func.value, "id", None) == short):
                continue
            options: dict[str, list[Any]] = {}
            # positional arguments bind in order (0.34.0's greedy_argmax passes its
            # constexprs so), keywords by name
            given = {fn.arg_names[i]: a for i, a in enumerate(node.args)
                     if i < len(fn.arg_names) and not isinstance(a, ast.Starred)}
            given.update({k.arg: k.value for k in node.keywords})
            for name in names:
                value = given.get(name)
                glob = getattr(module, getattr(value, "id", ""), None)
                if isinstance(value, ast.Constant):
                    options[name] = [value.value]
                elif isinstance(glob, (int, float, bool)):
                    options[name] = [glob]
                elif value is not None and "BLOCK" in name:
                    options[name] = list(BLOCK_CANDIDATES)
                elif value is not None:
                    options[name] = list(INT_CANDIDATES if _used_as_number(fn, name)
                                         else FLAG_CANDIDATES)
                elif fn.params[fn.arg_names.index(name)].default is not inspect.Parameter.empty:
                    options[name] = [fn.params[fn.arg_names.index(name)].default]
                else:
                    problems.append(f"{modname}: {name} not bound at the call site")
            base = {n: v[0] for n, v in options.items()}
            combos.append(base)
            combos += [{**base, n: v} for n, vs in options.items() for v in vs[1:]]
    if not combos and not problems:
        problems.append("no call site in the path modules")
    return combos, problems


def _load_store_bases(fn: Any) -> set[str]:
    """Parameters that are the base of a ``tl.load`` / ``tl.store`` address (the leftmost
    term of its sum, ``P + offsets``): pointers, whatever their names."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(fn.src)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("load", "store")
                and getattr(node.func.value, "id", None) == "tl" and node.args):
            base = node.args[0]
            while isinstance(base, ast.BinOp) and isinstance(base.op, ast.Add):
                base = base.left
            if isinstance(base, ast.Name) and base.id in fn.arg_names:
                out.add(base.id)
    return out


def _compile_bare(fn: Any, short: str, capability: int,
                  sources: list[tuple[Any, ast.AST]]) -> dict[str, Any]:
    """AOT-compile a bare kernel for ``capability`` with the call sites' constexprs."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    combos, problems = _call_site_constexprs(fn, short, sources)
    pointers = _load_store_bases(fn)
    entry: dict[str, Any] = {"keys": len(combos), "compiled": 0, "failed": problems}
    for consts in combos:
        sig = {}
        for name in fn.arg_names:
            if name in consts:
                sig[name] = "constexpr"
            elif name.endswith("_ptr"):
                sig[name] = next((t for frag, t in BARE_POINTER_TYPES if frag in name), "*i32")
            elif name in pointers:  # a load / store base without the _ptr suffix
                sig[name] = "*fp32"
            else:
                sig[name] = "i32"
        try:
            kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                                    target=GPUTarget("cuda", capability, 32))
            over = triton_smem.over_limit(kernel, capability)
            if over:  # what Triton's launcher would raise on such a GPU
                raise RuntimeError(over)
            entry["compiled"] += 1
        except Exception as exc:
            msg = _message(exc)
            entry["failed"].append(f"{consts}: {type(exc).__name__}: {msg}"[:300])
    return entry


def _add_dspark_draft(cfg: Any) -> Any:
    """``cfg`` with a DSpark draft: 3 layers after the backbone's, 7 speculative tokens."""
    hf = cfg.model_config.hf_config
    hf.hc_mult, hf.hc_eps, hf.hc_sinkhorn_iters = 4, 1e-6, 20
    hf.vocab_size, hf.n_routed_experts = 1024, 8
    hf.dspark_target_layer_ids, hf.n_mtp_layers, hf.dspark_markov_rank = [0, 1, 2], 3, 16
    cfg.speculative_config = types.SimpleNamespace(
        num_speculative_tokens=max(NUM_SPEC_TOKENS), draft_model_config=cfg.model_config,
        use_dspark=lambda: True)
    cfg.kernel_config.moe_backend = "auto"
    cfg.parallel_config.data_parallel_size = 1
    cfg.parallel_config.pipeline_parallel_size = 1
    cfg.parallel_config.enable_expert_parallel = False
    cfg.kernel_config.enable_jit_warmup = False
    return cfg


def _draft_config() -> Any:
    cfg = _add_dspark_draft(harness._v4_config())
    cfg.model_config.hf_config.mlp_layer_types = ["moe"] * 3
    return cfg


def probe_kernels(capability: int) -> dict[str, Any]:
    """Enumerate and AOT-compile the MTP/DSpark path's Triton kernels."""
    modules = _walk()
    inv = _inventory(modules)
    sources = _path_sources(modules)
    referenced = set().union(*(_names_referenced(t) for _, t in sources))
    jits, owners = inv["jits"], inv["owners"]
    by_name = {g: fn for _, g, fn in jits.values()}
    by_name.update({q.rpartition(".")[2]: fn for q, _, fn in jits.values()})
    owned = {id(_kernel_of(o)): q for q, _, o in owners.values()}

    cfg = _draft_config()
    out: dict[str, Any] = {"modules": modules, "owners": {}, "helpers": {}, "bare": {},
                           "not_on_path": []}
    compiled_sources: list[Any] = []
    for qual, gname, owner in sorted(owners.values(), key=lambda t: t[0]):
        if gname not in referenced:
            out["not_on_path"].append(qual)
            continue
        try:
            keys = _warmup_keys(owner)
        except Exception as exc:
            out["owners"][qual] = {"keys": 0, "compiled": 0,
                                   "failed": [f"get_warmup_keys: {type(exc).__name__}: {exc}"]}
            continue
        entry = _compile_keys(owner, keys, capability)
        entry["sample_key"] = repr(keys[0]) if keys else None
        out["owners"][qual] = entry
        compiled_sources.append(_kernel_of(owner))
    compiled_sources += [fn for _, g, fn in jits.values() if id(fn) not in owned
                         and (g in referenced or fn.__name__ in referenced)]
    covered = set().union(*(_callees(fn, by_name) for fn in compiled_sources)) \
        if compiled_sources else set()
    for qual, gname, fn in sorted(jits.values(), key=lambda t: t[0]):
        if id(fn) in owned:
            continue
        short = qual.rpartition(".")[2]
        if short in covered:
            out["helpers"][qual] = "compiled inside a caller"
        elif gname in referenced or short in referenced:
            src = "\n".join([fn.src] + [by_name[c].src for c in _callees(fn, by_name)])
            entry = _compile_bare(fn, short, capability, sources)
            entry["sm89_plus"] = sorted(k for k, pat in SM89_PLUS.items()
                                        if re.search(pat, src))
            out["bare"][qual] = entry
        else:
            out["not_on_path"].append(qual)
    # Controls: the same compile steps on kernels known to need FP8 hardware.
    fp8_bare = _fp8_control_kernel()
    call = ast.parse("_fp8_control_kernel[(1,)](x, n, BLOCK=block)")
    out["control_fp8_bare"] = _compile_bare(fp8_bare, "_fp8_control_kernel", capability,
                                            [(sys.modules[__name__], call)])
    # ... and it fails because of the architecture: SM90 compiles it
    out["control_fp8_bare_sm90"] = _compile_bare(fp8_bare, "_fp8_control_kernel", 90,
                                                 [(sys.modules[__name__], call)])
    from vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant import (
        _FUSED_INV_ROPE_FP8_QUANT_KERNEL as inv_rope,
    )
    key = inv_rope.get_warmup_keys(cfg)[0]
    out["control_fp8"] = _compile_keys(
        inv_rope, [type(key)(**{**key.__dict__, "quantize": True})], capability)
    return out


def _fp8_control_kernel() -> Any:
    """A bare kernel that converts to FP8 e4m3 (SM89+ only), as a control."""
    import triton
    import triton.language as tl

    @triton.jit
    def _fp8_control_kernel(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0)
        y = x.to(tl.float32).to(tl.float8e4nv).to(tl.float32)
        tl.store(x_ptr + offs, y.to(tl.int32), mask=offs < n)

    return _fp8_control_kernel


class _Picked(Exception):
    pass


def _selection_recorder(model: Any) -> tuple[list[str], tuple]:
    """A patch of ``model._select_dsv4_attn_cls`` that records the class each decoder layer
    selects and stops the layer there (its MoE and mHC are not under test), and the list it
    records into."""
    real = model._select_dsv4_attn_cls
    picked: list[str] = []

    def select(vllm_config: Any) -> Any:
        picked.append(harness._describe(real(vllm_config)))
        raise _Picked

    return picked, (model, "_select_dsv4_attn_cls", select)


def _dspark_selections(model: Any, dspark: Any, cfg: Any, stubbed: tuple[str, ...],
                       extra: list[tuple] = ()) -> dict[str, Any]:
    """Build ``dspark.DSparkDeepseekV4Model`` (V4's or V4.1's) with ``stubbed`` names of its
    module as stand-ins: the attention class each of its decoder layers (``model``'s)
    selects, and the error that stopped the build, if any."""
    import torch

    picked, select = _selection_recorder(model)

    class Layer(torch.nn.Module):  # each DSpark layer: record the selection, go on
        def __init__(self, vllm_config: Any, **kwargs: Any) -> None:
            super().__init__()
            try:
                model.DeepseekV4DecoderLayer(vllm_config, **kwargs)
            except _Picked:
                pass

    stub = harness._stub_cls()
    out: dict[str, Any] = {}
    with harness._patched([select] + [(dspark, n, stub) for n in stubbed] + [
            (dspark, "DeepseekV4DecoderLayer", Layer),
            (dspark, "get_current_vllm_config", lambda: cfg)] + list(extra)):
        try:
            dspark.DSparkDeepseekV4Model(vllm_config=cfg, prefix="model")
        except Exception as exc:
            out["dspark_error"] = f"{type(exc).__name__}: {exc}"[:300]
    out["dspark"] = picked
    return out


def probe_draft_attention() -> dict[str, Any]:
    """Attention class the MTP layer and the DSpark draft layers select."""
    import torch

    from vllm.models.deepseek_v4.nvidia import dspark, model, mtp

    cfg = _draft_config()
    picked, select = _selection_recorder(model)
    with harness._patched([select] + [(mtp, n, harness._stub_cls()) for n in (
            "RMSNorm", "ReplicatedLinear", "SharedHead")]):
        try:
            mtp.DeepSeekV4MultiTokenPredictorLayer(cfg, torch.empty(4, 512, dtype=torch.int32),
                                                    "model.layers.3")
        except _Picked:
            pass
    return {"mtp": picked, **_dspark_selections(model, dspark, cfg, (
        "RMSNorm", "ReplicatedLinear", "VocabParallelEmbedding", "MergedColumnParallelLinear",
        "DSparkMarkovHead", "DSparkConfidenceHead"))}


def probe_draft_insert() -> dict[str, Any]:
    """The Ampere layer built for the draft layer index, and the ``_C`` insert call
    DSpark's ``_insert_context_kv`` makes with it."""
    import torch

    from vllm.models.deepseek_v4.nvidia import dspark
    from vllm.models.deepseek_v4.nvidia.ampere_sparse import DeepseekV4AmpereSparseAttention

    built: list[Any] = []
    real_init = DeepseekV4AmpereSparseAttention.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        built.append(self)

    cfg = _draft_config()
    layer_idx = cfg.model_config.hf_config.num_hidden_layers  # first draft layer
    with harness._patched([(DeepseekV4AmpereSparseAttention, "__init__", init)]):
        harness._construct_ampere_attention(cfg, layer_idx)
    attn = built[-1]
    out: dict[str, Any] = {
        "compress_ratio": attn.compress_ratio, "n_local_heads": attn.n_local_heads,
        "padded_heads": attn.padded_heads,
        "swa_builder": harness._describe(attn.swa_backend_cls.get_builder_cls()),
        "padded_by_tp": {str(tp): DeepseekV4AmpereSparseAttention.get_padded_num_q_heads(64 // tp)
                         for tp in (1, 2, 4, 8, 16)},
    }
    calls: list[dict[str, Any]] = []

    def record(name: str) -> Any:
        def op(*args: Any) -> None:
            calls.append({"op": name, "q_heads": int(args[0].shape[1]),
                          "q_head_padded": int(args[6]) if len(args) > 6 else None,
                          "nargs": len(args)})
        return op

    n = 6
    attn.swa_cache_layer.kv_cache = torch.zeros(2, 64 * 584, dtype=torch.uint8)
    attn.swa_cache_layer.block_size = 64
    attn.rotary_emb.cos_sin_cache = torch.zeros(4096, 64)
    ns = torch.ops._C
    name = "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert"
    with harness._patched([(ns, name, record(name))]):
        dspark._insert_context_kv(attn, torch.zeros(n, attn.head_dim, dtype=torch.bfloat16),
                                  torch.arange(n), torch.arange(n))
    out["insert_calls"] = calls
    return out


def _v41_draft_config() -> Any:
    """``_v41_config`` with DeepSeek-V4.1's DSpark draft."""
    return _add_dspark_draft(harness._v41_config())


def probe_v41_draft_attention() -> dict[str, Any]:
    """Attention class DeepSeek-V4.1's DSpark draft layers (``DSparkV41DraftModel``:
    ``deepseek_v41/nvidia/dspark.py``, V4.1's own decoder layer) select."""
    from vllm.models.deepseek_v41.nvidia import dspark, model

    return _dspark_selections(model, dspark, _v41_draft_config(), (
        "RMSNorm", "ReplicatedLinear", "VocabParallelEmbedding", "DSparkMarkovHead",
        "DSparkConfidenceHead"), [(dspark, "maybe_init_gemm_rs", lambda *a, **k: False)])


def probe_v41_draft_insert() -> dict[str, Any]:
    """The V4.1 Ampere layer built for the first draft layer index, and the ``_C`` call
    V4.1's DSpark ``_insert_context_kv`` makes with it (the KV-only insert op)."""
    import torch

    from vllm.models.deepseek_v41.nvidia import dspark

    cfg = _v41_draft_config()
    first = cfg.model_config.hf_config.num_hidden_layers
    built: list[Any] = []
    layers = harness._construct_v41_ampere_layers(cfg, range(first, first + 3), built)
    attn = built[0]
    out: dict[str, Any] = {
        "layers": layers, "kv_mxfp8": bool(attn.kv_mxfp8),
        "swa_bytes_per_token": attn.swa_bytes_per_token,
        "swa_builder": harness._describe(attn.swa_backend_cls.get_builder_cls()),
    }
    calls: list[dict[str, Any]] = []

    def op(kv, cache, slots, positions, cos_sin, block_size, fp8_scale, mxfp8) -> None:
        calls.append({"kv": list(kv.shape), "cache": [str(cache.dtype), list(cache.shape)],
                      "block_size": int(block_size), "fp8_scale_none": fp8_scale is None,
                      "mxfp8": bool(mxfp8)})

    n, block = 6, 64
    # (stand-ins: the vLLM cache binds [num_blocks, block_size, bytes_per_token] uint8)
    attn.swa_cache_layer.kv_cache = torch.zeros(2, block, attn.swa_bytes_per_token,
                                                dtype=torch.uint8)
    attn.swa_cache_layer.block_size = block
    attn.rotary_emb.cos_sin_cache = torch.zeros(4096, 64)
    name = "fused_deepseek_v4_kv_rope_insert"
    with harness._patched([(torch.ops._C, name, op)]):
        dspark._insert_context_kv(attn, torch.zeros(n, attn.head_dim, dtype=torch.bfloat16),
                                  torch.arange(n), torch.arange(n))
    out["insert_calls"] = calls
    return out


def child(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", type=Path, required=True)
    ap.add_argument("--capability", required=True)
    ap.add_argument("--probe", action="append", required=True)
    args = ap.parse_args(argv)
    harness._boot(args.tree.resolve(), None)
    harness._CAPABILITY[:] = [int(x) for x in args.capability.split(".")]
    cc = harness._CAPABILITY[0] * 10 + harness._CAPABILITY[1]
    probes = {"kernels": lambda: probe_kernels(cc), "attention": probe_draft_attention,
              "insert": probe_draft_insert, "v41_attention": probe_v41_draft_attention,
              "v41_insert": probe_v41_draft_insert}
    res: dict[str, Any] = {}
    for name in args.probe:
        try:
            res[name] = probes[name]()
        except Exception as exc:
            res[name] = harness._error(exc)
    print(json.dumps(res, sort_keys=True, default=str))
    return 0


def run_child(tree: Path, capability: str, *probes: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--tree", str(tree),
           "--capability", capability]
    for p in probes:
        cmd += ["--probe", p]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(TESTS))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"probe of {tree} at {capability} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
