#!/usr/bin/env bash
# One device call for the Ampere backend (issue 5): optional extension build
# (SM80 code from compute_80 for the H200), the GPU tests of the layer and the
# FP8 writers, and the per-step layer timings.
#
#   bash scripts/device/layer.sh [all|test|bench] [pytest -k expression]
#
# Env: BUILD=1 builds deepinfer_sm80._C first (SM80 code from compute_80 as
# sm_90 SASS only, into overlay/deepinfer_sm80, time-boxed by BUILD_TIMEOUT);
# without it the layer uses whatever deepinfer_sm80 finds (portable otherwise).
# A GPU bundle carried at $BUNDLE (default .devcarry/h7-bundle.tar.gz, else
# dist/deepinfer-gpu-bundle.tar.gz) provides the vLLM tree + wheels for the
# upstream-writer comparisons.  TESTS overrides the test files.  Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/layer-out}
mkdir -p "$OUT"
MODE=${1:-all}
KEXPR=${2:-}
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv
  python3 -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'; } 2>&1 | tee "$OUT/env.log"

BUNDLE=${BUNDLE:-}
[ -z "$BUNDLE" ] && for b in .devcarry/h7-bundle.tar.gz dist/deepinfer-gpu-bundle.tar.gz; do
  [ -f "$b" ] && { BUNDLE=$b; break; }; done
if [ -n "$BUNDLE" ] && [ -f "$BUNDLE" ]; then
  W=/tmp/h7-bundle; rm -rf "$W"; mkdir -p "$W"; tar xzf "$BUNDLE" -C "$W"
  B=$W/deepinfer-gpu-bundle
  export DEEPINFER_VLLM_TREE=$B/vllm-tree
  if ls "$B"/wheelhouse/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/h7-site "$B"/wheelhouse/*.whl \
      && export PYTHONPATH=/tmp/h7-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  echo "vLLM tree: $DEEPINFER_VLLM_TREE"
else
  echo "no GPU bundle carried: upstream comparisons will skip"
fi

if [ "${BUILD:-0}" = 1 ]; then
  t0=$SECONDS
  PYTHONPATH=tools timeout "${BUILD_TIMEOUT:-150}" python3 -m deepinfer.build build --archs 8.0 \
    --extra-gencode compute_80:sm_90 --only-extra --target overlay \
    --build-dir /tmp/deepinfer_kbuild -j "$(nproc)" >"$OUT/build.log" 2>&1
  echo "build rc=$? in $((SECONDS - t0)) s"; tail -3 "$OUT/build.log"
fi

rc=0
if [ "$MODE" = all ] || [ "$MODE" = test ]; then
  t0=$SECONDS
  export WRITERS_LOG=$OUT/writers.txt LAYER_LOG=$OUT/layer.txt
  K=(); [ -n "$KEXPR" ] && K=(-k "$KEXPR")
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -rs -p no:cacheprovider "${K[@]}" \
    ${TESTS:-tests/gpu/test_writers_gpu.py tests/gpu/test_ampere_layer.py} >"$OUT/test.log" 2>&1
  rc=$?
  echo "tests rc=$rc in $((SECONDS - t0)) s"
  grep -E "^(E  |FAILED|ERROR|SKIPPED)|passed|failed|ampere ops" "$OUT/test.log" | head -40
  cat "$OUT/writers.txt" "$OUT/layer.txt" 2>/dev/null
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  t0=$SECONDS
  OUT=$OUT timeout "${BENCH_TIMEOUT:-120}" python3 scripts/device/layer_bench.py --reps "${REPS:-20}" >"$OUT/bench.log" 2>&1
  echo "bench rc=$? in $((SECONDS - t0)) s"
  grep -E "^\|" "$OUT/bench.log"; tail -5 "$OUT/bench.log"
fi
exit $rc
