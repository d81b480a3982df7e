#!/usr/bin/python3
"""The NCCL variables under the names the worker's PyTorch reads.

cohort run sets NCCL_ASYNC_ERROR_HANDLING (what PyTorch before 2.2 reads)
and TORCH_NCCL_ASYNC_ERROR_HANDLING (2.2 on, which warns where the old
name is set). The start-up hook (src/agent/python/sitecustomize.py) moves
the old name to the new one where the worker's torch is 2.2 or later;
cohort_reform's NCCL settings use the names of the torch it runs on.
Fake torch packages (a version.py only) stand for PyTorch 2.11 here;
Debian's 1.13 is the real one.

usage: test_torch_env_names.py SRC COHORT
"""
import json
import os
import subprocess
import sys
import tempfile

SRC, COHORT = sys.argv[1], sys.argv[2]
HOOK = os.path.join(SRC, "src", "agent", "python")
PY = "/usr/bin/python3"
OLD, NEW = "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"
# Prints the variables as the worker's script sees them.
SHOW = "import json, os; print(json.dumps({k: os.environ.get(k) for k in %r}))"
failed = 0


def check(what, ok, detail=""):
    global failed
    failed += not ok
    print("%s: %s%s" % ("ok" if ok else "FAIL", what, (" (%s)" % detail) if detail else ""),
          flush=True)


def fake_torch(root, version):
    """A package named torch with only a version.py (none when version is None)."""
    d = os.path.join(root, "torch")
    os.makedirs(d)
    open(os.path.join(d, "__init__.py"), "w").close()
    if version is not None:
        with open(os.path.join(d, "version.py"), "w") as f:
            f.write("from typing import Optional\n\n__version__ = '%s'\ndebug = False\n" % version)
    return root


def seen(argv, env, names=(OLD, NEW)):
    base = {k: v for k, v in os.environ.items() if k not in (OLD, NEW)}
    p = subprocess.run(argv + ["-c", SHOW % (list(names),)], env=dict(base, **env),
                       capture_output=True, text=True, timeout=60)
    # cohort run's lines begin with the rank's "[r0] ".
    lines = [line[line.index("{"):] for line in p.stdout.splitlines() if "{" in line]
    return json.loads(lines[-1]) if lines else {"error": p.stderr.strip()[-300:]}


def hook_cases(tmp):
    new = fake_torch(os.path.join(tmp, "t211"), "2.11.0+cu130")
    old = fake_torch(os.path.join(tmp, "t113"), "1.13.0a0")
    bare = fake_torch(os.path.join(tmp, "tnone"), None)
    path = lambda d: {"PYTHONPATH": HOOK + os.pathsep + d}  # noqa: E731
    got = seen([PY], dict(path(new), **{OLD: "1", NEW: "3"}))
    check("torch 2.11, both set: the old name is gone, the new one's value kept",
          got == {OLD: None, NEW: "3"}, got)
    got = seen([PY], dict(path(new), **{OLD: "0"}))
    check("torch 2.11, only the old name: moved to the new one", got == {OLD: None, NEW: "0"}, got)
    got = seen([PY], dict(path(old), **{OLD: "1", NEW: "1"}))
    check("torch 1.13: both kept (it reads only the old name)", got == {OLD: "1", NEW: "1"}, got)
    got = seen([PY], dict(path(bare), **{OLD: "1", NEW: "1"}))
    check("a torch without a version: both kept", got == {OLD: "1", NEW: "1"}, got)
    return new


def run_cases(new):
    run = [COHORT, "run", "--nproc-per-node", "1", "--no-python", PY]
    got = seen(run, {"PYTHONPATH": new})
    check("cohort run, torch 2.11: the worker has only the new name, 1",
          got == {OLD: None, NEW: "1"}, got)
    got = seen(run, {})
    check("cohort run, Debian's torch 1.13: both names, 1", got == {OLD: "1", NEW: "1"}, got)


# cohort_reform's settings for NCCL under torch 2.11's names and 1.13's.
MODULE = r"""
import json, os, sys
import torch
import cohort_reform
torch.__version__ = sys.argv[1]
cohort_reform._nccl_env()
print(json.dumps({k: os.environ.get(k) for k in sys.argv[2:]}))
"""


def module_cases():
    names = ["NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT", OLD, NEW]
    base = {k: v for k, v in os.environ.items() if k not in names}
    env = dict(base, PYTHONPATH=HOOK, **{OLD: "1", NEW: "1"})
    # (Debian's torch is 1.13: the hook keeps both async names; 2.11's is NEW.)
    for version, want in (("2.11.0", {"NCCL_BLOCKING_WAIT": None, "TORCH_NCCL_BLOCKING_WAIT": "1",
                                      OLD: "1", NEW: "0"}),
                          ("1.13.0", {"NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_BLOCKING_WAIT": None,
                                      OLD: "0", NEW: "1"})):
        p = subprocess.run([PY, "-c", MODULE, version] + names, env=env, capture_output=True,
                           text=True, timeout=120)
        out = p.stdout.strip().splitlines()
        got = json.loads(out[-1]) if p.returncode == 0 and out else p.stderr[-300:]
        check("cohort_reform on torch %s: blocking wait on, async handling off, its names"
              % version, got == want, got)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        new = hook_cases(tmp)
        run_cases(new)
    module_cases()
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
