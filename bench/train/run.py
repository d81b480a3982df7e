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
  4. memory: peak RSS against params+grads+optimizer+activations.

usage: bench/train/run.py [--build DIR] [--reps N] [--steps N] [--model M]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


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


def run_cohort(a, tmp, tag, head, opt, threads, world=1):
    """Runs cohort-gpt2 on `world` ranks; returns rank 0's metrics and output."""
    metrics = os.path.join(tmp, tag + ".jsonl")
    args = [os.path.join(a.build, "cohort-gpt2"), "--model", a.model, "--batch", str(a.batch),
            "--seq-len", str(a.seq_len), "--steps", str(a.steps), "--head", head,
            "--optimizer", opt, "--quiet", "--metrics", metrics]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="passive")
    for k in ("RANK", "WORLD_SIZE"):
        env.pop(k, None)
    if world == 1:
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            sys.exit("cohort-gpt2 failed: " + out.stderr.strip())
        return read_metrics(metrics), out.stdout
    store = subprocess.Popen([os.path.join(a.build, "cohort"), "store", "serve", "--host",
                              "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        line = store.stdout.readline()
        m = re.search(r"(127\.0\.0\.1:\d+)", line)
        if not m:
            sys.exit("cannot start a store: " + line)
        procs = []
        job = "bench-%s-%d" % (tag, time.time_ns())
        for r in range(world):
            e = dict(env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                     LOCAL_WORLD_SIZE=str(world), COHORT_STORE=m.group(1),
                     COHORT_JOB_ID=job)
            rargs = args if r == 0 else [x if x != metrics else metrics + ".r%d" % r for x in args]
            procs.append(subprocess.Popen(rargs, env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=3600) for p in procs]
        for p, (o, e) in zip(procs, outs):
            if p.returncode != 0:
                sys.exit("cohort-gpt2 rank failed: " + e.strip())
        return read_metrics(metrics), outs[0][0]
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--model", default="124M")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-torch", action="store_true", help="cohort-gpt2 parts only")
    ap.add_argument("--only", choices=["all", "scaling"], default="all",
                    help="scaling: only part 3 (2 ranks against 1)")
    a = ap.parse_args()
    tokens = a.batch * a.seq_len
    tmp = tempfile.mkdtemp(prefix="bench_train.")
    print("cohort-gpt2 training benchmark: GPT-2 %s, B=%d, T=%d, %d threads, %d reps x %d steps"
          % (a.model, a.batch, a.seq_len, a.threads, a.reps, a.steps))

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
    scaling(a, tmp)
    if a.only == "all":
        print("\n## memory (LM head, AdamW, 1 rank)")
        if rss:
            print("| peak RSS MiB | params+grads+optimizer+activations MiB | ratio |")
            print("|---|---|---|")
            print("| %.1f | %.1f | %.2f |" % (rss[0], rss[1], rss[0] / rss[1]))


def report_throughput(a, cases, res, sgemm, tokens):
    print("\n## throughput (median step; tokens/s = B*T/step)")
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
    print("| 1 rank tok/s | 2 ranks tok/s | efficiency | comm ms/step | comm hidden |")
    print("|---|---|---|---|---|")
    print("| %.1f | %.1f | %.0f%% | %.1f | %.0f%% |" % (t1, t2, 100 * t2 / (2 * t1), median(comm),
                                                     100 * median(hid)))


if __name__ == "__main__":
    main()
