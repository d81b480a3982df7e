#!/usr/bin/env python3
"""Validates `cohort doctor --json` against docs/doctor.schema.json.

usage: test_doctor_schema.py COHORT_BINARY FIXTURES_DIR SCHEMA
       test_doctor_schema.py --validate DOCUMENT SCHEMA   (one document, e.g.
       a real node's, as scripts/device-check.sh does: exit 0 when it conforms)

A small validator for the subset of JSON Schema the schema uses (type,
const, enum, pattern, minLength, minimum, properties, required,
additionalProperties false, items, anyOf); any other keyword is refused so
the schema cannot silently outgrow it. The validator first proves itself on
documents broken on purpose, then checks every fixture's output (and this
machine's) against the schema and against the derivation each fixture
expects. Prints 'N passed, N failed'.
"""
import copy
import json
import os
import re
import subprocess
import sys

from checks import check, report

ANNOTATIONS = {"$schema", "$id", "title", "description"}
KNOWN = ANNOTATIONS | {"type", "const", "enum", "pattern", "minLength", "minimum", "properties",
                       "required", "additionalProperties", "items", "anyOf"}
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(v, s, path="$"):
    """Returns a list of error strings (empty when v conforms to s)."""
    unknown = set(s) - KNOWN
    if unknown:
        raise ValueError("schema keyword(s) %s at %s not supported" % (sorted(unknown), path))
    errs = []
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(TYPES[t](v) for t in types):
            return ["%s: %r is not of type %s" % (path, v, types)]
    if "const" in s and v != s["const"]:
        errs.append("%s: %r is not %r" % (path, v, s["const"]))
    if "enum" in s and v not in s["enum"]:
        errs.append("%s: %r is not one of %r" % (path, v, s["enum"]))
    if isinstance(v, str):
        if "pattern" in s and re.search(s["pattern"], v) is None:
            errs.append("%s: %r does not match %s" % (path, v, s["pattern"]))
        if "minLength" in s and len(v) < s["minLength"]:
            errs.append("%s: %r is shorter than %d" % (path, v, s["minLength"]))
    if TYPES["number"](v) and "minimum" in s and v < s["minimum"]:
        errs.append("%s: %r is below %r" % (path, v, s["minimum"]))
    if isinstance(v, dict):
        for k in s.get("required", []):
            if k not in v:
                errs.append("%s: missing %s" % (path, k))
        props = s.get("properties", {})
        for k, sub in v.items():
            if k in props:
                errs += validate(sub, props[k], "%s.%s" % (path, k))
            elif s.get("additionalProperties", True) is False:
                errs.append("%s: unexpected property %s" % (path, k))
    if isinstance(v, list) and "items" in s:
        for i, item in enumerate(v):
            errs += validate(item, s["items"], "%s[%d]" % (path, i))
    if "anyOf" in s and not any(not validate(v, alt, path) for alt in s["anyOf"]):
        errs.append("%s: %r matches none of anyOf" % (path, v))
    return errs


