#!/usr/bin/env bash
# Diagnostic (device tool; experiment docs/experiments/gather-l2-prefetch.diff applied): the
# gather_timeline harness's launcher row with the tile kernel's L2 prefetch of a later tile
# at several distances (DEEPINFER_GATHER_PREFETCH_DIST, blocks), next to a build without it.
#   PD_DISTS="0 1 2112 4224 8448" PD_MODE=1 bash scripts/device/prefetch_dist.sh
set -uo pipefail
GEN="-gencode arch=compute_80,code=sm_90"
nvcc -O3 -std=c++17 -Icsrc $GEN -DGTL_NO_MARKS -o /tmp/gt_base scripts/device/gather_timeline.cu 2>/dev/null || exit 1
nvcc -O3 -std=c++17 -Icsrc $GEN -DGTL_NO_MARKS -DDEEPINFER_GATHER_PREFETCH_DEFAULT=${PD_MODE:-1} \
  -o /tmp/gt_pf scripts/device/gather_timeline.cu 2>/dev/null || exit 1
for shape in ${PD_SHAPES:-49152:1}; do
  for round in 1 2; do
    echo "-- $shape round $round: no prefetch"
    TL_ONLY=zzz /tmp/gt_base "${shape%%:*}" "${shape##*:}" | grep -E "shipped"
    for d in ${PD_DISTS:-0 1 2112 4224 8448}; do
      echo "-- $shape round $round: prefetch mode ${PD_MODE:-1}, distance $d blocks"
      TL_ONLY=zzz DEEPINFER_GATHER_PREFETCH_DIST=$d /tmp/gt_pf "${shape%%:*}" "${shape##*:}" | grep -E "shipped"
    done
  done
done
