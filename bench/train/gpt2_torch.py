#!/usr/bin/python3
"""The PyTorch peer of cohort-gpt2's benchmark: the same GPT-2 (pre-LN,
causal attention, GELU tanh, tied embeddings; LM head or the
GPT2ForQuestionAnswering head with an attention mask), the same fake data
shapes, optimiser and thread count, trained on the CPU in float32.

Prints one JSON object: {"step_s": [...], "tokens_per_s": median, ...}
(global tokens/s; rank 0 only when run as several ranks with DDP).
"""
import argparse
import json
import os
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

PRESETS = {
    "124M": dict(vocab=50257, npos=1024, layers=12, heads=12, channels=768),
    "350M": dict(vocab=50257, npos=1024, layers=24, heads=16, channels=1024),
    "tiny": dict(vocab=512, npos=64, layers=2, heads=4, channels=64),
}


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x, bias):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(hs) + bias, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, cfg, head):
        super().__init__()
        C = cfg["channels"]
        self.head = head
        self.wte = nn.Embedding(cfg["vocab"], C)
        self.wpe = nn.Embedding(cfg["npos"], C)
        self.blocks = nn.ModuleList(Block(C, cfg["heads"]) for _ in range(cfg["layers"]))
        self.lnf = nn.LayerNorm(C)
        if head == "qa":
            self.qa = nn.Linear(C, 2)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg["layers"]) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, mask, targets, start, end):
        B, T = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        bias = torch.full((T, T), float("-inf")).triu(1)
        if mask is not None:
            bias = bias + (1.0 - mask.float())[:, None, None, :] * -10000.0
        for blk in self.blocks:
            x = blk(x, bias)
        x = self.lnf(x)
        if self.head == "lm":
            logits = x @ self.wte.weight.T
            return F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))
        logits = self.qa(x)
        return (F.cross_entropy(logits[..., 0], start) + F.cross_entropy(logits[..., 1], end)) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="124M", choices=sorted(PRESETS))
    ap.add_argument("--head", default="lm", choices=["lm", "qa"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ddp-hook", default="none", choices=["none", "fp16", "powersgd"],
                    help="with WORLD_SIZE > 1 (torchrun's environment): DDP over gloo, with "
                         "no comm hook, fp16_compress_hook or powerSGD_hook")
    ap.add_argument("--powersgd-rank", type=int, default=4,
                    help="powerSGD_hook's matrix_approximation_rank")
    ap.add_argument("--powersgd-start", type=int, default=2,
                    help="powerSGD_hook's start_powerSGD_iter (vanilla allreduce before)")
    ap.add_argument("--bucket-cap-mb", type=float, default=25,
                    help="DDP's bucket_cap_mb (its default 25)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = PRESETS[a.model]
    model = GPT2(cfg, a.head)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
        if a.ddp_hook == "powersgd":
            # One bucket (docs/gpt2.md): DDP's rebuild after the first step keeps a first bucket
            # of this size whatever bucket_cap_mb says.
            dist._DEFAULT_FIRST_BUCKET_BYTES = int(a.bucket_cap_mb * 2**20)
        model = DDP(model, bucket_cap_mb=a.bucket_cap_mb)
        if a.ddp_hook == "fp16":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif a.ddp_hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=a.powersgd_rank,
                start_powerSGD_iter=a.powersgd_start)
            model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    if a.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    B, T, V = a.batch, a.seq_len, cfg["vocab"]
    times = []
    for _ in range(a.steps):
        # The seed's fake data.
        tokens = torch.randint(0, V, (B, T + 1))
        mask = torch.randint(0, 2, (B, T)) if a.head == "qa" else None
        start = torch.randint(0, T, (B,))
        end = torch.randint(0, T, (B,))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens[:, :T], mask, tokens[:, 1:], start, end)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times[1:] if len(times) > 1 else times)
    if world > 1:
        dist.barrier()
        if dist.get_rank() != 0:
            return
    print(json.dumps({"step_s": times, "median_step_s": med, "tokens_per_s": world * B * T / med,
                      "loss": loss.item(), "threads": a.threads, "world": world,
                      "ddp_hook": a.ddp_hook if world > 1 else "none"}))


if __name__ == "__main__":
    main()
