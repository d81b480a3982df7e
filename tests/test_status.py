#!/usr/bin/env python3
"""Helpers of tests/test_status.sh that the shell does badly.

usage: test_status.py schema SCHEMA JSONFILE NRANKS
         validates a `cohort status --json` document against the schema
         (with test_doctor_schema.py's validator, after proving that it
         refuses documents broken on purpose) and checks that it lists NRANKS
         distinct ranks; prints what is wrong, exits 0 when nothing is.
       test_status.py watch SECONDS CMD...
         runs CMD on a pseudo-terminal for SECONDS, then interrupts it;
         prints the number of frames (cursor-home sequences) on the first
         line, then the output with escape sequences removed.
"""
import copy
import json
import os
import pty
import re
import select
import signal
import sys
import time

from test_doctor_schema import validate


def schema(schema_path, doc_path, nranks):
    s = json.load(open(schema_path))
    doc = json.load(open(doc_path))
    errs = validate(doc, s)
    broken = []
    d = copy.deepcopy(doc); del d["nodes"]; broken.append(d)
    d = copy.deepcopy(doc); d["state"] = "sleeping"; broken.append(d)
    d = copy.deepcopy(doc); d["nodes"][0]["ranks"][0]["state"] = 3; broken.append(d)
    d = copy.deepcopy(doc); d["nodes"][0]["extra"] = 1; broken.append(d)
    for i, b in enumerate(broken):
        if not validate(b, s):
            errs.append("the validator accepted broken document %d" % i)
    ranks = [r["rank"] for n in doc["nodes"] if n for r in n["ranks"]]
    if sorted(ranks) != list(range(nranks)):
        errs.append("ranks %r, expected 0..%d" % (ranks, nranks - 1))
    for e in errs:
        print(e)
    return 1 if errs else 0


def watch(seconds, cmd):
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(cmd[0], cmd)
    out = b""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not r:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.kill(pid, signal.SIGINT)
    time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    print(text.count("\x1b[H") - text.count("\x1b[H\x1b[2J"))
    print(re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text).replace("\r", ""))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "schema":
        sys.exit(schema(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    sys.exit(watch(float(sys.argv[2]), sys.argv[3:]))
