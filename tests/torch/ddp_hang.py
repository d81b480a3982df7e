"""A PyTorch gloo DDP job whose rank HANG_RANK stops at step HANG_STEP in
one of the ways ranks hang (HANG_MODE: `sleep` in its data loader, `spin`
in a Python loop, `pipe` blocked on a read); the other ranks then wait in
DDP's gradient all_reduce. Prints "hanging" from the stuck rank."""
import os
import time

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
HANG_RANK = int(os.environ.get("HANG_RANK", "-1"))
HANG_STEP = int(os.environ.get("HANG_STEP", "3"))
MODE = os.environ.get("HANG_MODE", "sleep")


def get_batch(step, gen):
    if RANK == HANG_RANK and step == HANG_STEP:
        print("hanging", flush=True)
        if MODE == "sleep":
            time.sleep(3600)  # HANG-SLEEP
        elif MODE == "spin":
            while True: pass  # HANG-SPIN  # noqa: E701
        else:
            r, _w = os.pipe()
            os.read(r, 1)  # HANG-PIPE
    x = torch.randn(8, 16, generator=gen)
    return x, x.sum(1, keepdim=True)


def main():
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(RANK)
    for step in range(int(os.environ.get("STEPS", "1000000"))):
        x, y = get_batch(step, gen)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()  # DDP-BACKWARD
        opt.step()
        if step % 100 == 0:
            print(f"step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
