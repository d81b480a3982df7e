#!/usr/bin/python3
"""cohort_reform's workers end well: a worker that has finished its training exits 0,
never dies at the interpreter's exit.

torch 1.13's gloo worker threads free a collective's tensors after it completes; a
tensor that Python code held needs the GIL to be freed, and a thread that takes the GIL
while the interpreter finalises is ended by pthread_exit, which std::terminate turns into
SIGABRT ("terminate called without an active exception"). A job whose last step's
collective was still being freed as a rank exited lost that rank after its last line
(3 runs in 120 of examples/reform_ddp.py, 3 ranks, 20 steps); under `cohort run
--on-failure reform` the agents took the exit for a loss. cohort_reform ends its process
groups at exit (atexit), before the interpreter finalises. Here, each job of JOBS (with
and without an agent's control channel, COHORT_CONTROL_FD, whose other end this script
holds): two ranks train a few steps; rank 0 leaves an all_reduce in flight as its script
ends and is made to meet the race every time (the collective completes while its last
exit handler keeps the GIL, which it lets go only once finalising); every rank must exit
0 and say nothing of terminate. Without the fix every rank 0 dies of SIGABRT.
Usage: test_reform_torch_exit.py SOURCE_DIR [JOBS]
"""
import os
import socket
import subprocess
import sys
import tempfile

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
JOBS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
PY = "/usr/bin/python3"  # Debian's, with torch
LONG = 120  # seconds: "not stuck"

WORKER = r"""
import atexit, os, time

# Rank 0's interpreter at its end, as it may be when a collective completes: in C code
# that keeps the GIL (the last exit handler, a builtin, registered before any other
# module's and before Job's, so it runs last), then finalising, where a module global's
# finaliser lets the GIL go.
class Slow:
    def __del__(self):
        time.sleep(1.0)
if os.environ["RANK"] == "0":
    slow = Slow()
    atexit.register(sum, range(150000000))
import torch, torch.distributed as dist
import cohort_reform
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
job = cohort_reform.Job(model, opt, batch_size=4)
x, y = torch.randn(64, 64), torch.randn(64, 8)
while job.step < 5:
    with job.training_step():
        lo = (job.position + job.slot * 4) % 60
        loss = torch.nn.functional.mse_loss(job.ddp(x[lo:lo + 4]), y[lo:lo + 4])
        opt.zero_grad()
        loss.backward()
        opt.step()
# Rank 0 leaves an all_reduce in flight as its script ends, its tensor held by gloo alone;
# rank 1 makes it 0.2 s later, as rank 0 runs its exit handlers.
if job.rank == 0:
    dist.all_reduce(torch.ones(1 << 20), async_op=True)
else:
    time.sleep(0.2)
    dist.all_reduce(torch.ones(1 << 20), async_op=True).wait()
print("done step=%d rank=%d" % (job.step, job.rank), flush=True)
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(tmp, job, rank, port, channel):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(SRC, "src/agent/python"))
    env.pop("COHORT_CONTROL_FD", None)
    keep, fds = None, []
    if channel:  # the agent's end stays here, silent, until the worker is done
        keep, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env["COHORT_CONTROL_FD"] = str(child.fileno())
        fds = [child.fileno()]
    log = open(os.path.join(tmp, "job%d.rank%d.log" % (job, rank)), "w+")
    proc = subprocess.Popen([PY, "-c", WORKER], env=env, stdout=log, stderr=subprocess.STDOUT,
                            pass_fds=fds)
    if channel:
        child.close()
    return proc, log, keep


def run_job(tmp, job, channel):
    """One job of two ranks: a failure's description, or None."""
    port = free_port()
    ranks = [start(tmp, job, r, port, channel) for r in range(2)]
    bad = []
    for rank, (proc, log, keep) in enumerate(ranks):
        try:
            rc = proc.wait(LONG)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "stuck %d s" % LONG
        log.seek(0)
        text = log.read()
        if keep is not None:
            keep.close()
        if rc != 0 or "terminate called" in text or "done step=5 rank=%d" % rank not in text:
            bad.append("rank %d: exit %s, output:\n%s" % (rank, rc, text[-1500:]))
    return "\n".join(bad) or None


def main():
    failed = 0
    with tempfile.TemporaryDirectory(prefix="cohort-reform-exit-") as tmp:
        for job in range(JOBS):
            channel = job % 2 == 0
            why = run_job(tmp, job, channel)
            what = "job %d (%s the control channel): every rank exits 0 after its last line" % (
                job, "with" if channel else "without")
            print("%s: %s" % ("ok" if why is None else "FAIL", what), flush=True)
            if why is not None:
                print(why, flush=True)
                failed += 1
    print("%d passed, %d failed" % (JOBS - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
