#!/usr/bin/env bash
# The indexer's decode with a max_model_len-wide block table (bench/bench_indexer_width.py),
# this tree's kernels against a base commit's in the same call (device tool).
# Here:   scripts/device/ab.sh --pack BASE; make gpu-bundle; carry dist.
# There:  bash scripts/device/indexer_width.sh
# Builds this tree's extension and the base's (a second .so, chosen by $DEEPINFER_SM80_EXT),
# runs the indexer GPU tests on the new build (WIDTH_TESTS=0 skips them), then, for base and
# new: bench_indexer_width.py (base with $DEEPINFER_INDEXER_WINDOW=0: its row top-k has no
# window) and, with WIDTH_KEYS=1, bench_indexer_keys.py --quick (the usual decode shapes, whose
# block tables are as wide as their contexts). $WIDTH_BASE_ENV: the base's environment (default
# DEEPINFER_INDEXER_WINDOW=0, for a base built before the window; "" for a later base).
# $WIDTH_PROFILE="B:CTX:WIDTH ...": then bench/profile_v41_indexer.py --plain --timeline of each,
# for base and new (the kernels of one call, one by one). $WIDTH_SHAPES: indices into the
# benchmark's SHAPES (default all). $WIDTH_MORE_TESTS: more GPU test files for the new build.
# $WIDTH_COMBINE=N: N rounds of the combine's quick benchmark, base and new. $WIDTH_VARIANTS:
# the builds benchmarked (default "base new"); $WIDTH_BUDGETS: key-buffer sizes in MB for more
# variants (bench_indexer_width.py --budgets). Without "base" in $WIDTH_VARIANTS no base is
# packed or built. JSON and logs come back in $OUT.
set -uo pipefail
BASE_TGZ=${AB_BASE_TGZ:-$(pwd)/dist/ab-base-csrc.tar.gz}
WITH_BASE=0; [[ " ${WIDTH_VARIANTS:-base new} " == *" base "* ]] && WITH_BASE=1
[ "$WITH_BASE" = 0 ] || [ -f "$BASE_TGZ" ] || {
  echo "no $BASE_TGZ: run scripts/device/ab.sh --pack BASE here"; exit 2; }
source "$(dirname "$0")/bundle_env.sh" width
if [ "$WITH_BASE" = 1 ]; then
  build_ab_pair "$BASE_TGZ" || exit 1
else  # this tree's build only (WIDTH_VARIANTS without base: e.g. Python-side variants)
  mkdir -p /tmp/ab-so && cp overlay/deepinfer_sm80/_C*.so /tmp/ab-so/new.so || exit 1
fi
if [ "${WIDTH_TESTS:-1}" != 0 ]; then
  t0=$SECONDS
  timeout 330 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_candidate_kernels.py tests/gpu/test_indexer_keys.py tests/gpu/test_indexer_flat.py \
    tests/gpu/test_row_topk.py tests/gpu/test_ampere_indexer_gpu.py tests/gpu/test_ampere_layer.py \
    ${WIDTH_MORE_TESTS:-} > "$OUT/gpu-tests.log" 2>&1 || rc=1
  echo "indexer GPU tests (new): $(tail -1 "$OUT/gpu-tests.log") ($((SECONDS - t0)) s)"
  grep -E "^FAILED|Error" "$OUT/gpu-tests.log" | head -20
fi
for v in ${WIDTH_VARIANTS:-base new}; do
  t0=$SECONDS
  env_v=(); [ "$v" = base ] && read -ra env_v <<< "${WIDTH_BASE_ENV-DEEPINFER_INDEXER_WINDOW=0}"
  env "${env_v[@]}" DEEPINFER_SM80_EXT=/tmp/ab-so/$v.so \
    DEEPINFER_BENCH_COMMAND="bash scripts/device/indexer_width.sh ($v build)" \
    $PY bench/bench_indexer_width.py --no-doc --label "$v" ${WIDTH_SHAPES:+--shapes "$WIDTH_SHAPES"} \
    ${WIDTH_BUDGETS:+--budgets "$WIDTH_BUDGETS"} \
    > "$OUT/width-$v.log" 2>&1 || rc=1
  echo "--- bench_indexer_width, $v ($((SECONDS - t0)) s)"
  grep -E "^\||PASS|FAIL|Error" "$OUT/width-$v.log" | head -60
  if [ "${WIDTH_KEYS:-0}" = 1 ]; then
    env "${env_v[@]}" DEEPINFER_SM80_EXT=/tmp/ab-so/$v.so \
      $PY bench/bench_indexer_keys.py --quick --no-doc > "$OUT/keys-$v.log" 2>&1 || rc=1
    echo "--- bench_indexer_keys --quick, $v"
    grep -E "^\||FAIL|Error" "$OUT/keys-$v.log" | grep -E "decode_topk|scorer|top-k|FAIL|Error" | head -40
  fi
  for bcw in ${WIDTH_PROFILE:-}; do
    IFS=: read -r b c w <<< "$bcw"
    echo "--- profile $v: batch $b, ctx $c, table $w" | tee -a "$OUT/profile-$v.log"
    env "${env_v[@]}" DEEPINFER_SM80_EXT=/tmp/ab-so/$v.so timeout 120 \
      $PY bench/profile_v41_indexer.py --plain --timeline --batch "$b" --ctx "$c" --width "$w" \
      >> "$OUT/profile-$v.log" 2>&1 || rc=1
    grep -E "^##|Error" "$OUT/profile-$v.log" | tail -1
  done
done
# $WIDTH_COMBINE=N: N interleaved rounds of the combine's quick cases (bench_cache.py --ours-only
# --quick --only combine) for base and new
for r in $(seq 1 "${WIDTH_COMBINE:-0}"); do
  for v in base new; do
    DEEPINFER_SM80_EXT=/tmp/ab-so/$v.so timeout 100 $PY bench/bench_cache.py --no-doc --ours-only --quick \
      --only combine > "$OUT/combine-${v}-$r.log" 2>&1 || rc=1
    echo "--- combine $v round $r"; grep -E "^combine |FAIL" "$OUT/combine-${v}-$r.log" | head -6
  done
done
find bench/results -name 'bench_indexer_*.json' -newer "$OUT/env.log" -exec cp {} "$RES/" \;
echo "indexer_width.sh rc=$rc"; exit $rc
