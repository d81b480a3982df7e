"""checks.py - pass/fail counting for the Python tests, as check.h is for
the C ones: check(cond, what) counts the result and prints "FAIL: what" to
stderr when cond is false; report() prints "N passed, N failed" and returns
the exit status (0 when nothing failed). Imported from the tests' folder
(Python puts a script's own directory first on its path)."""
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
