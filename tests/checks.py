"""checks.py - pass/fail counting for the Python tests, as check.h is for
the C ones: check(cond, what) counts the result and prints "FAIL: what" to
stderr when cond is false; report() prints "N passed, N failed" and returns
the exit status (0 when nothing failed); fail(what) stops at once. For the
tests of the PyTorch module, torch_and_reform(src_dir) gives torch and
cohort_reform, or exits 77 (skipped) without torch. Imported from the tests'
folder (Python puts a script's own directory first on its path)."""
import os
import sys

passed = failed = 0


def check(cond, what):
    """Counts cond; returns it, so that a caller may stop on a failure."""
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, file=sys.stderr)
    return bool(cond)


def report():
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


def fail(what):
    """A failure after which the test cannot go on: prints it and exits 1."""
    print("FAIL: " + what)
    sys.exit(1)


def torch_and_reform(src_dir):
    """(torch, cohort_reform) from the source tree src_dir; exit 77 without torch."""
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        sys.exit(77)
    sys.path.insert(0, os.path.join(src_dir, "src", "agent", "python"))
    import cohort_reform
    return torch, cohort_reform
