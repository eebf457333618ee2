"""Import a vLLM source tree on a CPU-only machine and record its dispatch decisions.

Used by tests/test_dispatch*.py and tests/test_gates*.py to compare the pristine
vLLM 0.33.0 tree with the patched one (``make apply``) under a mocked CUDA platform of
a chosen compute capability. Needs vLLM's pure-Python dependencies (the
``vllm-cpu-deps`` extra of pyproject.toml) and torch; not vLLM's compiled parts.

Each tree is probed in its own subprocess (``python tests/vllm_cpu_harness.py --tree
T --capability 9.0 --capability 8.0 ...``), because vLLM binds ``current_platform``
and caches package lookups at import time. The child:

1. puts the tree (and optionally a directory of empty stand-in packages ``cutlass``
   and ``deep_gemm``, i.e. "installed") first on ``sys.path``;
2. registers empty modules for the compiled extensions the import chain reaches
   (``vllm._C_stable_libtorch``, ``vllm._moe_C_stable_libtorch``);
3. installs a CUDA platform whose ``get_device_capability`` returns the capability
   being probed (everything else is vLLM's own ``NonNvmlCudaPlatform``);
4. for each requested capability in turn, runs every probe in :data:`PROBES` and
   prints one JSON object: capability -> probe name -> decision (a string or a small
   structure), or ``{"error": ...}`` when the code under test raised.

One process probes several capabilities (imports dominate the cost). A decision cached
across capabilities would show up as a mismatch, never as a false agreement, because
the tests compare a fresh single-capability process with the multi-capability one.

A probe calls the real decision code of the tree (selector functions, dispatch
functions, ``__init__`` warmup registration) with the kernels it would launch replaced
by recorders, so the decision is observed, not re-derived.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import os
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tilelang_smem
import triton_smem

#: The patch set under test: the pin, or another set in patches/ (e.g. a rebase candidate) by
#: ``DEEPINFER_TEST_VLLM=<version>``.
VLLM_VERSION = os.environ.get("DEEPINFER_TEST_VLLM", "0.33.0")

#: Importable names of the pure-Python dependencies the DeepSeek-V4 import chain
#: reaches (pyproject.toml extra ``vllm-cpu-deps``), checked before probing.
REQUIRED_MODULES = (
    "regex", "pydantic", "cbor2", "psutil", "zmq", "transformers", "aiohttp", "requests",
    "openai_harmony", "openai", "PIL", "pybase64", "cachetools", "msgspec", "cloudpickle",
    "cpuinfo", "prometheus_client", "fastapi", "partial_json_parser", "einops", "triton",
    # imported at module level too (vllm/v1/structured_output, vllm/v1/utils.py): found
    # missing on the device image once the ones above were there (2026-12-03)
    "xgrammar", "llguidance", "uvloop",
)

#: ``vllm._custom_ops`` capability queries called at import time -> minimum capability.
_CAPABILITY_QUERIES = {
    "cutlass_scaled_mm_supports_fp8": 89,
    "cutlass_scaled_mm_supports_block_fp8": 90,
    "cutlass_group_gemm_supported": 90,
}

#: Modules backed by compiled vLLM extensions that the import chain imports
#: unconditionally on CUDA -> the names importers take from them. Registered as
#: stand-ins whose functions raise when called (no probe calls them).
_STUB_MODULES: dict[str, tuple[str, ...]] = {
    "vllm._C_stable_libtorch": (),
    "vllm._moe_C_stable_libtorch": (),
    "vllm.vllm_flash_attn": (
        "compile_flash_attn_varlen_func_from_specs", "flash_attn_varlen_func",
        "get_scheduler_metadata", "fa_version_unsupported_reason",
        "is_fa_version_supported"),
}


def deps_paths() -> list[str]:
    """Where vLLM's Python dependencies live apart from this interpreter's packages:
    ``$DEEPINFER_VLLM_DEPS`` (os.pathsep-separated; the GPU bundle's ``.site-vllm/``, which
    its setup.sh fills from ``make gpu-bundle VLLM_DEPS=1``). The vLLM-level checks'
    subprocesses put these first on their path (:func:`subprocess_pythonpath`)."""
    raw = os.environ.get("DEEPINFER_VLLM_DEPS", "")
    return [p for p in raw.split(os.pathsep) if p and Path(p).is_dir()]


def add_deps_paths() -> list[str]:
    """Put :func:`deps_paths` first on this process's ``sys.path`` (once each), for a script
    that imports the applied tree in-process (``bench/marlin_vllm.py``) rather than in a
    subprocess; returns the folders added."""
    extra = [p for p in deps_paths() if p not in sys.path]
    sys.path[:0] = extra
    return extra


def subprocess_pythonpath() -> str | None:
    """PYTHONPATH for a subprocess that imports an applied tree: :func:`deps_paths`, then
    this process's PYTHONPATH without folders holding a ``vllm`` package (the overlay's
    ``vllm/`` would shadow the tree's); None when that leaves nothing."""
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and not (Path(p) / "vllm").is_dir()]
    parts = deps_paths() + keep
    return os.pathsep.join(parts) if parts else None


def missing_dependencies() -> list[str]:
    """Names from :data:`REQUIRED_MODULES` that import neither here nor from
    :func:`deps_paths`."""
    import importlib.util

    extra = [p for p in deps_paths() if p not in sys.path]
    sys.path[:0] = extra
    try:
        missing = []
        for name in REQUIRED_MODULES + ("torch",):
            try:
                if importlib.util.find_spec(name) is None:
                    missing.append(name)
            except (ImportError, ValueError):
                missing.append(name)
        return missing
    finally:
        for p in extra:
            sys.path.remove(p)


def make_fake_packages(root: Path, names: tuple[str, ...] = ("cutlass", "deep_gemm")) -> Path:
    """Empty packages that make ``has_cutedsl()`` / ``has_deep_gemm()`` report True."""
    for name in names:
        pkg = root / name
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(
            '"""Empty stand-in: tests need the package to be importable, not usable."""\n')
    return root


