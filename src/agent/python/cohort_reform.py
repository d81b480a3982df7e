"""cohort_reform: PyTorch DDP workers that outlive a lost node.

Under `cohort run --on-failure reform` the agent gives each worker one end of
a control channel (COHORT_CONTROL_FD, a SOCK_SEQPACKET socket) and puts this
module's directory first on PYTHONPATH. A script takes part with a few lines
(docs/reform.md, "PyTorch workers"):

    import cohort_reform
    job = cohort_reform.Job(model, optimizer, batch_size=B)
    while job.step < steps:
        with job.training_step():
            lo = job.position + job.slot * B    # this rank's samples
            loss = loss_fn(job.ddp(x[lo:lo + B]), y[lo:lo + B])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

Job joins the process group (rank 0 hosts a TCPStore at MASTER_ADDR:
MASTER_PORT, as env:// does) and wraps the model in DistributedDataParallel.
When the agent announces `reshape`, a thread of this module makes the
collective in flight fail at once (gloo: it shuts the process group's own
sockets down; NCCL: it aborts the communicators), except for a node joining
(`grow=1`), which ends the membership at the next step boundary the ranks
agree on (COHORT_GROW_DEFER_MS at most); training_step() then, in the
same process, destroys the process group, answers `ready`, waits for `form`,
joins the new membership, answers `formed`, and has every rank holding the
most advanced state send its share of model, optimizer, step and data
position to every rank behind it (newcomers, COHORT_NEWCOMER=1, and
survivors whose step in flight failed), the shares at once. The step in
flight is kept when any rank completed it, else dropped: no completed step
is recomputed.

When every rank behind is new (and no rank sets COHORT_REFORM_CATCHUP=0;
docs/reform.md, "Catching up in the background"), those ranks instead catch
up while the others train: the donors stream their shares of the state of the
agreed step from its own memory (what is not sent by their next update moves
to new memory there) over a process group of their own. With gloo the ranks
that train exchange gradients in a group of their own (job.trainers of them),
a rank catching up runs its forward without autograd (job.ddp gives leaf
outputs: the script's backward ends there), and its optimizer.step() receives
the step's averaged gradients and hyper-parameters from the lowest rank that
trains, as that rank's update applies them, and keeps them instead of
updating. (With NCCL it computes its step and takes part in every step's
gradient exchange with -0.0 through a DDP comm hook, and keeps what the
exchange gave.) One more flag in the boundary's all_reduce says when every rank's
state is in; there the ranks catching up load it, replay the kept steps, and
from the next step every rank trains. Meanwhile job.catching_up is True on
them (their loss is not the model's) and job.slot gives each rank that trains
its samples.

A late node's agent may start this worker ahead of its membership
(COHORT_AWAIT_FORM=1, which hello's await_form=1 allows): Job then waits for
the first `form`, so the interpreter's start and the imports run while the
survivors train.

Without COHORT_CONTROL_FD (torchrun, `cohort run` without reform) Job is a
plain DDP set-up and training_step() only counts steps.
"""
import atexit
import contextlib
import copy
import gc
import hashlib
import inspect
import os
import pickle
import re
import select
import socket
import sys
import threading
import time
import types
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

__all__ = ["Job", "Reshaped", "Stopped", "NoState", "StreamFailed"]


class Reshaped(Exception):
    """The membership ended: the job's ranks change (raised by check())."""


class Stopped(RuntimeError):
    """The agent ended the job (`stop`), or its control channel closed."""


class NoState(RuntimeError):
    """No rank of the new membership holds training state: load a checkpoint."""


class StreamFailed(RuntimeError):
    """A rank catching up lost its state stream while the membership held: it asks the
    agent for a re-form (as for a failed collective), in which it receives the state."""


# The gloo group's timeout (torch's default: 30 minutes). A reshape ends a
# collective at once, with one exception in gloo (1.13): a send queued after
# its peer's socket broke (EPIPE or ECONNRESET in gloo's non-blocking write)
# is not woken when the pair fails, and waits for this timeout. Shutting down
# only the reading side keeps this process's own writes from failing, which
# leaves a peer closing in the same instant as the cause (a few percent of
# re-forms). Raise it when one rank may keep the others waiting longer
# (evaluation or a checkpoint on rank 0 alone).
_GLOO_TIMEOUT = timedelta(seconds=60)

# Substrings of the errors a collective raises when a peer is gone.
_COMM_ERRORS = ("gloo", "nccl", "connection", "closed", "reset by peer",
                "broken pipe", "timed out", "timeout", "aborted")


def _grow_defer_s():
    """COHORT_GROW_DEFER_MS in seconds (default 20 s; 0: a node's joining ends the
    membership at once, as a loss does)."""
    raw = os.environ.get("COHORT_GROW_DEFER_MS", "20000")
    if not raw.isdigit() or int(raw) > 3600000:
        raise ValueError("COHORT_GROW_DEFER_MS=%r: expected milliseconds, 0 to 3600000" % raw)
    return int(raw) / 1000.0


def _grow_break():
    """COHORT_GROW_BREAK: the share of a step within which a node joining breaks it, 0 to 1
    (0: every grow deferred; 1: every grow that comes during a step breaks it); unset: -1,
    derived from the world at each step (Job._open_window)."""
    raw = os.environ.get("COHORT_GROW_BREAK", "")
    if raw == "":
        return -1.0
    try:
        f = float(raw)
    except ValueError:
        f = -1.0
    if not 0.0 <= f <= 1.0:
        raise ValueError("COHORT_GROW_BREAK=%r: expected a share of a step, 0 to 1" % raw)
    return f


def _catch_up_on():
    """COHORT_REFORM_CATCHUP: 1 (default), a newcomer catches up in the background while the
    others train; 0, the blocking hand-over (every rank waits for the state's transfer). A rank
    with 0 makes the whole membership take the blocking one."""
    raw = os.environ.get("COHORT_REFORM_CATCHUP", "1")
    if raw not in ("0", "1"):
        raise ValueError("COHORT_REFORM_CATCHUP=%r: expected 0 or 1" % raw)
    return raw == "1"


# COHORT_REFORM_TRACE=1: each step's time, CPU and page faults and the catch-up's events, one
# line each on stderr ("cohort_reform trace: PID T ...", T: CLOCK_MONOTONIC, the same on every
# process of the machine), printed by the training thread at the step's end (docs/reform.md).
_TRACE = os.environ.get("COHORT_REFORM_TRACE") == "1"
_EVENTS = []  # (time, text): appended from any thread, printed by the training thread


def _trace(fmt, *args):
    if _TRACE:
        _EVENTS.append((time.monotonic(), fmt % args))


def _flush_trace():
    while _EVENTS:
        t, text = _EVENTS.pop(0)
        print("cohort_reform trace: %d %.3f %s" % (os.getpid(), t, text), file=sys.stderr,
              flush=True)


def _usage():
    """This process's (user s, system s, minor page faults) so far."""
    with open("/proc/self/stat") as f:
        st = f.read().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(st[11]) / hz, int(st[12]) / hz, int(st[7])


def _parse(data):
    """`VERB key=value ... why=rest of the text` -> (verb, {key: value})."""
    text = data.decode("ascii", "replace")
    verb, _, rest = text.partition(" ")
    fields = {}
    while rest:
        if rest.startswith("why="):
            fields["why"] = rest[4:]
            break
        word, _, rest = rest.partition(" ")
        key, eq, value = word.partition("=")
        if eq:
            fields[key] = value
    return verb, fields


