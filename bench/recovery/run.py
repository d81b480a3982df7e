#!/usr/bin/python3
"""bench/recovery: what one lost node costs a training job, every row in one run.

Three emulated nodes (network namespaces on a bridge, created and removed
here) x 1 rank x 1 thread train a small GPT-2 (the sizes below; --model 124M
for GPT-2 124M). When rank 0 has completed step --kill-step, every process
of node 2 (agent and worker) gets SIGKILL, and a replacement is started at
once (or --replace-after S seconds later: then it joins by a grow, after the
loss's re-form) in the same namespace with the same command line. Rows:

  cohort reform    cohort run --on-failure reform, cohort-gpt2 (survivors go on)
  cohort restart   cohort run --max-restarts, cohort-gpt2 --ckpt-dir/--ckpt-every
  torchrun restart torchrun --max_restarts, PyTorch DDP (gloo) with the elastic
                   tutorial's snapshot every --ckpt-every steps (torch_ckpt.py)
  torch reform     cohort run --on-failure reform, torch_reform.py (cohort_reform): the
                   replacement catches up in the background while the survivors train
  torch reform (blocking hand-over)  the torch reform row with COHORT_REFORM_CATCHUP=0:
                   every rank waits while the survivors hand the state to the replacement
                   (not among the default rows)
  cohort reform (before)  the cohort reform row with another cohort-gpt2
                   (--gpt2-before: e.g. one built before a change), run
                   alternately with the cohort reform row
  cohort reform (grow not deferred)  the cohort reform row with
                   COHORT_GROW_DEFER_MS=0: a node joining ends the step in
                   flight, as a loss does (not among the default rows)
  cohort reform (grow always deferred)  the cohort reform row with
                   COHORT_GROW_BREAK=0: a node joining never breaks a step
                   (cohort-gpt2 breaks one that has barely begun; not among the
                   default rows)

Figures per row: the median of --reps runs, each run's figure beside it in
brackets; all from rank 0's step lines as they arrive, in seconds after the kill:
  next      the survivors' next completed step
  redone    completed steps computed again
  joined    the first step the replacement contributes to (world back at 3)
  trains    the start of that step: the replacement trains from then (rank 0's last
            step, re-form or catch-up line before it)
  lost      time lost to the failure: (end - kill) - (steps left x step time) - the
            periodic checkpoints (restart rows) a run without the failure writes too,
            those of the steps beyond the ones done at the kill (rank 0's "checkpoint:
            step N written in T s" lines; the step time leaves checkpoints out as well)
  lost+     the same, counting the samples a smaller world did not train: (end - kill)
            - checkpoints - (each step left x its world / the full world) x step time (a
            step of 2 ranks of 3, shrunk or while a newcomer catches up, trains 2/3 of a
            full step)
  state     bytes the replacement received (reform) or the checkpoint loaded (restart; with
            PowerSGD every rank's error feedback in it, for torchrun beside the snapshot)
  blocked   reform rows: the seconds node 0's agent reports its survivors spent in
            re-forms after the kill (its "re-formed in T s" lines, summed; for a grow
            deferred to a step boundary this includes the step the survivors finished)
  dropped   cohort reform rows: re-forms after the kill that dropped a step in flight
            (rank 0's "step in flight dropped")
  stalled   cohort reform rows: rank 0's seconds in the re-forms that took a node in (the
            world grew) after the kill, from its re-form to going on ("T s in all" of
            its re-form lines, summed)
  grow at   reform rows: how far rank 0's step in flight had got when node 0's agent
            announced the replacement's grow, as a share of the step time (from rank 0's
            last step or re-form line before it; "-": no grow, the loss's re-form took
            the replacement in)
Runs alternate between the rows (rep 1 of every row, then rep 2, ...), so the
rows see the same load.
A run in which a process failed, the job did not finish every step, the
kill found no node to kill, or its time limit came first gives no figure: the
row says "fail", which run and why (for a limit: which one, and where rank 0
was), and the script exits 1; a SIGINT or SIGTERM (a caller's limit) ends
the bench the same way, with the rows done so far. A row whose tool lacks
the feature says "not run" and why. A run's limit (printed at the start) is
--row-limit, or twice a slow estimate from the model size, the steps and
--rate (run_limit).
torchrun is set up as a careful user of PyTorch's elastic tutorial would
(torchrun_opts, and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, without which torch
2.4 and later cannot take a replacement in; docs/reform.md has the reasons).
Run as root (namespaces, tc). --rate shapes every node's link with tc (tbf).
--grad-compress bf16|powersgd[:RANK] gives the cohort-gpt2 rows that exchange (PowerSGD from
step 2): on a slow link the exchange then leaves most of the link to the state transfer.
The torchrun restart row then runs DDP's own hook (torch_ckpt.py): powerSGD_hook of the
same rank (4 by default, as cohort-gpt2), start_powerSGD_iter 2, the whole model in one DDP
bucket (with several, torch 1.13 over gloo aborts at the first compressed step: the ranks
start the buckets' chained allreduces in different orders), each rank's PowerSGDState
(error feedback, P, Q) checkpointed with the snapshot and loaded on a restart, whose first
step runs uncompressed (DDP rebuilds its bucket after it); bf16 asks for
bf16_compress_hook, which torch 1.13 refuses without CUDA and NCCL, so the row says "not
run" and why. The torch rows' workers see no GPU (CPU_ONLY): powerSGD_hook synchronizes
the bucket's device wherever CUDA is available, which on CPU tensors fails (torch 2.11 on a
GPU machine); torch_ckpt.py --probe trains past the hook's warm-up to find out. The torch
reform rows do not run with --grad-compress (torch_reform.py has no comm hook).
docs/reform.md, "PowerSGD in the torchrun restart row", has the evidence.
The torch rows run --python (default Debian's /usr/bin/python3) and the
torchrun row `PYTHON -m torch.distributed.run` unless --torchrun names
another launcher (or COHORT_BENCH_PYTHON, COHORT_BENCH_TORCHRUN).
"""
import argparse
import functools
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from netns import Netns  # noqa: E402