def run_probes(tree: Path, capabilities: list[str], *, installed: Path | None = None,
               probes: tuple[str, ...] = (), timeout: float = 900,
               env: dict[str, str] | None = None,
               environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Run :data:`PROBES` (or the named subset) against ``tree`` in one subprocess, for
    each capability (``"8.0"``...); returns capability -> probe -> decision. ``env``: extra
    environment variables of the subprocess (the probes' knobs), over ``environ`` (default:
    this process's environment now)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--tree", str(tree)]
    for cap in capabilities:
        cmd += ["--capability", cap]
    if installed is not None:
        cmd += ["--installed", str(installed)]
    for p in probes:
        cmd += ["--probe", p]
    extra = env or {}
    env = dict(os.environ if environ is None else environ)
    env.update(extra)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Triton would look for a driver; vLLM then disables Triton. An empty device list
    # is vLLM's "distributed, devices not visible yet" case, which keeps Triton enabled.
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=str(Path(__file__).resolve().parent))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"probing {tree} at capabilities {capabilities} failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def skip_without_dependencies() -> None:
    """pytest.skip, naming the install step, when vLLM's pure-Python dependencies are
    missing (the tests that import the real tree need them)."""
    missing = missing_dependencies()
    if missing:
        import pytest

        pytest.skip("vLLM's pure-Python dependencies are not installed "
                    f"({', '.join(missing)}); run `make venv-torch` or "
                    "`pip install -e '.[vllm-cpu-deps]'`")


_TREES: dict[str, Path] = {}
_TREES_LOCK = threading.Lock()


def prepare_trees(tmp_path_factory: Any) -> dict[str, Path]:
    """``{"patched": ..., "pristine": ...}`` for :data:`VLLM_VERSION`, made once per
    test session: ``deepinfer apply`` into a temporary build directory (sdist from the
    per-user cache, downloaded on first use), and its base commit's ``vllm/``. Thread-safe:
    tests/background_probes.py may make them first, in its worker thread."""
    with _TREES_LOCK:
        return _prepare_trees(tmp_path_factory)


def _prepare_trees(tmp_path_factory: Any) -> dict[str, Path]:
    if not _TREES:
        import tarfile

        from deepinfer import apply as ap
        from deepinfer import source

        build = tmp_path_factory.mktemp("build")
        res = ap.apply(VLLM_VERSION, source.SourceSpec.parse("sdist"), build=build)
        pristine = tmp_path_factory.mktemp("pristine")
        archive = pristine / "base.tar"
        subprocess.run(["git", "-C", str(res.tree), "archive", "-o", str(archive),
                        "refs/deepinfer/base", "vllm"], check=True)
        with tarfile.open(archive) as tf:
            tf.extractall(pristine, filter="data")
        archive.unlink()
        _TREES.update(patched=res.tree, pristine=pristine)
    return dict(_TREES)


# ----------------------------------------------------------------------------- child


_CAPABILITY: list[int] = [0, 0]


_METADATA_DIR: Any = None


def _add_distribution_metadata(tree: Path) -> None:
    """vLLM asks ``importlib.metadata`` for its own version (and disables Triton when
    that fails); a tree without ``*.egg-info`` gets a minimal ``dist-info``."""
    global _METADATA_DIR
    import re
    import tempfile

    text = (tree / "vllm" / "_version.py").read_text()
    version = re.search(r"__version__ = version = '([^']+)'", text).group(1)
    _METADATA_DIR = tempfile.TemporaryDirectory(prefix="vllm-metadata-")
    info = Path(_METADATA_DIR.name) / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    sys.path.append(_METADATA_DIR.name)


def _boot(tree: Path, installed: Path | None) -> None:
    sys.path.insert(0, str(tree))
    _add_distribution_metadata(tree)
    if installed is not None:
        sys.path.insert(0, str(installed))
    for name, attrs in _STUB_MODULES.items():
        module = types.ModuleType(name)
        module.__doc__ = "CPU test stand-in for a compiled vLLM extension"
        for attr in attrs:
            setattr(module, attr, _unavailable(f"{name}.{attr}"))
        sys.modules.setdefault(name, module)

    import vllm
    if Path(vllm.__file__).resolve().parent != (tree / "vllm").resolve():
        raise RuntimeError(f"imported vllm from {vllm.__file__}, expected {tree}/vllm")

    import vllm.platforms as platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class MockedCudaPlatform(NonNvmlCudaPlatform):
        """vLLM's CUDA platform with the probed device capability, no device calls."""

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(major=_CAPABILITY[0], minor=_CAPABILITY[1])

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"mocked sm_{_CAPABILITY[0]}{_CAPABILITY[1]}"

    platforms._current_platform = MockedCudaPlatform()

    # Capability queries that modules answer at import time through compiled ops.
    # Python stand-ins with the thresholds of vLLM's csrc; the probed decisions do not
    # depend on them (they pick linear-layer kernels).
    import vllm._custom_ops as ops

    for name, threshold in _CAPABILITY_QUERIES.items():
        setattr(ops, name, lambda capability, _t=threshold: capability >= _t)


def _unavailable(name: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is compiled code, not available in the CPU harness")
    return fail


def _describe(obj: Any) -> str:
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    return repr(obj)


def _error(exc: BaseException) -> dict[str, str]:
    return {"error": type(exc).__name__, "message": str(exc).splitlines()[0][:600]
            if str(exc) else ""}


class Recorder:
    """Stands in for a kernel object or function: calling it (or its
    ``register_warmup``) appends ``name`` to the shared log."""

    def __init__(self, name: str, log: list[str], result: Any = None) -> None:
        self._name, self._log, self._result = name, log, result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._log.append(self._name)
        return self._result(*args, **kwargs) if callable(self._result) else self._result

    def register_warmup(self, *args: Any, **kwargs: Any) -> None:
        self._log.append(f"warmup:{self._name}")


class RecorderModule(types.ModuleType):
    """A module whose every attribute is a :class:`Recorder` named after it; stands in
    for the CuTeDSL kernel modules, which import ``cutlass`` at module level."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name)
        self._log = log

    def __getattr__(self, attr: str) -> Recorder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Recorder(attr, self._log)


@contextlib.contextmanager
def _patched(items: list[tuple[Any, str, Any]]) -> Iterator[None]:
    saved = []
    for obj, name, value in items:
        if isinstance(obj, dict):
            saved.append((obj, name, obj.get(name, _MISSING)))
            obj[name] = value
        else:
            saved.append((obj, name, getattr(obj, name, _MISSING)))
            setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, old in reversed(saved):
            if isinstance(obj, dict):
                if old is _MISSING:
                    obj.pop(name, None)
                else:
                    obj[name] = old
            elif old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


_MISSING = object()


@contextlib.contextmanager
def _recording_warmups(log: list[str]) -> Iterator[None]:
    """Every real JIT kernel's ``register_warmup`` appends its name instead."""
    from vllm.model_executor.warmup.jit_warmup import VllmJitKernel

    def record(self: Any, *args: Any, **kwargs: Any) -> None:
        log.append(f"warmup:{_kernel_name(self)}")

    with _patched([(VllmJitKernel, "register_warmup", record)]):
        yield


def _kernel_name(kernel: Any) -> str:
    for attr in ("kernel", "fn", "_fn"):
        fn = getattr(kernel, attr, None)
        inner = getattr(fn, "fn", fn)
        name = getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None)
        if isinstance(name, str):
            return name
    return type(kernel).__qualname__


def _fake_modules(log: list[str], *names: str) -> list[tuple[Any, str, Any]]:
    return [(sys.modules, n, RecorderModule(n, log)) for n in names]


_CUTEDSL_OPS = "vllm.models.deepseek_v4.nvidia.ops."


# ------------------------------------------------------------------------------ probes


def probe_attn_cls() -> dict[str, Any]:
    """``_select_dsv4_attn_cls`` for the default and every sparse-MLA backend choice."""
    from vllm.models.deepseek_v4.nvidia import model
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E

    out: dict[str, Any] = {}
    for name in (None, "FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV4",
                 "FLASHINFER_MLA_SPARSE_DSV4", "FLASHINFER_MLA_SPARSE",
                 "FLASHINFER_MLA_SPARSE_SM120", "TRITON_MLA"):
        backend = None if name is None else getattr(E, name)
        cfg = types.SimpleNamespace(attention_config=types.SimpleNamespace(backend=backend))
        try:
            out[str(name)] = _describe(model._select_dsv4_attn_cls(cfg))
        except Exception as exc:  # the decision may be a refusal
            out[str(name)] = _error(exc)
    return out


def probe_v41_attn_cls() -> dict[str, Any]:
    """DeepSeek-V4.1's ``_select_dsv4_attn_cls`` (its own copy in ``deepseek_v41``) for
    the default and each sparse-MLA backend choice, and with prefill context parallelism."""
    from vllm.models.deepseek_v41.nvidia import model
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E

    hf = types.SimpleNamespace(num_attention_heads=64, o_groups=8)
    out: dict[str, Any] = {}
    cases = [(str(n), n, 1) for n in (
        None, "FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV41", "FLASHMLA_MEGA_ATTN_DSV41",
        "FLASHINFER_MLA_SPARSE_DSV41", "FLASHINFER_MLA_SPARSE", "TRITON_MLA")]
    cases.append(("None/pcp2", None, 2))
    for key, name, pcp in cases:
        cfg = types.SimpleNamespace(
            attention_config=types.SimpleNamespace(
                backend=None if name is None else getattr(E, name)),
            parallel_config=types.SimpleNamespace(prefill_context_parallel_size=pcp,
                                                  tensor_parallel_size=1),
            model_config=types.SimpleNamespace(hf_config=hf),
            lora_config=None)  # (0.34.0 reads it: no mega-attention with LoRA)
        try:
            out[key] = _describe(model._select_dsv4_attn_cls(cfg))
        except Exception as exc:  # the decision may be a refusal
            out[key] = _error(exc)
    return out


def probe_gather() -> str:
    """Which kernel ``dequantize_and_gather_k_cache`` launches."""
    import torch

    from vllm.models.deepseek_v4.common.ops import cache_utils

    log: list[str] = []
    with _patched(_fake_modules(log, _CUTEDSL_OPS + "dequant_gather_k_cutedsl") + [
            (cache_utils, "_DEQUANTIZE_AND_GATHER_K_CACHE_KERNEL",
             Recorder("triton", log))]):
        cache_utils.dequantize_and_gather_k_cache(
            torch.empty(1, 4, 512, dtype=torch.bfloat16),
            torch.empty(1, 256 * 584, dtype=torch.uint8), torch.ones(1, dtype=torch.int32),
            None, torch.zeros(1, 1, dtype=torch.int32), 64, 0)
    return "+".join(log)


def probe_indexer_q() -> dict[str, str]:
    """Which kernel ``fused_indexer_q_rope_quant`` launches (FP8 and MXFP4 caches)."""
    import torch

    from vllm.models.deepseek_v4.common.ops import fused_indexer_q as fiq

    out = {}
    for use_fp4 in (False, True):
        log: list[str] = []
        with _patched(_fake_modules(log, _CUTEDSL_OPS + "fused_indexer_q_cutedsl") + [
                (fiq, "_FUSED_INDEXER_Q_ROPE_QUANT_TRITON_KERNEL", Recorder("triton_fp8", log)),
                (fiq, "_FUSED_INDEXER_Q_ROPE_MXFP4_TRITON_KERNEL",
                 Recorder("triton_mxfp4", log))]):
            try:
                fiq.fused_indexer_q_rope_quant(
                    torch.zeros(2, dtype=torch.int64),
                    torch.zeros(2, 4, 128, dtype=torch.bfloat16),
                    torch.zeros(8, 64, dtype=torch.float32),
                    torch.zeros(2, 4, dtype=torch.bfloat16), 128 ** -0.5, 4 ** -0.5,
                    use_fp4=use_fp4)
                out["mxfp4" if use_fp4 else "fp8"] = "+".join(log)
            except Exception as exc:
                out["mxfp4" if use_fp4 else "fp8"] = f"{'+'.join(log)}!{type(exc).__name__}"
    return out


def probe_compressor_store() -> dict[str, str]:
    """Which writer ``DeepseekCompressor._compress_norm_rope_store`` calls."""
    import torch

    from vllm.models.deepseek_v4 import compressor as comp

    out = {}
    for head_dim in (512, 128):
        log: list[str] = []
        layer = types.SimpleNamespace(kv_cache=torch.empty(1, 8, dtype=torch.uint8))
        me = types.SimpleNamespace(
            head_dim=head_dim, rope_head_dim=64, compress_ratio=4, overlap=True,
            use_fp4_cache=False, rms_norm_eps=1e-6, _quant_block=64, _token_stride=576,
            _scale_dim=8, norm=types.SimpleNamespace(weight=None), k_cache_prefix="k",
            _static_forward_context={"k": layer}, _use_two_stage_fused_compressor=False,
            _compress_scratch=None)
        md = types.SimpleNamespace(token_to_req_indices=None,
                                   slot_mapping=torch.zeros(1, dtype=torch.int64),
                                   block_table=None, block_size=64, num_decode_tokens=0)
        with _patched(_fake_modules(log, _CUTEDSL_OPS + "sparse_attn_compress_cutedsl") + [
                (comp, "compress_norm_rope_store_triton", Recorder("triton", log)),
                (comp, "compress_norm_rope_store_two_stage_triton",
                 Recorder("triton_two_stage", log))]):
            comp.DeepseekCompressor._compress_norm_rope_store(
                me, md, torch.empty(1), 1, torch.zeros(1, dtype=torch.int64),
                types.SimpleNamespace(cos_sin_cache=None), {"k": None}, {})
        out[str(head_dim)] = "+".join(log)
    return out


def _stub_cls() -> type:
    """An ``nn.Module`` that accepts any constructor arguments (linear layers, norms,
    caches and the other parts a constructor under test builds but does not decide)."""
    import torch

    class Stub(torch.nn.Module):
        block_size = 64

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            self.weight = None
            self.prefix = kwargs.get("prefix", "")

    return Stub


def _v4_config() -> Any:
    """A small stand-in ``VllmConfig`` with DeepSeek-V4-Flash layer dimensions: layer 0
    is C4 (with indexer), layer 1 C128, layer 2 sliding-window only."""
    hf = types.SimpleNamespace(
        hidden_size=4096, num_attention_heads=64, q_lora_rank=1024, o_lora_rank=1024,
        head_dim=512, qk_rope_head_dim=64, o_groups=8, sliding_window=128,
        num_hidden_layers=3, layer_types=["compressed_sparse_attention",
                                          "heavily_compressed_attention",
                                          "sliding_attention"],
        compress_rates={"compressed_sparse_attention": 4,
                        "heavily_compressed_attention": 128},
        rms_norm_eps=1e-6, max_position_embeddings=4096, index_topk=512,
        index_n_heads=64, index_head_dim=128, model_type="deepseek_v4",
        num_nextn_predict_layers=1)
    return _vllm_config(hf, 4096, types.SimpleNamespace(cache_dtype="fp8", block_size=64))


def _vllm_config(hf: Any, max_model_len: int, cache_config: Any) -> Any:
    """A stand-in ``VllmConfig`` around a model's ``hf`` config: TP 1, no context
    parallelism, default attention config, JIT warmups on, a fresh forward context."""
    import torch

    from vllm.config import AttentionConfig

    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=hf, hf_text_config=hf,
                                           max_model_len=max_model_len, dtype=torch.bfloat16),
        parallel_config=types.SimpleNamespace(
            tensor_parallel_size=1, decode_context_parallel_size=1,
            prefill_context_parallel_size=1, cp_kv_cache_interleave_size=1),
        attention_config=AttentionConfig(),
        quant_config=None,
        cache_config=cache_config,
        kernel_config=types.SimpleNamespace(enable_jit_warmup=True),
        scheduler_config=types.SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=64),
        compilation_config=types.SimpleNamespace(static_forward_context={}),
        speculative_config=None, use_v2_model_runner=True)


