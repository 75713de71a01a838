#!/usr/bin/env bash
# Prints the CMake targets of the meshnet libraries (add_library(meshnet_...)
# in src/, generated protobuf code aside), so that the clang thread-safety build
# in .ci/run compiles every library and nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
find src -name CMakeLists.txt -print0 |
  xargs -0 perl -0777 -ne 'while (/add_library\(\s*(meshnet_\w++)(?!\s+INTERFACE)/g) { print "$1\n" unless $1 eq "meshnet_rpc_proto"; }' |
  sort -u | tr '\n' ' '