class _Channel:
    """The worker's end of the agent's control channel, read by a thread."""

    def __init__(self, fd, on_reshape):
        self.sock = socket.socket(fileno=fd)
        os.set_inheritable(fd, False)  # not held open by the script's children
        self.on_reshape = on_reshape
        self.cond = threading.Condition()
        self.reshape_epoch = -1  # the newest membership announced as ended
        self.grow_epoch = -1     # the newest membership a node's joining will end (deferred)
        self.grow_timer = None   # ends it when the deferral runs out
        self.defer_s = _grow_defer_s()
        self.break_until = 0.0   # time.monotonic() until which a grow breaks the step
        self.forms = []          # `form` messages not yet taken
        self.stop_why = None     # set by `stop` or the channel closing
        self.send_lock = threading.Lock()
        threading.Thread(target=self._read, name="cohort-reform", daemon=True).start()

    def send(self, verb, **fields):
        msg = " ".join([verb] + ["%s=%s" % kv for kv in fields.items()])
        with self.send_lock:
            self.sock.send(msg.encode("ascii"))

    def _read(self):
        while True:
            try:
                data = self.sock.recv(2048)
            except OSError as e:
                data, why = b"", "the control channel failed: %s" % e
            else:
                why = "the agent's control channel closed"
            if not data:
                self._stopped(why)
                return
            verb, f = _parse(data)
            if verb == "reshape" and "epoch" in f and self._defer(f):
                continue
            if verb == "reshape" and "epoch" in f:
                with self.cond:
                    self.reshape_epoch = max(self.reshape_epoch, int(f["epoch"]))
                    self.cond.notify_all()
                self._cancel_grow()
                self.on_reshape(int(f["epoch"]))
            elif verb == "form" and "epoch" in f:
                with self.cond:
                    self.forms.append(f)
                    self.cond.notify_all()
            elif verb == "stop":
                self._stopped("the agent stopped the job: %s" % f.get("why", "no reason given"))

    def _defer(self, f):
        """A node joining (grow=1: every member lives): True when its reshape is deferred to
        the script's next step boundary (Job's training_step), for defer_ms at most; then
        it ends the membership as any reshape would."""
        if f.get("grow") != "1" or self.defer_s <= 0:
            return False
        limit = self.defer_s
        if f.get("defer_ms", "").isdigit():
            limit = min(limit, int(f["defer_ms"]) / 1000.0)
        epoch = int(f["epoch"])
        with self.cond:
            if self.grow_timer is None and time.monotonic() < self.break_until:
                return False  # early in the step: breaking it is cheaper (Job._open_window)
            self.grow_epoch = max(self.grow_epoch, epoch)
            self.cond.notify_all()  # a failed collective's wait (Job._recover) ends
            if self.grow_timer is not None:  # one pending already: its deadline is earlier
                return True
            self.grow_timer = threading.Timer(limit, self.end_membership, args=(epoch,))
            self.grow_timer.daemon = True
            self.grow_timer.start()
        return True

    def open_window(self, seconds, epoch):
        """As a step of membership `epoch` begins: a grow within `seconds` (<= 0: none) ends
        the membership at once. One pending already ends it now: True then."""
        with self.cond:
            self.break_until = time.monotonic() + seconds if seconds > 0 else 0.0
            now = seconds > 0 and self.grow_epoch >= epoch
        if now:
            self.end_membership(epoch)
        return now

    def _cancel_grow(self):
        """The membership ended: a deferral's timer has nothing left to end (its thread goes)."""
        with self.cond:
            timer, self.grow_timer = self.grow_timer, None
        if timer is not None:
            timer.cancel()

    def end_membership(self, epoch):
        """Membership `epoch` ends now: a reshape, or a deferred one taken (or expired)."""
        with self.cond:
            if self.reshape_epoch >= epoch:
                return
            self.reshape_epoch = epoch
            self.cond.notify_all()
        self._cancel_grow()
        self.on_reshape(epoch)

    def _stopped(self, why):
        with self.cond:
            if self.stop_why is None:
                self.stop_why = why
            self.cond.notify_all()
        self.on_reshape(None)

    def wait_reshape(self, epoch, timeout):
        """True once membership `epoch` is announced ended, a node's joining deferred
        included (or the job stops)."""
        with self.cond:
            return self.cond.wait_for(
                lambda: max(self.reshape_epoch, self.grow_epoch) >= epoch
                or self.stop_why is not None, timeout)

    def wait_form(self, after):
        """The first `form` of a membership newer than `after`; Stopped on stop."""
        with self.cond:
            while True:
                self.forms = [f for f in self.forms if int(f["epoch"]) > after]
                if self.forms:
                    return self.forms.pop(0)
                if self.stop_why is not None:
                    raise Stopped(self.stop_why)
                self.cond.wait()


def _sockets():
    """{fd: 'socket:[inode]'} of this process's sockets."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue
        if target.startswith("socket:"):
            out[int(name)] = target
    return out


def _shut_reading(fd, name):
    """Ends the reading side of the group's connected socket fd, if fd is
    still the socket called name (gloo may have closed it). Listening sockets
    are left alone: gloo's listener thread (PyTorch 2.x) aborts the process
    when its accept() fails, and a shut-down listener fails with EINVAL."""
    try:
        if os.readlink("/proc/self/fd/%d" % fd) != name:
            return
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        if not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            s.shutdown(socket.SHUT_RD)  # reading side only: see _GLOO_TIMEOUT
    except OSError:
        pass
    s.close()


def _peer_socket(fd, store_port):
    """Whether fd is a connection of the group to a peer rank: a connected TCP socket, not
    the store's (its port at either end: a store client's probe may close any time)."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
            return False
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return False
        return store_port not in (s.getsockname()[1], s.getpeername()[1])
    except OSError:
        return False
    finally:
        s.close()


class _PeerWatch:
    """Tells the agent at once when a peer rank's connection closes while this rank is in a
    step's body (Job._Step): a node killed whole closes its connections at once, but gloo
    notices only at the next collective and the agent only when the heartbeat times out.
    Armed in the step's body only: a peer that finished its last step closes after the
    boundary's all_reduce, outside it. A peer that took a reshape a moment before this rank
    closes too: the watch waits GRACE_S for this rank's own before it tells. One thread per
    membership, which ends once it told, at stop(), or when the membership ended."""

    GRACE_S = 0.3

    def __init__(self, job, socks, store_port):
        self.job, self.epoch, self.rank = job, job.epoch, job.rank
        self.lock = threading.Lock()
        self.armed = self.pending = False  # pending: a peer closed, not told yet
        self.poll = select.poll()
        for fd in [fd for fd in socks if _peer_socket(fd, store_port)]:
            self.poll.register(fd, select.POLLRDHUP)
        self.rd, self.wr = os.pipe()
        self.poll.register(self.rd, select.POLLIN)
        threading.Thread(target=self._run, name="cohort-reform-watch", daemon=True).start()

    def arm(self, on):
        """In a step's body (on) or out of it; a close seen out of it is told on arming."""
        with self.lock:
            self.armed = on
            wake = on and self.pending
        if wake:
            self._wake(b"a")

    def stop(self):
        self._wake(b"x")
        if self.wr >= 0:
            os.close(self.wr)
            self.wr = -1

    def _wake(self, byte):
        if self.wr >= 0:
            try:
                os.write(self.wr, byte)
            except OSError:
                pass

    def _run(self):
        try:
            while self._watch_once():
                pass
        finally:
            os.close(self.rd)

    def _watch_once(self):
        """One poll: False once the thread is done."""
        for fd, ev in self.poll.poll():
            if fd == self.rd:
                if os.read(self.rd, 1) == b"x":
                    return False
            else:
                self._closed(fd)
            if self.job.epoch != self.epoch or self.job.reshaped():
                return False
            with self.lock:
                tell = self.armed and self.pending
            if tell:
                self._tell()
                return False
        return True

    def _closed(self, fd):
        """fd's event: its peer closed it, or gloo closed it already on finding that (the
        number may even be another file's by now): no longer watched, pending."""
        self.poll.unregister(fd)
        with self.lock:
            self.pending = True

    def _tell(self):
        if self.job.channel.wait_reshape(self.epoch, self.GRACE_S):
            return  # the membership ended: the peer closed for that
        print("cohort_reform: rank %d: a peer's connection closed during the step (membership "
              "%d): told the agent" % (self.rank, self.epoch), file=sys.stderr, flush=True)
        self.job.channel.send("broken", epoch=self.epoch, why="a peer's connection closed")


