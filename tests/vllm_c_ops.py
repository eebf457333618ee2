"""vLLM CUDA kernels on the DeepSeek-V4 SM80 path, built outside vLLM as small shared
libraries and called through ctypes, so that the GPU tests can run them as SM80 code next to
their SM90 builds:

- ``dsv4_insert``: ``csrc/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu``. On SM8x every
  DeepSeek-V4/V4.1 attention layer calls this compiled op first
  (``torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert``: Q RMSNorm + RoPE and
  the padded Q; KV RoPE, UE8M0/e4m3 quantisation and the 584-byte record insert), and V4.1's
  ``forward_kv`` and DSpark call ``fused_deepseek_v4_kv_rope_insert``. Built for sm_80 its FP8
  conversion is cuda_fp8.h's software path instead of the SM89+ instruction.
- ``dsv4_hash_topk``: ``csrc/moe/topk_softplus_sqrt_kernels.cu``, the router of V4's hash MoE
  layers (``torch.ops._moe_C.topk_hash_softplus_sqrt`` with a token -> experts table). vLLM
  0.34.0 split it into ``topk_softplus_sqrt_kernels.cuh`` and instantiation units
  (``LATER_LAYOUTS``); the layout the tree has is used.
- ``indexer_k_gather``: ``cp_gather_indexer_k_quant_cache_kernel`` of ``csrc/cache_kernels.cu``,
  which the SM80 indexer's prefill (V4 and V4.1) calls to gather K rows and scales.
- ``silu_clamp`` and ``moe_align``: ``silu_and_mul_with_clamp`` (``csrc/activation_kernels.cu``)
  and ``moe_align_block_size`` (``csrc/moe/moe_align_sum_kernels.cu``), which vLLM's
  ``fused_marlin_moe`` calls between the routed experts' Marlin GEMMs (the Marlin kernels
  themselves: ``tests/vllm_c_marlin.py``).

vLLM builds them for every CUDA architecture; nothing else here runs them as SM80 code.

Each library is the kernel half of the upstream file (cut before its stable-ABI torch
wrappers, ``UpstreamSource.cut``; or one kernel taken out of it, ``extract``) plus a C harness from ``tests/vllm_c/`` (entry points that
restate the wrappers' host glue) and ``tests/vllm_c/torch_utils.h`` (a stand-in for vLLM's
header that can report a capability). It needs nvcc and torch's header-only headers, no
libtorch link.

Variants (``VARIANTS``): ``sm80`` is compute_80 code, SASS for sm_80/86/90 from it plus the
PTX, reporting capability 8.0 to upstream's launchers (so those that ask launch without PDL,
as on an A100); ``sm90`` is the Hopper build vLLM users run today. ``python
tests/vllm_c_ops.py --source dsv4_insert --variant sm80`` builds one and prints ptxas's
register / spill report.

Builds are cached under ``$DEEPINFER_VLLM_C_DIR`` (default ``build/vllm-c``), keyed by the
sources, the flags and the nvcc version.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
_HERE = Path(__file__).resolve().parent / "vllm_c"


@dataclass(frozen=True)
class UpstreamSource:
    path: str                  # the upstream file, relative to the tree
    headers: tuple[str, ...]   # local headers it or the harness includes, copied along
    cut: re.Pattern | None     # kept: the text before this (the first torch-op wrapper) or,
                               # with extract, the one definition that starts here; None:
                               # the whole file (a kernel header without wrappers)
    harness: str               # tests/vllm_c/<harness>: the C entry points
    lib: str                   # library file name
    extract: bool = False      # True: only the definition at `cut`, to its closing brace
    units: tuple[str, ...] = ()  # upstream units appended to the kernel half, their include
                                 # of `path` dropped (explicit instantiations kept elsewhere)
    wrappers: str = ""         # the file holding the torch-op wrappers the harness restates
                               # (default `path`); read by tests/test_vllm_c_build.py


SOURCES = {
    "dsv4_insert": UpstreamSource(
        "csrc/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu",
        ("csrc/type_convert.cuh", "csrc/dispatch_utils.h", "csrc/core/cuda_compat.h"),
        re.compile(r"^void fused_deepseek_v4_kv_rope_insert\(", re.M),
        "insert_harness.cu", "libdsv4_insert.so"),
    "dsv4_hash_topk": UpstreamSource(
        "csrc/moe/topk_softplus_sqrt_kernels.cu",
        ("csrc/cub_helpers.h", "csrc/core/cuda_compat.h"),
        re.compile(r"^template <typename ComputeType>\s*\nvoid dispatch_topk_softplus_sqrt_launch\(",
                   re.M),
        "hash_topk_harness.cu", "libdsv4_hash_topk.so"),
    # The indexer K gather sits among cache_kernels.cu's wrappers: only its kernel is taken.
    "indexer_k_gather": UpstreamSource(
        "csrc/cache_kernels.cu", ("csrc/core/utils.hpp",),
        re.compile(r"^template <int BLOCK_Y_SIZE>\s*\n__global__ void "
                   r"cp_gather_indexer_k_quant_cache_kernel\(", re.M),
        "indexer_k_gather_harness.cu", "libindexer_k_gather.so", extract=True),
    # The two small ops vLLM's fused_marlin_moe calls between the Marlin GEMMs of the routed
    # experts (tests/vllm_marlin_check.py): the SiLU with V4's swiglu clamp, and the grouping
    # of the routed rows by expert.
    "silu_clamp": UpstreamSource(
        "csrc/activation_kernels.cu",
        ("csrc/core/cuda_compat.h", "csrc/async_util.cuh", "csrc/cuda_vec_utils.cuh",
         "csrc/dispatch_utils.h"),
        re.compile(r"^#define LAUNCH_ACTIVATION_GATE_KERNEL\(", re.M),
        "activation_harness.cu", "libsilu_clamp.so"),
    "moe_align": UpstreamSource(
        "csrc/moe/moe_align_sum_kernels.cu",
        ("csrc/core/cuda_compat.h", "csrc/core/utils.hpp", "csrc/dispatch_utils.h",
         "csrc/quantization/vectorization.cuh"),
        re.compile(r"^void moe_align_block_size\(", re.M),
        "moe_align_harness.cu", "libmoe_align.so"),
}
# Later upstream layouts of a source, newest first; the layout used is the first whose file
# the tree has (layout()), else SOURCES'. vLLM 0.34.0 split the MoE router file into a
# kernel header (launchers declared `extern template`), one dispatch unit and one unit per
# (gating dtype, index dtype) that instantiates the launcher: the harness takes the header
# and the fp32-gating units (the hash layers' router logits are fp32).
LATER_LAYOUTS = {
    "dsv4_hash_topk": (UpstreamSource(
        "csrc/moe/topk_softplus_sqrt_kernels.cuh",
        ("csrc/cub_helpers.h", "csrc/core/cuda_compat.h"), None,
        "hash_topk_harness.cu", "libdsv4_hash_topk.so",
        units=("csrc/moe/topk_softplus_sqrt_f32_int32.cu",
               "csrc/moe/topk_softplus_sqrt_f32_int64.cu"),
        wrappers="csrc/moe/topk_softplus_sqrt.cu"),),
}


def layouts(source: str) -> tuple[UpstreamSource, ...]:
    """Every known layout of a source, newest first."""
    return (*LATER_LAYOUTS.get(source, ()), SOURCES[source])


def layout(source: str, tree: Path | None) -> UpstreamSource:
    """The layout of ``source`` in ``tree`` (SOURCES' when the tree has none of them)."""
    for src in layouts(source):
        if tree is not None and (Path(tree) / src.path).is_file():
            return src
    return SOURCES[source]


# Stable-ABI headers the wrappers need and the kernel halves do not.
_STABLE_INCLUDE = re.compile(r'^\s*#include\s*[<"]torch/csrc/stable/[^>"]+[>"]\s*$', re.M)

# vLLM's flags for its stable extension (cmake/utils.cmake get_torch_gpu_compiler_flags:
# torch's COMMON_NVCC_FLAGS without the half/bf16 operator switches, -DENABLE_FP8; no
# fast math for these files).
BASE_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-DENABLE_FP8",
              "-Xcompiler", "-fPIC", "-shared", "-Xptxas", "-v"]