# The Python of the torch rows (with torch), and their torchrun: --python, --torchrun or
# COHORT_BENCH_PYTHON, COHORT_BENCH_TORCHRUN (default: Debian's, "PYTHON -m torch.distributed.run").
PY = os.environ.get("COHORT_BENCH_PYTHON", "/usr/bin/python3")
# A step line as rank 0 prints it (cohort run: "[r0] ", torchrun --tee: "[default0]:"), not the
# copies in a failure report.
STEP = re.compile(r"^(?:\[\w+\]:?\s*)?step\s+(\d+)\s*/\s*(\d+)")
# "world A -> B" (the agent's and cohort-gpt2's re-form lines) is B, the world after.
WORLD = re.compile(r"\bworld\s+\d+\s*->\s*(\d+)|\bworld[= ](\d+)|(\d+)\s*->\s*(\d+)\s*ranks?|"
                   r"->\s*world\s*(\d+)")
CKPT = re.compile(r"checkpoint: step (\d+) written in ([0-9.]+) s")
REFORMED = re.compile(r"cohort: re-formed in ([0-9.]+) s")
STATE = re.compile(r"received\s+(\d+)\s*bytes|(\d+)\s*bytes\s+received")
# A newcomer that caught up in the background (cohort-gpt2's line, or cohort_reform's on rank
# 0): the first step it trained.
CAUGHT = re.compile(r"caught up: .*contribute from step (\d+)")
# cohort-gpt2's re-form line (rank 0): whether it dropped a step in flight, its seconds in all.
GPT2_REFORMED = re.compile(r"cohort-gpt2: re-formed \(epoch \d+\): world (\d+) -> (\d+) .*"
                           r"\(step in flight (\w+)\).* ([0-9.]+) s in all")
# Node 0's agent announcing a node's joining (it sends the grow's reshape next).
GROW = re.compile(r"cohort: re-forming without stopping the survivors: grow")
# The world of the job before the kill: 3 nodes x 1 rank.
FULL_WORLD = 3
# The torch rows train on CPUs (gloo) and their workers see no GPU: DDP's powerSGD_hook calls
# torch.cuda.synchronize(device) wherever CUDA is available, and on CPU tensors that raises.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


class Node:
    """One process tree started in a namespace, its output lines timestamped as they arrive."""

    def __init__(self, argv, env):
        self.lines = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, text=True, errors="replace")
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, deadline):
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
        self.reader.join(timeout=5)
        return self.proc.returncode


def model_args(a):
    return dict(layers=a.layers, heads=a.heads, channels=a.channels, vocab=a.vocab)


