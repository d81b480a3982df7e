"""cohort's start-up hook for Python workers: stack dumps on demand.

`cohort run` puts this directory first on PYTHONPATH and sets
COHORT_STACKS_FILE (a file of the rank's own) and COHORT_STACKS_SIGNAL (a
real-time signal number). Python imports `sitecustomize` at start-up, before
the user's script; this one registers faulthandler for that signal, so that
the agent can ask a running, hung or spinning worker for the traceback of
every thread without stopping it and without any change to the script.
faulthandler writes from its C signal handler, so a rank blocked in a system
call or spinning in C code answers as well as one running Python code.

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
_chain()
