#!/usr/bin/env bash
# Same-run A/B of the rows scorer (csrc/index/indexer_rows.cu) across builds, from the GPU bundle
# (`make gpu-bundle`, carry dist): this tree's build ("new"), the csrc of a base commit ("base":
# dist/ab-base-csrc.tar.gz from `scripts/device/ab.sh --pack BASE`), and one build per
# RA_VARIANTS entry NAME=SED (a sed expression applied to this tree's indexer_rows.cu, e.g.
# "kg4=s/#define KG8 2/#define KG8 4/"). Then the flat-scorer and scorer GPU tests on the new
# build, and RA_ROUNDS (default 3) interleaved rounds of bench/ab_indexer_rows.py per build.
#   bash scripts/device/indexer_rows_ab.sh
set -uo pipefail
REPO=$(pwd)
BASE_TGZ=$REPO/dist/ab-base-csrc.tar.gz
[ -f "$BASE_TGZ" ] || { echo "no $BASE_TGZ: run scripts/device/ab.sh --pack BASE here"; exit 2; }
source "$(dirname "$0")/bundle_env.sh" indexer_rows_ab
cp "$REPO"/bench/*.py bench/  # the working tree's bench scripts over the bundle's
mkdir -p /tmp/ra-so
cp overlay/deepinfer_sm80/_C*.so /tmp/ra-so/new.so || exit 1
build_as() {  # build_as NAME: the extension from ./csrc into /tmp/ra-so/NAME.so
  rm -rf build/ext
  .venv/bin/python -m deepinfer.build build --archs 8.0 --extra-gencode compute_80:sm_90 \
    --only-extra --target overlay -j "$(nproc)" > "$OUT/build-$1.log" 2>&1 || { tail -20 "$OUT/build-$1.log"; return 1; }
  cp overlay/deepinfer_sm80/_C*.so "/tmp/ra-so/$1.so"
}
names="base new"
cp -r csrc csrc-new
for v in ${RA_VARIANTS:-}; do
  n=${v%%=*}; e=${v#*=}
  rm -rf csrc && cp -r csrc-new csrc && sed -i "$e" csrc/index/indexer_rows.cu
  if cmp -s csrc/index/indexer_rows.cu csrc-new/index/indexer_rows.cu; then echo "variant $n: sed changed nothing"; rc=1; continue; fi
  build_as "$n" && names="$names $n" || rc=1
done
rm -rf csrc && mkdir csrc-base && tar xzf "$BASE_TGZ" -C csrc-base && mv csrc-base/csrc csrc
build_as base || exit 1
rm -rf csrc && mv csrc-new csrc
echo "=== builds: $names"
DEEPINFER_SM80_EXT=/tmp/ra-so/new.so timeout 300 $PY -m pytest -q -p no:cacheprovider \
  tests/gpu/test_indexer_flat.py tests/gpu/test_indexer_keys.py > "$OUT/gpu-tests-new.log" 2>&1 || rc=1
echo "flat / paged scorer tests (new): $(tail -1 "$OUT/gpu-tests-new.log")"
for r in $(seq 1 "${RA_ROUNDS:-3}"); do
  for n in $names; do
    DEEPINFER_SM80_EXT=/tmp/ra-so/$n.so timeout 200 $PY bench/ab_indexer_rows.py --label "$n" ${RA_ARGS:-} \
      > "$OUT/ab_${n}_$r.log" 2>&1 || rc=1
    grep -E "^ab |Error" "$OUT/ab_${n}_$r.log"
  done
done
echo "indexer_rows_ab.sh rc=$rc"; exit $rc
