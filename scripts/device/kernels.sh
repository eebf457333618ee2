#!/usr/bin/env bash
# One device call for the cache/index kernels (issue 4): build the whole extension
# (csrc/**; SM80 code from compute_80 PTX -> sm_90 SASS, so nothing newer than SM80 can
# slip in), run the GPU tests of the cache/index kernels and the FP8 codecs, then the
# gather/combine benchmark (bench/bench_cache.py: ours, the portable Triton gather, and
# upstream when a vLLM tree is available).
#
#   scripts/device/kernels.sh [all|test|bench|build] [pytest -k expression]
#
# Outputs under $OUT: build.log (ptxas report included), test.log, bench.log, bench JSON.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kernels-out}
mkdir -p "$OUT"
MODE=${1:-all}
KEXPR=${2:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv || true
date -u
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'

t0=$(date +%s)
PYTHONPATH=tools python3 -m deepinfer.build build --archs 8.0 --extra-gencode compute_80:sm_90 \
  --only-extra --target overlay --build-dir /tmp/deepinfer_kbuild -j "$(nproc)" -v >"$OUT/build.log" 2>&1
rc=$?
echo "build rc=$rc in $(( $(date +%s) - t0 )) s"
[ $rc -eq 0 ] || { grep -E "error|Error" "$OUT/build.log" | head -30; tail -30 "$OUT/build.log"; exit $rc; }
export DEEPINFER_SM80_EXT=$PWD/overlay/deepinfer_sm80/_C.so
python3 -c 'import sys; sys.path.insert(0, "overlay"); from deepinfer_sm80 import _ext; import torch; print("ops ok, device_info", torch.ops.deepinfer_sm80.device_info())'
[ "$MODE" = build ] && exit 0

if [ "$MODE" = all ] || [ "$MODE" = test ]; then
  t0=$(date +%s)
  python3 -m pytest -q -rs -p no:cacheprovider ${KEXPR:+-k "$KEXPR"} \
    tests/gpu/test_cache_kernels.py tests/gpu/test_index_kernels.py >"$OUT/test.log" 2>&1
  echo "tests rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "^(E  |FAILED|ERROR|SKIPPED)|passed|failed|seed" "$OUT/test.log" | head -40
  # the gather kernel's other compiled variants (benchmark knobs) must be exact too
  for v in "2 plain" "2 cs" "4 cs"; do
    set -- $v
    DEEPINFER_GATHER_INFLIGHT=$1 DEEPINFER_GATHER_STORE=$2 python3 -m pytest -q -p no:cacheprovider \
      -k "gather" tests/gpu/test_cache_kernels.py >"$OUT/test_gather_$1_$2.log" 2>&1
    echo "gather variant inflight=$1 store=$2: rc=$? $(tail -1 "$OUT/test_gather_$1_$2.log")"
  done
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  # GATHER_VARIANTS="4:plain 4:cs" times gather variants (csrc/cache/gather_k.cu knobs)
  for v in ${GATHER_VARIANTS:-4:plain}; do
    inflight=${v%%:*}; store=${v##*:}
    t0=$(date +%s)
    DEEPINFER_GATHER_INFLIGHT=$inflight DEEPINFER_GATHER_STORE=$store \
      python3 bench/bench_cache.py --no-doc ${BENCH_ARGS:-} >"$OUT/bench_${inflight}_$store.log" 2>&1
    echo "bench (gather in flight $inflight, store $store) rc=$? in $(( $(date +%s) - t0 )) s"
    for f in bench/results/bench_cache_*.json; do
      [ -e "$f" ] && mv "$f" "$OUT/g${inflight}${store}_$(basename "$f")"
    done
    grep -E "^- (Device|Date|Command)|^\| (dequant|combine)|FAIL" "$OUT/bench_${inflight}_$store.log"
  done
fi
