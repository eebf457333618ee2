#!/usr/bin/env bash
# Shared by the TileLang device scripts (mhc.sh, mhc_bench.sh), sourced after bundle_env.sh
# with REPO set to the repository root: unpacks the carried TileLang site
# ($REPO/.tl/tilelang-site.tar.xz, scripts/device/tilelang_carry.sh) onto PYTHONPATH and makes
# TileLang generate SM80 code (arch sm_80), compiled from compute_80 to this device's machine
# code (code sm_<major><minor>), as our extension is built.
SITE=/tmp/tlsite; rm -rf "$SITE"; mkdir -p "$SITE"
tar xJf "$REPO/.tl/tilelang-site.tar.xz" -C "$SITE" || exit 2
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
DEV_CC=$(python3 -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}")')
export TILELANG_DEFAULT_TARGET="{\"kind\": \"cuda\", \"arch\": \"sm_80\", \"code\": [\"sm_$DEV_CC\"]}"
$PY -c 'import tilelang; print("tilelang", tilelang.__version__)' 2>&1 | tail -1 | tee -a "$OUT/env.log"
