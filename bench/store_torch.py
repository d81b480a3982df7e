#!/usr/bin/python3
"""store_torch.py PORT REPS OPS N... - the peer of bench_store: PyTorch's TCPStore.

Runs the same workloads as bench_store.c against torch.distributed.TCPStore
(server thread in this process, clients through the Python binding) and
prints one line per measurement: "<name> <median seconds> <ops>".
Exits 3 when torch is not importable.
"""
import os
import statistics
import sys
import time
from datetime import timedelta

try:
    from torch.distributed import TCPStore
except Exception:  # torch missing or built without distributed
    sys.exit(3)

port, reps, ops = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sizes = [int(a) for a in sys.argv[4:]]
T = timedelta(seconds=60)
master = TCPStore("127.0.0.1", port, None, True, T, wait_for_workers=False)
client = TCPStore("127.0.0.1", port, None, False, T)
value = b"x" * 64


def timed(fn):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sets():
    for i in range(ops):
        client.set("k%d" % (i % 100), value)


def gets():
    for i in range(ops):
        client.get("k%d" % (i % 100))


def adds():
    for i in range(ops):
        client.add("ctr", 1)


def checks():
    # TCPStore has no ping; num_keys() is its cheapest round trip.
    for i in range(ops):
        client.num_keys()


sets()  # creates the keys read below
print("ping", timed(checks), ops, flush=True)
print("set", timed(sets), ops, flush=True)
print("get", timed(gets), ops, flush=True)
print("add", timed(adds), ops, flush=True)

round_no = [0]


def rendezvous(n):
    """n processes, forked beforehand and released together: connect, add,
    set own key, wait for all, get all. Returns seconds from release to the
    last exit."""
    round_no[0] += 1
    prefix = "r%d/" % round_no[0]
    keys = [prefix + str(i) for i in range(n)]
    go_r, go_w = os.pipe()
    pids = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(go_w)
                os.read(go_r, 1)
                c = TCPStore("127.0.0.1", port, None, False, T)
                c.add(prefix + "arrived", 1)
                c.set(keys[rank], value)
                c.wait(keys)
                for k in keys:
                    c.get(k)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(go_r)
    t0 = time.perf_counter()
    os.write(go_w, b"g" * n)
    ok = True
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        ok = ok and os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0
    took = time.perf_counter() - t0
    os.close(go_w)
    if not ok:
        sys.exit(1)
    return took


for n in sizes:
    print("rdzv%d" % n, statistics.median(rendezvous(n) for _ in range(reps)), 1, flush=True)
