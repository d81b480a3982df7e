"""Healthy ranks that print nothing: SILENT_MODE `ddp` trains a 512x512
linear layer with gloo DDP for SILENT_STEPS steps, 0.2 s of local compute
before each, only rank 0 printing every 5 steps (the script of issue 34);
`plain` calls torch.distributed.all_reduce SILENT_STEPS times after
SILENT_COMPUTE seconds of local compute in one loop, and no rank prints.
Every rank prints "start <rank>" once the group is up (its start-up is
over) and "done <rank>" at the end."""
import os
import time

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
MODE = os.environ.get("SILENT_MODE", "ddp")
STEPS = int(os.environ.get("SILENT_STEPS", "60"))
COMPUTE = float(os.environ.get("SILENT_COMPUTE", "2"))


def local_compute(a, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = torch.tanh(a @ a)
    return a


def ddp():
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(512, 512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    a = torch.randn(256, 256)
    for step in range(STEPS):
        a = local_compute(a, 0.2)
        x = torch.randn(64, 512)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if RANK == 0 and step % 5 == 0:
            print(f"step {step}", flush=True)


def plain():
    a, t = torch.randn(128, 128), torch.ones(4)
    for _ in range(STEPS):
        a = local_compute(a, COMPUTE)
        dist.all_reduce(t)
        t.fill_(1)


def main():
    dist.init_process_group("gloo", init_method="env://")
    print(f"start {RANK}", flush=True)
    ddp() if MODE == "ddp" else plain()
    dist.barrier()
    print(f"done {RANK}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
