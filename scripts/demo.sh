#!/usr/bin/env bash
# The main job on one machine: install dependencies, build, start a local mesh
# of three `meshnet serve` nodes on 127.0.0.1 (layers 0-1, 2-3 and 4-4 of the
# shipped stories260K model), and generate through it with
# `meshnet generate --nodes`. The nodes are stopped on exit.
#
#   scripts/demo.sh ["prompt"] [extra generate flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
prompt=${1:-Once upon a time}
shift || true

bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target meshnet
bin=build/src/cli/meshnet
model=models/stories260K.gguf

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

addrs=()
for range in 0-1 2-3 4-4; do
  out="$tmp/node-$range.out"
  "$bin" serve --model "$model" --layers "$range" --listen 127.0.0.1:0 --kv-budget 64MiB \
    --threads 1 --log-level warn >"$out" 2>"$tmp/node-$range.err" &
  pids+=($!)
  for _ in $(seq 1 200); do
    if grep -q '^listening on ' "$out" 2>/dev/null; then break; fi
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then cat "$tmp/node-$range.err" >&2; exit 1; fi
    sleep 0.05
  done
  addr=$(sed -n 's/^listening on //p' "$out" | head -n1)
  [[ -n "$addr" ]] || { echo "node $range did not start" >&2; exit 1; }
  echo "node layers $range on $addr" >&2
  addrs+=("$addr")
done

nodes=$(IFS=,; echo "${addrs[*]}")
"$bin" generate --nodes "$nodes" --prompt "$prompt" --max-tokens 64 "$@"