#: The attention modules' tensor-parallel linear classes, replaced by stand-ins when a layer is
#: built without a tensor-parallel group (0.34.0 adds ``wo_a``'s own class; a name a tree lacks
#: is set for the duration and removed again by ``_patched``).
_ATTENTION_LINEARS = ("MergedColumnParallelLinear", "ColumnParallelLinear", "RowParallelLinear",
                      "DeepseekV4GroupedWoA")


def _compressor_stubs(comp: Any, stub: Any) -> list[tuple[Any, str, Any]]:
    """The compressor module's linear layers (0.34.0: also its own ``wkv``/``wgate`` class),
    norm and state cache as stand-ins."""
    return [(comp, name, stub) for name in (
        "MergedColumnParallelLinear", "DeepseekV4CompressorKVScoreLinear", "RMSNorm",
        "CompressorStateCache")]


def _construct_compressor(cfg: Any, head_dim: int, ratio: int) -> None:
    from vllm.models.deepseek_v4 import compressor as comp

    stub = _stub_cls()
    with _patched(_compressor_stubs(comp, stub)
                  + [(type(_current_platform()), "device_type", "cpu")]):
        comp.DeepseekCompressor(cfg, ratio, cfg.model_config.hf_config.hidden_size,
                                head_dim, rotate=True, prefix="c", k_cache_prefix="k")


def _construct_indexer(cfg: Any, use_fp4: bool) -> None:
    import torch

    from vllm.models.deepseek_v4 import attention

    stub = _stub_cls()

    class Indexer(attention.DeepseekV4Indexer):
        def _get_cache_cls(self) -> Any:
            return stub

        def _get_compressor_cls(self) -> Any:
            return stub

        def _get_attn_cls(self) -> Any:
            return stub

    with _patched([(attention, "ReplicatedLinear", stub),
                   (attention, "dsa_indexer_uses_fp4", lambda _cfg: use_fp4),
                   (attention, "get_max_prefill_buffer_size", lambda _cfg: 4096),
                   (torch.cuda, "Event", stub)]):
        Indexer(cfg, cfg.model_config.hf_config, 4096, 1024, None, object(), None,
                compress_ratio=4, prefix="layers.0.attn.indexer")


def _construct_attention(cfg: Any, backend: Any, layer: int) -> None:
    import torch

    from vllm.models.deepseek_v4 import attention

    stub = _stub_cls()

    class Layer(attention.DeepseekV4Attention):
        backend_cls = backend

        @classmethod
        def get_padded_num_q_heads(cls, num_heads: int) -> int:
            return num_heads

        def forward_mqa(self, *args: Any) -> None:
            raise NotImplementedError

        def _o_proj(self, *args: Any) -> Any:
            raise NotImplementedError

        def _get_indexer_cls(self, vllm_config: Any) -> Any:
            return stub

    with _patched([(attention, name, stub) for name in (
            *_ATTENTION_LINEARS, "RMSNorm", "DeepseekV4SWACache", "DeepseekCompressor",
            "build_deepseek_v4_rope")] + [
            (attention, "get_tensor_model_parallel_world_size", lambda: 1),
            (attention, "make_attention_sink", lambda n, dtype: torch.zeros(n)),
            (torch.cuda, "Event", stub)]):
        Layer(cfg, f"model.layers.{layer}.attn")


def _construct_ampere_attention(cfg: Any, layer: int) -> None:
    """The overlay's SM80 attention layer itself (with its indexer and compressors);
    only linear layers, norms, caches and RoPE are stand-ins."""
    import torch

    from vllm.models.deepseek_v4 import attention
    from vllm.models.deepseek_v4 import compressor as comp
    from vllm.models.deepseek_v4.nvidia import ampere_sparse
    from vllm.models.deepseek_v4.nvidia.ampere_indexer import DeepseekV4AmpereIndexer

    stub = _stub_cls()

    class Indexer(DeepseekV4AmpereIndexer):
        def _get_cache_cls(self) -> Any:
            return stub

        def _get_attn_cls(self) -> Any:
            return stub

    class Layer(ampere_sparse.DeepseekV4AmpereSparseAttention):
        def _get_indexer_cls(self, vllm_config: Any) -> Any:
            return Indexer

    with _patched([(attention, name, stub) for name in (
            *_ATTENTION_LINEARS, "ReplicatedLinear", "RMSNorm", "DeepseekV4SWACache",
            "build_deepseek_v4_rope")]
            + _compressor_stubs(comp, stub) + [
            (attention, "get_tensor_model_parallel_world_size", lambda: 1),
            (attention, "make_attention_sink", lambda n, dtype: torch.zeros(n)),
            (attention, "dsa_indexer_uses_fp4", lambda _cfg: False),
            (attention, "get_max_prefill_buffer_size", lambda _cfg: 4096),
            (type(_current_platform()), "device_type", "cpu"),
            (torch.cuda, "Event", stub)]):
        Layer(cfg, f"model.layers.{layer}.attn")


def _attempt(log: list[str], build: Callable[[], None]) -> list[str]:
    try:
        build()
    except Exception as exc:
        log.append(f"!{type(exc).__name__}: {exc}"[:200])
    return log


def probe_compressor_warmup() -> dict[str, list[str]]:
    """Kernels ``DeepseekCompressor.__init__`` registers for JIT warmup."""
    out = {}
    for head_dim, ratio in ((512, 4), (512, 128), (128, 4)):
        log: list[str] = []
        with _recording_warmups(log), _patched(
                _fake_modules(log, _CUTEDSL_OPS + "sparse_attn_compress_cutedsl")):
            out[f"{head_dim}/c{ratio}"] = _attempt(
                log, lambda h=head_dim, r=ratio: _construct_compressor(_v4_config(), h, r))
    return out


def probe_indexer_warmup() -> dict[str, list[str]]:
    """Kernels ``DeepseekV4Indexer.__init__`` registers for JIT warmup: the CuTeDSL
    index-Q kernel, or through ``_register_q_quant_warmup`` the Triton one."""
    out = {}
    for use_fp4 in (False, True):
        log: list[str] = []
        with _recording_warmups(log), _patched(
                _fake_modules(log, _CUTEDSL_OPS + "fused_indexer_q_cutedsl")):
            out["mxfp4" if use_fp4 else "fp8"] = _attempt(
                log, lambda f=use_fp4: _construct_indexer(_v4_config(), f))
    return out


def _dsv4_backends() -> dict[str, Any]:
    from vllm.models.deepseek_v4.sparse_mla import DeepseekV4FlashMLABackend

    backends: dict[str, Any] = {"FLASHMLA_SPARSE_DSV4": DeepseekV4FlashMLABackend}
    try:
        from vllm.models.deepseek_v4.nvidia.ampere_sparse import (
            DeepseekV4AmpereSparseMLABackend,
        )
        backends["ampere"] = DeepseekV4AmpereSparseMLABackend
    except ImportError:
        pass
    return backends


def probe_attention_warmup() -> dict[str, list[str]]:
    """Kernels ``DeepseekV4Attention.__init__`` registers for JIT warmup (C4 layer),
    for the FlashMLA backend and, where the tree has it, the SM80 backend."""
    out = {}
    for label, backend in _dsv4_backends().items():
        log: list[str] = []
        with _recording_warmups(log), _patched(
                _fake_modules(log, _CUTEDSL_OPS + "dequant_gather_k_cutedsl")):
            out[label] = _attempt(
                log, lambda b=backend: _construct_attention(_v4_config(), b, 0))
    return out


class _AotDriver:
    """A Triton driver that only answers what ``JITFunction.warmup`` asks, for a GPU
    that is not there: compile for ``target``, launch nothing."""

    def __init__(self, capability: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


def _triton_aot(fn: Any, signature: dict[str, str], constexprs: dict[str, Any],
                num_warps: int) -> str:
    """Compile a ``@triton.jit`` kernel ahead of time for the probed capability: "ok", or
    the error's last line."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cap = _CAPABILITY[0] * 10 + _CAPABILITY[1]
    target = GPUTarget("cuda", cap, 32)
    try:
        kernel = triton.compile(ASTSource(fn, signature, constexprs=constexprs),
                                target=target, options={"num_warps": num_warps})
    except Exception as exc:
        return str(exc).strip().splitlines()[-1][:200]
    if not kernel.asm.get("cubin"):
        return "no cubin"
    return triton_smem.over_limit(kernel, cap) or "ok"


def probe_short_context_topk_aot() -> dict[str, Any]:
    """The indexer's short-context kernel (``_fill_short_context_topk_indices``: every
    candidate selected while a row sees no more than top-k of them) is launched bare from
    ``DeepseekV4Indexer.forward``, which the SM80 indexers inherit, so no warmup compiles
    it. Compile V4's and V4.1's for the probed capability with their call sites' values
    (top-k 512 padded to 512, num_warps 8; ratio 4 for V4, 1 and 2 for V4.1):
    "module/ratio" -> "ok" or the error's last line."""
    from vllm.models.deepseek_v4 import attention as v4
    from vllm.models.deepseek_v41 import attention as v41

    sig = {"output": "*i32", "positions": "*i64", "TOP_K": "constexpr",
           "COMPRESS_RATIO": "constexpr", "PADDED_TOP_K": "constexpr"}
    def kernel(module):  # 0.34.0 dropped the underscore (and the Python wrapper of that name)
        return getattr(module, "_fill_short_context_topk_indices", None) or \
            module.fill_short_context_topk_indices

    return {f"{name}/{ratio}": _triton_aot(
                kernel(module), sig,
                {"TOP_K": 512, "COMPRESS_RATIO": ratio, "PADDED_TOP_K": 512}, num_warps=8)
            for name, module, ratios in (("v4", v4, (4,)), ("v41", v41, (1, 2)))
            for ratio in ratios}