class Job:
    """A DDP training job that takes part in cohort's re-forms.

    model, optimizer: the user's module (not yet wrapped) and its optimizer
    (under the agent, Job wraps this instance's optimizer.step: a rank
    catching up keeps the step's gradients instead of updating).
    batch_size: samples per rank per step (position advances by
    trainers * batch_size per completed step: the world, less the ranks
    catching up; each rank that trains takes the samples of its slot). extra: {name: object with
    state_dict()/load_state_dict()} also handed to newcomers (an LR
    scheduler). backend: "gloo" (default) or "nccl". timeout: the process
    group's, 60 s (a stalled peer is ended by the agent's `reshape`, not by
    it; see _GLOO_TIMEOUT).
    join_timeout: seconds a bootstrap may wait for the other ranks.
    wait: seconds a failed collective waits for the agent's `reshape` before
    it counts as an ordinary error. ddp_args: DistributedDataParallel's.
    """

    def __init__(self, model, optimizer, batch_size=1, extra=None, backend="gloo",
                 timeout=_GLOO_TIMEOUT, join_timeout=120.0, wait=60.0,
                 ddp_args=None):
        self.module, self.optimizer, self.batch_size = model, optimizer, batch_size
        self.extra = dict(extra or {})
        self.backend, self.timeout, self.wait = backend, timeout, wait
        self.join_timeout = timedelta(seconds=join_timeout)
        self.ddp_args = dict(ddp_args or {})
        self.step = 0        # completed training steps
        self.position = 0    # samples consumed
        self.has_state = os.environ.get("COHORT_NEWCOMER") != "1"
        env = os.environ  # the membership: the agent's round
        self.epoch = int(env.get("COHORT_ROUND", env.get("TORCHELASTIC_RESTART_COUNT", "0")))
        self.reforms = []    # per membership joined: {"epoch", "world_size", "donor" (the
        #                      lowest of "donors"), "donors", "behind", "sent", "received"}
        self.dropped = 0     # steps begun here that a membership's end left incomplete
        self.grow_break = _grow_break()
        self.catch_up = _catch_up_on()
        self._step_t0 = self._last_step_s = None  # the step's start, the last one's seconds
        self._step_usage = None  # _usage() at the step's start (COHORT_REFORM_TRACE)
        self.ddp = None
        self._store = None
        self._lock = threading.Lock()  # the breaker against the teardown
        self._socks = {}               # the process groups' own sockets
        self._watch = None             # _PeerWatch of the membership (gloo)
        self._in_body = False          # inside a step's body (_Step)
        self._pg = None
        self._stream_pg = None         # the catch-up's own group (_CatchUp)
        self._catch = None             # _CatchUp while ranks of the membership catch up
        self.channel = None
        self._closed = False
        atexit.register(self.close)  # before the interpreter finalises: see close()
        if backend == "nccl":
            _nccl_env()
        fd = os.environ.get("COHORT_CONTROL_FD")
        if fd:
            self.channel = _Channel(int(fd), self._break)
            # await_form=1: this module can be started ahead of its membership.
            self.channel.send("hello", pid=os.getpid(), await_form=1)
            self._hook_model()
            self._hook_optimizer()
        if self.channel is not None and env.get("COHORT_AWAIT_FORM") == "1":
            self._first_form()  # started ahead: the survivors went on without waiting
            return
        first = dict(rank=env["RANK"], size=env["WORLD_SIZE"], epoch=self.epoch,
                     master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                     master_port=env["MASTER_PORT"])
        if self.channel is None:
            self._join(first, announce=not self.has_state)
        else:  # its membership may end before it formed: then the next one
            self._first_form(first)

    @property
    def rank(self):
        return dist.get_rank()

    @property
    def world_size(self):
        return dist.get_world_size()

    @property
    def catching_up(self):
        """True while this rank receives the state in the background: its steps train
        nothing (its loss and parameters are not the model's); it trains once caught up."""
        c = self._catch
        return c is not None and c.catching

    @property
    def trainers(self):
        """The ranks that train this step: world_size, less the ranks catching up."""
        c = self._catch
        return c.trainers if c is not None else self.world_size

    @property
    def slot(self):
        """This rank's place among the ranks that train, 0 to trainers - 1 (its rank when
        every rank trains): its samples this step are [position + slot * B, + B). A rank
        catching up is given a trainer's slot (its step trains nothing)."""
        c = self._catch
        return c.slot if c is not None else self.rank

    def reshaped(self):
        """True when the agent announced the end of the current membership."""
        c = self.channel
        return c is not None and (c.reshape_epoch >= self.epoch or c.stop_why is not None)

    def check(self):
        """Raises Reshaped when the membership ended (for custom loops)."""
        if self.reshaped():
            raise Reshaped("membership %d ended" % self.epoch)

    def training_step(self):
        """Context manager around one step: counts it when it completes; on
        a lost peer re-forms and swallows the error (the step is dropped)."""
        return _Step(self)

    def _boundary(self):
        """At a step boundary: one small all_reduce (MAX) that every rank makes at the same
        step: whether a node's joining is pending on some rank (the grow deferral), and while
        ranks catch up whether some rank's state is not in yet. When every rank's state is
        in, the ranks catching up replay and every rank trains from the next step
        (_caught_up). True when a node's joining ends the membership here, with no step in
        flight."""
        c, cu = self.channel, self._catch
        grow_on = c is not None and c.defer_s > 0
        if not grow_on and cu is None:
            return False
        flags = [1 if grow_on and c.grow_epoch >= self.epoch else 0]
        if cu is not None:
            cu.end_gradients()
            flags.append(cu.pending())
        flag = torch.tensor(flags, dtype=torch.int32, device=self._device())
        t0 = time.monotonic()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        got = flag.tolist()
        _trace("boundary: flags %s, %s in all, in %.3f s", flags, got, time.monotonic() - t0)
        if cu is not None and not got[1]:
            self._caught_up(cu)
        if not got[0]:
            return False
        c.end_membership(self.epoch)
        return True

    def _open_window(self):
        """As a step begins: the time within which a node joining breaks it rather than wait
        for its end (docs/reform.md "PyTorch workers"). Breaking costs the ranks the share f
        of the step done, deferring costs the newcomer the rest: with W ranks and N
        newcomers, W*f against N*(1-f), so f up to N/(W+N), N one node's ranks
        (LOCAL_WORLD_SIZE); COHORT_GROW_BREAK sets f. True when a grow pending since the
        last boundary ended the membership now."""
        c, last = self.channel, self._last_step_s
        if c is None or last is None:
            return False
        f = self.grow_break
        if f < 0:
            n = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or "1"))
            f = n / float(self.world_size + n)
        return c.open_window(3600.0 * 24 if f >= 1.0 else f * last, self.epoch)

    def _arm(self, on):
        """Entering (on) or leaving a step's body: the peer watch and the step's abort."""
        self._in_body = on
        if self._watch is not None:
            self._watch.arm(on)

    def _hook_model(self):
        """Ends a step's forward or backward as soon as its membership ended, rather than at
        DDP's next collective after the rest of the computation: a forward pre-hook on every
        submodule and a hook on every parameter's gradient raise Reshaped (the step is
        dropped as it would be at that collective)."""
        def check(*_):
            if self._in_body and self.reshaped():
                raise Reshaped("membership %d ended during the step" % self.epoch)
        for m in self.module.modules():
            m.register_forward_pre_hook(check)
        for p in self.module.parameters():
            if p.requires_grad:
                p.register_hook(check)

    def _hook_optimizer(self):
        """optimizer.step, on this instance: on a rank catching up it keeps the step's
        averaged gradients and hyper-parameters instead of updating (_CatchUp.keep); on a
        donor its first update after the join first moves what its stream has not sent yet
        to new memory (_CatchUp.release_live).
        A bound method, as LR schedulers expect (they wrap it to count steps)."""
        opt, orig = self.optimizer, self.optimizer.step
        job = self

        def step(_opt, *args, **kwargs):
            c = job._catch
            if c is not None and c.catching:
                return c.keep(_opt, orig, *args, **kwargs)
            if c is not None:
                c.release_live()
                return c.update(orig, *args, **kwargs)
            return orig(*args, **kwargs)
        if getattr(orig, "_with_counter", False):
            step._with_counter = True  # a scheduler's counter inside: not wrapped again
        opt.step = types.MethodType(step, opt)

    def _recover(self, exc):
        """A step's collective failed: True once re-formed (the step is dropped), False
        when it is an ordinary failure, the script's own."""
        if self.channel is None or not isinstance(exc, (RuntimeError, Reshaped)):
            return False
        if not self.reshaped():
            if not (isinstance(exc, (Reshaped, StreamFailed)) or _is_comm_error(exc)):
                return False  # the script's own error
            # Tell the agent now: a node killed whole closes its connections at once, but its
            # heartbeat stops only after the timeout.
            why = "".join(c if " " <= c <= "~" else "?" for c in (str(exc) + "\n").split("\n")[0])
            self.channel.send("broken", epoch=self.epoch, why=why[:200] or "a collective failed")
            if not self.channel.wait_reshape(self.epoch, self.wait):
                return False  # no loss announced: an ordinary failure
            # A node's joining, deferred here while a peer that agreed on it already left
            # (its flag all_reduce done first): it ends the membership now.
            self.channel.end_membership(self.epoch)
        self.reform()
        return True

    # ---- the breaker: runs on the channel's thread ----

    def _break(self, epoch):
        """Makes the collective in flight (and every later one) fail now."""
        if epoch is not None and epoch < self.epoch:
            return  # a membership already left
        with self._lock:
            if self.backend == "nccl":
                _abort_nccl(self._pg)
                _abort_nccl(self._stream_pg)
                return
            for fd, name in self._socks.items():
                _shut_reading(fd, name)

    # ---- leaving one membership, joining the next ----

    def close(self):
        """Leaves the job's process groups for good; called at exit (atexit), harmless twice or
        after the script destroyed the group itself. Their threads must end before the
        interpreter finalises: a gloo thread of torch 1.13 that frees a collective's tensors
        once it completed takes the GIL, and a thread that takes it while the interpreter
        finalises is ended by pthread_exit, which C++ turns into std::terminate: the worker
        died of SIGABRT after its last line, which the agent took for a loss. A step or a
        catch-up left in flight is broken first, so that nothing waits for peers."""
        if self._closed:
            return
        self._closed = True
        clean = not self._in_body and self._catch is None and not self.reshaped()
        self._release(brk=not clean)

    def _release(self, brk=True):
        """Everything of the current membership: DDP, process group, store; brk: its
        collectives in flight fail first."""
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        catch, self._catch = self._catch, None
        if catch is not None:
            catch.abandon()
        if brk:
            self._break(self.epoch)
        if catch is not None:
            catch.join(1.0)  # its waits fail once broken; a send a dead peer left waits on
        with self._lock:
            self._socks, self._pg, self._stream_pg = {}, None, None
        self.ddp = None
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None
        gc.collect()  # the old group's threads, sockets and store server

    def reform(self):
        """Leaves the ended membership and joins the next (blocks until formed)."""
        if self.channel is None:
            raise Stopped("no control channel (COHORT_CONTROL_FD): cannot re-form")
        self.channel.break_until = 0.0  # the step the window was for is over
        for _ in range(100):  # every round a new membership; the agent bounds them
            ended = max(self.epoch, self.channel.reshape_epoch)
            self._release()
            self.channel.send("ready", epoch=ended, step=self.step if self.has_state else -1)
            form = self.channel.wait_form(after=ended)
            if self._try_join(form):
                return
        raise Stopped("100 re-forms in a row failed")

    def _try_join(self, form, announce=True):
        """Joins form's membership: True; False when a reshape ended it while it formed."""
        try:
            self._join(form, announce)
            return True
        except (RuntimeError, ValueError) as e:
            if self.channel.stop_why is not None:
                raise Stopped(self.channel.stop_why) from e
            if not self.channel.wait_reshape(self.epoch, self.wait):
                raise
            return False

    def _first_form(self, first=None):
        """The first membership: first (the variables it was started with), else the
        first `form` (started ahead, COHORT_AWAIT_FORM=1: a late node's worker, whose
        interpreter and imports ran while the others trained). When that membership
        ends before it formed (a replacement that arrives after a further loss), it
        answers `ready` and joins the next `form`, as a re-form does."""
        after = -1
        for _ in range(100):
            form = first if first is not None else self.channel.wait_form(after=after)
            # A worker of the job's first start says nothing when it joins; a newcomer
            # and anyone given a `form` answer `formed`.
            if self._try_join(form, announce=first is None or not self.has_state):
                return
            first = None
            after = max(self.epoch, self.channel.reshape_epoch)
            self._release()
            self.channel.send("ready", epoch=after, step=self.step if self.has_state else -1)
        raise Stopped("100 memberships in a row ended before this worker joined one")

    def _set_env(self, f):
        """The variables of the new round, as the agent would set them."""
        names = {"rank": "RANK", "size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                 "local_size": "LOCAL_WORLD_SIZE", "node_rank": "GROUP_RANK",
                 "nnodes": "GROUP_WORLD_SIZE", "master_addr": "MASTER_ADDR",
                 "master_port": "MASTER_PORT", "epoch": "COHORT_ROUND",
                 "store": "COHORT_STORE"}
        for key, var in names.items():
            if key in f:
                os.environ[var] = str(f[key])
        os.environ.pop("COHORT_NEWCOMER", None)
        os.environ.pop("COHORT_AWAIT_FORM", None)

    def _join(self, f, announce=True):
        rank, size, epoch = int(f["rank"]), int(f["size"]), int(f["epoch"])
        self.epoch = epoch
        if self.channel is not None:
            self._set_env(f)
        if rank != 0:
            self._await_store(f["master_addr"], int(f["master_port"]))
        self._store = dist.TCPStore(f["master_addr"], int(f["master_port"]), size,
                                    rank == 0, timeout=self.join_timeout)
        before = _sockets()
        dist.init_process_group(self.backend, rank=rank, world_size=size, timeout=self.timeout,
                                store=dist.PrefixStore("cohort-reform/%d/" % epoch, self._store))
        with self._lock:
            self._pg = dist.group.WORLD
            self._socks = {fd: n for fd, n in _sockets().items() if before.get(fd) != n}
        if self.reshaped():  # announced while we bootstrapped
            raise RuntimeError("membership %d ended while it formed" % epoch)
        top, donors, behind, catch = self._agree()
        if self.channel is not None and announce:
            self.channel.send("formed", epoch=epoch, step=top)
        train_socks = dict(self._socks)
        if catch:
            sent, received = self._begin_catch_up(top, donors, behind), 0
        else:
            sent, received = self._transfer(donors, behind)
        if catch:
            self.ddp = self._catch.make_ddp()
        else:
            self.ddp = _ddp(self.module, self.ddp_args, in_sync=top > 0)
        if self.channel is not None and self.backend == "gloo":
            self._watch = _PeerWatch(self, train_socks, int(f["master_port"]))
        self.reforms.append(dict(epoch=epoch, world_size=size, donor=donors[0], donors=donors,
                                 behind=behind, sent=sent, received=received,
                                 catching_up=behind if catch else []))

    def _await_store(self, addr, port):
        """Until rank 0's TCPStore listens: torch's client, refused, retries only after
        a second (1.13), which a re-form would pay whenever rank 0 is slower to get
        there. Ends early when the membership ends; the TCPStore's own timeout and
        errors apply after."""
        end = time.monotonic() + self.join_timeout.total_seconds()
        delay = 0.002
        while time.monotonic() < end:
            try:
                socket.create_connection((addr, port), timeout=1.0).close()
                return
            except OSError:
                pass
            if self.reshaped():
                raise RuntimeError("membership %d ended while it formed" % self.epoch)
            time.sleep(delay)
            delay = min(2 * delay, 0.05)

    def _device(self):
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _agree(self):
        """(highest completed step, the ranks that send it, the ranks behind it, whether those
        catch up in the background). The senders: the ranks at that step whose layout
        (_layout) is the lowest one's, so each receiver's shares (_shares of the lowest's
        outline) are what they send. The ranks at the top step trained together: their
        layouts are alike, barring a state_dict whose order or tied tensors differ between
        processes (such a rank sends nothing). The ranks behind catch up when every one of
        them is new (no state: a survivor a step behind takes the blocking hand-over) and
        every rank allows it (COHORT_REFORM_CATCHUP not 0, under the agent, _catchable)."""
        ok = int(self.catch_up and self.channel is not None and self._catchable())
        mine = torch.tensor([self.step, _layout(self.state_dict()), ok] if self.has_state
                            else [-1, 0, ok], dtype=torch.int64, device=self._device())
        got = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(got, mine)
        got = [tuple(int(v) for v in g.tolist()) for g in got]
        steps = [g[0] for g in got]
        top = max(steps)
        if top < 0:
            raise NoState("no rank of membership %d holds training state: "
                          "load a checkpoint" % self.epoch)
        lowest = got[steps.index(top)][:2]
        behind = [r for r, s in enumerate(steps) if s < top]
        catch = (bool(behind) and all(g[2] for g in got) and all(steps[r] < 0 for r in behind)
                 and not self._buffers_from(behind))
        return top, [r for r, g in enumerate(got) if g[:2] == lowest], behind, catch

    def _catchable(self):
        """Whether this rank's state lets ranks behind catch up: the optimizer's
        hyper-parameters and the extra objects' state hold no tensor, so that a
        rank catching up takes them from the outline at the join (_take_outline)."""
        tensors = []
        _outline({"groups": self.optimizer.state_dict()["param_groups"],
                  "extra": {k: v.state_dict() for k, v in self.extra.items()}}, tensors)
        return not tensors

    def _buffers_from(self, behind):
        """True when DDP would broadcast the module's buffers from a rank 0 catching up
        (broadcast_buffers, its default, before every forward): its buffers are not the
        model's, so such a membership takes the blocking hand-over."""
        return (0 in behind and self.ddp_args.get("broadcast_buffers", True)
                and any(True for _ in self.module.buffers()))

    def state_dict(self):
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "step": self.step, "position": self.position,
                "extra": {k: v.state_dict() for k, v in self.extra.items()}}

    def load_state_dict(self, state):
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._load_rest(state)

    def _load_rest(self, state):
        """state's extra objects, step and data position."""
        for k, v in self.extra.items():
            v.load_state_dict(state["extra"][k])
        self.step, self.position = state["step"], state["position"]
        self.has_state = True

    def _transfer(self, donors, behind):
        """Every donor (the ranks at the top step, _agree) sends its share of the state to
        every rank behind it, the donors at once; (sent, received) bytes on this rank.

        The tensors go as they are, each straight from a donor's own tensor into one the
        receiver allocates, with a small pickled outline of the rest (step, position,
        hyper-parameters, where each tensor belongs) from the lowest donor ahead of them:
        no serialized copy of the state on either side. The donors hold the same state bit
        for bit (they trained together), so which one sends a tensor does not matter:
        _shares divides them by bytes, so each donor's link carries about 1/n of it."""
        if self.rank in donors and behind:
            return self._send(donors, behind), 0
        if self.rank in behind:
            return 0, self._receive(donors)
        return 0, 0

    def _send(self, donors, behind):
        """This donor's part: the outline (the lowest donor only) and its share, to every
        rank behind; the bytes sent."""
        dev, me, tensors = self._device(), donors.index(self.rank), []
        outline = _outline(self.state_dict(), tensors)
        owner = _shares([_nbytes(t) for t in tensors], len(donors))
        data = [t.to(dev).contiguous() for t, o in zip(tensors, owner) if o == me and t.numel()]
        head = []
        if me == 0:
            blob = _as_bytes(pickle.dumps(outline, protocol=pickle.HIGHEST_PROTOCOL), dev)
            head = [torch.tensor([blob.numel()], dtype=torch.int64, device=dev), blob]
        works = []
        for r in behind:
            works += [dist.isend(t, r) for t in head]
            works += [dist.isend(_bytes_of(t), r) for t in data]
        for w in works:
            w.wait()
        return sum(_nbytes(t) for t in head[1:] + data) * len(behind)

    def _receive(self, donors):
        """The outline from the lowest donor, then every tensor from the donor whose share it
        is, all received at once; loads the state; the bytes received."""
        dev = self._device()
        outline, head = self._receive_outline(donors[0])
        got = [torch.empty(s.shape, dtype=s.dtype, device=dev) for s in _slots(outline)]
        owner = _shares([_nbytes(t) for t in got], len(donors))
        works = [dist.irecv(_bytes_of(t), donors[o]) for t, o in zip(got, owner) if t.numel()]
        for w in works:
            w.wait()
        state = _fill(outline, [t.cpu() for t in got])
        self.module.load_state_dict(state["model"])
        _load_optimizer(self.optimizer, state["optimizer"])
        self._load_rest(state)
        return head + sum(_nbytes(t) for t in got)

    def _receive_outline(self, src):
        """The outline (the state with each tensor replaced by its slot) from rank src, and
        its bytes."""
        dev = self._device()
        size = torch.zeros(1, dtype=torch.int64, device=dev)
        dist.recv(size, src)
        head = torch.empty(int(size.item()), dtype=torch.uint8, device=dev)
        dist.recv(head, src)
        # A peer of this job sent it, as torch.load(weights_only=False) would trust it.
        return pickle.loads(head.cpu().numpy().tobytes()), head.numel()

    # ---- catching up in the background (_CatchUp) ----

    def _begin_catch_up(self, top, donors, behind):
        """The join of a membership whose ranks behind catch up: the lowest donor sends each
        of them the outline, from which they take the step, the data position, the
        optimizer's hyper-parameters and the extra objects' state (_take_outline); every rank
        joins the stream's own process group (its sockets broken with the others' on a
        reshape, not watched: _PeerWatch); the donors' threads copy their shares and stream
        them while they train. The bytes this rank sends."""
        me, dev, tensors, outline, head = self.rank, self._device(), [], None, 0
        if me in donors:
            outline = _outline(self.state_dict(), tensors)
        if me == donors[0]:  # a few kB: sent before the stream, the ranks behind wait for it
            blob = _as_bytes(pickle.dumps(outline, protocol=pickle.HIGHEST_PROTOCOL), dev)
            size = torch.tensor([blob.numel()], dtype=torch.int64, device=dev)
            for r in behind:
                dist.send(size, r)
                dist.send(blob, r)
            head = blob.numel()
        if me in behind:
            outline, head = self._receive_outline(donors[0])
            self._take_outline(outline)
        before = _sockets()
        pg = dist.new_group(backend=self.backend, timeout=self.timeout)
        idle = self.backend == "gloo" and not _sparse_gradients(self.module)
        trainers = [r for r in range(self.world_size) if r not in behind]
        train_pg = (dist.new_group(ranks=trainers, backend=self.backend, timeout=self.timeout)
                    if idle else None)
        with self._lock:
            self._stream_pg = pg
            self._socks.update({fd: n for fd, n in _sockets().items() if before.get(fd) != n})
        self._catch = _CatchUp(self, pg, top, donors, behind, outline, tensors, head, train_pg)
        self._catch.start()
        return self._catch.sent

    def _take_outline(self, outline):
        """A rank catching up takes from the outline what its steps need before the state is
        in, so that they follow the trainers': the step, the data position, the optimizer's
        hyper-parameters and the extra objects' state (an LR scheduler's)."""
        for g, h in zip(self.optimizer.param_groups, outline["optimizer"]["param_groups"]):
            g.update({k: v for k, v in h.items() if k != "params"})
        for k, v in self.extra.items():
            v.load_state_dict(outline["extra"][k])
        self.step, self.position = outline["step"], outline["position"]

    def _caught_up(self, cu):
        """Every rank's state is in (the boundary's flags, the same step on every rank): the
        ranks catching up load it and replay the kept steps (_CatchUp.finish), and from the
        next step every rank trains, under a DDP without the comm hook (made again: a hook
        cannot be taken off). Rank 0 says so in one line."""
        replayed = cu.finish() if cu.catching else self.step - cu.top
        cu.join(self.timeout.total_seconds())  # a donor's: its ranks behind have it all
        self._catch = None
        self.ddp = None
        gc.collect()  # the hooked DDP's buckets
        self.ddp = _ddp(self.module, self.ddp_args, in_sync=True)
        r = self.reforms[-1]
        r.update(caught=self.step + 1, replayed=replayed, received=r["received"] + cu.received)
        if self.rank != 0:
            return
        took = cu.seconds if cu.seconds is not None else time.monotonic() - cu.t0
        print("cohort_reform: rank(s) %s caught up: received %d bytes of state in the background "
              "from %d rank(s) (the snapshot of step %d, streamed in %.3f s), replayed %d step(s), "
              "contribute from step %d" % (",".join(str(b) for b in cu.behind), cu.state_bytes(),
                                           len(cu.donors), cu.top, took, replayed, self.step + 1),
              file=sys.stderr, flush=True)


