#!/usr/bin/python3
"""torch_swarm.py --nodes N [--hold S] [--timeout S] - the swarm's peer: PyTorch's TCPStore.

The same pattern as bench/scale/swarm.c, through torch.distributed.TCPStore
(Debian's torch 1.13): every node is a thread with two clients. The join:
add "joined", set its record, wait for the plan's head, get it and the page
of the plan that holds the node (one get each: this TCPStore has no
multi-get); node 0 waits for every record, reads them and sets the pages of
64 nodes' lines, then the head, as the agents do (src/rdzv/join.c). Then the watch: wait on "fail" in 200 ms slices, add to its
heartbeat counter every 500 ms, node 0 sweeping the others' counters; then
one failure is published and timed until every node has read it. The store
runs in a child process (this script with --serve) so that its CPU time and
memory can be read from /proc.

Prints one line of key=value pairs like the swarm, or "incomplete ..." and
exits 1 when the run does not finish within --timeout (no figures then).
Exits 3 when torch is not importable.
"""
import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta

try:
    from torch.distributed import TCPStore
except Exception:  # torch missing or built without distributed
    sys.exit(3)

JOB = "swarm/0/"
PAGE = 64  # nodes a page of the plan (RDZV_PLAN_PAGE)
SLICE = timedelta(milliseconds=200)


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(port):
    raise_nofile()
    store = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=600), wait_for_workers=False)
    print("ready", flush=True)
    sys.stdin.read()  # until the driver closes the pipe
    del store


def proc_cpu(pid):
    """CPU seconds of a process's threads to the nanosecond (schedstat)."""
    total = 0
    for t in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
            total += int(f.read().split()[0])
    return total / 1e9


def proc_usage(pid):
    """CPU seconds and RSS in KiB of a process."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick
    rss = int(fields[21]) * os.sysconf("SC_PAGESIZE") // 1024
    return cpu, rss


class Swarm:
    def __init__(self, args, port):
        self.a = args
        self.port = port
        self.lock = threading.Lock()
        self.joined = []
        self.watching = 0
        self.failed = {}
        self.requests = 0
        self.errors = []
        self.stop = threading.Event()
        self.plans = {}

    def client(self):
        return TCPStore("127.0.0.1", self.port, None, False, timedelta(seconds=self.a.timeout))

    def count(self, n=1):
        with self.lock:
            self.requests += n

    def host_plan(self, c, n):
        c.wait([JOB + "node/%d" % i for i in range(1, n + 1)])
        records = [c.get(JOB + "node/%d" % i) for i in range(1, n + 1)]
        self.count(n + 1)
        for p in range(0, (n + PAGE - 1) // PAGE):
            lines = [b"%d %d %s" % (s, s - 1, records[s - 1])
                     for s in range(p * PAGE + 1, min(n, (p + 1) * PAGE) + 1)]
            c.set(JOB + "plan/%d" % p, b"\n".join(lines))
            self.count()
        c.set(JOB + "plan", b"ok nnodes=%d\n0 %s" % (n, records[0]))
        self.count()

    def join(self, i):
        c = self.client()
        seq = c.add(JOB + "joined", 1)
        c.set(JOB + "node/%d" % seq, b"uid=%016x claim=-1 nproc=1 host=127.0.0.1 hostname=sim%d" % (i, i))
        self.count(2)
        if i == 0:
            self.host_plan(c, self.a.nodes)
        c.wait([JOB + "plan"])
        plan = c.get(JOB + "plan")
        page = c.get(JOB + "plan/%d" % ((seq - 1) // PAGE))
        self.count(3)
        mine = b"%d %d " % (seq, seq - 1)
        with self.lock:
            if not any(line.startswith(mine) for line in page.split(b"\n")):
                self.errors.append("node %d: not in its page of the plan" % i)
            self.joined.append(time.perf_counter())
            self.plans[len(plan)] = self.plans.get(len(plan), 0) + 1
        return c

    def watch(self, i):
        """Waits for the failure on its own client: this TCPStore cannot time
        out a wait without desynchronising its connection, so there are no
        200 ms slices; the thread blocks until the key exists."""
        w = self.client()
        with self.lock:
            self.watching += 1
        w.wait([JOB + "fail"])
        w.get(JOB + "fail")
        self.count(2)
        with self.lock:
            self.failed[i] = time.perf_counter()

    def beat(self, i, c):
        """The heartbeat counter every 500 ms; node 0 sweeps the others' counters."""
        while not self.stop.wait(0.5):
            c.add(JOB + "hb/%d" % i, 1)
            self.count()
            if i == 0:
                for k in range(1, self.a.nodes):
                    c.add(JOB + "hb/%d" % k, 0)
                self.count(self.a.nodes - 1)

    def guarded(self, fn, *args):
        try:
            fn(*args)
        except Exception as e:  # a node that fails makes the run incomplete
            with self.lock:
                self.errors.append("node %d: %s" % (args[0], e))

    def node(self, i, go):
        try:
            go.wait()
            c = self.join(i)
            threading.Thread(target=self.guarded, args=(self.beat, i, c), daemon=True).start()
            self.watch(i)
        except Exception as e:  # a node that fails makes the run incomplete
            with self.lock:
                self.errors.append("node %d: %s" % (i, e))


