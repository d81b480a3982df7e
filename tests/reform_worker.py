#!/usr/bin/python3
"""reform_worker.py [silent] - a tiny worker that speaks the re-form control
protocol (docs/reform.md) itself, for the agent's tests.

It prints "start pid=P rank=R world=W newcomer=N" and says hello on
COHORT_CONTROL_FD (not with `silent`: a worker that takes no part); a
"step" is 0.1 s. On `reshape` it prints "reshape pid=P rank=R" and answers
`ready`; on `form` it prints "formed pid=P rank=R world=W at=T store=S" (the new
ones, the wall clock and the new COHORT_STORE)
and answers `formed`; on `stop` it exits 1. It exits 0 once the file named
by $REFORM_DONE exists (with REFORM_DONE_ABORT=1 it dies of SIGABRT 1 s
later instead: a crash at exit), and 3 when the agent's end closes.

For the agent's loop during a re-form: with REFORM_BEAT=1 it writes its
step to COHORT_PROGRESS each step, except between `reshape` and `formed`;
REFORM_FORM_DELAY=S waits S seconds, silent, before it answers `formed` (a
slow bootstrap); REFORM_TICKS=1 prints "between pid=P n=K" each step
between `reshape` and `form`; once the file named by $REFORM_BROKEN exists
it says `broken` once (its collectives found a peer gone).

With REFORM_AWAIT=1 its hello says await_form=1 (it may be started ahead of
its membership, as cohort_reform allows: the agent then sends its first
`form` when the node joins).

A replacement still starting (PyTorch's import takes seconds): with
REFORM_HELLO_AFTER=FILE a newcomer (COHORT_NEWCOMER=1) says hello only once
FILE exists (at most 120 s), then prints "hello pid=P". With
REFORM_HELLO_RANK=R too, the worker of the first start with RANK=R (any
rank: R=any) waits so instead (a slow first start).
"""
import os
import select
import socket
import sys
import time


def say(text):
    print(text, flush=True)


def fields(msg):
    out = {}
    for tok in msg.split(" ")[1:]:
        if tok.startswith("why="):
            break
        k, _, v = tok.partition("=")
        out[k] = v
    return out


def main():
    # Started ahead (COHORT_AWAIT_FORM=1), it learns its rank and world from its first `form`.
    pid, rank, world = os.getpid(), os.environ.get("RANK", "-"), os.environ.get("WORLD_SIZE", "-")
    say("start pid=%d rank=%s world=%s newcomer=%s store=%s" %
        (pid, rank, world, os.environ.get("COHORT_NEWCOMER", "0"), os.environ.get("COHORT_STORE", "-")))
    done = os.environ.get("REFORM_DONE", "")
    fd = os.environ.get("COHORT_CONTROL_FD")
    silent = len(sys.argv) > 1 and sys.argv[1] == "silent"
    ch = None
    gate = os.environ.get("REFORM_HELLO_AFTER", "")
    slow = os.environ.get("REFORM_HELLO_RANK")
    if slow is not None:
        slow = os.environ.get("COHORT_NEWCOMER") != "1" and slow in (rank, "any")
    else:
        slow = os.environ.get("COHORT_NEWCOMER") == "1"
    if gate and slow:
        end = time.monotonic() + 120
        while not os.path.exists(gate) and time.monotonic() < end:
            time.sleep(0.05)
    if fd is not None and not silent:
        ch = socket.socket(fileno=int(fd))
        ahead = b" await_form=1" if os.environ.get("REFORM_AWAIT") == "1" else b""
        ch.send(b"hello pid=%d%s" % (pid, ahead))
        if gate:
            say("hello pid=%d" % pid)
    step = 0
    env = os.environ
    beat = env.get("COHORT_PROGRESS") if env.get("REFORM_BEAT") == "1" else None
    ticks, broken = env.get("REFORM_TICKS") == "1", env.get("REFORM_BROKEN", "")
    epoch, between = env.get("COHORT_ROUND", "0"), False
    while not (done and os.path.exists(done)):
        ready = select.select([ch], [], [], 0.1)[0] if ch is not None else time.sleep(0.1)
        step += 1
        if beat and not between:
            with open(beat, "w") as f:
                f.write("%d\n" % step)
        if between and ticks:
            say("between pid=%d n=%d" % (pid, step))
        if broken and os.path.exists(broken) and ch is not None:
            broken = ""
            ch.send(b"broken epoch=%s why=a peer's connection closed (test)" % epoch.encode())
        if not ready:
            continue
        msg = ch.recv(2048).decode("ascii", "replace")
        if not msg:
            say("control channel closed pid=%d" % pid)
            return 3
        verb, f = msg.split(" ")[0], fields(msg)
        if verb == "reshape":
            between = True
            say("reshape pid=%d rank=%s" % (pid, rank))
            ch.send(b"ready epoch=%s step=%d" % (f.get("epoch", "-1").encode(), step))
        elif verb == "form":
            rank, world, epoch = f["rank"], f["size"], f["epoch"]
            time.sleep(float(env.get("REFORM_FORM_DELAY", "0")))
            between = False
            say("formed pid=%d rank=%s world=%s at=%.3f store=%s" %
                (pid, rank, world, time.time(), f.get("store", "?")))
            ch.send(b"formed epoch=%s step=%d" % (f["epoch"].encode(), step))
        elif verb == "stop":
            say("stop pid=%d" % pid)
            return 1
    if env.get("REFORM_DONE_ABORT") == "1":
        time.sleep(1.0)
        say("abort pid=%d" % pid)
        os.abort()
    return 0


if __name__ == "__main__":
    sys.exit(main())
