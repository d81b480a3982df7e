#!/usr/bin/python3
"""The re-form peer of bench/recovery: torch_ckpt.py's model and data under
`cohort run --on-failure reform`, with cohort's PyTorch module
(cohort_reform, on the workers' path): survivors keep their process and
state, a newcomer receives the state from a survivor. No checkpoint.

Prints, on rank 0, "world=W" at start and after every re-form; one "step
N/TOTAL" line per completed step (flushed) on the lowest rank that trains
(rank 0 unless it catches up: job.slot 0); a newcomer given the state at its
join prints "received N bytes" (with COHORT_REFORM_CATCHUP=0; one that catches
up in the background has rank 0's "cohort_reform: rank(s) ... caught up:
received N bytes ..." line instead).
"""
import argparse
import os
import sys

import torch

import cohort_reform

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from gpt2_torch import GPT2  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    for name in ("--layers", "--heads", "--channels", "--vocab", "--steps"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = dict(vocab=a.vocab, npos=a.seq_len, layers=a.layers, heads=a.heads,
               channels=a.channels)
    model = GPT2(cfg, "lm")
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    job = cohort_reform.Job(model, opt, batch_size=a.batch)
    r = job.reforms[-1]
    if r["received"]:
        print("received %d bytes" % r["received"], flush=True)
    if job.rank == 0:
        print("world=%d" % job.world_size, flush=True)
    seen, report = len(job.reforms), False
    B, T, V = a.batch, a.seq_len, a.vocab
    while job.step < a.steps:
        before = job.step
        with job.training_step():
            first = job.position + job.slot * B
            report = job.slot == 0 and not job.catching_up
            rows = [torch.randint(0, V, (T + 1,), generator=torch.Generator().manual_seed(first + i))
                    for i in range(B)]
            tokens = torch.stack(rows)
            opt.zero_grad(set_to_none=True)
            loss = job.ddp(tokens[:, :T], None, tokens[:, 1:], None, None)
            loss.backward()
            opt.step()
        # A step completed before a re-form at its boundary (a node joining) counts: its
        # line first, then the new world's.
        if job.step > before and report:
            print("step %d/%d loss %.4f" % (job.step, a.steps, loss.item()), flush=True)
        if len(job.reforms) > seen:
            seen = len(job.reforms)
            if job.rank == 0:
                print("world=%d" % job.world_size, flush=True)


if __name__ == "__main__":
    main()
