#!/usr/bin/env python3
"""The README's first steps as a new user meets them (issue 34, item 6):
before its first example that runs `cohort` or `cohort-gpt2`, it says how
to put them on PATH (make install, or the build directory), and names
make install-torchrun; it says OMP_NUM_THREADS=1 only for more than one
worker per node, as env.c does; and a block that writes metrics under a
relative directory makes that directory first. usage: test_readme.py SOURCE_DIR"""
import re
import sys

text = open(sys.argv[1] + "/README.md").read()
lines = text.splitlines()
failed = 0


def check(what, ok):
    global failed
    if not ok:
        failed += 1
        print("FAIL:", what)


# The first line of a code block that runs cohort or cohort-gpt2.
first, in_code = None, False
for i, line in enumerate(lines):
    if line.startswith("```"):
        in_code = not in_code
        continue
    if in_code and re.match(r"\s*(cohort|cohort-gpt2)\s", line):
        first = i
        break
check("an example runs cohort", first is not None)
before = "\n".join(lines[: first or 0])
check("make install is named before the first example", "make install" in before)
check("the build directory on PATH before the first example",
      re.search(r"PATH=\S*build", before) is not None)
check("make install-torchrun is named", "make install-torchrun" in text)
omp = re.search(r"([^.]{0,80})`OMP_NUM_THREADS=1` unless set", text, re.S)
check("OMP_NUM_THREADS=1 is said for more than one worker per node",
      omp is not None and "more than one worker" in omp.group(1))

# Every code block that writes --metrics DIR/FILE under a relative path makes
# DIR first: cohort-gpt2 does not create it, and a fresh build has no
# build/demo (the main job's first run failed with "cannot open").
blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
for block in blocks:
    for m in re.finditer(r"--metrics (\S+)/[^/\s]+", block):
        d = m.group(1)
        if d.startswith("/") or d.startswith("$"):
            continue
        made = re.search(r"mkdir -p (\S+ )*" + re.escape(d) + r"\b", block[:m.start()])
        check("the block that writes --metrics %s/... makes %s first" % (d, d), made is not None)
print("%d failed" % failed)
sys.exit(1 if failed else 0)