@dataclass(frozen=True)
class Variant:
    gencode: tuple[str, ...]
    defines: tuple[str, ...]  # -DDEEPINFER_REPORTED_CC: what get_device_prop() reports


VARIANTS = {
    "sm80": Variant(("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_80,code=sm_86",
                     "-gencode=arch=compute_80,code=sm_90", "-gencode=arch=compute_80,code=compute_80"),
                    ("-DDEEPINFER_REPORTED_CC=80",)),
    "sm90": Variant(("-gencode=arch=compute_90,code=sm_90",), ()),
}


class VllmCError(RuntimeError):
    """The upstream source is missing or moved, or the build / a launch failed."""


def find_tree(source: str = "dsv4_insert") -> Path | None:
    """A vLLM tree holding the source's file: $DEEPINFER_VLLM_TREE, the applied tree of the
    patch set under test (build/vllm-$DEEPINFER_TEST_VLLM, default 0.33.0, as in
    tests/vllm_cpu_harness.py), or the GPU bundle's vllm-tree/."""
    version = os.environ.get("DEEPINFER_TEST_VLLM", "0.33.0")
    cands = [os.environ.get("DEEPINFER_VLLM_TREE"), _REPO / "build" / f"vllm-{version}",
             _REPO / "vllm-tree"]
    for c in cands:
        if c and any((Path(c) / src.path).is_file() for src in layouts(source)):
            return Path(c).resolve()
    return None


