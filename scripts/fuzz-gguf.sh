#!/usr/bin/env bash
# Builds the GGUF reader's libFuzzer target with clang (-DMESHNET_FUZZ=ON) and
# runs it for a bounded time over the committed seed corpus.
#
#   scripts/fuzz-gguf.sh [SECONDS]        (default 60; or FUZZ_TIME=...)
#
# Environment: BUILD_DIR (default <repo>/build-fuzz), JOBS (default 2).
# New inputs go to $BUILD_DIR/gguf-fuzz-corpus (the committed corpus is only
# read); crashes are written as $BUILD_DIR/gguf-fuzz-crash-* and make the
# script exit non-zero.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-fuzz}"
SECONDS_TO_RUN="${1:-${FUZZ_TIME:-60}}"
JOBS="${JOBS:-2}"
SEEDS="$ROOT/src/gguf/fuzz/corpus"

CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHNET_FUZZ=ON -DMESHNET_BENCH=OFF -DMESHNET_RPC=OFF >/dev/null
cmake --build "$BUILD_DIR" --target gguf_fuzz -j"$JOBS"

WORK="$BUILD_DIR/gguf-fuzz-corpus"
mkdir -p "$WORK"
echo "fuzzing the GGUF reader for ${SECONDS_TO_RUN}s (seeds: $SEEDS)"
"$BUILD_DIR/src/gguf/gguf_fuzz" \
  -max_total_time="$SECONDS_TO_RUN" \
  -max_len=16384 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$BUILD_DIR/gguf-fuzz-crash-" \
  "$WORK" "$SEEDS"
