#!/usr/bin/env bash
# Prints the CMake targets of the test executables that carry a given ctest
# label, read from the meshnet_test(...) calls in the source tree, so that a
# sanitizer build can compile only what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
label=$1
find src tests -name CMakeLists.txt -print0 2>/dev/null |
  xargs -0 perl -0777 -ne 'while (/meshnet_test\(\s*(\w+)([^)]*)\)/g) { my ($n, $b) = ($1, $2); print "$n\n" if $b =~ /LABELS[^)]*\b'"$label"'\b/; }' |
  sort -u | tr '\n' ' '