class _CatchUp:
    """One membership's catch-up in the background (docs/reform.md "PyTorch workers", "A node
    joining"). The donors stream the ranks behind (newcomers) their shares of the state of
    the agreed step (top) over a process group of its own, from the tensors' own memory (what
    is not sent by the donor's next update moves to new memory there: release_live). Each
    step's averaged gradients and hyper-parameters reach a rank catching up, which keeps
    them and, once every rank's state is in (Job._boundary), loads the state and replays
    them (finish). How they reach it: with gloo (idle), the trainers exchange gradients in a
    group of their own (train_pg) while a rank catching up runs its forward without autograd
    (_Idle) and takes the gradients in its optimizer.step(), each trainer sending a share of
    them (update, keep, end_gradients); otherwise (NCCL, sparse gradients) it computes its step and takes part in
    the exchange with -0.0 (_catch_up_hook), and keeps what the exchange gave (keep)."""

    def __init__(self, job, pg, top, donors, behind, outline, tensors, head, train_pg=None):
        self.job, self.pg, self.top, self.donors, self.behind = job, pg, top, donors, behind
        self.rank, self.dev = job.rank, job._device()
        trainers = [r for r in range(job.world_size) if r not in behind]
        self.trainers, self.catching = len(trainers), self.rank in behind
        self.train_pg, self.idle = train_pg, train_pg is not None
        self.grad_src = trainers[0]  # idle: the trainer that begins and ends each step's message
        self.grad_from = None        # idle: the trainer that sends each parameter's gradient
        self.outgoing = []           # idle, on a trainer: the step's gradient sends in flight
        self.ended = False           # idle, catching: this step's messages ended
        self.slot = (behind.index(self.rank) % len(trainers) if self.catching
                     else trainers.index(self.rank))
        self.outline = outline if self.catching else None
        self.head = head
        self.nbytes = head + sum(_nbytes(t) for t in tensors) if tensors else None
        self.kept = []        # per step while catching up: (hyper-parameters, gradients)
        self.got = None       # the tensors received, in the outline's order
        self.error = None     # what ended the stream, when it failed
        self.live = []        # per tensor of this donor's share: its holders (_live_share)
        self.progress = 0     # the share's first tensors whose sends ended
        self.done = threading.Event()    # the stream ended here
        self.t0, self.seconds = time.monotonic(), None
        self.sent = self.received = 0
        self.share, target = [], None
        if self.rank in donors:
            me = donors.index(self.rank)
            owner = _shares([_nbytes(t) for t in tensors], len(donors))
            owned = [t for t, o in zip(tensors, owner) if o == me and t.numel()]
            self.sent = (sum(_nbytes(t) for t in owned) + head) * len(behind)
            self.share = self._live_share(owned)
            target = self._send
        elif self.catching:
            target = self._receive
        if self.idle:
            owner = _shares([_nbytes(p) for p in _parameters(job.optimizer)], len(trainers))
            self.grad_from = [trainers[o] for o in owner]
        self.thread = None
        if target is None:
            self.done.set()
        else:
            self.thread = threading.Thread(target=target, name="cohort-reform-stream",
                                           daemon=True)

    def start(self):
        if self.thread is not None:
            self.thread.start()

    def join(self, timeout):
        if self.thread is not None and self.thread.ident is not None:
            self.thread.join(timeout)

    def _live_share(self, owned):
        """This donor's share, self.live beside it: the parameters and the optimizer's state
        change only in the optimizer's update, so the stream sends them from their own memory
        and the next update first moves those not sent by then (release_live); the rest
        (buffers, which a forward may write, and memory that holders share otherwise than as
        the same tensor) is copied now."""
        opt, holders = self.job.optimizer, {}
        for p in self.job.module.parameters():
            holders.setdefault(_storage_of(p), []).append((p, None, p))
        for st in opt.state.values():
            for k, v in st.items():
                if torch.is_tensor(v):
                    holders.setdefault(_storage_of(v), []).append((st, k, v))
        share, self.live = [], []
        for t in owned:
            hs = holders.get(_storage_of(t))
            same = hs and all(h[2].data_ptr() == t.data_ptr() and h[2].shape == t.shape
                              and h[2].stride() == t.stride() for h in hs)
            share.append(t if same else _copy(t, self.dev))
            self.live.append(hs if same else None)
        return share

    def release_live(self):
        """At this donor's first update after the join (Job._hook_optimizer): each tensor of
        its share whose sends have not ended gets new memory, a copy, in every holder
        (parameter or optimizer state), which the update then writes; the stream goes on
        from the old memory, the state of the agreed step. Without a wait on the stream."""
        live, self.live = self.live, []
        if not live:
            return
        moved = 0
        for hs in live[self.progress:]:
            if hs:
                moved += 1
                new = hs[0][2].detach().clone()
                for holder, key, _ in hs:
                    if key is None:
                        holder.data = new
                    else:
                        holder[key] = new
        _trace("stream: %d of %d tensors not sent yet at the update, moved", moved, len(live))

    def _send(self):
        """The donor's thread: streams its share to every rank behind, all at once, in the
        outline's order; self.progress counts the tensors whose sends ended (release_live)."""
        share, self.share = self.share, None
        try:
            works = [[dist.isend(_bytes_of(t), r, group=self.pg) for r in self.behind]
                     for t in share]
            first = None
            for i, ws in enumerate(works):
                try:
                    _wait_all(ws)
                except RuntimeError as e:
                    first = first or e
                if first is None and self.dev.type != "cuda":  # a GPU's: at the end, synced
                    self.progress = i + 1
            if first is not None:
                raise first
            _sync(self.dev)
            self.progress = len(share)
            self.seconds = time.monotonic() - self.t0
            _trace("stream: sent in %.3f s", self.seconds)
        except Exception as e:  # the membership ends: the ranks behind take the next one's
            self.error = e
        finally:
            self.done.set()

    def _receive(self):
        """The thread of a rank catching up: every tensor from the donor whose share it is,
        all at once."""
        try:
            got = [torch.empty(s.shape, dtype=s.dtype, device=self.dev)
                   for s in _slots(self.outline)]
            owner = _shares([_nbytes(t) for t in got], len(self.donors))
            _wait_all([dist.irecv(_bytes_of(t), self.donors[o], group=self.pg)
                       for t, o in zip(got, owner) if t.numel()])
            _sync(self.dev)
            self.got = got
            self.received = self.head + sum(_nbytes(t) for t in got)
            self.seconds = time.monotonic() - self.t0
            _trace("stream: received in %.3f s", self.seconds)
        except Exception as e:
            self.error = e
        finally:
            self.done.set()

    def make_ddp(self):
        """The membership's DDP while ranks catch up. Idle: the trainers' over their own group
        (its own 1/world is 1/trainers), a rank catching up an _Idle; else every rank's, with
        _catch_up_hook. Every rank's parameters are the same or replaced (those behind), so
        DDP does not broadcast them."""
        job = self.job
        if not self.idle:
            ddp = _ddp(job.module, job.ddp_args, in_sync=True)
            ddp.register_comm_hook(self, _catch_up_hook)
            return ddp
        if self.catching:
            return _Idle(job.module)
        return _ddp(job.module, dict(job.ddp_args, process_group=self.train_pg), in_sync=True)

    def update(self, orig, *args, **kwargs):
        """optimizer.step() on a trainer (Job._hook_optimizer). Idle: this trainer's part of
        the step's message to every rank catching up (_send_gradients) starts on its way as
        the update applies the gradients (before the update, which does not write them; with
        a closure, which computes them, after), and the update waits for those sends to end
        (the script may zero the gradients in place right after it)."""
        if not self.idle:
            return orig(*args, **kwargs)
        closure = args[0] if args else kwargs.get("closure")
        if closure is None:
            self._send_gradients()
        loss = orig(*args, **kwargs)
        if closure is not None:
            self._send_gradients()
        works, self.outgoing = self.outgoing, []
        try:
            _wait_all(works)
        except RuntimeError as e:  # a peer lost: the update is done, the boundary fails too
            _trace("gradients: a send failed: %s", str(e).split("\n")[0])
        return loss

    def _send_gradients(self):
        """Idle, on a trainer: its part of one step's message to every rank catching up: [1,
        n], n bytes of pickled (the hyper-parameters from grad_src, else None; which of the
        parameters whose gradient it sends (grad_from) have one), then those gradients in the
        param groups' order, straight from their own memory. The trainers hold the same
        averaged gradients, so each sends the share _shares gives it: no trainer's link
        carries them all."""
        opt = self.job.optimizer
        hp = _hyper_parameters(opt) if self.rank == self.grad_src else None
        mine = [p.grad for p, r in zip(_parameters(opt), self.grad_from) if r == self.rank]
        if not mine and self.rank != self.grad_src:
            return  # a share of nothing (fewer parameters than trainers): no part to send
        blob = _as_bytes(pickle.dumps((hp, [g is not None for g in mine]),
                                      protocol=pickle.HIGHEST_PROTOCOL), self.dev)
        head = torch.tensor([1, blob.numel()], dtype=torch.int64, device=self.dev)
        data = [_bytes_of(g.detach().contiguous()) for g in mine if g is not None]
        for r in self.behind:
            self.outgoing += [dist.isend(t, r) for t in [head, blob] + data]
        _trace("gradients: %d tensors on their way to %d rank(s)", len(data), len(self.behind))

    def end_gradients(self):
        """Idle, at a step boundary (Job._boundary; a failure here counts the step, as the
        boundary's all_reduce does): grad_src ends the step's messages with [0, 0] to every
        rank catching up; such a rank takes the messages its optimizer.step() did not take
        (a script that stepped twice or not at all), up to that end."""
        if not self.idle:
            return
        if self.rank == self.grad_src:
            end = torch.zeros(2, dtype=torch.int64, device=self.dev)
            _wait_all([dist.isend(end, r) for r in self.behind])
        elif self.catching:
            while not self.ended:
                self._take_gradients()
            self.ended = False

    def _take_gradients(self):
        """Idle, on a rank catching up: the next message of the trainers (update): a step's
        hyper-parameters and gradients, each from the trainer that sends it, kept (finish
        replays them), or grad_src's end of the step's messages (self.ended)."""
        hp, has = self._take_head(self.grad_src)
        if self.ended:
            return
        for r in sorted(set(self.grad_from) - {self.grad_src}):
            has.update(self._take_head(r)[1])
        opt = self.job.optimizer
        got = [torch.empty(p.shape, dtype=p.dtype, device=self.dev) if has.get(i) else None
               for i, p in enumerate(_parameters(opt))]
        _wait_all([dist.irecv(_bytes_of(t), r) for t, r in zip(got, self.grad_from)
                   if t is not None])
        it = iter(got)
        self.kept.append((hp, [[next(it) for _ in g["params"]] for g in opt.param_groups]))
        _trace("gradients: step %d's received", len(self.kept))

    def _take_head(self, src):
        """The head of trainer src's part of a step's message: (its hyper-parameters or None,
        {index of a parameter whose gradient src sends: whether it has one}); at grad_src's
        end of the step's messages, self.ended and (None, {})."""
        head = torch.zeros(2, dtype=torch.int64, device=self.dev)
        dist.recv(head, src)
        if int(head[0]) == 0:
            if src != self.grad_src:
                raise RuntimeError("rank %d ended a step's gradients out of turn" % src)
            self.ended = True
            return None, {}
        blob = torch.empty(int(head[1]), dtype=torch.uint8, device=self.dev)
        dist.recv(blob, src)
        hp, flags = pickle.loads(blob.cpu().numpy().tobytes())  # a peer of this job sent it
        sent = [i for i, r in enumerate(self.grad_from) if r == src]
        if len(flags) != len(sent):
            raise RuntimeError("rank %d sent gradients for %d parameters, not %d"
                               % (src, len(flags), len(sent)))
        return hp, dict(zip(sent, flags))

    def pending(self):
        """This rank's flag at a step boundary: 1 while its state is not in. StreamFailed
        when its stream failed (a reshape that broke it is seen by the boundary's
        all_reduce as well)."""
        if not self.catching or not self.done.is_set():
            return int(self.catching)
        if self.error is not None:
            raise StreamFailed("rank %d: the state stream failed: %s"
                               % (self.rank, str(self.error).split("\n")[0]))
        return 0

    def keep(self, opt, orig, *args, **kwargs):
        """optimizer.step() on a rank catching up: keeps the gradients the step would apply
        (the trainers' average, after any clipping) and the hyper-parameters, and leaves the
        parameters alone. Idle, those are the trainers', received here (their updates send
        them); else this rank's own, from the exchange. A closure, if given, runs once as the
        optimizers' own step runs it."""
        closure = args[0] if args else kwargs.get("closure")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.idle:  # the trainers' own, from them; a failure ends the step here
            if not self.ended:
                self._take_gradients()
        else:
            hp = [{k: v.clone() if torch.is_tensor(v) else v for k, v in g.items()
                   if k != "params"} for g in opt.param_groups]
            grads = [[None if p.grad is None else p.grad.detach().clone() for p in g["params"]]
                     for g in opt.param_groups]
            self.kept.append((hp, grads))
        if getattr(orig, "_with_counter", False):
            opt._step_count += 1  # as the LR scheduler's counter in orig would have
        return loss

    def finish(self):
        """Loads the state received and replays the kept steps through the optimizer's own
        step, each with its gradients and hyper-parameters: this rank then holds the
        trainers' parameters and optimizer state, bit for bit. The step, the data position,
        the hyper-parameters and the extra objects stay the live ones (they followed the
        trainers' since the join). The steps replayed."""
        job, opt = self.job, self.job.optimizer
        live = _hyper_parameters(opt)
        step, position = job.step, job.position
        state = _fill(self.outline, self.got)
        job.module.load_state_dict(state["model"])
        _load_optimizer(opt, state["optimizer"])
        for hp, grads in self.kept:
            for g, h, gs in zip(opt.param_groups, hp, grads):
                g.update(h)
                for p, grad in zip(g["params"], gs):
                    p.grad = grad
            type(opt).step(opt)  # the optimizer's own, not Job._hook_optimizer's
        for g, h in zip(opt.param_groups, live):
            g.update(h)
        replayed, self.kept, self.got, self.outline = len(self.kept), [], None, None
        job.step, job.position, job.has_state = step, position, True
        return replayed

    def state_bytes(self):
        """The state's bytes as a rank behind receives them (on a trainer that is no donor:
        its own state's tensors)."""
        if self.catching:
            return self.received
        if self.nbytes is None:
            tensors = []
            _outline(self.job.state_dict(), tensors)
            self.nbytes = sum(_nbytes(t) for t in tensors)
        return self.nbytes

    def abandon(self):
        """The membership ends before every rank's state is in: the ranks behind take the
        state in the next one (as newcomers: ready step=-1). One line on each, and on rank
        0."""
        if self.catching:
            print("cohort_reform: rank %d: membership %d ended while it caught up (the state of "
                  "step %d %s, %d step(s) kept): it takes the state in the next membership"
                  % (self.rank, self.job.epoch, self.top,
                     "in" if self.got is not None else "not in yet", len(self.kept)),
                  file=sys.stderr, flush=True)
        elif self.rank == 0:
            print("cohort_reform: membership %d ended while rank(s) %s caught up: they take the "
                  "state in the next membership" % (self.job.epoch,
                                                    ",".join(str(b) for b in self.behind)),
                  file=sys.stderr, flush=True)
        self.kept, self.got = [], None


