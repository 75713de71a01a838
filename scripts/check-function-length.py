#!/usr/bin/env python3
"""Function-length scan: fails if a production function in src/ is too long.

Reads every .h/.cc under src/ except tests (*_test.cc, *test_util*.h) and fuzz
targets, strips comments, string and character literals, and counts braces. A
`{` opened at namespace or class scope whose head (the text since the previous
`;`, `{` or `}`) has a parameter list `(...)` starts a function (a lambda or
table initialized at namespace scope counts too); its length is the lines from
the head's first line to the closing `}`, inclusive. Lambdas and local classes
count toward the function they are written in.

  scripts/check-function-length.py [--max N] [--report N] [--allow PATH:NAME]... [REPO_ROOT]

--max (default 80) is the hard limit that fails the scan; --report N lists
every function over N lines (the style target is ~60) without failing;
--allow PATH:NAME notes a known exception instead of failing on it.
Run by ctest (layering_function_length).
"""
import argparse
import pathlib
import re
import sys

CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|try)\b")
INIT_HEAD = re.compile(r"\)\s*(noexcept\s*)?:(?!:)")  # `Foo(...) : a_(x)` or `... : b_`
INIT_BRACE = re.compile(r"[\w>]\s*$")  # the `{` follows a member name or template type
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b[^()]*$")


def strip(text):
    """Blanks comments and literals, keeping newlines so line numbers hold."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def without_template_params(head):
    """Drops `template <...>` lists (nested <> too), whose `class` is no class."""
    out = head
    while True:
        m = re.search(r"\btemplate\s*<", out)
        if not m:
            return out
        depth, j = 0, m.end() - 1
        while j < len(out):
            depth += {"<": 1, ">": -1}.get(out[j], 0)
            j += 1
            if depth == 0:
                break
        out = out[: m.start()] + out[j:]


def functions(text):
    """Yields (name, first_line, last_line) for each function at namespace or class scope."""
    text = strip(text)
    text = re.sub(r"^\s*#.*(\\\n.*)*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.M)
    stack = []  # per open brace: "scope", "inner", "init" or ("func", name, first_line, inside_parens)
    head_start = 0
    line = 1
    line_at = [0] * (len(text) + 1)
    for i, c in enumerate(text):
        line_at[i] = line
        if c == "\n":
            line += 1
    for i, c in enumerate(text):
        if c in ";{}":
            in_func = any(isinstance(s, tuple) for s in stack)
            head = text[head_start:i]
            if c == "{" and not in_func and INIT_HEAD.search(head) and INIT_BRACE.search(head):
                stack.append("init")  # a member initializer `a_{...}` of a constructor
                continue
            if c == "}" and stack and stack[-1] == "init":
                stack.pop()
                continue
            if c == "{" and not in_func:
                decl = without_template_params(head.split("(")[0])
                if "(" in head and not CONTROL.match(head) and not SCOPE.search(decl):
                    first = head_start + len(head) - len(head.lstrip())
                    m = re.search(r"([~\w:<>=!+\-*/\[\]]+)\s*\(", head)
                    # Inside an open `(`: a braced argument (a default `= {}`, a
                    # lambda passed at namespace scope); the head goes on after it.
                    inside_parens = head.count("(") > head.count(")")
                    stack.append(("func", m.group(1) if m else "?", line_at[first], inside_parens))
                    if inside_parens:
                        continue
                else:
                    stack.append("scope")
            elif c == "{":
                stack.append("inner")
            elif c == "}" and stack:
                top = stack.pop()
                if isinstance(top, tuple):
                    yield top[1], top[2], line_at[i]
                    if top[3]:
                        continue
            head_start = i + 1
    return


def production_files(root):
    for f in sorted((root / "src").rglob("*")):
        if f.suffix not in (".h", ".cc"):
            continue
        name = f.name
        if name.endswith("_test.cc") or "test_util" in name or "fuzz" in f.parts[-2] or "fuzz" in name:
            continue
        yield f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=int, default=80)
    ap.add_argument("--report", type=int, default=0)
    ap.add_argument("--allow", action="append", default=[],
                    help="PATH:NAME of a function known to be over --max (noted, not failed)")
    ap.add_argument("root", nargs="?", default=".")
    args = ap.parse_args()
    root = pathlib.Path(args.root).resolve()
    over, listed, count = [], [], 0
    for f in production_files(root):
        for name, first, last in functions(f.read_text(errors="replace")):
            count += 1
            length = last - first + 1
            where = f"{f.relative_to(root)}:{first}: {name} is {length} lines"
            if length > args.max and f"{f.relative_to(root)}:{name}" in args.allow:
                listed.append(where + " (allowed)")
            elif length > args.max:
                over.append(where)
            elif args.report and length > args.report:
                listed.append(where)
    for w in listed:
        print(f"note: {w}")
    for w in over:
        print(f"{w} (limit {args.max})")
    print(f"check-function-length: {count} functions, {len(over)} over {args.max} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
