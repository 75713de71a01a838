#!/usr/bin/env bash
# The main job on one machine: install dependencies, build, start a node
# registry (`meshnet registry`) and a local mesh of three `meshnet serve` nodes
# on 127.0.0.1 that announce themselves to it (layers 0-1, 2-3 and 4-4 of the
# shipped stories260K model), show `meshnet status`, generate through the mesh
# with `meshnet generate --registry` (the client knows only the registry), then
# start the OpenAI-compatible API (`meshnet api --registry`) in front of the
# same nodes and stream a chat answer with curl. Everything is stopped on exit;
# with MESHNET_DEMO_SERVE=1 the API stays up (chat page at its address) until
# Ctrl-C.
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

# wait_line FILE PREFIX PID: the rest of FILE's first line starting with PREFIX.
wait_line() {
  for _ in $(seq 1 200); do
    if grep -q "^$2" "$1" 2>/dev/null; then break; fi
    if ! kill -0 "$3" 2>/dev/null; then cat "${1%.out}.err" >&2; exit 1; fi
    sleep 0.05
  done
  sed -n "s/^$2//p" "$1" | head -n1
}

"$bin" registry --listen 127.0.0.1:0 >"$tmp/registry.out" 2>"$tmp/registry.err" &
pids+=($!)
registry=$(wait_line "$tmp/registry.out" "registry on " "${pids[-1]}")
[[ -n "$registry" ]] || { echo "meshnet registry did not start" >&2; exit 1; }
echo "registry on $registry" >&2

for range in 0-1 2-3 4-4; do
  out="$tmp/node-$range.out"
  "$bin" serve --model "$model" --layers "$range" --listen 127.0.0.1:0 --kv-budget 64MiB \
    --threads 1 --log-level warn --registry "$registry" >"$out" 2>"$tmp/node-$range.err" &
  pids+=($!)
  addr=$(wait_line "$out" "listening on " "${pids[-1]}")
  [[ -n "$addr" ]] || { echo "node $range did not start" >&2; exit 1; }
  echo "node layers $range on $addr" >&2
done
# Announcements are asynchronous: wait until the registry lists all three.
for _ in $(seq 1 200); do
  n=$("$bin" status --registry "$registry" --output json | grep -o '"address"' | wc -l)
  [[ "$n" -ge 3 ]] && break
  sleep 0.05
done
"$bin" status --registry "$registry" >&2

"$bin" generate --registry "$registry" --prompt "$prompt" --max-tokens 64 "$@"

# The API in front of the same nodes.
"$bin" api --registry "$registry" --listen "${MESHNET_API_LISTEN:-127.0.0.1:0}" \
  >"$tmp/api.out" 2>"$tmp/api.err" &
pids+=($!)
api=$(wait_line "$tmp/api.out" "listening on " "${pids[-1]}")
[[ -n "$api" ]] || { echo "meshnet api did not start" >&2; exit 1; }
echo "meshnet api on http://$api (chat page at /)" >&2
escaped=$(printf '%s' "$prompt" | sed 's/\\/\\\\/g; s/"/\\"/g')
body=$(printf '{"model":"stories260K","messages":[{"role":"user","content":"%s"}],"max_tokens":48,"temperature":0,"stream":true}' "$escaped")
echo "\$ curl -N http://$api/v1/chat/completions -H 'Content-Type: application/json' -d '$body'" >&2
curl -sS -N "http://$api/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" |
  tee "$tmp/sse.txt"
printf 'streamed answer: '
python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.startswith("data: {"):
        c = json.loads(l[6:])["choices"]
        sys.stdout.write(c[0]["delta"].get("content", "") if c else "")
print()' "$tmp/sse.txt"
if [[ "${MESHNET_DEMO_SERVE:-0}" == 1 ]]; then
  echo "serving http://$api until Ctrl-C" >&2
  wait "${pids[-1]}"
fi