def probe_moe_router_topk_aot() -> dict[str, Any]:
    """DeepSeek-V4's MoE router on its non-hash layers: ``fused_topk_bias`` sends fp32
    router logits of 256 (V4-Flash) or 384 (V4-Pro) experts, top-6, renormalised, to the
    bare Triton kernel ``_dsv4_topk_kernel`` (``fused_moe/router/dsv4_topk.py``), which no
    warmup compiles. Compile it for the probed capability as its launcher does there
    (``launch_pdl`` = ``is_arch_support_pdl()``: False below 9.0; num_warps 1), with and
    without padding rows and the vision bias: "experts/padding/vl" -> "ok" or the error's
    last line. ``DEEPINFER_ROUTER_FORCE_PDL=1`` compiles with PDL on (what 9.0+ runs), a
    control that must fail below 9.0."""
    import triton

    from vllm.model_executor.layers.fused_moe.router import dsv4_topk

    pdl = os.environ.get("DEEPINFER_ROUTER_FORCE_PDL") == "1"
    sig = {"gating_output_ptr": "*fp32", "correction_bias_ptr": "*fp32",
           "is_padding_ptr": "*i1", "topk_weights_ptr": "*fp32", "topk_ids_ptr": "*i32",
           "routed_scaling_factor": "fp32", "input_ids_ptr": "*i64", "bias_vl_ptr": "*fp32",
           "image_sentinel_lo": "i32", "NUM_EXPERTS": "constexpr", "BLOCK_N": "constexpr",
           "HAS_PADDING": "constexpr", "HAS_VL": "constexpr", "launch_pdl": "constexpr"}
    out: dict[str, Any] = {}
    for experts in (256, 384):
        for padding in (False, True):
            for vl in (False, True):
                key = f"{experts}/{'pad' if padding else 'nopad'}/{'vl' if vl else 'novl'}"
                out[key] = _triton_aot(dsv4_topk._dsv4_topk_kernel, sig, {
                    "NUM_EXPERTS": experts, "BLOCK_N": triton.next_power_of_2(experts),
                    "HAS_PADDING": padding, "HAS_VL": vl, "launch_pdl": pdl}, num_warps=1)
    return out


def probe_warmup_aot() -> dict[str, Any]:
    """Compile, ahead of time for the probed capability, every JIT warmup key that a
    DeepSeek-V4 model's layers register on this tree (attention C4/C128/SWA layers with
    the SM80 backend where the tree has it, else FlashMLA; compressors; the indexer):
    kernel -> {"keys", "compiled", "failed": [first messages]}. Registrations to
    CuTeDSL kernels are reported as failures: they cannot compile below SM90."""
    from vllm.model_executor.warmup.jit_warmup import VllmJitKernel

    registrations: list[tuple[Any, tuple, dict]] = []
    cutedsl: list[str] = []

    def capture(self: Any, *args: Any, **kwargs: Any) -> None:
        registrations.append((self, args, kwargs))

    cfg = _v4_config()
    backends = _dsv4_backends()
    ampere = "ampere" in backends
    backend = backends["ampere" if ampere else "FLASHMLA_SPARSE_DSV4"]
    failures: list[str] = []
    with _patched([(VllmJitKernel, "register_warmup", capture)] + _fake_modules(
            cutedsl, *(_CUTEDSL_OPS + m for m in (
                "dequant_gather_k_cutedsl", "fused_indexer_q_cutedsl",
                "sparse_attn_compress_cutedsl")))):
        for layer in range(3):
            if ampere:  # the overlay's layer: its indexer and compressors included
                _attempt(failures, lambda i=layer: _construct_ampere_attention(cfg, i))
            else:
                _attempt(failures, lambda i=layer: _construct_attention(cfg, backend, i))
        if not ampere:
            for head_dim, ratio in ((512, 4), (512, 128), (128, 4)):
                _attempt(failures,
                         lambda h=head_dim, r=ratio: _construct_compressor(cfg, h, r))
            _attempt(failures, lambda: _construct_indexer(cfg, False))

    results: dict[str, Any] = {"backend": backend.get_name(), "construct": failures}
    for name in cutedsl:
        results[name.removeprefix("warmup:")] = {"keys": 1, "compiled": 0,
                                                 "failed": ["CuTeDSL kernel"]}
    results.update(_compile_registered_warmups(registrations, cfg))
    return results


def _compile_each(kernel: Any, keys: Any, entry: dict[str, Any]) -> None:
    """``kernel.compile(key)`` for each key (vLLM's compile-only warmup), counted into
    ``entry`` ("keys", "compiled", and the first three failures' last lines). A Triton kernel
    that needs more shared memory than a block of the probed capability gets (what Triton's
    launcher would refuse at the first launch: ``triton_smem``) counts as failed; "shared" is
    the most any of them needs."""
    cap = _CAPABILITY[0] * 10 + _CAPABILITY[1]
    entry.setdefault("shared", 0)
    for key in keys:
        entry["keys"] += 1
        try:
            with triton_smem.recording() as made:
                kernel.compile(key)
            entry["shared"] = max([entry["shared"]] + [
                int(getattr(k.metadata, "shared", 0) or 0) for k in made])
            over = [m for m in (triton_smem.over_limit(k, cap) for k in made) if m]
            if over:
                raise RuntimeError(f"{over[0]} (key {key!r})")
            entry["compiled"] += 1
        except Exception as exc:
            msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            if len(entry["failed"]) < 3:
                entry["failed"].append(f"{type(exc).__name__}: {msg}"[:300])


def _compile_registered_warmups(registrations: list[tuple[Any, tuple, dict]], cfg: Any
                                ) -> dict[str, Any]:
    """Compile every key of the captured ``register_warmup`` calls ahead of time for the
    probed capability: kernel -> {"keys", "compiled", "failed": [first messages]}."""
    from triton.runtime import driver

    results: dict[str, Any] = {}
    saved = driver._active  # no default driver exists without a GPU
    driver.set_active(_AotDriver(_CAPABILITY[0] * 10 + _CAPABILITY[1]))
    try:
        by_kernel: dict[int, tuple[Any, list[tuple[tuple, dict]]]] = {}
        for kernel, args, kwargs in registrations:
            by_kernel.setdefault(id(kernel), (kernel, []))[1].append((args, kwargs))
        for kernel, regs in by_kernel.values():
            entry = {"keys": 0, "compiled": 0, "failed": []}
            keys: dict[Any, None] = {}
            try:
                for args, kwargs in regs:
                    # as JitWarmupRegistry.warmup does
                    if not args and not kwargs and "vllm_config" in inspect.signature(
                            kernel.get_warmup_keys).parameters:
                        kwargs = {"vllm_config": cfg}
                    keys.update(dict.fromkeys(kernel.get_warmup_keys(*args, **kwargs)))
            except Exception as exc:
                entry["failed"].append(f"get_warmup_keys: {type(exc).__name__}: {exc}"[:200])
            _compile_each(kernel, keys, entry)
            results[_kernel_name(kernel)] = entry
    finally:
        driver._active = saved
    return results


def _v41_config() -> Any:
    """A stand-in ``VllmConfig`` with DeepSeek-V4.1-Flash layer dimensions and the tiny
    sharing topology of upstream's tests (tests/models/deepseek_v41/.../test_layers.py):
    compress ratios [0, 2, 2, 1, 1, 0, 0, 0], kv sources 1 and 3, index sources 1, 3 and 4,
    candidate source 3."""
    hf = types.SimpleNamespace(
        hidden_size=5120, num_attention_heads=64, q_lora_rank=1280, o_lora_rank=1024,
        head_dim=512, qk_rope_head_dim=64, o_groups=8, sliding_window=128,
        num_hidden_layers=8, compress_ratios=[0, 2, 2, 1, 1, 0, 0, 0],
        kv_source_layer_ids=[1, 3], index_source_layer_ids=[1, 3, 4],
        candidate_source_layer_id=3, candidate_topk_blocks=2048, candidate_block_size=8,
        rms_norm_eps=1e-6, max_position_embeddings=8192, index_topk=512, index_n_heads=32,
        index_head_dim=128, model_type="deepseek_v41")
    return _vllm_config(hf, 8192, types.SimpleNamespace(
        cache_dtype="fp8", block_size=128, swa_bounded_replay=False,
        enable_prefix_caching=False))


def _construct_v41_ampere_layers(cfg: Any, layers: Any = range(8),
                                 built: list[Any] | None = None) -> dict[str, Any]:
    """The overlay's DeepSeek-V4.1 Ampere attention layers ``layers`` (default 0..7 of
    ``_v41_config``; 8 and up are draft layers: DSpark's) (their indexers and the Ampere
    scorer included; linear layers, norms, caches, compressors and RoPE are stand-ins): per
    layer, what was built. ``built`` receives the layer objects."""
    import torch

    from vllm.models.deepseek_v41 import attention
    from vllm.models.deepseek_v41.nvidia import ampere_sparse

    stub = _stub_cls()
    ctx = cfg.compilation_config.static_forward_context

    class IndexerCache(stub):  # registers itself, as the real cache layer does
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            ctx[kwargs["prefix"]] = self

    from vllm.config import VllmConfig, set_current_vllm_config

    out: dict[str, Any] = {}
    # CustomOp.__init__ (the scorer) reads the current config: vLLM's defaults
    with set_current_vllm_config(VllmConfig()), _patched([(attention, name, stub) for name in (
            *_ATTENTION_LINEARS, "ReplicatedLinear", "RMSNorm", "DeepseekV4SWACache",
            "DeepseekCompressor",
            "build_deepseek_v4_rope")] + [
            (attention, "DeepseekV4IndexerCache", IndexerCache),
            (attention, "get_tensor_model_parallel_world_size", lambda: 1),
            (attention, "make_attention_sink", lambda n, dtype: torch.zeros(n)),
            (attention, "dsa_indexer_uses_fp4", lambda _cfg: False),
            (attention, "get_max_prefill_buffer_size", lambda _cfg: 8192),
            (torch.cuda, "Event", stub)]):
        topk = torch.full((64, 512), -1, dtype=torch.int32)
        cand = torch.full((64, 2048), -1, dtype=torch.int32)
        for i in layers:
            layer = ampere_sparse.DeepseekV41AmpereSparseAttention(
                cfg, f"model.layers.{i}.attn", topk_indices_buffer=topk,
                candidate_block_buffer=cand)
            if built is not None:
                built.append(layer)
            op = getattr(layer.indexer, "indexer_op", None)
            out[str(i)] = {
                "ratio": layer.compress_ratio, "compressed_from": layer.compressed_cache_prefix,
                "indexer": type(layer.indexer).__name__ if layer.indexer is not None else None,
                "scorer": type(op).__name__ if op is not None else None,
                "candidates": None if op is None or op.candidate_blocks is None else
                ("write" if op.candidate_write else "mask"),
                "max_decode_rows": None if op is None else op.max_decode_rows,
                "padded_heads": layer.padded_heads}
    return out