def kernel_half(text: str, source: str = "dsv4_insert", src: UpstreamSource | None = None
                ) -> str:
    """The upstream file cut before its first torch-op wrapper, stable includes dropped; or,
    for an ``extract`` source, the one definition that starts at ``cut``; or, without a
    ``cut``, the whole file with its stable includes dropped. ``src``: the layout (default
    SOURCES')."""
    src = src or SOURCES[source]
    if src.cut is None:
        return _STABLE_INCLUDE.sub("", text)
    m = src.cut.search(text)
    if m is None:
        raise VllmCError(
            f"{src.path}: no line matching {src.cut.pattern!r}; upstream moved or renamed what "
            f"the harness takes. Update SOURCES[{source!r}].cut in tests/vllm_c_ops.py and check "
            f"that tests/vllm_c/{src.harness} still restates the host glue.")
    if src.extract:
        return text[m.start():_definition_end(text, m.end(), src.path)] + "\n"
    return _STABLE_INCLUDE.sub("", text[:m.start()])


def upstream_text(tree: Path, source: str, src: UpstreamSource) -> str:
    """What the harness includes: the kernel half, then each of ``src.units`` without its
    include of the kernel file (which the half already holds)."""
    text = kernel_half((tree / src.path).read_text(), source, src)
    own = re.compile(rf'^\s*#include\s*"{re.escape(Path(src.path).name)}"\s*$', re.M)
    for unit in src.units:
        path = tree / unit
        if not path.is_file():
            raise VllmCError(f"{unit}: missing from {tree}; upstream moved the launcher's "
                             f"instantiations. Update LATER_LAYOUTS[{source!r}].units in "
                             "tests/vllm_c_ops.py.")
        text += f"\n// ---- {unit}\n" + own.sub("", path.read_text())
    return text


def _definition_end(text: str, pos: int, path: str) -> int:
    """Index just past the brace that closes the first body opened at or after ``pos``
    (line comments, block comments and string / character literals skipped)."""
    depth, i, n = 0, pos, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.find("*/", i)
            i = n if i < 0 else i + 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise VllmCError(f"{path}: the definition taken by the harness has no closing brace")


