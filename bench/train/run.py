#!/usr/bin/python3
"""Training benchmark of cohort-gpt2 against its PyTorch peer.

Runs, interleaved and repeated (medians of --reps runs, each the median of
its steps after the first):
  1. throughput: PyTorch (bench/train/gpt2_torch.py) and cohort-gpt2 on the
     same GPT-2, batch, sequence length and threads, for the LM head with
     AdamW and the QA head with SGD (the seed's workload);
  2. FLOP rate: cohort-gpt2's model GFLOP/s against OpenBLAS sgemm on the
     same matrix shapes in the same run (gpt2-sgemm-rate);
  3. scaling: 2 ranks x 1 thread against 1 rank x 1 thread at the same
     per-rank batch (a store on loopback, ranks started with the
     environment `cohort run` gives them), with the hidden share of the
     communication;
  4. memory: peak RSS against params+grads+optimizer+activations;
  5. shaped links (root; --only shaped, or part of all): two network
     namespaces joined by a veth pair shaped with tc (tbf) at each rate of
     --rates, set up and removed here; one rank against two ranks (one per
     namespace) for cohort-gpt2 with each --grad-compress of --compress, and
     PyTorch DDP (gloo) with no hook, fp16_compress_hook and, for each
     powersgd[:RANK] of --compress, powerSGD_hook of that rank, all in the same
     run (PowerSGD from the third step on in both, figures over the steps
     after that): tokens/s, scaling, allreduce time and hidden share, bytes on the
     wire. Beside them two independent 1-rank runs at once (no exchange):
     what the two ranks' compute alone gets from the machine's cores,
     memory and caches, the ceiling of any scaling figure there. A run
     that did not do its work (a rank failed, fewer steps, no bytes on the
     wire, no compression where asked) stops the benchmark instead of
     printing a figure. Then where rank 0's step goes: its main thread's CPU
     time (compute, compression, update) and its waits.
Every table is printed with the machine: CPU model, cores, OPENBLAS_CORETYPE
and OpenBLAS's core, memory bandwidth (bench/collectives/mem_bound), load.

usage: bench/train/run.py [--build DIR] [--reps N] [--steps N] [--model M]
                          [--only all|scaling|shaped] [--rates 1gbit,10gbit]
                          [--compress none,bf16,powersgd:4]
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def machine_probe(a, tmp):
    """What the figures were measured on: CPU model and cores (/proc/cpuinfo), OPENBLAS_CORETYPE
    and the core OpenBLAS runs (its OPENBLAS_VERBOSE line), and the memory bandwidth of
    bench/collectives/mem_bound (two threads, each reading its half of two 256 MiB arrays and
    writing both: 4 x 256 MiB a round; the best of 5 rounds). Returns a function that formats
    them with the load average of the moment."""
    model, cores = "unknown CPU", os.cpu_count()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    env = dict(os.environ, OPENBLAS_VERBOSE="2")
    out = subprocess.run([os.path.join(a.build, "gpt2-sgemm-rate")], env=env,
                         capture_output=True, text=True, timeout=60)
    # OpenBLAS names its core at every load: the last is the one that ran (gpt2-sgemm-rate, like
    # cohort-gpt2, starts again with better kernels when OpenBLAS chose its Prescott fallback).
    named = re.findall(r"Core: (\S+)", out.stdout + out.stderr)
    core = named[-1] if named else "?"
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    blas = ("OPENBLAS_CORETYPE=%s" % coretype if coretype else "OPENBLAS_CORETYPE unset") + \
        " (OpenBLAS core %s)" % core
    exe, nbytes = os.path.join(tmp, "mem_bound"), 256 << 20
    bw = "memory bandwidth: no figure"
    if subprocess.run(["cc", "-O3", "-pthread", "-o", exe,
                       os.path.join(HERE, "..", "collectives", "mem_bound.c")]).returncode == 0:
        us = []
        for _ in range(5):
            r = subprocess.run([exe, "1", "1", str(nbytes)], capture_output=True, text=True,
                               timeout=300)
            if r.returncode == 0 and r.stdout.split():
                us.append(float(r.stdout.split()[1]))
        if len(us) == 5:
            bw = "memory %.1f GB/s (mem_bound, 2 threads)" % (4 * nbytes / min(us) / 1e3)

    def describe():
        load = " ".join(open("/proc/loadavg").read().split()[:3])
        return "machine: %s, %d cores, %s, %s, load average %s" % (model, cores, blas, bw, load)
    return describe


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def read_metrics(path):
    rows = []
    with open(path) as f:
        for line in f:
            rows.append(json.loads(line))
    return rows


def step_median(rows):
    ms = [r["step_ms"] for r in rows[1:]] or [r["step_ms"] for r in rows]
    return median(ms) / 1e3


def checked_metrics(path, a, world, compress="none"):
    """Rank 0's metrics, refused unless the run did its work: every step, on `world` ranks, and
    with several ranks bytes on the wire compressed as asked."""
    rows = read_metrics(path)
    if len(rows) != a.steps or any(r["world"] != world for r in rows):
        sys.exit("%s: %d steps on world %s, expected %d on %d: no figure" % (
            path, len(rows), sorted({r["world"] for r in rows}), a.steps, world))
    if world > 1:
        compressed = rows[PSGD_START:] if psgd_rank(compress) else rows
        ratio = median([r["compress_ratio"] for r in compressed])
        if min(r["wire_mb"] for r in rows) <= 0 or (compress != "none") != (ratio > 1.5):
            sys.exit("%s: wire %s MB, compression %.2fx with --grad-compress %s: no figure" % (
                path, min(r["wire_mb"] for r in rows), ratio, compress))
    return rows


def run_cohort(a, tmp, tag, head, opt, threads, world=1, ns=None, compress="none",
               alongside=False):
    """Runs cohort-gpt2 on `world` ranks (rank r in namespace ns[r] when given, the store in
    ns[0] at ns_addr(0)); returns rank 0's checked metrics and output. alongside (world 1): two
    independent runs at once, and a list of both runs' metrics."""
    metrics = os.path.join(tmp, tag + ".jsonl")
    args = [os.path.join(a.build, "cohort-gpt2"), "--model", a.model, "--batch", str(a.batch),
            "--seq-len", str(a.seq_len), "--steps", str(a.steps), "--head", head,
            "--optimizer", opt, "--quiet", "--metrics", metrics, "--grad-compress", compress,
            "--powersgd-start", str(PSGD_START)]
    pre = (lambda r: ["ip", "netns", "exec", ns[r]]) if ns else (lambda r: [])
    host = ns_addr(0) if ns else "127.0.0.1"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="passive")
    for k in ("RANK", "WORLD_SIZE"):
        env.pop(k, None)
    if world == 1 and not alongside:
        out = subprocess.run(pre(0) + args, env=env, capture_output=True, text=True,
                             timeout=3600)
        if out.returncode != 0:
            sys.exit("cohort-gpt2 failed: " + out.stderr.strip())
        return checked_metrics(metrics, a, 1), out.stdout
    if world == 1:
        # Two 1-rank runs at once, each its own metrics: no exchange, both cores busy.
        procs = [subprocess.Popen(pre(0) + [x if x != metrics else metrics + ".%d" % i
                                            for x in args], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(2)]
        outs = [p.communicate(timeout=3600) for p in procs]
        for p, (o, e) in zip(procs, outs):
            if p.returncode != 0:
                sys.exit("cohort-gpt2 failed: " + e.strip())
        return [checked_metrics(metrics + ".%d" % i, a, 1) for i in range(2)], outs[0][0]
    store = subprocess.Popen(pre(0) + [os.path.join(a.build, "cohort"), "store", "serve",
                                       "--host", host, "--port", "0"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        line = store.stdout.readline()
        m = re.search(r"(%s:\d+)" % re.escape(host), line)
        if not m:
            sys.exit("cannot start a store: " + line)
        procs = []
        job = "bench-%s-%d" % (tag, time.time_ns())
        for r in range(world):
            e = dict(env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                     LOCAL_WORLD_SIZE=str(world), COHORT_STORE=m.group(1),
                     COHORT_JOB_ID=job)
            rargs = args if r == 0 else [x if x != metrics else metrics + ".r%d" % r for x in args]
            procs.append(subprocess.Popen(pre(r) + rargs, env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=3600) for p in procs]
        for p, (o, e) in zip(procs, outs):
            if p.returncode != 0:
                sys.exit("cohort-gpt2 rank failed: " + e.strip())
        return checked_metrics(metrics, a, world, compress), outs[0][0]
    finally:
        store.terminate()
        store.wait()


def run_torch(a, head, opt, threads):
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "gpt2_torch.py"), "--model",
                          a.model, "--batch", str(a.batch), "--seq-len", str(a.seq_len),
                          "--steps", str(a.steps), "--head", head, "--optimizer", opt,
                          "--threads", str(threads)],
                         capture_output=True, text=True, timeout=7200)
    if out.returncode != 0:
        sys.exit("PyTorch peer failed: " + out.stderr.strip()[-500:])
    return json.loads(out.stdout)


