#!/usr/bin/env python3
"""Expected output of a KV trace, produced by the reference replayer.

    ref_replay.py [--python /usr/bin/python3] [--reference seed_replay.py] < trace > expected

seed_replay.py dies (uncaught exception, no further output) on a line that is
not valid UTF-8 or JSON, whose JSON value is not an object, or whose "t"
float() refuses. The spec (spec/kv-trace.md) instead requires
{"error":"invalid-argument"} for such a line and that the replay goes on. All
of these fail before the reference touches any state (the clock included), so
the expected output of a trace is: the reference's output for the trace without
those lines, with {"error":"invalid-argument"} spliced in at their positions.
This script finds those lines exactly as seed_replay.py would reach them
(text-mode line splitting, `line.strip()`, json.loads, `float(op["t"])`) and
does the splicing; every other line is answered by the reference itself.
Stdlib only (the reference's interpreter needs numpy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

INVALID = '{"error":"invalid-argument"}'
DEFAULT_REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "seed", "seed_replay.py")


def split_lines(data: bytes) -> list[bytes]:
    """Lines as Python's text mode yields them (\\n, \\r\\n and \\r end a line)."""
    lines, cur, i, n = [], bytearray(), 0, len(data)
    while i < n:
        c = data[i]
        if c == 0x0A or c == 0x0D:
            lines.append(bytes(cur))
            cur = bytearray()
            if c == 0x0D and i + 1 < n and data[i + 1] == 0x0A:
                i += 1
        else:
            cur.append(c)
        i += 1
    if cur:
        lines.append(bytes(cur))
    return lines


def classify(raw: bytes) -> str:
    """'blank', 'crash' (the reference dies before any state) or 'op'."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "crash"
    if not line.strip():
        return "blank"
    try:
        op = json.loads(line)
    except (ValueError, RecursionError):
        return "crash"
    if not isinstance(op, dict):
        return "crash"  # `"t" in op` / op.get(...) raise outside the try
    if "t" in op:
        try:
            float(op["t"])
        except (TypeError, ValueError, OverflowError):
            return "crash"
    return "op"


def reference_output(trace: bytes, python: str, reference: str) -> str:
    lines = split_lines(trace)
    kinds = [classify(line) for line in lines]
    fed = b"".join(line + b"\n" for line, k in zip(lines, kinds) if k == "op")
    proc = subprocess.run([python, reference], input=fed, capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"reference failed ({proc.returncode}):\n"
                           f"{proc.stderr.decode('utf-8', 'replace')}")
    # split("\n"), not splitlines(): ids may hold U+2028 or U+0085 raw.
    answers = proc.stdout.decode("utf-8").split("\n")
    if answers and answers[-1] == "":
        answers.pop()
    if len(answers) != kinds.count("op"):
        raise RuntimeError(f"reference gave {len(answers)} lines for {kinds.count('op')} ops")
    out, it = [], iter(answers)
    for k in kinds:
        if k == "op":
            out.append(next(it))
        elif k == "crash":
            out.append(INVALID)
    return "".join(line + "\n" for line in out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--reference", default=os.environ.get("MESHNET_SEED_REPLAY",
                                                          DEFAULT_REFERENCE))
    args = ap.parse_args()
    try:
        text = reference_output(sys.stdin.buffer.read(), args.python, args.reference)
    except RuntimeError as e:
        print(f"ref_replay: {e}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(text.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