def probe_v41_ampere_construct() -> dict[str, Any]:
    """Build the V4.1 Ampere layers (``_construct_v41_ampere_layers``), recording the JIT
    warmups they register, and compile each registered key ahead of time for the probed
    capability (vLLM compiles them all at start-up; one failure aborts it)."""
    from vllm.model_executor.warmup.jit_warmup import VllmJitKernel

    registrations: list[tuple[Any, tuple, dict]] = []

    def capture(self: Any, *args: Any, **kwargs: Any) -> None:
        registrations.append((self, args, kwargs))

    cfg = _v41_config()
    with _patched([(VllmJitKernel, "register_warmup", capture)]):
        layers = _construct_v41_ampere_layers(cfg)
    return {"layers": layers, "warmups": _compile_registered_warmups(registrations, cfg)}


def probe_backend_support() -> dict[str, bool]:
    """``supports_compute_capability`` of the DeepSeek-V4 sparse-MLA backends at the
    probed capability (advisory for DSv4, which bypasses the generic selector)."""
    from vllm.models.deepseek_v4.nvidia.flashinfer_sparse import (
        DeepseekV4FlashInferMLASparseBackend,
    )
    from vllm.models.deepseek_v4.sparse_mla import DeepseekV4FlashMLABackend
    from vllm.platforms.interface import DeviceCapability

    backends: dict[str, Any] = {"FLASHMLA": DeepseekV4FlashMLABackend,
                                "FLASHINFER": DeepseekV4FlashInferMLASparseBackend}
    try:
        from vllm.models.deepseek_v4.nvidia.ampere_sparse import (
            DeepseekV4AmpereSparseMLABackend,
        )
        backends["ampere"] = DeepseekV4AmpereSparseMLABackend
    except ImportError:
        pass
    cap = DeviceCapability(major=_CAPABILITY[0], minor=_CAPABILITY[1])
    return {name: bool(b.supports_compute_capability(cap)) for name, b in backends.items()}


def probe_tile_scheduler() -> str:
    """Whether the SWA metadata builder asks FlashMLA for tile-scheduler structs."""
    from vllm.v1.attention.backends.mla import sparse_swa

    log: list[str] = []
    me = types.SimpleNamespace(_layer_types=[sparse_swa._LAYER_TYPE_SWAONLY,
                                             sparse_swa._LAYER_TYPE_C4A])
    with _patched([(sparse_swa, "get_mla_metadata",
                    Recorder("get_mla_metadata", log, lambda: ("sched", None)))]):
        res = sparse_swa.DeepseekSparseSWAMetadataBuilder.build_tile_scheduler(me, 4)
    used = sorted(k for k, v in res.items() if v is not None)
    return f"calls={len(log)} types={','.join(used) or '-'}"


def probe_indexer_decode_metadata() -> str:
    """Whether the indexer's draft-decode metadata update calls DeepGEMM's scheduler."""
    import torch

    from vllm.v1.attention.backends.mla import indexer

    log: list[str] = []
    n = 2
    decode = types.SimpleNamespace(
        block_table=torch.zeros(n, 4, dtype=torch.int32), indices=None,
        per_req_decode_lens=None, seq_lens=torch.zeros(n, 1, dtype=torch.int32),
        decode_lens=torch.zeros(n, dtype=torch.int32),
        schedule_metadata=torch.zeros(3, 2, dtype=torch.int32))
    md = types.SimpleNamespace(decode=decode, num_decode_tokens=n, num_prefills=0,
                               num_decodes=n, block_table=torch.zeros(n, 4, dtype=torch.int32),
                               seq_lens=torch.full((n,), 7, dtype=torch.int32))
    me = types.SimpleNamespace(dcp_world_size=1, compress_ratio=1,
                               arange_buffer=torch.arange(8, dtype=torch.int32),
                               kv_cache_spec=types.SimpleNamespace(num_states=64), num_sms=108)
    with _patched([(indexer, "get_paged_mqa_logits_metadata",
                    Recorder("deep_gemm_schedule", log,
                             lambda *a, **k: torch.zeros(3, 2, dtype=torch.int32)))]):
        indexer.DeepseekV32IndexerMetadataBuilder.update_draft_decode_metadata(me, md)
    return "+".join(log) or "none"


def probe_inv_rope_warmup() -> list[dict[str, Any]]:
    """Warmup compile keys of the inverse-RoPE (+FP8) kernel for a V4-Flash TP8 layer."""
    from vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant import (
        _FUSED_INV_ROPE_FP8_QUANT_KERNEL,
    )

    cfg = types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace(
            num_attention_heads=64, o_groups=8, head_dim=512, qk_rope_head_dim=64)),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=8))
    keys = _FUSED_INV_ROPE_FP8_QUANT_KERNEL.get_warmup_keys(cfg)
    return [{"quantize": k.quantize, "tma_aligned_scales": k.tma_aligned_scales,
             "launch_pdl": k.launch_pdl} for k in keys]


def probe_o_proj() -> dict[str, str]:
    """What ``deep_gemm_fp8_o_proj`` does with an FP8, a bf16 and a Marlin-repacked
    (int32) ``wo_a``."""
    import torch

    from vllm.models.deepseek_v4.nvidia.ops import o_proj

    n_groups, hpg, d, rank, t = 2, 2, 512, 16, 3
    out = {}
    for label, dtype in (("fp8", torch.float8_e4m3fn), ("bf16", torch.bfloat16),
                         ("int32", torch.int32)):
        log: list[str] = []

        def inv_rope(o: Any, *a: Any, quantize: bool, log: list[str] = log,
                     **k: Any) -> Any:
            log.append(f"inv_rope(quantize={quantize})")
            x = o.reshape(o.shape[0], n_groups, hpg * d)
            return (x.to(torch.float8_e4m3fn) if quantize else x), torch.empty(0)

        weight = torch.zeros(n_groups * rank, hpg * d, dtype=dtype)
        wo_a = types.SimpleNamespace(weight=weight, weight_scale_inv=torch.ones(1))
        with _patched([(o_proj, "fused_inv_rope_fp8_quant", inv_rope),
                       (o_proj, "fp8_einsum", Recorder("fp8_einsum", log))]):
            try:
                o_proj.deep_gemm_fp8_o_proj(
                    torch.zeros(t, n_groups * hpg, d, dtype=torch.bfloat16),
                    torch.zeros(t, dtype=torch.int64), torch.zeros(8, 64), wo_a,
                    lambda z, log=log: log.append("wo_b") or z, n_groups=n_groups,
                    heads_per_group=hpg, nope_dim=448, rope_dim=64, o_lora_rank=rank,
                    einsum_recipe=(1, 128, 128), tma_aligned_scales=False)
                out[label] = "+".join(log)
            except Exception as exc:
                out[label] = "+".join(log + [f"!{type(exc).__name__}"])
    return out


def probe_sparse_indexer_init() -> str:
    """Whether ``SparseAttnIndexer`` (the DeepGEMM indexer op) can be constructed."""
    import torch

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    cfg = VllmConfig()
    cfg.kernel_config.enable_jit_warmup = False
    with set_current_vllm_config(cfg):
        try:
            SparseAttnIndexer(types.SimpleNamespace(prefix="k"), 128, "ue8m0", 512, 128,
                              4096, 4096, torch.zeros(1, 512, dtype=torch.int32))
            return "constructed"
        except RuntimeError as exc:
            return f"refused: {str(exc)[:120]}"


