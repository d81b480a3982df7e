#!/usr/bin/python3
"""A/B of cohort run's progress files: cohort-gpt2 data-parallel under `cohort run`
with progress files and straggler accounting (the default: every rank gets
COHORT_PROGRESS and writes its step after each step; the agent polls the
files, publishes step times and node 0 compares them) against the same run
without them (--straggler-factor 0: no progress file, nothing polled).

A and B alternate, --reps times each; each run's figure is the median step
time of rank 0 after the first step (its --metrics file). Prints the median
of each and the ratio B/A (above 1: the progress files cost nothing or less).
A run that did not train (a non-zero exit, fewer steps than asked, another
world size) stops the benchmark without a figure.

usage: bench/train/progress_ab.py [--build DIR] [--reps N] [--steps N]
                                  [--model tiny|124M] [--nproc N]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(a, tmp, tag, extra):
    metrics = os.path.join(tmp, tag + ".jsonl")
    cmd = [os.path.join(a.build, "cohort"), "run", "--nproc-per-node", str(a.nproc)] + extra + [
        "--no-python", os.path.join(a.build, "cohort-gpt2"), "--model", a.model, "--steps",
        str(a.steps), "--batch", "4", "--seq-len", "64", "--quiet", "--metrics", metrics]
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit("%s: exit %d: %s: no figure" % (tag, out.returncode, out.stderr.strip()[-300:]))
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    if len(rows) != a.steps or any(r["world"] != a.nproc for r in rows):
        sys.exit("%s: %d steps on world %s, expected %d on %d: no figure" % (
            tag, len(rows), sorted({r["world"] for r in rows}), a.steps, a.nproc))
    os.unlink(metrics)
    return statistics.median(r["step_ms"] for r in rows[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--nproc", type=int, default=2)
    a = ap.parse_args()
    if a.reps < 1 or a.steps < 3 or a.nproc < 1:
        sys.exit("progress_ab: --reps >= 1, --steps >= 3, --nproc >= 1")
    on, off = [], []
    with tempfile.TemporaryDirectory(prefix="cohort-progress-ab-") as tmp:
        for i in range(a.reps):
            on.append(run(a, tmp, "on%d" % i, []))
            off.append(run(a, tmp, "off%d" % i, ["--straggler-factor", "0"]))
    mon, moff = statistics.median(on), statistics.median(off)
    print("cohort-gpt2 --model %s, %d ranks, %d steps, %d reps (%d cores, load %s)" % (
        a.model, a.nproc, a.steps, a.reps, os.cpu_count(), open("/proc/loadavg").read().split()[0]))
    print("%-44s %12s" % ("run", "step ms"))
    print("%-44s %12.1f" % ("A: progress files and stragglers (default)", mon))
    print("%-44s %12.1f" % ("B: none (--straggler-factor 0)", moff))
    print("%-44s %12.3f" % ("B / A", moff / mon))
    print("runs, ms: A %s; B %s" % (" ".join("%.0f" % x for x in on), " ".join("%.0f" % x for x in off)))


if __name__ == "__main__":
    main()
