#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with the GPU bundle
# carried at dist/deepinfer-gpu-bundle.tar.gz (make gpu-bundle). One call does it all:
#   bash scripts/device/bench.sh validate   upstream import + portable gather tests + quick bench
#   bash scripts/device/bench.sh full       build + GPU tests + full `make bench`
# Everything worth keeping goes to $OUT (logs, results JSON, docs/benchmarks.md).
set -uo pipefail
MODE=${1:-validate}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
BUNDLE=$(pwd)/dist/deepinfer-gpu-bundle.tar.gz
[ -f "$BUNDLE" ] || { echo "no $BUNDLE: run make gpu-bundle and carry dist/deepinfer-gpu-bundle.tar.gz"; exit 2; }
WORK=/tmp/deepinfer-bundle
rm -rf "$WORK" && mkdir -p "$WORK" && tar xzf "$BUNDLE" -C "$WORK"
cd "$WORK/deepinfer-gpu-bundle"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count)'
  nvcc --version | tail -2; cat BUNDLE.json; } 2>&1 | tee "$OUT/env.log"
PYTHON=python3 ./setup.sh 2>&1 | tee "$OUT/setup.log"
rc=0
step() {  # step NAME LOG CMD...: run, tee to $OUT/LOG, remember failure
  local name=$1 log=$2; shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > >(tee -a "$OUT/$log") 2>&1
  local r=$?
  echo "=== $name: rc=$r ($((SECONDS - t0)) s)" | tee -a "$OUT/$log"
  [ $r -eq 0 ] || rc=1
}
has_target() { make -n "$1" >/dev/null 2>&1; }
# SM80 code compiled from compute_80 PTX to sm_90 SASS for this H200 (nothing newer than
# SM80 can slip in), into overlay/ (BUILD_FULL=1: `make build`, sm_80 SASS + PTX as well)
if [ "$MODE" = full ]; then
  if [ "${BUILD_FULL:-0}" = 1 ]; then
    step build build.log make build ARCHS="8.0" BUILD_DIR=overlay EXTRA_GENCODE=compute_80:sm_90
  else
    step build build.log .venv/bin/python -m deepinfer.build build --archs 8.0 \
      --extra-gencode compute_80:sm_90 --only-extra --target overlay -j "$(nproc)"
  fi
fi
# GPU tests: GPU_TESTS (space-separated pytest paths/ids) or, by default, the portable
# gather's; full mode also runs every tests/gpu/test_{cache,index}*.py present
TESTS=(${GPU_TESTS:-tests/gpu/test_triton_portable.py})
if [ "$MODE" = full ] && [ -z "${GPU_TESTS:-}" ]; then
  for f in tests/gpu/test_cache*.py tests/gpu/test_index*.py tests/gpu/test_ops*.py; do
    [ -f "$f" ] && TESTS+=("$f")
  done
fi
step gpu-test tests.log .venv/bin/python -m pytest -q -rs "${TESTS[@]}"
if [ "$MODE" = full ]; then
  step bench bench.log make bench BENCH="${BENCH:-cache}"
else
  step bench bench.log env DEEPINFER_BENCH_COMMAND="bash scripts/device/bench.sh validate" \
    .venv/bin/python bench/bench_cache.py --quick
fi
cp docs/benchmarks.md "$OUT/benchmarks.md" 2>/dev/null
find bench/results -name '*.json' -newer "$OUT/env.log" -exec cp {} "$OUT/" \;
echo "device script done: rc=$rc"
exit $rc
