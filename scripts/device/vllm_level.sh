#!/usr/bin/env bash
# The vLLM-level GPU checks: vLLM's own metadata builders (the applied tree, platform mocked
# to capability 8.0, their Triton kernels compiled for this GPU) into the Ampere adapters
# and this project's CUDA kernels, against float64 oracles (tests/gpu/test_vllm_*_gpu.py).
# Here:   make gpu-bundle VLLM_DEPS=1; carry dist (without VLLM_DEPS the checks skip).
# There:  bash scripts/device/vllm_level.sh [all]
#   (default) the vLLM-level GPU checks only;  all: every GPU test (tests/gpu), which no
#   longer fits one 600-s call;  part1, part2: every GPU test in two calls (part1: the files
#   not named test_vllm_*, with vLLM's compiled cache / index ops; part2: the vLLM-level
#   checks and vLLM's Marlin ops; about 250-310 s and 430 s of tests on the H200 by the
#   2026-12-05 calls, plus ~40 s of set-up and build each)
#   VL_TESTS="FILE ...": these test files instead; VL_K=EXPR: pytest -k EXPR;
#   VL_ARGS="...": more pytest arguments (e.g. --durations=30)
#   VL_BUDGET=S: end the tests S seconds after this script started (default 585: the
#   device tool's 600-s call), so that another script can follow in the same call
# VL_PROBE=1 first lists the modules the checks' import chain lacks here
# (scripts/device/vllm_missing_modules.py).
# Logs come back in $OUT/vllm-level-logs.tgz.
set -uo pipefail
MODE=${1:-checks}
source "$(dirname "$0")/bundle_env.sh" vllm-level
if [ "${VL_PROBE:-0}" = 1 ]; then
  timeout 300 $PY scripts/device/vllm_missing_modules.py 2>&1 | tee "$OUT/probe.log"
fi
t0=$SECONDS
TESTS=(tests/gpu/test_vllm_indexer_decode_gpu.py tests/gpu/test_vllm_attention_gpu.py
       tests/gpu/test_vllm_v41_attention_gpu.py)
[ "$MODE" = all ] && TESTS=(tests/gpu)
PART2=(tests/gpu/test_vllm_attention_gpu.py tests/gpu/test_vllm_indexer_decode_gpu.py
       tests/gpu/test_vllm_v41_attention_gpu.py tests/gpu/test_vllm_c_marlin_sm80.py)
[ "$MODE" = part2 ] && TESTS=("${PART2[@]}")
if [ "$MODE" = part1 ]; then  # every file of tests/gpu that part2 leaves out
  TESTS=(); for t in tests/gpu/test_*.py; do
    [[ " ${PART2[*]} " == *" $t "* ]] || TESTS+=("$t"); done
fi
[ -n "${VL_TESTS:-}" ] && read -r -a TESTS <<< "$VL_TESTS"
existing=(); for t in "${TESTS[@]}"; do [ -e "$t" ] && existing+=("$t"); done
kk=(); [ -n "${VL_K:-}" ] && kk=(-k "$VL_K")
[ -n "${VL_ARGS:-}" ] && { read -r -a more <<< "$VL_ARGS"; kk+=("${more[@]}"); }
# what is left of the device tool's 600-s call after set-up and build (the whole suite now
# needs more: 2026-12-05 it reached item 900 of ~958 at 548 s; part1 + part2 split it)
timeout $((${VL_BUDGET:-585} - SECONDS)) $PY -m pytest -q -rs -p no:cacheprovider "${kk[@]}" "${existing[@]}" > "$OUT/gpu-tests.log" 2>&1 || rc=1
tail -25 "$OUT/gpu-tests.log"; grep -E "^FAILED|^ERROR" "$OUT/gpu-tests.log" | head -20
echo "=== gpu tests ($MODE) rc=$rc ($((SECONDS - t0)) s)"
echo "vllm_level.sh rc=$rc"; exit $rc