def _torch_include() -> Path:
    import torch

    inc = Path(torch.__file__).resolve().parent / "include"
    if not (inc / "torch" / "headeronly").is_dir():
        raise VllmCError(f"torch {torch.__version__} at {inc} has no header-only headers "
                         "(torch/headeronly); the upstream source needs them")
    return inc


def _nvcc() -> str:
    nvcc = shutil.which("nvcc") or (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin"
                                    / "nvcc").as_posix()
    if not Path(nvcc).exists():
        raise VllmCError("nvcc not found (PATH or $CUDA_HOME/bin)")
    return nvcc


def build_dir(name: str, files: dict[str, str], flags: list[str], nvcc: str,
              out_root: Path | None = None) -> Path:
    """``<root>/<name>-<key>``, the key a hash of the sources (``files``: relative path ->
    text), the flags and nvcc's version; root ``out_root``, else $DEEPINFER_VLLM_C_DIR, else
    build/vllm-c. Unless the directory already holds a build, the sources are written to its
    ``src/`` (laid out by their relative paths)."""
    ver = subprocess.run([nvcc, "--version"], text=True, capture_output=True).stdout
    key = hashlib.sha256("\0".join([*sorted(f"{k}\0{s}" for k, s in files.items()), *flags,
                                    ver]).encode()).hexdigest()[:12]
    root = out_root or Path(os.environ.get("DEEPINFER_VLLM_C_DIR", _REPO / "build" / "vllm-c"))
    d = root / f"{name}-{key}"
    for rel, text in files.items():
        p = d / "src" / rel
        if not p.is_file() or p.read_text() != text:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    return d


def build(variant: str, source: str = "dsv4_insert", tree: Path | None = None,
          out_root: Path | None = None) -> Path:
    """Build (or reuse) the source's library for the variant; returns its path."""
    v = VARIANTS[variant]
    tree = tree or find_tree(source)
    if tree is None:
        raise VllmCError(f"no vLLM tree with {SOURCES[source].path} (set DEEPINFER_VLLM_TREE)")
    src = layout(source, tree)
    nvcc = _nvcc()
    inc = _torch_include()
    # Laid out as under csrc/, so that the file's relative includes resolve; the kernel half
    # and the harness sit where the upstream file was.
    here = Path(src.path).relative_to("csrc").parent
    files = {str(here / "upstream_kernels.inc"): upstream_text(tree, source, src)}
    for h in src.headers:
        files[str(Path(h).relative_to("csrc"))] = (tree / h).read_text()
    files[str(here / src.harness)] = (_HERE / src.harness).read_text()
    files["torch_utils.h"] = (_HERE / "torch_utils.h").read_text()
    flags = [*BASE_FLAGS, *v.gencode, *v.defines]
    # torch's headers are not in the key: the library uses their header-only types and links
    # nothing of libtorch, so a build against one torch serves another.
    d = build_dir(f"{source}-{variant}", files, flags, nvcc, out_root)
    lib = d / src.lib
    if lib.is_file():
        return lib
    srcdir = d / "src"
    tmp = d / (src.lib + ".part")
    cmd = [nvcc, *flags, "-I", str(srcdir), "-I", str(inc), str(srcdir / here / src.harness),
           "-o", str(tmp)]
    proc = subprocess.run(cmd, text=True, capture_output=True)
    (d / "build.log").write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise VllmCError(f"nvcc failed for {source} / {variant} (log: {d / 'build.log'}):\n"
                         f"{tail}")
    tmp.rename(lib)
    return lib


def ptxas_report(lib: Path) -> list[str]:
    """ptxas's per-kernel lines (registers, spills) from the build log."""
    log = (lib.parent / "build.log").read_text()
    return [ln.strip() for ln in log.splitlines()
            if "ptxas info" in ln and ("Used" in ln or "spill" in ln or "Compiling entry" in ln)]