def gpt2_cmd(a, tmp, binary=None):
    m = model_args(a)
    return [binary or a.gpt2, "--layers", str(m["layers"]), "--heads", str(m["heads"]), "--channels",
            str(m["channels"]), "--vocab", str(m["vocab"]), "--positions", "64", "--seq-len",
            str(a.seq_len), "--batch", str(a.batch), "--steps", str(a.steps), "--threads", "1",
            "--warmup", "0"] + compress_args(a)


def compress_args(a):
    """cohort-gpt2's exchange (and torch_ckpt.py's, the same flags): --grad-compress,
    PowerSGD from its second step (so the kill lands well after its warm-up)."""
    if a.grad_compress == "none":
        return []
    args = ["--grad-compress", a.grad_compress]
    return args + (["--powersgd-start", "2"] if a.grad_compress.startswith("powersgd") else [])


def torch_cmd(a, tmp, script_args):
    m = model_args(a)
    return ["--layers", str(m["layers"]), "--heads", str(m["heads"]), "--channels",
            str(m["channels"]), "--vocab", str(m["vocab"]), "--steps", str(a.steps), "--batch",
            str(a.batch), "--seq-len", str(a.seq_len)] + script_args


def torchrun_opts(a):
    """torchrun as a careful user of PyTorch's elastic tutorial sets it up (docs/reform.md says
    why): the tutorial's c10d rendezvous on node 0 and a fixed world of 3 (min = max: a round
    completes as soon as the third node joins, so last_call_timeout never applies); the agent
    looks at its workers every 0.1 s (torch 2.x's default; 1.13's is 5 s); and a lost agent's
    entry in the rendezvous state expires after cohort's heartbeat timeout (keep-alives every
    1 s, --heartbeat of them missed) where PyTorch reads these settings (2.x); torch 1.13
    ignores them and keeps 3 missed keep-alives of 5 s, which a re-rendezvous waits for."""
    return ["--monitor_interval", "0.1", "--rdzv_conf",
            "keep_alive_interval=1,keep_alive_max_attempt=%d" % max(1, math.ceil(a.heartbeat))]


@functools.lru_cache(maxsize=None)
def torch_major(python):
    """The major version of the torch that PYTHON imports (0 when it cannot tell)."""
    p = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                       capture_output=True, text=True, timeout=120)
    m = re.match(r"(\d+)\.", p.stdout.strip())
    return int(m.group(1)) if p.returncode == 0 and m else 0


def torchrun_output(a):
    """torchrun's redirects: torch 1.13 on Python 3.11 takes only --redirects 2 --tee 1 (an enum
    bug), so its workers' stderr stays in torchrun's log files; torch 2.x tees both streams, so
    that a worker's dying words reach the row's log."""
    return ["--redirects", "3", "--tee", "3"] if torch_major(a.python) >= 2 else \
        ["--redirects", "2", "--tee", "1"]


def row_cmd(row, a, tmp, i, port, ns):
    """The command line of node i for a row (the replacement uses node 2's)."""
    master = "%s:%d" % (ns.addr(0), port)
    base = [a.cohort, "run", "--nnodes", "3", "--node-rank", str(i), "--master", master,
            "--job", "recovery", "--net", "off", "--heartbeat-timeout", str(a.heartbeat)]
    if row.startswith("cohort reform"):
        binary = a.gpt2_before if row == "cohort reform (before)" else a.gpt2
        return base[:2] + ["--nnodes", "2:3"] + base[4:] + ["--on-failure", "reform", "--"] + \
            gpt2_cmd(a, tmp, binary)
    if row == "cohort restart":
        return base + ["--max-restarts", "3", "--"] + gpt2_cmd(a, tmp) + [
            "--ckpt-dir", os.path.join(tmp, "ckpt"), "--ckpt-every", str(a.ckpt_every)]
    if row.startswith("torch reform"):
        return base[:2] + ["--nnodes", "2:3"] + base[4:] + ["--on-failure", "reform", "--", a.python,
                                                            os.path.join(HERE,
                                                                         "torch_reform.py")] + \
            torch_cmd(a, tmp, [])
    return a.torchrun + ["--nnodes", "3", "--nproc_per_node", "1",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", master, "--rdzv_id", "recovery",
            "--max_restarts", "3"] + torchrun_output(a) + torchrun_opts(a) + [
            os.path.join(HERE, "torch_ckpt.py")] + torch_cmd(
                a, tmp, ["--ckpt", os.path.join(tmp, "snapshot.pt"), "--ckpt-every",
                         str(a.ckpt_every)] + compress_args(a))


