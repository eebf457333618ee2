#!/usr/bin/env bash
# Build .tl/tilelang-site.tar.xz: TileLang (the version vLLM pins in requirements/cuda.txt)
# and the native parts of its closure, unpacked for the GPU box's Python (3.12, x86-64) and
# compressed to fit the device tool's 64 MiB carry next to the GPU bundle (~35 MB with xz,
# ~85 MB as wheels). Wheels come from the index pip is configured to use. On the box:
#   mkdir -p /tmp/tlsite && tar xJf .tl/tilelang-site.tar.xz -C /tmp/tlsite
#   export PYTHONPATH=/tmp/tlsite
# Left out: the z3 command-line binary and the duplicate libz3.so.4.15 (a link to
# libz3.so instead), TileLang's composable_kernel headers (HIP only). The packages the box
# already has (torch, numpy, ml_dtypes, psutil, tqdm, cloudpickle, typing_extensions) are
# not carried.
# Usage: scripts/device/tilelang_carry.sh [TILELANG_VERSION]   (run in the repo root)
set -euo pipefail
VER=${1:-0.1.12}
PY=${PYTHON:-python3}
WHL=$(mktemp -d); SITE=$(mktemp -d); trap 'rm -rf "$WHL" "$SITE"' EXIT
dl() {
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WHL" "$@"
}
dl "tilelang==$VER"
# its native requirements, at versions its metadata accepts
dl "apache-tvm-ffi>=0.1.10,<=0.1.11" "z3-solver>=4.13.0,<4.15.5" torch-c-dlpack-ext
for w in "$WHL"/*.whl; do (cd "$SITE" && "$PY" -m zipfile -e "$w" .); done
rm -rf "$SITE"/z3_solver-*.data "$SITE"/tilelang/3rdparty/composable_kernel
if [ -f "$SITE/z3/lib/libz3.so.4.15" ]; then
  rm "$SITE/z3/lib/libz3.so.4.15"; ln -s libz3.so "$SITE/z3/lib/libz3.so.4.15"
fi
chmod -R u+rwX,go+rX "$SITE"; find "$SITE" -name '*.so*' -exec chmod +x {} +
mkdir -p .tl
tar -cJf .tl/tilelang-site.tar.xz -C "$SITE" .
ls -la .tl/tilelang-site.tar.xz
