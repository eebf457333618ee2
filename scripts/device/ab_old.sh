#!/usr/bin/env bash
# Temporary same-run A/B: the current kernel against the kernel of 8bd408f
# (csrc/attention/sparse_mla_kernel_ab_old.cuh, -DDEEPINFER_AB_OLD): prefill timings and
# Nsight Compute instruction counts / stall samples of the 64-head prefill for each build.
source "$(dirname "$0")/bundle_env.sh" ab
for v in new old; do
  if [ $v = old ]; then
    rm -rf build/ext
    NVCC_APPEND_FLAGS=-DDEEPINFER_AB_OLD .venv/bin/python -m deepinfer.build build --archs 8.0 \
      --extra-gencode compute_80:sm_90 --only-extra --target overlay -j "$(nproc)" > "$OUT/build-old.log" 2>&1 \
      || { tail -20 "$OUT/build-old.log"; exit 1; }
  fi
  if [ $v = new ]; then
    timeout 200 $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py > "$OUT/tests-new.log" 2>&1 || rc=1
    echo "attention tests (new): $(tail -1 "$OUT/tests-new.log")"
  fi
  for e in ${AB_ENVS:-}; do
    env $e timeout 200 $PY bench/explore_attention.py --tag "$v-$e" --prefill-only --smem-cap 166912 \
      > "$OUT/ab_$v.log" 2>&1 || rc=1
    grep '^{' "$OUT/ab_$v.log" | cut -c1-150
  done
  timeout 200 ncu --clock-control none --kernel-name-base demangled -k "regex:sparse_mla_kernel" \
    --launch-skip 1 --launch-count 1 --section WarpStateStats --section InstructionStats \
    --section SourceCounters -o /tmp/ncu_$v \
    $PY bench/profile_attention.py > "$OUT/ncu_$v.log" 2>&1 || rc=1
  ncu -i /tmp/ncu_$v.ncu-rep --page details > "$OUT/ncu_$v.txt" 2>&1
  ncu -i /tmp/ncu_$v.ncu-rep --page source --csv --print-source sass > "$OUT/sass_$v.csv" 2>&1
  echo "--- ncu $v"
  grep -E "Duration|Executed Instructions |Warp Cycles Per Issued" "$OUT/ncu_$v.txt" | head -4
  head -c 400 "$OUT/sass_$v.csv"; echo; wc -l "$OUT/sass_$v.csv"
done
echo "ab_old.sh rc=$rc"
