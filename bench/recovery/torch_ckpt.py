#!/usr/bin/python3
"""The restart peer of bench/recovery: PyTorch DDP over gloo with the
recipe of PyTorch's elastic tutorial (torchrun restarts every worker after a
failure; the script loads its latest snapshot at start and writes one every
--ckpt-every steps). The model is bench/train/gpt2_torch.py's GPT-2 with the
sizes cohort-gpt2 is given, on the seed's fake data.

Prints, on rank 0, "world=W" at start, "resumed at step S" after a load, and
one "step N/TOTAL" line per completed step (flushed), the lines
bench/recovery/run.py times.

--grad-compress powersgd[:RANK] registers DDP's own powerSGD_hook (rank 4 by
default, as cohort-gpt2; vanilla allreduce for the first --powersgd-start
steps) with the whole model in ONE bucket: with several, torch 1.13's hook
starts a bucket's P and Q allreduces from gloo's callback thread while the
autograd thread starts the next bucket's, the ranks number their collectives
in different orders and gloo aborts ("op.preamble.length <= op.nbytes").
bucket_cap_mb alone does not make one bucket: DDP's rebuild after the first
step keeps a first bucket of dist._DEFAULT_FIRST_BUCKET_BYTES (1 MB), so that
is raised too (docs/reform.md, "PowerSGD in the torchrun restart row").
Every rank writes its PowerSGDState (error feedback, warm-start P and Q, its
RNG, iteration) beside the snapshot at the same step, and a restart loads it
when every rank has one of the snapshot's step; its first step runs
uncompressed (DDP rebuilds its bucket after it, in the order the saved state
was laid out in). --grad-compress bf16 asks for bf16_compress_hook, which
torch 1.13 refuses without CUDA and NCCL. powerSGD_hook calls
torch.cuda.synchronize on the bucket's device wherever CUDA is available, which
fails at the first compressed step on CPU tensors (bench/recovery hides the GPUs
from these workers). --probe says whether this torch can train with the
compression (exit 0) or why not (exit 2), without a job.
"""
import argparse
import os
import re
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
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


def checkpoint(a, rank, model, opt, psgd, step):
    """Every rank its PowerSGD state (if any), then rank 0 the snapshot and how long its part
    took ("checkpoint: step N written in T s", after its step line: run.py leaves it out)."""
    t0 = time.monotonic()
    if psgd is not None:
        psgd_save(a.ckpt, rank, psgd, step)
    if rank == 0:
        snapshot_save(a.ckpt, model, opt, step)
        print("checkpoint: step %d written in %.3f s" % (step, time.monotonic() - t0),
              flush=True)


def psgd_path(path, rank):
    return "%s.psgd%d" % (path, rank)


def psgd_save(path, rank, state, step):
    """This rank's PowerSGDState (pickled by its __getstate__, the process group left out)."""
    tmp = psgd_path(path, rank) + ".tmp"
    torch.save({"step": step, "state": state}, tmp)
    os.replace(tmp, psgd_path(path, rank))


def psgd_load(path, rank, start, fresh):
    """The saved PowerSGDState when every rank has one of the snapshot's step, else fresh
    (every rank decides alike: one compressing and another not would mismatch collectives).
    Its first step after the load runs uncompressed: DDP lays its bucket out anew after
    one step, and the saved error feedback and P, Q are in that layout."""
    p = psgd_path(path, rank)
    saved = torch.load(p) if start and os.path.exists(p) else None
    ok = torch.tensor([1 if saved and saved["step"] == start else 0])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if not ok.item():
        return fresh, False
    state = saved["state"]
    state.iter = min(state.iter, state.start_powerSGD_iter - 1)
    return state, True


def one_bucket(model):
    """DDP's bucket size and its rebuilt first bucket's both above the model's gradients."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    dist._DEFAULT_FIRST_BUCKET_BYTES = nbytes + (1 << 20)
    return nbytes / (1 << 20) + 1


def compression(a, model, rank, start):
    """(the DDP, the PowerSGDState or None, whether it was loaded) for --grad-compress."""
    if not a.grad_compress.startswith("powersgd"):
        ddp = DDP(model)
        if a.grad_compress == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        return ddp, None, False
    m = re.fullmatch(r"powersgd(?::(\d+))?", a.grad_compress)
    fresh = powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=int(m.group(1) or 4),
        start_powerSGD_iter=a.powersgd_start)
    state, loaded = psgd_load(a.ckpt, rank, start, fresh)
    ddp = DDP(model, bucket_cap_mb=one_bucket(model))
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp, state, loaded


def probe(a):
    """Sets the compression up on a 1-rank gloo group and trains a layer past the hook's
    warm-up (powerSGD_hook on CPU tensors where CUDA is available fails only there): exit
    0, or print why not and exit 2."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    code = 0
    try:
        ddp = compression(a, torch.nn.Linear(64, 64), 0, 0)[0]
        for _ in range(a.powersgd_start + 2):
            ddp(torch.ones(2, 64)).sum().backward()
    except Exception as e:  # noqa: BLE001 (the reason is what the caller prints)
        print("%s: %s" % (type(e).__name__, (str(e).strip().splitlines() or ["?"])[0]))
        code = 2
    # Not sys.exit: after a trained DDP, torch 1.13's interpreter finalisation aborts now and
    # then ("terminate called without an active exception", 3 of 20 runs), which the caller
    # would read as the answer.
    sys.stdout.flush()
    os._exit(code)


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
    ap.add_argument("--grad-compress", default="none",
                    help="none, bf16 or powersgd[:RANK] (DDP's comm hooks)")
    ap.add_argument("--powersgd-start", type=int, default=2,
                    help="powerSGD_hook's start_powerSGD_iter (default 2)")
    ap.add_argument("--probe", action="store_true",
                    help="only say whether the compression can be set up here")
    a = ap.parse_args()
    if not re.fullmatch(r"none|bf16|powersgd(:[1-9][0-9]*)?", a.grad_compress):
        ap.error("--grad-compress must be none, bf16 or powersgd[:RANK]")
    if a.probe:
        probe(a)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = dict(vocab=a.vocab, npos=a.seq_len, layers=a.layers, heads=a.heads,
               channels=a.channels)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = GPT2(cfg, "lm")
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    start = snapshot_load(a.ckpt, model, opt)
    ddp, psgd, loaded = compression(a, model, rank, start)
    if rank == 0:
        print("world=%d" % world, flush=True)
        if start:
            print("resumed at step %d" % start, flush=True)
        if start and psgd is not None:
            print("PowerSGD state %s" % ("loaded" if loaded else "not saved at that step: "
                                         "warm-up again"), flush=True)
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
            checkpoint(a, rank, model, opt, psgd, step)
    if rank == 0 and psgd is not None:
        rate, before, after = psgd.compression_stats()
        print("PowerSGD: compression %.1fx (%d floats -> %d over this process's compressed "
              "steps)" % (rate, before, after), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
