#!/usr/bin/env bash
# Prove that GPU tests can fail (device tool): build the bundle's extension, run the tests
# (they must pass), then apply a deliberate defect to one source file of the bundle, rebuild
# and run the same tests again (they must fail). Nothing in the repository is changed.
#   MUTANT_FILE=csrc/attention/combine.cu MUTANT_SED='s/if (b > 0) load_batch(b);/if (b > 0) {}/' \
#   MUTANT_TESTS="tests/gpu/test_attention.py -k long_lists" bash scripts/device/mutant.sh
# Exit 0 only if the tests pass on the real code and at least one fails on the mutant.
set -uo pipefail
: "${MUTANT_FILE:?}" "${MUTANT_SED:?}" "${MUTANT_TESTS:?}"
source "$(dirname "$0")/bundle_env.sh" mutant
timeout 300 $PY -m pytest -q -p no:cacheprovider $MUTANT_TESTS > "$OUT/tests-real.log" 2>&1
real=$?
echo "real code: $(tail -1 "$OUT/tests-real.log") (rc $real)"
cp "$MUTANT_FILE" "$OUT/original.src"
sed -i "$MUTANT_SED" "$MUTANT_FILE"
if cmp -s "$MUTANT_FILE" "$OUT/original.src"; then echo "the sed expression changed nothing"; exit 2; fi
diff "$OUT/original.src" "$MUTANT_FILE" | head -10
rm -rf build/ext
.venv/bin/python -m deepinfer.build build --archs 8.0 --extra-gencode compute_80:sm_90 \
  --only-extra --target overlay -j "$(nproc)" > "$OUT/build-mutant.log" 2>&1 || { tail -20 "$OUT/build-mutant.log"; exit 1; }
timeout 300 $PY -m pytest -q -p no:cacheprovider -rf $MUTANT_TESTS > "$OUT/tests-mutant.log" 2>&1
mut=$?
grep -E "^FAILED" "$OUT/tests-mutant.log" | cut -c1-200 | head -20
echo "mutant: $(tail -1 "$OUT/tests-mutant.log") (rc $mut)"
[ "$real" = 0 ] && [ "$mut" != 0 ] && { echo "mutant.sh: the tests catch the defect"; exit 0; }
echo "mutant.sh: NOT shown (real rc $real, mutant rc $mut)"; exit 1