def main():
    # A SIGTERM (timeout, Ctrl-C of a wrapper) unwinds like an exit, so the shaped-link section
    # removes its namespaces.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench/train: terminated: no figure"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--model", default="124M")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-torch", action="store_true", help="cohort-gpt2 parts only")
    ap.add_argument("--only", choices=["all", "scaling", "shaped"], default="all",
                    help="scaling: only part 3 (2 ranks against 1); shaped: only part 5")
    ap.add_argument("--rates", default="1gbit,10gbit", help="shaped links: tc rates")
    ap.add_argument("--compress", default="none,bf16,powersgd",
                    help="shaped links: cohort-gpt2 --grad-compress values")
    a = ap.parse_args()
    tokens = a.batch * a.seq_len
    tmp = tempfile.mkdtemp(prefix="bench_train.")
    print("cohort-gpt2 training benchmark: GPT-2 %s, B=%d, T=%d, %d threads, %d reps x %d steps"
          % (a.model, a.batch, a.seq_len, a.threads, a.reps, a.steps))
    a.machine = machine_probe(a, tmp)
    print(a.machine())

    # 1. throughput against PyTorch
    cases = [("lm", "adamw"), ("qa", "sgd")]
    res = {c: {"torch": [], "cohort": [], "gflops": []} for c in cases}
    sgemm = []
    rss = None
    for rep in range(a.reps if a.only == "all" else 0):
        for head, opt in cases:
            if not a.skip_torch:
                res[(head, opt)]["torch"].append(run_torch(a, head, opt, a.threads)["median_step_s"])
            rows, out = run_cohort(a, tmp, "%s%d" % (head, rep), head, opt, a.threads)
            res[(head, opt)]["cohort"].append(step_median(rows))
            res[(head, opt)]["gflops"].append(median([r["gflops"] for r in rows[1:]]))
            if head == "lm":
                m = re.search(r"peak RSS ([\d.]+) MiB \(estimate ([\d.]+) MiB", out)
                rss = (float(m.group(1)), float(m.group(2))) if m else rss
        out = subprocess.run([os.path.join(a.build, "gpt2-sgemm-rate"), a.model, "lm",
                              str(a.batch), str(a.seq_len), str(a.threads), "3"],
                             capture_output=True, text=True, timeout=3600)
        sgemm.append(json.loads(out.stdout))

    if a.only == "all":
        report_throughput(a, cases, res, sgemm, tokens)
    if a.only in ("all", "scaling"):
        scaling(a, tmp)
    if a.only == "all":
        print("\n## memory (LM head, AdamW, 1 rank)")
        if rss:
            print(a.machine())
            print("| peak RSS MiB | params+grads+optimizer+activations MiB | ratio |")
            print("|---|---|---|")
            print("| %.1f | %.1f | %.2f |" % (rss[0], rss[1], rss[0] / rss[1]))
    if a.only in ("all", "shaped"):
        shaped(a, tmp)


