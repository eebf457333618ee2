"""The 0.33.0 patch set's gates, Triton fix, packaging and overlay identity (CPU).

- gate helpers (``cuda_device_predates_sm90``, ``cutedsl_usable``,
  ``deep_gemm_usable``): equal to the presence checks on CUDA 9.0+ and off CUDA,
  False below 9.0;
- no DeepSeek-V4 kernel choice is left on a bare presence check (AST audit of the
  patched files, so a rebase that brings a new ``has_cutedsl()`` site fails here);
- ``FusedInvRopeFP8QuantKernel`` compiles for sm_80/sm_86 without quantization in the
  patched tree (Triton ahead-of-time, no GPU) and not in the pristine one, and sm_90
  gets the same code from both;
- ``pip install`` of the patched tree ships ``deepinfer_sm80``;
- every Python file the series changes compiles, and adds no pyflakes message;
- the overlay identity module matches the pin, and ``vllm.__version__`` stays
  upstream's.

Tests that need the applied tree are marked ``network`` (sdist download, cached).
"""
from __future__ import annotations

import ast
import json
import py_compile
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest

import background_probes
import vllm_cpu_harness as harness

ROOT = Path(__file__).resolve().parents[1]
IDENTITY = ROOT / "overlay" / "vllm" / "deepinfer_sm80_overlay.py"


PATCH_SETS = sorted(d.name.removeprefix("vllm-") for d in (ROOT / "patches").glob("vllm-*")
                    if (d / "pin.toml").is_file())


def _identity_package(dest: Path, version: str) -> Path:
    """A bare ``vllm`` package holding the overlay identity module and the pin module
    apply generates for the patch set of ``version``."""
    from deepinfer.patchset import PIN_MODULE_TREE_PATH, load_patchset, pin_module_text

    pkg = dest / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / IDENTITY.name).write_bytes(IDENTITY.read_bytes())
    (dest / PIN_MODULE_TREE_PATH).write_text(pin_module_text(load_patchset(version, ROOT).pin))
    return pkg


