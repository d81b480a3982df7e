#!/usr/bin/python3
"""examples/reform_ddp.py with one test hook, for tests/test_reform_torch.py.

Once the file named by $REFORM_TEST_FAIL exists, this worker's next step
that completes (its all_reduce gave the full sum, its optimizer stepped) is
made to fail as a lost peer's would ("Connection closed by peer"), once: the
step is not counted here while the other ranks count it. So this survivor
is behind the others at the re-form, deterministically (docs/reform.md,
"Steps": the highest completed step wins, a survivor behind it receives
the state).
Usage: reform_torch_behind.py ARGS OF reform_ddp.py
"""
import os
import runpy
import sys

import cohort_reform

here = os.path.dirname(os.path.abspath(__file__))
trigger = os.environ.get("REFORM_TEST_FAIL", "")
original = cohort_reform._Step.__exit__


def failing_exit(self, kind, exc, tb):
    global trigger
    if kind is None and trigger and os.path.exists(trigger):
        trigger = ""
        print("failing step=%d pid=%d" % (self.job.step + 1, os.getpid()), flush=True)
        exc = RuntimeError("Connection closed by peer (test: this rank's step failed)")
        return original(self, RuntimeError, exc, None) or _raise(exc)
    return original(self, kind, exc, tb)


def _raise(exc):
    raise exc


cohort_reform._Step.__exit__ = failing_exit
example = os.path.join(here, "..", "examples", "reform_ddp.py")
sys.argv = [example] + sys.argv[1:]
runpy.run_path(example, run_name="__main__")