def report_throughput(a, cases, res, sgemm, tokens):
    print("\n## throughput (median step; tokens/s = B*T/step)")
    print(a.machine())
    print("| head / optimiser | PyTorch s/step | PyTorch tok/s | cohort-gpt2 s/step | cohort-gpt2 tok/s | speed-up |")
    print("|---|---|---|---|---|---|")
    for head, opt in cases:
        r = res[(head, opt)]
        tc, cc = median(r["torch"]), median(r["cohort"])
        print("| %s / %s | %.3f | %.1f | %.3f | %.1f | %.2fx |" % (
            head, opt, tc, tokens / tc if r["torch"] else float("nan"), cc, tokens / cc,
            tc / cc if r["torch"] else float("nan")))

    print("\n## FLOP rate (LM head, same shapes, same run)")
    blas = median([s["openblas_gflops"] for s in sgemm])
    sliced = median([s["sliced_gflops"] for s in sgemm])
    model = median(res[("lm", "adamw")]["gflops"])
    print(a.machine())
    print("| model GFLOP/s | OpenBLAS sgemm GFLOP/s | cohort matmul kernels GFLOP/s | model / sgemm |")
    print("|---|---|---|---|")
    print("| %.1f | %.1f | %.1f | %.0f%% |" % (model, blas, sliced, 100 * model / blas))