def run(binary, args, env=None):
    p = subprocess.run([binary, "doctor"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env or {"PATH": "/usr/bin:/bin"}, timeout=60)
    return p.returncode, p.stdout.decode()


def structural(doc, label):
    """Invariants the schema cannot express."""
    check(doc["ok"] == (doc["errors"] == []), "%s: ok agrees with errors" % label)
    names = [s["name"] for s in doc["settings"]]
    check(len(names) == len(set(names)), "%s: setting names unique" % label)
    check(not set(names) & {k["name"] for k in doc["kept"]}, "%s: kept never in settings" % label)
    s = doc["summary"]
    gid = "none" if s["gid_index"] is None else str(s["gid_index"])
    check(s["text"] == "link=%s;hca=%s;gid=%s" % (s["link"], s["hca"], gid),
          "%s: summary text matches its fields" % label)
    active = ["%s:%d" % (h["name"], p["port"]) for h in doc["rdma"] for p in h["ports"] if p["active"]]
    check(s["hca"] == ",".join(active), "%s: summary HCA set is the active ports" % label)
    for h in doc["rdma"]:
        for p in h["ports"]:
            check(p["active"] == (p["state"] == 4), "%s: active means state 4" % label)
            idx = [g["index"] for g in p["gids"]]
            check(idx == sorted(idx), "%s: GIDs in numeric order" % label)
    names = [c["name"] for c in doc["checks"]]
    check(names == CHECKS, "%s: every check once, in order: %s" % (label, names))
    settings = [c for c in doc["checks"] if c["name"] == "settings"]
    check(settings and (settings[0]["status"] == "fail") == (not doc["ok"]),
          "%s: the settings check fails exactly when ok is false" % label)
    g = doc["gpus"]
    check([d["index"] for d in g["devices"]] == list(range(len(g["devices"]))),
          "%s: GPU indices count from 0" % label)
    check(len(g["devices"]) <= g["found"], "%s: no more GPUs visible than found" % label)
    check(all(d["vendor"] == g["vendor"] and d["driver"] == g["driver"] for d in g["devices"]),
          "%s: each GPU carries the node's vendor and driver" % label)
    check((g["vendor"] is None) == (g["found"] == 0), "%s: a vendor exactly when GPUs" % label)


def self_test(schema, good):
    check(validate(good, schema) == [], "validator accepts a good document")
    broken = []
    d = copy.deepcopy(good); del d["summary"]; broken.append(("missing summary", d))
    d = copy.deepcopy(good); d["ok"] = "yes"; broken.append(("ok as a string", d))
    d = copy.deepcopy(good); d["extra"] = 1; broken.append(("extra property", d))
    d = copy.deepcopy(good); d["summary"]["link"] = "token-ring"; broken.append(("bad enum", d))
    d = copy.deepcopy(good); d["summary"]["gid_index"] = -3; broken.append(("negative gid", d))
    d = copy.deepcopy(good); d["settings"].append({"name": "lower", "value": "1", "reason": "r"})
    broken.append(("bad name pattern", d))
    d = copy.deepcopy(good); d["limits"]["memlock"] = "lots"; broken.append(("memlock anyOf", d))
    d = copy.deepcopy(good); d["rdma"][0]["ports"][0]["gids"][0]["index"] = True
    broken.append(("bool as integer", d))
    d = copy.deepcopy(good); d["schema"] = "cohort-doctor/1"; broken.append(("schema 1", d))
    d = copy.deepcopy(good); del d["gpus"]; broken.append(("no gpus", d))
    d = copy.deepcopy(good); d["checks"][0]["status"] = "FAILED"; broken.append(("bad status", d))
    d = copy.deepcopy(good); d["checks"][0]["detail"] = "two\nlines"; broken.append(("two lines", d))
    d = copy.deepcopy(good); d["checks"][0]["name"] = "made-up"; broken.append(("unknown check", d))
    d = copy.deepcopy(good); d["rdma"][0]["numa_node"] = -1; broken.append(("numa -1", d))
    if good["gpus"]["devices"]:
        d = copy.deepcopy(good); d["gpus"]["devices"][0]["pci"] = "3b:00"
        broken.append(("bad GPU PCI address", d))
        d = copy.deepcopy(good); del d["gpus"]["devices"][0]["numa_node"]
        broken.append(("GPU without NUMA node", d))
        d = copy.deepcopy(good); d["gpus"]["cuda_library"] = {"path": "/x", "version": "1"}
        broken.append(("a libcuda version without a dot", d))
    for what, doc in broken:
        check(validate(doc, schema) != [], "validator rejects a document with %s" % what)


CHECKS = ["gpu-driver", "gpu-visible", "nccl-library", "rdma-devices", "rdma-ports", "memlock",
          "gpu-hca-numa", "nccl-ib-hca", "nccl-ib-gid-index", "nccl-socket-ifname", "settings"]

# fixture, extra arguments, exit status, expected settings (None: must be absent), summary gid
CASES = [
    ("roce_bond", [], 0, {"NCCL_IB_HCA": "mlx5_bond_0:1", "NCCL_IB_GID_INDEX": "9",
                          "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": None}, 9),
    ("roce_bond", ["--master", "10.20.0.1"], 0, {"NCCL_SOCKET_IFNAME": "net1",
                                                  "GLOO_SOCKET_IFNAME": "net1"}, 9),
    ("ib_hdr4", [], 0, {"NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
                        "NCCL_IB_GID_INDEX": None, "NCCL_SOCKET_IFNAME": "eno1"}, None),
    ("port_down", [], 0, {"NCCL_IB_HCA": "mlx5_0:1"}, None),
    ("no_rdma", [], 0, {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0",
                        "UCX_NET_DEVICES": "eth0", "NCCL_SOCKET_NTHREADS": "4",
                        "NCCL_NSOCKS_PERTHREAD": "8"}, None),
    ("no_rdma", ["--master", "172.16.0.9"], 0, {"NCCL_SOCKET_IFNAME": "=eth1"}, None),
    ("gid_many", [], 0, {"NCCL_IB_GID_INDEX": None}, 3),
    ("gid_many", ["--set-gid-index"], 0, {"NCCL_IB_GID_INDEX": "3"}, 3),
    ("gid_many", ["--set-gid-index", "--master", "10.200.0.1"], 0, {"NCCL_IB_GID_INDEX": "11"}, 11),
    ("roce_single", [], 0, {"NCCL_IB_GID_INDEX": "1"}, 1),
    ("roce_none", [], 1, {"NCCL_IB_GID_INDEX": None}, None),
    ("gpu_ib", [], 0, {"NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1"}, None),
    ("gpu_broken", [], 0, {"NCCL_IB_HCA": "mlx5_0:1"}, None),
    ("ib_down", [], 0, {"NCCL_IB_DISABLE": "1"}, None),
]

# fixture: the checks' statuses that --json reports (the rest: ok or n/a), and the GPUs
# (PCI address, NUMA node), the driver and libcuda's version.
CHECK_CASES = {
    "gpu_ib": ({}, [("0000:18:00.0", 0), ("0000:98:00.0", 1)], "580.159.04", "580.159.04"),
    "gpu_broken": ({"gpu-driver": "fail", "nccl-library": "fail", "memlock": "fail",
                    "gpu-hca-numa": "warn"},
                   [("0000:98:00.0", 1), ("0000:99:00.0", 1)], "580.159.04", "570.86.15"),
    "no_rdma": ({"gpu-driver": "warn", "nccl-library": "fail"},
                [("0000:3b:00.0", 1), ("0000:86:00.0", 0)], "580.159.04", None),
    "ib_down": ({"rdma-ports": "fail"}, [], None, None),
    "roce_single": ({"rdma-devices": "fail", "memlock": "fail"}, [], None, None),
    "roce_none": ({"settings": "fail"}, [], None, None),
}


def check_checks(doc, name, label):
    """The verdicts and GPU facts a fixture is made to give."""
    if name not in CHECK_CASES:
        return
    want, gpus, driver, cuda = CHECK_CASES[name]
    got = {c["name"]: c["status"] for c in doc["checks"]}
    for k in CHECKS:
        if k in want:
            check(got.get(k) == want[k], "%s: check %s is %r, expected %r" % (label, k, got.get(k), want[k]))
        else:
            check(got.get(k) in ("ok", "n/a"), "%s: check %s is %r, expected ok or n/a" % (label, k, got.get(k)))
    g = doc["gpus"]
    check([(d["pci"], d["numa_node"]) for d in g["devices"]] == gpus,
          "%s: GPUs %r, expected %r" % (label, g["devices"], gpus))
    check(g["driver"] == driver, "%s: driver %r, expected %r" % (label, g["driver"], driver))
    lib = g["cuda_library"]["version"] if g["cuda_library"] else None
    check(lib == cuda, "%s: libcuda %r, expected %r" % (label, lib, cuda))


def validate_one(path, schema_path):
    """--validate: one document against the schema; the errors, one a line."""
    with open(schema_path) as f:
        schema = json.load(f)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print("%s: not a JSON document: %s" % (path, e))
        return 1
    errs = validate(doc, schema)
    for e in errs:
        print("%s: %s" % (path, e))
    if not errs:
        print("%s conforms to %s" % (path, doc.get("schema")))
    return 1 if errs else 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--validate":
        return validate_one(sys.argv[2], sys.argv[3])
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    binary, fixtures, schema_path = sys.argv[1:]
    with open(schema_path) as f:
        schema = json.load(f)
    first = True
    for name, extra, status, expect, gid in CASES:
        root = os.path.join(fixtures, name)
        args = ["--json", "--sysfs-root", root + "/sys", "--proc-root", root + "/proc",
                "--dev-root", root + "/dev", "--lib-root", root + "/lib",
                "--ifaddrs", root + "/ifaddrs"] + extra
        label = " ".join([name] + extra)
        rc, out = run(binary, args)
        check(rc == status, "%s: exit status %d, expected %d" % (label, rc, status))
        try:
            doc = json.loads(out)
        except ValueError as e:
            check(False, "%s: output is JSON (%s)" % (label, e))
            continue
        errs = validate(doc, schema)
        check(errs == [], "%s: conforms to the schema: %s" % (label, errs[:3]))
        structural(doc, label)
        if not extra:
            check_checks(doc, name, label)
        settings = {s["name"]: s["value"] for s in doc["settings"]}
        for k, v in expect.items():
            check(settings.get(k) == v, "%s: %s is %r, expected %r" % (label, k, settings.get(k), v))
        check(doc["summary"]["gid_index"] == gid,
              "%s: summary gid_index %r, expected %r" % (label, doc["summary"]["gid_index"], gid))
        if first and doc["rdma"] and doc["rdma"][0]["ports"][0]["gids"] and doc["gpus"]["devices"]:
            self_test(schema, doc)
            first = False

    check(not first, "the validator proved itself on a fixture with GPUs and GIDs")

    # This machine: runs, conforms, and without an active RDMA port disables IB.
    rc, out = run(binary, ["--json"])
    check(rc == 0, "real machine: exit status %d" % rc)
    try:
        doc = json.loads(out)
        check(validate(doc, schema) == [], "real machine: conforms to the schema")
        structural(doc, "real machine")
        if not any(p["active"] for h in doc["rdma"] for p in h["ports"]):
            check({s["name"]: s["value"] for s in doc["settings"]}.get("NCCL_IB_DISABLE") == "1",
                  "real machine without RDMA: NCCL_IB_DISABLE=1")
    except ValueError as e:
        check(False, "real machine: output is JSON (%s)" % e)

    return report()


if __name__ == "__main__":
    sys.exit(main())
