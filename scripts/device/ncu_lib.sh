#!/usr/bin/env bash
# Helpers for the ncu profile scripts (sourced after bundle_env.sh, which sets $OUT):
#   ncu_profile REGEX OUTFILE LINES [ncu options...] -- command...
#       one launch (the second) of the kernels matching REGEX, report to $OUT/OUTFILE, its first
#       LINES lines without the separators to stdout; "no ncu on this machine" without ncu.
#   dump_sass FUNC_REGEX OUTFILE
#       sm_90 SASS of the functions matching FUNC_REGEX in the built extension, to $OUT/OUTFILE.
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)

ncu_profile() {
  local regex=$1 file=$2 lines=$3 opts=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  if [ -z "$NCU" ]; then echo "no ncu on this machine"; return 0; fi
  timeout 240 "$NCU" --kernel-name "regex:$regex" --launch-skip 1 --launch-count 1 "${opts[@]}" \
    "$@" > "$OUT/$file" 2>&1
  grep -vE "^==PROF==|^\s*$" "$OUT/$file" | grep -vE "^\s+-{5,}" | head -"$lines"
}

dump_sass() {
  local func=$1 file=$2 so cuobj
  so=$(find overlay -name '_C*.so' | head -1)
  cuobj=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
  [ -n "$cuobj" ] && [ -n "$so" ] && "$cuobj" -sass "$so" 2>/dev/null | \
    awk -v f="$func" '/Function : /{p = ($0 ~ f)} p' > "$OUT/$file"
  wc -l "$OUT/$file" 2>/dev/null
}