def probe_gate_helpers() -> dict[str, Any]:
    """The patch set's gate helpers next to the presence checks they refine, on the
    mocked CUDA platform and on vLLM's CPU platform."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform
    from vllm.utils import import_utils as iu

    def values() -> dict[str, bool]:
        return {name: bool(getattr(iu, name)()) for name in (
            "has_cutedsl", "has_deep_gemm", "cuda_device_predates_sm90",
            "cutedsl_usable", "deep_gemm_usable")}

    out: dict[str, Any] = {"cuda": values()}
    with _patched([(platforms, "_current_platform", CpuPlatform())]):
        out["cpu"] = values()
    return out


def probe_overlay_identity() -> dict[str, Any]:
    """The overlay identity module next to the upstream version vLLM reports."""
    import vllm
    from vllm import deepinfer_sm80_overlay as overlay

    try:
        overlay.check_upstream()
        check = "ok"
    except RuntimeError as exc:
        check = f"refused: {exc}"
    return {"vllm.__version__": vllm.__version__, "identity": overlay.identity(),
            "describe": overlay.describe(), "check_upstream": check}


def probe_inv_rope_aot() -> dict[str, Any]:
    """Triton ahead-of-time compile of the inverse-RoPE (+FP8) kernel: does it compile
    for sm_80/sm_86 without quantization, and what does sm_90 get (instruction text
    without debug info, hashed) for each constexpr variant."""
    import hashlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant import (
        FusedInvRopeFP8QuantKernel,
    )

    def compile_for(cc: int, quantize: bool, tma: bool) -> Any:
        sig = {"o_ptr": "*bf16", "positions_ptr": "*i64", "cos_sin_cache_ptr": "*fp32",
               "out_ptr": "*fp8e4nv" if quantize else "*bf16",
               "scale_ptr": "*i32" if tma else "*fp32", "num_tokens": "i32",
               "heads_per_group": "constexpr", "o_stride_token": "i64",
               "o_stride_head": "i64", "cache_stride_pos": "i64",
               "out_stride_group": "i64", "out_stride_token": "i64",
               "scale_stride_group": "i64", "scale_stride_k": "i64",
               "fp8_max": "constexpr", "eps": "constexpr", "QUANT_GROUP_SIZE": "constexpr",
               "CHUNKS_PER_HEAD": "constexpr", "NOPE_DIM": "constexpr",
               "HALF_ROPE": "constexpr", "QUANTIZE": "constexpr",
               "TMA_ALIGNED_SCALES": "constexpr", "launch_pdl": "constexpr"}
        consts = {"heads_per_group": 8, "fp8_max": 448.0, "eps": 1e-10,
                  "QUANT_GROUP_SIZE": 128, "CHUNKS_PER_HEAD": 4, "NOPE_DIM": 448,
                  "HALF_ROPE": 32, "QUANTIZE": quantize, "TMA_ALIGNED_SCALES": tma,
                  "launch_pdl": cc >= 90}
        kernel = FusedInvRopeFP8QuantKernel.kernel
        if "BLOCK_H" in kernel.arg_names:  # 0.34.0: heads per program, as its launcher picks
            import importlib  # (the package re-exports a function of the module's name)
            m = importlib.import_module(FusedInvRopeFP8QuantKernel.__module__)
            consts["BLOCK_H"] = m._heads_per_program(consts["heads_per_group"])
        sig = {a: sig.get(a, "constexpr") for a in kernel.arg_names}
        src = ASTSource(fn=kernel, signature=sig, constexprs=consts)
        return triton.compile(src, target=GPUTarget("cuda", cc, 32))

    def code(ptx: str) -> str:
        body = ptx.split(".section\t.debug", 1)[0]
        lines = [ln for ln in body.splitlines()
                 if not ln.strip().startswith((".loc", ".file", "//"))]
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]

    out: dict[str, Any] = {}
    for cc in (80, 86):
        for quantize in (False, True):
            try:
                kernel = compile_for(cc, quantize, False)
                out[f"sm{cc}/quantize={quantize}"] = triton_smem.over_limit(kernel, cc) or "ok"
            except Exception as exc:
                msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
                out[f"sm{cc}/quantize={quantize}"] = f"fails: {type(exc).__name__}: {msg}"[:160]
    for quantize in (False, True):
        for tma in (False, True):
            out[f"sm90/quantize={quantize}/tma={tma}"] = code(
                compile_for(90, quantize, tma).asm["ptx"])
    return out


def _ptx_code(ptx: str) -> str:
    """Hash of a PTX text without debug info (comments, .loc/.file, debug sections, and
    the ``$L__tmpN:`` labels that only mark debug scopes, e.g. of an inlined function)."""
    import hashlib
    import re

    body = ptx.split(".section\t.debug", 1)[0]
    lines = [ln for ln in body.splitlines()
             if not ln.strip().startswith((".loc", ".file", "//"))
             and not re.fullmatch(r"\$L__tmp\d+:", ln.strip())]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _v41_fp8_kernels() -> dict[str, tuple[Any, dict[str, str], dict[str, Any], str]]:
    """DeepSeek-V4.1's FP8 Triton kernels SM80 needs (name -> kernel, signature,
    constexprs, name of the optional software-codec parameter)."""
    from vllm.models.deepseek_v41.common import engram
    from vllm.models.deepseek_v41.common.ops import fused_compress_quant_cache as fcq
    from vllm.models.deepseek_v41.common.ops import indexer_k_store as iks

    insert_sig = {"latent": "*bf16", "positions": "*i64", "cos_sin": "*fp32",
                  "cache": "*u8", "cache_slots": "*i64"}
    insert_consts = {"COS_STRIDE": 64, "CACHE_STRIDE": 37440, "CACHE_BLOCK": 64,
                     "COMPRESS_RATIO": 2, "SANITIZE_CACHE_NANS": False}
    ik_sig = {"k_pre_ptr": "*bf16", "k_pre_stride": "i64", "positions_ptr": "*i64",
              "rms_norm_weight_ptr": "*bf16", "rms_norm_eps": "fp32",
              "cos_sin_cache_ptr": "*fp32", "cos_sin_stride": "i64", "k_cache_ptr": "*u8",
              "kv_slot_mapping_ptr": "*i64", "kv_cache_block_size": "i32"}
    ik_consts = {"HEAD_SIZE": 128, "ROPE_HEAD_DIM": 64, "COMPRESS_RATIO": 1,
                 "TOKEN_STRIDE": 128, "SCALE_DIM": 4, "KV_BLOCK_STRIDE": 16896,
                 "FP8_MAX": 448.0, "USE_FP4": False, "MX_SCALE": False, "SHUFFLE": False,
                 "BLOCK_TILE_SIZE": 16, "HEAD_TILE_SIZE": 16}
    out = {"rope_quant_insert_584": (fcq._rope_quant_insert_kernel, insert_sig,
                                     insert_consts, "FP8_ENCODE"),
           "indexer_k_store_fp8": (iks._indexer_k_norm_rope_quant_store_kernel, ik_sig,
                                   ik_consts, "FP8_ENCODE")}
    for packed in (False, True):
        for peer in (0, 4096):
            sig = {"weight": "*i64" if peer else "*fp8e4nv", "scales": "*u8", "ids": "*i64",
                   "sorted_dst": "*i32", "out": "*u8" if packed else "*bf16",
                   "vocab_start": "i64", "vocab_end": "i64", "num_rows": "i32",
                   "ids_stride_t": "i64", "ids_stride_h": "i64", "GRID": "i32",
                   "SORTED": "i1"}
            consts = {"HEAD_START": 0, "LOCAL_HEADS": 8, "TOTAL_HEADS": 8, "DIM": 256,
                      "QUANT_BLOCK": 32, "BLOCK_R": 16, "PACKED": packed,
                      "OUT_STRIDE": 8 * (256 + 8) if packed else 256, "PEER_ROWS": peer}
            out[f"engram_lookup/packed={packed}/peer={bool(peer)}"] = (
                engram._engram_lookup_kernel, sig, consts, "FP8_DECODE")
    return out


def probe_v41_fp8_launch() -> dict[str, Any]:
    """What DeepSeek-V4.1's FP8 launchers hand their Triton kernels at the probed
    capability: the software codec passed (its name, or None for the hardware
    conversion) and, for the Engram lookup, the dtype of the table it reads."""
    import torch

    from vllm.models.deepseek_v41.common import engram
    from vllm.models.deepseek_v41.common.ops import fused_compress_quant_cache as fcq
    from vllm.models.deepseek_v41.common.ops import indexer_k_store as iks

    calls: list[tuple[tuple, dict]] = []

    class Launch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((args, kwargs))

    def codec(kwargs: dict[str, Any], name: str) -> str | None:
        fn = kwargs.get(name)
        return None if fn is None else getattr(fn, "__name__", str(fn))

    out: dict[str, Any] = {}
    with _patched([(fcq, "_rope_quant_insert_kernel", Launch())]):
        fcq.rope_quant_insert(
            torch.zeros(4, 512, dtype=torch.bfloat16), torch.arange(4),
            torch.zeros(64, 64), torch.zeros(2, 64, 584, dtype=torch.uint8),
            torch.arange(4), compress_ratio=2)
    out["rope_quant_insert_584"] = codec(calls[-1][1], "FP8_ENCODE")
    with _patched([(iks, "_indexer_k_norm_rope_quant_store_kernel", Launch())]):
        for fp4 in (False, True):
            row = 64 if fp4 else 128
            iks.indexer_k_norm_rope_store(
                torch.zeros(4, 128, dtype=torch.bfloat16), torch.arange(4),
                torch.zeros(64, 64), torch.ones(128, dtype=torch.bfloat16), 1e-6,
                torch.zeros(2, 64, row + 4, dtype=torch.uint8), torch.arange(4),
                compress_ratio=1, use_fp4_cache=fp4)
            out[f"indexer_k_store/fp4={fp4}"] = codec(calls[-1][1], "FP8_ENCODE")
    table = torch.zeros(64, 256, dtype=torch.float8_e4m3fn)
    scales = torch.zeros(64, 8, dtype=torch.uint8)
    me = types.SimpleNamespace(
        part_n_hash_cols=2, n_hash_cols=2, head_start=0, vocab_start_idx=0,
        vocab_end_idx=64, cpu_offload=False, _packed=None, _num_sms=108, peer_rows=0,
        peer_ptrs=None, dim=256, block_size=32, _storage=lambda: (table, scales),
        _uses_small_host_pages=False)  # (0.34.0+: sorts rows of small-page host tables)
    with _patched([(engram, "_engram_lookup_kernel", Launch())]):
        engram.ParallelEngramEmbedding.lookup(
            me, torch.zeros(3, 2, dtype=torch.int64), torch.empty(6, 256, dtype=torch.bfloat16))
    args, kwargs = calls[-1]
    out["engram_lookup"] = {"decoder": codec(kwargs, "FP8_DECODE"), "table": str(args[0].dtype)}
    return out


def probe_v41_fp8_aot() -> dict[str, Any]:
    """Triton ahead-of-time compile of DeepSeek-V4.1's FP8 kernels: for sm_80/sm_86,
    with the software e4m3 codec where the tree's kernel takes one ("soft") and without
    ("hardware"); for sm_90 the instruction text (hashed, no debug info) of the default."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def compile_for(kernel, sig, consts, cc, codec):
        sig = dict(sig)
        consts = dict(consts)
        if codec is not None:
            name, fn = codec
            consts[name] = fn
            if sig.get("weight") == "*fp8e4nv":  # the lookup reads uint8 codes then
                sig["weight"] = "*u8"
        for k in consts:
            sig.setdefault(k, "constexpr")
        ordered = {a: sig[a] for a in kernel.arg_names if a in sig}
        src = ASTSource(fn=kernel, signature=ordered, constexprs=consts)
        return triton.compile(src, target=GPUTarget("cuda", cc, 32))

    def attempt(fn, cc: int) -> str:
        try:
            return triton_smem.over_limit(fn(), cc) or "ok"
        except Exception as exc:
            msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            return f"fails: {type(exc).__name__}: {msg}"[:160]

    out: dict[str, Any] = {}
    for label, (kernel, sig, consts, param) in _v41_fp8_kernels().items():
        has_param = param in kernel.arg_names
        codec = None
        if has_param:
            from deepinfer_sm80.triton_writers import fp8

            codec = (param, fp8.e4m3_encode if param == "FP8_ENCODE" else fp8.e4m3_decode)
        for cc in (80, 86):
            out[f"{label}/sm{cc}/hardware"] = attempt(
                lambda: compile_for(kernel, sig, consts, cc, None), cc)
            out[f"{label}/sm{cc}/soft"] = (attempt(
                lambda: compile_for(kernel, sig, consts, cc, codec), cc)
                if has_param else "no parameter")
        out[f"{label}/sm90"] = _ptx_code(
            compile_for(kernel, sig, consts, 90, None).asm["ptx"])
    return out


