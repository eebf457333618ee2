"""Which modules, beyond what this machine has, does the vLLM-level checks' import chain need?

Boots the applied tree as tests/vllm_builder_check.boot does (the platform mocked to 8.0,
then the DeepSeek-V4 and V4.1 Ampere adapters) in a subprocess, with the PYTHONPATH those
checks get (harness.subprocess_pythonpath: the bundle's .site-vllm first). Each module that
is not found is recorded and stubbed (an empty package whose attributes are empty classes)
for the next attempt, until the chain imports: one device call lists them all instead of
one per call. Usage (in the unpacked GPU bundle): .venv/bin/python
scripts/device/vllm_missing_modules.py [--tree vllm-tree]"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import vllm_cpu_harness as harness  # noqa: E402

CHILD = r"""
import importlib.abc, importlib.machinery, json, sys, types
from pathlib import Path
stubbed = set(json.loads(sys.argv[1]))
hidden = set(json.loads(sys.argv[5]))

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in hidden - stubbed:
            raise ModuleNotFoundError(f"No module named {fullname!r} (hidden)", name=fullname)

def _stub_attr(attr):
    if attr.startswith("__"):  # no made-up dunders (callers probe __file__, __version__...)
        raise AttributeError(attr)
    return type(attr, (), {})

class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in stubbed:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__file__ = f"<stub of {spec.name}>"
        m.__getattr__ = _stub_attr
        return m
    def exec_module(self, module):
        pass

sys.meta_path.insert(0, Stub())
sys.meta_path.insert(0, Hide())
sys.path.insert(0, sys.argv[3])
import vllm_builder_check as checks
mods = tuple(f"vllm.models.deepseek_v4.nvidia.{m}"
             for m in ("ampere_ops", "ampere_indexer", "ampere_sparse"))
mods += ("vllm.models.deepseek_v41.nvidia.ampere_sparse",)
try:
    checks.boot(Path(sys.argv[2]), Path(sys.argv[4]), "8.0", mods, device="cpu")
except ModuleNotFoundError as e:
    print("MISSING " + (e.name or str(e)).split(".")[0])
    sys.exit(3)
print("BOOTED")
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT / "vllm-tree")
    ap.add_argument("--max", type=int, default=20)
    ap.add_argument("--hide", action="append", default=[],
                    help="treat this module as missing (to check the probe itself)")
    args = ap.parse_args(argv)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    pp = harness.subprocess_pythonpath()
    if pp:
        env["PYTHONPATH"] = pp
    missing: list[str] = []
    for _ in range(args.max):
        p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(missing), str(args.tree),
                            str(ROOT / "tests"), str(ROOT / "overlay"),
                            json.dumps(args.hide)],
                           capture_output=True, text=True, env=env, timeout=600)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("MISSING ", "BOOTED"))]
        if lines and lines[-1] == "BOOTED":
            print(f"the chain imports with these stubbed: {missing or 'none'}")
            return 0 if not missing else 1
        if not lines:
            print(f"the chain failed otherwise (exit {p.returncode}):\n{p.stderr[-3000:]}")
            return 2
        missing.append(lines[-1].split()[1])
        print(f"missing: {missing[-1]}", flush=True)
    print(f"gave up after {args.max}: {missing}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
