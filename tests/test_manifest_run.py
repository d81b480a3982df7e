#!/usr/bin/python3
"""test_manifest_run.py BINDIR - what `cohort manifest` generates, run for real.

Each template of a 2-node job (2 workers per node) is executed on this
machine with the real `cohort run` agents talking over loopback, standing in
only for the scheduler:
  slurm   the script runs under bash with an `srun` that starts the command
          once per node with the SLURM_* variables Slurm would set;
  docker  the lines run under bash with a `docker` that drops the container
          options and runs the command in place;
  k8s     the container command of each pod index, expanded as the kubelet
          does, with pod 0's DNS name pointed at 127.0.0.1 (no cluster DNS).
Every worker prints its RANK, WORLD_SIZE and argv; the test asserts four
distinct ranks of a world of four and the exact awkward argv on each.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile

import yaml

BINDIR = sys.argv[1]
COHORT = os.path.join(BINDIR, "cohort")
failures = passed = 0


def check(cond, what):
    global failures, passed
    if cond:
        passed += 1
    else:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


ARGS = ["it's", 'say "hi": now', "$(HOME)", "$$", "a b\tc", "", "ünï ☃", "--", "-h"]
WORKER = ["/usr/bin/python3", "-c",
          "import json, os, sys; print('WORKER ' + json.dumps([os.environ['RANK'], "
          "os.environ['WORLD_SIZE'], sys.argv[1:]]), flush=True)"] + ARGS


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def manifest(*args):
    p = subprocess.run([COHORT, "manifest", *args], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0, "manifest %s: %s" % (args[0], p.stderr))
    return p.stdout


def run_group(cmds, envs, timeout=120):
    """Starts each argv in its own process group, as on separate machines;
    returns their (exit status, output). Bounded: all are killed at timeout."""
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) for c, e in zip(cmds, envs)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = p.communicate()
            out += "\n[timed out]"
        outs.append((p.returncode, out))
    return outs


def check_workers(kind, output):
    seen = {}
    for line in output.splitlines():
        m = re.search(r"WORKER (.*)$", line)
        if m:
            rank, world, argv = json.loads(m.group(1))
            seen[rank] = (world, argv)
    check(sorted(seen) == ["0", "1", "2", "3"], "%s: ranks %r\n%s" % (kind, sorted(seen), output))
    for rank, (world, argv) in seen.items():
        check(world == "4", "%s: rank %s WORLD_SIZE %s" % (kind, rank, world))
        check(argv == ARGS, "%s: rank %s argv %r" % (kind, rank, argv))


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


# srun of a 2-node allocation on this machine: the command once per node.
FAKE_SRUN = r'''#!/usr/bin/python3
import os, subprocess, sys
args = sys.argv[1:]
while args[0].startswith("--"):
    args.pop(0)  # srun's own options
procs = []
for node in range(2):
    env = dict(os.environ, SLURM_NODEID=str(node), SLURM_PROCID=str(node),
               SLURM_STEP_NODELIST="localhost,localhost", SLURM_STEP_NUM_NODES="2",
               SLURM_STEP_NUM_TASKS="2", SLURM_JOB_NODELIST="localhost,localhost",
               SLURM_NNODES="2", SLURM_JOB_NUM_NODES="2")
    procs.append(subprocess.Popen(args, env=env))
sys.exit(max(p.wait() for p in procs))
'''

# docker run: skip the container options, run the command here.
FAKE_DOCKER = r'''#!/usr/bin/python3
import os, sys
args = sys.argv[1:]
assert args.pop(0) == "run"
with_value = {"--network", "--ipc", "--ulimit", "--shm-size", "--gpus", "--device",
              "--cap-add", "--env"}
while args[0].startswith("--"):
    opt = args.pop(0)
    if opt in with_value:
        args.pop(0)
args.pop(0)  # the image
os.execvp(args[0], args)
'''


def main():
    env = dict(os.environ, PATH=BINDIR + ":" + os.environ["PATH"], COHORT_TOKEN="test-token")
    with tempfile.TemporaryDirectory() as d:
        # Slurm: the agents put the store on port 29400 + job id % 1000.
        jobid = None
        for j in range(1000):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", 29400 + (os.getpid() + j) % 1000))
                jobid = 7000000 + (os.getpid() + j) % 1000
                break
            except OSError:
                pass
            finally:
                sock.close()
        check(jobid is not None, "a free Slurm-derived port")
        script = manifest("slurm", "--nodes", "2", "--nproc-per-node", "2", "--", *WORKER)
        write_exe(os.path.join(d, "srun"), FAKE_SRUN)
        senv = dict(env, PATH=d + ":" + env["PATH"], SLURM_JOB_ID=str(jobid))
        (rc, out), = run_group([["bash", "-c", script]], [senv])
        check(rc == 0, "slurm script exit %s\n%s" % (rc, out))
        check_workers("slurm", out)

    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        lines = manifest("docker", "--nodes", "2", "--nproc-per-node", "2", "--image", "img",
                         "--master-addr", "127.0.0.1", "--port", str(port), "--", *WORKER)
        write_exe(os.path.join(d, "docker"), FAKE_DOCKER)
        denv = dict(env, PATH=d + ":" + env["PATH"])
        # Each node's line, as a separate shell on its own "machine".
        cmds = []
        for block in lines.split("# node ")[1:]:
            cmds.append(["bash", "-c", block.split("\n", 1)[1]])
        check(len(cmds) == 2, "two docker lines")
        outs = run_group(cmds, [denv, denv])
        check(all(rc == 0 for rc, _ in outs), "docker nodes exit %r" % [o for o in outs])
        check_workers("docker", "\n".join(o for _, o in outs))

    port = free_port()
    text = manifest("k8s", "--name", "cj", "--nodes", "2", "--nproc-per-node", "2", "--image",
                    "img", "--port", str(port), "--", *WORKER)
    job = [doc for doc in yaml.safe_load_all(text) if doc and doc["kind"] == "Job"][0]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    cmds = []
    for index in range(job["spec"]["completions"]):
        argv = []
        for a in command:
            # The kubelet's expansion: $(VAR) from the container's env, $$ -> $.
            a = re.sub(r"\$\$|\$\(JOB_COMPLETION_INDEX\)",
                       lambda m: "$" if m.group(0) == "$$" else str(index), a)
            argv.append(a.replace("cj-0.cj:", "127.0.0.1:"))  # stands in for cluster DNS
        cmds.append(argv)
    check(cmds[0][0] == "cohort", "k8s runs cohort")
    kenvs = [dict(env, JOB_COMPLETION_INDEX=str(i)) for i in range(2)]
    procs_out = run_group(cmds, kenvs)
    check(all(rc == 0 for rc, _ in procs_out), "k8s pods exit %r" % procs_out)
    check_workers("k8s", "\n".join(o for _, o in procs_out))

    print("%d passed, %d failed" % (passed, failures))
    return 1 if failures else 0


sys.exit(main())
