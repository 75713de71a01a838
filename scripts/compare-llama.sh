#!/usr/bin/env bash
# Same files, same machine, same run: meshnet against llama.cpp's own tools.
#
#   scripts/compare-llama.sh LLAMA_BIN_DIR [TYPES] [SESSIONS]
#
# LLAMA_BIN_DIR holds llama-bench and llama-batched-bench of a llama.cpp built
# from source outside this repository (llama.cpp is not in Debian bookworm).
# TYPES (default q8_0,q4_k,f32): weight types of the 768-dim, 12-layer model
# that `meshnet make-model` writes into a temporary directory (removed at exit).
# SESSIONS (default 1,16): concurrent sequences.
#
# For each type, alternating llama.cpp and meshnet (2 compute threads each):
#   (F16 KV cache on both sides, and room for every session's cache)
#   decode      llama-bench tg64             vs `meshnet generate` of 64 tokens
#                                               (one session, inter-token p50)
#   batched     llama-batched-bench          vs `meshnet generate --sessions N`
#               (16-token prompts, 64 new)      (same prompt length, 64 new),
#               aggregate decode tokens/s: its S_TG (prefill excluded) against
#               N / our inter-token p50 (prefill excluded likewise)
# and prints meshnet / llama.cpp. Run it on a quiet machine: llama.cpp's
# threads spin at barriers, so a busy core distorts its figures far more than
# ours. Absolute figures vary with load; the ratios are what to read.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLAMA="${1:?usage: scripts/compare-llama.sh LLAMA_BIN_DIR [TYPES] [SESSIONS]}"
TYPES="${2:-q8_0,q4_k,f32}"
SESSIONS="${3:-1,16}"
MESHNET="${MESHNET:-$ROOT/build/src/cli/meshnet}"
for tool in llama-bench llama-batched-bench; do
  [[ -x "$LLAMA/$tool" ]] || { echo "compare-llama: no $LLAMA/$tool" >&2; exit 2; }
done
[[ -x "$MESHNET" ]] || { echo "compare-llama: build meshnet first ($MESHNET)" >&2; exit 2; }
export LD_LIBRARY_PATH="$LLAMA${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# 16 tokens with the shipped model's tokenizer (BOS included), as llama-batched-bench's -npp 16.
PROMPT="Once upon a time there was a little girl named Lily. She"

# Prints the aggregate tokens/s (prefill included) of `meshnet generate --sessions N` and its ITL p50 in ms.
meshnet_run() {  # model sessions
  "$MESHNET" generate -m "$1" --shards 1 --threads 2 -n 64 --sessions "$2" -p "$PROMPT" \
    --kv-dtype f16 --kv-budget 1GiB 2>&1 |
    python3 -c '
import re, sys
text = sys.stdin.read()
m = re.search(r"([0-9.]+) tokens/s; .*inter-token p50 ([0-9.]+) ms", text)
if not m:
    sys.exit("compare-llama: unexpected meshnet output:\n" + text[-2000:])
print(m.group(1), m.group(2))'
}

llama_tg() {  # model -> tokens/s of tg64
  "$LLAMA/llama-bench" -m "$1" -t 2 -p 0 -n 64 -r 3 -o json 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}

llama_batched() {  # model sessions -> aggregate generated tokens/s (S_TG)
  "$LLAMA/llama-batched-bench" -m "$1" -t 2 -c 4096 -b 2048 -ub 512 -npp 16 -ntg 64 -npl "$2" 2>&1 |
    python3 -c '
import sys
rows = []  # read all of it: closing the pipe early would kill the tool (pipefail)
for line in sys.stdin:
    cells = [c.strip() for c in line.split("|")]
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    if len(cells) >= 10 and cells[1].isdigit() and cells[3].isdigit():
        rows.append(cells[8])
if not rows:
    sys.exit("compare-llama: no llama-batched-bench result")
print(rows[0])'
}

printf '%-6s %-18s %12s %12s %8s\n' type test llama.cpp meshnet ratio
IFS=, read -ra types <<<"$TYPES"
IFS=, read -ra sessions <<<"$SESSIONS"
for t in "${types[@]}"; do
  model="$WORK/$t.gguf"
  "$MESHNET" make-model --out "$model" --n-embd 768 --n-layers 12 --type "$t" --seed 7 \
    --context 1024 --tokenizer-from "$ROOT/models/stories260K.gguf" >/dev/null
  l=$(llama_tg "$model")
  read -r _ itl <<<"$(meshnet_run "$model" 1)"
  m=$(python3 -c "print(1000.0 / $itl)")
  printf '%-6s %-18s %12.1f %12.1f %7.2fx\n' "$t" "decode tok/s" "$l" "$m" \
    "$(python3 -c "print($m / $l)")"
  for n in "${sessions[@]}"; do
    l=$(llama_batched "$model" "$n")
    read -r _ itl <<<"$(meshnet_run "$model" "$n")"
    m=$(python3 -c "print($n * 1000.0 / $itl)")
    printf '%-6s %-18s %12.1f %12.1f %7.2fx\n' "$t" "$n seq aggregate" "$l" "$m" \
      "$(python3 -c "print($m / $l)")"
  done
done
