"""An ordinary PyTorch DDP training script (gloo, env:// init), as a user
would write it for torchrun. Each rank initialises its model from a different
seed, so identical parameters at the end show that DDP's broadcast and
gradient averaging really ran across the ranks. Prints one line
"PARAMS <sha256>" per rank."""
import hashlib
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(int(os.environ.get("STEPS", "20"))):
        x = torch.randn(8, 16, generator=gen)
        y = x.sum(1, keepdim=True)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("PARAMS " + hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    print(f"LOSS {loss.item():.6f} world {dist.get_world_size()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
