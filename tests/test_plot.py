#!/usr/bin/python3
"""test_plot.py COHORT - `cohort plot` end to end: a generated metrics file
becomes a well-formed SVG whose two polylines have one point per step and
follow the data; several files share the panels, one colour and a legend line
each; bad input ends with one line and a non-zero exit."""
import json
import math
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

from checks import check, report

COHORT = sys.argv[1]
SVG = "{http://www.w3.org/2000/svg}"


def plot(*args):
    return subprocess.run([COHORT, "plot", *args], capture_output=True, text=True, timeout=60)


def polylines(path):
    root = ET.parse(path).getroot()
    check(root.tag == SVG + "svg", "root is <svg>")
    out = {}
    for pl in root.iter(SVG + "polyline"):
        pts = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
        out[pl.get("class")] = pts
    return out


with tempfile.TemporaryDirectory() as d:
    steps = 137
    metrics = os.path.join(d, "run 1 & <co>.jsonl")
    with open(metrics, "w") as f:
        for s in range(steps):
            f.write(json.dumps({"step": s, "loss": 8 * math.exp(-s / 40) + 0.5,
                                "tokens_per_s": 1e5 + 1e3 * (s % 7), "lr": 3e-4, "ms": 12.5})
                    + "\n")
        f.write('{"step": %d, "loss": 0.4, "tokens_' % steps)  # the job is still writing
    p = plot(metrics)
    svg = os.path.join(d, "run 1 & <co>.svg")
    check(p.returncode == 0, "plot exits 0: " + p.stderr)
    check(os.path.exists(svg), "default output next to the metrics")
    check("%d steps" % steps in p.stdout and "incomplete last line" in p.stdout, p.stdout)
    lines = polylines(svg)
    check(set(lines) == {"loss", "tokens_per_s"}, "two polylines: %r" % list(lines))
    for name, pts in lines.items():
        check(len(pts) == steps, "%s has %d points for %d steps" % (name, len(pts), steps))
        xs = [x for x, _ in pts]
        check(xs == sorted(xs) and len(set(xs)) == steps, "%s x increases with step" % name)
    # SVG y grows downwards: a falling loss rises in y, the throughput
    # pattern repeats every 7 steps.
    loss = lines["loss"]
    check(all(loss[i][1] < loss[i + 1][1] for i in range(steps - 1)), "loss curve falls")
    tps = lines["tokens_per_s"]
    check(all(abs(tps[i][1] - tps[i + 7][1]) < 0.02 for i in range(steps - 7)), "tps periodic")

    # -o, and standard output.
    out = os.path.join(d, "x.svg")
    p = plot("-o", out, metrics)
    check(p.returncode == 0 and len(polylines(out)["loss"]) == steps, "-o FILE")
    p = plot(metrics, "--output", "-")
    check(p.returncode == 0 and ET.fromstring(p.stdout.encode()).tag == SVG + "svg", "-o -")
    check(not [f for f in os.listdir(d) if ".tmp." in f], "no temporary files left")

    # Repeated steps (a resumed run): one point per distinct step.
    resumed = os.path.join(d, "resumed.jsonl")
    with open(resumed, "w") as f:
        for s in list(range(50)) + list(range(30, 60)):
            f.write(json.dumps({"step": s, "loss": 1.0, "tokens_per_s": 2.0}) + "\n")
    p = plot("-o", out, resumed)
    check(p.returncode == 0 and len(polylines(out)["tokens_per_s"]) == 60, "resumed run")

    # Several runs in one picture: each file a polyline per panel (data-series k, its own
    # colour) over the union of the steps, and a legend naming the files.
    short = os.path.join(d, "short<run>.jsonl")
    with open(short, "w") as f:
        for s in range(20, 70):
            f.write(json.dumps({"step": s, "loss": 3.0 - s / 100, "tokens_per_s": 5e4}) + "\n")
    both = os.path.join(d, "both.svg")
    p = plot(metrics, short, "-o", both)
    check(p.returncode == 0, "two files: exit 0: " + p.stderr)
    root = ET.parse(both).getroot()
    series = {}
    for pl in root.iter(SVG + "polyline"):
        pts = [tuple(map(float, q.split(","))) for q in pl.get("points").split()]
        series[(pl.get("class"), pl.get("data-series"))] = (pts, pl.get("stroke"))
    check(sorted(series) == [("loss", "0"), ("loss", "1"), ("tokens_per_s", "0"),
                             ("tokens_per_s", "1")], "a polyline per file and panel: %r" % sorted(series))
    check(len(series[("loss", "0")][0]) == steps and len(series[("loss", "1")][0]) == 50,
          "each file keeps its own points")
    check(series[("loss", "0")][1] != series[("loss", "1")][1], "one colour per file")
    check(series[("loss", "0")][1] == series[("tokens_per_s", "0")][1], "a file keeps its colour")
    x0 = series[("loss", "0")][0]
    x1 = series[("loss", "1")][0]
    check(x1[0][0] == x0[20][0] and x1[-1][0] == x0[69][0], "one step axis for both files")
    legend = [t.text for g in root.iter(SVG + "g") if g.get("class") == "legend"
              for t in g.iter(SVG + "text")]
    check(legend == [metrics, short], "the legend names the files: %r" % legend)
    for args in [[metrics, short], [metrics] * 9 + ["-o", both]]:
        p = plot(*args)
        check(p.returncode == 2 and p.stderr.count("\n") == 1, "%d files%s: exit 2 with one line" % (
            len(args), "" if "-o" in args else " without -o"))
    p = plot(metrics, os.path.join(d, "nope.jsonl"), "-o", os.path.join(d, "none.svg"))
    check(p.returncode == 1 and "nope.jsonl" in p.stderr and p.stderr.count("\n") == 1,
          "a missing second file: exit 1 naming it")
    check(not os.path.exists(os.path.join(d, "none.svg")), "... and no picture")

    # Bad input: non-zero, one line, no output file.
    bad = {
        "garbage.jsonl": '{"step": 0, "loss": 1, "tokens_per_s": 1}\nnot json\n',
        "missing.jsonl": '{"step": 0, "loss": 1}\n',
        "empty.jsonl": "",
        "binary.jsonl": "\x00\x01\x02\n",
        "string.jsonl": '{"step": 0, "loss": "low", "tokens_per_s": 1}\n',
    }
    for name, text in bad.items():
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        p = plot(path)
        check(p.returncode == 1, "%s: exit 1, got %d" % (name, p.returncode))
        check(p.stderr.count("\n") == 1 and p.stderr.startswith("cohort plot: "),
              "%s: one line: %r" % (name, p.stderr))
        check(not os.path.exists(path[:-6] + ".svg"), "%s: no svg written" % name)
    check("line 2" in plot(os.path.join(d, "garbage.jsonl")).stderr, "error names the line")
    for args, code in [([], 2), (["a", "b"], 2), (["--bogus", metrics], 2), (["-o"], 2),
                       ([os.path.join(d, "nope.jsonl")], 1), ([d], 1),
                       (["-o", os.path.join(d, "no/such/dir.svg"), metrics], 1)]:
        p = plot(*args)
        check(p.returncode == code and p.stderr.count("\n") == 1 and p.stdout == "",
              "%r: exit %d with one line, got %d %r" % (args, code, p.returncode, p.stderr))
    p = plot("--help")
    check(p.returncode == 0 and p.stdout.startswith("usage: cohort plot"), "--help")

sys.exit(report())
