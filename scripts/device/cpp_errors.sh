#!/usr/bin/env bash
# Does a failed TORCH_CHECK inside the extension reach Python as a RuntimeError? Builds the
# extension from the GPU bundle (bundle_env.sh), runs scripts/device/cpp_errors.py, and, where a
# case crashes, reruns it under the SIGSEGV shim (segv_shim.c) to name the faulting object.
#   bash scripts/device/cpp_errors.sh
set -uo pipefail
R=$(pwd)
source "$R/scripts/device/bundle_env.sh" cpperr
gcc -O1 -shared -fPIC -o /tmp/segv_shim.so "$R/scripts/device/segv_shim.c" -ldl || exit 1
$PY "$R/scripts/device/cpp_errors.py" 2>&1 | tee "$OUT/cases.log"; rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
  CPP_ERRORS_ONLY="row_topk k=0" LD_PRELOAD=/tmp/segv_shim.so $PY "$R/scripts/device/cpp_errors.py" --raw 2>&1 | head -60
  for v in "TORCH_SHOW_CPP_STACKTRACES=1" "TORCH_SHOW_CPP_STACKTRACES=0" "TORCH_DISABLE_ADDR2LINE=1"; do
    echo "== $v"; env $v CPP_ERRORS_ONLY="row_topk k=0" $PY "$R/scripts/device/cpp_errors.py" 2>&1 | head -3
  done
fi
echo "== a plain CPU op with a failing TORCH_CHECK, built with the extension's flags"
INC=$($PY -c "import torch.utils.cpp_extension as c; print(' '.join('-isystem'+p for p in c.include_paths()))")
LIB=$($PY -c "import torch.utils.cpp_extension as c; print(' '.join('-L'+p for p in c.library_paths()))")
ABI=$($PY -c "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
c++ -O3 -std=c++17 -fPIC -D_GLIBCXX_USE_CXX11_ABI=$ABI -DTORCH_API_INCLUDE_EXTENSION_H $INC \
  -c "$R/scripts/device/cpp_errors_boom.cpp" -o /tmp/boom.o && c++ -shared /tmp/boom.o -o /tmp/boom.so $LIB -lc10 -ltorch -ltorch_cpu
$PY -c "
import torch; torch.ops.load_library('/tmp/boom.so')
try:
    torch.ops.errt.boom(torch.zeros(2))
except RuntimeError as e: print('boom: RuntimeError', str(e).splitlines()[0])
"; echo "boom rc=$?"
LD_PRELOAD=/tmp/segv_shim.so $PY -c "
import torch; torch.ops.load_library('/tmp/boom.so')
try:
    torch.ops.errt.boom(torch.zeros(2))
except RuntimeError as e: print('boom: RuntimeError', str(e).splitlines()[0])
" 2>&1 | head -30
$PY -c "import torch; print(torch.__version__, torch._C._GLIBCXX_USE_CXX11_ABI, torch.__file__)"
ls overlay/deepinfer_sm80/_C*.so 2>/dev/null; ldd overlay/deepinfer_sm80/_C*.so 2>/dev/null | head -20
echo "cpp_errors.sh rc=$rc"; exit $rc
