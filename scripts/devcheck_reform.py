#!/usr/bin/env python3
"""cohort_reform's NCCL path on a real GPU (scripts/device-check.sh, "reform").

One GPU holds one NCCL rank (NCCL refuses two ranks on one device), so this
checks what a single rank can show: this script plays the agent's side of the
control channel (docs/reform.md: a SOCK_SEQPACKET socketpair,
COHORT_CONTROL_FD) for one worker training a small DDP model on the GPU with
cohort_reform.Job(backend=BACKEND). While the worker trains, `reshape` must
abort its NCCL communicator from the module's thread (ProcessGroupNCCL's
abort), the worker must answer `ready` with its last completed step, join the
new membership that `form` names (a new store port, in the same process),
answer `formed` with the same step, and go on training: same PID, steps
strictly increasing, none recomputed. Twice, then `stop`. And torch prints
no warning of a variable under its pre-2.2 name (cohort run sets both names
of NCCL_ASYNC_ERROR_HANDLING, as here; the start-up hook keeps torch's).

usage: devcheck_reform.py SOURCE_DIR [BACKEND]     (BACKEND: nccl, or gloo
to try the script on a machine without a GPU). Prints PASS/FAIL lines and
one RESULT line; exit 0 when every check passed.
"""
import os
import socket
import subprocess
import sys
import time

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "nccl"
LONG = 120.0  # "not stuck"

WORKER = r'''
import os, sys, time
import torch
import cohort_reform
backend = sys.argv[1]
_abort = cohort_reform._abort_nccl
def traced_abort(pg):  # says which abort the module reaches on this torch
    if pg is not None:
        try:
            b = pg._get_backend(torch.device("cuda"))
        except (AttributeError, RuntimeError):
            b = pg
        found = [n for n in ("abort", "_abort") if hasattr(b, n)]
        print("abort %s.%s" % (type(b).__name__, found[0] if found else "none"), flush=True)
    _abort(pg)
cohort_reform._abort_nccl = traced_abort
dev = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(0)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                            torch.nn.Linear(256, 1)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
args = {"device_ids": [0]} if backend == "nccl" else {}
job = cohort_reform.Job(model, opt, batch_size=32, backend=backend, ddp_args=args)
print("joined epoch=%d pid=%d" % (job.epoch, os.getpid()), flush=True)
while job.step < 100000:
    done = job.step  # a step dropped by a re-form is not printed
    with job.training_step():
        g = torch.Generator().manual_seed(job.position)
        x = torch.randn(32, 64, generator=g).to(dev)
        loss = (job.ddp(x) - x[:, :1]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if backend == "nccl":
            torch.cuda.synchronize()
        time.sleep(0.02)
    if job.step > done:
        print("step=%d epoch=%d pid=%d loss=%.5f" % (job.step, job.epoch, os.getpid(),
                                                       float(loss)), flush=True)
    else:
        print("dropped step=%d epoch=%d" % (job.step + 1, job.epoch), flush=True)
'''

failed = 0


def check(what, ok, detail=""):
    global failed
    print("%s: %s%s" % ("PASS" if ok else "FAIL", what, (" (" + detail + ")") if detail else ""),
          flush=True)
    failed += not ok
    return ok


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def recv(sock):
    """The next message but `broken`, as (verb, fields)."""
    while True:
        data = sock.recv(2048).decode()
        words = data.partition(" why=")[0].split(" ")
        if words[0] != "broken":
            return words[0], dict(w.split("=", 1) for w in words[1:] if "=" in w)


def steps(log):
    out = []
    with open(log) as f:
        for line in f:
            if line.startswith("step="):  # another thread's output may share the line
                out.append(dict(w.split("=", 1) for w in line.split() if "=" in w))
    return out


def wait_steps(proc, log, n):
    end = time.monotonic() + LONG
    while time.monotonic() < end and proc.poll() is None:
        s = steps(log)
        if len(s) >= n:
            return s
        time.sleep(0.05)
    return steps(log)


