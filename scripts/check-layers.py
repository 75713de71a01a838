#!/usr/bin/env python3
"""Include scan: fails if a folder of src/ includes a folder above it.

The layer order is the `foreach(dir ...)` list of the top-level CMakeLists.txt
(lowest first); a folder may include itself and the folders listed before it,
nothing else. Generated protobuf headers ("proto/...") belong to rpc/ only.
Every folder under src/ must be in the list. Run by ctest (layering_include_scan).

  scripts/check-layers.py [REPO_ROOT]
"""
import pathlib
import re
import sys


def layer_order(root):
    text = (root / "CMakeLists.txt").read_text()
    m = re.search(r"foreach\(dir ([^)]*)\)", text)
    if not m:
        sys.exit("check-layers: no foreach(dir ...) layer list in CMakeLists.txt")
    return m.group(1).split()


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    order = layer_order(root)
    rank = {d: i for i, d in enumerate(order)}
    include = re.compile(r'^\s*#\s*include\s+"([^"/]+)/[^"]+"', re.M)
    problems = []
    for folder in sorted(p for p in (root / "src").iterdir() if p.is_dir()):
        if folder.name not in rank:
            problems.append(f"src/{folder.name}/ is not in the layer list of CMakeLists.txt")
            continue
        for f in sorted(folder.rglob("*")):
            if f.suffix not in (".h", ".cc"):
                continue
            for m in include.finditer(f.read_text(errors="replace")):
                target = m.group(1)
                rel = f.relative_to(root)
                if target == "proto":
                    if folder.name != "rpc":
                        problems.append(f"{rel}: includes generated proto headers (rpc/ only)")
                elif target in rank and rank[target] > rank[folder.name]:
                    problems.append(f"{rel}: {folder.name}/ includes {target}/, which is above it")
    for p in problems:
        print(p)
    print(f"check-layers: {len(order)} layers, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