class _Idle:
    """job.ddp on a rank catching up in an idle membership (_CatchUp): its steps train nothing,
    so its forward runs without autograd and gives its floating-point outputs as leaves that
    require a gradient, on which the script's loss and backward run as usual and end there
    (no parameter gets a gradient, no exchange takes place). Other attributes are the
    module's; no_sync() does nothing."""

    def __init__(self, module):
        self.module = module

    def __call__(self, *args, **kwargs):
        with torch.no_grad():
            return _as_leaves(self.module(*args, **kwargs))

    def no_sync(self):
        return contextlib.nullcontext()

    def __getattr__(self, name):
        return getattr(self.module, name)


def _as_leaves(x):
    """x (a forward's output) with each floating-point tensor made a leaf that requires a
    gradient, in the same containers (dicts, lists, tuples, named tuples)."""
    if torch.is_tensor(x):
        return x.detach().requires_grad_() if x.is_floating_point() else x
    if isinstance(x, dict):  # a copy, item by item: a dict class may not take pairs
        out = copy.copy(x)
        for k, v in x.items():
            out[k] = _as_leaves(v)
        return out
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_as_leaves(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_as_leaves(v) for v in x)
    return x


def _sparse_gradients(module):
    """Whether a submodule makes sparse gradients (an embedding with sparse=True): the idle
    catch-up hands dense ones only."""
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return any(isinstance(m, kinds) and m.sparse for m in module.modules())


