"""Can this machine run DeepInfer-SM80's kernels? A check for operators, before serving.

    python -m deepinfer_sm80.doctor [--device N] [--json] [--no-smoke] [--force-sm80]

It reports, each with what to do where something is wrong:

* torch and CUDA: a CUDA build of torch that sees a GPU;
* the GPU: compute capability (8.x takes this project's SM80 path; 9.0 and newer keep
  upstream's kernels; below 8.0 is refused), SM count and shared memory per block (the
  kernels' tile configurations need 99 KB, and use 163 KB where the part has it);
* the extension ``deepinfer_sm80/_C.so``: found, built with code for this GPU (machine code,
  or PTX the driver compiles at load: slow the first time), loadable by this torch, and its
  ops registered;
* a smoke run (with ``--no-smoke`` left out): the KV-cache writer and gather on a few random
  rows, bit-exact against the torch reference, and the attention plan for a 64-head decode;
* vLLM: whether the running vLLM carries this overlay and is the release its patch set was
  written for (``vllm.deepinfer_sm80_overlay``).

Exit status 0 when nothing is an error, 1 otherwise. Imports nothing but torch and this
package (and vLLM's overlay identity module, if vLLM is importable).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

LEVELS = ("ok", "info", "warn", "error")
# csrc/api: the ops the vLLM adapters and deepinfer_sm80.ops call
REQUIRED_OPS = (
    "quantize_and_insert_k_cache", "dequantize_and_gather_k_cache",
    "compute_global_topk_indices_and_lens", "combine_topk_swa_indices", "sparse_mla_decode",
    "sparse_mla_prefill", "sparse_mla_plan", "indexer_paged_keys", "indexer_flat_keys",
    "row_topk_keys", "row_topk_indices", "candidate_block_keys", "candidate_mask",
    "hc_prenorm_gemm", "device_info")
# dynamic shared memory per block the kernels' largest tile configurations use (sm_80), and
# the smallest they have (sm_86): docs/attention.md
SMEM_SM80 = 163 * 1024
SMEM_SM86 = 99 * 1024


@dataclass
class Finding:
    level: str  # one of LEVELS
    topic: str
    message: str
    fix: str = ""


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: str, topic: str, message: str, fix: str = "") -> Finding:
        assert level in LEVELS, level
        f = Finding(level, topic, message, fix)
        self.findings.append(f)
        return f

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    def text(self) -> str:
        lines = []
        for f in self.findings:
            lines.append(f"[{f.level:5}] {f.topic}: {f.message}")
            if f.fix:
                lines.append(f"        fix: {f.fix}")
        lines.append("result: " + ("ok" if self.ok else "errors above"))
        return "\n".join(lines)


def check_capability(report: Report, major: int, minor: int) -> bool:
    """The SM80 path's verdict on a compute capability; True where it runs this package."""
    cap = f"{major}.{minor}"
    if major == 8:
        report.add("ok", "path", f"capability {cap}: the patched vLLM takes this project's SM80 "
                   "kernels for DeepSeek-V4 and V4.1")
        return True
    if major >= 9:
        report.add("info", "path", f"capability {cap}: the patched vLLM keeps upstream's kernels "
                   "(FlashMLA, DeepGEMM) here; this package is not used")
        return False
    report.add("error", "path", f"capability {cap} is below 8.0: no bf16 mma.sync, refused at "
               "start-up", "run on an Ampere (8.x) or newer GPU")
    return False


def check_limits(report: Report, sm_count: int, smem_optin: int) -> None:
    """SM count and the opt-in shared memory per block the kernels' tiles need."""
    kb = smem_optin // 1024
    msg = f"{sm_count} SMs, {kb} KB shared memory per block"
    if smem_optin >= SMEM_SM80:
        report.add("ok", "limits", msg + " (the largest tile configurations fit)")
    elif smem_optin >= SMEM_SM86:
        report.add("ok", "limits", msg + " (the 99 KB tile configurations, as on SM86)")
    else:
        report.add("error", "limits", msg + f": below the {SMEM_SM86 // 1024} KB the smallest "
                   "tile configurations need", "run on an A100/A800 (8.0) or an 8.6 part")


