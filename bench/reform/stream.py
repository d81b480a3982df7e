#!/usr/bin/python3
"""bench/reform/stream.py: the background state stream alone (no training on
the links), one newcomer receiving from 2 donors (each survivor sends half
the bytes) beside 1 donor (it sends them all), over emulated nodes.

Three network namespaces on a bridge (tests/netns.py, created and removed
here), every node's link shaped with tc tbf (--rate, egress of each node, as
bench/recovery does); a store in node 0. Rows, alternating per rep:
  2 donors -> 1 new   ranks 0, 1, 2 on nodes 0, 1, 2; rank 2 new
  1 donor -> 1 new    ranks 0, 1 on nodes 0, 2; rank 1 new
Each run starts bench_state_stream (bench/reform/state_stream.c) in the
nodes; its figure is the seconds from the begin to the newcomer's poll
saying 1. With --copy the rows are instead 2 donors -> 1 new sending from
their pieces in place, and the same with each donor sending from a copy of
its share (COHORT_STREAM_COPY: its thread copies the share into fresh
memory first). Prints the median of --reps runs per row, each run beside it, the
rate it reached and the ratio; a run whose bytes arrived wrong or whose
ranks failed prints no figure ("fail") and the script exits 1.
Run as root (namespaces, tc).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from netns import Netns  # noqa: E402

ROWS = [("2 donors -> 1 new", [0, 1, 2], 0b100, []), ("1 donor -> 1 new", [0, 2], 0b10, [])]
COPY_ROWS = [("2 donors, from the pieces", [0, 1, 2], 0b100, []),
             ("2 donors, each from a copy of its share", [0, 1, 2], 0b100, ["copy"])]


def one_run(a, ns, store, nodes, newmask, extra, tag):
    """One stream: its seconds, or None and why."""
    procs = []
    for rank, node in enumerate(nodes):
        cmd = ns.exec(node) + [a.bin, store, tag, str(rank), str(len(nodes)), str(newmask),
                               str(a.mib)] + extra
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=a.limit)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.wait()
            return None, "the %d s limit" % a.limit
        outs.append((p.returncode, out, err))
    for rc, out, err in outs:
        if rc != 0:
            return None, "a rank exited %d: %s" % (rc, (err or out).strip()[-200:])
    words = outs[0][1].split()
    if len(words) != 3 or words[0] != "stream" or words[2] != "0":
        return None, "rank 0 said %r" % outs[0][1]
    return float(words[1]), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bench_state_stream"))
    ap.add_argument("--cohort", default=os.path.join(ROOT, "build", "cohort"))
    ap.add_argument("--mib", type=int, default=256, help="MiB streamed (default 256)")
    ap.add_argument("--rate", default="1gbit", help="every node's link (tc tbf; default 1gbit)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--limit", type=int, default=300, help="seconds a run may take")
    ap.add_argument("--copy", action="store_true",
                    help="rows: 2 donors from their pieces against 2 from a copy of their share")
    a = ap.parse_args()
    rows = COPY_ROWS if a.copy else ROWS
    if a.reps < 1 or a.mib < 1:
        ap.error("--reps and --mib must be at least 1")
    if os.geteuid() != 0:
        sys.exit("bench/reform/stream.py: network namespaces need root")
    print("# bench/reform/stream.py: %d MiB, link %s (tbf, each node's egress), %d rep(s), "
          "%d cores, load %.1f %.1f %.1f" % ((a.mib, a.rate, a.reps, os.cpu_count()) +
                                             os.getloadavg()))
    ns = Netns(3, subnet="10.203.0")
    store_proc, figs, fails = None, {r[0]: [] for r in rows}, {}
    try:
        ns.up()
        for node in ns.nodes:
            subprocess.run(["tc", "-n", node, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                            a.rate, "burst", "256kb", "latency", "50ms"], check=True, timeout=30)
        store = "%s:29650" % ns.addr(0)
        store_proc = subprocess.Popen(ns.exec(0) + [a.cohort, "store", "serve", "--host",
                                                    ns.addr(0), "--port", "29650"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        for rep in range(a.reps):
            for k, (name, nodes, mask, extra) in enumerate(rows):
                if name in fails:
                    continue
                sec, why = one_run(a, ns, store, nodes, mask, extra, "bs-%d-%d-%d" % (
                    os.getpid(), rep, k))
                if sec is None:
                    fails[name] = "run %d: %s" % (rep + 1, why)
                else:
                    figs[name].append(sec)
    finally:
        if store_proc is not None:
            store_proc.kill()
            store_proc.wait()
        ns.down()
    print("| row | stream s, median (each run) | Gbit/s into the newcomer |")
    print("|---|---|---|")
    med = {}
    for name, _, _, _ in rows:
        if name in fails:
            print("| %s | fail: %s | |" % (name, fails[name]))
            continue
        med[name] = statistics.median(figs[name])
        print("| %s | %.2f (%s) | %.2f |" % (name, med[name], ", ".join(
            "%.2f" % x for x in figs[name]), a.mib * 8 * 1.048576e-3 / med[name]))
    if len(med) == 2:
        print("# %s / %s: %.2fx" % ("from a copy" if a.copy else "1 donor",
                                    "from the pieces" if a.copy else "2 donors",
                                    med[rows[1][0]] / med[rows[0][0]]))
    print("# load at the end: %.1f %.1f %.1f" % os.getloadavg())
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