_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class _CLib:
    """A built library; calls go on torch's current stream, tensors are CUDA tensors."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lib = ctypes.CDLL(str(path))

    @staticmethod
    def _check(rc: int, err: ctypes.Array, what: str) -> None:
        if rc != 0:
            raise VllmCError(f"{what}: {err.value.decode(errors='replace')}")

    @staticmethod
    def _stream() -> int:
        import torch

        return torch.cuda.current_stream().cuda_stream


class InsertLib(_CLib):
    """The SWA writer's two ops, with upstream's argument checks restated (enough to never
    launch on wrong shapes)."""

    def __init__(self, path: Path):
        super().__init__(path)
        f = self._lib.dsv4_qnorm_rope_kv_rope_quant_insert
        f.argtypes = [_P, _P, _P, _P, _P, _P, _P, _F, _I, _I, _I, _I, _I, _I, _I, _I, _I, _I, _P,
                      ctypes.c_char_p, _I]
        f.restype = _I
        g = self._lib.dsv4_kv_rope_insert_packed
        g.argtypes = [_P, _P, _P, _P, _P, _I, _I, _I, _I, _P, ctypes.c_char_p, _I]
        g.restype = _I
        self._lib.dsv4_reported_capability.restype = _I

    def reported_capability(self) -> int:
        return self._lib.dsv4_reported_capability()

    def qnorm_rope_kv_rope_quant_insert(self, q, kv, k_cache, slot_mapping, position_ids,
                                        cos_sin_cache, q_head_padded: int, eps: float,
                                        cache_block_size: int, apply_q_norm: bool = True,
                                        kv_mxfp8: bool = False, apply_q_rope: bool = True,
                                        is_q_interleaved: bool = False):
        """As ``torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert``: returns the
        padded Q ([N, q_head_padded, 512] bf16), writes the records into ``k_cache``
        ([num_blocks, block_bytes] uint8)."""
        import torch

        n = q.size(0)
        ok = (q.is_cuda and q.dtype == torch.bfloat16 and q.dim() == 3 and q.size(2) == 512
              and q.is_contiguous() and kv.dtype == torch.bfloat16 and kv.is_contiguous()
              and tuple(kv.shape) == (n, 512) and k_cache.dtype == torch.uint8
              and k_cache.dim() == 2 and k_cache.stride(1) == 1
              and slot_mapping.dtype == torch.int64 and slot_mapping.dim() == 1
              and slot_mapping.size(0) <= n and position_ids.dtype == torch.int64
              and tuple(position_ids.shape) == (n,) and cos_sin_cache.dtype == torch.float32
              and cos_sin_cache.dim() == 2 and cos_sin_cache.size(1) == 64
              and cos_sin_cache.is_contiguous() and q_head_padded in (0, 8, 16, 32, 64, 128)
              and (q_head_padded == 0 or q.size(1) <= q_head_padded))
        if not ok:
            raise ValueError("qnorm_rope_kv_rope_quant_insert: arguments outside what the "
                             "upstream op accepts")
        q_out = (q.new_empty((0,)) if q_head_padded == 0
                 else q.new_empty((n, q_head_padded, 512)))
        err = ctypes.create_string_buffer(512)
        rc = self._lib.dsv4_qnorm_rope_kv_rope_quant_insert(
            q.data_ptr(), q_out.data_ptr() if q_out.numel() else None, kv.data_ptr(),
            k_cache.data_ptr(), slot_mapping.data_ptr(), position_ids.data_ptr(),
            cos_sin_cache.data_ptr(), float(eps), n, slot_mapping.size(0), q.size(1),
            q_head_padded, cache_block_size, k_cache.stride(0), int(apply_q_norm), int(kv_mxfp8),
            int(apply_q_rope), int(is_q_interleaved), self._stream(), err, len(err))
        self._check(rc, err, "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert")
        return q_out

    def kv_rope_insert(self, kv, k_cache, slot_mapping, position_ids, cos_sin_cache,
                       cache_block_size: int, kv_mxfp8: bool = False) -> None:
        """As ``torch.ops._C.fused_deepseek_v4_kv_rope_insert`` on a packed cache
        ([num_blocks, block_size, 584] uint8)."""
        import torch

        row = 528 if kv_mxfp8 else 584
        ok = (kv.is_cuda and kv.dtype == torch.bfloat16 and kv.is_contiguous()
              and kv.dim() == 2 and kv.size(1) == 512 and k_cache.dtype == torch.uint8
              and k_cache.dim() == 3 and k_cache.size(1) == cache_block_size
              and k_cache.size(2) == row and k_cache.stride(2) == 1
              and slot_mapping.dtype == torch.int64 and slot_mapping.dim() == 1
              and slot_mapping.size(0) <= kv.size(0) and position_ids.dtype == torch.int64
              and tuple(position_ids.shape) == (kv.size(0),)
              and cos_sin_cache.dtype == torch.float32 and cos_sin_cache.size(1) == 64
              and cos_sin_cache.is_contiguous())
        if not ok:
            raise ValueError("kv_rope_insert: arguments outside what the upstream op accepts")
        err = ctypes.create_string_buffer(512)
        rc = self._lib.dsv4_kv_rope_insert_packed(
            kv.data_ptr(), k_cache.data_ptr(), slot_mapping.data_ptr(), position_ids.data_ptr(),
            cos_sin_cache.data_ptr(), slot_mapping.size(0), cache_block_size, k_cache.stride(0),
            int(kv_mxfp8), self._stream(), err, len(err))
        self._check(rc, err, "fused_deepseek_v4_kv_rope_insert")


class HashTopkLib(_CLib):
    """The hash layers' router, ``topk_hash_softplus_sqrt`` with fp32 logits and a table."""

    def __init__(self, path: Path):
        super().__init__(path)
        f = self._lib.dsv4_topk_hash_softplus_sqrt
        f.argtypes = [_P, _P, _P, _I, _P, _I, _I, _I, _I, ctypes.c_double, _P, _P, _P, _I, _P,
                      _P, ctypes.c_int64, _P, ctypes.c_char_p, _I]
        f.restype = _I

    def topk_hash_softplus_sqrt(self, gating, tid2eid, input_ids, topk: int = 6,
                                renormalize: bool = True, routed_scaling_factor: float = 1.0,
                                indices_dtype=None, is_padding=None, bias=None, bias_vl=None,
                                image_sentinel_lo: int = 0):
        """As ``vllm_topk_softplus_sqrt`` on a hash layer: returns (weights fp32 [T, topk],
        expert ids [T, topk])."""
        import torch

        t, e = gating.shape
        idt = indices_dtype or torch.int32
        ok = (gating.is_cuda and gating.dtype == torch.float32 and gating.is_contiguous()
              and tid2eid.dtype in (torch.int32, torch.int64) and tid2eid.is_contiguous()
              and tid2eid.dim() == 2 and tid2eid.size(1) == topk
              and input_ids.dtype == tid2eid.dtype and tuple(input_ids.shape) == (t,)
              and idt in (torch.int32, torch.int64)
              and (is_padding is None or (is_padding.dtype == torch.bool
                                          and tuple(is_padding.shape) == (t,)))
              and (bias_vl is None or (bias_vl.dtype == torch.float32
                                       and tuple(bias_vl.shape) == (e,))))
        if not ok:
            raise ValueError("topk_hash_softplus_sqrt: arguments outside what the upstream op "
                             "accepts")
        weights = torch.empty((t, topk), dtype=torch.float32, device=gating.device)
        ids = torch.empty((t, topk), dtype=idt, device=gating.device)
        tei = torch.empty((t, topk), dtype=torch.int32, device=gating.device)

        def ptr(x):
            return None if x is None else x.data_ptr()

        err = ctypes.create_string_buffer(512)
        rc = self._lib.dsv4_topk_hash_softplus_sqrt(
            gating.data_ptr(), weights.data_ptr(), ids.data_ptr(), int(idt == torch.int64),
            tei.data_ptr(), t, e, topk, int(renormalize), float(routed_scaling_factor),
            ptr(bias), input_ids.data_ptr(), tid2eid.data_ptr(),
            int(tid2eid.dtype == torch.int64), ptr(is_padding), ptr(bias_vl),
            int(image_sentinel_lo), self._stream(), err, len(err))
        self._check(rc, err, "topk_hash_softplus_sqrt")
        return weights, ids