def _catch_up_hook(state, bucket):
    """DDP's comm hook while ranks catch up (state: the _CatchUp). A rank that trains adds its
    gradients times 1/trainers (as DDP's own reducer scales by 1/world), a rank catching up
    adds -0.0 (x + -0.0 == x for every float, -0.0 and +0.0 included): every rank receives
    the trainers' average, the same bits on each."""
    buf = bucket.buffer()
    if state.catching:
        buf.fill_(-0.0)
    else:
        buf.mul_(1.0 / state.trainers)
    fut = dist.all_reduce(buf, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _wait_all(works):
    """Waits for every one of works, the failed ones too (an operation still pending is not
    let go of while its transfer may run: it ends, done or failed, once the membership's
    sockets are broken); raises the first failure."""
    first = None
    for w in works:
        try:
            w.wait()
        except RuntimeError as e:
            first = first or e
    if first is not None:
        raise first


def _load_optimizer(opt, state):
    """opt.load_state_dict(state), state's tensors received for it: without the deep copy of
    them that load_state_dict takes first (torch 1.13: the optimizer state's memory once more,
    and the time to fill it), which returns each of them as it is."""
    tensors = []
    _map(state, lambda x: tensors.append(x) if torch.is_tensor(x) else x)
    for t in tensors:
        t.__deepcopy__ = (lambda t: lambda memo: t)(t)  # an instance's, found before Tensor's
    try:
        opt.load_state_dict(state)
    finally:
        for t in tensors:
            del t.__deepcopy__


def _storage_of(t):
    """(device, address) of the memory t is a view of."""
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return str(t.device), st.data_ptr()


def _copy(t, dev):
    """A contiguous copy of t on dev."""
    return torch.empty(t.shape, dtype=t.dtype, device=dev).copy_(t.detach())


def _sync(dev):
    """Waits for the device's work queued so far (a GPU's copies and transfers)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _ddp(module, ddp_args, in_sync):
    """DistributedDataParallel around module. in_sync: every rank holds the same parameters
    bit for bit already (a re-form after a completed step: the ranks trained together, and
    those behind received the state), so DDP's own broadcast of them from rank 0 at
    construction, the whole model once more over the group's links, is left out (a DDP that
    takes init_sync: init_sync=False; 1.13: its module's _sync_module_states skipped for this
    call). Every rank
    decides alike (the agreed step)."""
    if not in_sync or "init_sync" in ddp_args:
        return DistributedDataParallel(module, **ddp_args)
    if "init_sync" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return DistributedDataParallel(module, init_sync=False, **ddp_args)
    import torch.nn.parallel.distributed as ddp_module
    sync = getattr(ddp_module, "_sync_module_states", None)
    if sync is None:
        return DistributedDataParallel(module, **ddp_args)
    ddp_module._sync_module_states = lambda *args, **kwargs: None
    try:
        return DistributedDataParallel(module, **ddp_args)
    finally:
        ddp_module._sync_module_states = sync


class _Slot:
    """Where a tensor of the state goes, in the outline the donor sends."""
    __slots__ = ("index", "shape", "dtype")

    def __init__(self, index, shape, dtype):
        self.index, self.shape, self.dtype = index, shape, dtype

    def __getstate__(self):
        return (self.index, self.shape, self.dtype)

    def __setstate__(self, st):
        self.index, self.shape, self.dtype = st


def _map(obj, leaf):
    """obj rebuilt with leaf(x) for each x that is not a dict, list or tuple (the state
    dicts' containers; a module's state_dict keeps its _metadata, which
    load_state_dict reads)."""
    if isinstance(obj, dict):
        out = type(obj)((k, _map(v, leaf)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_map(v, leaf) for v in obj)
    return leaf(obj)


def _outline(obj, tensors):
    """obj with every tensor replaced by a _Slot, the tensors appended to tensors in order
    (a tensor that two entries share, such as tied weights, once)."""
    seen = {}

    def slot_of(x):
        if not torch.is_tensor(x):
            return x
        t = x.detach()
        key = (str(t.device), t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        if t.numel() and key in seen:
            return seen[key]
        slot = _Slot(len(tensors), tuple(t.shape), t.dtype)
        tensors.append(t)
        if t.numel():
            seen[key] = slot
        return slot
    return _map(obj, slot_of)


def _slots(outline):
    """The outline's slots, one per tensor sent, in the order they were sent."""
    found = {}
    _map(outline, lambda x: found.setdefault(x.index, x) if isinstance(x, _Slot) else x)
    return [found[i] for i in range(len(found))]


