#!/usr/bin/env python3
"""The README's first steps as a new user meets them (issue 34, item 6):
before its first example that runs `cohort` or `cohort-gpt2`, it says how
to put them on PATH (make install, or the build directory), and names
make install-torchrun; and it says OMP_NUM_THREADS=1 only for more than one
worker per node, as env.c does. usage: test_readme.py SOURCE_DIR"""
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
print("%d failed" % failed)
sys.exit(1 if failed else 0)