def run_limit(a):
    """A run's time limit, in seconds, from the model, the steps and the link (--row-limit
    overrides): twice a slow estimate of start-up + steps + recovery on a loaded small machine.
    A step: 1 s plus 6 x parameters x tokens at 2.5 GFLOP/s per rank (PyTorch 1.13's GPT-2 124M
    step, B=4 T=64, took 27-98 s on the 2-core VM at a load of 10-16); the state (parameters and
    two AdamW moments, 12 bytes a parameter) crosses the link 4 times (checkpoints written and
    read, the newcomer's transfer), at --rate or 10 Gbit/s; start-up and recovery 60 s each
    (interpreters, imports, torchrun's re-rendezvous)."""
    if a.row_limit:
        return a.row_limit, "--row-limit"
    L, C, V = a.layers, a.channels, a.vocab
    params = V * C + 64 * C + L * 12 * C * C
    step_s = 1.0 + 6.0 * params * a.batch * a.seq_len / 2.5e9
    rate = parse_rate(a.rate) if a.rate else 10e9
    limit = 2 * (60 + a.steps * step_s + 4 * 12 * params * 8 / rate + 60)
    return round(limit), "from model, steps, link"


def parse_rate(text):
    """tc's rate ("1gbit", "100mbit", "500kbit", "1000000bit") in bits per second."""
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", text.strip().lower())
    if not m:
        raise ValueError("bad --rate %r (e.g. 1gbit, 100mbit)" % text)
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def row_missing(row, a):
    """Why a row cannot run with these tools, or None."""
    if row == "cohort reform (before)" and not os.access(a.gpt2_before or "", os.X_OK):
        return "no --gpt2-before binary"
    if "reform" in row:
        h = subprocess.run([a.cohort, "run", "--help"], capture_output=True, text=True)
        if "--on-failure" not in h.stdout:
            return "this cohort has no --on-failure reform"
    if "torch" in row and subprocess.run([a.python, "-c", "import torch"],
                                         capture_output=True).returncode != 0:
        return "no PyTorch at " + a.python
    if row.startswith("torch reform") and a.grad_compress != "none":
        return "torch_reform.py has no --grad-compress (no comm hook across its re-forms)"
    if row == "torchrun restart" and a.grad_compress != "none":
        return torch_compress_missing(a)
    return None


def torch_compress_missing(a):
    """Why torch_ckpt.py cannot set up --grad-compress with this torch (its --probe), or None."""
    p = subprocess.run([a.python, os.path.join(HERE, "torch_ckpt.py"), "--probe"] + torch_cmd(
        a, None, ["--ckpt", os.devnull, "--ckpt-every", "1"] + compress_args(a)),
        env=dict(os.environ, **CPU_ONLY), capture_output=True, text=True, timeout=300)
    if p.returncode == 0:
        return None
    why = (p.stdout.strip().splitlines() or p.stderr.strip().splitlines() or ["?"])[-1]
    return "DDP's %s hook does not run here: %s" % (a.grad_compress, why[:200])


def shape(ns, rate):
    for node in ns.nodes:
        subprocess.run(["tc", "-n", node, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                        rate, "burst", "256kb", "latency", "50ms"], check=True, timeout=30)


def in_node(ns, i, cmd):
    """cmd in node i's namespace, with hostname node<i> (torchrun resolves its own name)."""
    return ns.exec(i) + ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                         "node%d" % i] + cmd