def _fill(outline, tensors):
    """The outline with each slot replaced by its tensor."""
    return _map(outline, lambda x: tensors[x.index] if isinstance(x, _Slot) else x)


def _layout(state):
    """A digest of where state's tensors go, in _outline's order (each place's slot, shape
    and dtype; the rest left out), below 2**56: ranks whose digests are equal send
    the same tensor list."""
    places = _map(_outline(state, []),
                  lambda x: (x.index, x.shape, str(x.dtype)) if isinstance(x, _Slot) else None)
    return int.from_bytes(hashlib.sha256(repr(places).encode()).digest()[:7], "big")


def _parameters(opt):
    """The optimizer's parameters, group after group: the order every rank numbers them in."""
    return [p for g in opt.param_groups for p in g["params"]]


def _hyper_parameters(opt):
    """Each param group's settings (lr, betas, ...), without its parameters."""
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def _shares(nbytes, n):
    """Which of n donors sends each tensor (nbytes: each one's bytes, in the outline's
    order): the largest first, each to the donor with the fewest bytes so far (the lowest
    on a tie). Every rank computes it alike from the same sizes."""
    load, owner = [0] * n, [0] * len(nbytes)
    for i in sorted(range(len(nbytes)), key=lambda i: (-nbytes[i], i)):
        owner[i] = load.index(min(load))
        load[owner[i]] += nbytes[i]
    return owner