def _load_identity(dest: Path, version: str):
    _identity_package(dest, version)
    code = ("import json, sys; from vllm import deepinfer_sm80_overlay as o; "
            "print(json.dumps({k: getattr(o, k) for k in o.__all__ if k.isupper()} "
            "| {'describe': o.describe(), 'identity': o.identity(), "
            "'modules': sorted(m for m in sys.modules if m.startswith('vllm'))}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=dest, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return harness.prepare_trees(tmp_path_factory)


@pytest.fixture(scope="module")
def deps() -> None:
    harness.skip_without_dependencies()


# ------------------------------------------------------------------ identity (no tree)


def test_patch_sets_found() -> None:
    assert "0.33.0" in PATCH_SETS, PATCH_SETS


@pytest.mark.parametrize("version", PATCH_SETS)
def test_identity_matches_pyproject_and_pin(tmp_path, version) -> None:
    """For every patch set: the identity module, with the pin module apply generates for
    that set, reports the set's pin and the overlay's distribution."""
    ident = _load_identity(tmp_path, version)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert ident["OVERLAY_NAME"] == project["name"]
    assert ident["OVERLAY_VERSION"] == project["version"]
    pin = tomllib.loads((ROOT / "patches" / f"vllm-{version}" / "pin.toml").read_text())
    assert ident["PINNED_VLLM_VERSION"] == pin["version"] == version
    assert ident["PINNED_VLLM_COMMIT"] == pin["commit_short"].removeprefix("g")
    assert ident["PINNED_VLLM_COMMIT_FULL"] == (pin["commit"] or None)
    assert ident["identity"]["vllm_version"] == version
    assert ident["describe"] == (f"deepinfer-sm80 {project['version']} on vLLM "
                                 f"{version} ({ident['PINNED_VLLM_COMMIT']})")
    assert ident["modules"] == ["vllm", "vllm.deepinfer_sm80_overlay",
                                "vllm.deepinfer_sm80_pin"]


def test_identity_module_imports_only_the_pin_module_at_import_time() -> None:
    from deepinfer.patchset import load_patchset, pin_module_text

    tree = ast.parse(IDENTITY.read_text())
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) for n in top_level)
    assert sorted((n.level, n.module) for n in top_level) == [(0, "__future__"),
                                                              (1, "deepinfer_sm80_pin")]
    pin_tree = ast.parse(pin_module_text(load_patchset(PATCH_SETS[0], ROOT).pin))
    assert not [n for n in ast.walk(pin_tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


# -------------------------------------------------------------------------- tree tests


@pytest.mark.network
def test_gate_helpers_truth_table(trees, deps, tmp_path_factory) -> None:
    fakes = harness.make_fake_packages(tmp_path_factory.mktemp("site"))
    caps = ["12.0", "10.0", "9.0", "8.9", "8.6", "8.0"]
    for installed in (fakes, None):
        res = harness.run_probes(trees["patched"], caps, installed=installed,
                                 probes=("gate_helpers",))
        for cap in caps:
            g = res[cap]["gate_helpers"]
            assert "error" not in g, g
            assert g["cuda"]["has_cutedsl"] is (installed is not None)
            below = float(cap) < 9.0
            assert g["cuda"]["cuda_device_predates_sm90"] is below
            for name, has in (("cutedsl_usable", "has_cutedsl"),
                              ("deep_gemm_usable", "has_deep_gemm")):
                assert g["cuda"][name] is (g["cuda"][has] and not below), (cap, name)
                # off CUDA the helpers are the presence checks, whatever the GPU
                assert g["cpu"][name] is g["cpu"][has], (cap, name)
            assert g["cpu"]["cuda_device_predates_sm90"] is False


#: Files of the patched tree whose DeepSeek-V4 kernel choices must not use a bare
#: presence check, and the functions allowed to keep one (with the reason).
AUDIT = {
    "vllm/models/deepseek_v4/common/ops/cache_utils.py": {},
    "vllm/models/deepseek_v4/common/ops/fused_indexer_q.py": {},
    "vllm/models/deepseek_v4/attention.py": {},
    "vllm/models/deepseek_v4/compressor.py": {},
    "vllm/v1/attention/backends/mla/indexer.py": {
        # each also requires capability family 90 or 100
        "_supports_varlen_paged_mqa_logits", "_supports_flattened_device_query_lens",
        # falls back to next_n in (1, 2) below 9.0 whatever it returns
        "_supports_native_decode"},
    "vllm/model_executor/layers/sparse_attn_indexer.py": {
        # DCP merge: refuses without CuTeDSL; DCP is not supported below 9.0
        "_assert_cutedsl_dcp_merge_supported", "__init__"},
}


def _presence_calls(source: str) -> list[tuple[str, int, str]]:
    """(enclosing function, line, callee) of every has_cutedsl()/has_deep_gemm() call."""
    found = []

    class Visitor(ast.NodeVisitor):
        stack: list[str] = []

        def visit_FunctionDef(self, node):  # noqa: N802
            self.stack.append(node.name)
            self.generic_visit(node)
            self.stack.pop()

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Call(self, node):  # noqa: N802
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("has_cutedsl", "has_deep_gemm"):
                found.append((self.stack[-1] if self.stack else "<module>",
                              node.lineno, name))
            self.generic_visit(node)

    Visitor().visit(ast.parse(source))
    return found


@pytest.mark.network
def test_no_presence_check_left_on_a_dsv4_kernel_choice(trees) -> None:
    for rel, allowed in AUDIT.items():
        calls = _presence_calls((trees["patched"] / rel).read_text())
        left = [c for c in calls if c[0] not in allowed]
        assert not left, f"{rel}: presence checks still choose kernels at {left}"
    # the audit can fail: the pristine tree has such calls in these DSv4 files
    for rel in list(AUDIT)[:3]:
        assert _presence_calls((trees["pristine"] / rel).read_text()), rel


def _cutedsl_compressor_tests(source: str) -> list[tuple[int, bool]]:
    """(line, also checks the architecture) of every ``if`` that picks the CuTeDSL
    compressor by ``is_cuda() and head_dim == 512``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If):
            text = ast.unparse(node.test)
            if "is_cuda()" in text and "head_dim == 512" in text:
                out.append((node.lineno, "cuda_device_predates_sm90()" in text))
    return out


@pytest.mark.network
def test_cutedsl_compressor_choice_checks_the_architecture(trees) -> None:
    rel = "vllm/models/deepseek_v4/compressor.py"
    patched = _cutedsl_compressor_tests((trees["patched"] / rel).read_text())
    # the C128 skip needs no arch check; the store routing and its warmup do
    gated = [ok for _, ok in patched]
    assert gated.count(True) == 2, patched
    pristine = _cutedsl_compressor_tests((trees["pristine"] / rel).read_text())
    assert [ok for _, ok in pristine].count(True) == 0 and len(pristine) == len(patched)


@pytest.mark.network
def test_inv_rope_kernel_compiles_for_sm80_sm86_and_sm90_code_is_unchanged(trees, deps
                                                                          ) -> None:
    got = {t: harness.run_probes(trees[t], ["9.0"], probes=("inv_rope_aot",))["9.0"]
           ["inv_rope_aot"] for t in ("patched", "pristine")}
    for t in got:
        assert "error" not in got[t], got[t]
    for cc in (80, 86):
        assert got["patched"][f"sm{cc}/quantize=False"] == "ok"
        assert "fp8e4nv" in got["pristine"][f"sm{cc}/quantize=False"]
        # quantizing still needs FP8 conversion: nothing on SM80 asks for it
        assert "fp8e4nv" in got["patched"][f"sm{cc}/quantize=True"]
    sm90 = [k for k in got["patched"] if k.startswith("sm90/")]
    assert len(sm90) == 4
    assert {k: got["patched"][k] for k in sm90} == {k: got["pristine"][k] for k in sm90}


@pytest.mark.network
def test_v41_fp8_kernels_compile_for_sm80_sm86_and_sm90_code_is_unchanged(trees, deps
                                                                         ) -> None:
    """DeepSeek-V4.1's compressed insert (584-byte record), indexer-K store and Engram
    lookup (four variants): with the software e4m3 codec they compile for sm_80/86, the
    hardware conversion does not (patched and pristine alike), and the sm_90 code of the
    default (no codec) equals the pristine kernel's."""
    got = {t: harness.run_probes(trees[t], ["9.0"], probes=("v41_fp8_aot",))["9.0"]
           ["v41_fp8_aot"] for t in ("patched", "pristine")}
    for t in got:
        assert "error" not in got[t], got[t]
    labels = {k.split("/sm")[0] for k in got["patched"]}
    assert len(labels) == 6, labels
    for label in labels:
        for cc in (80, 86):
            assert got["patched"][f"{label}/sm{cc}/soft"] == "ok", label
            for t in got:
                assert "fp8e4nv" in got[t][f"{label}/sm{cc}/hardware"], (t, label)
            assert got["pristine"][f"{label}/sm{cc}/soft"] == "no parameter"
        assert got["patched"][f"{label}/sm90"] == got["pristine"][f"{label}/sm90"], label


@pytest.mark.network
@pytest.mark.parametrize("cap", ["8.0", "8.6"])
def test_v41_ampere_layers_build_and_their_warmups_compile_on_sm8x(trees, deps, cap
                                                                  ) -> None:
    """DeepSeek-V4.1's layers built with the SM80 classes (attention, indexer and its
    scorer; linear layers, norms, caches, compressors and RoPE stand-ins) in upstream's
    tiny sharing topology: ratios [0, 2, 2, 1, 1, 0, 0, 0], kv sources 1 and 3, index
    sources 1, 3 and 4, candidate source 3. Every JIT warmup they register compiles for
    the capability ahead of time (vLLM compiles them at start-up; a failure aborts it)."""
    got = harness.run_probes(trees["patched"], [cap], probes=("v41_ampere_construct",))[cap]
    got = got["v41_ampere_construct"]
    assert "error" not in got, got
    layers = got["layers"]
    assert [layers[str(i)]["ratio"] for i in range(8)] == [0, 2, 2, 1, 1, 0, 0, 0]
    assert [layers[str(i)]["compressed_from"] for i in (1, 2, 3, 4)] == [
        "model.layers.1.attn", "model.layers.1.attn", "model.layers.3.attn",
        "model.layers.3.attn"]
    for i in (1, 3, 4):
        assert layers[str(i)]["indexer"] == "DeepseekV41AmpereIndexer"
        assert layers[str(i)]["scorer"] == "AmpereSparseAttnIndexer"
    assert [layers[str(i)]["candidates"] for i in (1, 3, 4)] == [None, "write", "mask"]
    # the scorers know a step's decode rows (their profile-run reservation sizes the eager
    # decode by it): vLLM's default max_num_seqs, no speculative tokens
    rows = {layers[str(i)]["max_decode_rows"] for i in (1, 3, 4)}
    assert len(rows) == 1 and rows.pop() > 0, layers
    assert all(layers[str(i)]["indexer"] is None for i in (0, 2, 5, 6, 7))
    warm = got["warmups"]
    assert len(warm) >= 4, warm
    for kernel, entry in warm.items():
        assert entry["keys"] > 0 and entry["compiled"] == entry["keys"], (kernel, entry)


@pytest.mark.network
def test_overlay_identity_in_the_applied_tree(trees, deps) -> None:
    res = harness.run_probes(trees["patched"], ["8.0"], probes=("overlay_identity",))
    ident = res["8.0"]["overlay_identity"]
    assert ident.get("check_upstream") == "ok", ident
    assert ident["vllm.__version__"] == harness.VLLM_VERSION
    assert ident["identity"]["vllm_version"] == harness.VLLM_VERSION
    version_py = "vllm/_version.py"
    assert ((trees["patched"] / version_py).read_bytes()
            == (trees["pristine"] / version_py).read_bytes())


def test_identity_check_refuses_another_vllm(tmp_path) -> None:
    """check_upstream() names both versions when the overlay sits in another vLLM."""
    pkg = _identity_package(tmp_path, "0.33.0")
    (pkg / "_version.py").write_text(
        "__version__ = '0.32.0'\n__commit_id__ = 'g0123456789'\n")
    code = ("from vllm import deepinfer_sm80_overlay as o\n"
            "try:\n    o.check_upstream()\nexcept RuntimeError as e:\n    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("refused") and "0.32.0" in out and "0.33.0" in out


@pytest.mark.network
def test_pip_install_of_the_tree_ships_deepinfer_sm80(trees) -> None:
    import setuptools

    tree = trees["patched"]
    pyproject = tomllib.loads((tree / "pyproject.toml").read_text())
    find = pyproject["tool"]["setuptools"]["packages"]["find"]
    found = set(setuptools.find_packages(where=str(tree / find["where"][0]),
                                         include=find["include"]))
    expected = {".".join(d.relative_to(tree).parts)
                for d in (tree / "deepinfer_sm80").rglob("*")
                if d.is_dir() and any(d.glob("*.py")) and "__pycache__" not in d.parts}
    expected.add("deepinfer_sm80")
    missing = sorted(expected - found)
    assert not missing, (f"not installed (a directory without __init__.py?): {missing}")
    assert "vllm.models.deepseek_v4.nvidia" in found
    # the built extension travels as package data
    setup = ast.parse((tree / "setup.py").read_text())
    data = next(n.value for n in ast.walk(setup) if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "package_data" for t in n.targets))
    keys = {k.value: [e.value for e in v.elts]
            for k, v in zip(data.keys, data.values, strict=True)}
    assert any(re.fullmatch(r"\*\.so\*?", g) for g in keys.get("deepinfer_sm80", []))
    # and the pristine discovery would not ship it (the patch is what does)
    pristine_find = 'include = ["vllm*"]'
    assert pristine_find in subprocess.run(
        ["git", "-C", str(tree), "show", "refs/deepinfer/base:pyproject.toml"],
        capture_output=True, text=True, check=True).stdout


def _series_python_files(tree: Path, diff_filter: str) -> list[str]:
    """The applied tree's Python files that its series and overlay changed since the base
    (``git diff --diff-filter``: A added, M modified)."""
    return subprocess.run(
        ["git", "-C", str(tree), "diff", "--name-only", f"--diff-filter={diff_filter}",
         "refs/deepinfer/base", "HEAD", "--", "*.py"],
        capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.network
def test_every_python_file_the_series_changes_compiles(trees, tmp_path) -> None:
    tree = trees["patched"]
    changed = _series_python_files(tree, "AM")
    assert "vllm/models/deepseek_v4/nvidia/model.py" in changed
    for rel in changed:
        py_compile.compile(str(tree / rel), cfile=str(tmp_path / "x.pyc"), doraise=True)


def _pyflakes(source: str, filename: str) -> Counter:
    """pyflakes' messages for one file, without line numbers (so that lines the series moves
    compare equal); a message on a line carrying a ``# noqa`` comment (any codes) is left
    out."""
    from pyflakes import checker

    lines = source.splitlines()
    w = checker.Checker(ast.parse(source, filename), filename=filename)
    return Counter(f"{type(m).__name__}: {m.message % m.message_args}" for m in w.messages
                   if "# noqa" not in lines[m.lineno - 1])


@pytest.mark.network
@pytest.mark.parametrize("version", PATCH_SETS)
def test_the_series_adds_no_pyflakes_message_to_upstream_files(trees, version,
                                                              tmp_path) -> None:
    """For every patch set: each Python file its series changes has no pyflakes message that
    upstream's file lacks (an undefined name in a branch taken only on 8.x would pass every
    CPU test that does not reach it); a file the series adds has none at all."""
    if version == harness.VLLM_VERSION:
        tree = trees["patched"]
    else:  # a set kept beside the pin (docs/rebase-0.34.0.md): applied here
        from deepinfer import apply as ap, source

        tree = ap.apply(version, source.SourceSpec.parse("sdist"), build=tmp_path).tree

    modified, added = _series_python_files(tree, "M"), _series_python_files(tree, "A")
    assert "vllm/models/deepseek_v4/nvidia/model.py" in modified
    new: dict[str, list[str]] = {}
    for rel in modified:
        before = subprocess.run(["git", "-C", str(tree), "show", f"refs/deepinfer/base:{rel}"],
                                capture_output=True, text=True, check=True).stdout
        extra = _pyflakes((tree / rel).read_text(), rel) - _pyflakes(before, rel)
        if extra:
            new[rel] = sorted(extra)
    for rel in added:
        found = _pyflakes((tree / rel).read_text(), rel)
        if found:
            new[rel] = sorted(found)
    assert not new, f"pyflakes messages the series adds (file: messages): {new}"


@pytest.mark.network
@pytest.mark.parametrize("cap", ["8.0", "8.6"])
def test_every_warmup_a_dsv4_model_registers_on_sm8x_compiles(trees, deps, cap) -> None:
    """vLLM compiles every registered JIT warmup key at start-up and a failing compile
    aborts it. Build the layers of a C4/C128/SWA model on the patched tree with the SM80
    backend and compile each registered key for the capability, ahead of time."""
    res = harness.run_probes(trees["patched"], [cap], probes=("warmup_aot",))[cap]
    got = res["warmup_aot"]
    assert "error" not in got, got
    assert got.pop("backend") == "AMPERE_SPARSE_DSV4"
    assert got.pop("construct") == []
    assert len(got) >= 5, got
    for kernel, entry in got.items():
        assert entry["keys"] > 0 and entry["compiled"] == entry["keys"], (kernel, entry)


MHC_TIMEOUT = 1800


def _mhc_probe(cap: str, env: dict[str, str]) -> tuple:
    return [cap], ("mhc_tilelang_aot",), env, MHC_TIMEOUT


def _mhc_pdl_env() -> dict[str, str]:
    return {"DEEPINFER_MHC_FORCE_PDL": "1", "DEEPINFER_MHC_KEYS_PER_REGISTRATION": "1"}


def background_probe_spec(item: pytest.Item) -> tuple | None:
    """The TileLang mHC compile probes (about 18 minutes on CI's 2 cores) run in the
    background from the end of collection (tests/background_probes.py)."""
    if shutil.which("nvcc") is None:
        return None
    if item.originalname == "test_dsv4_mhc_tilelang_warmups_compile_for_sm8x":
        p = item.callspec.params
        return _mhc_probe(p["cap"], {"DEEPINFER_MHC_HIDDEN": str(p["hidden"]),
                                     "DEEPINFER_MHC_MODEL": p["model"]})
    if item.originalname == "test_mhc_compile_check_can_fail":
        return _mhc_probe("8.0", _mhc_pdl_env())
    return None


@pytest.mark.network
# V4-Flash at sm_80, V4-Pro (the larger shared-memory tiles) at sm_86, V4.1 at both: 6-7
# minutes per V4 case and 2-2.5 minutes per V4.1 case on CI's 2 cores with TileLang's cache
# cold (2026-12-02, pytest --durations); in the background (background_probe_spec).
@pytest.mark.parametrize("cap,hidden,model", [
    ("8.0", 4096, "v4"), ("8.6", 7168, "v4"), ("8.0", 5120, "v41"), ("8.6", 5120, "v41")])
def test_dsv4_mhc_tilelang_warmups_compile_for_sm8x(trees, deps, cap, hidden, model,
                                                   ) -> None:
    """Every DeepSeek-V4 / V4.1 layer runs vLLM's TileLang mHC kernels (pre with the
    fused RMSNorm, fused post + pre, post, hc_head); only patch 8 touches their routing.
    Each warmup key the first V4 decoder layer and the model register (hidden 4096:
    V4-Flash, 7168: V4-Pro), or a V4.1 decoder layer (5120), compiles for the part's
    architecture with TileLang's nvcc step (ptxas for sm_80 / sm_86), without PDL (9.0+)
    and without any SM90-only feature in the generated source. The numerics of that
    code: tests/gpu/test_mhc_tilelang_sm80.py."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc (TileLang compiles its CUDA source with it)")
    got = background_probes.result(trees, *_mhc_probe(cap, {
        "DEEPINFER_MHC_HIDDEN": str(hidden), "DEEPINFER_MHC_MODEL": model}))[cap]["mhc_tilelang_aot"]
    if got.get("skipped", "").startswith("tilelang not installed"):
        pytest.skip(got["skipped"])
    assert "error" not in got, got
    assert got["enable_pdl"] is False and (got["hidden"], got["model"]) == (hidden, model)
    assert got["targets"] == [f"sm_{cap.replace('.', '')}"], got
    assert got["sm90_only"] == {}, got
    # what the host launcher will ask for fits the part's block (tests/tilelang_smem.py)
    assert got["shared_over"] == {}, got["shared_over"]
    assert got["shared"] and max(got["shared"].values()) > 0, got["shared"]
    kernels = got["kernels"]
    assert set(kernels) == ({"MHCPreNormKernel"} if model == "v41" else {
        "MhcPreBigFuseTileLangKernel", "HcPrenormGemmTileLangKernel", "MhcPostTileLangKernel",
        "MhcFusedTileLangKernel", "HcHeadFusedTileLangKernel"}), kernels
    for kernel, entry in kernels.items():
        assert entry["keys"] > 0 and entry["compiled"] == entry["keys"], (kernel, entry)


@pytest.mark.network
@pytest.mark.parametrize("cap", ["8.0", "8.6"])
def test_short_context_topk_kernel_compiles_for_sm8x(trees, deps, cap) -> None:
    """The indexer's short-context Triton kernel runs on SM8x (the SM80 indexers inherit
    ``DeepseekV4Indexer.forward``) without any warmup compiling it first: V4's and V4.1's
    compile for the part with their call sites' values."""
    got = harness.run_probes(trees["patched"], [cap], probes=("short_context_topk_aot",))[
        cap]["short_context_topk_aot"]
    assert got == {"v4/4": "ok", "v41/1": "ok", "v41/2": "ok"}, got


@pytest.mark.network
@pytest.mark.parametrize("cap", ["8.0", "8.6"])
def test_moe_router_kernel_compiles_for_sm8x(trees, deps, cap) -> None:
    """V4's non-hash MoE layers route through the bare Triton ``_dsv4_topk_kernel`` (256 or
    384 experts, top-6); nothing compiles it before the first forward. It compiles for the
    part as launched there (no PDL below 9.0), with and without padding rows and the vision
    bias."""
    got = harness.run_probes(trees["patched"], [cap], probes=("moe_router_topk_aot",))[
        cap]["moe_router_topk_aot"]
    assert got == {f"{e}/{p}/{v}": "ok" for e in (256, 384) for p in ("nopad", "pad")
                   for v in ("novl", "vl")}, got


@pytest.mark.network
def test_moe_router_compile_check_can_fail(trees, deps, monkeypatch) -> None:
    """The check above with PDL forced on (what 9.0+ launches): fails for sm_80, passes for
    sm_90."""
    monkeypatch.setenv("DEEPINFER_ROUTER_FORCE_PDL", "1")
    got = harness.run_probes(trees["patched"], ["8.0", "9.0"], probes=("moe_router_topk_aot",))
    assert all(v != "ok" for v in got["8.0"]["moe_router_topk_aot"].values()), got["8.0"]
    assert set(got["9.0"]["moe_router_topk_aot"].values()) == {"ok"}, got["9.0"]


@pytest.mark.network
def test_mhc_compile_check_can_fail(trees, deps) -> None:
    """The check above, with PDL forced on (what 9.0+ compiles): SM90-only code that must
    not pass for sm_80, and does not. The first key of each registration is enough to show
    it for every kernel (all 23 keys took 2.4 minutes on 2 cores)."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc (TileLang compiles its CUDA source with it)")
    got = background_probes.result(trees, *_mhc_probe("8.0", _mhc_pdl_env()))["8.0"][
        "mhc_tilelang_aot"]
    if got.get("skipped", "").startswith("tilelang not installed"):
        pytest.skip(got["skipped"])
    assert got["enable_pdl"] is True and len(got["kernels"]) == 5, got
    for kernel, entry in got["kernels"].items():
        assert entry["keys"] > 0 and entry["compiled"] == 0, (kernel, entry)
        assert all("PDL" in f for f in entry["failed"]), (kernel, entry)


@pytest.mark.network
def test_pristine_warmups_fail_to_compile_on_sm80(trees, deps) -> None:
    """The check above can fail: upstream registers FP8 Triton and CuTeDSL kernels."""
    got = harness.run_probes(trees["pristine"], ["8.0"], probes=("warmup_aot",))["8.0"][
        "warmup_aot"]
    failing = {k for k, v in got.items() if isinstance(v, dict) and v.get("failed")}
    assert {"FusedInvRopeFP8QuantKernel.kernel",
            "FusedIndexerQRopeQuantTritonKernel.kernel"} <= failing, got
