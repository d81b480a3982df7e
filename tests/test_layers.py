#!/usr/bin/env python3
"""Includes point downwards: every file under a folder of include/, src/ and
tools/ includes "X/..." only for its own module or an X that the "may include"
column of docs/architecture.md lists for that folder, and every such folder
has a row there.

usage: test_layers.py SOURCE_DIR
"""
import os
import re
import sys

ROW = re.compile(r"^\| `((?:include|src|tools)(?:/[a-z0-9_]+)?)/` \|.*\| ([^|]*) \|\s*$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/')


def allowed_table(doc):
    """{folder: set of include prefixes it may use} from the table's rows."""
    table = {}
    with open(doc, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line)
            if m:
                table[m.group(1)] = set(re.findall(r"`([a-z0-9_]+)`", m.group(2)))
    return table


def own_prefix(folder):
    """The include prefix of a folder's own headers: src/agent -> agent,
    include/cohort -> cohort, tools and tools/cohort -> tools."""
    return "tools" if folder.startswith("tools") else folder.split("/")[1]


def violations(src, table):
    bad = []
    folders = ["tools"]  # the files directly in tools/, then every folder
    for top in ("include", "src", "tools"):
        folders += [f"{top}/{name}" for name in sorted(os.listdir(os.path.join(src, top)))
                    if os.path.isdir(os.path.join(src, top, name))]
    for folder in folders:
        path = os.path.join(src, folder)
        if folder not in table:
            bad.append(f"{folder}/ has no row in docs/architecture.md's layer table")
            continue
        ok = table[folder] | {own_prefix(folder)}
        for fn in sorted(os.listdir(path)):
            if not fn.endswith((".c", ".h")):
                continue
            with open(os.path.join(path, fn), encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if m and m.group(1) not in ok:
                        bad.append(f"{folder}/{fn}:{n}: includes {m.group(1)}/, "
                                   f"which {folder}/ may not (may: {' '.join(sorted(ok))})")
    return bad


def self_test():
    """The checker catches an upward include and an unmapped folder."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for folder in ("include/cohort", "src/base", "src/store", "src/new", "tools/cohort"):
            os.makedirs(os.path.join(d, folder))
        with open(os.path.join(d, "src/base/a.c"), "w") as f:
            f.write('#include "base/a.h"\n#include "store/store.h"\n')
        table = {"include/cohort": set(), "src/base": {"cohort"}, "src/store": {"base"},
                 "tools": set(), "tools/cohort": {"base"}}
        bad = violations(d, table)
        return (len(bad) == 2 and any("src/base/a.c:2: includes store/" in b for b in bad)
                and any("src/new/ has no row" in b for b in bad))


def main():
    if len(sys.argv) != 2:
        print("usage: test_layers.py SOURCE_DIR", file=sys.stderr)
        return 2
    src = sys.argv[1]
    table = allowed_table(os.path.join(src, "docs", "architecture.md"))
    failed = 0
    if len(table) < 10:
        print(f"FAIL: docs/architecture.md: only {len(table)} rows in the layer table")
        failed += 1
    if not self_test():
        print("FAIL: the checker misses an upward include or an unmapped folder")
        failed += 1
    for b in violations(src, table):
        print("FAIL:", b)
        failed += 1
    print(f"{len(table)} folders mapped, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
