#!/usr/bin/env bash
# Where the row top-k's time goes (measurement, not a record): an ncu profile of one launch per
# shape (bench/profile_row_topk.py: stall reasons, scheduler, instruction mix, the top stall
# sites with their SASS) and the kernel's sm_90 SASS (cuobjdump), from the GPU bundle
# (`make gpu-bundle`, carry dist).
#   [RT_SHAPES="rows:n:k ..."] bash scripts/device/row_topk_ncu.sh
set -uo pipefail
REPO=$(pwd)
source "$(dirname "$0")/bundle_env.sh" row_topk_ncu
cp "$REPO"/bench/*.py bench/  # the working tree's bench scripts over the bundle's
SHAPES=${RT_SHAPES:-1:8192:512 64:8192:512}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  for s in $SHAPES; do
    IFS=: read -r r n k <<<"$s"
    timeout 240 "$NCU" --clock-control none --kernel-name regex:row_topk_kernel --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats \
      --section SourceCounters --print-details all \
      $PY bench/profile_row_topk.py --rows "$r" --n "$n" --k "$k" > "$OUT/ncu-$r-$n-$k.txt" 2>&1
    grep -vE "^==PROF==|^\s*$" "$OUT/ncu-$r-$n-$k.txt" | grep -vE "^\s+-{5,}" | head -220
  done
else
  echo "no ncu on this machine"
fi
SO=$(find overlay -name '_C*.so' | head -1)
CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
[ -n "$CUOBJ" ] && [ -n "$SO" ] && "$CUOBJ" -sass "$SO" 2>/dev/null | \
  awk '/Function : /{p = /row_topk_kernel/} p' > "$OUT/row_topk_sass.txt"
wc -l "$OUT/row_topk_sass.txt"
cp "$OUT/row_topk_sass.txt" "$RES/" 2>/dev/null
exit 0