class _Stop(Exception):
    """Ends a probed call once the decision is made."""


def probe_mhc_broadcast_route() -> str:
    """Which projection DeepSeek-V4's first-layer mHC pre (``mhc_pre_broadcast_tilelang``,
    nvidia/model.py:750: the embedding arrives as (T, H)) takes: "deep_gemm"
    (``tf32_hc_prenorm_gemm``, forced by ``use_tilelang_fallback=False``) or
    "tilelang_pre" (``mhc_pre_tilelang`` on the broadcast residual). CPU tensors; the
    kernels are stand-ins that record the call."""
    import torch

    import vllm.utils.deep_gemm as dg
    from vllm.model_executor.kernels.mhc import tilelang as W
    from vllm.model_executor.kernels.mhc import tilelang_kernels as K

    T, hc, H = 2, 4, 64
    calls: list[str] = []

    def pre(residual: Any, *args: Any, **kwargs: Any) -> tuple:
        calls.append("tilelang_pre")
        return (torch.zeros(T, hc, 1), torch.zeros(T, hc, hc),
                torch.zeros(T, H, dtype=torch.bfloat16))

    def gemm(*args: Any, **kwargs: Any) -> None:
        calls.append("deep_gemm")
        raise _Stop

    mix = hc * (2 + hc)
    with _patched([(W, "mhc_pre_tilelang", pre), (dg, "tf32_hc_prenorm_gemm", gemm),
                   (K, "compute_num_split", lambda *a, **k: 1)]):
        try:
            W.mhc_pre_broadcast_tilelang(
                torch.zeros(T, H, dtype=torch.bfloat16), torch.zeros(mix, hc * H),
                torch.ones(3), torch.zeros(mix), 1e-6, 1e-6, 1e-6, 2.0, 20,
                norm_weight=torch.ones(H, dtype=torch.bfloat16), norm_eps=1e-6,
                fn_broadcast=torch.zeros(mix, H))
        except _Stop:
            pass
    return calls[0] if calls else "none"


#: PTX / CUDA features that need SM90 or newer; none may appear in SM80 code.
SM90_ONLY_FEATURES = ("griddepcontrol", "cp.async.bulk", "wgmma", "setmaxnreg",
                      "fence.proxy.async", "elect.sync", "stmatrix", "__cluster_dims__",
                      "cudaGridDependencySynchronize", "tma_load", "tma_store")


def _mhc_tilelang_registrations(cfg: Any, hidden: int, hc_mult: int = 4) -> list[tuple]:
    """The TileLang mHC warmups DeepSeek-V4 registers on a CUDA device, with the model's
    arguments: the first decoder layer on the first PP rank (nvidia/model.py:687-731,
    ``include_pre_gemm_splits = is_deep_gemm_supported()``, False below 9.0) and the
    model's ``hc_head`` (:935-946). eps 1e-6, hc_post_alpha 2.0, 20 Sinkhorn iterations
    (DeepSeek-V4-Flash's config)."""
    from vllm.model_executor.kernels.mhc import tilelang_kernels as K
    from vllm.utils.deep_gemm import is_deep_gemm_supported

    pre_splits = is_deep_gemm_supported()
    eps = 1e-6
    regs = [(K._MHC_PRE_BIG_FUSE_TILELANG_KERNEL, (cfg,), dict(
        hidden_size=hidden, hc_mult=hc_mult, use_norm_weight=True,
        include_pre_gemm_splits=pre_splits, include_broadcast_splits=True, rms_eps=eps,
        hc_pre_eps=eps, hc_sinkhorn_eps=eps, hc_post_mult_value=2.0, sinkhorn_repeat=20,
        norm_eps=(eps, eps), broadcast_norm_eps=eps))]
    if not pre_splits:
        regs.append((K._HC_PRENORM_GEMM_TILELANG_KERNEL, (cfg,), dict(
            hidden_size=hidden, hc_mult=hc_mult, n_out=hc_mult * (2 + hc_mult))))
    regs += [
        (K._MHC_POST_TILELANG_KERNEL, (), dict(hidden_size=hidden, hc_mult=hc_mult)),
        (K._MHC_FUSED_TILELANG_KERNEL, (cfg,), dict(hidden_size=hidden, hc_mult=hc_mult)),
        (K._HC_HEAD_FUSED_TILELANG_KERNEL, (), dict(hidden_size=hidden, hc_mult=hc_mult,
                                                     rms_eps=eps, hc_eps=eps)),
    ]
    return regs


def _mhc_v41_registrations(cfg: Any, hidden: int, hc_mult: int = 4) -> list[tuple]:
    """The mHC warmups a DeepSeek-V4.1 decoder layer registers on a CUDA device
    (deepseek_v41/nvidia/model.py:435-497) without a side stream for the shifted mHC
    (family 100 only) and without a draft: ``MHC_PRE_NORM_KERNEL`` for the broadcast
    embedding and for the hc stream without and with the carried pre-mix."""
    from vllm.model_executor.kernels.mhc.tilelang_kernels import mhc_fused_post_pre_splits
    from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

    eps = 1e-6
    stream = {"rms_numel": hc_mult * hidden,
              "extra_splits": mhc_fused_post_pre_splits(hidden, hc_mult)}
    variants = [{"rms_numel": hidden, "use_pre_mix_in": False, "extra_splits": ()},
                {**stream, "use_pre_mix_in": False}, {**stream, "use_pre_mix_in": True}]
    return [(MHC_PRE_NORM_KERNEL, (), dict(
        split_mode="fused", max_tokens=cfg.scheduler_config.max_num_batched_tokens,
        hidden_size=hidden, rms_eps=eps, hc_pre_eps=eps, hc_sinkhorn_eps=eps,
        hc_post_mult_value=2.0, sinkhorn_repeat=20, norm_eps=eps, hc_mult=hc_mult, **v))
        for v in variants]


def probe_mhc_tilelang_aot() -> dict[str, Any]:
    """Compile every TileLang mHC warmup key of DeepSeek-V4 (hidden 4096: V4-Flash;
    $DEEPINFER_MHC_HIDDEN to change; $DEEPINFER_MHC_MODEL=v41: DeepSeek-V4.1's decoder
    layer instead; $DEEPINFER_MHC_FORCE_PDL=1: a control with PDL forced on;
    $DEEPINFER_MHC_KEYS_PER_REGISTRATION=n: only the first n keys of each registration) for
    the probed capability's architecture, as vLLM
    does at start-up (``VllmTileLangJitKernel.compile``: no launch), with the split-k grid
    sized for the part's SMs (A100 108, SM86 84). Per kernel: keys, compiled, failures,
    SM90-only features found in the generated CUDA source, and the targets compiled for;
    per kernel cache, the most shared memory one of its blocks takes ("shared", bytes, from
    ``tilelang_smem``) and where that exceeds the part's block limit ("shared_over")."""
    import os
    import types as _types

    try:
        import tilelang  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"tilelang not installed ({exc})"}
    if _CAPABILITY[0] >= 9:
        return {"skipped": "only SM8x is probed"}
    import torch

    arch = f"sm_{_CAPABILITY[0]}{_CAPABILITY[1]}"
    sms = 108 if tuple(_CAPABILITY) == (8, 0) else 84
    hidden = int(os.environ.get("DEEPINFER_MHC_HIDDEN", "4096"))
    model = os.environ.get("DEEPINFER_MHC_MODEL", "v4")
    saved_env = os.environ.get("TILELANG_DEFAULT_TARGET")
    saved_props = torch.cuda.get_device_properties
    os.environ["TILELANG_DEFAULT_TARGET"] = f'{{"kind": "cuda", "arch": "{arch}"}}'
    torch.cuda.get_device_properties = lambda d=None: _types.SimpleNamespace(
        multi_processor_count=sms, name=f"mocked {arch}")
    try:
        from vllm.model_executor.kernels.mhc import tilelang_kernels as K

        K.compute_num_split.cache_clear()
        if os.environ.get("DEEPINFER_MHC_FORCE_PDL") == "1":  # control: SM90-only code in
            K.ENABLE_PDL = True  # every kernel (griddepcontrol), which must not pass
        cfg = _types.SimpleNamespace(
            scheduler_config=_types.SimpleNamespace(max_num_batched_tokens=8192))
        out: dict[str, Any] = {"enable_pdl": K.ENABLE_PDL, "hidden": hidden, "model": model,
                               "kernels": {}}
        regs = (_mhc_v41_registrations if model == "v41" else _mhc_tilelang_registrations)(
            cfg, hidden)
        per_reg = int(os.environ.get("DEEPINFER_MHC_KEYS_PER_REGISTRATION", "0"))
        for kernel, args, kwargs in regs:
            entry = out["kernels"].setdefault(type(kernel).__name__,
                                              {"keys": 0, "compiled": 0, "failed": []})
            keys = list(kernel.get_warmup_keys(*args, **kwargs))
            _compile_each(kernel, keys[:per_reg] if per_reg > 0 else keys, entry)
        from vllm.model_executor.kernels.mhc.warmup import MHC_PRE_NORM_KERNEL

        found: dict[str, list[str]] = {}
        targets: set[str] = set()
        shared: dict[str, int] = {}
        shared_over: dict[str, str] = {}
        cap = _CAPABILITY[0] * 10 + _CAPABILITY[1]
        caches = [(name, getattr(obj, "__dict__", {}).get("_kernel_cache"))
                  for name, obj in vars(K).items()]
        caches.append(("MHC_PRE_NORM_KERNEL", MHC_PRE_NORM_KERNEL._compiled_cache))
        for name, cache in caches:
            if not isinstance(cache, dict):
                continue
            for compiled in cache.values():
                src = compiled.get_kernel_source()
                hits = [f for f in SM90_ONLY_FEATURES if f in src]
                if hits:
                    found[name] = sorted(set(found.get(name, [])) | set(hits))
                targets.add(str(compiled.target.attrs["arch"]))
                for fn, nbytes in tilelang_smem.kernel_shared_bytes(compiled).items():
                    shared[name] = max(shared.get(name, 0), nbytes)
                    msg = tilelang_smem.over_limit(f"{name} ({fn})", nbytes, cap)
                    if msg and name not in shared_over:
                        shared_over[name] = msg
        out["sm90_only"] = found
        out["targets"] = sorted(targets)
        out["shared"] = shared
        out["shared_over"] = shared_over
        return out
    finally:
        torch.cuda.get_device_properties = saved_props
        if saved_env is None:
            os.environ.pop("TILELANG_DEFAULT_TARGET", None)
        else:
            os.environ["TILELANG_DEFAULT_TARGET"] = saved_env


