#!/usr/bin/env bash
# Tuning call (device tool): from the GPU bundle (make gpu-bundle, carried at
# dist/deepinfer-gpu-bundle.tar.gz) build the whole extension (compute_80 PTX -> sm_90),
# run the GPU tests of the changed kernels, then the variant sweeps. Not the benchmark of
# record (final.sh is); what it measured this far is in docs/kernels-cache-index.md and
# docs/attention.md.
#   tests         attention/cache/index GPU tests, plus the gather knobs in GATHER_TESTS
#   bench         attention sweep (ATTN_SWEEP entries NAME or NAME=ENV=VAL,ENV=VAL; the
#                 "default" one also sweeps batch-1 split counts), bench_cache with
#                 baselines, bench_cache --ours-only for each gather knob set in GATHER_SWEEP
#                 (KNOB=VAL,KNOB=VAL for $DEEPINFER_GATHER_<KNOB>)
#   attention     attention tests + sweep for each ATTN_SWEEP entry (B1=1: the default one
#                 also sweeps batch-1 split counts)
#   profile       Nsight Compute metrics of the gather next to a same-bytes copy
#   profile-full  the same with every memory / scheduler section
#   profile-combine  Nsight Compute of the combine at T=1536 next to a same-bytes copy (L2-warm)
#   profile-attn  Nsight Compute of the attention kernels (prefill / decode, 64 heads):
#                 warp states, source counters, per-SASS-instruction stall samples (CSV),
#                 then the batch-1 decode split sweep
#   profile-prefill  Nsight Compute warp states and stall samples of the 64-head prefill
#   profile-decode   the same for the 64-head decode at batch 128, plus per-SASS-line counters
#   b1            batch-1 decode split sweep per forced head group (B1_HEADS, default 8 16 32)
#   splits        decode split sweep (forced splits) for SPLIT_SWEEP=B:H[:rows],.. (default 128:8,128:32)
#   phases        per-phase SM cycles of the attention tile loop (bench/phase_clocks.py);
#                 builds with NVCC_APPEND_FLAGS=-DDEEPINFER_ATTN_PHASE_CLOCKS itself
#   cache         bench_cache with baselines, then the GATHER_SWEEP knob sets (no attention)
#   all           tests, bench, profile
# Several modes in one call (one build): comma-separated, e.g. tests,cache.
#   bash scripts/device/explore.sh [tests|bench|cache|attention|phases|profile|profile-full|
#                                   profile-attn|profile-prefill|profile-decode|profile-combine|b1|splits|all][,...]
set -uo pipefail
MODE=${1:-all}
mode() {  # mode NAME: NAME was asked for (all implies tests, bench, profile)
  case ",$MODE," in *",$1,"*) return 0 ;; esac
  [ "$MODE" = all ] && { [ "$1" = tests ] || [ "$1" = bench ] || [ "$1" = profile ]; }
}
gather_envs() {  # gather_envs KNOB=VAL,KNOB=VAL -> DEEPINFER_GATHER_KNOB=VAL ... (space-separated)
  echo "$1" | sed 's/\([A-Z0-9_]*=\)/DEEPINFER_GATHER_\1/g; s/,/ /g'
}
mode phases && export NVCC_APPEND_FLAGS="-DDEEPINFER_ATTN_PHASE_CLOCKS"
source "$(dirname "$0")/bundle_env.sh" explore
if mode tests; then
  t0=$SECONDS
  timeout 300 $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py tests/gpu/test_cache_kernels.py \
    tests/gpu/test_index_kernels.py > "$OUT/tests.log" 2>&1 || rc=1
  tail -3 "$OUT/tests.log"; echo "=== tests rc=$rc ($((SECONDS - t0)) s)"
  t0=$SECONDS
  for v in ${GATHER_TESTS:-INFLIGHT=2 INFLIGHT=8 STORE=cs}; do  # variants must be exact too
    envs=$(gather_envs "$v")
    env $envs timeout 100 $PY -m pytest -q -p no:cacheprovider -k gather tests/gpu/test_cache_kernels.py \
      > "$OUT/tests-gather-$v.log" 2>&1 || rc=1
    echo "gather $v: $(tail -1 "$OUT/tests-gather-$v.log")"
  done
