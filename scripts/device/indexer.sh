#!/usr/bin/env bash
# The lightning indexer's CUDA scorer (paged decode and flat prefill) on the GPU, from the GPU
# bundle (`make apply && make gpu-bundle`, carried at dist/): build the extension (SM80 code
# from compute_80 PTX as sm_90 SASS), run its GPU tests and the indexer/layer tests that go
# through decode_topk / prefill_topk, then the benches (Triton scorer baselines in the same run):
# bench/bench_indexer_keys.py (decode) and bench/bench_indexer_prefill.py (prefill);
# INDEXER_BENCHES=width: bench/bench_indexer_width.py (decode with a max_model_len-wide block table).
# INDEXER_SWEEP=1: also bench/sweep_decode_scorer.py (one row per request: warp vs rows kernel).
# INDEXER_TESTS=0: no tests (after a final.sh tests run in the same call).
#   [INDEXER_BENCHES="keys prefill"] [INDEXER_SWEEP=1] [INDEXER_TESTS=0] bash scripts/device/indexer.sh [quick]
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" indexer
t0=$SECONDS
if [ "${INDEXER_TESTS:-1}" = 0 ]; then
  echo "=== gpu tests skipped (INDEXER_TESTS=0)"
else
  $PY -m pytest -q -rs -p no:cacheprovider tests/gpu/test_indexer_keys.py tests/gpu/test_indexer_flat.py tests/gpu/test_row_topk.py \
    tests/gpu/test_ampere_indexer_gpu.py tests/gpu/test_ampere_layer.py > "$OUT/gpu-tests.log" 2>&1 || rc=1
  tail -15 "$OUT/gpu-tests.log"
  echo "=== gpu tests rc=$rc ($((SECONDS - t0)) s)"
fi
ARGS=(); [ "${1:-}" = quick ] && ARGS=(--quick)
for b in ${INDEXER_BENCHES:-keys prefill}; do
  t0=$SECONDS
  DEEPINFER_BENCH_COMMAND="bash scripts/device/indexer.sh ${1:-}" \
    $PY bench/bench_indexer_$b.py "${ARGS[@]}" > "$OUT/bench-$b.log" 2>&1 || rc=1
  grep -E "^\||PASS|FAIL|copy" "$OUT/bench-$b.log" | head -70
  echo "=== bench $b ($((SECONDS - t0)) s)"
done
if [ "${INDEXER_SWEEP:-0}" = 1 ]; then  # one row per request: warp vs rows kernel by shape
  t0=$SECONDS
  $PY bench/sweep_decode_scorer.py > "$OUT/sweep-decode-scorer.log" 2>&1 || rc=1
  grep -vE "^\{" "$OUT/sweep-decode-scorer.log" | tail -110
  echo "=== sweep ($((SECONDS - t0)) s)"
  find bench/results -name 'sweep_decode_scorer_*.json' -newer "$OUT/env.log" -exec cp {} "$RES/" \;
fi
cp docs/benchmarks.md "$RES/benchmarks.md" 2>/dev/null
find bench/results -name 'bench_indexer_*.json' -newer "$OUT/env.log" -exec cp {} "$RES/" \;
echo "indexer.sh rc=$rc"; exit $rc
