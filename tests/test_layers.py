#!/usr/bin/env python3
"""docs/architecture.md is a true map:
- includes point downwards: every file under a folder of include/, src/ and
  tools/ includes "X/..." only for its own module or an X that the "may
  include" column lists for that folder, and every such folder has a row;
- nothing is missing from it: every .c file (and every header that is not
  the header of a .c file beside it) is named in its folder's row, as
  `name.c` or `sub/name.c`, or anywhere on the page by its path from the
  root; every file under scripts/ and every page under docs/ (.md, .json,
  man/*.1) is named on the page.

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


def folder_rows(doc):
    """{folder: text of its row in the layer table}."""
    rows = {}
    with open(doc, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line)
            if m:
                rows[m.group(1)] = line
    return rows


def mapped_files(src):
    """The files the map must name, as (folder or None, path from the root).
    None: named anywhere on the page is enough (scripts, docs)."""
    files = []
    for top in ("include", "src", "tools"):
        for root, dirs, names in os.walk(os.path.join(src, top)):
            dirs.sort()
            rel = os.path.relpath(root, src)
            folder = "/".join(rel.split(os.sep)[:2])
            stems = {n[:-2] for n in names if n.endswith(".c")}
            for n in sorted(names):
                header_of_c = n.endswith(".h") and n[:-2] in stems
                if n.endswith((".c", ".h", ".py")) and not header_of_c:
                    files.append((folder, os.path.join(rel, n)))
    for top, exts in (("scripts", None), ("docs", (".md", ".json", ".1"))):
        for root, dirs, names in os.walk(os.path.join(src, top)):
            dirs.sort()
            for n in sorted(names):
                if exts is None or n.endswith(exts):
                    files.append((None, os.path.relpath(os.path.join(root, n), src)))
    return files


def unmapped(src, page, rows):
    """The files of mapped_files() that the page does not name."""
    bad = []
    for folder, path in mapped_files(src):
        if path in page:
            continue
        if folder is None:
            if f"`{os.path.basename(path)}`" not in page:
                bad.append(f"{path} is not named in docs/architecture.md")
            continue
        row = rows.get(folder, "")
        inner = os.path.relpath(path, folder)
        if f"`{inner}`" not in row and f"`{os.path.basename(path)}`" not in row:
            bad.append(f"{path} is not named in {folder}/'s row of docs/architecture.md")
    return bad


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
        os.makedirs(os.path.join(d, "docs/man"))
        os.makedirs(os.path.join(d, "scripts"))
        for fn in ("src/base/a.h", "src/base/b.h", "src/store/c.c", "docs/x.md",
                   "docs/man/y.1", "scripts/z.sh"):
            open(os.path.join(d, fn), "w").close()
        rows = {"src/base": "| `src/base/` | `a.c` |", "src/store": "| `src/store/` | `b.h` |"}
        page = "`y.1` `z.sh` src/base/b.h " + "".join(rows.values())
        missing = unmapped(d, page, rows)
        return (len(bad) == 2 and any("src/base/a.c:2: includes store/" in b for b in bad)
                and any("src/new/ has no row" in b for b in bad)
                and sorted(missing) == ["docs/x.md is not named in docs/architecture.md",
                                        "src/store/c.c is not named in src/store/'s row "
                                        "of docs/architecture.md"])


def main():
    if len(sys.argv) != 2:
        print("usage: test_layers.py SOURCE_DIR", file=sys.stderr)
        return 2
    src = sys.argv[1]
    doc = os.path.join(src, "docs", "architecture.md")
    table = allowed_table(doc)
    with open(doc, encoding="utf-8") as f:
        page = f.read()
    failed = 0
    if len(table) < 10:
        print(f"FAIL: docs/architecture.md: only {len(table)} rows in the layer table")
        failed += 1
    if not self_test():
        print("FAIL: the checker misses an upward include, an unmapped folder or file")
        failed += 1
    for b in violations(src, table) + unmapped(src, page, folder_rows(doc)):
        print("FAIL:", b)
        failed += 1
    print(f"{len(table)} folders mapped, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
