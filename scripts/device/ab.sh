#!/usr/bin/env bash
# Same-run A/B of the kernels of this tree against those of a base commit (device tool).
# Here:   git archive --format=tar.gz -o dist/ab-base-csrc.tar.gz BASE csrc
#         (or scripts/device/ab.sh --pack BASE), make gpu-bundle; carry dist.
# There:  bash scripts/device/ab.sh
# Builds the extension twice in one call (this tree's csrc, then the base's csrc into a second
# .so, selected by $DEEPINFER_SM80_EXT), runs the attention GPU tests on this tree's build
# (AB_TESTS=0 skips them; AB_TEST_K: a pytest -k filter; AB_TEST_TIMEOUT seconds, default 200;
# AB_STOP_ON_FAIL=1: stop there if they fail), then AB_ROUNDS (default 3) interleaved rounds of
# bench/explore_attention.py --prefill-only for: base, new, and each AB_ENVS entry
# (NAME=ENV=VAL,ENV=VAL, run on the new build). Interleaving spreads run-to-run drift over
# every variant alike. AB_CASES=prefill (default) or "prefill decode" (decode B=128 too; "b1"
# adds the batch-1 split sweep); AB_SPLIT_SWEEP=B:H,.. adds forced-split decode sweeps.
# At the end, scripts/device/ab_summary.py prints the rounds, medians and changes against base
# (also $OUT/summary.md in ab-logs.tgz).
# AB_SMEM_CAP: the attention cases' shared-memory cap (default 166912, SM80; 101376: SM86).
# AB_BENCH=cache: instead, the cache/index GPU tests and bench/bench_cache.py --ours-only
# --quick (gather 1 x 49,152 and 4 x 12,288, combine T=1536 cold and L2-warm; AB_ONLY=gather
# or combine: that kernel only; AB_CACHE_ARGS: more bench_cache.py arguments, e.g. --all-shapes)
# for base, new and AB_ENVS; AB_BASELINES=1: then once more for
# the new build with upstream's and the portable Triton baselines. AB_BENCH=topk: the row
# top-k's and indexer's GPU tests on the new build, then AB_ROUNDS interleaved rounds of
# bench/ab_row_topk.py (the row top-k alone) for base and new.
set -uo pipefail
if [ "${1:-}" = --pack ]; then
  mkdir -p dist && git archive --format=tar.gz -o dist/ab-base-csrc.tar.gz "${2:?base ref}" csrc \
    && echo "dist/ab-base-csrc.tar.gz: csrc of $(git rev-parse --short "$2")"
  exit $?
fi
BASE_TGZ=${AB_BASE_TGZ:-$(pwd)/dist/ab-base-csrc.tar.gz}  # AB_BASE_TGZ: another packed base
[ -f "$BASE_TGZ" ] || { echo "no $BASE_TGZ: run scripts/device/ab.sh --pack BASE here"; exit 2; }
source "$(dirname "$0")/bundle_env.sh" ab
ab_variant() {  # bundle_env's variant, plus so: the .so the variant runs on
  variant "$1"; so=/tmp/ab-so/new.so; [ "$name" = base ] && so=/tmp/ab-so/base.so
}
build_ab_pair "$BASE_TGZ" || exit 1
if [ "${AB_BENCH:-attention}" = topk ]; then
  timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_row_topk.py tests/gpu/test_ampere_indexer_gpu.py \
    > "$OUT/tests-topk.log" 2>&1 || rc=1
  echo "row top-k / indexer tests (new): $(tail -1 "$OUT/tests-topk.log")"
  for r in $(seq 1 "${AB_ROUNDS:-3}"); do
    for v in base new; do
      ab_variant "$v"
      DEEPINFER_SM80_EXT=$so timeout 150 $PY bench/ab_row_topk.py --label "$name" \
        > "$OUT/ab_topk_${name}_$r.log" 2>&1 || rc=1
      echo "--- $name round $r"; grep -E "^row_topk|Error" "$OUT/ab_topk_${name}_$r.log"
    done
  done
  echo "ab.sh rc=$rc"; exit $rc
