#!/usr/bin/env python3
"""Runs every case of one llama.cpp tokenizer suite (tests/data/tokenizers) through
`meshnet tokenize --no-bos --output json` and compares the ids with the .out line.
Prints every failing case (input, expected, actual) and exits 1 if any differs.

usage: cli_suite.py MESHNET VOCAB.gguf
"""
import json
import os
import subprocess
import sys
import tempfile

SEP = b"\n__ggml_vocab_test__\n"


def main():
    meshnet, gguf = sys.argv[1], sys.argv[2]
    with open(gguf + ".inp", "rb") as f:
        inp = f.read()
    with open(gguf + ".out", "r", encoding="utf-8") as f:
        want = [[int(x) for x in line.split()] for line in f.read().split("\n")]
    cases = inp.split(SEP)[:-1]  # every case ends with the separator
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "case.txt")
        for i, text in enumerate(cases):
            with open(path, "wb") as f:
                f.write(text)
            run = subprocess.run([meshnet, "tokenize", "--model", gguf, "--file", path,
                                  "--no-bos", "--output", "json"],
                                 capture_output=True, timeout=60)
            if run.returncode != 0:
                failures.append(f"case {i} {text!r}: exit {run.returncode}: {run.stderr!r}")
                continue
            got = json.loads(run.stdout)["ids"]
            if got != want[i]:
                failures.append(f"case {i} {text!r}\n  want: {want[i]}\n  got:  {got}")
    print(f"{os.path.basename(gguf)}: {len(cases) - len(failures)}/{len(cases)} cases match")
    for line in failures:
        print(line)
    return 1 if failures or not cases else 0


if __name__ == "__main__":
    sys.exit(main())
