#!/usr/bin/env bash
# Prints the CMake targets of the test executables (meshnet_test(...)) of a
# configured build tree, by label, so that a sanitizer build can compile only
# what it runs. CMake writes the list to BUILD_DIR/test-targets.txt.
#   scripts/ctest-targets.sh BUILD_DIR LABEL                those that carry LABEL
#   scripts/ctest-targets.sh BUILD_DIR --except L1 [L2...]  those that carry none
set -euo pipefail
list="$1/test-targets.txt"
shift
[[ -f $list ]] || { echo "ctest-targets: $list missing (configure first)" >&2; exit 2; }
except=0
if [[ $1 == --except ]]; then
  except=1
  shift
fi
awk -v want="$*" -v except="$except" '
  BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) wanted[w[i]] = 1 }
  NF == 2 {
    hit = 0; m = split($2, l, ",")
    for (i = 1; i <= m; i++) if (l[i] in wanted) hit = 1
    if (hit != except) print $1
  }' "$list" | sort -u | tr '\n' ' '