def check_library_code(report: Report, code, capability: int, lib: Path) -> bool:
    """Does ``lib`` (``fatbin.LibraryCode`` ``code``) carry code for ``capability`` (x 10)?"""
    sass = ", ".join(f"sm_{a}" for a in code.sass) or "none"
    ptx = ", ".join(f"compute_{a}" for a in code.ptx) or "none"
    has = f"machine code {sass}; PTX {ptx}"
    major, minor = divmod(capability, 10)
    fix = f'rebuild for this GPU: make build ARCHS="{major}.{minor}"'
    how = code.runs_on(capability)
    if how == "sass":
        native = capability in code.sass
        report.add("ok", "extension code", f"{lib.name}: {has}" + (
            "" if native else f" (runs here: same major version as {major}.x)"))
        return True
    if how == "ptx":
        report.add("warn", "extension code", f"{lib.name}: {has}; no machine code for "
                   f"sm_{capability}: the driver compiles the PTX when the library loads "
                   "(slow, the first time on this machine)", fix)
        return True
    report.add("error", "extension code", f"{lib.name}: {has}; nothing runs on "
               f"sm_{capability}", fix)
    return False


def _library() -> Path | None:
    from deepinfer_sm80 import _ext_paths

    found = [p for p in _ext_paths.candidates() if p.is_file()]
    return found[0] if found else None


def _registered_ops() -> set[str]:
    import torch

    prefix = "deepinfer_sm80::"
    return {n[len(prefix):] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)}


