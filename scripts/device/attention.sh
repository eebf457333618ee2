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

if [ "$MODE" = profile ]; then
  # Nsight Compute counters of one prefill (64 heads) and two decode launches; clocks left alone.
  cat >/tmp/attn_prof.py <<'PY'
import os, sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "overlay")
torch.ops.load_library(os.environ["DEEPINFER_SM80_LIB"])
import bench_attention as b
ops, ref = b.load_ours()
s = b.make_prefill_set(1024, 64)
for _ in range(2):
    ops.flash_mla_sparse_fwd(s["q"], s["kv"], s["idx"], b.SCALE, attn_sink=s["sink"], topk_length=s["lens"], out=s["out"])
for h in (8, 64):
    d = b.make_decode_set(ref, 128, 1, h, 1)
    for _ in range(2):
        ops.sparse_mla_decode(d["q"], d["swa"], d["swa_idx"], d["swa_lens"], d["comp"], d["comp_idx"], d["comp_lens"], d["sink"], b.SCALE, d["out"], d["lse"], num_splits=1)
torch.cuda.synchronize()
PY
  ncu --clock-control none -k regex:sparse_mla_kernel --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
      --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis \
      --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed_op_ldsm.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed_pipe_tensor.sum \
      python3 /tmp/attn_prof.py >"$OUT/ncu_prefill.txt" 2>&1
  ncu --clock-control none -k regex:sparse_mla_kernel --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
      --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum \
      python3 /tmp/attn_prof.py >"$OUT/ncu_decode8.txt" 2>&1
  grep -E "Duration|Throughput|Stall|Warp Cycles|Bank|bank|Achieved Occ|Registers|Block Limit|pipe_tensor|ldsm|wavefronts|Issued|Eligible" "$OUT/ncu_prefill.txt" | head -60
  echo ===== decode h8
  grep -E "Duration|Throughput|Stall|Warp Cycles|bank|Achieved Occ|Block Limit" "$OUT/ncu_decode8.txt" | head -40
  exit 0
fi

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
  grep -E "^\| |FAIL|Device-to-device|Error" "$OUT/bench.log" | head -40
  if [ -z "${BENCH_ARGS:-}" ]; then  # the SM86 configuration (99 KB cap), A6000 SM count
    python3 bench/bench_attention.py --no-doc --quick --smem-cap 101376 --sm-count 84 >"$OUT/bench_sm86.log" 2>&1
    echo "bench sm86 rc=$?"
    grep -E "^\| |FAIL|Error" "$OUT/bench_sm86.log" | head -20
  fi
fi
