#!/usr/bin/python3
"""examples/reform_ddp.py with test hooks, for tests/test_reform_torch.py.

Once the file named by $REFORM_TEST_FAIL exists, this worker's next step
that completes (its all_reduce gave the full sum, its optimizer stepped) is
made to fail as a lost peer's would ("Connection closed by peer"), once: the
step is not counted here while the other ranks count it. So this survivor
is behind the others at the re-form, deterministically (docs/reform.md,
"Steps": the highest completed step wins, a survivor behind it receives
the state).

While the file named by $REFORM_TEST_SLOW exists, a step's forward waits
after the model's first layer (having made SLOW.in), as a large model's
would compute; a backward of that step that runs all the same makes
SLOW.backward (the module should end the step at its next layer once the
membership ended).

While the file named by $REFORM_TEST_HOLD exists, every torch.distributed.isend
of this worker on a group of its own (the catch-up's stream; not the training
group's sends, such as each step's gradients to a rank catching up) waits
before it begins: a donor's stream of the state to a newcomer is held (in the
background) while the others train; the old blocking hand-over held the whole
step with it.

While the file named by $REFORM_TEST_COMPUTE exists, a membership whose newcomer
catches up takes the path of NCCL and of sparse gradients (the newcomer computes
its steps and takes part in the exchange) rather than gloo's, in which it
computes nothing. A backward that reaches the model's parameters while this
rank catches up prints "backward while catching up pid=P step=N".

After each completed step it prints "state step=N rank=R catching=C sha=H":
a SHA-256 of the model's state_dict and the optimizer's state (every tensor's
bytes, the hyper-parameters), the same on every rank that holds the model.
Usage: reform_torch_behind.py ARGS OF reform_ddp.py
"""
import hashlib
import os
import runpy
import sys
import time

import torch
import torch.distributed as dist

import cohort_reform

here = os.path.dirname(os.path.abspath(__file__))
trigger = os.environ.get("REFORM_TEST_FAIL", "")
original = cohort_reform._Step.__exit__


slow = os.environ.get("REFORM_TEST_SLOW", "")
slow_step = {"on": False}  # in a step whose forward waited


def slow_forward(module, inputs, output):
    if not (slow and os.path.exists(slow)):
        return
    open(slow + ".in", "w").close()
    end = time.monotonic() + 60
    while os.path.exists(slow) and time.monotonic() < end:
        time.sleep(0.01)
    slow_step["on"] = True


def slow_backward(grad):
    if slow_step["on"]:
        open(slow + ".backward", "w").close()


original_init = cohort_reform.Job.__init__


def hooked_init(self, model, *args, **kwargs):
    first = next(m for m in model.modules() if not list(m.children()))
    first.register_forward_hook(slow_forward)
    list(model.parameters())[-1].register_hook(slow_backward)

    def note_backward(grad):
        if getattr(self, "_catch", None) is not None and self.catching_up:
            print("backward while catching up pid=%d step=%d" % (os.getpid(), self.step + 1),
                  flush=True)
    list(model.parameters())[0].register_hook(note_backward)
    original_init(self, model, *args, **kwargs)


compute = os.environ.get("REFORM_TEST_COMPUTE", "")
original_sparse = cohort_reform._sparse_gradients


def forced_compute(module):
    return bool(compute and os.path.exists(compute)) or original_sparse(module)


hold = os.environ.get("REFORM_TEST_HOLD", "")
original_isend = dist.isend


def held_isend(*args, **kwargs):
    while hold and kwargs.get("group") is not None and os.path.exists(hold):
        time.sleep(0.01)
    return original_isend(*args, **kwargs)


def state_sha(job):
    """A SHA-256 of the model's and the optimizer's state, bit for bit."""
    h = hashlib.sha256()

    def add(v):
        if torch.is_tensor(v):
            h.update(str((v.dtype, tuple(v.shape))).encode())
            h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(v).encode())
    for k, v in job.module.state_dict().items():
        add(k)
        add(v)
    opt = job.optimizer.state_dict()
    for i in sorted(opt["state"]):
        for k in sorted(opt["state"][i]):
            add((i, k))
            add(opt["state"][i][k])
    add(opt["param_groups"])
    return h.hexdigest()


def failing_exit(self, kind, exc, tb):
    global trigger
    slow_step["on"] = False
    step = self.job.step
    if kind is None and trigger and os.path.exists(trigger):
        trigger = ""
        print("failing step=%d pid=%d" % (self.job.step + 1, os.getpid()), flush=True)
        exc = RuntimeError("Connection closed by peer (test: this rank's step failed)")
        return original(self, RuntimeError, exc, None) or _raise(exc)
    catching = getattr(self.job, "catching_up", False)
    out = original(self, kind, exc, tb)
    if kind is None and self.job.step == step + 1:
        print("state step=%d rank=%d catching=%d sha=%s" % (
            self.job.step, self.job.rank if dist.is_initialized() else -1, catching,
            state_sha(self.job)), flush=True)
    return out


def _raise(exc):
    raise exc


cohort_reform._Step.__exit__ = failing_exit
dist.isend = held_isend
cohort_reform.Job.__init__ = hooked_init
cohort_reform._sparse_gradients = forced_compute
example = os.path.join(here, "..", "examples", "reform_ddp.py")
sys.argv = [example] + sys.argv[1:]
runpy.run_path(example, run_name="__main__")
