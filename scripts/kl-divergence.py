#!/usr/bin/env python3
"""KL divergence between two `meshnet generate --dump-logits` files.

    scripts/kl-divergence.py BASE.jsonl TEST.jsonl [--skip N]

Each file holds one JSON array of logits per line (one generation step). With
the same prompt and `--force-file` (teacher forcing) both runs see the same
tokens, so line i of each is the next-token distribution at the same
position. Prints the positions compared, the mean and the largest
KL(base || test) (natural log, in double) and how often the argmax agrees.
`--skip N` leaves out the first N positions. Stdlib only.
"""

import argparse
import json
import math
import sys


def log_softmax(logits):
    mx = max(logits)
    lse = mx + math.log(sum(math.exp(x - mx) for x in logits))
    return [x - lse for x in logits]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("test")
    ap.add_argument("--skip", type=int, default=0)
    args = ap.parse_args()
    with open(args.base) as fb, open(args.test) as ft:
        base = [json.loads(line) for line in fb if line.strip()]
        test = [json.loads(line) for line in ft if line.strip()]
    if len(base) != len(test):
        print(f"kl-divergence: {len(base)} positions against {len(test)}", file=sys.stderr)
        return 2
    kls, same = [], 0
    for b, t in list(zip(base, test))[args.skip:]:
        p, q = log_softmax(b), log_softmax(t)
        kls.append(max(0.0, sum(math.exp(pi) * (pi - qi) for pi, qi in zip(p, q))))
        same += b.index(max(b)) == t.index(max(t))
    if not kls:
        print("kl-divergence: no positions to compare", file=sys.stderr)
        return 2
    print(f"positions {len(kls)}  mean KLD {sum(kls) / len(kls):.6g}  max KLD {max(kls):.6g}  "
          f"same top {100.0 * same / len(kls):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
