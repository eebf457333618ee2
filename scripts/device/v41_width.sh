#!/usr/bin/env bash
# DeepSeek-V4.1's candidate step with a max_model_len-wide block table
# (bench/bench_v41_width.py), on the device tool's GPU.
# Here:   make gpu-bundle; carry dist.
# There:  bash scripts/device/v41_width.sh [tests|indexer|none|profile]
#   tests:   every GPU test first (tests/gpu), then the benchmark
#   indexer: the indexer's and the layer's GPU tests first
#   none:    the benchmark only (default)
#   profile: no test, no benchmark: the step's kernels per call from torch.profiler
#            (bench/profile_v41_indexer.py) for each BATCH:CTX of $V41W_PROFILE, the block
#            table $V41W_PROFILE_WIDTH compressed positions wide (default: the context)
# V41W_QUICK=1 runs the benchmark's two quick shapes; V41W_CHUNKS=1 only the candidate source
# in request chunks against one pass. Logs and JSON come back in $OUT.
set -uo pipefail
MODE=${1:-none}
source "$(dirname "$0")/bundle_env.sh" v41w
if [ "$MODE" = profile ]; then
  for bc in ${V41W_PROFILE:-1:2048 1:65536 64:2048}; do
    echo "=== profile_v41_indexer --batch ${bc%%:*} --ctx ${bc##*:}"
    $PY bench/profile_v41_indexer.py --batch "${bc%%:*}" --ctx "${bc##*:}" \
      --width "${V41W_PROFILE_WIDTH:-0}" 2>&1 | tee -a "$OUT/profile.log" || rc=1
  done
  echo "v41_width.sh profile rc=$rc"; exit $rc
fi
if [ "$MODE" != none ]; then
  t0=$SECONDS
  TESTS=(tests/gpu)
  [ "$MODE" = indexer ] && TESTS=(tests/gpu/test_candidate_kernels.py tests/gpu/test_indexer_keys.py tests/gpu/test_indexer_flat.py
    tests/gpu/test_row_topk.py tests/gpu/test_ampere_indexer_gpu.py tests/gpu/test_ampere_layer.py)
  timeout 420 $PY -m pytest -q -rs -p no:cacheprovider "${TESTS[@]}" > "$OUT/gpu-tests.log" 2>&1 || rc=1
  tail -6 "$OUT/gpu-tests.log"; grep -E "^FAILED|^ERROR" "$OUT/gpu-tests.log" | head -20
  echo "=== gpu tests ($MODE) rc=$rc ($((SECONDS - t0)) s)"
fi
t0=$SECONDS
q=(); [ "${V41W_QUICK:-0}" = 1 ] && q=(--quick); [ "${V41W_CHUNKS:-0}" = 1 ] && q+=(--chunks)
DEEPINFER_BENCH_COMMAND="bash scripts/device/v41_width.sh $MODE" \
  $PY bench/bench_v41_width.py --no-doc "${q[@]}" > "$OUT/bench-v41-width.log" 2>&1 || rc=1
grep -vE "^\s*$" "$OUT/bench-v41-width.log" | grep -E "^\{|^\||PASS|FAIL|Error|rror" | head -80
echo "=== bench_v41_width ($((SECONDS - t0)) s)"
find bench/results -name 'bench_v41_width*.json' -newer "$OUT/env.log" -exec cp {} "$RES/" \;
echo "v41_width.sh rc=$rc"; exit $rc
