#!/usr/bin/env python3
"""Expected output of a KV trace with q8_0 / q4_0 recipes (meshnet's KV dtypes
that the reference does not know), derived from the reference replayer.

    quant_ref_replay.py [--python /usr/bin/python3] [--reference seed_replay.py] < trace > expected

The reference semantics stand for every op; only the byte counts and the row
values change with the dtype. So the trace goes to the reference (through
ref_replay.py) with each q8_0 / q4_0 recipe turned into a float32 one, and the
answers are then mapped back:

* budget: with integer token counts, T * bpt_q > B  <=>  T * bpt_f > B' for
  B' = floor(B / bpt_q) * bpt_f (bpt: bytes per token of the quantized recipe
  and of its float32 twin), so every budget check and LRU eviction of the
  float32 run is the quantized one's; config's budget_bytes becomes B';
* an op recipe is compatible iff its own (quantized) fingerprint equals the
  config's; an incompatible one is sent with total_layers + 1000 (still valid,
  never compatible);
* config answers the quantized recipe's fingerprint (kv_dtype "q8_0" or
  "q4_0" in the canonical JSON) and bpt_q; stats' total_bytes is
  total_f / bpt_f * bpt_q;
* resolve / get checksums: a live context's rows are the spec's K/V at
  positions 0..seq_len-1 (appends write at seq_len, truncate keeps a prefix),
  so they are recomputed here: the float32 values quantized per head as
  ops/kv_quant.h states (numpy float32 arithmetic, round to nearest even) and
  dequantized;
* a q8_0 / q4_0 recipe with non-int n_kv_heads or head_dim is
  invalid-argument (meshnet's rule for its own dtypes) and not sent.

Supports the plain traces the quant goldens use: str sessions, int epochs,
int geometry. Needs numpy (as the reference does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_replay  # noqa: E402

QUANT = ("q8_0", "q4_0")
INVALID = '{"error":"invalid-argument"}'


def head_bytes(dtype: str, head_dim: int) -> int:
    blocks = (head_dim + 31) // 32
    if dtype == "q8_0":
        return 2 * blocks + head_dim
    tail = head_dim % 32
    return 2 * blocks + (head_dim - tail) // 2 + (tail + 1) // 2


def bytes_per_token(r: dict) -> int:
    layers = r["end_layer"] - r["start_layer"] + 1
    if r["kv_dtype"] in QUANT:
        return 2 * r["n_kv_heads"] * head_bytes(r["kv_dtype"], r["head_dim"]) * layers
    return 2 * r["n_kv_heads"] * r["head_dim"] * 4 * layers


def fingerprint(r: dict) -> str:
    arch = "llama" if r["architecture_adapter"] in ("llama", "LlamaForCausalLM") else "?"
    canonical = {"architecture_adapter": arch, "boundary_schema_version": 1,
                 "end_layer": r["end_layer"], "head_dim": r["head_dim"], "kind": "hot-kv-recipe",
                 "kv_dtype": r["kv_dtype"], "n_kv_heads": r["n_kv_heads"],
                 "start_layer": r["start_layer"], "total_layers": r["total_layers"]}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True,
                                     separators=(",", ":")).encode()).hexdigest()


def fnv1a32(text: str) -> int:
    h = 0x811C9DC5
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def quantize_dequantize(x: np.ndarray, dtype: str) -> np.ndarray:
    """One head (float32 values), blockwise as ops/kv_quant.h."""
    out = np.empty_like(x)
    for b0 in range(0, x.size, 32):
        blk = x[b0:b0 + 32]
        if dtype == "q8_0":
            amax = np.float32(np.max(np.abs(blk)))
            d = np.float16(amax / np.float32(127))
            inv = np.float32(127) / amax if amax != 0 else np.float32(0)
            codes = np.clip(np.rint(blk * inv), -127, 127)
        else:
            mx = max(np.float32(0), np.max(blk))
            mn = min(np.float32(0), np.min(blk))
            m = mn if -mn > mx else mx
            d = np.float16(m / np.float32(-8)) if m != 0 else np.float16(0)
            inv = np.float32(-8) / m if m != 0 else np.float32(0)
            codes = np.clip(np.rint(blk * inv) + 8, 0, 15) - 8
        # The codes are integers (no -0): value = float(code) * d, as in C++.
        out[b0:b0 + 32] = codes.astype(np.int32).astype(np.float32) * np.float32(d)
    return out


def quant_checksum(r: dict, session: str, epoch: int, seq_len: int) -> str:
    digest = hashlib.sha256()
    heads, dim = r["n_kv_heads"], r["head_dim"]
    for layer in range(r["start_layer"], r["end_layer"] + 1):
        p = np.arange(seq_len, dtype=np.int64)[:, None, None]
        h = np.arange(heads, dtype=np.int64)[None, :, None]
        d = np.arange(dim, dtype=np.int64)[None, None, :]
        raw = (fnv1a32(session) + 31 * epoch + 131 * layer + 17 * p + 7 * h + d) % 1000
        k = (raw.astype(np.float64) / 1000.0).astype(np.float32)
        for values in (k, -k):
            rows = values.reshape(-1, dim)
            q = np.stack([quantize_dequantize(row, r["kv_dtype"]) for row in rows]) if seq_len else rows
            digest.update(np.ascontiguousarray(q, dtype="<f4").tobytes())
    return digest.hexdigest()[:16]


def int_geometry(r: dict) -> bool:
    return all(type(r[k]) is int for k in ("n_kv_heads", "head_dim"))


def transform(ops: list[dict]) -> tuple[list[str | None], list[dict | None]]:
    """The float32 trace (None: answered here) and the quantized config per op."""
    sent, configs, config = [], [], None
    for op in ops:
        op = json.loads(json.dumps(op))
        r = op.get("recipe")
        quant = isinstance(r, dict) and r.get("kv_dtype") in QUANT
        if op.get("op") == "config":
            if quant and not int_geometry(r):
                sent.append(None)
                configs.append(None)
                continue
            if quant:
                twin = dict(r, kv_dtype="float32")
                op["budget_bytes"] = op["budget_bytes"] // bytes_per_token(r) * bytes_per_token(twin)
                op["recipe"] = twin
                config = r
            else:
                config = None
        elif isinstance(r, dict) and (quant or config is not None):
            if quant and not int_geometry(r):
                sent.append(None)
                configs.append(None)
                continue
            same = config is not None and fingerprint(r) == fingerprint(config)
            twin = dict(r, kv_dtype="float32")
            if not same:
                twin["total_layers"] = r["total_layers"] + 1000
            op["recipe"] = twin
        sent.append(json.dumps(op, ensure_ascii=False))
        configs.append(config)
    return sent, configs


def map_back(op: dict, answer: str, config: dict | None) -> str:
    if config is None:
        return answer
    a = json.loads(answer)
    if not a.get("ok"):
        return answer
    kind = op.get("op")
    bpt_q = bytes_per_token(config)
    bpt_f = bytes_per_token(dict(config, kv_dtype="float32"))
    if kind == "config":
        a["fingerprint"] = fingerprint(config)
        a["bytes_per_token"] = bpt_q
    elif kind == "stats":
        a["total_bytes"] = a["total_bytes"] // bpt_f * bpt_q
    elif kind in ("resolve", "get") and "checksum" in a:
        a["checksum"] = quant_checksum(config, op["session"], op["epoch"], a["seq_len"])
    return json.dumps(a, separators=(",", ":"), ensure_ascii=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--reference", default=os.environ.get("MESHNET_SEED_REPLAY",
                                                          ref_replay.DEFAULT_REFERENCE))
    args = ap.parse_args()
    lines = [line for line in sys.stdin.read().split("\n") if line.strip()]
    ops = [json.loads(line) for line in lines]
    sent, configs = transform(ops)
    fed = "".join(s + "\n" for s in sent if s is not None).encode("utf-8")
    try:
        answers = iter(ref_replay.reference_output(fed, args.python, args.reference).split("\n"))
    except RuntimeError as e:
        print(f"quant_ref_replay: {e}", file=sys.stderr)
        return 1
    out = []
    for op, s, config in zip(ops, sent, configs):
        out.append(INVALID if s is None else map_back(op, next(answers), config))
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
