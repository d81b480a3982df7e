#!/usr/bin/python3
"""test_manifest.py COHORT - `cohort manifest` end to end.

Parses what `cohort manifest k8s|slurm|docker` prints with real parsers
(PyYAML, bash, shlex) and asserts the structure, names, counts and that the
command each node runs is exactly the argv given after `--`, including
arguments with quotes, colons, dollars, newlines and non-ASCII text.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

import yaml

from checks import check, report

COHORT = os.path.abspath(sys.argv[1])


def run(*args):
    p = subprocess.run([COHORT, "manifest", *args], capture_output=True, timeout=30)
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8", "replace")


# Arguments that break naive quoting in YAML or a shell.
AWKWARD = [
    "python3", "-c", 'import sys; print("a: b", \'c\', sys.argv[1:])',
    "$(HOME)", "$$", "${PATH}", "$JOB_COMPLETION_INDEX", "tab\there", "new\nline", "",
    "ünïcode ☃ 𝄞", "#not a comment", "- dash", "{a: [1, 2]}", "null", "yes", "0x1F",
    "\\back\\slash", "ctrl\x01\x1b", "nel\u0085 ls\u2028", "'single'", "*star", "&anchor",
    "!tag", "%", "@x", "`backtick`", "a;b|c&d>e<f", "--", "-h", "--help", " lead", "trail ",
]


def k8s_expand(s, env):
    """Kubernetes' expansion of $(VAR) in command and args: "$$" becomes "$",
    $(NAME) becomes env[NAME] when defined, anything else stays."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            if s[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if s[i + 1] == "(":
                j = s.find(")", i + 2)
                if j >= 0 and s[i + 2:j] in env:
                    out.append(env[s[i + 2:j]])
                    i = j + 1
                    continue
        out.append(s[i])
        i += 1
    return "".join(out)


def test_k8s():
    rc, out, err = run("k8s", "--name", "gpt2-train", "--nodes", "3", "--nproc-per-node", "8",
                       "--image", "registry.example/ml/cohort:1.2", "--gpus", "8", "--rdma",
                       "roce", "--shm", "16G", "--token-secret", "gpt2-token", "--port", "29500",
                       "--", *AWKWARD)
    check(rc == 0 and err == "", "k8s exits 0 silently: %d %s" % (rc, err))
    docs = [d for d in yaml.safe_load_all(out) if d is not None]
    check(len(docs) == 2, "k8s: two YAML documents, got %d" % len(docs))
    check(out.count("\n---\n") + out.startswith("---\n") == 2, "k8s: documents separated by ---")
    svc = next(d for d in docs if d["kind"] == "Service")
    job = next(d for d in docs if d["kind"] == "Job")
    check(svc["apiVersion"] == "v1" and job["apiVersion"] == "batch/v1", "apiVersions")
    check(svc["metadata"]["name"] == "gpt2-train", "service name")
    check(svc["spec"]["clusterIP"] == "None", "headless service")
    check(svc["spec"]["publishNotReadyAddresses"] is True, "publishNotReadyAddresses")
    check(svc["spec"]["ports"][0]["port"] == 29500, "service port")
    js = job["spec"]
    check(job["metadata"]["name"] == "gpt2-train", "job name")
    check(js["completionMode"] == "Indexed", "Indexed job")
    check(js["completions"] == 3 and js["parallelism"] == 3, "completions = parallelism = nodes")
    check(js["backoffLimit"] == 0, "no retries of single pods")
    tpl = js["template"]
    labels = tpl["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
          "service selector matches the pod labels")
    check(tpl["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "kube-system/roce",
          "roce network annotation")
    ps = tpl["spec"]
    check(ps["subdomain"] == svc["metadata"]["name"], "pod subdomain = service name")
    check(ps["restartPolicy"] == "Never", "restartPolicy Never")
    check(len(ps["containers"]) == 1, "one container")
    c = ps["containers"][0]
    check(c["image"] == "registry.example/ml/cohort:1.2", "image")
    check(c["resources"]["limits"] == {"nvidia.com/gpu": 8, "rdma/rdma": 1}, "gpu and rdma limits")
    check(c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"], "IPC_LOCK")
    env = {e["name"]: e for e in c["env"]}
    check(env["COHORT_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "gpt2-token", "key": "token"},
          "token from the Secret")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in ps["volumes"]}
    shm = [n for n, p in mounts.items() if p == "/dev/shm"]
    check(len(shm) == 1, "/dev/shm mounted")
    check(vols[shm[0]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"},
          "memory-backed /dev/shm of 16Gi")
    # What the kubelet runs in pod 2 after expanding $(VAR) references.
    argv = [k8s_expand(a, {"JOB_COMPLETION_INDEX": "2"}) for a in c["command"]]
    want = ["cohort", "run", "--nnodes", "3", "--nproc-per-node", "8",
            "--master", "gpt2-train-0.gpt2-train:29500", "--node-rank", "2", "--"] + AWKWARD
    check(argv == want, "k8s command round-trips:\n%r\n%r" % (argv, want))
    # Pod 0's DNS name is <hostname>.<subdomain>, hostname <job>-<index>.
    master_host = want[7].rsplit(":", 1)[0]
    check(master_host == "%s-0.%s" % (job["metadata"]["name"], ps["subdomain"]),
          "master is pod 0's DNS name")

    check("Secret" not in [d["kind"] for d in docs], "no Secret beside --token-secret")

    # The minimal form: no GPUs, RDMA or shm limit; a Secret with a generated token.
    rc, out, err = run("k8s", "--name", "j", "--nodes", "1", "--nproc-per-node", "2", "--image",
                       "img", "--", "python3", "t.py")
    check(rc == 0, "minimal k8s: " + err)
    docs = [d for d in yaml.safe_load_all(out) if d is not None]
    check([d["kind"] for d in docs] == ["Secret", "Service", "Job"], "Secret, Service and Job")
    job = [d for d in docs if d["kind"] == "Job"][0]
    c = job["spec"]["template"]["spec"]["containers"][0]
    check("resources" not in c and "securityContext" not in c,
          "minimal k8s has no resources or capabilities")
    secret = [d for d in docs if d["kind"] == "Secret"][0]
    check(secret["metadata"]["name"] == "j-token" and secret["type"] == "Opaque" and
          secret["metadata"]["labels"] == {"cohort.job": "j"}, "the Secret j-token")
    token = secret["stringData"]["token"]
    check(re.fullmatch(r"[0-9a-f]{32}", token) is not None, "a generated token: %r" % token)
    check(c["env"] == [{"name": "COHORT_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "j-token", "key": "token"}}}], "the pods read COHORT_TOKEN from the Secret")
    rc, again, err = run("k8s", "--name", "j", "--nodes", "1", "--nproc-per-node", "2", "--image",
                         "img", "--", "python3", "t.py")
    other = [d for d in yaml.safe_load_all(again) if d and d["kind"] == "Secret"][0]
    check(other["stringData"]["token"] != token, "every manifest has a token of its own")
    check("annotations" not in job["spec"]["template"]["metadata"], "no network annotation")
    check(job["spec"]["template"]["spec"]["volumes"][0]["emptyDir"] == {"medium": "Memory"},
          "memory-backed /dev/shm without limit")
    check(c["command"][-3:] == ["--", "python3", "t.py"], "minimal command")
    check("--master" in c["command"] and c["command"][c["command"].index("--master") + 1]
          == "j-0.j:29400", "default port 29400")

    rc, out, err = run("k8s", "--name", "j", "--nodes", "2", "--nproc-per-node", "1", "--image",
                       "img", "--rdma", "ib", "--", "x")
    job = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Job"][0]
    c = job["spec"]["template"]["spec"]["containers"][0]
    check(rc == 0 and c["resources"]["limits"] == {"rdma/rdma": 1}, "ib: rdma resource")
    check("annotations" not in job["spec"]["template"]["metadata"], "ib: no roce network")


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


RECORDER = """#!/usr/bin/python3
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
"""


# A recorder that also notes the COHORT_TOKEN it was given.
RECORDER_TOKEN = """#!/usr/bin/python3
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps([os.environ.get("COHORT_TOKEN"), os.path.basename(sys.argv[0])]
                       + sys.argv[1:]) + "\\n")
"""


def test_slurm():
    rc, out, err = run("slurm", "--nodes", "4", "--nproc-per-node", "8", "--time", "1-12:00:00",
                       "--partition", "gpu", "--job-name", "gpt2", "--gpus-per-node", "8", "--",
                       *AWKWARD)
    check(rc == 0 and err == "", "slurm exits 0 silently: " + err)
    lines = out.splitlines()
    check(lines[0] == "#!/bin/bash", "shebang")
    # sbatch reads #SBATCH lines only before the first command.
    first_cmd = next(i for i, l in enumerate(lines) if l and not l.startswith("#"))
    sb = [l for l in lines[:first_cmd] if l.startswith("#SBATCH ")]
    opts = dict(l.split(None, 1)[1].split("=", 1) for l in sb)
    check(opts == {"--nodes": "4", "--ntasks-per-node": "1", "--time": "1-12:00:00",
                   "--partition": "gpu", "--job-name": "gpt2", "--gpus-per-node": "8"},
          "#SBATCH options: %r" % opts)
    check(not any(l.startswith("#SBATCH") for l in lines[first_cmd:]), "no late #SBATCH")
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "job.sbatch")
        with open(script, "w") as f:
            f.write(out)
        p = subprocess.run(["bash", "-n", script], capture_output=True, timeout=30)
        check(p.returncode == 0, "bash -n accepts the script: %s" % p.stderr)
        # Run it with a recording srun: what reaches srun is what each node runs,
        # with the token srun passes on (made by `cohort token` unless exported).
        write_exe(os.path.join(d, "srun"), RECORDER_TOKEN)
        path = os.path.dirname(COHORT) + ":" + d + ":" + os.environ["PATH"]
        env = dict(os.environ, PATH=path, RECORD=os.path.join(d, "rec"))
        env.pop("COHORT_TOKEN", None)
        for exported in [None, "exported-token"]:
            if exported:
                env["COHORT_TOKEN"] = exported
            p = subprocess.run(["bash", script], env=env, capture_output=True, timeout=30)
            check(p.returncode == 0, "script runs: %s" % p.stderr)
        with open(os.path.join(d, "rec")) as f:
            calls = [json.loads(l) for l in f]
        want = ["srun", "--nodes=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "cohort",
                "run", "--nproc-per-node", "8", "--"] + AWKWARD
        check([c[1:] for c in calls] == [want, want],
              "srun line round-trips:\n%r\n%r" % (calls, [want]))
        check(re.fullmatch(r"[0-9a-f]{32}", calls[0][0] or "") is not None,
              "a fresh token when none is exported: %r" % calls[0][0])
        check(calls[1][0] == "exported-token", "the exported token is kept")
    rc, out, err = run("slurm", "--nodes", "1", "--nproc-per-node", "2", "--", "t")
    check(rc == 0 and "--time" not in out and "--partition" not in out and "--job-name" not in out,
          "optional #SBATCH lines absent")


def shell_commands(text):
    """Splits a shell text into commands: a newline inside quotes continues
    the command, comment lines are skipped."""
    cmds, pending = [], None
    for line in text.split("\n"):
        if pending is None and (not line or line.startswith("#")):
            continue
        pending = line if pending is None else pending + "\n" + line
        try:
            cmds.append((pending, shlex.split(pending)))
            pending = None
        except ValueError:
            pass
    check(pending is None, "unterminated quote in %r" % text)
    return cmds


def test_docker():
    rc, out, err = run("docker", "--nodes", "3", "--nproc-per-node", "8", "--image",
                       "egoldne7/pytorch:latest", "--master-addr", "10.1.2.3", "--gpus", "all",
                       "--shm", "8G", "--rdma", "--", *AWKWARD)
    check(rc == 0 and err == "", "docker exits 0 silently: " + err)
    runs = shell_commands(out)
    check(len(runs) == 4, "the env file's line, then one docker line per node")
    envline, runs = runs[0][1], runs[1:]
    check(envline[:5] == ["(umask", "077", "&&", "printf", "COHORT_TOKEN=%s\\n"] and
          envline[6:] == [">", "cohort-job.env)"] and
          re.fullmatch(r"[0-9a-f]{32}", envline[5]) is not None, "the env file's line: %r" % envline)
    check(envline[5] not in "".join(line for line, _ in runs), "no token on docker's lines")
    for rank, (line, a) in enumerate(runs):
        check(a[:2] == ["docker", "run"], "docker run")
        i = a.index("egoldne7/pytorch:latest")
        flags = a[2:i]
        check("--ipc" not in flags, "node %d: no --ipc host beside --shm-size" % rank)
        for f in [["--network", "host"], ["--ulimit", "memlock=-1:-1"],
                  ["--shm-size", "8g"], ["--gpus", "all"], ["--device", "/dev/infiniband"],
                  ["--cap-add", "IPC_LOCK"], ["--env-file", "cohort-job.env"]]:
            check(any(flags[k:k + 2] == f for k in range(len(flags))), "node %d: %r" % (rank, f))
        want = ["cohort", "run", "--nnodes", "3", "--node-rank", str(rank), "--master",
                "10.1.2.3:29400", "--nproc-per-node", "8", "--"] + AWKWARD
        check(a[i + 1:] == want, "node %d command round-trips" % rank)
    # bash agrees with shlex: run the lines with a recording docker.
    with tempfile.TemporaryDirectory() as d:
        write_exe(os.path.join(d, "docker"), RECORDER)
        env = dict(os.environ, PATH=d + ":" + os.environ["PATH"], RECORD=os.path.join(d, "rec"))
        p = subprocess.run(["bash", "-c", out], env=env, capture_output=True, timeout=30, cwd=d)
        check(p.returncode == 0, "docker lines run in bash: %s" % p.stderr)
        with open(os.path.join(d, "rec")) as f:
            calls = [json.loads(l) for l in f]
        check(calls == [a for _, a in runs], "bash and shlex agree")
        envfile = os.path.join(d, "cohort-job.env")
        with open(envfile) as f:
            check(f.read() == "COHORT_TOKEN=%s\n" % envline[5], "the env file holds the token")
        check(os.stat(envfile).st_mode & 0o777 == 0o600, "the env file is private")
    rc, out, err = run("docker", "--nodes", "2", "--nproc-per-node", "1", "--image", "i",
                       "--master-addr", "head", "--port", "1234", "--", "t")
    runs = [a for _, a in shell_commands(out)][1:]
    check(rc == 0 and all("--gpus" not in r and "--device" not in r and "--shm-size" not in r
                          for r in runs), "docker without gpus, rdma, shm")
    check(all(r[r.index("--master") + 1] == "head:1234" for r in runs), "docker --port")
    check(all(r[r.index("--ipc") + 1] == "host" for r in runs), "docker --ipc host without --shm")


def test_bad_flags():
    base_k8s = ["k8s", "--name", "j", "--nodes", "2", "--nproc-per-node", "1", "--image", "i"]
    base_docker = ["docker", "--nodes", "2", "--nproc-per-node", "1", "--image", "i",
                   "--master-addr", "h"]
    bad = [
        [], ["pbs"], ["k8s"], ["k8s", "--bogus"], ["k8s", "--nodes"],
        base_k8s + ["--", ], base_k8s + ["python3"], base_k8s[:-2] + ["--", "x"],
        ["k8s", "--nodes", "2", "--nproc-per-node", "1", "--image", "i", "--", "x"],
        base_k8s[:4] + ["--image", "i", "--", "x"],
        ["k8s", "--name", "J", "--nodes", "2", "--nproc-per-node", "1", "--image", "i", "--", "x"],
        base_k8s + ["--rdma", "iwarp", "--", "x"], base_k8s + ["--shm", "lots", "--", "x"],
        base_k8s + ["--gpus", "-1", "--", "x"], base_k8s + ["--port", "70000", "--", "x"],
        base_k8s + ["--token-secret", "A B", "--", "x"], base_k8s + ["-x", "--", "x"],
        ["k8s", "--name", "j", "--nodes", "two", "--nproc-per-node", "1", "--image", "i", "--",
         "x"],
        ["k8s", "--name", "j", "--nodes", "0", "--nproc-per-node", "1", "--image", "i", "--", "x"],
        ["slurm", "--nodes", "2", "--", "x"],
        ["slurm", "--nodes", "2", "--nproc-per-node", "1", "--time", "1h", "--", "x"],
        ["slurm", "--nodes", "2", "--nproc-per-node", "1", "--job-name", "a b", "--", "x"],
        ["slurm", "--nodes", "2", "--nproc-per-node", "1", "--image", "i", "--", "x"],
        base_docker[:-2] + ["--", "x"], base_docker + ["--rdma", "roce", "--", "x"],
        base_docker[:-1] + ["bad host", "--", "x"], base_docker + ["--", "\udcff"],
    ]
    for args in bad:
        try:
            p = subprocess.run([COHORT, "manifest", *args], capture_output=True, timeout=30)
        except UnicodeEncodeError:
            # Invalid UTF-8 in an argument: pass the raw bytes.
            p = subprocess.run([os.fsencode(COHORT), b"manifest"] +
                               [a.encode("utf-8", "surrogateescape") for a in args],
                               capture_output=True, timeout=30)
        e = p.stderr.decode("utf-8", "replace")
        check(p.returncode == 2, "exit 2 for %r (got %d)" % (args, p.returncode))
        check(e.count("\n") == 1 and e.endswith("\n") and e.startswith("cohort manifest"),
              "one-line error for %r: %r" % (args, e))
        check(p.stdout == b"", "no output for %r" % (args,))
    for args in [["--help"], ["k8s", "--help"], ["slurm", "-h"], ["docker", "--help"]]:
        rc, out, err = run(*args)
        check(rc == 0 and out.startswith("usage: cohort manifest"), "help for %r" % (args,))


def random_args(rng, count):
    """Random valid-UTF-8 arguments: every ASCII byte but NUL, characters
    YAML treats specially, and random code points of every plane."""
    pool = [chr(c) for c in range(1, 128)] + ["\u0085", "\u00a0", "\u2028", "\u2029",
                                             "\ufeff", "\ufffe", "\uffff", "\U0001f600",
                                             "\U0010fffd", "é", "☃", "$(", "$$", "'", '"']
    out = []
    for _ in range(count):
        n = rng.randrange(0, 12)
        chars = []
        for _ in range(n):
            if rng.random() < 0.8:
                chars.append(rng.choice(pool))
            else:
                c = rng.randrange(0x80, 0x110000)
                chars.append(chr(c) if not 0xD800 <= c <= 0xDFFF else "x")
        out.append("".join(chars))
    return out


def test_random_roundtrip():
    import random
    rng = random.Random(20261122)
    for trial in range(20):
        args = random_args(rng, 8)
        rc, out, err = run("k8s", "--name", "r", "--nodes", "2", "--nproc-per-node", "1",
                           "--image", "i", "--", *args)
        check(rc == 0, "random k8s %d: %s" % (trial, err))
        job = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Job"][0]
        cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
        got = [k8s_expand(a, {"JOB_COMPLETION_INDEX": "1"}) for a in cmd]
        check(got[got.index("--") + 1:] == args, "random k8s %d round-trips %r" % (trial, args))
        for kind in ("slurm", "docker"):
            extra = ["--image", "i", "--master-addr", "h"] if kind == "docker" else []
            rc, out, err = run(kind, "--nodes", "1", "--nproc-per-node", "1", *extra, "--",
                               *args)
            check(rc == 0, "random %s %d: %s" % (kind, trial, err))
            with tempfile.TemporaryDirectory() as d:
                write_exe(os.path.join(d, "srun" if kind == "slurm" else "docker"), RECORDER)
                path = d + ":" + os.path.dirname(COHORT) + ":" + os.environ["PATH"]
                env = dict(os.environ, PATH=path, RECORD=os.path.join(d, "rec"))
                p = subprocess.run(["bash", "-c", out], env=env, capture_output=True, timeout=30,
                                   cwd=d)
                with open(os.path.join(d, "rec")) as f:
                    call = json.loads(f.readline())
            check(p.returncode == 0 and call[len(call) - len(args):] == args and
                  call[len(call) - len(args) - 1] == "--",
                  "random %s %d round-trips through bash %r" % (kind, trial, args))


test_k8s()
test_random_roundtrip()
test_slurm()
test_docker()
test_bad_flags()
sys.exit(report())