class IndexerKGatherLib(_CLib):
    """``cp_gather_indexer_k_quant_cache``: the prefill indexer's K and scale rows gathered
    from the indexer cache (fp8 [block_size x head_dim] then fp32 scales [block_size] per
    block) in request order."""

    def __init__(self, path: Path):
        super().__init__(path)
        f = self._lib.cp_gather_indexer_k_quant_cache
        i64 = ctypes.c_int64
        f.argtypes = [_P, _P, _P, _P, _P, _I, i64, i64, i64, i64, i64, _I, _I, _I, _P,
                      ctypes.c_char_p, _I]
        f.restype = _I

    def cp_gather_indexer_k_quant_cache(self, kv_cache, dst_k, dst_scale, block_table,
                                        cu_seq_lens) -> None:
        """As the upstream op: ``kv_cache`` [num_blocks, block_size, cache_stride] (uint8),
        ``dst_k`` [num_tokens, head_dim], ``dst_scale`` [num_tokens, head_dim / quant_block
        * 4] (bytes), ``block_table`` [batch, max_blocks] int32, ``cu_seq_lens`` [batch + 1]
        int32."""
        import torch

        t, head_dim = dst_k.shape
        ok = (kv_cache.is_cuda and kv_cache.dim() == 3 and kv_cache.element_size() == 1
              and dst_k.element_size() == 1 and dst_k.stride(1) == 1
              and dst_scale.element_size() == 1 and dst_scale.dim() == 2
              and dst_scale.size(0) == t and head_dim % 16 == 0
              and block_table.dtype == torch.int32 and block_table.dim() == 2
              and cu_seq_lens.dtype == torch.int32
              and tuple(cu_seq_lens.shape) == (block_table.size(0) + 1,))
        if not ok:
            raise ValueError("cp_gather_indexer_k_quant_cache: arguments outside what the "
                             "upstream op accepts")
        quant_block = head_dim * 4 // dst_scale.size(1)
        err = ctypes.create_string_buffer(512)
        rc = self._lib.cp_gather_indexer_k_quant_cache(
            kv_cache.data_ptr(), dst_k.data_ptr(), dst_scale.data_ptr(), block_table.data_ptr(),
            cu_seq_lens.data_ptr(), block_table.size(0), dst_k.stride(0), head_dim,
            kv_cache.stride(0), kv_cache.stride(1), kv_cache.size(1), block_table.size(1), t,
            quant_block, self._stream(), err, len(err))
        self._check(rc, err, "cp_gather_indexer_k_quant_cache")