def scaling(a, tmp):
    one, two, hid, comm = [], [], [], []
    for rep in range(a.reps):
        rows, _ = run_cohort(a, tmp, "s1_%d" % rep, "lm", "adamw", 1, world=1)
        one.append(a.batch * a.seq_len / step_median(rows))
        rows, _ = run_cohort(a, tmp, "s2_%d" % rep, "lm", "adamw", 1, world=2)
        two.append(2 * a.batch * a.seq_len / step_median(rows))
        hid.append(median([r["hidden_frac"] for r in rows[1:]]))
        comm.append(median([r["comm_ms"] for r in rows[1:]]))
    t1, t2 = median(one), median(two)
    print("\n## scaling (LM head, AdamW, B=%d per rank, 1 thread per rank)" % a.batch)
    print(a.machine())
    print("| 1 rank tok/s | 2 ranks tok/s | efficiency | comm ms/step | comm hidden |")
    print("|---|---|---|---|---|")
    print("| %.1f | %.1f | %.0f%% | %.1f | %.0f%% |" % (t1, t2, 100 * t2 / (2 * t1), median(comm),
                                                     100 * median(hid)))


# ---- 5. shaped links ----

NS = ["cbt%d_a" % os.getpid(), "cbt%d_b" % os.getpid()]


def ns_addr(i):
    return "10.203.%d.%d" % (os.getpid() % 250, i + 1)


def sh(*cmd):
    subprocess.run(cmd, check=True, timeout=30)


def ns_down():
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, timeout=30)


def ns_up(rate):
    """Two namespaces joined by a veth pair (eth0 in each), each end shaped to `rate`."""
    ns_down()
    for ns in NS:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", "cbt%da" % os.getpid(), "netns", NS[0], "type", "veth", "peer",
       "name", "cbt%db" % os.getpid(), "netns", NS[1])
    for i, ns in enumerate(NS):
        sh("ip", "-n", ns, "link", "set", "cbt%d%s" % (os.getpid(), "ab"[i]), "name", "eth0")
        sh("ip", "-n", ns, "addr", "add", ns_addr(i) + "/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst",
           "256kb", "latency", "50ms")


# PowerSGD starts at this (0-based) step in both trainers; PyTorch refuses less than 2 with error
# feedback and warm start. The figures of a PowerSGD run leave out the steps before it.
PSGD_START = 2


