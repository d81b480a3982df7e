#!/usr/bin/python3
"""extract.py SRC_DIR OUT_DIR - the schemas under tests/schemas/ from the
upstream files named in README.md (SRC_DIR holds them under the names used
there). Keeps the validating keywords as they are and drops only the
human-readable "description" texts, to keep the copies small:
  k8s-core-batch.json  the definitions Job, Service, Secret and everything
                       they reference, "$ref"s rewritten to "#/definitions/"
  <kind>.json          the openAPIV3Schema of each CRD's served version
"""
import json
import os
import sys

import yaml

SRC, OUT = sys.argv[1], sys.argv[2]
CRDS = {"trainjob": "trainjobs.yaml", "trainingruntime": "trainingruntimes.yaml",
        "jobset": "jobsets.yaml", "pytorchjob": "pytorchjobs.yaml",
        "podmonitor": "podmonitors.yaml"}
ROOTS = ["io.k8s.api.batch.v1.Job", "io.k8s.api.core.v1.Service", "io.k8s.api.core.v1.Secret"]


def strip(node):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "description" and isinstance(v, str):
                continue
            if k == "$ref" and isinstance(v, str):
                v = v.replace("#/components/schemas/", "#/definitions/")
            out[k] = strip(v)
        return out
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def refs(node, found):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                found.add(v.rsplit("/", 1)[1])
            else:
                refs(v, found)
    elif isinstance(node, list):
        for v in node:
            refs(v, found)


def write(name, doc):
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(doc, f, sort_keys=True, separators=(",", ":"))
        f.write("\n")


def main():
    with open(os.path.join(SRC, "trainer-swagger.json")) as f:
        schemas = json.load(f)["components"]["schemas"]
    keep, todo = set(), list(ROOTS)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        found = set()
        refs(schemas[name], found)
        todo.extend(found - keep)
    write("k8s-core-batch.json", {"definitions": {k: strip(schemas[k]) for k in sorted(keep)}})
    for kind, fname in CRDS.items():
        with open(os.path.join(SRC, fname)) as f:
            crd = yaml.safe_load(f)
        served = [v for v in crd["spec"]["versions"] if v.get("storage")]
        write(kind + ".json", {"apiVersion": crd["spec"]["group"] + "/" + served[0]["name"],
                               "kind": crd["spec"]["names"]["kind"],
                               "schema": strip(served[0]["schema"]["openAPIV3Schema"])})


main()
