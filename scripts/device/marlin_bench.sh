#!/usr/bin/env bash
# vLLM's Marlin GEMMs timed as SM80 code (bench/marlin_vllm.py), on the device tool's GPU.
# Here:   make gpu-bundle VLLM_DEPS=1; carry dist.
# There:  bash scripts/device/marlin_bench.sh [tests|none]
#   tests: the Marlin GPU test file first (tests/gpu/test_vllm_c_marlin_sm80.py, ~2 min)
#   none:  the benchmark only (default)
# MB_QUICK=1 runs the benchmark's quick shapes; MB_BUDGET=S ends the benchmark S seconds after
# this script started (default 590, for a call of its own). Logs, JSON and docs/benchmarks.md come back
# in $OUT.
set -uo pipefail
MODE=${1:-none}
source "$(dirname "$0")/bundle_env.sh" marlin
if [ "$MODE" = tests ]; then
  t0=$SECONDS
  timeout 300 $PY -m pytest -q -rs -s -p no:cacheprovider tests/gpu/test_vllm_c_marlin_sm80.py \
    > "$OUT/gpu-tests.log" 2>&1 || rc=1
  tail -4 "$OUT/gpu-tests.log"; grep -E "^FAILED|^ERROR" "$OUT/gpu-tests.log" | head -20
  echo "=== gpu tests rc=$rc ($((SECONDS - t0)) s)"
fi
t0=$SECONDS
q=(); [ "${MB_QUICK:-0}" = 1 ] && q=(--quick)
DEEPINFER_BENCH_COMMAND="bash scripts/device/marlin_bench.sh $MODE" \
  timeout $((${MB_BUDGET:-590} - SECONDS)) $PY bench/marlin_vllm.py "${q[@]}" > "$OUT/bench-marlin.log" 2>&1 || brc=1
grep -E "^\||PASS|FAIL|Error|rror" "$OUT/bench-marlin.log" | head -80
# stopped early (time limit, error): the rows measured so far, one line each
[ "${brc:-0}" = 0 ] || { rc=1; grep -E "^(row|copy_start):" "$OUT/bench-marlin.log" | tail -60; }
tail -5 "$OUT/bench-marlin.log"
echo "=== marlin_vllm ($((SECONDS - t0)) s)"
find bench/results -name 'marlin_vllm*.json' -newer "$OUT/env.log" -exec cp {} "$RES/" \;
cp docs/benchmarks.md "$RES/benchmarks.md" 2>/dev/null
echo "marlin_bench.sh rc=$rc"; exit $rc
