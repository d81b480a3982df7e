#!/usr/bin/python3
"""The restart peer of bench/recovery: PyTorch DDP over gloo with the
recipe of PyTorch's elastic tutorial (torchrun restarts every worker after a
failure; the script loads its latest snapshot at start and writes one every
--ckpt-every steps). The model is bench/train/gpt2_torch.py's GPT-2 with the
sizes cohort-gpt2 is given, on the seed's fake data.

Prints, on rank 0, "world=W" at start, "resumed at step S" after a load, and
one "step N/TOTAL" line per completed step (flushed), the lines
bench/recovery/run.py times.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from gpt2_torch import GPT2  # noqa: E402


def snapshot_load(path, model, opt):
    if not os.path.exists(path):
        return 0
    snap = torch.load(path)
    model.load_state_dict(snap["model"])
    opt.load_state_dict(snap["opt"])
    return snap["step"]


def snapshot_save(path, model, opt, step):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--channels", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--ckpt", required=True, help="the snapshot file (shared by the nodes)")
    ap.add_argument("--ckpt-every", type=int, required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = dict(vocab=a.vocab, npos=a.seq_len, layers=a.layers, heads=a.heads,
               channels=a.channels)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = GPT2(cfg, "lm")
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    start = snapshot_load(a.ckpt, model, opt)
    ddp = DDP(model)
    if rank == 0:
        print("world=%d" % world, flush=True)
        if start:
            print("resumed at step %d" % start, flush=True)
    B, T, V = a.batch, a.seq_len, a.vocab
    for step in range(start + 1, a.steps + 1):
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        tokens = torch.randint(0, V, (B, T + 1), generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = ddp(tokens[:, :T], None, tokens[:, 1:], None, None)
        loss.backward()
        opt.step()
        if rank == 0:
            print("step %d/%d loss %.4f" % (step, a.steps, loss.item()), flush=True)
            if step % a.ckpt_every == 0:
                t0 = time.monotonic()
                snapshot_save(a.ckpt, model, opt, step)
                print("checkpoint: step %d written in %.3f s" % (step, time.monotonic() - t0),
                      flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
