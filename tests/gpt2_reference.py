#!/usr/bin/python3
"""PyTorch reference for cohort-gpt2's model (used by test_gpt2_ref).

Reads a dump written by tests/test_gpt2_ref.c (weights, batch, and the C
side's loss, logits, gradients and weights after two AdamW and two SGD
steps), rebuilds the same GPT-2 in float64 with torch.nn.functional, and
compares. Exits 0 when everything agrees within relative tolerance 1e-4,
1 otherwise (printing the worst errors), 2 on a malformed dump.

The model: pre-LN blocks, causal attention with a padding mask on keys
added as -10000 to the scores (the original GPT-2 convention), GELU (tanh),
tied embeddings for the LM head; the QA head is Hugging Face's
GPT2ForQuestionAnswering (Linear(C, 2), loss = mean of the start and end
cross-entropies over positions).
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

TOL = 1e-4


def load(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))
        arrays = {}
        for a in meta["arrays"]:
            dt = torch.float32 if a["dtype"] == "f32" else torch.int32
            raw = f.read(4 * a["count"])
            if len(raw) != 4 * a["count"]:
                raise ValueError("truncated dump")
            arrays[a["name"]] = torch.frombuffer(bytearray(raw), dtype=dt).clone()
        if f.read(1):
            raise ValueError("trailing bytes in dump")
    return meta, arrays


def unpack_params(meta, flat):
    """Named float64 leaf tensors viewing the flat parameter vector."""
    params = {}
    for t in meta["tensors"]:
        v = flat[t["offset"]: t["offset"] + t["rows"] * t["cols"]].double()
        shape = (t["rows"], t["cols"]) if t["rows"] > 1 else (t["cols"],)
        params[t["name"]] = v.reshape(shape).clone().requires_grad_(True)
    return params


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def forward(meta, p, tokens, mask, start, end, targets):
    B, T, C, NH = meta["B"], meta["T"], meta["channels"], meta["heads"]
    hs = C // NH
    x = p["wte"][tokens] + p["wpe"][:T]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    use_mask = meta["head"] == "qa" and meta.get("masked", 0)
    for l in range(meta["layers"]):
        g = lambda n: p["h%d.%s" % (l, n)]
        h = layernorm(x, g("ln1w"), g("ln1b"))
        qkv = h @ g("qkvw").T + g("qkvb")
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf"))
        if use_mask:
            att = att + (1.0 - mask.double())[:, None, None, :] * -10000.0
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ g("attprojw").T + g("attprojb")
        h = layernorm(x, g("ln2w"), g("ln2b"))
        h = F.gelu(h @ g("fcw").T + g("fcb"), approximate="tanh")
        x = x + h @ g("fcprojw").T + g("fcprojb")
    x = layernorm(x, p["lnfw"], p["lnfb"])
    if meta["head"] == "lm":
        logits = x @ p["wte"].T
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1).long())
    else:
        logits = x @ p["qaw"].T + p["qab"]
        s_logits, e_logits = logits[..., 0], logits[..., 1]
        loss = (F.cross_entropy(s_logits, start.long()) + F.cross_entropy(e_logits, end.long())) / 2
    return loss, logits


def rel(a, b, floor=0.0):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), floor, 1e-300)).item()


def main():
    if len(sys.argv) != 2:
        print("usage: gpt2_reference.py DUMP", file=sys.stderr)
        return 2
    try:
        meta, a = load(sys.argv[1])
    except (OSError, ValueError, KeyError) as e:
        print("gpt2_reference: bad dump: %s" % e, file=sys.stderr)
        return 2
    B, T = meta["B"], meta["T"]
    tokens = a["tokens"].view(B, T).long()
    targets = a["targets"].view(B, T)
    mask = a["mask"].view(B, T)
    p = unpack_params(meta, a["params"])
    loss, logits = forward(meta, p, tokens, mask, a["start"], a["end"], targets)
    loss.backward()

    failures = []
    worst = {}

    def check(name, err, tol=TOL):
        worst[name] = err
        if not err <= tol:
            failures.append("%s: relative error %.3g > %.1g" % (name, err, tol))

    check("loss", abs(a["loss"].item() - loss.item()) / abs(loss.item()))
    check("logits", rel(a["logits"], logits.detach().reshape(-1)))
    gflat = a["grads"]
    total = math.sqrt(sum(float(v.grad.norm()) ** 2 for v in p.values()))
    for t in meta["tensors"]:
        ref = p[t["name"]].grad.reshape(-1)
        got = gflat[t["offset"]: t["offset"] + ref.numel()]
        # Gradients that vanish in exact arithmetic (a bias under softmax
        # shift invariance) are judged against the total gradient norm.
        check("grad " + t["name"], rel(got, ref, floor=1e-2 * total))

    # Optimisers from the same weights and the C side's gradients.
    for kind in ("adamw", "sgd"):
        cfg = meta[kind]
        q = unpack_params(meta, a["params"])
        for t in meta["tensors"]:
            n = t["rows"] * t["cols"]
            q[t["name"]].grad = gflat[t["offset"]: t["offset"] + n].double().reshape(q[t["name"]].shape)
        decay = [q[t["name"]] for t in meta["tensors"] if t["decay"]]
        nodecay = [q[t["name"]] for t in meta["tensors"] if not t["decay"]]
        if kind == "adamw":
            opt = torch.optim.AdamW(
                [{"params": decay, "weight_decay": cfg["weight_decay"]},
                 {"params": nodecay, "weight_decay": 0.0}],
                lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
        else:
            opt = torch.optim.SGD(decay + nodecay, lr=cfg["lr"], momentum=cfg["momentum"])
        with torch.no_grad():
            for _ in range(cfg["steps"]):
                opt.step()
        ref = torch.cat([q[t["name"]].detach().reshape(-1) for t in meta["tensors"]])
        got = a[kind]
        # Compare the moves, not the weights (which barely change).
        move = ref - a["params"].double()
        check(kind + " update", rel(got.double() - a["params"].double(), move, floor=1e-3 * move.norm().item()))

    status = "ok" if not failures else "FAILED"
    print("gpt2_reference [%s head]: %s; loss %.6f (C %.6f); worst %s" % (
        meta["head"], status, loss.item(), a["loss"].item(),
        ", ".join("%s %.2g" % kv for kv in sorted(worst.items(), key=lambda kv: -kv[1])[:4])))
    for f in failures:
        print("  " + f)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
