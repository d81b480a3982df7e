#!/usr/bin/python3
"""test_manifest_run.py BINDIR - what `cohort manifest` generates, run for real.

Each template of a 2-node job (2 workers per node) is executed with the real
`cohort run` agents, each node in a network namespace of its own (created and
removed here, on a bridge in a namespace of its own), standing in only for
the scheduler:
  slurm   the script runs under bash with an `srun` that starts the command
          once per node, in that node's namespace, with the SLURM_* variables
          Slurm would set (hostnames from the namespaces' hosts files);
  docker  the lines run under bash with a `docker` that drops the container
          options and runs the command in place, each line in its node;
  k8s     the container command of each pod index, expanded as the kubelet
          does, in its node, with pod 0's DNS name pointed at node 0's address
          (no cluster DNS).
Every worker prints its RANK, WORLD_SIZE and argv; the test asserts four
distinct ranks of a world of four and the exact awkward argv on each.

No token is set by the test: each template authenticates its job by itself
(Slurm's script makes one, the docker lines read the env file the template
writes, the pods read the Secret the manifest holds). While the workers wait,
an intruder in a third namespace, without the token, tries to read a key,
to set the failure key and to join as a node: all three are refused, and the
job then finishes.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import yaml

from checks import check, report
from netns import Netns

BINDIR = os.path.abspath(sys.argv[1])
COHORT = os.path.join(BINDIR, "cohort")


ARGS = ["it's", 'say "hi": now', "$(HOME)", "$$", "a b\tc", "", "ünï ☃", "--", "-h"]
# Each worker prints, then waits (bounded) for the file $GO_FILE before it ends,
# so that the job is running while the intruder tries its luck.
WORKER = ["/usr/bin/python3", "-c",
          "import json, os, sys, time; print('WORKER ' + json.dumps([os.environ['RANK'], "
          "os.environ['WORLD_SIZE'], sys.argv[1:]]), flush=True); t = time.time()\n"
          "while not os.path.exists(os.environ['GO_FILE']) and time.time() - t < 60: "
          "time.sleep(0.05)"] + ARGS


NET = Netns(3)  # node 0, node 1, the intruder
INTRUDER = 2
PORT = 29400  # any port is free in namespaces of our own


def manifest(*args):
    p = subprocess.run([COHORT, "manifest", *args], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0, "manifest %s: %s" % (args[0], p.stderr))
    return p.stdout


def intrude(kind, port, go_file):
    """While the job runs: a client without the token can neither read a key
    nor set the failure key, and an agent without it cannot join. Then lets
    the workers end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COHORT_")}
    addr = "%s:%d" % (NET.addr(0), port)
    there = NET.exec(INTRUDER)
    # The job is up once its store answers (refusing us, since we lack the token).
    deadline = time.time() + 60
    while time.time() < deadline:
        p = subprocess.run(there + [COHORT, "store", "ping", "--addr", addr, "--timeout", "2"],
                           env=env,
                           capture_output=True, text=True, timeout=30)
        if "token" in p.stderr:
            break
        time.sleep(0.2)
    for what, argv in [("read a key", ["store", "get", "--addr", addr, "--timeout", "5", "plan"]),
                       ("set the failure key", ["store", "set", "--addr", addr, "--timeout", "5",
                                                "j/0/fail", "intruder says stop"])]:
        p = subprocess.run(there + [COHORT] + argv, env=env, capture_output=True, text=True,
                           timeout=30)
        check(p.returncode != 0 and "token" in p.stderr,
              "%s: an intruder without the token cannot %s: %d %s" %
              (kind, what, p.returncode, p.stderr))
    p = subprocess.run(there + [COHORT, "run", "--nnodes", "2", "--node-rank", "1", "--master", addr,
                        "--nproc-per-node", "1", "--", "/bin/true"], env=env,
                       capture_output=True, text=True, timeout=120)
    check(p.returncode != 0 and "token" in p.stderr,
          "%s: an agent without the token cannot join: %d %s" % (kind, p.returncode, p.stderr))
    open(go_file, "w").close()


def run_group(cmds, envs, timeout=120, during=None):
    """Starts each argv in its own process group, as on separate machines,
    runs during() while they run, and returns their (exit status, output).
    Bounded: all are killed at timeout."""
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) for c, e in zip(cmds, envs)]
    if during is not None:
        during()
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


# srun of a 2-node allocation: the command once per node, in the namespace
# named by NODE_NS<i>.
FAKE_SRUN = r'''#!/usr/bin/python3
import os, subprocess, sys
args = sys.argv[1:]
while args[0].startswith("--"):
    args.pop(0)  # srun's own options
procs = []
for node in range(2):
    env = dict(os.environ, SLURM_NODEID=str(node), SLURM_PROCID=str(node),
               SLURM_STEP_NODELIST="node0,node1", SLURM_STEP_NUM_NODES="2",
               SLURM_STEP_NUM_TASKS="2", SLURM_JOB_NODELIST="node0,node1",
               SLURM_NNODES="2", SLURM_JOB_NUM_NODES="2")
    ns = os.environ["NODE_NS%d" % node]
    procs.append(subprocess.Popen(["ip", "netns", "exec", ns] + args, env=env))
sys.exit(max(p.wait() for p in procs))
'''

