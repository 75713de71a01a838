#!/usr/bin/python3
"""Differential tokenizer cases: random and adversarial texts for every vocabulary in
tests/data/tokenizers, tokenized by llama.cpp's llama-tokenize (built elsewhere; this script
only runs it), written next to each vocabulary as

  ggml-vocab-NAME.gguf.fuzz.inp  the texts, raw bytes, each followed by "\\n__ggml_vocab_test__\\n"
  ggml-vocab-NAME.gguf.fuzz.out  three lines per text: the ids without special tokens and
                                 without parsing control tokens (llama-tokenize --no-bos
                                 --no-parse-special), with parsing (--no-bos), and with
                                 the model's BOS/EOS and parsing (llama-tokenize's defaults)

  gen-tokenizer-cases.py --llama-tokenize PATH [--seed N] [--count N] [DATA_DIR]

The texts mix scripts (Latin, Cyrillic, Greek, CJK, Arabic, Devanagari, Thai, emoji with
ZWJ sequences, combining marks), long digit runs, whitespace runs (tabs, CR/LF, NBSP,
ideographic space), code, broken UTF-8, and the vocabulary's own control and user-defined
tokens (whole, split, nested, surrounded by whitespace) in plain text.
"""
import argparse
import pathlib
import random
import struct
import subprocess
import tempfile

SEPARATOR = b"\n__ggml_vocab_test__\n"


def read_vocab(path):
    """The tokens and token types of a GGUF file (a minimal reader of its key/values)."""
    data = pathlib.Path(path).read_bytes()
    pos = 24  # magic, version, tensor count
    (kv_count,) = struct.unpack_from("<Q", data, 16)
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def string(p):
        (n,) = struct.unpack_from("<Q", data, p)
        return data[p + 8:p + 8 + n], p + 8 + n

    def value(kind, p):
        if kind == 8:
            return string(p)
        if kind == 9:
            elem, n = struct.unpack_from("<IQ", data, p)
            p += 12
            items = []
            for _ in range(n):
                v, p = value(elem, p)
                items.append(v)
            return items, p
        fmt = "<" + scalar[kind]
        return struct.unpack_from(fmt, data, p)[0], p + struct.calcsize(fmt)

    fields = {}
    for _ in range(kv_count):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", data, pos)
        fields[key.decode()], pos = value(kind, pos + 4)
    return fields["tokenizer.ggml.tokens"], fields.get("tokenizer.ggml.token_type", [])


SCRIPTS = ["hello", "Tokenizer", "naïve façade", "привет мир", "καλημέρα κόσμε", "東京都の天気",
           "ひらがなカタカナ", "안녕하세요", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีครับ",
           "🦙", "👩‍👩‍👧‍👦", "🇯🇵🇫🇷", "e\u0301a\u0308", "\u200b", "\ufeff", "\u202e", "ǅ", "ﬁ",
           "Ⅻ", "①②", "𝔘𝔫𝔦", "ß", "İ", "I'm", "don't", "'s", "'LL"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", "\u00a0", "\u3000", "\u2028", " \t \n"]
CODE = ["def f(x):\n    return x**2", "<div class=\"a\">", "a->b", "!!!", "...", "''", '""',
        "`x`", "{}[]()", "i++;", "#include <x>", "$HOME", "1+1=2", "a_b-c.d", "\\n", "http://a.b/c?d=e"]
SPECIALS = ["<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|user|>",
            "<|assistant|>", "<|system|>", "<|end|>", "<0x41>", "<|EOT|>", "<mask>", "<pad>"]


def digits(rng):
    n = rng.choice([1, 2, 3, 4, 5, 7, 12, 20, 33, 64, 150])
    run = "".join(rng.choice("0123456789") for _ in range(n))
    return rng.choice(["", " ", "$", "v", "x="]) + run + rng.choice(["", ".5", ",000", " ", "th"])


def special_piece(rng, specials):
    tok = rng.choice(specials)
    form = rng.randrange(7)
    if form == 0:  # split in two
        cut = rng.randrange(1, max(2, len(tok)))
        return tok[:cut] + rng.choice(["", " "]) + tok[cut:]
    if form == 1:  # nested or doubled
        return tok[:1] + tok + tok[1:] if len(tok) > 2 else tok + tok
    if form == 2:  # surrounded by whitespace runs (llama.cpp strips around some tokens)
        return rng.choice(SPACES) + tok + rng.choice(SPACES)
    return tok


def piece(rng, specials):
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice(SCRIPTS)
    if kind == 1:
        return digits(rng)
    if kind == 2:
        return rng.choice(SPACES) * rng.choice([1, 1, 2, 5, 17])
    if kind == 3:
        return rng.choice(CODE)
    if kind == 4:
        return special_piece(rng, specials)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in
                   range(rng.randrange(1, 12)))


def text(rng, specials):
    out = "".join(piece(rng, specials) for _ in range(rng.randrange(1, 9))).encode()
    if rng.randrange(12) == 0:  # broken UTF-8: a stray byte or a cut sequence
        at = rng.randrange(len(out) + 1)
        out = out[:at] + rng.choice([b"\xff", b"\xe6\x97", b"\xc3", b"\x80\x80"]) + out[at:]
    if rng.randrange(15) == 0:  # long
        out = out * rng.randrange(20, 120)
    return out


def tokenize(binary, vocab, data, flags):
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        out = subprocess.run([binary, "-m", str(vocab), "-f", f.name, "--ids", "--no-escape",
                              "--log-disable"] + flags, check=True, capture_output=True).stdout
    line = out.decode().strip().splitlines()[-1]
    return " ".join(x.strip() for x in line.strip("[]").split(",") if x.strip())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-tokenize", required=True)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--count", type=int, default=150)
    ap.add_argument("data_dir", nargs="?", default="tests/data/tokenizers")
    args = ap.parse_args()
    for vocab in sorted(pathlib.Path(args.data_dir).glob("ggml-vocab-*.gguf")):
        tokens, types = read_vocab(vocab)
        own = [t.decode("utf-8", "replace") for t, k in zip(tokens, types) if k in (2, 3, 4)]
        rng = random.Random(f"{args.seed}-{vocab.name}")
        own = [t for t in own if t.strip()]
        specials = SPECIALS + rng.sample(own, min(200, len(own)))
        cases = [text(rng, specials) for _ in range(args.count)]
        cases = [c for c in cases if SEPARATOR not in c]
        lines = []
        for c in cases:
            for flags in (["--no-bos", "--no-parse-special"], ["--no-bos"], []):
                lines.append(tokenize(args.llama_tokenize, vocab, c, flags))
        pathlib.Path(str(vocab) + ".fuzz.inp").write_bytes(b"".join(c + SEPARATOR for c in cases))
        pathlib.Path(str(vocab) + ".fuzz.out").write_text("\n".join(lines) + "\n")
        print(f"{vocab.name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
