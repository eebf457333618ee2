#!/usr/bin/env bash
# Diagnostic (device tool, needs only nvcc and the CUDA runtime; runs from the repository
# root, no bundle): per-block timelines of the shipped tile gather next to same-shape copy
# kernels (scripts/device/gather_timeline.cu), at the benchmark's two target shapes and one
# large size. Output in $OUT/timeline-*.txt.
#   bash scripts/device/gather_timeline.sh            (TL_SHAPES="49152:1 12288:4 196608:1")
# Knobs: TL_TIMING_RUNS (2), TL_TIMELINE (1: also the instrumented build), TL_ONLY (variants
# to time, by words of their names), TL_AB_DEFINES (a second timing build, below), TL_DEFINES
# (defines for the first timing build and the timeline build).
set -uo pipefail
OUT=${OUT:-/tmp/gather-timeline}
mkdir -p "$OUT"
# two builds: the timing build (no timeline code in any kernel; graph-replayed times) and the
# timeline build (the marks; one instrumented call per kernel)
GEN="-gencode arch=compute_80,code=sm_90 -gencode arch=compute_80,code=compute_80"
nvcc -O3 -std=c++17 -Icsrc $GEN -DGTL_NO_MARKS ${TL_DEFINES:-} -o /tmp/gather_timing scripts/device/gather_timeline.cu || exit 1
nvcc -O3 -std=c++17 -Icsrc $GEN ${TL_DEFINES:-} -o /tmp/gather_timeline scripts/device/gather_timeline.cu || exit 1
# TL_AB_DEFINES="-DNAME=value ...": a second timing build with these defines, run after each
# run of the first (a same-call A/B of a compile-time choice of the shipped kernels)
if [ -n "${TL_AB_DEFINES:-}" ]; then
  nvcc -O3 -std=c++17 -Icsrc $GEN -DGTL_NO_MARKS $TL_AB_DEFINES -o /tmp/gather_timing_b \
    scripts/device/gather_timeline.cu || exit 1
fi
rc=0
for s in ${TL_SHAPES:-49152:1 12288:4 196608:1}; do
  for r in $(seq ${TL_TIMING_RUNS:-2}); do
    /tmp/gather_timing "${s%%:*}" "${s##*:}" > "$OUT/timing-${s/:/x}-$r.txt" 2>&1 || rc=1
    grep -E "^GPU|^==" "$OUT/timing-${s/:/x}-$r.txt"
    if [ -n "${TL_AB_DEFINES:-}" ]; then
      echo "-- build B: $TL_AB_DEFINES"
      /tmp/gather_timing_b "${s%%:*}" "${s##*:}" > "$OUT/timing-b-${s/:/x}-$r.txt" 2>&1 || rc=1
      grep -E "^GPU|^==" "$OUT/timing-b-${s/:/x}-$r.txt"
    fi
  done
  [ "${TL_TIMELINE:-1}" = 1 ] || continue
  /tmp/gather_timeline "${s%%:*}" "${s##*:}" > "$OUT/timeline-${s/:/x}.txt" 2>&1 || rc=1
  grep -E "^GPU|^==|first loads" "$OUT/timeline-${s/:/x}.txt" | sed 's/timeline span.*//'
done
echo "gather_timeline.sh rc=$rc"
exit $rc
