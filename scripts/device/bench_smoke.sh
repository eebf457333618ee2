#!/usr/bin/env bash
# After a change to the benchmark scripts (not the kernels): the cache/index tests and
# bench_cache as in `final.sh cache`, then `bench_attention.py --quick --no-doc` in the same
# bundle, to see both reports name the upstream tree they imported from, then `--help` of
# every benchmark script with a command line (imports with CUDA torch). Not a record.
#   bash scripts/device/bench_smoke.sh      (carry dist; make gpu-bundle first)
set -uo pipefail
REPO=$(pwd)
bash "$REPO/scripts/device/final.sh" cache > /tmp/bench_smoke_final.txt 2>&1; rc=$?
grep -E "passed|failed|^\| (dequant|combine).*\| ours \||final.sh" /tmp/bench_smoke_final.txt | head -12
grep -h "upstream = vLLM" /tmp/deepinfer-final/deepinfer-gpu-bundle/docs/benchmarks.md | head -2 | cut -c1-160
cd /tmp/deepinfer-final/deepinfer-gpu-bundle || exit 2
.venv/bin/python bench/bench_attention.py --quick --no-doc 2>&1 | grep -E "xpu|^\| prefill" | cut -c1-200 | head -12
for s in bench/*.py; do
  grep -q argparse "$s" || continue
  if .venv/bin/python "$s" --help > /dev/null 2> /tmp/bench_smoke_help.txt; then
    n_ok=$((${n_ok:-0} + 1))
  else
    echo "FAIL: $s --help"; tail -3 /tmp/bench_smoke_help.txt; rc=1
  fi
done
echo "bench scripts --help: ${n_ok:-0} ok"
exit $rc
