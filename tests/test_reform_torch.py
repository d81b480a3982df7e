#!/usr/bin/python3
"""cohort_reform against a fake agent: PyTorch DDP workers (gloo) outlive
lost peers in their own processes, and a newcomer receives their state.

This script plays the agent's side of the control channel of docs/reform.md
(one SOCK_SEQPACKET socketpair per worker, COHORT_CONTROL_FD): it forks three
workers running examples/reform_ddp.py, then
  1. kill -9 of rank 2 mid-step; `reshape`, `form` with 2 ranks;
  2. a newcomer (COHORT_NEWCOMER=1) joins: `reshape grow=1` to one survivor
     only, `form` with 3 ranks; the survivors complete their step, agree on
     its end and answer `ready` at the same step, dropping none; the
     newcomer catches up in the background: with the survivors' streams
     held (tests/reform_torch_behind.py, REFORM_TEST_HOLD) the survivors
     must complete steps at world 3 with 2 ranks training; once let go, the
     newcomer receives the survivors' parameters, optimizer state, step and
     data position, each survivor sending a share of it (both send, and
     together exactly what the newcomer received), replays the steps it
     kept, and then holds the survivors' model and optimizer state bit for
     bit (a SHA-256 of both); the samples of the ranks that train tile the
     data, none trained twice or skipped;
  3. SIGSTOP of a rank (its sockets stay open, gloo alone would wait out the
     process group's timeout): a `reshape grow=1 defer_ms=1000` must break
     the survivors' collective once the deferral runs out; `form` with 2
     ranks;
  4. four re-forms in a row leave the survivors' descriptor and thread
     counts as they were;
  5. a survivor behind: one survivor's step fails after its all_reduce
     (tests/reform_torch_behind.py) while the other's completes; the ranks
     agree on the highest completed step, the one behind receives the state
     from the other, and they go on with identical parameters;
  6. a newcomer started ahead of its membership (COHORT_AWAIT_FORM=1, no
     RANK, WORLD_SIZE or MASTER_*): it says hello with await_form=1, waits
     for its first `form`, joins, answers `formed` and catches up (by the
     path of NCCL: it computes its steps and adds -0.0 in the exchange; in
     section 2 it computes nothing and the trainers exchange alone);
  7. a newcomer started with its membership's variables whose membership
     ends before it formed: it answers `ready`, joins the next `form` and
     receives the state at the join, every rank waiting (it has
     COHORT_REFORM_CATCHUP=0: the blocking hand-over);
  8. a grow breaks the step in flight: COHORT_GROW_BREAK=1 on the workers
     that joined (0, every grow deferred, on the first three, which 2 and 3
     need), the first stalled (SIGSTOP) and `reshape grow=1
     defer_ms=60000` to the others (COHORT_GROW_DEFER_MS=120000 on all):
     they re-form within 20 s, not after the deferral's 60 s;
  9. a reshape while a rank computes its step's forward (held after the
     first layer): the step ends at the next layer, its backward never runs;
 10. a donor lost while it streams (held) to a newcomer catching up: the
     newcomer says that it takes the state in the next membership, and does
     (catching up again from the donor left), ending with the same state.
Wherever state is handed over (2, 5, 6, 7), every survivor at the agreed step
sends a share and the survivors send exactly the bytes the ranks behind receive.
It checks every time that the survivors keep their PIDs, answer `ready` and
`formed`, go on training with the new world size, never recompute a
completed step, advance the data position by world * batch per step, and
end with identical parameters. First, in its own process: a rank that
loaded the state handed over has the donor's layout (cohort_reform._layout:
both may donate later; a tied weight sent once); with the cohort binary as
second argument, `cohort run` ships this module to Python workers.
Usage: test_reform_torch.py SOURCE_DIR [COHORT]
"""
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
PY = "/usr/bin/python3"  # Debian's, with torch
BATCH = 4
STEPS = 100000  # never reached: the test stops the workers when it is done
# Generous bounds meaning "not stuck" (a step takes ~10 ms).
LONG = 120.0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def fail(msg):
    print("FAIL: " + msg, flush=True)
    raise SystemExit(1)


