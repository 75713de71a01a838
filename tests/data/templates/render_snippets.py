#!/usr/bin/python3
"""Renders the language-feature snippets of snippets.json with render.py's environment (Python
jinja2 set up as Hugging Face does), one JSON line per snippet: {"name", "prompt"} or
{"name", "error"}. snippets.json is {"vars": {...shared variables...}, "snippets": [{"name",
"template", optional "vars"}]}.

  render_snippets.py snippets.json
"""
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render  # noqa: E402


def main():
    spec = json.load(open(sys.argv[1], encoding="utf-8"))
    env = render.environment()
    for s in spec["snippets"]:
        # A fresh copy per snippet: jinja2 can change a variable in place even in its immutable
        # sandbox (`x|indent` on a list x runs `x += "\n"`, extending it before it fails).
        variables = copy.deepcopy(spec["vars"])
        variables.update(copy.deepcopy(s.get("vars", {})))
        try:
            out = {"name": s["name"], "prompt": env.from_string(s["template"]).render(**variables)}
        except Exception as e:
            out = {"name": s["name"], "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