def _smoke(report: Report, device) -> None:
    """Writer and gather on a few random rows against the torch reference (bit-exact)."""
    import torch

    from deepinfer_sm80.ops import cache as ops
    from deepinfer_sm80.reference import cache as ref

    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    bs, nb, n = 64, 4, 150
    stride = -(-bs * ops.RECORD_BYTES // 576) * 576
    k = (torch.randn(n, ops.HEAD_DIM, generator=g) * 4).to(torch.bfloat16)
    slots = torch.randperm(nb * bs, generator=g)[:n].to(torch.int64)
    slots[::17] = -1
    want = torch.zeros(nb, stride, dtype=torch.uint8)
    ref.quantize_and_insert_k_cache(k, want, slots, bs)
    got = torch.zeros(nb, stride, dtype=torch.uint8, device=device)
    ops.quantize_and_insert_k_cache(k.to(device), got, slots.to(device), bs)
    seq = torch.tensor([200, 37], dtype=torch.int32)
    bt = torch.randint(0, nb, (2, 4), generator=g, dtype=torch.int32)  # pages may repeat
    out_want = torch.zeros(2, 256, ops.HEAD_DIM, dtype=torch.bfloat16)
    ref.dequantize_and_gather_k_cache(out_want, want, seq, None, bt, bs, 0)
    out_got = torch.zeros(2, 256, ops.HEAD_DIM, dtype=torch.bfloat16, device=device)
    ops.dequantize_and_gather_k_cache(out_got, got, seq.to(device), None, bt.to(device), bs, 0)
    if got.is_cuda:
        torch.cuda.synchronize(device)
    written = int((want != 0).any(1).sum())  # (the rows landed somewhere: not a vacuous match)
    same = (written > 0 and torch.equal(got.cpu(), want)
            and torch.equal(out_got.cpu(), out_want))
    if same:
        report.add("ok", "smoke run", "KV-cache writer and gather bit-exact against the torch "
                   "reference on fresh random rows")
    else:
        report.add("error", "smoke run", "the KV-cache writer or gather differs from the torch "
                   "reference on this GPU", "report it with this output; run `make gpu-test`")
    from deepinfer_sm80.ops import attention

    plan = attention.sparse_mla_plan(128, 64, 640, True)
    report.add("info", "attention plan", "decode, 128 rows x 64 heads x 640 keys: "
               + ", ".join(f"{k} {v}" for k, v in plan.items()))


def _vllm(report: Report) -> None:
    import importlib
    import importlib.util

    fix = "install the tree `make apply` built: pip install -e build/vllm"
    if importlib.util.find_spec("vllm") is None:
        report.add("info", "vllm", "vLLM is not installed here (a kernels-only check)", fix)
        return
    try:
        overlay = importlib.import_module("vllm.deepinfer_sm80_overlay")
    except ModuleNotFoundError as exc:
        if exc.name == "vllm.deepinfer_sm80_overlay":
            report.add("warn", "vllm", "the installed vLLM does not carry the DeepInfer-SM80 "
                       "overlay: DeepSeek-V4 and V4.1 fail with it on 8.x", fix)
        else:
            report.add("warn", "vllm", f"the overlay's identity does not import: {exc}", fix)
        return
    except Exception as exc:
        report.add("warn", "vllm", f"the overlay's identity does not import: "
                   f"{type(exc).__name__}: {exc}", fix)
        return
    try:
        overlay.check_upstream()
    except Exception as exc:
        report.add("error", "vllm", str(exc))
        return
    report.add("ok", "vllm", overlay.describe())


def run(device: int | None = None, smoke: bool = True, force_sm80: bool = False) -> Report:
    """The checks, in order. ``force_sm80``: treat a 9.x GPU as if it took the SM80 path (the
    limits, the ops, the smoke run), as this project's own GPU tests run the SM80 code on an
    H100/H200 (``make build EXTRA_GENCODE=compute_80:sm_90``)."""
    report = Report()
    try:
        import torch
    except ImportError:
        report.add("error", "torch", "torch is not installed", "install torch with CUDA")
        return report
    report.add("info", "torch", f"{torch.__version__}, CUDA {torch.version.cuda or 'none'}")
    from deepinfer_sm80.fatbin import code_in_library

    lib = _library()
    if lib is None:
        from deepinfer_sm80 import _ext_paths

        named = _ext_paths.override()
        report.add("error", "extension",
                   f"DEEPINFER_SM80_EXT names {named}, which is not a file" if named
                   else "deepinfer_sm80/_C.so is not built",
                   'make build ARCHS="8.0 8.6" (or point DEEPINFER_SM80_EXT at a built _C.so)')
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not cuda:
        report.add("error", "cuda", "torch sees no CUDA device" + (
            "" if torch.version.cuda else " (this torch is a CPU build)"),
            "install a CUDA build of torch; check the driver (nvidia-smi) and "
            "CUDA_VISIBLE_DEVICES")
        if lib is not None:
            code = code_in_library(lib)
            report.add("info", "extension code", f"{lib}: machine code "
                       f"{list(code.sass)}, PTX {list(code.ptx)}")
        _vllm(report)
        return report
    index = torch.cuda.current_device() if device is None else device
    props = torch.cuda.get_device_properties(index)
    report.add("info", "device", f"cuda:{index} {props.name}")
    sm80_path = check_capability(report, props.major, props.minor)
    if force_sm80 and props.major >= 9:
        report.add("info", "path", "--force-sm80: checked as if it took the SM80 path")
        sm80_path = True
    smem = getattr(props, "shared_memory_per_block_optin", 0)
    if sm80_path:
        check_limits(report, props.multi_processor_count, smem)
    runs = False
    if lib is not None and not sm80_path:
        report.add("info", "extension", f"{lib}: not used on capability "
                   f"{props.major}.{props.minor} (--force-sm80 checks it anyway)")
    elif lib is not None:
        runs = check_library_code(report, code_in_library(lib), props.major * 10 + props.minor,
                                  lib)
    loaded = False
    if lib is not None and runs:
        try:
            from deepinfer_sm80 import _ext

            report.add("ok", "extension", f"loaded {_ext.load()}")
            loaded = True
        except ImportError as exc:
            report.add("error", "extension", str(exc), "rebuild with `make build` for this torch")
    if loaded:
        have = _registered_ops()
        missing = [o for o in REQUIRED_OPS if o not in have]
        if missing:
            report.add("error", "ops", f"missing from the library: {', '.join(missing)}",
                       "the library is older than this package: rebuild with `make build`")
        else:
            report.add("ok", "ops", f"{len(have)} ops registered, the {len(REQUIRED_OPS)} the "
                       "adapters call among them")
        if smoke and sm80_path and not missing:
            try:
                _smoke(report, torch.device("cuda", index))
            except Exception as exc:
                report.add("error", "smoke run", f"{type(exc).__name__}: {exc}",
                           'rebuild for this GPU: make build ARCHS="'
                           f'{props.major}.{props.minor}"')
    _vllm(report)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deepinfer_sm80.doctor",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", type=int, default=None, help="CUDA device index")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of text")
    ap.add_argument("--no-smoke", action="store_true", help="skip the kernels' smoke run")
    ap.add_argument("--force-sm80", action="store_true",
                    help="on a 9.x GPU, check the SM80 path anyway (this project's GPU tests)")
    args = ap.parse_args(argv)
    report = run(args.device, smoke=not args.no_smoke, force_sm80=args.force_sm80)
    if args.json:
        print(json.dumps({"ok": report.ok, "findings": [asdict(f) for f in report.findings]}))
    else:
        print(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
