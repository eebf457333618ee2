#!/usr/bin/env bash
# vLLM's TileLang mHC kernels as SM80 code on the GPU box, against float64 references
# (tests/gpu/test_mhc_tilelang_sm80.py), plus any GPU test files named in MHC_EXTRA_TESTS
# (they use the extension, built here from compute_80 PTX as sm_90 SASS).
# Carry: dist (make gpu-bundle) and .tl (scripts/device/tilelang_carry.sh).
#   bash scripts/device/mhc.sh
# TileLang generates SM80 code (arch sm_80) and nvcc compiles it from compute_80 to this
# device's machine code (code sm_<major><minor> of the device), as our extension is built.
REPO=$(pwd)
source scripts/device/bundle_env.sh mhc
source "$REPO/scripts/device/tilelang_env.sh"
t0=$SECONDS
# MHC_TESTS: what this pytest process runs (default the mHC file; other GPU tests may follow
# it in the same process, e.g. to check that the module leaves the platform as it found it)
$PY -m pytest -q -s ${MHC_TESTS:-tests/gpu/test_mhc_tilelang_sm80.py} > "$OUT/mhc.log" 2>&1 || rc=1
echo "=== mhc tests rc=$rc ($((SECONDS - t0)) s)"; grep -E "passed|failed|error" "$OUT/mhc.log" | tail -3
grep -E "outside_tol=[1-9]|Error|error:" "$OUT/mhc.log" | head -20
if [ -n "${MHC_EXTRA_TESTS:-}" ]; then
  $PY -m pytest -q $MHC_EXTRA_TESTS > "$OUT/extra.log" 2>&1 || rc=1
  echo "=== extra tests: $(tail -1 "$OUT/extra.log")"; grep -E "^FAILED|^ERROR" "$OUT/extra.log" | head
fi
cp "$OUT/mhc.log" "$RES/" 2>/dev/null
exit $rc
