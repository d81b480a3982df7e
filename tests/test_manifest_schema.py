#!/usr/bin/python3
"""test_manifest_schema.py COHORT SCHEMA_DIR - every Kubernetes kind of
`cohort manifest` against the real schemas of the APIs it targets.

The schemas (tests/schemas/README.md says where each comes from):
  k8s-core-batch.json   Job, Service, Secret and all they reference, from the
                        OpenAPI of k8s.io/api v0.36.2 (Kubernetes 1.36)
  trainjob.json, trainingruntime.json  Kubeflow Trainer v2.3.0's CRDs
  jobset.json           JobSet v0.12.0's CRD
  pytorchjob.json       Training Operator v1.9.0's CRD
  podmonitor.json       Prometheus Operator v0.93.0's PodMonitor CRD
Every object is validated strictly, as `kubectl apply` (field validation
Strict, its default) treats it: an object schema with properties and no
additionalProperties or x-kubernetes-preserve-unknown-fields accepts no other
field. Objects of the CRDs have their metadata checked against ObjectMeta.
CEL rules (x-kubernetes-validations) are not evaluated.

The same validator must reject broken copies of the output (an unknown field,
a wrong type, a missing required field), so that the test can fail.
"""
import copy
import json
import os
import subprocess
import sys

import jsonschema
import yaml

from checks import check, report

COHORT = os.path.abspath(sys.argv[1])
SCHEMAS = sys.argv[2]