class SiluClampLib(_CLib):
    """``silu_and_mul_with_clamp(result, input, limit, alpha, beta)``: silu(min(gate, limit))
    * (clamp(up, +-limit) + beta) with the sigmoid's argument scaled by alpha, for 16-bit
    inputs [..., 2d] -> [..., d]."""

    def __init__(self, path: Path):
        super().__init__(path)
        f = self._lib.silu_and_mul_with_clamp
        f.argtypes = [_P, _P, _I, ctypes.c_int64, _I, _F, _F, _F, _P, ctypes.c_char_p, _I]
        f.restype = _I

    def silu_and_mul_with_clamp(self, result, input, limit: float, alpha: float = 1.0,
                                beta: float = 0.0) -> None:
        import torch

        d = input.size(-1) // 2
        ok = (input.is_cuda and input.dtype in (torch.float16, torch.bfloat16)
              and result.dtype == input.dtype and input.is_contiguous()
              and result.is_contiguous() and input.size(-1) == 2 * d
              and tuple(result.shape) == (*input.shape[:-1], d))
        if not ok:
            raise ValueError("silu_and_mul_with_clamp: arguments outside what this harness "
                             "restates (contiguous 16-bit [..., 2d] -> [..., d])")
        err = ctypes.create_string_buffer(512)
        rc = self._lib.silu_and_mul_with_clamp(
            result.data_ptr(), input.data_ptr(), int(input.dtype == torch.bfloat16),
            input.numel() // input.size(-1), d, float(limit), float(alpha), float(beta),
            self._stream(), err, len(err))
        self._check(rc, err, "silu_and_mul_with_clamp")


