"""vLLM's Marlin kernels, built from the applied tree as SM80 code and called through
ctypes, so that the GPU tests can run the quantised GEMMs of DeepSeek-V4 and V4.1 the way vLLM
runs them on an A100.

On capability 8.x vLLM's own selectors (no patch of ours) send V4's FP8-block linears to
``MarlinFP8ScaledMMLinearKernel``, V4.1's MXFP8 linears to ``MarlinMxfp8LinearKernel`` and the
routed experts (MXFP4; FP8 for V4-Flash-Base) to ``MarlinExperts`` (``docs/ampere-backend.md``,
"Quantised GEMMs"). All are weight-only: bf16 activations, the weights widened inside the
kernel.

Two libraries (``FAMILIES``), each built by ``build(family=...)``:

- "dense": ``torch.ops._C.marlin_gemm`` and ``gptq_marlin_repack``. ``marlin.cu`` cut before
  its torch-op wrapper (``marlin_mm`` and the tile-config choice are upstream's) and
  ``gptq_marlin_repack.cu``'s kernel half, behind ``tests/vllm_c/marlin_harness.cu``;
- "moe": ``torch.ops._moe_C.moe_wna16_marlin_gemm``. ``marlin_moe_wna16/ops.cu`` cut before its
  wrapper, behind ``tests/vllm_c/marlin_moe_harness.cu``.

For each, the tree's own ``generate_kernels.py`` is run for arch 8.0 and the family's
instantiations are kept (``Family.kernel_types``), one compilation unit each, compiled in
parallel; ``kernel_selector.h`` is reduced to them (every other weight type then gets
upstream's "Unsupported shapes" error instead of a missing symbol). The harnesses answer the
host code's device queries as an A100 or A6000 would (capability 8.0, ``LIMITS``: SM count and
opt-in shared memory). ``layout_defines`` reads off the tree whether it still has Marlin's
8-bit activations (vLLM 0.33.0) or not (0.34.0).

Code: compute_80, as SASS for sm_90 (the H200 the tests run on) plus the compute_80 PTX.
``MarlinLib`` / ``MarlinMoeLib`` (over ``_MarlinBase``) restate the wrappers' host glue (type
ids, output and reduction buffers, checks) for 16-bit activations; ``register_vllm_ops``
defines the ops with the schemas of the tree's binding files, so vLLM's Python
(``vllm._custom_ops``, ``marlin_utils_fp8``, ``fused_marlin_moe``) calls them unchanged.

Needs nvcc, torch's header-only headers and jinja2 (the generator); no libtorch link. Builds
are cached under ``$DEEPINFER_VLLM_C_DIR`` (default ``build/vllm-c``), keyed by the sources,
the flags and the nvcc version.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import vllm_c_ops
from vllm_c_ops import VllmCError

MARLIN = "csrc/quantization/marlin"
MOE = "csrc/moe/marlin_moe_wna16"
GEMM_CUT = re.compile(r"^torch::stable::Tensor marlin_gemm\(", re.M)
MOE_CUT = re.compile(r"^torch::stable::Tensor moe_wna16_marlin_gemm\(", re.M)
REPACK_CUT = re.compile(r"^#define CALL_IF\(", re.M)


@dataclass(frozen=True)
class Family:
    """One Marlin library: the dense GEMM (with the weight repack) or the MoE GEMM."""
    dir: str                   # where the tree's kernel.h / marlin_template.h and the
                               # generated units live
    main: str                  # the file with marlin_mm and the torch-op wrapper
    cut: re.Pattern            # the wrapper's first line
    cut_last: bool             # cut before the last match (marlin.cu has a stub first)
    #: (activation, weight, output) types whose instantiations are built
    kernel_types: tuple[tuple[str, str, str], ...]
    headers: tuple[str, ...]   # the tree's headers the build copies (paths under csrc/..)
    harness: str               # tests/vllm_c/<harness>
    lib: str


FAMILIES = {
    # bf16 x e4m3 -> bf16 holds the FP8 channel / group-128 kernels (bf16 scales) and
    # MXFP8's (e8m0 groups of 32): V4's FP8-block linears and V4.1's MXFP8 linears.
    "dense": Family(MARLIN, "marlin.cu", GEMM_CUT, True, (("kBFloat16", "kFE4M3fn", "kBFloat16"),),
                    tuple(f"{MARLIN}/{n}" for n in ("kernel.h", "marlin.cuh", "marlin_dtypes.cuh",
                                                    "marlin_template.h", "dequant.h",
                                                    "marlin_mma.h")),
                    "marlin_harness.cu", "libmarlin_sm80.so"),
    # bf16 x e2m1 -> bf16 holds MXFP4's kernels (e8m0 groups of 32; NVFP4's too): the routed
    # experts of V4-Flash, V4-Pro and V4.1-Flash; bf16 x e4m3 -> bf16 the FP8 experts of
    # V4-Flash-Base (group 128).
    "moe": Family(MOE, "ops.cu", MOE_CUT, False, (("kBFloat16", "kFE2M1f", "kBFloat16"),
                                                  ("kBFloat16", "kFE4M3fn", "kBFloat16")),
                  (f"{MOE}/kernel.h", f"{MOE}/marlin_template.h",
                   *(f"{MARLIN}/{n}" for n in ("marlin.cuh", "marlin_dtypes.cuh", "dequant.h",
                                                "marlin_mma.h"))),
                  "marlin_moe_harness.cu", "libmarlin_moe_sm80.so"),
}
#: The tree's files the builds read (the GPU bundle carries them: deepinfer.bundle.VLLM_CSRC).
FILES = tuple(dict.fromkeys([
    *(f"{f.dir}/{f.main}" for f in FAMILIES.values()),
    *(h for f in FAMILIES.values() for h in f.headers),
    f"{MARLIN}/gptq_marlin_repack.cu", f"{MARLIN}/generate_kernels.py",
    "csrc/core/scalar_type.hpp", "csrc/torch_bindings.cpp", "csrc/moe/torch_bindings.cpp"]))

#: What the host code is told: SM count and opt-in shared memory per block (A100: 108 SMs,
#: 163 KB; RTX A6000: 84 SMs, 99 KB).
LIMITS = {"a100": (108, 163 * 1024), "a6000": (84, 99 * 1024)}
A100_LIMITS = LIMITS["a100"]

_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-DENABLE_FP8", "-Xcompiler",
          "-fPIC", "-static-global-template-stub=false", "-DDEEPINFER_REPORTED_CC=80"]
_GENCODE = ["-gencode=arch=compute_80,code=sm_90", "-gencode=arch=compute_80,code=compute_80"]
_SELECTOR_ENTRY = re.compile(
    r"(?:else )?if \((?P<cond>[^\n]*)\)\n  kernel = (?P<kernel>Marlin<[^;\n]*>);\n")
_INSTANTIATION = re.compile(
    r"^template __global__ void (Marlin<[^>]*>)\( MARLIN_KERNEL_PARAMS \);$", re.M)


def layout_defines(tree: Path, family: str = "dense") -> list[str]:
    """What the harnesses need to know of the tree's Marlin layout, as -D flags. vLLM 0.33.0
    has 8-bit activations in Marlin (``marlin_mm``'s ``a_s`` argument, the ops' ``a_scales``,
    the repack's ``is_a_8bit``); vLLM 0.34.0 removed them."""
    fam = FAMILIES[family]
    main = (tree / fam.dir / fam.main).read_text()
    a_scales = re.search(r"void\* a_s,", main) is not None
    repack = (tree / MARLIN / "gptq_marlin_repack.cu").read_text()
    a8 = re.search(r"int const num_bits,\s*bool is_a_8bit>", repack) is not None
    return [f"-DDEEPINFER_MARLIN_A_SCALES={int(a_scales)}",
            f"-DDEEPINFER_MARLIN_REPACK_A8={int(a8)}"]


def find_tree() -> Path | None:
    """A vLLM tree with the Marlin sources ($DEEPINFER_VLLM_TREE, build/vllm-<version>, the
    GPU bundle's vllm-tree/)."""
    version = os.environ.get("DEEPINFER_TEST_VLLM", "0.33.0")
    root = Path(__file__).resolve().parents[1]
    for c in (os.environ.get("DEEPINFER_VLLM_TREE"), root / "build" / f"vllm-{version}",
              root / "vllm-tree"):
        if c and all((Path(c) / f).is_file() for f in FILES):
            return Path(c).resolve()
    return None


def _cut(text: str, pattern: re.Pattern, path: str, last: bool) -> str:
    found = list(pattern.finditer(text))
    if not found:
        raise VllmCError(f"{path}: no line matching {pattern.pattern!r}; upstream moved the "
                         "wrapper the harness stands in for. Update tests/vllm_c_marlin.py and "
                         "check tests/vllm_c/marlin_harness.cu against the new wrapper.")
    m = found[-1] if last else found[0]
    return vllm_c_ops._STABLE_INCLUDE.sub("", text[:m.start()])


def gemm_half(tree: Path) -> str:
    """marlin.cu before its wrapper, with the ``#endif`` of each conditional the cut left open
    (the ``__CUDA_ARCH__ < 750`` stub's ``#if ... #else``): conditionals cannot span files."""
    half = _cut((tree / MARLIN / "marlin.cu").read_text(), GEMM_CUT, f"{MARLIN}/marlin.cu", True)
    depth = 0
    for line in half.splitlines():
        d = line.strip()
        if re.match(r"#\s*if(n?def)?\b", d):
            depth += 1
        elif re.match(r"#\s*endif\b", d):
            depth -= 1
    return half + "\n#endif  // closed by tests/vllm_c_marlin.py (cut before the wrapper)\n" * depth


def repack_half(tree: Path) -> str:
    return _cut((tree / MARLIN / "gptq_marlin_repack.cu").read_text(), REPACK_CUT,
                f"{MARLIN}/gptq_marlin_repack.cu", False)


def generate(tree: Path, family: str = "dense") -> tuple[dict[str, str], str]:
    """Run the tree's generator for arch 8.0 (as vLLM's CMake does for each family's
    directory); returns ({unit name: source}, selector) for the family's kernel types: one
    unit per instantiation, and kernel_selector.h keeping exactly the instantiations built.
    One run per tree, generator text and family in a process."""
    script = (Path(tree) / MARLIN / "generate_kernels.py").read_text()
    units, selector = _generate(Path(tree).resolve(), family, script)
    return dict(units), selector


@functools.lru_cache(maxsize=None)
def _generate(tree: Path, family: str, script: str) -> tuple[tuple[tuple[str, str], ...], str]:
    fam = FAMILIES[family]
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(tree / MARLIN / "generate_kernels.py", tmp)
        proc = subprocess.run([sys.executable, str(Path(tmp) / "generate_kernels.py"), "8.0", tmp],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise VllmCError(f"{MARLIN}/generate_kernels.py failed:\n{proc.stderr[-2000:]}")
        outputs = {p.name: p.read_text() for p in Path(tmp).iterdir()
                   if p.name.endswith(".cu") or p.name == "kernel_selector.h"}
    if "kernel_selector.h" not in outputs:
        raise VllmCError(f"{MARLIN}/generate_kernels.py wrote no kernel_selector.h")
    units: dict[str, str] = {}
    for a, b, c in fam.kernel_types:
        name = f"sm80_kernel_{a[1:]}_{b[1:]}_{c[1:]}.cu".lower()
        if name not in outputs:
            raise VllmCError(f"the generator wrote no {name} for arch 8.0 (files: "
                             f"{sorted(outputs)}); update FAMILIES in tests/vllm_c_marlin.py")
        text = outputs[name]
        found = list(_INSTANTIATION.finditer(text))
        if not found:
            raise VllmCError(f"{name}: no explicit instantiation of Marlin<...> in the form "
                             "the build splits")
        head = text[:found[0].start()]
        for i, m in enumerate(found):
            units[f"{name[:-3]}_{i:03d}.cu"] = f"{head}{m.group(0)}\n\n}}\n"
    selector = _reduce_selector(outputs["kernel_selector.h"], fam.kernel_types)
    built = {m.group(1).replace(" ", "") for u in units.values()
             for m in _INSTANTIATION.finditer(u)}
    selected = {m.group("kernel").replace(" ", "") for m in _SELECTOR_ENTRY.finditer(selector)}
    if built != selected:
        raise VllmCError("kernel_selector.h and the generated instantiations disagree "
                         f"({len(selected)} selected, {len(built)} built)")
    return tuple(units.items()), selector


def _reduce_selector(text: str, kernel_types) -> str:
    keep = []
    for m in _SELECTOR_ENTRY.finditer(text):
        cond = m.group("cond")
        if any(f"a_type == vllm::{a}" in cond and f"b_type == vllm::{b}" in cond
               and f"c_type == vllm::{c}" in cond for a, b, c in kernel_types):
            keep.append((cond, m.group("kernel")))
    if not keep:
        raise VllmCError("kernel_selector.h: no entry for the kernel types in the form "
                         "`if (...)\\n  kernel = Marlin<...>;`")
    lines = ["// kernel_selector.h of the tree's generator, reduced by tests/vllm_c_marlin.py"]
    for i, (cond, kernel) in enumerate(keep):
        lines.append(f"{'if' if i == 0 else 'else if'} ({cond})\n  kernel = {kernel};")
    return "\n".join(lines) + "\n"


def moe_half(tree: Path) -> str:
    return _cut((tree / MOE / "ops.cu").read_text(), MOE_CUT, f"{MOE}/ops.cu", False)


def sources(tree: Path, family: str = "dense") -> dict[str, str]:
    """Every file of the family's build, by path under the build's source root (laid out
    as csrc/)."""
    fam = FAMILIES[family]
    units, selector = generate(tree, family)
    here = fam.dir[len("csrc/"):]
    files = {h[len("csrc/"):]: (tree / h).read_text() for h in fam.headers}
    files["core/scalar_type.hpp"] = (tree / "csrc/core/scalar_type.hpp").read_text()
    files["torch_utils.h"] = (vllm_c_ops._HERE / "torch_utils.h").read_text()
    files[f"{here}/kernel_selector.h"] = selector
    if family == "dense":
        files[f"{here}/marlin_gemm.inc"] = gemm_half(tree)
        files[f"{here}/marlin_repack.inc"] = repack_half(tree)
    else:
        files[f"{here}/marlin_moe.inc"] = moe_half(tree)
    for own in (fam.harness, "marlin_ampere_limits.h"):
        files[f"{here}/{own}"] = (vllm_c_ops._HERE / own).read_text()
    for name, text in units.items():
        files[f"{here}/{name}"] = text
    return files


def build(tree: Path | None = None, out_root: Path | None = None, jobs: int | None = None,
          family: str = "dense") -> Path:
    """Build (or reuse) the family's library; returns its path."""
    tree = tree or find_tree()
    if tree is None:
        raise VllmCError(f"no vLLM tree with the Marlin sources ({FILES[0]}; make apply, or "
                         "set DEEPINFER_VLLM_TREE)")
    nvcc, inc = vllm_c_ops._nvcc(), vllm_c_ops._torch_include()
    fam = FAMILIES[family]
    files = sources(tree, family)
    flags = [*_FLAGS, *layout_defines(tree, family), *_GENCODE]
    d = vllm_c_ops.build_dir(f"marlin-{family}-sm80", files, flags, nvcc, out_root)
    lib = d / fam.lib
    if lib.is_file():
        return lib
    src = d / "src"
    compile_units = sorted(n for n in files if n.endswith(".cu"))
    objs = d / "obj"
    objs.mkdir(parents=True, exist_ok=True)

    def compile_one(name: str) -> tuple[str, subprocess.CompletedProcess]:
        cmd = [nvcc, *flags, "-Xptxas", "-v", "-c", "-I", str(src), "-I", str(inc),
               str(src / name), "-o", str(objs / (Path(name).stem + ".o"))]
        return " ".join(cmd), subprocess.run(cmd, text=True, capture_output=True)

    log = []
    workers = jobs or max(1, min(32, os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(compile_one, compile_units))
    failed = [(cmd, p) for cmd, p in results if p.returncode != 0]
    for cmd, p in results:
        log.append(cmd + "\n" + p.stdout + p.stderr)
    (d / "build.log").write_text("\n\n".join(log))
    if failed:
        tail = "\n".join((failed[0][1].stdout + failed[0][1].stderr).strip().splitlines()[-20:])
        raise VllmCError(f"nvcc failed for {len(failed)} Marlin unit(s) (log: {d / 'build.log'}):"
                         f"\n{failed[0][0]}\n{tail}")
    tmp = d / (fam.lib + ".part")
    cmd = [nvcc, "-shared", *sorted(str(p) for p in objs.glob("*.o")), "-o", str(tmp)]
    proc = subprocess.run(cmd, text=True, capture_output=True)
    if proc.returncode != 0:
        raise VllmCError(f"linking the Marlin library failed:\n{proc.stderr[-2000:]}")
    tmp.rename(lib)
    return lib


def compile_check(tree: Path, out_dir: Path, units: int = 1,
                  gencode: tuple[str, ...] = ("-gencode=arch=compute_80,code=sm_80",
                                              "-gencode=arch=compute_86,code=sm_86"),
                  family: str = "dense") -> list[str]:
    """Compile the harness and the first ``units`` instantiations for real Ampere targets
    (no link, no GPU); returns ptxas's lines (raises on a compile error). For the CPU suite."""
    nvcc, inc = vllm_c_ops._nvcc(), vllm_c_ops._torch_include()
    fam = FAMILIES[family]
    files = sources(tree, family)
    for name, text in files.items():
        p = out_dir / "src" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    names = [f"{fam.dir[len('csrc/'):]}/{fam.harness}",
             *sorted(n for n in files if "/sm80_kernel_" in n)[:units]]
    lines = []
    for name in names:
        cmd = [nvcc, *_FLAGS, *layout_defines(tree, family), *gencode, "-Xptxas", "-v", "-c",
               "-I", str(out_dir / "src"), "-I",
               str(inc), str(out_dir / "src" / name), "-o", str(out_dir / (Path(name).stem + ".o"))]
        proc = subprocess.run(cmd, text=True, capture_output=True)
        if proc.returncode != 0:
            raise VllmCError(f"nvcc failed for {name}:\n{(proc.stdout + proc.stderr)[-3000:]}")
        lines += [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines()
                  if "ptxas info" in ln or "spill" in ln]
    return lines


def ptxas_report(lib: Path) -> list[str]:
    """ptxas's register / spill lines of the Marlin kernels."""
    log = (lib.parent / "build.log").read_text()
    return [ln.strip() for ln in log.splitlines()
            if "ptxas info" in ln and ("Used" in ln or "Function properties" in ln)]


_P, _I, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64


class _MarlinBase:
    """What both libraries share (tests/vllm_c/marlin_ampere_limits.h): the limits the host
    code is told, the C++ ScalarType ids, the wrappers' type decisions. ``limits``: (SM count,
    opt-in shared memory bytes); the A100's by default. Subclasses declare their entry points
    in ``_declare``."""

    TILE, MIN_THREAD_N, MAX_THREAD_N = 16, 64, 256

    def __init__(self, path: Path, limits: tuple[int, int] = A100_LIMITS):
        self.path = Path(path)
        self._lib = ctypes.CDLL(str(path))
        self._lib.deepinfer_marlin_set_limits.argtypes = [_I, _I]
        self._lib.deepinfer_marlin_type_ids.argtypes = [_P]
        self._declare()
        ids = (ctypes.c_int64 * 6)()
        self._lib.deepinfer_marlin_type_ids(ids)
        self.ids = dict(zip(("f16", "bf16", "fe4m3fn", "fe8m0fnu", "fe2m1f", "s8"), ids))
        self.set_limits(limits)

    def set_limits(self, limits: tuple[int, int]) -> None:
        """What the host code is told from now on: (SM count, opt-in shared memory bytes)."""
        self.limits = tuple(limits)
        self._lib.deepinfer_marlin_set_limits(*self.limits)

    def _declare(self) -> None:
        raise NotImplementedError

    def _sms(self, device) -> int:
        import torch

        n = torch.cuda.get_device_properties(device).multi_processor_count
        return min(n, self.limits[0]) if self.limits[0] > 0 else n

    def _types(self, a, b_type_id: int, b_scales) -> tuple[int, int, int, bool]:
        """The wrappers' type decisions for a 16-bit activation: (activation / output type id,
        scale type id, weights per int32, NVFP4?)."""
        import torch

        ids = self.ids
        if a.dtype not in (torch.float16, torch.bfloat16):
            raise NotImplementedError("8-bit activations: Marlin W8A8 needs SM89+ (vLLM refuses "
                                      "it below)")
        act = ids["f16"] if a.dtype == torch.float16 else ids["bf16"]
        s_type = act
        if b_type_id == ids["fe2m1f"]:
            s_type = {torch.float8_e4m3fn: ids["fe4m3fn"],
                      torch.float8_e8m0fnu: ids["fe8m0fnu"]}.get(b_scales.dtype)
            if s_type is None:
                raise RuntimeError("When b_type = float4_e2m1f, b_scale scalar type must be "
                                   "float8_e4m3fn or float8_e8m0fnu")
        elif b_type_id == ids["fe4m3fn"] and b_scales.dtype == torch.float8_e8m0fnu:
            s_type = ids["fe8m0fnu"]
        bits = 4 if b_type_id == ids["fe2m1f"] else 8 if b_type_id == ids["fe4m3fn"] else 0
        if not bits:
            raise NotImplementedError("only the FP8 / FP4 weight types are built here")
        return act, s_type, 32 // bits, b_type_id == ids["fe2m1f"] and s_type == ids["fe4m3fn"]

    @staticmethod
    def _group_size(size_k: int, num_groups: int, what: str) -> int:
        """The wrappers' scale group along K: -1 for one group (channelwise), else K / groups."""
        if num_groups <= 1:
            return -1
        if size_k % num_groups:
            raise RuntimeError(f"size_k is not divisible by {what}")
        return size_k // num_groups

    @staticmethod
    def _check(rc: int, err, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what}: {err.value.decode(errors='replace')}")


class MarlinLib(_MarlinBase):
    """The dense library with the wrappers' host glue of ``marlin_gemm`` and
    ``gptq_marlin_repack`` restated (16-bit activations only: SM8x has no FP8 MMA, and vLLM
    refuses Marlin W8A8 there)."""

    def _declare(self) -> None:
        mm = self._lib.deepinfer_marlin_mm
        mm.argtypes = [_P] * 9 + [_I, _I, _I, _I, _P, _I64, _I64, _I64, _I64, _I, _I, _I, _I,
                                  _I, _P, _I, _I, _I, _I, ctypes.c_char_p, _I]
        mm.restype = _I
        rp = self._lib.deepinfer_gptq_marlin_repack
        rp.argtypes = [_P, _P, _I, _I, _I, _I, _I, _P, ctypes.c_char_p, _I]
        rp.restype = _I

    def gptq_marlin_repack(self, b_q_weight, size_k: int, size_n: int, num_bits: int,
                           is_a_8bit: bool = False):
        import torch

        pack = 32 // num_bits if num_bits in (4, 8) else 0
        tile_n = 64 // (2 if is_a_8bit else 1)
        if not (pack and size_k % 16 == 0 and size_n % 64 == 0 and b_q_weight.is_cuda
                and b_q_weight.dtype == torch.int32 and b_q_weight.is_contiguous()
                and tuple(b_q_weight.shape) == (size_k // pack, size_n) and tile_n):
            raise ValueError("gptq_marlin_repack: arguments outside what the upstream op accepts")
        out = b_q_weight.new_empty((size_k // self.TILE, size_n * self.TILE // pack))
        err = ctypes.create_string_buffer(512)
        with torch.cuda.device(b_q_weight.device):
            rc = self._lib.deepinfer_gptq_marlin_repack(
                b_q_weight.data_ptr(), out.data_ptr(), size_k, size_n, num_bits, int(is_a_8bit),
                b_q_weight.device.index, torch.cuda.current_stream().cuda_stream, err, len(err))
        self._check(rc, err, "gptq_marlin_repack")
        return out

    def marlin_gemm(self, a, c_or_none, b_q_weight, b_bias_or_none, b_scales, a_scales_or_none,
                    global_scale_or_none, b_zeros_or_none, workspace, b_type_id: int,
                    size_m: int, size_n: int, size_k: int, use_atomic_add: bool = False,
                    use_fp32_reduce: bool = False, is_zp_float: bool = False):
        import torch

        act, s_type, pack, nvfp4 = self._types(a, b_type_id, b_scales)
        if not (a.dim() == 2 and tuple(a.shape) == (size_m, size_k) and size_k % self.TILE == 0
                and b_q_weight.size(0) == size_k // self.TILE
                and b_q_weight.size(1) % self.TILE == 0
                and b_q_weight.size(1) // self.TILE * pack == size_n
                and a.is_cuda and a.stride(1) == 1 and a.stride(0) % 8 == 0
                and a.data_ptr() % 16 == 0 and b_q_weight.is_cuda and b_q_weight.is_contiguous()
                and b_scales.is_cuda and b_scales.is_contiguous() and b_scales.dim() == 2
                and b_scales.size(1) == size_n and size_n % self.MIN_THREAD_N == 0
                and a_scales_or_none is None and b_zeros_or_none is None
                and (global_scale_or_none is not None) == nvfp4):
            raise RuntimeError("marlin_gemm: arguments outside what the upstream op accepts")
        dev = a.device
        sms = self._sms(dev)
        if workspace.numel() < sms:
            raise RuntimeError(f"workspace.numel = {workspace.numel()} is below {sms}")
        if c_or_none is not None:
            c = c_or_none
            if not (c.is_contiguous() and tuple(c.shape) == (size_m, size_n)
                    and c.dtype == a.dtype):
                raise RuntimeError("marlin_gemm: c")
        else:
            c = torch.empty((size_m, size_n), dtype=a.dtype, device=dev)
        if size_m == 0:
            return c
        if use_fp32_reduce:
            mb = min((size_m + 15) // 16 * 16, 64)
            c_tmp = torch.empty(sms * mb * self.MAX_THREAD_N, dtype=torch.float32, device=dev)
        else:
            c_tmp = torch.empty(0, dtype=torch.float32, device=dev)
        num_groups = b_scales.size(0)
        group_size = self._group_size(size_k, num_groups, "b_scales.size(0)")
        empty = torch.empty(0, dtype=torch.float32, device=dev)
        bias = b_bias_or_none
        if bias is not None and not (bias.is_contiguous() and bias.size(0) == size_n):
            raise RuntimeError("marlin_gemm: b_bias")
        gs = global_scale_or_none if global_scale_or_none is not None else empty
        err = ctypes.create_string_buffer(1024)
        with torch.cuda.device(dev):
            rc = self._lib.deepinfer_marlin_mm(
                a.data_ptr(), b_q_weight.data_ptr(), c.data_ptr(), c_tmp.data_ptr(),
                bias.data_ptr() if bias is not None else None, empty.data_ptr(),
                b_scales.data_ptr(), gs.data_ptr(), None, size_m, size_n, size_k, a.stride(0),
                workspace.data_ptr(), act, b_type_id, act, s_type, int(bias is not None), 0,
                num_groups, group_size, dev.index, torch.cuda.current_stream().cuda_stream, sms,
                int(use_atomic_add), int(use_fp32_reduce), int(is_zp_float), err, len(err))
        self._check(rc, err, "marlin_gemm")
        return c


class MarlinMoeLib(_MarlinBase):
    """The MoE library with ``moe_wna16_marlin_gemm``'s host glue restated (16-bit
    activations)."""

    def _declare(self) -> None:
        mm = self._lib.deepinfer_moe_marlin_mm
        mm.argtypes = ([_P] * 13 + [_I, _I, _I, _I, _I, _I, _I, _P, _I64, _I64, _I64, _I64, _I,
                                    _I, _I, _I, _P, _I, _I, _I, _I, _I, _I, _I,
                                    ctypes.c_char_p, _I])
        mm.restype = _I

    def moe_wna16_marlin_gemm(self, a, c_or_none, b_q_weight, b_bias_or_none, b_scales,
                              a_scales_or_none, global_scale_or_none, b_zeros_or_none,
                              workspace, sorted_token_ids, expert_ids, num_tokens_past_padded,
                              topk_weights, moe_block_size: int, top_k: int,
                              mul_topk_weights: bool, b_type_id: int, size_m: int, size_n: int,
                              size_k: int, use_atomic_add: bool, use_fp32_reduce: bool,
                              is_zp_float: bool, thread_k: int = -1, thread_n: int = -1,
                              blocks_per_sm: int = -1):
        import torch

        act, s_type, pack, nvfp4 = self._types(a, b_type_id, b_scales)
        num_experts = b_q_weight.size(0)
        block_ok = moe_block_size == 8 or (moe_block_size % 16 == 0
                                           and 16 <= moe_block_size <= 64)
        if not (block_ok and a.dim() == 2 and tuple(a.shape) == (size_m, size_k)
                and size_k % self.TILE == 0 and b_q_weight.dim() == 3
                and b_q_weight.size(1) == size_k // self.TILE
                and b_q_weight.size(2) % self.TILE == 0
                and b_q_weight.size(2) // self.TILE * pack == size_n
                and a.is_cuda and a.is_contiguous() and b_q_weight.is_contiguous()
                and b_scales.is_contiguous() and b_scales.dim() == 3
                and b_scales.size(2) == size_n and size_n % self.MIN_THREAD_N == 0
                and a_scales_or_none is None and b_zeros_or_none is None
                and (global_scale_or_none is not None) == nvfp4):
            raise RuntimeError("moe_wna16_marlin_gemm: arguments outside what the upstream op "
                               "accepts")
        dev = a.device
        sms = self._sms(dev)
        if c_or_none is not None:
            c = c_or_none
            if not (c.is_contiguous() and tuple(c.shape) == (size_m * top_k, size_n)):
                raise RuntimeError("moe_wna16_marlin_gemm: c")
        else:
            c = torch.empty((size_m * top_k, size_n), dtype=a.dtype, device=dev)
        if use_fp32_reduce and not use_atomic_add:
            n_tmp = min(size_n * sorted_token_ids.size(0),
                        sms * 4 * moe_block_size * self.MAX_THREAD_N)
            if moe_block_size == 8:
                n_tmp *= 2
            c_tmp = torch.empty(n_tmp, dtype=torch.float32, device=dev)
        else:
            c_tmp = torch.empty(0, dtype=torch.float32, device=dev)
        group_size = self._group_size(size_k, b_scales.size(1), "b_scales.size(1)")
        bias = b_bias_or_none
        if bias is not None and not (bias.is_contiguous() and bias.size(1) == size_n):
            raise RuntimeError("moe_wna16_marlin_gemm: b_bias")
        need = min(size_n // self.MIN_THREAD_N * (sorted_token_ids.size(0) // moe_block_size),
                   sms * 4)
        if workspace.numel() < need:
            raise RuntimeError(f"workspace.numel = {workspace.numel()} is below {need}")
        empty = torch.empty(0, dtype=torch.float32, device=dev)
        gs = global_scale_or_none if global_scale_or_none is not None else empty
        err = ctypes.create_string_buffer(1024)
        with torch.cuda.device(dev):
            rc = self._lib.deepinfer_moe_marlin_mm(
                a.data_ptr(), b_q_weight.data_ptr(), c.data_ptr(), c_tmp.data_ptr(),
                bias.data_ptr() if bias is not None else None, empty.data_ptr(),
                b_scales.data_ptr(), gs.data_ptr(), None, sorted_token_ids.data_ptr(),
                expert_ids.data_ptr(), num_tokens_past_padded.data_ptr(),
                topk_weights.data_ptr(), moe_block_size, num_experts, top_k,
                int(mul_topk_weights), size_m, size_n, size_k, workspace.data_ptr(), act,
                b_type_id, act, s_type, int(bias is not None), 0, group_size, dev.index,
                torch.cuda.current_stream().cuda_stream, thread_k, thread_n, sms, blocks_per_sm,
                int(use_atomic_add), int(use_fp32_reduce), int(is_zp_float), err, len(err))
        self._check(rc, err, "moe_wna16_marlin_gemm")
        return c


def op_schemas(tree: Path, names=("marlin_gemm", "gptq_marlin_repack"),
               bindings: str = "csrc/torch_bindings.cpp") -> dict[str, str]:
    """The ``ops.def`` / ``m.def`` schemas of ``names`` in one of the tree's bindings files."""
    text = (tree / bindings).read_text()
    out = {}
    for m in re.finditer(r'\b(?:ops|m)\.def\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\)', text):
        schema = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
        name = schema.split("(", 1)[0].strip()
        if name in names:
            out[name] = re.sub(r"\s+", " ", schema)
    missing = [n for n in names if n not in out]
    if missing:
        raise VllmCError(f"{bindings}: no ops.def / m.def for {missing}")
    return out


_LIBRARIES = []  # torch.library.Library objects must outlive the registration


def register_vllm_ops(lib: MarlinLib, tree: Path) -> None:
    """Define the library's ops with the tree's schemas and ``lib`` as their CUDA
    implementation: ``_C::marlin_gemm`` and ``_C::gptq_marlin_repack`` for the dense library,
    ``_moe_C::moe_wna16_marlin_gemm`` for the MoE one."""
    if isinstance(lib, MarlinMoeLib):
        schema = op_schemas(tree, ("moe_wna16_marlin_gemm",), "csrc/moe/torch_bindings.cpp")

        def moe_gemm_without_a_scales(a, c, b, bias, scales, *rest):  # vLLM 0.34.0 on
            return lib.moe_wna16_marlin_gemm(a, c, b, bias, scales, None, *rest)

        define(tree, "_moe_C", "csrc/moe/torch_bindings.cpp", {"moe_wna16_marlin_gemm": (
            lib.moe_wna16_marlin_gemm if "a_scales" in schema["moe_wna16_marlin_gemm"]
            else moe_gemm_without_a_scales)})
    else:
        schemas = op_schemas(tree)

        def gemm_without_a_scales(a, c, b, bias, scales, *rest):  # vLLM 0.34.0 on
            return lib.marlin_gemm(a, c, b, bias, scales, None, *rest)

        def repack_16bit(b_q_weight, size_k, size_n, num_bits):  # vLLM 0.34.0 on
            return lib.gptq_marlin_repack(b_q_weight, size_k, size_n, num_bits, False)

        define(tree, "_C", "csrc/torch_bindings.cpp", {
            "marlin_gemm": (lib.marlin_gemm if "a_scales" in schemas["marlin_gemm"]
                            else gemm_without_a_scales),
            "gptq_marlin_repack": (lib.gptq_marlin_repack
                                   if "is_a_8bit" in schemas["gptq_marlin_repack"]
                                   else repack_16bit)})


def define(tree: Path, namespace: str, bindings: str, impls: dict) -> None:
    """Define ``namespace::name`` for each of ``impls`` with the schema of the tree's
    ``bindings`` file and the callable as its CUDA implementation."""
    import torch

    schemas = op_schemas(tree, tuple(impls), bindings)
    library = torch.library.Library(namespace, "FRAGMENT")
    for name, fn in impls.items():
        library.define(schemas[name])
        library.impl(name, fn, "CUDA")
    _LIBRARIES.append(library)
