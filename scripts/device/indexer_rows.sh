#!/usr/bin/env bash
# The prefill scorer's rows kernel (csrc/index/indexer_rows.cu) on the GPU, from the GPU bundle
# (`make gpu-bundle`, carried at dist/): its GPU tests (flat scorer, indexer, layer), the prefill
# bench (Triton and the warp-per-row kernel as same-run baselines), then the block height
# ($DEEPINFER_INDEXER_ROWS = 2, 4, 8 rows per block; read once per process) on the quick shapes.
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
      for r in 2 4 8; do
        echo "--- DEEPINFER_INDEXER_ROWS=$r"
        DEEPINFER_INDEXER_ROWS=$r $PY bench/bench_indexer_prefill.py --quick --no-doc --sm-count 0 \
          > "$OUT/sweep-rows$r.log" 2>&1 || rc=1
        grep -E "^\| scorer" "$OUT/sweep-rows$r.log" | head -8
      done ;;
  esac
  echo "=== $step rc=$rc ($((SECONDS - t0)) s)"
done
echo "indexer_rows.sh rc=$rc"; exit $rc
