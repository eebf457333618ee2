#!/usr/bin/env bash
# One device call for the sparse MLA attention kernels: build (standalone extension from
# csrc/attention + csrc/api/attention.cpp; SM80 code from compute_80 PTX for the H200, so
# no Hopper instruction can slip in), GPU tests with both shared-memory caps, benchmark.
#
#   scripts/device/attention.sh [all|test|bench|build] [pytest -k expression]
#
# Outputs under $OUT (build.log with the ptxas resource report, test.log, bench.log and the
# benchmark JSON). Upstream's portable Triton prefill is looked up in $DEEPINFER_XPU_MLA
# (default .devcarry/xpu_mla_sparse.py, carried from /tmp/up/vllm-0.33.0).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attention-out}
mkdir -p "$OUT"
MODE=${1:-all}
KEXPR=${2:-}
BUILD=${ATTN_BUILD_DIR:-/tmp/deepinfer_attn_build}
mkdir -p "$BUILD"
export DEEPINFER_XPU_MLA=${DEEPINFER_XPU_MLA:-$PWD/.devcarry/xpu_mla_sparse.py}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,memory.used --format=csv || true
date -u

t0=$(date +%s)
MAX_JOBS=16 python3 - "$BUILD" <<'PY' >"$OUT/build.log" 2>&1
import glob, sys, torch.utils.cpp_extension as ce
build = sys.argv[1]
srcs = sorted(glob.glob("csrc/attention/**/*.cu", recursive=True)) + ["csrc/api/attention.cpp"]
print("sources:", srcs)
ce.load(name="deepinfer_sm80_attention", sources=srcs, build_directory=build,
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=["-O3", "-std=c++17", "-gencode", "arch=compute_80,code=sm_90",
                           "-Xptxas", "-v", "-lineinfo"],
        is_python_module=False, verbose=True)
print("built", build)
PY
rc=$?
echo "build rc=$rc in $(( $(date +%s) - t0 )) s"
grep -E "error|Used [0-9]+ registers|spill" "$OUT/build.log" | sed 's/ptxas info *: //' | head -30
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit $rc; }
export DEEPINFER_SM80_LIB=$BUILD/deepinfer_sm80_attention.so
[ "$MODE" = build ] && exit 0

if [ "$MODE" = all ] || [ "$MODE" = test ]; then
  t0=$(date +%s)
  export ATTN_ERR_LOG=$OUT/errors.txt
  if [ -n "$KEXPR" ]; then
    python3 -m pytest -q -x -k "$KEXPR" tests/gpu/test_attention.py -p no:cacheprovider >"$OUT/test.log" 2>&1
  else
    python3 -m pytest -q tests/gpu/test_attention.py -p no:cacheprovider >"$OUT/test.log" 2>&1
  fi
  trc=$?
  echo "tests rc=$trc in $(( $(date +%s) - t0 )) s"
  grep -E "^E |passed|failed" "$OUT/test.log" | head -30
  echo "worst errors (vs fp64, vs fp32):"; sort -g -k2 "$OUT/errors.txt" | tail -3
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  t0=$(date +%s)
  python3 bench/bench_attention.py --no-doc ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  echo "bench rc=$? in $(( $(date +%s) - t0 )) s"
  cat "$OUT/bench.log" | tail -60
fi
