#!/usr/bin/env bash
# vLLM's TileLang mHC kernels timed as SM80 code (bench/bench_mhc.py) on the GPU box, against
# the same math in fp32 torch and the copy-bandwidth floor, all in the same run.
# Carry: dist (make gpu-bundle) and .tl (scripts/device/tilelang_carry.sh), as for mhc.sh.
#   bash scripts/device/mhc_bench.sh [quick]
# MHCB_TESTS=1 runs the float64 GPU test (tests/gpu/test_mhc_tilelang_sm80.py) first, in the
# same set-up; MHCB_BUDGET=S ends the benchmark S seconds after this script started (default
# 590); the rows measured by then are in the log.
# TileLang generates SM80 code (arch sm_80), compiled from compute_80 to this device's
# machine code; the platform reports 8.0 and the split-k grids are sized for 108 SMs.
REPO=$(pwd)
source scripts/device/bundle_env.sh mhc-bench
source "$REPO/scripts/device/tilelang_env.sh"
q=(); [ "${1:-}" = quick ] && q=(--quick)
if [ "${MHCB_TESTS:-0}" = 1 ]; then
  t0=$SECONDS
  $PY -m pytest -q -s -p no:cacheprovider tests/gpu/test_mhc_tilelang_sm80.py > "$OUT/mhc-tests.log" 2>&1 || rc=1
  echo "=== mhc tests rc=$rc ($((SECONDS - t0)) s)"; grep -E "passed|failed|error" "$OUT/mhc-tests.log" | tail -3
  grep -E "outside_tol=[1-9]|Error|error:" "$OUT/mhc-tests.log" | head -20
fi
run_bench "bash scripts/device/mhc_bench.sh ${1:-}" "${MHCB_BUDGET:-590}" bench_mhc.py "${q[@]}"
echo "mhc_bench.sh rc=$rc"; exit $rc