def psgd_rank(compress):
    """The rank of a powersgd[:RANK] value (cohort-gpt2's default 4), None for other values."""
    if not compress.startswith("powersgd"):
        return None
    return int(compress.split(":")[1]) if ":" in compress else 4


def torch_hooks(comps):
    """PyTorch's peers of the --compress values: no hook, fp16_compress_hook, and powerSGD_hook
    of each PowerSGD rank asked for."""
    return ["none", "fp16"] + ["powersgd:%d" % psgd_rank(c) for c in comps if psgd_rank(c)]


def hook_name(h):
    return {"none": "no hook", "fp16": "fp16_compress_hook"}.get(
        h, "powerSGD_hook rank %s" % h.split(":")[-1])


def run_torch_ns(a, world, hook):
    """PyTorch on one rank (namespace 0) or DDP on two (one per namespace); checked. Returns
    tokens/s over the steps after the first (after PowerSGD's start with powerSGD_hook)."""
    cmd = ["/usr/bin/python3", os.path.join(HERE, "gpt2_torch.py"), "--model", a.model,
           "--batch", str(a.batch), "--seq-len", str(a.seq_len), "--steps", str(a.steps),
           "--threads", "1", "--ddp-hook", hook.split(":")[0]]
    if psgd_rank(hook):
        # One bucket for the whole model (gpt2_torch.py also raises DDP's first bucket to it):
        # with several, Debian's torch 1.13 and gloo end the powerSGD_hook run at its first
        # compressed step (gloo pair.cc "op.preamble.length <= op.nbytes": the buckets' chained
        # allreduces are started in different orders on the ranks). It leaves PyTorch no
        # overlap of PowerSGD with backward.
        cmd += ["--powersgd-rank", str(psgd_rank(hook)), "--powersgd-start", str(PSGD_START),
                "--bucket-cap-mb", "1024"]
    env = dict(os.environ, MASTER_ADDR=ns_addr(0), MASTER_PORT=str(29500 + os.getpid() % 1000),
               WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(["ip", "netns", "exec", NS[r]] + cmd,
                              env=dict(env, RANK=str(r), LOCAL_RANK="0"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = [p.communicate(timeout=7200) for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit("PyTorch DDP failed: " + " | ".join(e.strip()[-300:] for _, e in outs))
    res = json.loads(outs[0][0])
    if res["world"] != world or len(res["step_s"]) != a.steps:
        sys.exit("PyTorch run did not do its work: %r: no figure" % res)
    return world * a.batch * a.seq_len / median(res["step_s"][PSGD_START if psgd_rank(hook) else 1:])


def shaped(a, tmp):
    print("\n## shaped links (LM head, AdamW, B=%d per rank, 1 thread per rank, 2 namespaces "
          "joined by a veth pair, tbf on each end)" % a.batch)
    if os.geteuid() != 0:
        print("skipped: network namespaces and tc need root")
        return
    comps = a.compress.split(",")
    hooks = torch_hooks(comps)
    if any(psgd_rank(c) for c in comps) and a.steps < PSGD_START + 2:
        sys.exit("PowerSGD starts at step %d: --steps must be at least %d" % (
            PSGD_START + 1, PSGD_START + 2))
    rows = []
    for rate in a.rates.split(","):
        ns_up(rate)
        try:
            r = {"c1": [], "t1": [], "ph1": [], "cpair": [], "phpair": []}
            for c in comps:
                r["c2" + c], r["hid" + c], r["comm" + c], r["mb" + c] = [], [], [], []
                r["ph" + c] = []
            for h in hooks:
                r["t2" + h] = []
            for rep in range(a.reps):
                rows1, _ = run_cohort(a, tmp, "sh1_%s_%d" % (rate, rep), "lm", "adamw", 1,
                                      world=1, ns=NS)
                r["c1"].append(a.batch * a.seq_len / step_median(rows1))
                r["ph1"].append(phases(rows1[1:]))
                pair, _ = run_cohort(a, tmp, "shp_%s_%d" % (rate, rep), "lm", "adamw", 1,
                                     world=1, ns=NS, alongside=True)
                r["cpair"].append(sum(a.batch * a.seq_len / step_median(x) for x in pair))
                r["phpair"].append(phases(pair[0][1:]))
                for c in comps:
                    rows2, _ = run_cohort(a, tmp, "sh2_%s_%s_%d" % (rate, c, rep), "lm", "adamw",
                                          1, world=2, ns=NS, compress=c)
                    if psgd_rank(c):
                        # The figures below skip rows2[0]: what is left are the compressed steps.
                        rows2 = rows2[PSGD_START - 1:]
                    r["c2" + c].append(2 * a.batch * a.seq_len / step_median(rows2))
                    r["hid" + c].append(median([x["hidden_frac"] for x in rows2[1:]]))
                    r["comm" + c].append(median([x["comm_ms"] for x in rows2[1:]]))
                    r["mb" + c].append(median([x["wire_mb"] for x in rows2[1:]]))
                    r["ph" + c].append(phases(rows2[1:]))
                if not a.skip_torch:
                    r["t1"].append(run_torch_ns(a, 1, "none"))
                    for h in hooks:
                        r["t2" + h].append(run_torch_ns(a, 2, h))
            rows.append((rate, r))
        finally:
            ns_down()
    print(a.machine())
    print("| link | run | 1 rank tok/s | 2 ranks tok/s | scaling | allreduce ms/step | hidden "
          "| wire MB/step/rank |")
    print("|---|---|---|---|---|---|---|---|")
    for rate, r in rows:
        c1, cp = median(r["c1"]), median(r["cpair"])
        print("| %s | two 1-rank runs at once, no exchange (the CPU's ceiling) | %.1f | %.1f | "
              "%.2f | | | |" % (rate, c1, cp, cp / (2 * c1)))
        for c in comps:
            c2 = median(r["c2" + c])
            print("| %s | cohort-gpt2 --grad-compress %s | %.1f | %.1f | %.2f | %.1f | %.0f%% | "
                  "%.2f |" % (rate, c, c1, c2, c2 / (2 * c1), median(r["comm" + c]),
                              100 * median(r["hid" + c]), median(r["mb" + c])))
        if not a.skip_torch:
            t1 = median(r["t1"])
            for h in hooks:
                t2 = median(r["t2" + h])
                print("| %s | PyTorch DDP gloo, %s | %.1f | %.1f | %.2f | | | |" % (
                    rate, hook_name(h), t1, t2, t2 / (2 * t1)))
    print("(medians of %d reps, each the median of its steps after the first; scaling = 2-rank "
          "tok/s / (2 x 1-rank tok/s) in the same run)" % a.reps)
    print("\nWhere rank 0's step goes (ms, medians as above; cpu = its main thread's CPU time ="
          " compute + compress + update; waited: wall time blocked on the exchange):")
    print("| link | run | ranks | step | cpu | compute | compress | update | waited |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rate, r in rows:
        print(phase_row(rate, "(any)", 1, r["ph1"]))
        print(phase_row(rate, "(any), beside another", 1, r["phpair"]))
        for c in comps:
            print(phase_row(rate, c, 2, r["ph" + c]))


PHASES = ("step_ms", "cpu_ms", "compute_ms", "compress_ms", "update_ms", "exposed_ms")


def phases(rows):
    """The medians of a run's per-phase figures (NaN for a cohort-gpt2 that does not report
    them)."""
    return {k: median([x[k] for x in rows if k in x]) for k in PHASES}


def phase_row(rate, run, ranks, reps):
    return "| %s | %s | %d | %s |" % (rate, run, ranks, " | ".join(
        "%.0f" % median([p[k] for p in reps]) for k in PHASES))


if __name__ == "__main__":
    main()
