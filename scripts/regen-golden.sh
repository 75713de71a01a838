#!/usr/bin/env bash
# Regenerates tests/golden/*.expected.jsonl from the reference replayer.
#
#   scripts/regen-golden.sh [--check] [--reference PATH] [--python PATH] [NAME...]
#
# Each expected output is produced by the reference seed_replay.py through
# tests/ref_replay.py: the reference answers every op; the lines it cannot even
# parse (invalid UTF-8 or JSON, a non-object, a "t" that float() refuses; on
# those seed_replay.py dies before touching any state) are answered with
# {"error":"invalid-argument"}, as spec/kv-trace.md requires. quant_* goldens
# go through tests/quant_ref_replay.py (the reference's answers mapped to
# meshnet's q8_0 / q4_0 byte counts and rows). The traces
# themselves are committed as they are (random_seed*.trace.jsonl and
# decode_small.trace.jsonl were written by scripts/gen_trace.py).
#
#   --check       regenerate into a temporary directory and fail if any
#                 committed expected output differs (nothing is written)
#   --reference   seed_replay.py (default $MESHNET_SEED_REPLAY or
#                 ../shared/seed/seed_replay.py beside the repository)
#   --python      interpreter with numpy (default $MESHNET_REFERENCE_PYTHON or /usr/bin/python3)
#   NAME...       only these goldens (e.g. ttl unicode); default all
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
golden="$root/tests/golden"
reference=${MESHNET_SEED_REPLAY:-$(cd "$(dirname "$0")/.." && pwd)/../shared/seed/seed_replay.py}
python=${MESHNET_REFERENCE_PYTHON:-/usr/bin/python3}
check=0
names=()
while (($#)); do
  case "$1" in
    --check) check=1 ;;
    --reference) reference=$2; shift ;;
    --python) python=$2; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    -*) echo "regen-golden: unknown option $1" >&2; exit 2 ;;
    *) names+=("$1") ;;
  esac
  shift
done
[[ -f $reference ]] || { echo "regen-golden: no reference at $reference" >&2; exit 2; }
"$python" -c 'import numpy' 2>/dev/null ||
  { echo "regen-golden: $python cannot import numpy (apt-get install -y python3-numpy)" >&2; exit 2; }
if ((${#names[@]} == 0)); then
  for t in "$golden"/*.trace.jsonl; do names+=("$(basename "$t" .trace.jsonl)"); done
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for name in "${names[@]}"; do
  trace="$golden/$name.trace.jsonl"
  [[ -f $trace ]] || { echo "regen-golden: no $trace" >&2; exit 2; }
  # quant_* goldens use meshnet's q8_0 / q4_0 KV dtypes, which the reference
  # does not know: their answers are the reference's, mapped to the quantized
  # byte counts and rows (tests/quant_ref_replay.py; needs numpy here too).
  oracle="$root/tests/ref_replay.py" oracle_python=python3
  [[ $name == quant_* ]] && oracle="$root/tests/quant_ref_replay.py" oracle_python=$python
  "$oracle_python" "$oracle" --python "$python" --reference "$reference" \
    < "$trace" > "$tmp/$name.expected.jsonl"
  if ((check)); then
    if ! cmp -s "$tmp/$name.expected.jsonl" "$golden/$name.expected.jsonl"; then
      echo "regen-golden: $name.expected.jsonl is out of date" >&2
      diff -u "$golden/$name.expected.jsonl" "$tmp/$name.expected.jsonl" | head -20 >&2 || true
      status=1
    fi
  else
    mv "$tmp/$name.expected.jsonl" "$golden/$name.expected.jsonl"
    echo "regen-golden: $name ($(wc -l < "$golden/$name.expected.jsonl") results)"
  fi
done
exit $status
