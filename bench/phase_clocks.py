"""Per-phase SM cycles of the sparse MLA kernel (GPU, measurement build only).

Build the extension with NVCC_APPEND_FLAGS=-DDEEPINFER_ATTN_PHASE_CLOCKS: a few blocks then
print, from one score warp and one non-score warp of each group (the two-group 64-head
prefill: the second group's non-score warps are its loaders), the whole block's cycles and
nanoseconds (so the SM clock), the prologue and epilogue, and the cycles spent per phase of the tile
loop (wait + barrier for the tile, fp8 dequantisation, score MMA (the loader warps: the
next tile's copies), barrier, softmax, barrier, PV MMA). A barrier's wait usually lands in
the phase after it (the clock read is not ordered after the barrier). This script runs prefill (64 and 8 heads,
4096 tokens x 640 keys) and decode (batch 128, 64 and 8 heads) once each after a warm-up and
prints the mean cycles per tile per phase.

Usage: python bench/phase_clocks.py   (stdout of the kernels is parsed from a subprocess)
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict


def run_cases() -> None:
    import torch

    import _paths  # noqa: F401  (overlay/ on sys.path)
    import bench_attention as ba
    import explore_attention as ea

    ops, ref = ba.load_ours()
    torch.manual_seed(1)
    for heads in (64, 8):
        s = ba.make_prefill_set(4096, heads)
        for it in range(2):
            print(f"CASE prefill H={heads} it={it}", flush=True)
            ops.flash_mla_sparse_fwd(s["q"], s["kv"], s["idx"], ba.SCALE, attn_sink=s["sink"],
                                     topk_length=s["lens"], out=s["out"])
            torch.cuda.synchronize()
    for heads in (64, 8):
        d = ba.make_decode_set(ref, 128, 1, heads, 2)
        for it in range(2):
            print(f"CASE decode B=128 H={heads} it={it}", flush=True)
            ea.decode_call(ops, d, 0, 0)()
            torch.cuda.synchronize()


def summarise(text: str) -> None:
    case = None
    rows = defaultdict(list)
    for line in text.splitlines():
        if line.startswith("CASE"):
            case = line[5:]
        elif line.startswith("PHASE") and case and case.endswith("it=1"):
            kv = dict(re.findall(r"(\w+)=(-?\d+)", line))
            rows[(case, kv.get("grp", "0"), kv["warp"])].append({k: int(v) for k, v in kv.items()})
    for (case, grp, warp), rs in rows.items():
        tiles = sum(r["tiles"] for r in rs)
        keys = ["wait", "deq", "score", "bar1", "softmax", "bar2", "pv"]
        per = {k: sum(r[k] for r in rs) / max(tiles, 1) for k in keys}
        tot = sum(r["total"] for r in rs) / len(rs)
        pro = sum(r["pro"] for r in rs) / len(rs)
        ns = sum(r.get("ns", 0) for r in rs) / len(rs)
        epi = sum(r.get("epi", 0) for r in rs) / len(rs)
        print(f"{case:28s} group {grp} warp {warp}: {len(rs)} blocks, {tiles / len(rs):.1f} tiles, block "
              f"{tot:.0f} cyc = {ns:.0f} ns ({tot / max(ns, 1):.3f} GHz; prologue {pro:.0f}, epilogue {epi:.0f}); per tile: "
              + " ".join(f"{k} {v:.0f}" for k, v in per.items())
              + f" | sum {sum(per.values()):.0f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        run_cases()
    else:
        res = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True)
        sys.stdout.write(res.stderr[-3000:] if res.returncode else "")
        summarise(res.stdout)
        sys.exit(res.returncode)
