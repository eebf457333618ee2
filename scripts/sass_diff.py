#!/usr/bin/env python3
"""Compare the SASS of the attention kernels of two csrc trees, kernel by kernel.

A change outside the tile loop (prologue, epilogue, launch parameters) can make ptxas
schedule the loop differently, and a same-run A/B then measures the new schedule as much as
the change (docs/attention.md, session of 2026-11-30 from 08:21 UTC). This script compiles one
.cu file of each tree (default: the prefill instantiations) for one target (default: sm_90
SASS from compute_80 PTX, what the H200 runs) and prints, per kernel, the registers and how
many of the MMA / shared-memory / barrier / global-memory instructions moved (a sequence
diff of their opcodes). 0 means the loop schedule is that of the base.

    python scripts/sass_diff.py BASE_ROOT NEW_ROOT [--file csrc/attention/prefill/sparse_mla_prefill.cu]
        [--gencode arch=compute_80,code=sm_90]
    (BASE_ROOT: e.g. a `git archive BASE csrc | tar x -C /tmp/base` tree)

Needs nvcc, cuobjdump and nvdisasm on PATH. The last two come as wheels from the package index
(`pip download --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, unzip, then put their
nvidia/cu13/bin on PATH); cuobjdump -sass fails without nvdisasm.
"""
from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

KEY = ("HMMA", "LDSM", "BAR", "LDS", "STS", "LDGSTS", "MUFU", "SHFL", "LDG", "STG")


def compile_sass(root: Path, src: str, gencode: str, out: Path) -> tuple[str, dict[str, int]]:
    cubin = out / "k.cubin"
    r = subprocess.run(["nvcc", "-std=c++17", "-gencode", gencode, "-Xptxas", "-v", "-I", "csrc",
                        "-I", "csrc/attention", "-cubin", "-o", str(cubin), src],
                       cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"nvcc failed in {root}:\n{r.stderr[-2000:]}")
    regs, name = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            regs[name] = int(m.group(1))
            name = None
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return sass, regs


def key_ops(sass: str) -> dict[str, list[str]]:
    parts = re.split(r"\n\s+Function : (\S+)\n", sass)
    out = {}
    for i in range(1, len(parts), 2):
        ops = []
        for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+([^;]*);", parts[i + 1]):
            ins = re.sub(r"^@!?U?P\w+\s+", "", m.group(1).strip())
            if ins and ins.split()[0].split(".")[0] in KEY:
                ops.append(ins.split()[0])
        out[parts[i]] = ops
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--file", default="csrc/attention/prefill/sparse_mla_prefill.cu")
    ap.add_argument("--gencode", default="arch=compute_80,code=sm_90")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        sa, ra = compile_sass(args.base, args.file, args.gencode, Path(a))
        sb, rb = compile_sass(args.new, args.file, args.gencode, Path(b))
    ka, kb = key_ops(sa), key_ops(sb)
    moved_any = False
    for k, ops_a in ka.items():
        ops_b = kb.get(k)
        short = re.sub(r"_ZN14deepinfer_sm809attention", "", k)[:90]
        if ops_b is None:
            print(f"{short}: only in base")
            continue
        sm = difflib.SequenceMatcher(a=ops_a, b=ops_b, autojunk=False)
        moved = sum(max(i2 - i1, j2 - j1) for t, i1, i2, j1, j2 in sm.get_opcodes() if t != "equal")
        moved_any |= moved > 0
        print(f"{short}: regs {ra.get(k)} -> {rb.get(k)}; key instructions {len(ops_a)} -> {len(ops_b)}, moved {moved}")
    return 1 if moved_any else 0


if __name__ == "__main__":
    sys.exit(main())
