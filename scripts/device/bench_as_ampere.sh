#!/usr/bin/env bash
# Check (device tool): what `make bench`'s cache benchmark does on an Ampere card, emulated on
# a newer GPU by reporting compute capability 8.0 to the benchmark (torch's
# get_device_capability patched; the kernels, grids and timings are the real GPU's). Upstream's
# gather (tl.float8e4nv, SM89+) must be left out with its reason, every other row present.
# From the GPU bundle (make gpu-bundle; carry dist):
#   bash scripts/device/bench_as_ampere.sh
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" as-ampere
DEEPINFER_BENCH_COMMAND="bash scripts/device/bench_as_ampere.sh (capability reported as 8.0: a check, not a record)" \
  $PY - --quick --no-doc --sm-count 108 > "$OUT/bench.log" 2>&1 <<'PYEOF' || rc=1
import runpy, sys
import torch
torch.cuda.get_device_capability = lambda *a, **k: (8, 0)
sys.argv = ["bench/bench_cache.py"] + sys.argv[1:]
runpy.run_path("bench/bench_cache.py", run_name="__main__")
PYEOF
grep -E "^\| (dequant|combine)|upstream gather|FAIL|missing|not run" "$OUT/bench.log" | head -40
echo "bench_as_ampere.sh rc=$rc"
exit $rc
