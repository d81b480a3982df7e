#!/usr/bin/python3
"""test_k8s_pods.py BINDIR SOURCE_DIR - the pods of `cohort manifest
trainjob|pytorchjob|jobset` start a 2-pod PyTorch DDP job unchanged when
each pod has exactly the environment its controller gives it.

Each pod is a network namespace (created and removed here) with the pod's
host name, the cluster DNS names of its controller in the hosts files, and
an environment of exactly these variables (env -i):
  - the image's PATH (cohort's build directory, /usr/bin, /bin) and the
    HOSTNAME the runtime sets;
  - what the controller adds, as its code does:
      Kubeflow Trainer v2.3.0, pkg/runtime/framework/plugins/torch/torch.go
        (EnforceMLPolicy): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK
        (the completion-index annotation), PET_MASTER_ADDR
        NAME-node-0-0.NAME, PET_MASTER_PORT 29400; the TrainJob's trainer
        image, command and env go into the runtime's container "node";
      Training Operator v1.9.0, pkg/controller.v1/pytorch/envvar.go
        (setPodEnv) and master.go: PYTHONUNBUFFERED=1, MASTER_PORT,
        PET_MASTER_PORT, MASTER_ADDR and PET_MASTER_ADDR NAME-master-0,
        WORLD_SIZE (pods x nprocPerNode), RANK and PET_NODE_RANK (0 for the
        Master, 1 + index for a Worker), PET_NPROC_PER_NODE, PET_NNODES;
      JobSet v0.12.0: no variable; pod i is NAME-node-0-i in the subdomain
        NAME;
      the Job controller (every kind runs Indexed Jobs but the PyTorchJob):
        JOB_COMPLETION_INDEX;
  - the container's own env as the kubelet resolves it (value, secretKeyRef
    from the Secret the manifest holds, fieldRef of the completion index);
and the container's command with $(VAR) expanded as the kubelet does.
The command after `--` is an ordinary DDP script (Debian's torch, gloo,
env://). Every kind must end with both pods exiting 0, every rank printing
the same parameters and a world of 4 (2 pods x 2 workers): with the
Training Operator's RANK (the pod's) and WORLD_SIZE in the pods, that shows
cohort replaces them in each worker, as torchrun does. Last, the TrainJob
as Trainer's documentation writes one (`torchrun SCRIPT`) runs unchanged in
an image whose torchrun is cohort's link.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile

import yaml

from checks import check, report
from netns import Netns

BINDIR = os.path.abspath(sys.argv[1])
SRC = os.path.abspath(sys.argv[2])
PY = "/usr/bin/python3"
TRAIN = [PY, os.path.join(SRC, "tests", "torch", "ddp_train.py")]
NAME = "cj"
NET = Netns(2, subnet="10.203.0")
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def manifest(kind):
    p = subprocess.run([os.path.join(BINDIR, "cohort"), "manifest", kind, "--name", NAME,
                        "--nodes", "2", "--nproc-per-node", "2", "--image", "img", "--", *TRAIN],
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 0, "manifest %s: %s" % (kind, p.stderr))
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def expand(s, env):
    """The kubelet's $(VAR) expansion: "$$" is "$", $(NAME) the value of a
    variable defined before, anything else unchanged."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, s)


def kubelet(container, controller_env, secrets, index, hostname):
    """The process the kubelet starts: (argv, env), env exactly the image's
    PATH, HOSTNAME, then the container's env in order (controllers append
    theirs to it), each value expanded against those before it."""
    env = {"PATH": BINDIR + ":/usr/bin:/bin", "HOSTNAME": hostname}
    for e in container.get("env", []) + controller_env:
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
            continue
        src = e["valueFrom"]
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            env[e["name"]] = secrets[ref["name"]][ref["key"]]
        elif src.get("fieldRef", {}).get("fieldPath") == INDEX_ANNOTATION:
            env[e["name"]] = str(index)
        else:
            raise ValueError("no kubelet source for %r" % e)
    argv = [expand(a, env) for a in container.get("command", []) + container.get("args", [])]
    return argv, env


def index_env():
    """The Job controller's variable for an Indexed Job's pods."""
    return [{"name": "JOB_COMPLETION_INDEX",
             "valueFrom": {"fieldRef": {"fieldPath": INDEX_ANNOTATION}}}]


def trainjob_pods(docs, secrets):
    runtime = next(d for d in docs if d["kind"] == "TrainingRuntime")
    tj = next(d for d in docs if d["kind"] == "TrainJob")
    check(tj["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"], "trainjob: its runtime")
    rjob = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    check(rjob["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"]
          == "trainer", "trainjob: the runtime's Job is the trainer's")
    pod = rjob["template"]["spec"]["template"]["spec"]
    node = next(c for c in pod["containers"] if c["name"] == "node")
    tr = tj["spec"]["trainer"]
    # The TrainJob's trainer fills in the runtime's "node" container.
    container = dict(node, image=tr["image"], command=tr["command"], env=tr.get("env", []))
    n = tr["numNodes"]
    pods = []
    for i in range(n):
        host = "%s-node-0-%d" % (NAME, i)
        plugin = [{"name": "PET_NNODES", "value": str(n)},
                  {"name": "PET_NPROC_PER_NODE", "value": str(tr["numProcPerNode"])},
                  {"name": "PET_NODE_RANK",
                   "valueFrom": {"fieldRef": {"fieldPath": INDEX_ANNOTATION}}},
                  {"name": "PET_MASTER_ADDR", "value": "%s-node-0-0.%s" % (NAME, NAME)},
                  {"name": "PET_MASTER_PORT", "value": "29400"}]
        pods.append((host, [host + "." + NAME], kubelet(container, plugin + index_env(),
                                                        secrets, i, host)))
    return pods