class MoeAlignLib(_CLib):
    """``moe_align_block_size`` without an expert map, for int32 top-k ids."""

    def __init__(self, path: Path):
        super().__init__(path)
        f = self._lib.moe_align_block_size_i32
        f.argtypes = [_P, ctypes.c_int64, _I, _I, _I, _P, ctypes.c_int64, _P, _P, _P, _P,
                      ctypes.c_char_p, _I]
        f.restype = _I

    def moe_align_block_size(self, topk_ids, num_experts: int, block_size: int,
                             sorted_token_ids, experts_ids, num_tokens_post_pad,
                             maybe_expert_map=None, scatter_idx=None) -> None:
        import torch

        ok = (topk_ids.is_cuda and topk_ids.dtype == torch.int32 and topk_ids.dim() == 2
              and topk_ids.is_contiguous() and maybe_expert_map is None and scatter_idx is None
              and sorted_token_ids.dtype == experts_ids.dtype == torch.int32
              and num_tokens_post_pad.dtype == torch.int32 and num_tokens_post_pad.numel() >= 1)
        if not ok:
            raise ValueError("moe_align_block_size: arguments outside what this harness "
                             "restates (int32 top-k ids, no expert map, no scatter index)")
        cumsum = torch.empty(num_experts + 1, dtype=torch.int32, device=topk_ids.device)
        err = ctypes.create_string_buffer(512)
        rc = self._lib.moe_align_block_size_i32(
            topk_ids.data_ptr(), topk_ids.numel(), topk_ids.size(1), num_experts, block_size,
            sorted_token_ids.data_ptr(), sorted_token_ids.size(0), experts_ids.data_ptr(),
            num_tokens_post_pad.data_ptr(), cumsum.data_ptr(), self._stream(), err, len(err))
        self._check(rc, err, "moe_align_block_size")


_LIB_CLASS = {"dsv4_insert": InsertLib, "dsv4_hash_topk": HashTopkLib,
              "indexer_k_gather": IndexerKGatherLib, "silu_clamp": SiluClampLib,
              "moe_align": MoeAlignLib}


def load(variant: str, source: str = "dsv4_insert"):
    """The source's library for the variant, wrapped in its class (``_LIB_CLASS``)."""
    return _LIB_CLASS[source](build(variant, source))


def load_for_tests(source: str) -> dict:
    """For a GPU test's fixture: {"sm80": lib} plus "sm90" where the device runs SM90 code;
    skips (pytest) without a GPU or without the upstream file."""
    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    if find_tree(source) is None:
        pytest.skip(f"no vLLM tree with {SOURCES[source].path}: run `make apply`, or set "
                    "DEEPINFER_VLLM_TREE (the GPU bundle carries the file in vllm-tree/)")
    out = {"sm80": load("sm80", source)}
    if torch.cuda.get_device_capability() >= (9, 0):
        out["sm90"] = load("sm90", source)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=sorted(SOURCES), action="append")
    ap.add_argument("--variant", choices=sorted(VARIANTS), action="append")
    ap.add_argument("--tree", type=Path)
    args = ap.parse_args(argv)
    for source in args.source or sorted(SOURCES):
        for var in args.variant or sorted(VARIANTS):
            lib = build(var, source, args.tree)
            print(f"{source} / {var}: {lib}")
            for ln in ptxas_report(lib):
                print("  " + ln)
    return 0


if __name__ == "__main__":
    sys.exit(main())
