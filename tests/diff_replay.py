#!/usr/bin/env python3
"""Differential test: `meshnet kv replay` against the reference on random traces.

    diff_replay.py --meshnet build/src/cli/meshnet [--traces 40] [--seed 1]
                   [--python /usr/bin/python3] [--reference .../seed_replay.py]

Generates --traces random traces with scripts/gen_trace.py (seeds seed ..
seed+traces-1), computes the expected output with the reference replayer
(through tests/ref_replay.py, which answers the lines the reference cannot
parse with invalid-argument as the spec requires), replays each trace with
`meshnet kv replay` through both append paths, and compares line for line. On
a mismatch it prints the op and both answers and keeps the trace in --workdir.

Exits 77 (reported as skipped by ctest) when the reference cannot run: no
interpreter at --python, no numpy in it, or no reference file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))

import gen_trace  # noqa: E402
import ref_replay  # noqa: E402

SKIP = 77


def skip(reason: str) -> int:
    print(f"SKIPPED: {reason}")
    return SKIP


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--meshnet", required=True)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--reference", default=ref_replay.DEFAULT_REFERENCE)
    ap.add_argument("--traces", type=int, default=16)
    ap.add_argument("--time-budget", type=float, default=25.0,
                    help="start no new trace after this many seconds (at least 4 run)")
    ap.add_argument("--ops", type=int, default=250)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("MESHNET_DIFF_SEED", "1")))
    ap.add_argument("--workdir", default=os.path.join(os.getcwd(), "differential"))
    args = ap.parse_args()

    if not os.path.exists(args.python):
        return skip(f"no reference interpreter at {args.python}")
    if not os.path.exists(args.reference):
        return skip(f"no reference replayer at {args.reference}")
    probe = subprocess.run([args.python, "-c", "import numpy"], capture_output=True, check=False)
    if probe.returncode != 0:
        return skip(f"{args.python} has no numpy (apt-get install -y python3-numpy)")

    os.makedirs(args.workdir, exist_ok=True)
    start = time.monotonic()
    failures = 0
    ops = 0
    done = 0
    for seed in range(args.seed, args.seed + args.traces):
        if done >= 4 and time.monotonic() - start > args.time_budget:
            print(f"time budget of {args.time_budget:.0f} s reached after {done} traces")
            break
        done += 1
        trace = gen_trace.generate(seed, args.ops).encode("utf-8")
        lines = [l for l in ref_replay.split_lines(trace) if ref_replay.classify(l) != "blank"]
        ops += len(lines)
        expected = ref_replay.reference_output(trace, args.python, args.reference)
        for path in ("append", "step"):
            proc = subprocess.run([args.meshnet, "kv", "replay", "--append-path", path],
                                  input=trace, capture_output=True, check=False)
            actual = proc.stdout.decode("utf-8", "replace")
            if proc.returncode == 0 and actual == expected:
                continue
            failures += 1
            name = os.path.join(args.workdir, f"seed{seed}.trace.jsonl")
            with open(name, "wb") as f:
                f.write(trace)
            with open(name.replace(".trace.", ".expected."), "w", encoding="utf-8") as f:
                f.write(expected)
            print(f"MISMATCH seed {seed} (--append-path {path}, exit {proc.returncode}); "
                  f"trace kept in {name}")
            if proc.stderr:
                print(proc.stderr.decode("utf-8", "replace"))
            exp, act = expected.split("\n"), actual.split("\n")
            shown = 0
            for i in range(max(len(exp), len(act))):
                e = exp[i] if i < len(exp) else "<none>"
                a = act[i] if i < len(act) else "<none>"
                if e != a and shown < 5:
                    op = lines[i].decode("utf-8", "replace") if i < len(lines) else "<none>"
                    print(f"  op {i + 1}: {op}\n    expected {e}\n    actual   {a}")
                    shown += 1
    elapsed = time.monotonic() - start
    print(f"{done} traces ({ops} ops, seeds {args.seed}..{args.seed + done - 1}) "
          f"x 2 append paths: {failures} mismatches, {elapsed:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
