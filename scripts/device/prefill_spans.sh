#!/usr/bin/env bash
# Same-run A/B of prefill_topk's chunk spans (bench/ab_prefill_spans.py) from the GPU bundle
# (`make gpu-bundle`, carried at dist/): build the extension, run the indexer GPU tests of
# prefill_topk, then the A/B.   bash scripts/device/prefill_spans.sh
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" spans
$PY -m pytest -q -p no:cacheprovider tests/gpu/test_indexer_flat.py tests/gpu/test_ampere_indexer_gpu.py \
  > "$OUT/gpu-tests.log" 2>&1 || rc=1
echo "tests: $(tail -1 "$OUT/gpu-tests.log")"
$PY bench/ab_prefill_spans.py --rounds "${SPANS_ROUNDS:-5}" 2>&1 | tee "$OUT/ab.log" || rc=1
echo "prefill_spans.sh rc=$rc"; exit $rc
