#!/usr/bin/env bash
# The gather feeding the prefill (bench/pipeline_gather_prefill.py), with the gather's L2
# evict_first policy on and off in alternating processes (the knob is read once per process).
#   Here:  make gpu-bundle; carry dist.   There:  bash scripts/device/pipeline.sh [rounds]
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" pipeline
for r in $(seq 1 "${1:-3}"); do
  for v in 1 0; do
    DEEPINFER_GATHER_L2POLICY=$v timeout 120 $PY bench/pipeline_gather_prefill.py \
      > "$OUT/pipeline_${v}_$r.log" 2>&1 || rc=1
    grep '"case"' "$OUT/pipeline_${v}_$r.log" || tail -5 "$OUT/pipeline_${v}_$r.log"
  done
done
echo "pipeline.sh rc=$rc"; exit $rc