fi
if mode attention; then  # one attention A/B: ATTN_SWEEP variants, tests for each
  for v in ${ATTN_SWEEP:-default}; do
    variant "$v"
    env $envs timeout 200 $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py \
      > "$OUT/tests-attention-$name.log" 2>&1 || rc=1
    echo "attention tests ($name): $(tail -1 "$OUT/tests-attention-$name.log")"
    extra=""; [ "$name" = default ] && [ -n "${B1:-}" ] && extra="--b1"
    env $envs timeout 240 $PY bench/explore_attention.py --tag "$name" $extra --smem-cap 166912 \
      --json "$OUT/explore_attention_$name.json" > "$OUT/explore_attention_$name.log" 2>&1 || rc=1
    grep -v "^\[" "$OUT/explore_attention_$name.log" | grep -v "kernels\|Warn\|warn" | cut -c1-200
  done
fi
if mode bench; then
  t0=$SECONDS
  # variants: name=ENV settings (comma-separated); the first also sweeps batch-1 splits
  for v in ${ATTN_SWEEP:-default}; do
    variant "$v"
    extra=""; [ "$name" = default ] && extra="--b1"
    env $envs timeout 240 $PY bench/explore_attention.py --tag "$name" $extra \
      --smem-cap 166912 --json "$OUT/explore_attention_$name.json" > "$OUT/explore_attention_$name.log" 2>&1 || rc=1
    grep -v "^\[" "$OUT/explore_attention_$name.log" | grep -v "kernels\|Warn\|warn" | cut -c1-200
  done
  # batch 1, 64 heads, with 16-head groups and no narrowing (99 KB cap) for comparison
  DEEPINFER_ATTN_NARROW=0 timeout 120 $PY bench/explore_attention.py --tag h16-no-narrow --b1-only \
    --smem-cap 101376 > "$OUT/explore_attention_h16.log" 2>&1 || rc=1
  grep '"heads": 64' "$OUT/explore_attention_h16.log" | grep -v kernels | cut -c1-200
  echo "=== attention sweep ($((SECONDS - t0)) s)"
fi
if mode bench || mode cache; then
  t0=$SECONDS
  DEEPINFER_BENCH_COMMAND="bash scripts/device/explore.sh : bench/bench_cache.py --no-doc" \
    timeout 240 $PY bench/bench_cache.py --no-doc > "$OUT/bench-cache.log" 2>&1 || rc=1
  grep -E "us( |$)|FAIL" "$OUT/bench-cache.log" | head -60
  for v in ${GATHER_SWEEP:-INFLIGHT=8 BLOCKS_PER_SM=4 STORE=cs}; do
    envs=$(gather_envs "$v")
    env $envs timeout 120 $PY bench/bench_cache.py --no-doc --ours-only > "$OUT/bench-cache-$v.log" 2>&1
    echo "--- gather $v"
    grep -E "^gather .* ours|FAIL" "$OUT/bench-cache-$v.log"
  done
  echo "=== cache sweep ($((SECONDS - t0)) s)"
  find bench/results -name '*.json' -newer "$OUT/env.log" -exec cp {} "$OUT/" \;
fi
if mode profile-full; then  # every memory / scheduler section for gather and copy
  timeout 300 ncu --clock-control none --kernel-name-base demangled -k "regex:gather_k|bitwise_not" \
    --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats $PY bench/profile_gather.py > "$OUT/ncu_gather_full.txt" 2>&1
  grep -E "^  [a-z].*\(|^    [A-Z].*[0-9]$|^    [A-Z].*%" "$OUT/ncu_gather_full.txt" | grep -v "^    -" | cut -c1-120 | head -150
fi
if mode splits; then  # decode split sweep at any batch / head count, planner's choice = splits 0
  timeout 300 $PY bench/explore_attention.py --tag splits --split-sweep "${SPLIT_SWEEP:-128:8,128:32}" \
    --prefill-heads "" --smem-cap 166912 > "$OUT/explore_attention_splits.log" 2>&1 || rc=1
  grep -v "^\[" "$OUT/explore_attention_splits.log" | grep '"case"' | cut -c1-400