fi
if [ "${AB_BENCH:-attention}" = cache ]; then
  timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_cache_kernels.py tests/gpu/test_index_kernels.py \
    > "$OUT/tests-cache.log" 2>&1 || rc=1
  echo "cache/index tests (new): $(tail -1 "$OUT/tests-cache.log")"
  for v in ${AB_ENVS:-}; do  # knob variants must be exact too
    ab_variant "$v"
    env $envs timeout 100 $PY -m pytest -q -p no:cacheprovider -k "gather or combine" \
      tests/gpu/test_cache_kernels.py tests/gpu/test_index_kernels.py \
      > "$OUT/tests-cache-$name.log" 2>&1 || rc=1
    echo "gather/combine tests ($name): $(tail -1 "$OUT/tests-cache-$name.log")"
  done
  for r in $(seq 1 "${AB_ROUNDS:-3}"); do
    for v in base new ${AB_ENVS:-}; do
      ab_variant "$v"
      env DEEPINFER_SM80_EXT=$so $envs timeout 150 $PY bench/bench_cache.py --no-doc --ours-only --quick \
        ${AB_ONLY:+--only $AB_ONLY} ${AB_CACHE_ARGS:-} \
        > "$OUT/ab_cache_${name}_$r.log" 2>&1 || rc=1
      echo "--- $name round $r"; grep -E "^(gather|combine) |FAIL" "$OUT/ab_cache_${name}_$r.log" | head -12
    done
  done
  if [ -n "${AB_BASELINES:-}" ]; then  # new build with upstream / portable baselines, same call
    timeout 240 $PY bench/bench_cache.py --no-doc --quick ${AB_ONLY:+--only $AB_ONLY} \
      > "$OUT/ab_cache_baselines.log" 2>&1 || rc=1
    echo "--- new with baselines"; grep -E "^(gather|combine) |FAIL|copy" "$OUT/ab_cache_baselines.log" | head -20
  fi
  echo "ab.sh rc=$rc"; exit $rc
fi
if [ "${AB_TESTS:-1}" != 0 ]; then
  t0=$SECONDS
  timeout "${AB_TEST_TIMEOUT:-200}" $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py \
    ${AB_TEST_K:+-k "$AB_TEST_K"} > "$OUT/tests-attention.log" 2>&1 || rc=1
  echo "attention tests (new): $(tail -1 "$OUT/tests-attention.log") ($((SECONDS - t0)) s)"
  # AB_STOP_ON_FAIL=1: no benchmark of a build that failed its tests (a hung kernel would
  # spend the rest of the call in the benchmark's timeouts)
  if [ "$rc" != 0 ] && [ -n "${AB_STOP_ON_FAIL:-}" ]; then
    grep -E "FAILED|Error|error" "$OUT/tests-attention.log" | head -20; echo "ab.sh rc=$rc"; exit $rc
  fi
fi
# explore_attention.py flags; PREFILL_HEADS="": no prefill case; any decode case drops --prefill-only
only="--prefill-only"
case "${AB_CASES:-prefill}" in *decode*|*b1*) only="" ;; esac
[ -n "${AB_SPLIT_SWEEP:-}" ] && only=""
cases="$only --prefill-heads=${PREFILL_HEADS-64}"
case "${AB_CASES:-prefill}" in *b1*) cases="$cases --b1" ;; esac
[ -n "${AB_SPLIT_SWEEP:-}" ] && cases="$cases --split-sweep $AB_SPLIT_SWEEP"
for r in $(seq 1 "${AB_ROUNDS:-3}"); do
  for v in base new ${AB_ENVS:-}; do
    ab_variant "$v"
    env DEEPINFER_SM80_EXT=$so $envs timeout 150 $PY bench/explore_attention.py --tag "$name" $cases \
      --smem-cap "${AB_SMEM_CAP:-166912}" > "$OUT/ab_${name}_$r.log" 2>&1 || rc=1
    grep '"case"' "$OUT/ab_${name}_$r.log" | cut -c1-170
  done
done
# per case and variant: every round, the median and its change against the base build
$PY scripts/device/ab_summary.py "$OUT" | tee "$OUT/summary.md"
echo "ab.sh rc=$rc"; exit $rc