# docker run: skip the container options but for the env file (whose
# variables the container gets), run the command here.
FAKE_DOCKER = r'''#!/usr/bin/python3
import os, sys
args = sys.argv[1:]
assert args.pop(0) == "run"
with_value = {"--network", "--ipc", "--ulimit", "--shm-size", "--gpus", "--device",
              "--cap-add", "--env"}
while args[0].startswith("--"):
    opt = args.pop(0)
    if opt == "--env-file":
        with open(args.pop(0)) as f:
            for line in f.read().splitlines():
                name, value = line.split("=", 1)
                os.environ[name] = value
    elif opt in with_value:
        args.pop(0)
args.pop(0)  # the image
os.execvp(args[0], args)
'''


def run_slurm(env):
    with tempfile.TemporaryDirectory() as d:
        # Slurm: the agents put the store on port 29400 + job id % 1000.
        jobid = 7000000 + os.getpid() % 1000
        port = 29400 + jobid % 1000
        script = manifest("slurm", "--nodes", "2", "--nproc-per-node", "2", "--", *WORKER)
        write_exe(os.path.join(d, "srun"), FAKE_SRUN)
        go = os.path.join(d, "go")
        senv = dict(env, PATH=d + ":" + env["PATH"], SLURM_JOB_ID=str(jobid), GO_FILE=go,
                    NODE_NS0=NET.nodes[0], NODE_NS1=NET.nodes[1])
        (rc, out), = run_group([["bash", "-c", script]], [senv],
                               during=lambda: intrude("slurm", port, go))
        check(rc == 0, "slurm script exit %s\n%s" % (rc, out))
        check_workers("slurm", out)


def run_docker(env):
    with tempfile.TemporaryDirectory() as d:
        lines = manifest("docker", "--nodes", "2", "--nproc-per-node", "2", "--image", "img",
                         "--master-addr", NET.addr(0), "--port", str(PORT), "--", *WORKER)
        write_exe(os.path.join(d, "docker"), FAKE_DOCKER)
        go = os.path.join(d, "go")
        denv = dict(env, PATH=d + ":" + env["PATH"], GO_FILE=go)
        # The env file's line once (the file is then "copied" to every node: the
        # nodes share d), then each node's line as a separate shell in its node.
        blocks = lines.split("# node ")
        p = subprocess.run(["bash", "-c", blocks[0]], env=denv, cwd=d, timeout=30)
        check(p.returncode == 0, "docker: the env file's line runs")
        cmds = [NET.exec(i) + ["bash", "-c", "cd %s && %s" % (d, b.split("\n", 1)[1])]
                for i, b in enumerate(blocks[1:])]
        check(len(cmds) == 2, "two docker lines")
        outs = run_group(cmds, [denv, denv], during=lambda: intrude("docker", PORT, go))
        check(all(rc == 0 for rc, _ in outs), "docker nodes exit %r" % [o for o in outs])
        check_workers("docker", "\n".join(o for _, o in outs))


def run_k8s(env):
    text = manifest("k8s", "--name", "cj", "--nodes", "2", "--nproc-per-node", "2", "--image",
                    "img", "--port", str(PORT), "--", *WORKER)
    docs = [doc for doc in yaml.safe_load_all(text) if doc]
    job = [doc for doc in docs if doc["kind"] == "Job"][0]
    secrets = {doc["metadata"]["name"]: doc["stringData"] for doc in docs if doc["kind"] == "Secret"}
    container = job["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    cmds = []
    for index in range(job["spec"]["completions"]):
        argv = []
        for a in command:
            # The kubelet's expansion: $(VAR) from the container's env, $$ -> $.
            a = re.sub(r"\$\$|\$\(JOB_COMPLETION_INDEX\)",
                       lambda m: "$" if m.group(0) == "$$" else str(index), a)
            argv.append(a.replace("cj-0.cj:", NET.addr(0) + ":"))  # stands in for cluster DNS
        check(argv[0] == "cohort", "k8s runs cohort")
        cmds.append(NET.exec(index) + argv)
    # The kubelet's env: each secretKeyRef from the Secret the manifest holds.
    penv = {}
    for e in container.get("env", []):
        ref = e["valueFrom"]["secretKeyRef"]
        penv[e["name"]] = secrets[ref["name"]][ref["key"]]
    check("COHORT_TOKEN" in penv, "k8s: the pods get COHORT_TOKEN from the Secret")
    with tempfile.TemporaryDirectory() as d:
        go = os.path.join(d, "go")
        kenvs = [dict(env, JOB_COMPLETION_INDEX=str(i), GO_FILE=go, **penv) for i in range(2)]
        procs_out = run_group(cmds, kenvs, during=lambda: intrude("k8s", PORT, go))
    check(all(rc == 0 for rc, _ in procs_out), "k8s pods exit %r" % procs_out)
    check_workers("k8s", "\n".join(o for _, o in procs_out))


def main():
    # No token from the user: the templates make their own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COHORT_")}
    env["PATH"] = BINDIR + ":" + os.environ["PATH"]
    NET.up()
    try:
        run_slurm(env)
        run_docker(env)
        run_k8s(env)
    finally:
        NET.down()

    return report()


sys.exit(main())
