#!/usr/bin/env bash
# End-to-end replay throughput: `meshnet kv replay` vs the reference
# seed_replay.py, each as a fresh process on the same decode trace
# (scripts/gen_trace.py --decode 8 1024 --no-resolve: 8 sessions x 1024
# one-token appends, 4 owned layers x 8 KV heads x 64 dims float32).
#
#   bench/replay_bench.sh MESHNET_BINARY [SESSIONS TOKENS]
#
# Prints CPU (user + sys) and wall seconds of both, the ratios, and whether the
# outputs are identical. A fresh process includes first-touch page faults of
# the whole KV pool (see replay_bench.cc for warm, in-process numbers).
# Env: MESHNET_REFERENCE_PYTHON (default /usr/bin/python3), MESHNET_SEED_REPLAY.
set -euo pipefail
meshnet=${1:?usage: replay_bench.sh MESHNET_BINARY [SESSIONS TOKENS]}
sessions=${2:-8}
tokens=${3:-1024}
python=${MESHNET_REFERENCE_PYTHON:-/usr/bin/python3}
reference=${MESHNET_SEED_REPLAY:-$(cd "$(dirname "$0")/.." && pwd)/../shared/seed/seed_replay.py}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 "$root/scripts/gen_trace.py" --decode "$sessions" "$tokens" --no-resolve > "$tmp/trace.jsonl"
echo "trace: $(wc -l < "$tmp/trace.jsonl") ops ($sessions sessions x $tokens one-token appends)"

# cpu_wall IN OUT CMD...: runs CMD < IN > OUT; prints "cpu wall" (seconds).
cpu_wall() {
  local in=$1 out=$2
  shift 2
  /usr/bin/time -f "%U %S %e" -o "$tmp/time" "$@" < "$in" > "$out"
  awk '{printf "%.4f %.4f\n", $1 + $2, $3}' "$tmp/time"
}

best_cpu=1e9 best_wall=1e9
for _ in 1 2 3 4 5; do
  read -r c w < <(cpu_wall "$tmp/trace.jsonl" "$tmp/ours.jsonl" "$meshnet" kv replay)
  best_cpu=$(awk -v a="$best_cpu" -v b="$c" 'BEGIN{print (b < a) ? b : a}')
  best_wall=$(awk -v a="$best_wall" -v b="$w" 'BEGIN{print (b < a) ? b : a}')
done
echo "meshnet kv replay: cpu ${best_cpu} s, wall ${best_wall} s (best of 5 processes)"

if [[ ! -f $reference ]] || ! "$python" -c 'import numpy' 2>/dev/null; then
  echo "reference unavailable ($python with numpy, $reference): no ratio"
  exit 0
fi
read -r rc rw < <(cpu_wall "$tmp/trace.jsonl" "$tmp/ref.jsonl" "$python" "$reference")
echo "seed_replay.py:    cpu ${rc} s, wall ${rw} s (one process)"
awk -v rc="$rc" -v rw="$rw" -v c="$best_cpu" -v w="$best_wall" \
  'BEGIN{printf "ratio: %.1fx cpu, %.1fx wall\n", rc / c, rw / w}'
if cmp -s "$tmp/ours.jsonl" "$tmp/ref.jsonl"; then echo "outputs identical"; else echo "OUTPUTS DIFFER"; exit 1; fi