def kill_node(ns, i):
    """SIGKILL to every process of node i; how many there were."""
    p = subprocess.run(["ip", "netns", "pids", ns.nodes[i]], capture_output=True, text=True)
    pids = [int(x) for x in p.stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def steps_of(lines):
    out = []
    for t, line in lines:
        m = STEP.search(line)
        if m:
            out.append((t, int(m.group(1))))
    return out


def figures(node0, everyone, t_kill, total):
    """The row's figures from rank 0's lines, or None when they do not add up."""
    steps = steps_of(node0.lines)
    before = [(t, s) for t, s in steps if t < t_kill]
    after = [(t, s) for t, s in steps if t >= t_kill]
    if len(before) < 3 or not after or after[-1][1] != total:
        return None
    # Periodic checkpoints (restart rows): (time of the line, step, seconds gathering and writing).
    ckpts = [(t, int(m.group(1)), float(m.group(2))) for t, m in
             ((t, CKPT.search(line)) for t, line in node0.lines) if m]

    def written(t0, t1):
        return sum(d for t, _, d in ckpts if t0 < t <= t1)
    # The step time: consecutive steps on the same side of the kill, the first two left out,
    # less the checkpoints written between them.
    gaps = [b[0] - a[0] - written(a[0], b[0]) for a, b in zip(before[2:], before[3:])]
    gaps += [b[0] - a[0] - written(a[0], b[0]) for a, b in zip(after[2:], after[3:])]
    if not gaps:
        return None
    step_s = statistics.median(gaps)
    done = max(s for _, s in before)
    # After the kill, the checkpoints of steps beyond those done a run without the failure also
    # writes: not time lost to the failure (those of steps computed again are).
    periodic = sum(d for t, s, d in ckpts if t_kill <= t <= after[-1][0] and s > done)
    joined = None
    world_back = None
    for t, line in node0.lines:
        if t < t_kill:
            continue
        m = WORLD.search(line)
        if m:
            w = int(next(g for g in reversed(m.groups()) if g is not None))
            if w == 3 and world_back is None:
                world_back = t
    if world_back is not None:
        nxt = [t for t, _ in after if t > world_back]
        joined = nxt[0] - t_kill if nxt else None
    for t, line in node0.lines:
        m = CAUGHT.search(line)
        if t >= t_kill and m:
            at = [ts for ts, s in after if s >= int(m.group(1))]
            joined = at[0] - t_kill if at else None
    trains = None
    if joined is not None:  # the step `joined` ends began at rank 0's line before it
        t_joined = joined + t_kill
        marks = [t for t, _ in steps if t < t_joined]
        marks += [t for t, line in node0.lines if t_kill <= t < t_joined and
                  (WORLD.search(line) or CAUGHT.search(line))]
        trains = max(0.0, max(marks) - t_kill) if marks else None
    blocked = None
    for t, line in node0.lines:
        m = REFORMED.search(line)
        if t >= t_kill and m:
            blocked = (blocked or 0.0) + float(m.group(1))
    dropped = stalled = None
    for t, line in node0.lines:
        m = GPT2_REFORMED.search(line)
        if t >= t_kill and m:
            dropped = (dropped or 0) + (m.group(3) == "dropped")
            if int(m.group(2)) > int(m.group(1)):
                stalled = (stalled or 0.0) + float(m.group(4))
    state = None
    for _, line in (l for n in everyone for l in n.lines):
        m = STATE.search(line)
        if m:
            state = max(state or 0, int(m.group(1) or m.group(2)))
    grow_at = None
    grows = [t for t, line in node0.lines if t >= t_kill and GROW.search(line)]
    if grows:
        marks = [t for t, line in node0.lines if t < grows[0] and (
            STEP.search(line) or GPT2_REFORMED.search(line))]
        grow_at = (grows[0] - max(marks)) / step_s if marks else None
    share = trained_share(node0, after, t_kill, done)
    return dict(next=after[0][0] - t_kill, redone=sum(1 for _, s in after if s <= done),
                joined=joined, trains=trains,
                lost=(after[-1][0] - t_kill) - periodic - (total - done) * step_s,
                lostw=(after[-1][0] - t_kill) - periodic - share * step_s,
                step=step_s, state=state, blocked=blocked, dropped=dropped, stalled=stalled,
                growat=grow_at)


def trained_share(node0, after, t_kill, done):
    """The steps left, each weighted by the share of the full world that trained it: the world
    rank 0's last re-form line before the step announced (3 before any), 2 for a step before the
    one a caught-up newcomer contributes from."""
    events = []
    caught = None
    for t, line in node0.lines:
        m = WORLD.search(line)
        if t >= t_kill and m:
            events.append((t, int(next(g for g in reversed(m.groups()) if g is not None))))
        m = CAUGHT.search(line)
        if t >= t_kill and m and caught is None:
            caught = int(m.group(1))
    share, seen = 0.0, set()
    for t, s in after:
        if s <= done or s in seen:
            continue
        seen.add(s)
        w = FULL_WORLD
        for te, we in events:
            if te <= t:
                w = we
        if caught is not None and s < caught:
            w = min(w, FULL_WORLD - 1)
        share += min(w, FULL_WORLD) / FULL_WORLD
    return share


def ended_by_limit(limit, source, node0, t_kill):
    """Why a run had no figure when its limit ended it after the kill: where rank 0 was."""
    after = [s for t, s in steps_of(node0.lines) if t >= t_kill]
    last = node0.lines[-1][1][-160:] if node0.lines else "(none)"
    return ("the run's %d s limit (%s) ended it %.0f s after the kill, rank 0 %s; node 0's "
            "last line: %s" % (limit, source, time.monotonic() - t_kill,
                               "at step %d" % after[-1] if after else "with no step since",
                               last))


def one_run(row, a, port):
    """One run of a row: its figures, or None (and why) when it did not do its work."""
    tmp = tempfile.mkdtemp(prefix="cohort-bench-recovery-")
    ns = Netns(3, subnet="10.203.0")
    nodes = []
    try:
        ns.up()
        if a.rate:
            shape(ns, a.rate)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if row == "cohort reform (grow not deferred)":
            env["COHORT_GROW_DEFER_MS"] = "0"
        if row == "cohort reform (grow always deferred)":
            env["COHORT_GROW_BREAK"] = "0"
        if row == "torch reform (blocking hand-over)":
            env["COHORT_REFORM_CATCHUP"] = "0"
        if "torch" in row:
            env.update(CPU_ONLY)
        if row == "torchrun restart":
            # torch >= 2.4 shares the rendezvous's TCP store with the workers and keeps the
            # address it bootstrapped in the first round: a replacement then waits for a
            # MASTER_ADDR that no agent writes again (docs/reform.md). 1.13 ignores it.
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        for i in (2, 1, 0):
            nodes.insert(0, Node(in_node(ns, i, row_cmd(row, a, tmp, i, port, ns)), env))
        limit, source = run_limit(a)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            st = steps_of(nodes[0].lines)
            if st and st[-1][1] >= a.kill_step:
                break
            if nodes[0].proc.poll() is not None:
                return None, "node 0 ended before step %d" % a.kill_step
            time.sleep(0.01)
        else:
            return None, "the run's %d s limit (%s) ended it before step %d" % (limit, source,
                                                                               a.kill_step)
        if kill_node(ns, 2) == 0:
            return None, "nothing to kill on node 2"
        t_kill = time.monotonic()
        time.sleep(a.replace_after)
        repl = Node(in_node(ns, 2, row_cmd(row, a, tmp, 2, port, ns)), env)
        nodes.append(repl)
        for i, n in enumerate(nodes):
            if i == 2:
                continue
            rc = n.wait(deadline)
            if rc is None:
                return None, ended_by_limit(limit, source, nodes[0], t_kill)
            if rc != 0:
                tail = " | ".join(l for _, l in n.lines[-3:])
                return None, "node %s ended with %s: %s" % (i if i < 3 else "2 (new)", rc,
                                                            tail[-300:])
        fig = figures(nodes[0], nodes, t_kill, a.steps)
        if fig is None:
            return None, "rank 0's steps do not add up"
        if fig["state"] is None and "restart" in row:
            fig["state"] = checkpoint_bytes(tmp)
        return fig, None
    finally:
        if a.logs:
            os.makedirs(a.logs, exist_ok=True)
            for i, n in enumerate(nodes):
                with open(os.path.join(a.logs, "%s-%d-node%d.log" % (row.replace(" ", "_"), port,
                                                                     i)), "w") as f:
                    f.writelines("%.3f %s\n" % (t, l) for t, l in n.lines)
        for n in nodes:
            if n.proc.poll() is None:
                n.proc.kill()
        ns.down()
        subprocess.run(["rm", "-rf", tmp])


def checkpoint_bytes(tmp):
    """A restart row's checkpoint: its largest file (cohort-gpt2's ckpt_<step>.bin, which holds
    every rank's PowerSGD state; torch_ckpt.py's snapshot) plus torch_ckpt.py's per-rank
    PowerSGD states beside the snapshot (snapshot.pt.psgd<rank>), or None."""
    files = [os.path.join(dp, f) for dp, _, fs in os.walk(tmp) for f in fs]
    ck = [os.path.getsize(p) for p in files if p.endswith((".pt", ".bin", ".ckpt"))]
    psgd = [os.path.getsize(p) for p in files if re.search(r"\.psgd\d+$", p)]
    return max(ck) + sum(psgd) if ck else None


def fmt(x, unit=""):
    if x is None:
        return "-"
    if isinstance(x, int):
        return str(x)
    return "%.2f%s" % (x, unit)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cohort", default=os.path.join(ROOT, "build", "cohort"))
    ap.add_argument("--gpt2", default=os.path.join(ROOT, "build", "cohort-gpt2"))
    ap.add_argument("--gpt2-before", default="",
                    help="adds the row 'cohort reform (before)' with this cohort-gpt2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kill-step", type=int, default=6)
    ap.add_argument("--replace-after", type=float, default=0,
                    help="seconds from the kill to the replacement's start (default 0)")
    ap.add_argument("--ckpt-every", type=int, default=5,
                    help="restart rows: a checkpoint every N steps (default 5)")
    ap.add_argument("--heartbeat", type=float, default=2,
                    help="cohort's --heartbeat-timeout (default 2 s)")
    ap.add_argument("--model", default="small", choices=["small", "124M"])
    ap.add_argument("--batch", type=int, default=4, help="every row's --batch (default 4)")
    ap.add_argument("--seq-len", type=int, default=64,
                    help="every row's --seq-len (default 64, at most 64)")
    ap.add_argument("--grad-compress", default="none",
                    help="the cohort-gpt2 rows' --grad-compress (none, bf16, powersgd[:RANK]; "
                    "PowerSGD from step 2), and the torchrun restart row's DDP comm hook "
                    "(powerSGD_hook of that rank from step 2, one bucket; bf16_compress_hook "
                    "where torch allows it); the torch reform row then does not run")
    ap.add_argument("--rate", default="", help="shape every link with tc, e.g. 1gbit")
    ap.add_argument("--rows", default="cohort reform,cohort reform (before),cohort restart,"
                    "torchrun restart,torch reform")
    ap.add_argument("--logs", default="", help="write every node's timestamped output here")
    ap.add_argument("--row-limit", "--timeout", dest="row_limit", type=float, default=0,
                    help="seconds a run may take (default: from the model, the steps and "
                    "--rate; printed)")
    ap.add_argument("--python", default=PY,
                    help="the torch rows' Python (default $COHORT_BENCH_PYTHON or %(default)s)")
    ap.add_argument("--torchrun", default=os.environ.get("COHORT_BENCH_TORCHRUN", ""),
                    help="the torchrun restart row's launcher, split like a shell word list "
                    "(default $COHORT_BENCH_TORCHRUN or PYTHON -m torch.distributed.run)")
    a = ap.parse_args()
    a.torchrun = shlex.split(a.torchrun) or [a.python, "-m", "torch.distributed.run"]
    sizes = {"small": (4, 4, 128, 4096), "124M": (12, 12, 768, 50257)}[a.model]
    a.layers, a.heads, a.channels, a.vocab = sizes
    if a.reps < 1:
        ap.error("--reps must be at least 1")
    if not re.fullmatch(r"none|bf16|powersgd(:[1-9][0-9]?)?", a.grad_compress):
        ap.error("--grad-compress must be none, bf16 or powersgd[:RANK]")
    if not 0 <= a.replace_after <= 3600:
        ap.error("--replace-after must be 0 to 3600 seconds")
    try:
        limit, source = run_limit(a)
    except ValueError as e:
        ap.error(str(e))
    if os.geteuid() != 0:
        sys.exit("bench/recovery: network namespaces need root")
    info = dict(l.split(":", 1) for l in open("/proc/cpuinfo") if ":" in l)
    cpu = "%s (family %s model %s)" % tuple(info.get(k, "?").strip() for k in
                                            ("model name\t", "cpu family\t", "model\t\t"))
    print("# bench/recovery: 3 nodes x 1 rank x 1 thread, GPT-2 L=%d H=%d C=%d V=%d (B=%d "
          "T=%d, --grad-compress %s), %d steps, "
          "node 2 killed after step %d, replacement started %s; heartbeat timeout %g s; "
          "link %s; %s, %d cores, load %.1f" % (a.layers, a.heads, a.channels, a.vocab, a.batch,
                                                a.seq_len, a.grad_compress, a.steps, a.kill_step,
                                                "%g s later" % a.replace_after
                                                if a.replace_after else "at once",
                                                a.heartbeat, a.rate or "unshaped",
                                                cpu, os.cpu_count(), os.getloadavg()[0]))
    print("# each run ends at %d s (%s); %d rep(s), the rows alternating; load %s" % (
        limit, source, a.reps, "%.1f %.1f %.1f" % os.getloadavg()))
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    results, runs, stopped = run_rows(a, rows)
    print_table(rows, results, runs)
    print("# load at the end: %.1f %.1f %.1f" % os.getloadavg())
    if stopped:
        print("# stopped by %s (the caller's limit)" % stopped)
    sys.exit(1 if stopped or any(st == "fail" for st, _ in results.values()) else 0)


class Stopped(Exception):
    """SIGINT or SIGTERM from the caller (e.g. `timeout -s INT`): its limit, not a row's."""


def stop(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runs' clean-up is not cut short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stopped(signal.Signals(signum).name)


def run_rows(a, rows):
    """Every rep of every row, the rows alternating (rep 1 of each, then rep 2, ...) so that
    the load drifts hit every row alike. A row stops at its first failed run."""
    results, runs, port = {}, {}, 29700
    for row in rows:
        why = row_missing(row, a)
        if why:
            results[row] = ("not run", why)
        else:
            runs[row] = []
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        for rep in range(a.reps):
            for row in [r for r in rows if r in runs and r not in results]:
                port += 1
                try:
                    fig, why = one_run(row, a, port)
                except Stopped as e:
                    results[row] = ("fail", "%s ended run %d of %d before its end" % (
                        e, rep + 1, a.reps))
                    raise
                if fig is None:
                    results[row] = ("fail", "run %d of %d: %s" % (rep + 1, a.reps, why))
                else:
                    runs[row].append(fig)
    except Stopped as e:
        for row in rows:
            if row not in results:
                results[row] = ("fail", "%s came before its %d runs were done" % (e, a.reps))
        return results, runs, str(e)
    return results, runs, None


KEYS = ("step", "next", "redone", "joined", "trains", "blocked", "dropped", "stalled", "growat",
        "lost", "lostw")


def cell(rs, k):
    """The median of a figure over a row's runs, each run's beside it: "m (r1, r2, r3)"."""
    xs = [r[k] for r in rs]
    have = [x for x in xs if x is not None]
    if not have:
        return "-", None
    med = statistics.median(have)
    if isinstance(xs[0], int) and med == int(med):
        med = int(med)
    if len(xs) == 1:
        return fmt(med), med
    return "%s (%s)" % (fmt(med), ", ".join(fmt(x) for x in xs)), med


def print_table(rows, results, runs):
    """The table: a row that failed or did not run says so and has no figure."""
    print("| row | step s | next s | redone | joined s | trains s | blocked s | dropped | stalled s "
          "| grow at | lost s | lost+ s | state bytes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    med = {}
    for row in rows:
        if row in results:
            print("| %s | %s: %s |" % (row, results[row][0], results[row][1]))
            continue
        cells = [cell(runs[row], k) for k in KEYS]
        med[row] = dict(zip(KEYS, (m for _, m in cells)))
        states = [r["state"] for r in runs[row] if r["state"] is not None]
        print("| %s | %s | %s |" % (row, " | ".join(c for c, _ in cells),
                                    "{:,}".format(max(states)) if states else "-"))
    before, after = med.get("cohort reform (before)"), med.get("cohort reform")
    if before and after and before["joined"] and after["joined"]:
        print("newcomer joined, before / after: %.2fx" % (before["joined"] / after["joined"]))
    eager = med.get("cohort reform (grow not deferred)")
    for k, what in (("lost", "time lost"), ("stalled", "rank 0 stalled in grows")):
        if eager and after and eager[k] and after[k] and after[k] > 0:
            print("%s, grow not deferred / deferred: %.2fx" % (what, eager[k] / after[k]))
    waits = med.get("cohort reform (grow always deferred)")
    for k, what in (("trains", "the newcomer trains from"), ("joined", "the newcomer joined"),
                    ("lost", "time lost"), ("lostw", "time lost with the samples")):
        if waits and after and waits[k] is not None and after[k] and after[k] > 0:
            print("%s, always deferred / break early: %.2fx" % (what, waits[k] / after[k]))
    for fast, slow in (("cohort reform", "cohort restart"), ("cohort reform", "torchrun restart"),
                       ("torch reform", "torchrun restart"),
                       ("torch reform", "torch reform (blocking hand-over)")):
        for k, what in (("lost", "time lost"), ("lostw", "time lost with the samples")):
            if fast in med and slow in med and med[fast][k] and med[fast][k] > 0:
                print("%s, %s / %s: %.1fx" % (what, slow, fast, med[slow][k] / med[fast][k]))


if __name__ == "__main__":
    main()
