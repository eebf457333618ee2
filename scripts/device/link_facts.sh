#!/usr/bin/env bash
# Why does the extension carry its own libstdc++ (cpp_errors.sh)? Facts about the link on the
# GPU box, then a relink with the system g++ and the error cases again.
set -uo pipefail
R=$(pwd)
source "$R/scripts/device/bundle_env.sh" linkfacts > /dev/null 2>&1
echo "CXX=${CXX:-unset} CC=${CC:-unset} LDFLAGS=${LDFLAGS:-unset} CXXFLAGS=${CXXFLAGS:-unset}"
which c++ g++; c++ --version | head -1; readlink -f "$(which c++)"
B=$(ls -d build/ext/* | head -1); echo "build dir: $B"
grep -E "^(cxx|ldflags) =" "$B/build.ninja"
readelf -d overlay/deepinfer_sm80/_C.so | grep -E "NEEDED|RPATH|RUNPATH"
nm -D --defined-only overlay/deepinfer_sm80/_C.so | grep -c "St7codecvt\|_ZNSo" 
(cd "$B" && ninja -t commands | tail -1 | cut -c1-600)
echo "== relink verbose"
(cd "$B" && $(ninja -t commands | tail -1) -v 2>&1 | grep -E "collect2|ld " | tr ' ' '\n' | grep -E "stdc|static|crt|\.a$" | head -20)