def pytorchjob_pods(docs, secrets):
    pj = next(d for d in docs if d["kind"] == "PyTorchJob")
    specs = pj["spec"]["pytorchReplicaSpecs"]
    total = sum(s["replicas"] for s in specs.values())
    nproc = int(pj["spec"]["nprocPerNode"])
    pods = []
    for rtype in ("Master", "Worker"):
        spec = specs.get(rtype)
        for index in range(spec["replicas"] if spec else 0):
            c = next(c for c in spec["template"]["spec"]["containers"] if c["name"] == "pytorch")
            port = next(p["containerPort"] for p in specs["Master"]["template"]["spec"]
                        ["containers"][0]["ports"] if p["name"] == "pytorchjob-port")
            rank = index + (rtype == "Worker")
            master = "%s-master-0" % NAME
            operator = [{"name": "PYTHONUNBUFFERED", "value": "1"},
                        {"name": "MASTER_PORT", "value": str(port)},
                        {"name": "PET_MASTER_PORT", "value": str(port)},
                        {"name": "MASTER_ADDR", "value": master},
                        {"name": "PET_MASTER_ADDR", "value": master},
                        {"name": "WORLD_SIZE", "value": str(total * nproc)},
                        {"name": "RANK", "value": str(rank)},
                        {"name": "PET_NODE_RANK", "value": str(rank)},
                        {"name": "PET_NPROC_PER_NODE", "value": pj["spec"]["nprocPerNode"]},
                        {"name": "PET_NNODES", "value": str(total)}]
            host = "%s-%s-%d" % (NAME, rtype.lower(), index)
            # Each replica has a Service of its name: the Master's is MASTER_ADDR.
            pods.append((host, [host], kubelet(c, operator, secrets, rank, host)))
    return pods


def jobset_pods(docs, secrets):
    js = next(d for d in docs if d["kind"] == "JobSet")
    rjob = js["spec"]["replicatedJobs"][0]
    job = rjob["template"]["spec"]
    c = job["template"]["spec"]["containers"][0]
    pods = []
    for i in range(job["completions"]):
        host = "%s-%s-0-%d" % (NAME, rjob["name"], i)
        pods.append((host, [host + "." + NAME], kubelet(c, index_env(), secrets, i, host)))
    return pods


def run_pods(kind, pods):
    """Runs each pod's process in its namespace under its host name with
    exactly its environment; returns [(exit status, output)]."""
    NET.add_hosts([names for _, names, _ in pods])
    procs = []
    for i, (host, _, (argv, env)) in enumerate(pods):
        cmd = NET.exec(i) + ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host,
                             "/usr/bin/env", "-i"] + ["%s=%s" % kv for kv in env.items()] + argv
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
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


def check_ddp(kind, outs):
    check(all(rc == 0 for rc, _ in outs), "%s: both pods exit 0: %r" %
          (kind, [(rc, out[-2000:]) for rc, out in outs]))
    text = "\n".join(out for _, out in outs)
    params = dict(re.findall(r"^\[r(\d+)\] PARAMS (\w+)$", text, re.M))
    check(sorted(params) == ["0", "1", "2", "3"], "%s: 4 ranks print their parameters: %r" %
          (kind, sorted(params)))
    check(len(set(params.values())) == 1, "%s: every rank ends with the same parameters" % kind)
    worlds = re.findall(r"^\[r\d+\] LOSS \S+ world (\d+)$", text, re.M)
    check(worlds == ["4"] * 4, "%s: a world of 4 on every rank: %r" % (kind, worlds))


def torchrun_link():
    """A TrainJob as Trainer's docs write it, `torchrun SCRIPT` on the stock
    torch runtime, in an image whose torchrun is cohort's link (make
    install-torchrun): the same pods, that command, unchanged."""
    with tempfile.TemporaryDirectory() as d:
        os.symlink(os.path.join(BINDIR, "cohort"), os.path.join(d, "torchrun"))
        docs = manifest("trainjob")
        secrets = {x["metadata"]["name"]: x["stringData"] for x in docs if x["kind"] == "Secret"}
        tj = next(x for x in docs if x["kind"] == "TrainJob")
        tj["spec"]["trainer"]["command"] = ["torchrun", TRAIN[1]]
        pods = []
        for host, names, (argv, env) in trainjob_pods(docs, secrets):
            env["PATH"] = d + ":" + env["PATH"]
            pods.append((host, names, (argv, env)))
        check(pods[0][2][0] == ["torchrun", TRAIN[1]], "trainjob: torchrun SCRIPT")
        check_ddp("trainjob (torchrun link)", run_pods("trainjob", pods))


def main():
    NET.up()
    try:
        for kind, pods_of in (("trainjob", trainjob_pods), ("pytorchjob", pytorchjob_pods),
                              ("jobset", jobset_pods)):
            docs = manifest(kind)
            secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
            pods = pods_of(docs, secrets)
            check(len(pods) == 2, "%s: two pods" % kind)
            for host, _, (argv, env) in pods:
                check(argv[:2] == ["cohort", "run"] and argv[-len(TRAIN) - 1:] == ["--"] + TRAIN,
                      "%s: %s runs cohort run -- the script: %r" % (kind, host, argv))
                check("COHORT_TOKEN" in env, "%s: %s has the token from the Secret" % (kind, host))
            if kind == "pytorchjob":
                _, _, (_, env1) = pods[1]
                check(env1["RANK"] == "1" and env1["WORLD_SIZE"] == "4",
                      "pytorchjob: the operator's RANK is the pod's, WORLD_SIZE the processes'")
            check_ddp(kind, run_pods(kind, pods))
        torchrun_link()
    finally:
        NET.down()
    return report()


sys.exit(main())
