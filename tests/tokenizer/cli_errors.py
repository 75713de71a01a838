#!/usr/bin/env python3
"""`meshnet tokenize` on malformed tokenizer GGUFs and awkward input:

  - a copy of the GPT-2 vocab GGUF with one tokenizer field broken in place
    (unsupported pre, a merge without its space, BOS id out of range, an
    unknown token type) is refused with exit code 2 and a message naming it;
  - invalid UTF-8 in a prompt file tokenizes like U+FFFD per bad byte
    (llama.cpp), exit 0.

usage: cli_errors.py MESHNET VOCAB.gguf WORKDIR
"""
import json
import os
import struct
import subprocess
import sys


def field_offset(buf, key):
    """Offset of the value type id of metadata `key` (GGUF: u64 len, key, u32 type)."""
    k = key.encode()
    at = buf.find(struct.pack("<Q", len(k)) + k)
    assert at >= 0, key
    return at + 8 + len(k)


def patched(buf, key, edit):
    b = bytearray(buf)
    edit(b, field_offset(buf, key) + 4)  # just past the type id
    return bytes(b)


def set_pre(b, at):  # string: u64 len, bytes ("gpt-2" -> "gpt-X")
    n = struct.unpack_from("<Q", b, at)[0]
    b[at + 8 + n - 1] = ord("X")


def break_first_merge(b, at):  # array: u32 elem type, u64 count, then u64 len + bytes
    n = struct.unpack_from("<Q", b, at + 12)[0]
    first = b[at + 20:at + 20 + n]
    space = first.index(b" ", 1)
    b[at + 20 + space] = ord("_")


def bos_out_of_range(b, at):
    struct.pack_into("<I", b, at, 1 << 24)


def bad_token_type(b, at):  # array of i32: elem type, count, values
    struct.pack_into("<i", b, at + 12 + 4 * 5, 42)


CASES = [
    ("tokenizer.ggml.pre", set_pre, "'gpt-X' is not supported"),
    ("tokenizer.ggml.merges", break_first_merge, "merge 0"),
    ("tokenizer.ggml.bos_token_id", bos_out_of_range, "tokenizer.ggml.bos_token_id"),
    ("tokenizer.ggml.token_type", bad_token_type, "token 5 has unknown type 42"),
]


def tokenize(meshnet, model, path):
    return subprocess.run([meshnet, "tokenize", "--model", model, "--file", path, "--no-bos",
                           "--output", "json"], capture_output=True, timeout=60)


def main():
    meshnet, vocab, workdir = sys.argv[1:4]
    os.makedirs(workdir, exist_ok=True)
    with open(vocab, "rb") as f:
        buf = f.read()
    text = os.path.join(workdir, "text.txt")
    with open(text, "wb") as f:
        f.write(b"Hello")
    failures = []
    for key, edit, mention in CASES:
        path = os.path.join(workdir, key.replace(".", "_") + ".gguf")
        with open(path, "wb") as f:
            f.write(patched(buf, key, edit))
        r = tokenize(meshnet, path, text)
        err = r.stderr.decode(errors="replace")
        if r.returncode != 2 or not err.startswith("meshnet: error: ") or mention not in err:
            failures.append(f"{key}: exit {r.returncode}, stderr {err!r} (want 2, {mention!r})")
    # Invalid UTF-8: each bad byte is tokenized as U+FFFD.
    for raw, same in [(b"a\xffb", "a\ufffdb"), (b"x\xe2\x82", "x\ufffd\ufffd"),
                      (b"\x80\xc3", "\ufffd\ufffd")]:
        with open(text, "wb") as f:
            f.write(raw)
        r1 = tokenize(meshnet, vocab, text)
        with open(text, "wb") as f:
            f.write(same.encode())
        r2 = tokenize(meshnet, vocab, text)
        if r1.returncode != 0 or json.loads(r1.stdout) != json.loads(r2.stdout):
            failures.append(f"invalid UTF-8 {raw!r}: exit {r1.returncode}, {r1.stdout!r} vs "
                            f"{r2.stdout!r}")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(CASES) + 3 - len(failures)}/{len(CASES) + 3} checks pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
