"""cohort's start-up hook for Python workers: stack dumps on demand.

`cohort run` puts this directory first on PYTHONPATH and sets
COHORT_STACKS_FILE (a file of the rank's own) and COHORT_STACKS_SIGNAL (a
real-time signal number). Python imports `sitecustomize` at start-up, before
the user's script; this one registers faulthandler for that signal, so that
the agent can ask a running, hung or spinning worker for the traceback of
every thread without stopping it and without any change to the script.
faulthandler writes from its C signal handler, so a rank blocked in a system
call or spinning in C code answers as well as one running Python code.

Where the worker's PyTorch is 2.2 or later, the pre-2.2 name of a variable
cohort run sets for both (NCCL_ASYNC_ERROR_HANDLING) moves to the TORCH_
name that PyTorch reads, so PyTorch prints no deprecation warning, as under
its own torchrun.

Then it runs the sitecustomize that would have been imported without us
(Debian's, a virtualenv's), so nothing the user had changes.
"""
import os
import sys


def _register():
    path = os.environ.get("COHORT_STACKS_FILE")
    signum = os.environ.get("COHORT_STACKS_SIGNAL")
    if not path or not signum:
        return
    try:
        import faulthandler
        import signal

        sig = int(signum)
        previous = signal.getsignal(sig)
        # Appending: the agent empties the file before each request, so the
        # file holds exactly the last dump.
        out = open(path, "a")
        # Chain only to a handler someone installed: the default action of a
        # real-time signal is to terminate.
        chain = previous not in (signal.SIG_DFL, None)
        faulthandler.register(sig, file=out, all_threads=True, chain=chain)
        sys.modules[__name__]._cohort_stacks_file = out
    except (OSError, ValueError, RuntimeError) as e:
        sys.stderr.write("cohort: no Python stack dumps for this worker: %s\n" % e)


# Automatic beats come at most this often (seconds), as libcohort's do.
_BEAT_EVERY = 0.2
# How often the main thread's Python stack is sampled (seconds).
_SAMPLE_EVERY = 0.25
# torch.distributed's blocking calls that complete a collective.
_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_object",
    "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced",
    "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "gather",
    "gather_object", "scatter", "scatter_object_list", "send", "recv",
)


class _Beat:
    """Touches the rank's automatic progress file (COHORT_HANG_WATCH), at
    most every _BEAT_EVERY s; writes it once the first collective or DDP
    step completed, which ends the rank's start-up for the agent."""

    def __init__(self, path):
        self.path = path
        self.last = 0.0
        self.stepped = False

    def __call__(self, step=False):
        import time

        now = time.monotonic()
        first = step and not self.stepped
        if now - self.last < _BEAT_EVERY and not first:
            return
        self.last = now
        try:
            if first:
                with open(self.path, "w") as f:
                    f.write("step\n")
                self.stepped = True
            else:
                os.utime(self.path)
        except OSError:
            pass  # the agent's directory is gone: the job is ending


def _stack(frame):
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _sample(beat, ident):
    """Beats whenever the main thread's stack is not made of the same calls
    as at the last sample: a loop that returns from a function and calls it
    again has moved, even when each sample finds it in the same line; a rank
    spinning in one loop or blocked in one call has not. The last sample's
    frames are held, so that a new call cannot reuse an old one's identity."""
    import time

    last = None
    while True:
        time.sleep(_SAMPLE_EVERY)
        now = _stack(sys._current_frames().get(ident))
        if not now:
            return  # the main thread is gone
        if last is not None and (
            len(now) != len(last) or any(a is not b for a, b in zip(now, last))
        ):
            beat()
        last = now


def _wrap_collective(f, beat):
    import functools

    @functools.wraps(f)
    def collective(*args, **kwargs):
        result = f(*args, **kwargs)
        if not kwargs.get("async_op"):
            beat(step=True)
        return result

    collective._cohort_beats = True
    return collective


def _patch_distributed(module, beat):
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    for where in (module, c10d):
        for name in _COLLECTIVES:
            f = getattr(where, name, None) if where is not None else None
            if callable(f) and not getattr(f, "_cohort_beats", False):
                setattr(where, name, _wrap_collective(f, beat))


def _patch_ddp(module, beat):
    ddp = getattr(module, "DistributedDataParallel", None)
    forward = getattr(ddp, "forward", None)
    if forward is None or getattr(forward, "_cohort_beats", False):
        return
    import functools

    # A new forward means the last step's gradient all_reduce completed.
    @functools.wraps(forward)
    def stepped(self, *args, **kwargs):
        beat(step=True)
        return forward(self, *args, **kwargs)

    stepped._cohort_beats = True
    ddp.forward = stepped


class _AfterImport:
    """A meta path finder that patches modules once they are executed."""

    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module):
            run(module)
            try:
                patch(module)
            except Exception as e:  # never break the user's import
                sys.stderr.write("cohort: no progress beats from %s: %s\n" % (name, e))

        loader.exec_module = exec_module
        return spec


def _progress():
    """Progress without changes to the script: completed torch.distributed
    collectives and DDP steps are progress, and so is the main thread's
    Python stack moving (both in COHORT_HANG_WATCH's file). Only in the worker's own process (a child
    Python inherits COHORT_PROGRESS_PID and stays out)."""
    path = os.environ.get("COHORT_HANG_WATCH")
    if not path:
        return
    me = str(os.getpid())
    if os.environ.setdefault("COHORT_PROGRESS_PID", me) != me:
        return
    import threading

    beat = _Beat(path)
    patches = {
        "torch.distributed": lambda m: _patch_distributed(m, beat),
        "torch.nn.parallel.distributed": lambda m: _patch_ddp(m, beat),
    }
    sys.meta_path.insert(0, _AfterImport(patches))
    ident = threading.main_thread().ident
    threading.Thread(target=_sample, args=(beat, ident), name="cohort-progress",
                     daemon=True).start()


# Variables cohort run sets under their pre-2.2 names, for PyTorch before 2.2
# (which reads only those; torchrun 1.13 set them) beside the TORCH_ ones.
# PyTorch 2.2 and later read the TORCH_ name first and warn on every process
# where the old one is set.
_RENAMED_IN_TORCH_2_2 = ("NCCL_ASYNC_ERROR_HANDLING",)


def _torch_version():
    """(major, minor) of the torch this Python would import, read from its
    version.py without importing it; None when there is none or no version."""
    import importlib.util  # as _chain; not re, which costs a worker 3 ms

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    for where in (spec and spec.submodule_search_locations) or ():
        try:
            with open(os.path.join(where, "version.py")) as f:
                line = next((x for x in f if x.startswith("__version__")), "")
        except OSError:
            continue
        major, _, rest = line.partition("=")[2].strip(" '\"\n").partition(".")
        minor = rest.partition(".")[0]
        if major.isdigit() and minor.isdigit():
            return int(major), int(minor)
    return None


def _torch_env():
    """Where torch reads the TORCH_ names (2.2 on), an old name moves to its
    new one (kept where that is set: torch reads it first), so that torch has
    no deprecation warning to print and every value it reads is the same."""
    old = [n for n in _RENAMED_IN_TORCH_2_2 if n in os.environ]
    if not old or (_torch_version() or (0, 0)) < (2, 2):
        return
    for name in old:
        os.environ.setdefault("TORCH_" + name, os.environ.pop(name))


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_register()
_progress()
_torch_env()
_chain()
