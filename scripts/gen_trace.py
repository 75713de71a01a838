#!/usr/bin/env python3
"""Random KV traces for `meshnet kv replay` (spec/kv-trace.md). Stdlib only.

    gen_trace.py --seed 7 [--ops 300]          a random trace on stdout
    gen_trace.py --decode 8 1024 [--no-resolve] a decode trace: 8 sessions x 1024
                                                one-token appends, 4 owned layers x
                                                8 KV heads x 64 dims, float32

A random trace covers every op, both dtypes (and numpy aliases of them), TTL
(including advances of exactly ttl and just past it), small budgets, session
caps and miss histories, unicode / blank / control-character / non-str session
ids, op recipes (compatible, aliased, incompatible, invalid), Python typing
corner cases (bool and float epochs, string expected_seq_len, float truncate
lengths, ...), a re-config, and lines the reference cannot parse (invalid JSON,
non-objects, bad "t"; see tests/ref_replay.py for how those are expected).

It avoids inputs on which the reference crashes after touching state or
answers in ways the C++ port documents as divergent: ints beyond int64,
Infinity as a truncate length or append epoch, opening ids with lone
surrogates, block_tokens > 1, numpy dtypes other than float32/float16, and
appends too large to allocate.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

IDS = ["a", "b", "c", "séance-ü", "", "   ", "\u3000", 'q"uo\\te', "tab\tnl\n", "\x00ctl\x1f",
       "emoji😀", "\u2028sep", "del\x7f", "ǅ"]
LONE_SURROGATE_IDS = ["\ud800", "x\udfffy"]  # never opened: the reference cannot print them
NON_STR_IDS = [1, 1.0, True, 0, False, None, 2.5, float("nan"), [1], {"k": 1}]
F32 = ["float32", "float32", "float32", "f4", "<f4", "single"]
F16 = ["float16", "float16", "float16", "f2", "half", "e"]


def _recipe(rng: random.Random) -> dict:
    total = rng.randint(1, 5)
    start = rng.randint(0, total - 1)
    end = rng.randint(start, total - 1)
    return {
        "architecture_adapter": rng.choice(["llama", "llama", "LlamaForCausalLM"]),
        "kv_dtype": rng.choice(F32 if rng.random() < 0.5 else F16),
        "n_kv_heads": rng.randint(1, 3),
        "head_dim": rng.randint(1, 4),
        "total_layers": total,
        "start_layer": start,
        "end_layer": end,
    }


def _itemsize(dtype: str) -> int:
    return 4 if dtype in F32 else 2


def _bytes_per_token(r: dict) -> int:
    return (2 * r["n_kv_heads"] * r["head_dim"] * _itemsize(r["kv_dtype"])
            * (r["end_layer"] - r["start_layer"] + 1))


def _config(rng: random.Random) -> tuple[dict, dict]:
    recipe = _recipe(rng)
    bpt = _bytes_per_token(recipe)
    op: dict = {
        "op": "config",
        "budget_bytes": bpt * rng.randint(2, 24) + rng.choice([0, 0, 0, rng.randint(0, bpt - 1)]),
        "max_sessions": rng.randint(1, 5),
        "ttl_seconds": rng.choice([0, 0.0, 1.0, 2.5, 4.0, 10.0]),
        "miss_history": rng.choice([0, 1, 2, 3, 5, 256]),
        "block_tokens": 1,
        "recipe": recipe,
    }
    r = rng.random()
    if r < 0.06:
        op["budget_bytes"] = op["budget_bytes"] + 0.5  # float budget
    elif r < 0.10:
        op["max_sessions"] = rng.choice([2.5, True])
    elif r < 0.14:
        op["miss_history"] = rng.choice([1.5, True, False])
    elif r < 0.18:
        del op["block_tokens"]
    elif r < 0.21:
        op["block_tokens"] = rng.choice([1.0, True])
    elif r < 0.25:  # Python prints a float bytes_per_token
        recipe["n_kv_heads"] = float(recipe["n_kv_heads"])
    elif r < 0.28:
        recipe["head_dim"] = True
    return op, recipe


def _bad_config(rng: random.Random, good: dict) -> dict:
    op = json.loads(json.dumps(good))
    choice = rng.randrange(9)
    if choice == 0:
        del op["budget_bytes"]
    elif choice == 1:
        op["budget_bytes"] = 0
    elif choice == 2:
        op["max_sessions"] = 0
    elif choice == 3:
        op["ttl_seconds"] = -1
    elif choice == 4:
        op["miss_history"] = "3"
    elif choice == 5:
        op["block_tokens"] = None
    elif choice == 6:
        op["recipe"]["architecture_adapter"] = "mistral"
    elif choice == 7:
        op["recipe"]["end_layer"] = op["recipe"]["total_layers"]
    else:
        op["recipe"] = [1, 2]
    return op


def _op_recipe(rng: random.Random, recipe: dict):
    r = rng.random()
    if r < 0.4:
        return dict(recipe)
    variant = dict(recipe)
    if r < 0.55:  # compatible spellings
        variant["architecture_adapter"] = "LlamaForCausalLM"
        variant["kv_dtype"] = rng.choice(F32 if recipe["kv_dtype"] in F32 else F16)
        variant["boundary_schema_version"] = 7  # ignored by make_recipe
    elif r < 0.75:  # incompatible
        key = rng.choice(["n_kv_heads", "head_dim", "total_layers", "kv_dtype", "types"])
        if key == "kv_dtype":
            variant["kv_dtype"] = "float16" if recipe["kv_dtype"] in F32 else "float32"
        elif key == "total_layers":
            variant["total_layers"] = recipe["total_layers"] + 1
        elif key == "types":  # 1 vs 1.0 vs true print differently in the fingerprint
            variant["n_kv_heads"] = rng.choice([float(recipe["n_kv_heads"]), True, 2.5])
        else:
            variant[key] = recipe[key] + 1
    elif r < 0.9:  # invalid
        key = rng.randrange(5)
        if key == 0:
            del variant["head_dim"]
        elif key == 1:
            variant["n_kv_heads"] = 0
        elif key == 2:
            variant["start_layer"] = -1
        elif key == 3:
            variant["kv_dtype"] = rng.choice(["bogus", "float128x", 5])
        else:
            variant["start_layer"] = True
    else:
        return None
    return variant


class _Gen:
    def __init__(self, seed: int, n_ops: int) -> None:
        self.rng = random.Random(seed)
        self.n_ops = n_ops
        self.lines: list[str] = []
        self.t = 0.0
        self.ids = self.rng.sample(IDS, self.rng.randint(2, 5))
        self.latest: dict[str, int] = {}

    def emit(self, obj, ascii_only: bool | None = None) -> None:
        if ascii_only is None:
            ascii_only = self.rng.random() < 0.2
        self.lines.append(json.dumps(obj, ensure_ascii=ascii_only, separators=(",", ":")
                                     if self.rng.random() < 0.5 else None))

    def session(self, may_be_odd: bool):
        r = self.rng.random()
        if may_be_odd and r < 0.08:
            return self.rng.choice(NON_STR_IDS)
        if may_be_odd and r < 0.11:
            return self.rng.choice(LONE_SURROGATE_IDS)
        return self.rng.choice(self.ids)

    def epoch(self, session, opening: bool):
        """Mostly the session's latest epoch (as a client would send), sometimes a
        newer one (supersession) or an older one (stale), sometimes not an int."""
        r = self.rng.random()
        if r < 0.06:
            return self.rng.choice([-1, True, 1.0, "1", None, [0]])
        latest = self.latest.get(session, 0) if isinstance(session, str) else 0
        if r < (0.30 if opening else 0.14):
            epoch = latest + self.rng.choice([1, 1, 2])
        elif r < (0.36 if opening else 0.22):
            epoch = max(0, latest - 1)
        else:
            epoch = latest
        if opening and isinstance(session, str) and session.strip():
            self.latest[session] = max(latest, epoch)
        return epoch

    def expected(self):
        return self.rng.choice([0, 1, 2, 3, 4, 5, None, 2.0, True, "2", 2.5, [1]])

    def tick(self, op: dict) -> None:
        r = self.rng.random()
        if r < 0.35:
            self.t += self.rng.choice([0.0, 0.25, 0.5, 1.0, 2.5, 2.75, 4.0, 4.25, 10.0, 10.25])
            op["t"] = self.t if self.rng.random() < 0.9 else str(self.t)
        elif r < 0.37:
            self.t = float(int(self.t) + 1)
            op["t"] = int(self.t)

    def weird_line(self) -> None:
        rng = self.rng
        choice = rng.randrange(10)
        if choice == 0:
            self.lines.append('{"op":"open","session":"a"')  # invalid JSON
        elif choice == 1:
            self.lines.append(rng.choice(["[1,2]", "7", '"stats"', "null"]))  # not an object
        elif choice == 2:
            self.lines.append(rng.choice(["", "   ", "\t", "\u3000 \u00a0"]))  # blank
        elif choice == 3:
            self.lines.append(json.dumps({"op": "stats", "t": rng.choice([None, "soon", [1]])}))
        elif choice == 4:
            self.lines.append(json.dumps({"op": rng.choice(["nope", "Config", 5, None])}))
        elif choice == 5:
            self.lines.append('{"op":"open","session":"a","session":"b","epoch":0}')  # dup key
        elif choice == 6:
            self.lines.append('{"op":"stats","x":NaN,"y":-Infinity,"z":1e999}')
        elif choice == 7:
            self.lines.append("{'op':'stats'}")
        elif choice == 8:
            self.lines.append('{"op":"resolve","session":"\\u0061","epoch":0}')
        else:
            self.lines.append('{"op":"stats"} {"op":"stats"}')

    def op(self, recipe: dict) -> None:
        rng = self.rng
        kind = rng.choices(
            ["open", "append", "resolve", "get", "truncate", "release", "stats", "weird",
             "missing"],
            weights=[16, 30, 14, 7, 8, 8, 7, 6, 4])[0]
        if kind == "weird":
            return self.weird_line()
        if kind == "missing":
            op = {"op": rng.choice(["open", "append", "truncate", "release", "resolve", "get"]),
                  "session": self.session(False), "epoch": 0, "tokens": 1, "length": 1}
            del op[rng.choice(["session", "epoch", "tokens", "length"])]
            return self.emit(op)
        op: dict = {"op": kind}
        self.tick(op)
        if kind == "stats":
            return self.emit(op)
        opened = kind == "open"
        op["session"] = self.session(not opened)
        if opened and rng.random() < 0.05:
            op["session"] = rng.choice(NON_STR_IDS[:3])  # invalid for open
        op["epoch"] = self.epoch(op["session"], opened)
        if kind in ("open", "append", "resolve", "get") and rng.random() < 0.25:
            op["recipe"] = _op_recipe(rng, recipe)
        if kind in ("append", "resolve", "get") and rng.random() < 0.45:
            op["expected_seq_len"] = self.expected()
        if kind == "append":
            r = rng.random()
            op["tokens"] = (rng.choice([-1, True, 1.5, "2", None]) if r < 0.05 else
                            rng.randint(5, 40) if r < 0.15 else rng.randint(0, 3))
        if kind == "truncate":
            op["length"] = rng.choice([0, 1, 2, 3, 5, 9, -1, 2.5, -0.5, -0.0, "1", True, None,
                                       1e300, float("nan")])
        lone = isinstance(op["session"], str) and any(0xD800 <= ord(c) <= 0xDFFF
                                                      for c in op["session"])
        self.emit(op, ascii_only=True if lone else None)

    def run(self) -> list[str]:
        rng = self.rng
        if rng.random() < 0.1:
            self.emit({"op": "stats"})  # before any config: invalid-argument
        config, recipe = _config(rng)
        if rng.random() < 0.15:
            self.emit(_bad_config(rng, config))
        self.emit(config)
        reconfig_at = rng.randrange(self.n_ops) if rng.random() < 0.3 else -1
        for i in range(self.n_ops):
            if i == reconfig_at:
                if rng.random() < 0.4:
                    self.emit(_bad_config(rng, config))  # keeps the old manager
                else:
                    config, recipe = _config(rng)
                    self.emit(config)
                    self.latest.clear()
            self.op(recipe)
        return self.lines


def generate(seed: int, n_ops: int = 250) -> str:
    """A random trace (text, '\\n'-terminated lines)."""
    return "\n".join(_Gen(seed, n_ops).run()) + "\n"


def decode_trace(sessions: int = 8, tokens: int = 1024, layers: int = 4, heads: int = 8,
                 dim: int = 64, resolve: bool = True) -> str:
    """Prefill-free decode: open `sessions`, then `tokens` rounds of one-token appends
    (each with expected_seq_len), then (if `resolve`) resolve every session, then stats."""
    recipe = {"architecture_adapter": "llama", "kv_dtype": "float32", "n_kv_heads": heads,
              "head_dim": dim, "total_layers": 32, "start_layer": 0, "end_layer": layers - 1}
    bpt = 2 * heads * dim * 4 * layers
    lines = [json.dumps({"op": "config", "budget_bytes": bpt * sessions * tokens,
                         "max_sessions": sessions, "ttl_seconds": 0.0, "miss_history": 256,
                         "block_tokens": 1, "recipe": recipe}, separators=(",", ":"))]
    ids = [f"decode-{i}" for i in range(sessions)]
    for s in ids:
        lines.append(json.dumps({"op": "open", "t": 0.0, "session": s, "epoch": 0},
                                separators=(",", ":")))
    for pos in range(tokens):
        for s in ids:
            lines.append(json.dumps({"op": "append", "session": s, "epoch": 0, "tokens": 1,
                                     "expected_seq_len": pos}, separators=(",", ":")))
    for s in ids if resolve else []:
        lines.append(json.dumps({"op": "resolve", "session": s, "epoch": 0,
                                 "expected_seq_len": tokens}, separators=(",", ":")))
    lines.append('{"op":"stats"}')
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", type=int, default=250)
    ap.add_argument("--decode", nargs=2, type=int, metavar=("SESSIONS", "TOKENS"))
    ap.add_argument("--no-resolve", action="store_true",
                    help="decode trace without the final resolves (no checksums)")
    args = ap.parse_args()
    sys.stdout.reconfigure(encoding="utf-8", newline="\n")
    if args.decode:
        sys.stdout.write(decode_trace(*args.decode, resolve=not args.no_resolve))
    else:
        sys.stdout.write(generate(args.seed, args.ops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
