#!/usr/bin/env bash
# Shared prologue of the device scripts (final.sh, explore.sh, ab.sh), sourced, not run:
#   source scripts/device/bundle_env.sh NAME
# Logs go to /tmp/NAME-logs and travel back as $OUT/NAME-logs.tgz (the device returns at
# most 8 files); RES is the original $OUT for files that should come back one by one. Then
# the GPU bundle (dist/deepinfer-gpu-bundle.tar.gz, from `make gpu-bundle`) is unpacked in
# /tmp/deepinfer-NAME, its setup.sh run, and the whole extension built from compute_80 PTX
# as sm_90 SASS (nothing newer than SM80 can slip in). Defines `variant NAME=ENV=VAL,..` (sets
# name and envs). Leaves the shell in the bundle with
# PY=.venv/bin/python and rc=0.
_name=$1
RES=${OUT:-/tmp/out}; mkdir -p "$RES"
OUT=/tmp/$_name-logs; rm -rf "$OUT"; mkdir -p "$OUT"
trap 'tar czf "$RES/'"$_name"'-logs.tgz" -C /tmp '"$_name"'-logs' EXIT
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
BUNDLE=$(pwd)/dist/deepinfer-gpu-bundle.tar.gz
[ -f "$BUNDLE" ] || { echo "no $BUNDLE: run make gpu-bundle and carry dist"; exit 2; }
WORK=/tmp/deepinfer-$_name; rm -rf "$WORK"; mkdir -p "$WORK"; tar xzf "$BUNDLE" -C "$WORK"
cd "$WORK/deepinfer-gpu-bundle" || exit 2
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; grep -vE '"(index|vllm_tree)":' BUNDLE.json; } 2>&1 | tee "$OUT/env.log"
t0=$SECONDS
PYTHON=python3 ./setup.sh > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
echo "=== setup ok ($((SECONDS - t0)) s)"
t0=$SECONDS
.venv/bin/python -m deepinfer.build build --archs 8.0 --extra-gencode compute_80:sm_90 \
  --only-extra --target overlay -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "=== build ok ($((SECONDS - t0)) s)"
PY=.venv/bin/python
rc=0
variant() {  # variant NAME=ENV=VAL,ENV=VAL: sets name and envs (space-separated) for `env $envs ...`
  name=${1%%=*}; envs=""; [ "$name" != "$1" ] && envs=${1#*=}; envs=${envs//,/ }
}
# build_ab_pair TGZ (same-run A/Bs: ab.sh, indexer_width.sh): the extension just built (this
# tree's) to /tmp/ab-so/new.so, the csrc packed in TGZ (`scripts/device/ab.sh --pack BASE`) built
# into /tmp/ab-so/base.so (log $OUT/build-base.log); $DEEPINFER_SM80_EXT then picks new.so.
build_ab_pair() {
  local tgz=$1 t0=$SECONDS
  mkdir -p /tmp/ab-so
  cp overlay/deepinfer_sm80/_C*.so /tmp/ab-so/new.so || return 1
  mv csrc csrc-new && mkdir csrc-base && tar xzf "$tgz" -C csrc-base && mv csrc-base/csrc csrc || return 1
  rm -rf build/ext
  .venv/bin/python -m deepinfer.build build --archs 8.0 --extra-gencode compute_80:sm_90 \
    --only-extra --target overlay -j "$(nproc)" > "$OUT/build-base.log" 2>&1 || { tail -30 "$OUT/build-base.log"; return 1; }
  cp overlay/deepinfer_sm80/_C*.so /tmp/ab-so/base.so || return 1
  rm -rf csrc && mv csrc-new csrc
  echo "=== base build ok ($((SECONDS - t0)) s)"
  export DEEPINFER_SM80_EXT=/tmp/ab-so/new.so
}
# run_bench LABEL BUDGET SCRIPT [ARGS...] (mhc_bench.sh, mhc_prenorm.sh): bench/SCRIPT --no-doc
# ARGS, recorded as run by LABEL, ended BUDGET seconds after the calling script started; its log
# $OUT/<SCRIPT stem>.log (check lines and rows shown here), the JSON it wrote copied to $RES;
# sets rc=1 when it fails.
run_bench() {
  local label=$1 budget=$2 script=$3 t0=$SECONDS; shift 3
  local stem=${script%.py}
  DEEPINFER_BENCH_COMMAND="$label" timeout $((budget - SECONDS)) $PY "bench/$script" --no-doc "$@" \
    > "$OUT/$stem.log" 2>&1 || rc=1
  grep -E "^\{|PASS|FAIL|Error|rror" "$OUT/$stem.log" | head -150
  echo "=== $stem ($((SECONDS - t0)) s)"
  find bench/results -name "${stem}_*.json" -newer "$OUT/env.log" -exec cp {} "$RES/" \;
}