class Worker:
    def __init__(self, tmp, name, rank, size, epoch, port, newcomer=False, ahead=False,
                 grow_break="0", catchup=None):
        self.agent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.agent_end.settimeout(LONG)
        self.log = os.path.join(tmp, name + ".log")
        env = dict(os.environ, LOCAL_RANK="0", COHORT_CONTROL_FD=str(child_end.fileno()),
                   OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(SRC, "src/agent/python"),
                   COHORT_GROW_BREAK=grow_break, COHORT_GROW_DEFER_MS="120000")
        if ahead:  # no membership yet: its first `form` gives it
            env["COHORT_AWAIT_FORM"] = "1"
        else:
            env.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), COHORT_ROUND=str(epoch))
        if newcomer:
            env["COHORT_NEWCOMER"] = "1"
        if catchup is not None:
            env["COHORT_REFORM_CATCHUP"] = catchup
        self.hold_file = os.path.join(tmp, name + ".hold")
        env["REFORM_TEST_HOLD"] = self.hold_file
        self.fail_file = os.path.join(tmp, name + ".fail")
        env["REFORM_TEST_FAIL"] = self.fail_file
        self.slow_file = os.path.join(tmp, name + ".slow")
        env["REFORM_TEST_SLOW"] = self.slow_file
        self.compute_file = os.path.join(tmp, name + ".compute")
        env["REFORM_TEST_COMPUTE"] = self.compute_file
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [PY, os.path.join(SRC, "tests/reform_torch_behind.py"), "--steps", str(STEPS),
                 "--batch", str(BATCH), "--step-time", "0.01"],
                env=env, stdout=out, stderr=subprocess.STDOUT, pass_fds=[child_end.fileno()])
        child_end.close()
        self.pid = self.proc.pid
        self.expect("hello", pid=str(self.pid), await_form="1")

    def send(self, text):
        self.agent_end.send(text.encode())

    def expect(self, verb, **fields):
        """The next message but `broken` (a worker that found a peer gone
        says so before the agent's `reshape` may have come)."""
        while True:
            try:
                data = self.agent_end.recv(2048).decode()
            except socket.timeout:
                fail("pid %d: no `%s` within %.0f s\n%s" % (self.pid, verb, LONG, self.tail()))
            head = data.partition(" why=")[0]
            words = head.split(" ")
            got = dict(w.split("=", 1) for w in words[1:])
            if words[0] != "broken":
                break
        if words[0] != verb or any(got.get(k) != v for k, v in fields.items()):
            fail("pid %d: expected `%s %s`, got `%s`" % (self.pid, verb, fields, data))
        return got

    def text(self):
        with open(self.log) as f:
            return f.read()

    def tail(self):
        return "\n".join(self.text().splitlines()[-30:])

    def lines(self, kind):
        out = []
        for line in self.text().splitlines():
            words = line.split(" ")
            if words[0] == kind:  # "joined epoch=0 ..."
                words = words[1:]
            elif not words[0].startswith(kind + "="):  # "step=3 rank=0 ..."
                continue
            try:
                out.append(dict(w.split("=", 1) for w in words))
            except ValueError:
                continue  # a line cut short by kill -9
        return out

    def wait_step(self, pred, what, within=LONG, kind="step"):
        """The first `kind` line matching pred, within `within` seconds."""
        end = time.monotonic() + within
        while time.monotonic() < end:
            for s in self.lines(kind):
                if pred(s):
                    return s
            if self.proc.poll() is not None:
                fail("pid %d ended (%s) waiting for %s\n%s"
                     % (self.pid, self.proc.returncode, what, self.tail()))
            time.sleep(0.05)
        fail("pid %d: no %s within %.0f s\n%s" % (self.pid, what, within, self.tail()))

    def end(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.agent_end.close()


def last_step(w):
    steps = w.lines("step")
    return int(steps[-1]["step"]) if steps else 0


def reform(survivors, ended, epoch, port, size, why, ahead=(), grow=None, told=None):
    """reshape -> ready (each survivor) -> form -> formed; returns the time
    the reshape was sent and the agreed step. ahead: workers started ahead,
    given `form` after the survivors (the next ranks) and answering `formed`.
    grow: a node's joining, deferred at most grow ms (`grow=1 defer_ms=`);
    told: the survivors the reshape is sent to (default all)."""
    t = time.time()
    extra = "" if grow is None else "grow=1 defer_ms=%d " % grow
    for w in (survivors if told is None else told):
        w.send("reshape epoch=%d %swhy=%s" % (ended, extra, why))
    readies = [int(w.expect("ready", epoch=str(ended))["step"]) for w in survivors]
    for rank, w in enumerate(list(survivors) + list(ahead)):
        w.send("form epoch=%d rank=%d size=%d local_rank=0 local_size=1 node_rank=%d "
               "nnodes=%d store=127.0.0.1:1 job=test master_addr=127.0.0.1 master_port=%d"
               % (epoch, rank, size, rank, size, port))
    formed = {w.expect("formed", epoch=str(epoch))["step"] for w in list(survivors) + list(ahead)}
    if len(formed) != 1 or int(formed.pop()) != max(readies):
        fail("formed steps %s, ready steps %s: not one agreed maximum" % (formed, readies))
    reform.readies = readies
    return t, max(readies)


def check_after(survivors, t, world, what):
    """Every survivor, same PID, completes a step with the new world size."""
    worst = 0.0
    for w in survivors:
        s = w.wait_step(lambda s: int(s["world"]) == world and float(s["time"]) > t,
                        "a step with world=%d (%s)" % (world, what))
        if int(s["pid"]) != w.pid:
            fail("%s: pid %s printed by the worker started as %d" % (what, s["pid"], w.pid))
        worst = max(worst, float(s["time"]) - t)
    print("%s: every member's first step with world=%d %.2f s after it" % (what, world, worst),
          flush=True)


def reformed(w, epoch):
    """w's `reformed` line for membership `epoch`, within LONG seconds."""
    end = time.monotonic() + LONG
    while time.monotonic() < end:
        got = [r for r in w.lines("reformed") if r["epoch"] == str(epoch)]
        if got:
            return got[0]
        time.sleep(0.05)
    fail("pid %d: no `reformed epoch=%d` line\n%s" % (w.pid, epoch, w.tail()))


def dropped(w, epoch):
    """The steps w had dropped when it re-formed into `epoch` (its `reformed` line)."""
    return int(reformed(w, epoch)["dropped"])


def split(survivors, epoch, agreed, received, what):
    """Every survivor at the agreed step (its `ready`: reform.readies) sent a share of the
    state, and the survivors sent exactly what the ranks behind received (received: the
    newcomers' counts; a survivor behind's from its line): the outline once, from the
    lowest donor, and each tensor from one donor only, to each rank behind."""
    lines = [reformed(w, epoch) for w in survivors]
    shares = [int(r["sent"]) for r, s in zip(lines, reform.readies) if s == agreed]
    sent = sum(int(r["sent"]) for r in lines)
    got = sum(received) + sum(int(r["received"]) for r in lines)
    if not shares or min(shares) <= 0 or sent != got:
        fail("%s: the survivors at step %d sent %s bytes (%d in all), the ranks behind "
             "received %d: not every survivor at the step sent its share"
             % (what, agreed, shares, sent, got))
    print("%s: %d survivors at step %d sent %s bytes of state, %d received"
          % (what, len(shares), agreed, shares, got), flush=True)
    return shares


def check_history(w):
    """Steps strictly increase by one; position += trainers * batch per step (the ranks that
    trained it: the world less the ranks catching up)."""
    prev = None
    for s in w.lines("step"):
        step, pos, trainers = int(s["step"]), int(s["position"]), int(s["trainers"])
        if prev is not None:
            if step <= prev[0]:
                fail("pid %d: step %d after step %d: a completed step recomputed"
                     % (w.pid, step, prev[0]))
            if step == prev[0] + 1 and pos - prev[1] != trainers * BATCH:
                fail("pid %d: step %d moved the position %d -> %d with %d ranks training"
                     % (w.pid, step, prev[1], pos, trainers))
        prev = (step, pos)


def caught(w, epoch):
    """w's `caught` line for membership `epoch` (it caught up in the background)."""
    return w.wait_step(lambda c: c["epoch"] == str(epoch),
                       "`caught epoch=%d` (the state in, the kept steps replayed)" % epoch,
                       kind="caught")


def same_state(ws, step, what):
    """After `step` every rank of ws holds the same model and optimizer state, bit for bit
    (reform_torch_behind.py's SHA-256 of both)."""
    got = {w.pid: w.wait_step(lambda s: int(s["step"]) == step, "state after step %d" % step,
                              kind="state")["sha"] for w in ws}
    if len(set(got.values())) != 1:
        fail("%s: the model and optimizer state after step %d differ between ranks: %s"
             % (what, step, got))
    print("%s: %d ranks hold the same model and optimizer state after step %d"
          % (what, len(ws), step), flush=True)


def check_slices(ws, first, last, what):
    """Steps first..last: the samples of the ranks that trained each step (catching=0) tile the
    data from the position before the step to the position after it, one after another,
    across the steps: none trained twice, none skipped."""
    prev = None
    for step in range(first, last + 1):
        lines = [w.wait_step(lambda s: int(s["step"]) == step, "step %d" % step) for w in ws]
        trained = sorted(tuple(int(x) for x in s["samples"].split(":")) for s in lines
                         if s["catching"] == "0")
        ends = {int(s["position"]) for s in lines}
        trainers = {int(s["trainers"]) for s in lines}
        if len(ends) != 1 or trainers != {len(trained)}:
            fail("%s: step %d: positions %s, %s ranks training by their lines, %d trained"
                 % (what, step, sorted(ends), sorted(trainers), len(trained)))
        end = ends.pop()
        cur = end - BATCH * len(trained) if prev is None else prev
        for lo, hi in trained:
            if lo != cur:
                fail("%s: step %d: the trained samples %s do not follow on from %d: some "
                     "trained twice or skipped" % (what, step, trained, cur))
            cur = hi
        if cur != end:
            fail("%s: step %d ends the samples at %d, its position says %d"
                 % (what, step, cur, end))
        prev = end
    print("%s: the trained samples of steps %d-%d tile the data, none twice, none skipped"
          % (what, first, last), flush=True)


def same_params(ws, step, what):
    """The parameters after `step` are the same on every rank of ws."""
    got = {}
    for w in ws:
        s = w.wait_step(lambda s: int(s["step"]) == step, "step %d" % step)
        got[w.pid] = s["params"]
    if len(set(got.values())) != 1:
        fail("%s: parameters after step %d differ between ranks: %s" % (what, step, got))


def shipped(cohort):
    """`cohort run` puts this very cohort_reform on a Python worker's path."""
    script = ("import cohort_reform, os, sys\n"
              "first = os.environ['PYTHONPATH'].split(':')[0]\n"
              "sys.exit(os.path.dirname(cohort_reform.__file__) != first or "
              "open(cohort_reform.__file__).read() != open(sys.argv[1]).read())\n")
    r = subprocess.run([cohort, "run", "--nproc-per-node", "1", "--no-python", PY, "-c",
                        script, os.path.join(SRC, "src/agent/python/cohort_reform.py")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=LONG)
    if r.returncode != 0:
        fail("cohort run did not give the worker src/agent/python/cohort_reform.py first "
             "on PYTHONPATH:\n" + r.stdout.decode(errors="replace"))


def breaker_spares_listeners(src):
    """The breaker ends the reading side of the group's connected sockets and
    leaves its listening sockets listening: gloo's listener thread (PyTorch
    2.x) aborts the process when accept() fails, as it does on a shut-down
    listener (EINVAL)."""
    sys.path.insert(0, os.path.join(src, "src", "agent", "python"))
    import cohort_reform
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(4)
        lst.settimeout(10)
        cli = socket.create_connection(lst.getsockname(), timeout=10)
        srv, _ = lst.accept()
        names = cohort_reform._sockets()
        for s in (lst, srv):
            cohort_reform._shut_reading(s.fileno(), names[s.fileno()])
        srv.settimeout(10)
        if srv.recv(1) != b"":
            fail("the breaker left a connected socket's reading side open")
        try:
            other = socket.create_connection(lst.getsockname(), timeout=10)
            lst.accept()[0].close()
            other.close()
        except OSError as e:
            fail("the breaker shut a listening socket: accept() failed: %s" % e)
        for s in (cli, srv):
            s.close()


def layouts_agree():
    """A rank that loaded the state a donor handed over (its outline through pickle, its
    tensors) has the donor's layout (cohort_reform._layout), so both may donate next time:
    with tied weights (one tensor in two entries) and Adam's state after a step."""
    import torch
    import cohort_reform

    def job(seed):
        torch.manual_seed(seed)
        emb, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
        head.weight = emb.weight
        j = cohort_reform.Job.__new__(cohort_reform.Job)  # the state's parts only
        j.module = torch.nn.Sequential(emb, torch.nn.Tanh(), head)
        j.optimizer = torch.optim.Adam(j.module.parameters())
        j.extra, j.step, j.position = {}, 3, 12
        return j
    donor, heir = job(0), job(1)
    donor.module(torch.tensor([1, 2])).sum().backward()
    donor.optimizer.step()
    tensors = []
    outline = pickle.loads(pickle.dumps(cohort_reform._outline(donor.state_dict(), tensors)))
    heir.load_state_dict(cohort_reform._fill(outline, [t.clone() for t in tensors]))
    tied = [outline["model"][k].index for k in ("0.weight", "2.weight")]
    if tied[0] != tied[1]:
        fail("the tied weight has two places in the outline: %s" % tied)
    got = [cohort_reform._layout(j.state_dict()) for j in (donor, heir)]
    if got[0] != got[1]:
        fail("a rank that loaded the handed-over state has layout %x, the donor's %x"
             % (got[1], got[0]))


def main():
    breaker_spares_listeners(sys.argv[1])
    layouts_agree()
    if len(sys.argv) > 2:
        shipped(sys.argv[2])
    tmp = tempfile.mkdtemp(prefix="reform-torch-%d-" % os.getpid())
    port = free_port()
    ws = []
    run.extra = []
    try:
        for r in range(3):
            ws.append(Worker(tmp, "w%d" % r, r, 3, 0, port))
        run(tmp, ws)
    finally:  # a failure printed the logs' tails already
        for w in ws + run.extra:
            w.end()
        if not os.environ.get("KEEP"):
            shutil.rmtree(tmp)
    print("PASS")


def run(tmp, ws):
    for w in ws:
        w.wait_step(lambda s: int(s["step"]) >= 5, "step 5")

    # 1. A node lost: kill -9 of rank 2.
    t_kill = time.time()
    ws[2].proc.kill()
    ws[2].proc.wait()
    survivors = ws[:2]
    reform(survivors, 0, 1, free_port(), 2, "rank 2 lost (kill -9)")
    check_after(survivors, t_kill, 2, "kill -9")

    # 2. A newcomer joins and catches up in the background. The agent's reshape says grow=1
    # and reaches survivors[0] only: every survivor completes the step in flight, they agree
    # at that step's end (survivors[1] too, which was told nothing) and re-form there,
    # dropping no step. The survivors' streams of the state are held: they must go on
    # training meanwhile (the blocking hand-over held them in the join).
    at = max(last_step(w) for w in survivors) + 3
    for w in survivors:
        w.wait_step(lambda s: int(s["step"]) >= at, "step %d" % at)
    port = free_port()
    new = Worker(tmp, "new", 2, 3, 2, port, newcomer=True, grow_break="1")
    run.extra.append(new)
    for w in survivors:
        open(w.hold_file, "w").close()
    before = [dropped(w, 1) for w in survivors]
    t_grow, agreed = reform(survivors, 1, 2, port, 3, "a node joins", grow=60000,
                            told=survivors[:1])
    if len(set(reform.readies)) != 1:
        fail("a deferred grow: the survivors answered `ready` at steps %s, not at one "
             "boundary" % reform.readies)
    new.expect("formed", epoch="2", step=str(agreed))
    for w in survivors:
        w.wait_step(lambda s: int(s["step"]) >= agreed + 2 and s["world"] == "3"
                    and s["trainers"] == "2" and s["catching"] == "0",
                    "2 steps trained while the newcomer catches up (its stream held)", within=30)
    joined = new.wait_step(lambda j: True, "the newcomer's `joined` line", kind="joined")
    if int(joined["received"]) != 0 or int(joined["step"]) != agreed:
        fail("the newcomer did not join catching up at step %d: %s\n%s"
             % (agreed, joined, new.tail()))
    if new.lines("caught"):
        fail("the newcomer caught up while the survivors' streams were held")
    after = [dropped(w, 2) for w in survivors]
    if after != before:
        fail("a deferred grow: the survivors' dropped steps went from %s to %s"
             % (before, after))
    for w in survivors:
        os.unlink(w.hold_file)
    got = caught(new, 2)
    t = int(got["step"])
    during = [s for s in survivors[0].lines("step") if agreed < int(s["step"]) <= t]
    if int(got["received"]) <= 0 or int(got["replayed"]) != t - agreed or len(during) < 2:
        fail("the newcomer's catch-up: %s, the survivors trained %d steps meanwhile"
             % (got, len(during)))
    print("grow: the survivors trained steps %d-%d while the newcomer caught up (%s bytes, "
          "%s steps replayed)" % (agreed + 1, t, got["received"], got["replayed"]), flush=True)
    members = survivors + [new]
    same_state(members, t, "the newcomer caught up")
    check_after(members, t_grow, 3, "grow")
    same_params(members, t + 1, "the newcomer's first step training")
    split(survivors, 2, agreed, [int(got["received"])], "grow")
    if not all(s["catching"] == "1" for s in new.lines("step") if int(s["step"]) <= t):
        fail("the newcomer's steps up to %d did not say it was catching up" % t)
    if "backward while catching up" in new.text():
        fail("gloo: the newcomer's backward reached the model while it caught up\n%s"
             % new.tail())
    print("grow: the newcomer's %d steps catching up ran no backward through the model"
          % (t - agreed), flush=True)
    check_slices(members, agreed + 1, t + 2, "grow")

    # 3. A stalled rank (SIGSTOP): only `reshape` ends the survivors' wait. It comes as a
    # grow deferred 1 s at most: no step boundary comes while the collective waits for
    # the stalled rank, so the deferral runs out and ends the membership then.
    stalled = members[1]
    t_stop = time.time()
    os.kill(stalled.pid, signal.SIGSTOP)
    time.sleep(1.0)  # the others are now blocked in a collective with it
    survivors = [members[0], members[2]]
    reform(survivors, 2, 3, free_port(), 2, "rank 1 silent (SIGSTOP)", grow=1000)
    check_after(survivors, t_stop + 1.0, 2, "SIGSTOP")
    stalled.proc.kill()
    stalled.proc.wait()

    # 4. Re-forms in a row leave no descriptor and no thread behind.
    def counts():
        return [(len(os.listdir("/proc/%d/fd" % w.pid)),
                 len(os.listdir("/proc/%d/task" % w.pid))) for w in survivors]
    before = counts()
    for e in range(3, 7):
        reform(survivors, e, e + 1, free_port(), 2, "re-form %d" % e)
        t = time.time()
        for w in survivors:
            w.wait_step(lambda s: float(s["time"]) > t, "a step after re-form %d" % e)
    if counts() != before:
        fail("4 re-forms changed the survivors' (descriptors, threads) from %s to %s"
             % (before, counts()))

    # 5. A survivor behind: survivors[1]'s next step fails after its all_reduce (it says
    # `broken`) while survivors[0] completes it and waits in the next one.
    ahead, behind = survivors
    open(behind.fail_file, "w").close()
    got = behind.agent_end.recv(2048).decode()
    if not got.startswith("broken epoch=7 "):
        fail("the failing survivor said `%s`, not `broken epoch=7`" % got)
    reform(survivors, 7, 8, free_port(), 2, "rank 1's step failed")
    s_ahead, s_behind = reform.readies
    if s_ahead != s_behind + 1:
        fail("ready steps %d and %d: not one survivor a step behind" % (s_ahead, s_behind))
    done, got = reformed(ahead, 8), reformed(behind, 8)
    if int(done["sent"]) <= 0 or int(got["received"]) <= 0 or int(got["step"]) != s_ahead:
        fail("the survivor behind did not receive the state of step %d: %s %s"
             % (s_ahead, done, got))
    split(survivors, 8, s_ahead, [], "behind")
    same_params(survivors, s_ahead + 1, "the survivor behind's next step")
    print("behind: the survivor at step %d received %s bytes of step %d's state"
          % (s_behind, got["received"], s_ahead), flush=True)

    # 6. A newcomer started ahead: it waits for its first `form` (saying nothing meanwhile).
    late = Worker(tmp, "ahead", None, None, None, None, newcomer=True, ahead=True,
                  grow_break="1")
    run.extra.append(late)
    late.agent_end.settimeout(1.0)
    try:
        got = late.agent_end.recv(2048).decode()
        fail("the worker started ahead said `%s` before its form" % got)
    except socket.timeout:
        pass
    late.agent_end.settimeout(LONG)
    # A grow, told to survivors[0] only (the newcomer of section 2 breaks a step on a grow):
    # the survivors re-form at one step boundary, so the worker started ahead catches up,
    # by NCCL's path (it computes its steps, its part of the exchange -0.0).
    for w in survivors + [late]:
        open(w.compute_file, "w").close()
    t_late, agreed = reform(survivors, 8, 9, free_port(), 3, "a node joins", ahead=[late],
                            grow=60000, told=survivors[:1])
    joined = late.wait_step(lambda j: j["epoch"] == "9", "`joined epoch=9`", kind="joined")
    if int(joined["received"]) != 0 or int(joined["step"]) != agreed or joined["rank"] != "2":
        fail("the worker started ahead did not join as rank 2 of epoch 9 catching up from "
             "step %d: %s\n%s" % (agreed, joined, late.tail()))
    got = caught(late, 9)
    for w in survivors + [late]:
        os.unlink(w.compute_file)
    if "backward while catching up" not in late.text():
        fail("NCCL's path: the worker started ahead ran no backward while it caught up\n%s"
             % late.tail())
    split(survivors, 9, agreed, [int(got["received"])], "started ahead")
    survivors = survivors + [late]
    check_after(survivors, t_late, 3, "started ahead")
    same_state(survivors, int(got["step"]), "the worker started ahead caught up")
    same_params(survivors, int(got["step"]) + 1, "the worker started ahead's first step training")
    check_slices(survivors, agreed + 1, int(got["step"]) + 1, "started ahead")

    # 10 (before 7). A donor lost while it streams to a newcomer catching up (the streams
    # held): the membership ends, the newcomer says it takes the state in the next one, and does.
    for w in survivors:
        open(w.hold_file, "w").close()
    port = free_port()
    # The grow goes to survivors[0] (COHORT_GROW_BREAK=0: deferred), so that they re-form at
    # one step boundary and the newcomer catches up; survivors[2], a donor, is then killed.
    late2 = Worker(tmp, "late2", 3, 4, 10, port, newcomer=True, grow_break="1")
    run.extra.append(late2)
    _, agreed = reform(survivors, 9, 10, port, 4, "a node joins", grow=60000,
                       told=survivors[:1])
    late2.expect("formed", epoch="10", step=str(agreed))
    joined = late2.wait_step(lambda j: True, "`joined epoch=10`", kind="joined")
    if int(joined["received"]) != 0:
        fail("the newcomer did not join catching up: %s" % joined)
    for w in survivors:
        w.wait_step(lambda s: int(s["step"]) > agreed and s["trainers"] == "3", "a step with "
                    "3 ranks training while the newcomer catches up", within=30)
    lost = survivors.pop(2)
    lost.proc.kill()
    lost.proc.wait()
    for w in survivors:
        os.unlink(w.hold_file)
    t_lost, agreed = reform(survivors + [late2], 10, 11, free_port(), 3,
                            "a donor lost while it streams")
    if reform.readies[-1] != -1:
        fail("the newcomer answered `ready` with step %d, not -1 (no state)" % reform.readies[-1])
    if "membership 10 ended while it caught up" not in late2.text():
        fail("the newcomer did not say that it takes the state in the next membership\n%s"
             % late2.tail())
    # It catches up again, unless a survivor's step in flight failed while another's completed
    # (that survivor is behind too: the blocking hand-over for both).
    if len(set(reform.readies[:-1])) == 1:
        got = caught(late2, 11)
        t = int(got["step"])
    else:
        got = reformed(late2, 11)
        t = agreed + 1
    if int(got["received"]) <= 0:
        fail("the newcomer did not receive the state in membership 11: %s" % got)
    survivors = survivors + [late2]
    same_state(survivors, t, "a donor lost while it streamed")
    check_after(survivors, t_lost, 3, "a donor lost while it streamed")
    print("donor lost: the newcomer took the state of step %d in the next membership (%s bytes)"
          % (agreed, got["received"]), flush=True)

    # 7. A replacement started with its membership's variables (not ahead) whose membership
    # ends before it formed (a further loss): it answers `ready` and joins the next `form`.
    # It has COHORT_REFORM_CATCHUP=0: the blocking hand-over, every rank waiting for it.
    heir = Worker(tmp, "heir", 3, 4, 12, free_port(), newcomer=True, grow_break="1",
                  catchup="0")
    run.extra.append(heir)
    heir.send("reshape epoch=12 why=a further loss")
    heir.expect("ready", epoch="12", step="-1")
    t_heir, agreed = reform(survivors, 11, 13, free_port(), 4, "a node joins", ahead=[heir])
    joined = None
    end = time.monotonic() + LONG
    while joined is None and time.monotonic() < end:
        joined = ([j for j in heir.lines("joined") if j["epoch"] == "13"] or [None])[0]
        time.sleep(0.05)
    if joined is None or int(joined["received"]) <= 0 or int(joined["step"]) != agreed \
            or joined["rank"] != "3":
        fail("the replacement whose membership ended did not join epoch 13 as rank 3 with "
             "the state of step %d: %s\n%s" % (agreed, joined, heir.tail()))
    split(survivors, 13, agreed, [int(joined["received"])], "replacement")
    survivors = survivors + [heir]
    check_after(survivors, t_heir, 4, "membership ended before the replacement formed")
    same_params(survivors, agreed + 1, "the replacement's first step")
    same_state(survivors, agreed + 1, "the replacement given the state at its join")
    if heir.lines("caught") or any(s["trainers"] != "4" for s in heir.lines("step")):
        fail("COHORT_REFORM_CATCHUP=0: the replacement caught up in the background\n%s"
             % heir.tail())

    # 8. A grow breaks the step in flight (COHORT_GROW_BREAK=1 on the workers that joined):
    # the first worker stalls (SIGSTOP), the others wait for it in a collective, and a grow
    # deferred up to 60 s comes; they break at once, so all three answer `ready` long
    # before the deferral would have run out.
    stalled = survivors[0]
    os.kill(stalled.pid, signal.SIGSTOP)
    time.sleep(1.0)
    survivors = survivors[1:]
    t_break = time.time()
    reform(survivors, 13, 14, free_port(), 3, "a node joins", grow=60000)
    took = time.time() - t_break
    if took > 20.0:
        fail("a grow with COHORT_GROW_BREAK=1 re-formed %.1f s after it came: it waited for "
             "its deferral (60 s) instead of breaking the step" % took)
    print("grow breaking the step: re-formed %.2f s after it came" % took, flush=True)
    stalled.proc.kill()
    stalled.proc.wait()
    check_after(survivors, t_break, 3, "grow breaking the step")

    # 9. A reshape while a rank is inside its step's forward (held after its first layer, as a
    # large model's would compute): the step ends at the next layer; its backward never runs.
    w = survivors[0]
    open(w.slow_file, "w").close()
    end = time.monotonic() + LONG
    while not os.path.exists(w.slow_file + ".in") and time.monotonic() < end:
        time.sleep(0.01)
    for v in survivors:
        v.send("reshape epoch=14 why=a loss while rank 0 computes")
    time.sleep(0.5)  # the reshape reaches its channel thread while the forward is held
    os.unlink(w.slow_file)
    t_mid, agreed = reform(survivors, 14, 15, free_port(), 3, "", told=[])
    if os.path.exists(w.slow_file + ".backward"):
        fail("the step whose membership ended during its forward ran its backward")
    check_after(survivors, t_mid, 3, "a loss during the forward")
    same_params(survivors, agreed + 1, "the step after a loss during the forward")

    # Training goes on; the survivors agree bit for bit and kept their history.
    at = max(last_step(w) for w in survivors) + 10
    for w in survivors:
        w.wait_step(lambda s: int(s["step"]) >= at, "step %d" % at)
        check_history(w)
    for w in survivors:
        w.send("stop why=test over")
    same_params(survivors, at, "the end")
    for w in survivors:
        try:
            w.proc.wait(timeout=LONG)
        except subprocess.TimeoutExpired:
            fail("pid %d did not end after `stop`" % w.pid)
        m = re.findall(r"Stopped: the agent stopped the job: test over", w.text())
        if not m:
            fail("pid %d: no Stopped error naming the agent's why\n%s" % (w.pid, w.tail()))


if __name__ == "__main__":
    main()
