#!/usr/bin/env bash
# Check (device tool): which baselines `make bench`'s cache benchmark leaves out on an Ampere
# card, run on a newer GPU with DEEPINFER_BENCH_CAPABILITY=8.0 (bench_cache.bench_capability:
# it steers only the choice of baselines; every kernel, Triton's included, still compiles and
# runs for the real GPU). Upstream's gather (tl.float8e4nv, SM89+) must be left out with its
# reason and every other row present, the check list clean.
# From the GPU bundle (make gpu-bundle; carry dist):
#   bash scripts/device/bench_as_ampere.sh
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" as-ampere
DEEPINFER_BENCH_CAPABILITY=8.0 \
  DEEPINFER_BENCH_COMMAND="bash scripts/device/bench_as_ampere.sh (baselines chosen as for sm_80: a check, not a record)" \
  $PY bench/bench_cache.py --quick --no-doc --sm-count 108 > "$OUT/bench.log" 2>&1 || rc=1
grep -E "^\| (dequant|combine)|upstream gather|FAIL|missing|not run" "$OUT/bench.log" | head -40
echo "bench_as_ampere.sh rc=$rc"
exit $rc
