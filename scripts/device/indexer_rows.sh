#!/usr/bin/env bash
# The prefill scorer's rows kernel (csrc/index/indexer_rows.cu) on the GPU, from the GPU bundle
# (`make gpu-bundle`, carried at dist/): its GPU tests (flat scorer, indexer, layer), the prefill
# bench (Triton and the warp-per-row kernel as same-run baselines), then rows per block
# ($DEEPINFER_INDEXER_ROWS = at most 8, 4, 2; read once per process) by column chunk
# (bench/explore_indexer_rows.py; ROWS_CFGS, ROWS_CHUNKS, ROWS_SM).
#   bash scripts/device/indexer_rows.sh [tests|bench|sweep ...]   (default: all three)
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" indexer_rows
STEPS=${*:-tests bench sweep}
for step in $STEPS; do
  t0=$SECONDS
  case $step in
    tests)
      $PY -m pytest -q -rs -p no:cacheprovider tests/gpu/test_indexer_flat.py tests/gpu/test_indexer_keys.py \
        tests/gpu/test_ampere_indexer_gpu.py tests/gpu/test_ampere_layer.py > "$OUT/gpu-tests.log" 2>&1 || rc=1
      tail -15 "$OUT/gpu-tests.log" ;;
    bench)
      DEEPINFER_BENCH_COMMAND="bash scripts/device/indexer_rows.sh bench" \
        $PY bench/bench_indexer_prefill.py > "$OUT/bench-prefill.log" 2>&1 || rc=1
      grep -E "^\||PASS|FAIL" "$OUT/bench-prefill.log" | head -40
      cp docs/benchmarks.md "$RES/benchmarks.md" 2>/dev/null
      find bench/results -name 'bench_indexer_prefill_*.json' -newer "$OUT/env.log" -exec cp {} "$RES/" \; ;;
    sweep)
      for c in ${ROWS_CFGS:-8 4 2}; do
        DEEPINFER_INDEXER_ROWS=$c $PY bench/explore_indexer_rows.py --chunks "${ROWS_CHUNKS:-0,1024,2048,4096,8192}" \
          --sm-count "${ROWS_SM:-0}" 2>&1 | tee "$OUT/sweep-cfg$c.log" | grep -E "^rows|Error|error" || rc=1
      done ;;
  esac
  echo "=== $step rc=$rc ($((SECONDS - t0)) s)"
done
echo "indexer_rows.sh rc=$rc"; exit $rc