def closed(node):
    """The schema with strict field validation: objects that list their
    properties take no others."""
    if isinstance(node, list):
        return [closed(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: closed(v) for k, v in node.items()}
    if ("properties" in out and "additionalProperties" not in out and
            not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def load(name):
    with open(os.path.join(SCHEMAS, name)) as f:
        return json.load(f)


CORE = closed(load("k8s-core-batch.json"))


def core_validator(definition):
    schema = {"$ref": "#/definitions/" + definition, "definitions": CORE["definitions"]}
    return jsonschema.Draft7Validator(schema)


META = core_validator("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
VALIDATORS = {
    ("v1", "Secret"): core_validator("io.k8s.api.core.v1.Secret"),
    ("v1", "Service"): core_validator("io.k8s.api.core.v1.Service"),
    ("batch/v1", "Job"): core_validator("io.k8s.api.batch.v1.Job"),
}
for crd in ["trainjob", "trainingruntime", "jobset", "pytorchjob", "podmonitor"]:
    doc = load(crd + ".json")
    VALIDATORS[(doc["apiVersion"], doc["kind"])] = jsonschema.Draft7Validator(
        closed(doc["schema"]))
CRD_KINDS = {k for k in VALIDATORS if "." in k[0].split("/")[0]}


def errors(obj):
    """The schema's complaints about one object, as readable lines."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in VALIDATORS:
        return ["no schema for %r" % (key,)]
    found = ["%s: %s" % ("/".join(map(str, e.absolute_path)), e.message)
             for e in VALIDATORS[key].iter_errors(obj)]
    if key in CRD_KINDS:
        found += ["metadata/%s: %s" % ("/".join(map(str, e.absolute_path)), e.message)
                  for e in META.iter_errors(obj.get("metadata", {}))]
    return found


def manifest(*args):
    p = subprocess.run([COHORT, "manifest", *args], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0 and p.stderr == "", "manifest %r: %s" % (args, p.stderr))
    return [d for d in yaml.safe_load_all(p.stdout) if d is not None]


BASE = ["--name", "gpt2", "--nodes", "3", "--nproc-per-node", "8", "--image",
        "registry.example/ml/cohort:1.2"]
CMD = ["--", "python3", "train.py", "--lr", "$(LR)", "it's \"quoted\"", "ünï"]
# The option combinations the kinds are checked with.
COMBOS = [
    [],
    ["--gpus", "8", "--rdma", "roce", "--shm", "16G", "--token-secret", "gpt2-token",
     "--hang-timeout", "300", "--metrics-port", "9400", "--pod-monitor"],
    ["--rdma", "ib", "--metrics-port", "9090", "--shm", "512M"],
    ["--gpus", "1", "--hang-timeout", "60"],
]
KINDS = {
    "k8s": ["Secret", "Service", "Job"],
    "jobset": ["Secret", "JobSet"],
    "trainjob": ["Secret", "TrainingRuntime", "TrainJob"],
    "pytorchjob": ["Secret", "PyTorchJob"],
}


def test_kinds():
    for kind, objects in KINDS.items():
        for combo in COMBOS:
            docs = manifest(kind, *BASE, *combo, *CMD)
            want = [o for o in objects if o != "Secret" or "--token-secret" not in combo]
            want += ["PodMonitor"] if "--pod-monitor" in combo else []
            check([d["kind"] for d in docs] == want,
                  "%s %r: objects %r" % (kind, combo, [d["kind"] for d in docs]))
            for d in docs:
                errs = errors(d)
                check(errs == [], "%s %r: %s %s fails its schema:\n  %s" %
                      (kind, combo, d["kind"], d["metadata"]["name"], "\n  ".join(errs[:10])))
    # One node: a PyTorchJob of a Master alone.
    docs = manifest("pytorchjob", "--name", "one", "--nodes", "1", "--nproc-per-node", "2",
                    "--image", "img", "--", "x")
    check(errors(docs[-1]) == [] and list(docs[-1]["spec"]["pytorchReplicaSpecs"]) == ["Master"],
          "pytorchjob of one node: a Master alone")


def broken(doc, path, value):
    """A copy of doc with the field at path (a list of keys) set to value, or
    removed when value is None."""
    d = copy.deepcopy(doc)
    node = d
    for k in path[:-1]:
        node = node[k]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return d


def test_validator_rejects():
    """The validator fails what the API server would refuse."""
    pod = ["spec", "template", "spec"]
    job = manifest("k8s", *BASE, *CMD)[-1]
    cases = [
        ("an unknown container field", job, pod + ["containers", 0, "comand"], ["x"]),
        ("completions as a string", job, ["spec", "completions"], "3"),
        ("a container without a name", job, pod + ["containers", 0, "name"], None),
        ("an unknown Job spec field", job, ["spec", "indexed"], True),
    ]
    js = manifest("jobset", *BASE, *CMD)[-1]
    rj = ["spec", "replicatedJobs", 0]
    cases += [
        ("a JobSet replicated Job without a name", js, rj + ["name"], None),
        ("an unknown field in JobSet's pod", js, rj + ["template", "spec"] + pod[1:] +
         ["hostNet"], True),
        ("an unknown label type in JobSet's metadata", js, ["metadata", "labels"], {"a": 1}),
    ]
    tj = manifest("trainjob", *BASE, *CMD)[-1]
    cases += [
        ("a TrainJob's numNodes as a string", tj, ["spec", "trainer", "numNodes"], "3"),
        ("a TrainJob without runtimeRef", tj, ["spec", "runtimeRef"], None),
        ("an unknown TrainJob trainer field", tj, ["spec", "trainer", "ports"], [1]),
    ]
    pj = manifest("pytorchjob", *BASE, *CMD)[-1]
    cases += [
        ("an unknown PyTorchJob replica type field", pj,
         ["spec", "pytorchReplicaSpecs", "Master", "replica"], 1),
        ("a PyTorchJob container's port as text", pj,
         ["spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0, "ports",
          0, "containerPort"], "29400"),
    ]
    pm = manifest("jobset", *BASE, "--metrics-port", "9400", "--pod-monitor", *CMD)[-1]
    check(pm["kind"] == "PodMonitor", "--pod-monitor prints a PodMonitor last")
    check(pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics" and
          pm["spec"]["selector"]["matchLabels"] == {"cohort.job": "gpt2"},
          "the PodMonitor selects the job's pods and their port named metrics")
    cases += [
        ("a PodMonitor without a selector", pm, ["spec", "selector"], None),
        ("a PodMonitor endpoint's unknown field", pm, ["spec", "podMetricsEndpoints", 0,
                                                       "ports"], "metrics"),
    ]
    for what, doc, path, value in cases:
        check(errors(doc) == [], "the unbroken %s validates" % doc["kind"])
        check(errors(broken(doc, path, value)) != [], "the validator rejects %s" % what)


test_kinds()
test_validator_rejects()
sys.exit(report())