def _nbytes(t):
    return t.numel() * t.element_size()


def _bytes_of(t):
    """A contiguous tensor's memory as bytes (a view: a receive fills the tensor)."""
    return t.reshape(-1).view(torch.uint8)


def _as_bytes(b, dev):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).to(dev)


def _nccl_env():
    """NCCL settings a re-form needs, read when the process group is made, under
    the names this torch reads: TORCH_NCCL_... from 2.2 (which reads them first
    and warns where an old name is set; cohort's start-up hook has moved the
    agent's), the old ones before."""
    version = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    prefix = "TORCH_" if version >= (2, 2) else ""
    # Blocking wait: an aborted communicator raises in DDP's wait, before
    # the optimizer step, instead of passing partial gradients on.
    os.environ.setdefault(prefix + "NCCL_BLOCKING_WAIT", "1")
    # 1 (torchrun's and cohort's default) ends the process on an aborted
    # collective: the survivor would be lost. 0: the abort is ours.
    if os.environ.get(prefix + "NCCL_ASYNC_ERROR_HANDLING") == "1":
        os.environ[prefix + "NCCL_ASYNC_ERROR_HANDLING"] = "0"


def _abort_nccl(pg):
    """Aborts the NCCL communicators of pg (torch 2.x) from any thread."""
    if pg is None:
        return
    try:
        backend = pg._get_backend(torch.device("cuda"))
    except (AttributeError, RuntimeError):
        backend = pg
    for name in ("abort", "_abort"):
        fn = getattr(backend, name, None)
        if fn is not None:
            fn()
            return


def _is_comm_error(exc):
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(s in text for s in _COMM_ERRORS)


class _Step:
    def __init__(self, job):
        self.job = job

    def __enter__(self):
        job = self.job
        if job.reshaped() or job._open_window():
            job.reform()
        job._step_t0 = time.monotonic()
        if _TRACE:
            job._step_usage = _usage()
        job._arm(True)
        return job

    def __exit__(self, kind, exc, tb):
        job = self.job
        job._arm(False)
        if kind is None:
            job._last_step_s = time.monotonic() - job._step_t0
            if _TRACE:
                u = [b - a for a, b in zip(job._step_usage, _usage())]
                _trace("step %d: %.3f s, cpu user %.2f s sys %.2f s, %d page faults, catching=%d",
                       job.step + 1, job._last_step_s, u[0], u[1], u[2], int(job.catching_up))
                _flush_trace()
            # A collective that completed gave every rank's sum: the step counts.
            job.step += 1
            job.position += job.trainers * job.batch_size
            try:
                grow = job._boundary()
            except RuntimeError as e:  # a loss after the step: it still counts
                if job._recover(e):
                    return False
                raise
            if grow or job.reshaped():
                job.reform()
            return False
        if not job._recover(exc):
            return False
        job.dropped += 1
        return True
