"""Does a failed TORCH_CHECK inside the extension's ops reach Python as a RuntimeError?
Each case runs in its own subprocess (a crash ends only that case). Run on the GPU box after
building the extension: python scripts/device/cpp_errors.py"""
import subprocess
import sys

PRE = """
import torch, sys
sys.path.insert(0, 'overlay')
from deepinfer_sm80 import _ext
_ext.load()
ops = torch.ops.deepinfer_sm80
d = 'cuda'
"""
CASES = {
    "row_topk k=0": "ops.row_topk_keys(torch.empty(2, 4, dtype=torch.int64, device=d), torch.zeros(2, 8, dtype=torch.int64, device=d), 0)",
    "paged heads=8": "ops.indexer_paged_keys(torch.empty(2, 64, dtype=torch.int64, device=d), torch.zeros(2, 8, 128, dtype=torch.uint8, device=d), torch.zeros(2, 8, device=d), torch.zeros(2, 64*132, dtype=torch.uint8, device=d), torch.zeros(1, 2, dtype=torch.int32, device=d), torch.zeros(2, dtype=torch.int32, device=d), torch.zeros(2, dtype=torch.int32, device=d), torch.zeros(2, dtype=torch.int32, device=d), 0, 64, 64)",
    "flat stride 136": "ops.indexer_flat_keys(torch.empty(2, 64, dtype=torch.int64, device=d), torch.zeros(2, 16, 128, dtype=torch.uint8, device=d), torch.zeros(2, 16, device=d), torch.zeros(64, 136, dtype=torch.uint8, device=d)[:, :128], torch.ones(64, device=d), torch.zeros(2, dtype=torch.int32, device=d), torch.zeros(2, dtype=torch.int32, device=d), 0, 64)",
    "flat heads=8": "ops.indexer_flat_keys(torch.empty(2, 64, dtype=torch.int64, device=d), torch.zeros(2, 8, 128, dtype=torch.uint8, device=d), torch.zeros(2, 8, device=d), torch.zeros(64, 128, dtype=torch.uint8, device=d), torch.ones(64, device=d), torch.zeros(2, dtype=torch.int32, device=d), torch.zeros(2, dtype=torch.int32, device=d), 0, 64)",
    "flat ok": "ops.indexer_flat_keys(torch.empty(2, 64, dtype=torch.int64, device=d), torch.zeros(2, 16, 128, dtype=torch.uint8, device=d), torch.zeros(2, 16, device=d), torch.zeros(64, 128, dtype=torch.uint8, device=d), torch.ones(64, device=d), torch.zeros(2, dtype=torch.int32, device=d), torch.zeros(2, dtype=torch.int32, device=d), 0, 64); torch.cuda.synchronize()",
}
import os

only = os.environ.get("CPP_ERRORS_ONLY")
raw = "--raw" in sys.argv  # the case's own stderr, whole (under the SIGSEGV shim)
bad = 0
for name, stmt in CASES.items():
    if only and name != only:
        continue
    code = PRE + f"""
try:
    {stmt}
    print('NO ERROR')
except RuntimeError as e:
    print('RuntimeError:', str(e).splitlines()[0][:160])
"""
    r = subprocess.run([sys.executable, "-c", code] if raw else
                       [sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True)
    if raw:
        print(r.stdout, r.stderr)
    out = (r.stdout.strip() or r.stderr.strip().splitlines()[0] if (r.stdout.strip() or r.stderr.strip()) else "")
    print(f"{name:18s} rc={r.returncode} {out[:200]}")
    if r.returncode != 0:
        bad += 1
        print("   stderr:", " | ".join(r.stderr.strip().splitlines()[:6])[:600])
sys.exit(1 if bad else 0)
