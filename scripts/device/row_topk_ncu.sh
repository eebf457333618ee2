#!/usr/bin/env bash
# Where the row top-k's time goes (measurement, not a record): an ncu profile of one launch per
# shape (bench/profile_row_topk.py: stall reasons, scheduler, instruction mix, the top stall
# sites with their SASS) and the kernel's sm_90 SASS (cuobjdump), from the GPU bundle
# (`make gpu-bundle`, carry dist).
#   [RT_SHAPES="rows:n:k ..."] bash scripts/device/row_topk_ncu.sh
set -uo pipefail
REPO=$(pwd)
source "$(dirname "$0")/bundle_env.sh" row_topk_ncu
source "$REPO/scripts/device/ncu_lib.sh"
cp "$REPO"/bench/*.py bench/  # the working tree's bench scripts over the bundle's
SHAPES=${RT_SHAPES:-1:8192:512 64:8192:512}
for s in $SHAPES; do
  IFS=: read -r r n k <<<"$s"
  ncu_profile row_topk_kernel "ncu-$r-$n-$k.txt" 220 --clock-control none \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats \
    --section SourceCounters --print-details all \
    -- $PY bench/profile_row_topk.py --rows "$r" --n "$n" --k "$k"
done
dump_sass row_topk_kernel row_topk_sass.txt
cp "$OUT/row_topk_sass.txt" "$RES/" 2>/dev/null
exit 0
