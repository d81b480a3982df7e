"""A small DDP training run (gloo) that survives a lost node.

On each node (node 0 at HOST; to try it on one machine: docs/reform.md,
"Try it on one machine"), with a Python that has torch:

    cohort run --nnodes 2:3 --master HOST:29400 --on-failure reform \\
        -- /usr/bin/python3 examples/reform_ddp.py --steps 200

The lines marked "# cohort" are all it takes to take part in re-forms
(docs/reform.md, "PyTorch workers"): survivors keep their process and state,
newcomers receive the state from the survivors while these train. Each
completed step prints one line: step, rank, world size, pid, the ranks
that trained it, whether this rank was catching up (then it trained
nothing: its loss is "-"), data position after the step, the samples it took, loss, a
digest of the parameters (the same on every rank that trains), wall time. A
rank that caught up prints "caught ..." once, with the bytes it received.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F

import cohort_reform  # cohort

DIM = 8


def samples(lo, n):
    """Samples lo..lo+n-1 of an endless synthetic regression set."""
    i = torch.arange(lo, lo + n, dtype=torch.float32).unsqueeze(1)
    x = torch.sin(i * 0.37 + torch.arange(DIM, dtype=torch.float32))
    y = x @ torch.linspace(-1.0, 1.0, DIM).unsqueeze(1) + 0.5
    return x, y


def digest(model):
    """One number that differs when the parameters do (ranks must agree)."""
    return sum(float((p.double() * (i + 1)).sum()) for i, p in enumerate(model.parameters()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=4, help="samples per rank per step")
    ap.add_argument("--step-time", type=float, default=0.0,
                    help="seconds each step sleeps (stands for a larger model)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    job = cohort_reform.Job(model, opt, batch_size=args.batch)  # cohort
    r = job.reforms[-1]
    print("joined epoch=%d rank=%d world=%d pid=%d step=%d received=%d"
          % (r["epoch"], job.rank, job.world_size, os.getpid(), job.step, r["received"]),
          flush=True)
    seen, caught = len(job.reforms), None
    while job.step < args.steps:
        done = False
        with job.training_step():  # cohort
            lo = job.position + job.slot * args.batch  # cohort: this rank's samples
            x, y = samples(lo, args.batch)
            loss = F.mse_loss(job.ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(args.step_time)
            done, world, trainers, junk = True, job.world_size, job.trainers, job.catching_up
        if len(job.reforms) > seen:
            seen = len(job.reforms)
            r = job.reforms[-1]
            print("reformed epoch=%d rank=%d world=%d pid=%d step=%d sent=%d received=%d "
                  "dropped=%d" % (r["epoch"], job.rank, job.world_size, os.getpid(), job.step,
                                  r["sent"], r["received"], job.dropped), flush=True)
        r = job.reforms[-1]
        if "caught" in r and r is not caught and job.rank in r["catching_up"]:
            caught = r
            print("caught epoch=%d rank=%d world=%d pid=%d step=%d received=%d replayed=%d"
                  % (r["epoch"], job.rank, job.world_size, os.getpid(), job.step, r["received"],
                     r["replayed"]), flush=True)
        if done:  # world, trainers, catching: the step's; rank: the next one's
            print("step=%d rank=%d world=%d pid=%d trainers=%d catching=%d position=%d "
                  "samples=%d:%d loss=%s params=%.12g time=%.3f"
                  % (job.step, job.rank, world, os.getpid(), trainers, junk, job.position, lo,
                     lo + args.batch, "-" if junk else "%.6f" % loss.item(), digest(model),
                     time.time()), flush=True)
    print("done step=%d rank=%d world=%d pid=%d position=%d params=%.12g"
          % (job.step, job.rank, job.world_size, os.getpid(), job.position, digest(model)),
          flush=True)


if __name__ == "__main__":
    main()
