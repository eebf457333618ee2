#!/usr/bin/env bash
# Tuning call (device tool): from the GPU bundle (make gpu-bundle, carried at
# dist/deepinfer-gpu-bundle.tar.gz) build the whole extension (compute_80 PTX -> sm_90),
# run the GPU tests of the changed kernels, then the variant sweeps:
#   - gather/combine: bench_cache.py with baselines (default variant) and --ours-only for
#     the gather knobs listed in GATHER_SWEEP (INFLIGHT:STORE:BLOCKS_PER_SM);
#   - attention: bench/explore_attention.py for each $DEEPINFER_ATTN_SCORE_TILE in
#     ATTN_SWEEP (batch-1 split sweep on the first).
#   bash scripts/device/explore.sh [tests|bench|all]
set -uo pipefail
MODE=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RES=$OUT; OUT=/tmp/explore-logs; rm -rf "$OUT"; mkdir -p "$OUT"  # logs travel back as one archive
trap 'tar czf "$RES/explore-logs.tgz" -C /tmp explore-logs' EXIT
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
BUNDLE=$(pwd)/dist/deepinfer-gpu-bundle.tar.gz
[ -f "$BUNDLE" ] || { echo "no $BUNDLE"; exit 2; }
WORK=/tmp/deepinfer-explore; rm -rf "$WORK"; mkdir -p "$WORK"; tar xzf "$BUNDLE" -C "$WORK"
cd "$WORK/deepinfer-gpu-bundle"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } 2>&1 | tee "$OUT/env.log"
t0=$SECONDS
PYTHON=python3 ./setup.sh > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
echo "=== setup ok ($((SECONDS - t0)) s)"
t0=$SECONDS
.venv/bin/python -m deepinfer.build build --archs 8.0 --extra-gencode compute_80:sm_90 \
  --only-extra --target overlay -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "=== build ok ($((SECONDS - t0)) s)"
PY=.venv/bin/python
rc=0
if [ "$MODE" = tests ] || [ "$MODE" = all ]; then
  t0=$SECONDS
  timeout 300 $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py tests/gpu/test_cache_kernels.py \
    tests/gpu/test_index_kernels.py > "$OUT/tests.log" 2>&1 || rc=1
  tail -3 "$OUT/tests.log"; echo "=== tests rc=$rc ($((SECONDS - t0)) s)"
  t0=$SECONDS
  DEEPINFER_ATTN_REGSM=1 timeout 200 $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py \
    > "$OUT/tests-regsm.log" 2>&1 || rc=1
  tail -2 "$OUT/tests-regsm.log"; echo "=== register-softmax-variant attention tests ($((SECONDS - t0)) s)"
  DEEPINFER_GATHER_INFLIGHT=8 timeout 100 $PY -m pytest -q -p no:cacheprovider -k gather tests/gpu/test_cache_kernels.py \
    > "$OUT/tests-gather8.log" 2>&1 || rc=1
  tail -1 "$OUT/tests-gather8.log"
fi
if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  t0=$SECONDS
  # variants: name=ENV settings (comma-separated); the first also sweeps batch-1 splits
  for v in ${ATTN_SWEEP:-default regsm=DEEPINFER_ATTN_REGSM=1 nonarrow=DEEPINFER_ATTN_NARROW=0}; do
    name=${v%%=*}; envs=""; [ "$name" != "$v" ] && envs=${v#*=}
    extra=""; [ "$name" = default ] && extra="--b1"
    env ${envs//,/ } timeout 240 $PY bench/explore_attention.py --tag "$name" $extra \
      --smem-cap 166912 --json "$OUT/explore_attention_$name.json" > "$OUT/explore_attention_$name.log" 2>&1 || rc=1
    grep -v "^\[" "$OUT/explore_attention_$name.log" | grep -v "kernels\|Warn\|warn" | cut -c1-200
  done
  echo "=== attention sweep ($((SECONDS - t0)) s)"
  t0=$SECONDS
  DEEPINFER_BENCH_COMMAND="bash scripts/device/explore.sh : bench/bench_cache.py --no-doc" \
    timeout 240 $PY bench/bench_cache.py --no-doc > "$OUT/bench-cache.log" 2>&1 || rc=1
  grep -E "us |FAIL" "$OUT/bench-cache.log" | head -40
  for v in ${GATHER_SWEEP:-8:plain:0 8:cs:0 4:plain:4 8:plain:4}; do
    IFS=: read -r inflight store bps <<< "$v"
    DEEPINFER_GATHER_INFLIGHT=$inflight DEEPINFER_GATHER_STORE=$store DEEPINFER_GATHER_BLOCKS_PER_SM=$bps \
      timeout 120 $PY bench/bench_cache.py --no-doc --ours-only --sm-count 0 > "$OUT/bench-cache-$inflight-$store-$bps.log" 2>&1
    echo "--- gather inflight=$inflight store=$store blocks/SM=$bps"
    grep -E "^gather .* ours|FAIL" "$OUT/bench-cache-$inflight-$store-$bps.log"
  done
  echo "=== cache sweep ($((SECONDS - t0)) s)"
  find bench/results -name '*.json' -newer "$OUT/env.log" -exec cp {} "$OUT/" \;
fi
if [ "$MODE" = profile ] || [ "$MODE" = all ]; then
  t0=$SECONDS
  M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,smsp__warp_issue_stalled_drain_per_warp_active.pct
  timeout 200 ncu --clock-control none --launch-skip 2 --launch-count 2 --metrics $M \
    $PY bench/profile_gather.py > "$OUT/ncu_gather.txt" 2>&1
  grep -E "gather_k|bitwise|elementwise|duration|dram__|lts__|warps_active|stalled" "$OUT/ncu_gather.txt" | head -40
  echo "=== profile ($((SECONDS - t0)) s)"
fi
echo "explore.sh rc=$rc"; exit $rc
