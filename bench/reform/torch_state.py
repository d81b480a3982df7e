#!/usr/bin/python3
"""bench/reform/torch_state.py: handing a PyTorch job's state to a newcomer,
cohort_reform's transfer (each tensor sent as it is, a small pickled outline
ahead) beside the serialized one it replaced (torch.save of the whole state
into one buffer, sent, torch.load on the other side), side by side in one run.

Two processes on loopback (gloo, 127.0.0.1), 1 thread each: the donor holds
a GPT-2 (bench/train/gpt2_torch.py's, --model) and its AdamW state after a
step; the receiver a fresh model and an optimizer without state. Each rep
changes the donor's state (one more AdamW step) and runs both rows in turn
(the order alternating); a row's figure is the seconds from a barrier before
the transfer to a barrier after the receiver loaded the state. After every
transfer the receiver's parameters and optimizer state are compared with the
donor's (a SHA-256 of every tensor's bytes): a run that did not hand over the
exact state prints no figure and the script exits 1.

Prints the median of --reps per row with every rep beside it, the bytes, the
rate and the ratio.
Debian's torch: run with /usr/bin/python3.
"""
import argparse
import hashlib
import io
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
ROWS = ("tensors (cohort_reform)", "serialized (torch.save/load)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_hash(job):
    import torch
    h = hashlib.sha256()
    tensors = []

    def walk(o):
        if torch.is_tensor(o):
            tensors.append(o)
        elif isinstance(o, dict):
            for k in sorted(o, key=str):
                walk(o[k])
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
    walk(job.state_dict())
    for t in tensors:
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def serialized(job, donor, behind):
    """The transfer cohort_reform made before (one torch.save buffer); (sent, received)."""
    import torch
    import torch.distributed as dist
    if job.rank == donor:
        buf = io.BytesIO()
        torch.save(job.state_dict(), buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        works = []
        for r in behind:
            works += [dist.isend(size, r), dist.isend(data, r)]
        for w in works:
            w.wait()
        return data.numel() * len(behind), 0
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, donor)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(data, donor)
    job.load_state_dict(torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu"))
    return 0, data.numel()


def worker(a):
    sys.path.insert(0, os.path.join(ROOT, "src", "agent", "python"))
    sys.path.insert(0, os.path.join(ROOT, "bench", "train"))
    import torch
    import torch.distributed as dist
    import cohort_reform
    from gpt2_torch import GPT2, PRESETS
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port,
                            rank=a.worker, world_size=2)
    torch.manual_seed(a.worker)
    cfg = dict(PRESETS[a.model], npos=a.seq_len)
    model = GPT2(cfg, "lm")
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    job = cohort_reform.Job.__new__(cohort_reform.Job)  # the state's parts, no process group
    job.module, job.optimizer, job.extra, job.backend = model, opt, {}, "gloo"
    job.step, job.position, job.has_state = 0, 0, a.worker == 0
    for rep in range(a.reps):
        order = [0, 1] if rep % 2 == 0 else [1, 0]
        for row in order:
            if a.worker == 0:  # a new state each time: nothing the receiver has yet
                for p in model.parameters():
                    p.grad = torch.randn_like(p)
                opt.step()
                job.step += 1
                job.position += 4
            dist.barrier()
            t0 = time.monotonic()
            if row == 0:
                sent, got = job._transfer([0], [1])
            else:
                sent, got = serialized(job, 0, [1])
            dist.barrier()
            secs = time.monotonic() - t0
            both = [None, None]
            dist.all_gather_object(both, state_hash(job))
            if a.worker == 0:
                print("run rep=%d row=%d secs=%.4f bytes=%d same=%d"
                      % (rep, row, secs, sent, both[0] == both[1]), flush=True)
    dist.destroy_process_group()


def parse(line):
    return {k: v for k, v in (w.split("=", 1) for w in line.split()[1:])}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="124M", help="a preset of bench/train/gpt2_torch.py")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--limit", type=int, default=900, help="seconds for the whole run")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.reps < 1:
        sys.exit("torch_state.py: --reps must be at least 1")
    if a.worker is not None:
        return worker(a)
    port = free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--model", a.model, "--seq-len",
           str(a.seq_len), "--reps", str(a.reps), "--port", str(port), "--worker"]
    with open(os.devnull, "w") as null:
        procs = [subprocess.Popen(cmd + [str(r)], stdout=subprocess.PIPE, stderr=null, text=True)
                 for r in (0, 1)]
        try:
            outs = [p.communicate(timeout=a.limit)[0] for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
                p.wait()
            sys.exit("torch_state.py: the %d s limit came first: no figure" % a.limit)
    if any(p.returncode != 0 for p in procs):
        sys.exit("torch_state.py: a process failed (exit %s): no figure"
                 % [p.returncode for p in procs])
    runs = [parse(l) for l in outs[0].splitlines() if l.startswith("run ")]
    if len(runs) != 2 * a.reps or any(r["same"] != "1" for r in runs):
        sys.exit("torch_state.py: a transfer did not hand over the donor's exact state: "
                 "no figure\n" + outs[0])
    load = os.getloadavg()[0]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print("# bench/reform/torch_state.py: GPT-2 %s (T=%d) + AdamW state, donor -> 1 newcomer, "
          "gloo on loopback, torch %s; %s, %d cores, load %.1f; %d reps"
          % (a.model, a.seq_len, __import__("torch").__version__, cpu, os.cpu_count(), load,
             a.reps))
    print("| row | seconds (median; each rep) | bytes | GB/s |")
    print("|---|---|---|---|")
    med = []
    for row, name in enumerate(ROWS):
        rs = [r for r in runs if int(r["row"]) == row]
        secs = [float(r["secs"]) for r in rs]
        m = statistics.median(secs)
        med.append(m)
        nbytes = int(rs[0]["bytes"])
        print("| %s | %.3f (%s) | %s | %.2f |"
              % (name, m, ", ".join("%.3f" % s for s in secs), format(nbytes, ","),
                 nbytes / m * 1e-9))
    print("serialized / tensors: %.2fx" % (med[1] / med[0]))


if __name__ == "__main__":
    main()
