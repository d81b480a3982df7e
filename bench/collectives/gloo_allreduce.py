"""gloo_allreduce.py - the PyTorch Gloo peer of bench/collectives/run.sh.

Usage (one process per rank; MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE set):
    gloo_allreduce.py ITERS WARMUP SIZE...
For each size (bytes of float32) rank 0 prints "SIZE TIME_US", the slowest
rank's mean time of one dist.all_reduce(SUM) over ITERS after WARMUP.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    iters, warmup = int(sys.argv[1]), int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    for size in sizes:
        t = torch.arange(size // 4, dtype=torch.float32).remainder_(7)
        for _ in range(warmup):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        us = torch.tensor([(time.perf_counter() - t0) / iters * 1e6], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"{size} {us.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
