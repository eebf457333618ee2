#!/usr/bin/env bash
# Diagnostic (device tool): the gather and its same-run reference copies from a quarter of
# the standard size (12,288 entries) to 16x it (786,432), to separate the per-call fixed
# cost from the steady-state bandwidth; then bench/mixed_copy.py --parts (the chunked copy
# from random cache pages by program size, and the one-wave question; GS_PARTS=0 skips it).
# From the GPU bundle (make gpu-bundle; carry dist):
#   bash scripts/device/gather_sizes.sh
# GS_OVERHEAD=1: also bench/gather_overhead.py (the per-call cost: idle grid, 1/8 gathered,
# one more graph node). GS_SHAPES: other bench_cache.py --gather-shape arguments.
# GS_VARIANTS: space-separated
# NAME=ENV=VAL,ENV=VAL knob settings, each timed after the default (the gather tests run
# under each first).
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" gather-sizes
for v in default ${GS_VARIANTS:-}; do
  variant "$v"
  env $envs $PY -m pytest -q -p no:cacheprovider -k gather tests/gpu/test_cache_kernels.py \
    > "$OUT/tests-$name.log" 2>&1 || rc=1
  echo "gather tests ($name): $(tail -1 "$OUT/tests-$name.log")"
  env $envs $PY bench/bench_cache.py --ours-only --only gather --quick --sm-count 0 \
    ${GS_SHAPES:---gather-shape 1x12288 --gather-shape 1x24576 --gather-shape 1x49152 --gather-shape 1x98304 --gather-shape 1x196608 --gather-shape 1x786432} \
    > "$OUT/bench-sizes-$name.log" 2>&1 || rc=1
  echo "--- $name ($envs)"
  grep -E "^\| dequant|FAIL|results:" "$OUT/bench-sizes-$name.log"
  cp "$(ls -t bench/results/bench_cache_*.json | head -1)" "$RES/" 2>/dev/null
done
[ "${GS_OVERHEAD:-0}" = 1 ] && { $PY bench/gather_overhead.py 2>&1 | tee "$OUT/overhead.log" || rc=1; }
[ "${GS_PARTS:-1}" = 0 ] || (cd bench && timeout 240 ../$PY mixed_copy.py --parts) 2>&1 | tee "$OUT/parts.log" || rc=1
echo "gather_sizes.sh rc=$rc"
exit $rc
