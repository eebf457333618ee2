#!/usr/bin/env bash
# The mHC pre block's projection on SM80 tensor cores (csrc/mhc/prenorm_gemm.cu): its GPU test
# (tests/gpu/test_mhc_prenorm_gemm_gpu.py, float64 oracle), then bench/bench_mhc_prenorm.py:
# ours against vLLM's TileLang fallback, alone and inside vLLM's pre block, same run.
# Carry: dist (make gpu-bundle) and, for the TileLang rows, .tl (scripts/device/tilelang_carry.sh;
# without it the bench runs --no-tilelang: ours against float64 and the copy floor only).
#   bash scripts/device/mhc_prenorm.sh [quick]
# MHCP_BUDGET=S ends the benchmark S seconds after this script started (default 590).
# MHCP_TESTS: the GPU test files to run first (default the kernel's own; add
# tests/gpu/test_mhc_tilelang_sm80.py to check vLLM's mHC wrappers, routed by patch 9 where
# the bundle's tree has it, against float64).
REPO=$(pwd)
source scripts/device/bundle_env.sh mhc-prenorm
args=(); [ "${1:-}" = quick ] && args=(--quick)
if [ -f "$REPO/.tl/tilelang-site.tar.xz" ]; then
  source "$REPO/scripts/device/tilelang_env.sh"
else
  args+=(--no-tilelang); echo "no .tl carried: ours against float64 and the copy floor only"
fi
t0=$SECONDS
$PY -m pytest -q -rs -p no:cacheprovider ${MHCP_TESTS:-tests/gpu/test_mhc_prenorm_gemm_gpu.py} \
  > "$OUT/gpu-tests.log" 2>&1 || rc=1
tail -3 "$OUT/gpu-tests.log"; grep -E "^FAILED|^ERROR|outside_tol=[1-9]" "$OUT/gpu-tests.log" | head -20
echo "=== GPU tests rc=$rc ($((SECONDS - t0)) s)"
run_bench "bash scripts/device/mhc_prenorm.sh ${1:-}" "${MHCP_BUDGET:-590}" bench_mhc_prenorm.py \
  "${args[@]}"
echo "mhc_prenorm.sh rc=$rc"; exit $rc