def _current_platform() -> Any:
    from vllm.platforms import current_platform
    return current_platform


#: DeepSeek-V4 / V4.1 GEMM shapes the quantised-kernel probe asks about: name -> (hidden,
#: moe_intermediate, routed experts, top-k). V4-Flash and V4-Pro (upstream map §8); V4.1-Flash.
_MOE_MODELS = {"v4_flash": (4096, 2048, 256, 6), "v4_pro": (7168, 3072, 384, 6),
               "v41_flash": (5120, 2304, 256, 6)}


def _dsv4_moe_config(hidden: int, inter: int, experts: int, topk: int, tp: int,
                     ep: bool) -> Any:
    """The ``FusedMoEConfig`` vLLM's ``FusedMoE`` builds for a DeepSeek-V4 MoE layer
    (fused_moe/layer.py:360-391): silu gate with V4's swiglu clamp (10), the DeepseekV4
    routing method, bf16 activations, TP ``tp`` (or EP ``tp`` with ``ep``), no DP, the
    default ``auto`` backend."""
    import torch

    from vllm.config import ParallelConfig
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    # FusedMoEParallelConfig.make asks the (here uninitialised) process groups for ranks;
    # these are the fields it returns for rank 0 of TP ``tp`` (layer.py make_parallel_config),
    # or, with expert parallelism, of EP ``tp`` over the TP ranks.
    par = FusedMoEParallelConfig(
        tp_size=1 if ep else tp, tp_rank=0, pcp_size=1, pcp_rank=0, dp_size=1, dp_rank=0,
        ep_size=tp if ep else 1, ep_rank=0, sp_size=1, use_ep=ep,
        all2all_backend=ParallelConfig().all2all_backend, enable_eplb=False)
    return FusedMoEConfig(
        num_experts=experts, experts_per_token=topk, hidden_dim=hidden,
        intermediate_size=inter, num_local_experts=experts // tp if ep else experts,
        num_logical_experts=experts,
        activation=MoEActivation.from_str("silu"), device="cuda",
        routing_method=RoutingMethodType.DeepseekV4, moe_parallel_config=par,
        in_dtype=torch.bfloat16, router_logits_dtype=torch.float32, swiglu_limit=10.0)


def probe_quant_kernels() -> dict[str, Any]:
    """Which of vLLM's quantised GEMM kernels the DeepSeek-V4 / V4.1 layers get, from the
    real selectors: the FP8-block linears (``init_fp8_linear_kernel``, V4's
    ``fused_wqa_wkv``, ``wq_b``, ``wo_b``, shared experts), V4.1's MXFP8 linears
    (``init_mxfp8_linear_kernel``), the routed experts with MXFP4 weights
    (``select_deepseek_v4_mxfp4_moe_backend``, V4-Flash / V4-Pro / V4.1) and with FP8-block
    weights (``select_fp8_moe_backend``, V4-Flash-Base), at TP 1, TP 8 and EP 8. Each entry is the
    kernel class (and MoE backend) picked, or the error the selector raised."""
    import torch

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.kernels import linear as lk
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as fp8_oracle
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as mxfp4_oracle
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        GroupShape,
        create_fp8_quant_key,
        kFp8Dynamic128Sym,
    )

    def attempt(fn: Callable[[], Any]) -> Any:
        try:
            got = fn()
        except Exception as exc:  # the selectors raise when nothing fits
            return _error(exc)
        if isinstance(got, tuple):
            backend, cls = got
            return {"backend": getattr(backend, "value", str(backend)),
                    "experts": None if cls is None else cls.__name__}
        return type(got).__name__

    act = create_fp8_quant_key(static=False, group_shape=GroupShape(1, 128))
    wkey = create_fp8_quant_key(static=True, group_shape=GroupShape(128, 128))
    out: dict[str, Any] = {}
    with set_current_vllm_config(VllmConfig()):
        # (N, K): V4-Flash fused_wqa_wkv (1024 + 512 rows of 4096), V4-Pro wo_b, V4.1 wkv
        for name, shape in (("fp8_block/4096x1536", (1536, 4096)),
                            ("fp8_block/7168x7168", (7168, 7168))):
            out[name] = attempt(lambda shape=shape: lk.init_fp8_linear_kernel(
                activation_quant_key=act, weight_quant_key=wkey, weight_shape=shape,
                input_dtype=torch.bfloat16, out_dtype=torch.bfloat16))
        out["mxfp8/5120x1792"] = attempt(
            lambda: lk.init_mxfp8_linear_kernel(weight_shape=(1792, 5120)))
        for model, (hidden, inter, experts, topk) in _MOE_MODELS.items():
            for par, tp, ep in (("tp1", 1, False), ("tp8", 8, False), ("ep8", 8, True)):
                moe = _dsv4_moe_config(hidden, inter if ep else inter // tp, experts, topk,
                                       tp, ep)
                out[f"moe_mxfp4/{model}/{par}"] = attempt(
                    lambda moe=moe: mxfp4_oracle.select_deepseek_v4_mxfp4_moe_backend(moe))
                if model == "v4_flash":
                    out[f"moe_fp8/{model}/{par}"] = attempt(
                        lambda moe=moe: fp8_oracle.select_fp8_moe_backend(
                            moe, weight_key=wkey, activation_key=kFp8Dynamic128Sym))
    return out


PROBES: dict[str, Callable[[], Any]] = {
    "attn_cls": probe_attn_cls,
    "v41_attn_cls": probe_v41_attn_cls,
    "v41_fp8_launch": probe_v41_fp8_launch,
    "gather": probe_gather,
    "indexer_q": probe_indexer_q,
    "compressor_store": probe_compressor_store,
    "compressor_warmup": probe_compressor_warmup,
    "indexer_warmup": probe_indexer_warmup,
    "attention_warmup": probe_attention_warmup,
    "backend_support": probe_backend_support,
    "tile_scheduler": probe_tile_scheduler,
    "indexer_decode_metadata": probe_indexer_decode_metadata,
    "inv_rope_warmup": probe_inv_rope_warmup,
    "o_proj": probe_o_proj,
    "sparse_indexer_init": probe_sparse_indexer_init,
    "mhc_broadcast_route": probe_mhc_broadcast_route,
    "quant_kernels": probe_quant_kernels,
}

#: Probes not in the default set (asked for by name): they need the patched tree or
#: cost more than a decision.
EXTRA_PROBES: dict[str, Callable[[], Any]] = {
    "gate_helpers": probe_gate_helpers,
    "overlay_identity": probe_overlay_identity,
    "inv_rope_aot": probe_inv_rope_aot,
    "warmup_aot": probe_warmup_aot,
    "v41_fp8_aot": probe_v41_fp8_aot,
    "v41_ampere_construct": probe_v41_ampere_construct,
    "mhc_tilelang_aot": probe_mhc_tilelang_aot,
    "short_context_topk_aot": probe_short_context_topk_aot,
    "moe_router_topk_aot": probe_moe_router_topk_aot,
}


#: Module-level names vLLM computes from the device capability once, at import: module ->
#: (name, the function that computes it). A process that probes several capabilities
#: recomputes them for each (``_reset_capability_state``).
_IMPORT_TIME_CONSTANTS = {
    "vllm.model_executor.layers.quantization.utils.w8a8_utils": (
        "CUTLASS_BLOCK_FP8_SUPPORTED", "cutlass_block_fp8_supported"),
}


def _reset_capability_state() -> None:
    """Make an already-imported vLLM answer for the newly probed capability as a fresh
    process would: empty every ``functools.cache`` / ``lru_cache`` of its modules (capability
    checks such as ``utils/deep_gemm.py``'s, ``utils/flashinfer.py``'s and
    ``fp8_utils.py``'s), and recompute :data:`_IMPORT_TIME_CONSTANTS` in every module that
    holds them (``w8a8_utils.py:41``; the CUTLASS block kernel imports the name). Without it
    an 8.0 probe after a 12.0 one was given the CUTLASS FP8-block linear kernel."""
    modules = [(n, m) for n, m in list(sys.modules.items())
               if m is not None and (n == "vllm" or n.startswith("vllm."))]
    for name, module in modules:
        for value in list(vars(module).values()):
            if (isinstance(value, functools._lru_cache_wrapper)
                    and getattr(value, "__module__", None) == name):
                value.cache_clear()
    for owner, (const, fn) in _IMPORT_TIME_CONSTANTS.items():
        if owner in sys.modules:
            value = getattr(sys.modules[owner], fn)()
            for _, module in modules:
                if const in vars(module):
                    setattr(module, const, value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True)
    ap.add_argument("--capability", action="append", required=True,
                    help="e.g. 8.0; repeat to probe several in this order")
    ap.add_argument("--installed", type=Path, default=None,
                    help="directory with stand-in cutlass/deep_gemm packages")
    ap.add_argument("--probe", action="append", default=[])
    args = ap.parse_args(argv)
    _boot(args.tree.resolve(), args.installed)
    results: dict[str, Any] = {}
    for cap in args.capability:
        _CAPABILITY[:] = [int(x) for x in cap.split(".")]
        _reset_capability_state()
        results[cap] = {}
        for name in args.probe or list(PROBES):
            try:
                results[cap][name] = {**PROBES, **EXTRA_PROBES}[name]()
            except Exception as exc:
                results[cap][name] = _error(exc)
    print(json.dumps(results, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