fi
if mode b1; then  # batch-1 decode: split sweep per forced head group
  for hg in ${B1_HEADS:-8 16 32}; do
    DEEPINFER_ATTN_DECODE_HEADS=$hg timeout 120 $PY bench/explore_attention.py --tag "b1-h$hg" --b1-only \
      --smem-cap 166912 > "$OUT/explore_attention_b1_h$hg.log" 2>&1 || rc=1
    grep -v "^\[" "$OUT/explore_attention_b1_h$hg.log" | grep '"heads": 64' | cut -c1-160
  done
fi
if mode phases; then  # ATTN_SWEEP variants as in the attention mode
  for v in ${ATTN_SWEEP:-default}; do
    variant "$v"
    env $envs timeout 200 $PY bench/phase_clocks.py > "$OUT/phase_clocks_$name.log" 2>&1 || rc=1
    echo "--- phases ($name)"; cut -c1-300 "$OUT/phase_clocks_$name.log"
  done
fi
if mode profile-attn; then
  t0=$SECONDS
  timeout 240 ncu --clock-control none --kernel-name-base demangled -k "regex:sparse_mla_kernel" \
    --launch-count 4 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section SourceCounters --section Occupancy --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis -o /tmp/attn $PY bench/profile_attention.py > "$OUT/ncu_attn.log" 2>&1 || rc=1
  tail -5 "$OUT/ncu_attn.log"
  ncu -i /tmp/attn.ncu-rep --page details > "$OUT/ncu_attn_details.txt" 2>&1
  grep -E "^  [a-z].*\(|^    [A-Z].*[0-9]$|^    [A-Z].*%" "$OUT/ncu_attn_details.txt" | grep -v "^    -" | cut -c1-120 | head -80
  ncu -i /tmp/attn.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_attn_sass.csv" 2>&1 || \
    ncu -i /tmp/attn.ncu-rep --page source --csv > "$OUT/ncu_attn_sass.csv" 2>&1
  head -c 600 "$OUT/ncu_attn_sass.csv"; echo; wc -l "$OUT/ncu_attn_sass.csv"
  timeout 120 $PY bench/explore_attention.py --tag b1 --b1-only --smem-cap 166912 \
    > "$OUT/explore_attention_b1.log" 2>&1 || rc=1
  grep -v "^\[" "$OUT/explore_attention_b1.log" | grep -v "kernels\|Warn\|warn" | cut -c1-160
  echo "=== profile-attn ($((SECONDS - t0)) s)"
fi
if mode profile-prefill; then  # the 64-head prefill's warp states (one steady-state launch)
  t0=$SECONDS
  timeout 200 ncu --clock-control none --kernel-name-base demangled -k "regex:sparse_mla_kernel" \
    --launch-skip 1 --launch-count 1 --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_pipe_tensor.sum \
    $PY bench/profile_attention.py > "$OUT/ncu_prefill.txt" 2>&1 || rc=1
  grep -E "^  [a-z].*\(|Duration|Issued Warp|No Eligible|Eligible Warps|Warp Cycles Per|Executed Instructions |Pipe|pipe|Shared|shared|Throughput|Utilization|hmma|wavefronts|bank" \
    "$OUT/ncu_prefill.txt" | grep -v "^    -\|^          " | cut -c1-140 | head -60
  timeout 200 ncu --clock-control none --kernel-name-base demangled -k "regex:sparse_mla_kernel" \
    --launch-skip 1 --launch-count 1 --metrics regex:smsp__pcsamp_warps_issue_stalled_.*$ \
    $PY bench/profile_attention.py > "$OUT/ncu_prefill_stalls.txt" 2>&1 || rc=1
  grep -E "pcsamp" "$OUT/ncu_prefill_stalls.txt" | awk '$NF+0 > 0' | sort -k3 -n -r | cut -c1-120 | head -30
  echo "=== profile-prefill ($((SECONDS - t0)) s)"
