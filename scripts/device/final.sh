#!/usr/bin/env bash
# Final integration call (lead): from the GPU bundle made out of the applied tree
# (`make apply && make gpu-bundle`, carried at dist/deepinfer-gpu-bundle.tar.gz):
# build the WHOLE extension (every csrc/ source, SM80 code from compute_80 PTX as sm_90
# SASS), run every GPU test (tests/gpu), then the benchmarks of record:
#   - bench/bench_cache.py (gather / combine, baselines in the same run)      -> bench_cache
#   - bench/bench_attention.py at the SM80 cap (163 KB), grid for the device  -> attention
#   - bench/bench_attention.py --quick at the SM86 cap (99 KB), grid for 84 SMs -> attention_sm86
# Back under $OUT: docs/benchmarks.md of the bundle (sections rewritten by the runs), the
# results JSON, and final-logs.tgz (every log).
#   bash scripts/device/final.sh [all|cache|attention|tests]   (cache: tests of the cache/index
#       kernels and bench_cache only, after a change to them; attention: every GPU test and
#       the two attention benchmarks, no bench_cache, after a change to the attention kernels;
#       tests: every GPU test, no benchmark; FINAL_TESTS="tests/gpu/x.py ..." runs only those)
set -uo pipefail
MODE=${1:-all}
source "$(dirname "$0")/bundle_env.sh" final
t0=$SECONDS
TESTS=(tests/gpu)
[ "$MODE" = cache ] && TESTS=(tests/gpu/test_cache_kernels.py tests/gpu/test_index_kernels.py tests/gpu/test_kernels_vs_upstream.py)
[ -n "${FINAL_TESTS:-}" ] && read -r -a TESTS <<< "$FINAL_TESTS"  # e.g. one test file
$PY -m pytest -q -rs -p no:cacheprovider "${TESTS[@]}" > "$OUT/gpu-tests.log" 2>&1 || rc=1
tail -15 "$OUT/gpu-tests.log"
echo "=== gpu tests rc=$rc ($((SECONDS - t0)) s)"
[ "$MODE" = tests ] && { echo "final.sh tests rc=$rc"; exit $rc; }
t0=$SECONDS
if [ "$MODE" != attention ]; then
  DEEPINFER_BENCH_COMMAND="bash scripts/device/final.sh $MODE : bench/bench_cache.py" \
    $PY bench/bench_cache.py > "$OUT/bench-cache.log" 2>&1 || rc=1
  grep -E "^\| (dequant|combine)|FAIL" "$OUT/bench-cache.log" | head -40
  echo "=== cache bench ($((SECONDS - t0)) s)"
fi
if [ "$MODE" = cache ]; then
  cp docs/benchmarks.md "$RES/benchmarks.md" 2>/dev/null
  find bench/results -name '*.json' -newer "$OUT/env.log" -exec cp {} "$RES/" \;
  echo "final.sh cache rc=$rc"; exit $rc
fi
t0=$SECONDS
DEEPINFER_BENCH_COMMAND="bash scripts/device/final.sh $MODE : bench/bench_attention.py --smem-cap 166912" \
  $PY bench/bench_attention.py --smem-cap 166912 > "$OUT/bench-attention.log" 2>&1 || rc=1
grep -E "^\| (decode|prefill)|FAIL" "$OUT/bench-attention.log" | head -30
echo "=== attention bench ($((SECONDS - t0)) s)"
t0=$SECONDS
DEEPINFER_BENCH_COMMAND="bash scripts/device/final.sh $MODE : bench/bench_attention.py --quick --smem-cap 101376 --sm-count 84 --section attention_sm86" \
  $PY bench/bench_attention.py --quick --smem-cap 101376 --sm-count 84 --section attention_sm86 \
  > "$OUT/bench-attention-sm86.log" 2>&1 || rc=1
grep -E "^\| (decode|prefill)|FAIL" "$OUT/bench-attention-sm86.log" | head -20
echo "=== attention bench, SM86 cap ($((SECONDS - t0)) s)"
cp docs/benchmarks.md "$RES/benchmarks.md" 2>/dev/null
find bench/results -name '*.json' -newer "$OUT/env.log" -exec cp {} "$RES/" \;
echo "final.sh rc=$rc"; exit $rc