def reform(agent, proc, log, ended, epoch):
    """reshape -> ready -> form -> formed; the worker's steps go on."""
    before = len(steps(log))
    t = time.monotonic()
    agent.send(("reshape epoch=%d why=devcheck" % ended).encode())
    verb, f = recv(agent)
    check("epoch %d: `ready` after reshape" % ended, verb == "ready", "%s %s" % (verb, f))
    ready = time.monotonic() - t
    agent.send(("form epoch=%d rank=0 size=1 local_rank=0 local_size=1 node_rank=0 nnodes=1 "
                "store=127.0.0.1:1 job=devcheck master_addr=127.0.0.1 master_port=%d"
                % (epoch, free_port())).encode())
    verb2, g = recv(agent)
    check("epoch %d: `formed` with the ready step" % epoch,
          verb2 == "formed" and g.get("step") == f.get("step"), "%s %s" % (verb2, g))
    formed = time.monotonic() - t
    s = wait_steps(proc, log, before + 3)
    after = [x for x in s[before:] if x["epoch"] == str(epoch)]
    check("epoch %d: training goes on in the same process" % epoch,
          len(after) >= 1 and all(x["pid"] == str(proc.pid) for x in after))
    return ready, formed


def main():
    tmp = "/tmp/devcheck-reform-%d" % os.getpid()
    os.makedirs(tmp, exist_ok=True)
    log = os.path.join(tmp, "worker.log")
    agent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    agent.settimeout(LONG)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), COHORT_ROUND="0",
               COHORT_CONTROL_FD=str(child.fileno()), OMP_NUM_THREADS="1",
               # What cohort run sets (both names; the start-up hook on PYTHONPATH keeps
               # the one this torch reads); the module lowers it.
               NCCL_ASYNC_ERROR_HANDLING="1", TORCH_NCCL_ASYNC_ERROR_HANDLING="1",
               PYTHONPATH=os.path.join(SRC, "src/agent/python"))
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", WORKER, BACKEND], env=env, stdout=out,
                                stderr=subprocess.STDOUT, pass_fds=[child.fileno()])
    child.close()
    times = []
    try:
        verb, f = recv(agent)
        if check("hello with the worker's pid", verb == "hello" and f.get("pid") == str(proc.pid),
                 "%s %s" % (verb, f)):
            check("steps before the re-form", len(wait_steps(proc, log, 5)) >= 5)
            times.append(reform(agent, proc, log, 0, 1))
            times.append(reform(agent, proc, log, 1, 2))
            agent.send(b"stop why=devcheck over")
        rc = proc.wait(timeout=LONG)
        check("the worker ends on `stop`", rc is not None, "rc %s" % rc)
    except (socket.timeout, subprocess.TimeoutExpired, ValueError) as e:
        check("no stall", False, repr(e))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(log) as f:
        aborts = [line.split() for line in f if line.startswith("abort ")]
    if BACKEND == "nccl":
        check("reshape aborted the NCCL communicator",
              len(aborts) >= 2 and all(a[1].endswith((".abort", "._abort")) for a in aborts),
              " ".join(a[1] for a in aborts) or "no abort")
    with open(log) as f:
        renamed = [line.strip() for line in f if "is deprecated; use TORCH_" in line]
    check("torch warned of no variable under its old name", not renamed,
          renamed[0] if renamed else "")
    s = steps(log)
    nums = [int(x["step"]) for x in s]
    with open(log) as f:
        dropped = sum(line.startswith("dropped ") for line in f)
    check("completed steps strictly increasing, none recomputed",
          nums == sorted(set(nums)) and len(nums) >= 10,
          "%d steps, %d in flight dropped by a re-form" % (len(nums), dropped))
    with open(log) as f:
        tail = f.read().splitlines()[-15:]
    print("\n".join("  worker: " + line for line in tail))
    print("RESULT backend=%s steps=%d failed=%d ready_s=%s formed_s=%s"
          % (BACKEND, len(nums), failed, ",".join("%.3f" % a for a, _ in times),
             ",".join("%.3f" % b for _, b in times)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
