#!/usr/bin/env bash
# Installs dependencies, builds meshnet (RelWithDebInfo) into build/ and runs
# every test with ctest. Extra arguments go to ctest (e.g. -L unit, -R kv).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j2 --timeout 600 "$@"