def wait_for(cond, deadline):
    while not cond():
        if time.perf_counter() > deadline:
            return False
        time.sleep(0.005)
    return True


def run(args):
    raise_nofile()
    threading.stack_size(256 * 1024)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([sys.executable, __file__, "--serve", str(port)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    srv.stdout.readline()
    sw = Swarm(args, port)
    n = args.nodes
    cpu0, rss0 = proc_usage(srv.pid)
    cpu_start = proc_cpu(srv.pid)
    go = threading.Event()
    threads = [threading.Thread(target=sw.node, args=(i, go), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    go.set()
    deadline = t0 + args.timeout
    out = {}
    ok = wait_for(lambda: len(sw.joined) == n or sw.errors, deadline) and not sw.errors
    ok = ok and len(sw.plans) == 1
    if ok:
        out["rendezvous_ms"] = (max(sw.joined) - t0) * 1000
        out["join_cpu_us"] = (proc_cpu(srv.pid) - cpu_start) * 1e6 / n
        ok = wait_for(lambda: sw.watching == n or sw.errors, deadline) and not sw.errors
    if ok:
        c0, _ = proc_usage(srv.pid)
        r0, h0 = sw.requests, time.perf_counter()
        time.sleep(args.hold)
        c1, rss1 = proc_usage(srv.pid)
        h1 = time.perf_counter()
        out["hb_cpu_pct"] = 100 * (c1 - c0) / (h1 - h0)
        out["hb_req_per_s"] = (sw.requests - r0) / (h1 - h0)
        out["rss_kib"] = rss1 - rss0
        out["rss_b_per_conn"] = (rss1 - rss0) * 1024 / (2 * n)
        out["rss_b_per_node"] = (rss1 - rss0) * 1024 / n
        pub = sw.client()
        sent = time.perf_counter()
        pub.set(JOB + "fail", b"node 7 (sim7): rank 7 exited with code 1")
        ok = wait_for(lambda: len(sw.failed) == n or sw.errors, time.perf_counter() + args.timeout)
        ok = ok and not sw.errors
    sw.stop.set()
    # The store exits when this process has gone (its stdin closes): killing it
    # first would reset the blocked clients, which abort the process.
    if not ok:
        print("incomplete nodes=%d joined=%d watching=%d failed=%d: %s" %
              (n, len(sw.joined), sw.watching, len(sw.failed),
               sw.errors[0] if sw.errors else "timed out"), flush=True)
        os._exit(1)
    d = sorted(t - sent for t in sw.failed.values())
    out["fail_max_ms"] = d[-1] * 1000
    out["fail_med_ms"] = statistics.median(d) * 1000
    keys = ["rendezvous_ms", "join_cpu_us", "hb_cpu_pct", "hb_req_per_s", "fail_max_ms",
            "fail_med_ms", "rss_kib", "rss_b_per_conn", "rss_b_per_node"]
    print("nodes=%d sweep=host " % n + " ".join("%s=%.1f" % (k, out[k]) for k in keys), flush=True)
    os._exit(0)  # the node threads are daemons blocked in the store


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=256)
    p.add_argument("--hold", type=float, default=3)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--serve", type=int)
    args = p.parse_args()
    if args.serve:
        serve(args.serve)
    else:
        run(args)


if __name__ == "__main__":
    main()
