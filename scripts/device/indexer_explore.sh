#!/usr/bin/env bash
# Where the CUDA indexer scorer's time goes (measurement, not a record): the same shape under
# the kernel's diagnostic knobs (tile stream only, math only) and residency pads, then an ncu
# profile of the shipped kernel when ncu is on the machine.
#   bash scripts/device/indexer_explore.sh
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" indexer_explore
P="$PY bench/profile_indexer_keys.py --time"
for v in "" DEEPINFER_INDEXER_DIAG=1 DEEPINFER_INDEXER_DIAG=2 DEEPINFER_INDEXER_SMEM_PAD=80000 \
         "DEEPINFER_INDEXER_DIAG=1 DEEPINFER_INDEXER_SMEM_PAD=60000"; do
  env $v $P 2>&1 | tail -1 | tee -a "$OUT/timing.txt"
done
for a in "--heads 32" "--smem-cap 101376" "--smem-cap 101376 --heads 32"; do
  $P $a 2>&1 | tail -1 | tee -a "$OUT/timing.txt"
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  timeout 200 "$NCU" --kernel-name regex:indexer_keys_kernel --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats \
    --section MemoryWorkloadAnalysis $PY bench/profile_indexer_keys.py > "$OUT/ncu.txt" 2>&1
  grep -vE "^==PROF==|^\s*$" "$OUT/ncu.txt" | head -120
else
  echo "no ncu on this machine"
fi
exit 0
