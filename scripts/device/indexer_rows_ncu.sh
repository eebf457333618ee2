#!/usr/bin/env bash
# Where the prefill rows scorer's time goes (measurement, not a record): its timing next to the
# warp kernel (bench/ab_indexer_rows.py --quick), an ncu profile of one launch per shape
# (bench/profile_indexer_rows.py: stall reasons, pipes, shared memory, the top stall sites), and
# its SASS for sm_90 (cuobjdump), from the GPU bundle (`make gpu-bundle`, carry dist).
#   bash scripts/device/indexer_rows_ncu.sh          (NCU_SHAPES: "rows:nk:heads ...")
set -uo pipefail
REPO=$(pwd)
source "$(dirname "$0")/bundle_env.sh" indexer_rows_ncu
source "$REPO/scripts/device/ncu_lib.sh"
cp "$REPO"/bench/*.py bench/  # the working tree's bench scripts over the bundle's
SHAPES=${NCU_SHAPES:-256:16384:64 256:16384:32}
$PY bench/ab_indexer_rows.py --label ncu --quick 2>&1 | tee "$OUT/timing.txt" | grep -E "^ab |Error"
for s in $SHAPES; do
  IFS=: read -r r n h <<<"$s"
  ncu_profile indexer_rows_kernel "ncu-$r-$n-$h.txt" 150 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
    --section InstructionStats --section SourceCounters \
    -- $PY bench/profile_indexer_rows.py --rows "$r" --nk "$n" --heads "$h"
done
# 64 heads, 8 rows, flat (template <8, 8, false>)
dump_sass indexer_rows_kernelILi8ELi8ELb0E rows_sass.txt
exit 0