fi
if mode profile-decode; then  # the 64-head decode at batch 128 (one steady-state launch): stalls
  t0=$SECONDS
  # profile_attention.py launches prefill, prefill, decode, decode: skip 3 = the second decode
  timeout 200 ncu --clock-control none --kernel-name-base demangled -k "regex:sparse_mla_kernel" \
    --launch-skip 3 --launch-count 1 --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SpeedOfLight --section SourceCounters \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
    -o /tmp/dec $PY bench/profile_attention.py > "$OUT/ncu_decode.log" 2>&1 || rc=1
  ncu -i /tmp/dec.ncu-rep --page details > "$OUT/ncu_decode.txt" 2>&1
  grep -E "^  [a-z].*\(|Duration|Issued Warp|No Eligible|Eligible Warps|Warp Cycles Per|Executed Instructions |Stall|stall|hmma|wavefronts|bank" \
    "$OUT/ncu_decode.txt" | grep -v "^    -" | cut -c1-140 | head -50
  ncu -i /tmp/dec.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_decode_sass.csv" 2>&1
  timeout 200 ncu --clock-control none --kernel-name-base demangled -k "regex:sparse_mla_kernel" \
    --launch-skip 3 --launch-count 1 --metrics regex:smsp__pcsamp_warps_issue_stalled_.*$ \
    $PY bench/profile_attention.py > "$OUT/ncu_decode_stalls.txt" 2>&1 || rc=1
  grep -E "pcsamp" "$OUT/ncu_decode_stalls.txt" | awk '$NF+0 > 0' | sort -k3 -n -r | cut -c1-120 | head -30
  echo "=== profile-decode ($((SECONDS - t0)) s)"
fi
if mode profile-combine; then  # combine T=1536 next to a same-bytes copy, caches kept (L2-warm)
  t0=$SECONDS
  timeout 200 ncu --clock-control none --cache-control none --kernel-name-base demangled \
    -k "regex:combine_kernel|bitwise_not" --launch-skip 2 --launch-count 4 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis \
    $PY bench/profile_combine.py > "$OUT/ncu_combine.txt" 2>&1
  grep -E "^  [a-z].*\(|Duration|Elapsed Cycles|Throughput|Registers|Achieved Occupancy|Issued Warp|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per|Block Limit|Grid Size|Block Size|Hit Rate|Mem Busy|Max Bandwidth" \
    "$OUT/ncu_combine.txt" | cut -c1-120 | head -90
  # one warm launch of the combine with per-SASS-instruction execution counts (CSV)
  timeout 150 ncu --clock-control none --cache-control none --kernel-name-base demangled \
    -k "regex:combine_kernel" --launch-skip 2 --launch-count 1 --section SourceCounters \
    --section InstructionStats -o /tmp/comb $PY bench/profile_combine.py > "$OUT/ncu_comb.log" 2>&1 || rc=1
  ncu -i /tmp/comb.ncu-rep --page details > "$OUT/ncu_comb_details.txt" 2>&1
  grep -E "Executed Instructions|Issued Instructions|Branch Instructions" "$OUT/ncu_comb_details.txt" | head
  ncu -i /tmp/comb.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_comb_sass.csv" 2>&1
  wc -l "$OUT/ncu_comb_sass.csv"
  echo "=== profile-combine ($((SECONDS - t0)) s)"
fi
if mode profile; then
  t0=$SECONDS
  M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,smsp__warp_issue_stalled_drain_per_warp_active.pct
  timeout 150 ncu --clock-control none --kernel-name-base demangled -k "regex:gather_k|bitwise_not" \
    --launch-count 4 --metrics $M $PY bench/profile_gather.py > "$OUT/ncu_gather.txt" 2>&1
  grep -E "^  [a-z].*\(|duration|dram__|lts__|warps_active|stalled" "$OUT/ncu_gather.txt" | cut -c1-110 | head -30
  echo "=== profile ($((SECONDS - t0)) s)"
fi
echo "explore.sh rc=$rc"; exit $rc
