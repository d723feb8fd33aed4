"""The published schemas of the kinds in deploy/k8s/, vendored for offline validation.

No cluster and no network here, so the manifests are checked against the schemas a cluster would
apply, kept byte for byte under tests/data/k8s-schemas/ (SOURCES.md says where each came from):

- Service, ConfigMap, Job: yannh/kubernetes-json-schema's ``v1.31.0-standalone-strict`` files,
  Kubernetes' OpenAPI converted to JSON Schema with ``additionalProperties: false`` on every
  object, so a misspelled field is an error as ``kubectl apply`` (``--validate=strict``) makes it.
- LeaderWorkerSet: the ``openAPIV3Schema`` of the CRD kubernetes-sigs/lws v0.10.0 installs. A CRD
  schema does not forbid unknown fields in JSON Schema terms; the API server does (a field the
  structural schema does not name is pruned, or refused under strict field validation). The
  validator applies that rule, on a copy, to every object the schema lists properties for.

Both are validated as JSON Schema Draft 4: the yannh files come from OpenAPI v2 (whose schema
objects are Draft 4) and their ``$schema`` names no draft; a CRD's OpenAPI v3.0 schema object is
Draft 4's successor (Wright draft 00) and uses only keywords that mean the same in Draft 4.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import re
from functools import cache
from typing import Any

import jsonschema
import yaml

from tests.support import DATA

SCHEMAS = DATA / "k8s-schemas"
CORE = {
    ("v1", "Service"): "v1.31.0-standalone-strict/service-v1.json",
    ("v1", "ConfigMap"): "v1.31.0-standalone-strict/configmap-v1.json",
    ("batch/v1", "Job"): "v1.31.0-standalone-strict/job-batch-v1.json.gz",
}
LWS_CRD = "lws-v0.10.0/leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz"
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
# sha256 of each file as published (before gzip): a hand edit, or a trimmed schema, fails the pins.
PINNED = {
    CORE[("v1", "Service")]: "b55227d2c6695f73f16e1c7d6243ca87136de59987397b701ce31e72d68912af",
    CORE[("v1", "ConfigMap")]: "0e36f65157f453a2ae67bc1749f2300229aace9b5a42faa54b9b4d747301b9f8",
    CORE[("batch/v1", "Job")]: "b0769885f610ae9286161f75004469615619289b047b60edb1db680cfaca0a50",
    LWS_CRD: "c5dcad8ed943e495490241f00b9a1b45d51203b6d484020db3636d5bf553568e",
}
# Kubernetes object names that become DNS names (the LWS name names its StatefulSets, its headless
# Service and its pods' hostnames): an RFC 1035 label.
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def vendored(rel: str) -> bytes:
    """The published bytes of one vendored file (gzip undone)."""
    raw = (SCHEMAS / rel).read_bytes()
    return gzip.decompress(raw) if rel.endswith(".gz") else raw


def sha256(rel: str) -> str:
    return hashlib.sha256(vendored(rel)).hexdigest()


def strict_structural(schema: Any) -> Any:
    """A copy of a CRD schema where an object that lists ``properties`` admits no other field.

    Why: that is what the API server does with a structural schema (unknown fields pruned, or
    refused with ``kubectl apply``'s default strict validation); JSON Schema alone would accept
    ``contaners`` silently. Maps (``additionalProperties``) and preserve-unknown objects keep
    accepting any key, as they do in Kubernetes.
    """
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for key, value in node.items():
            if key == "properties":
                stack.extend(value.values())
            elif isinstance(value, (dict, list)):
                stack.append(value)
    return out


@cache
def core_validator(api_version: str, kind: str) -> jsonschema.Draft4Validator:
    schema = json.loads(vendored(CORE[(api_version, kind)]))
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


@cache
def lws_crd() -> dict[str, Any]:
    """The CRD document (1.3 MB of YAML: libyaml's safe loader where PyYAML has it)."""
    return yaml.load(vendored(LWS_CRD), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@cache
def lws_validator() -> jsonschema.Draft4Validator:
    """The CRD's v1 ``openAPIV3Schema``, with the API server's unknown-field rule applied."""
    (version,) = [v for v in lws_crd()["spec"]["versions"] if v["name"] == LWS[0].split("/")[1]]
    assert version["served"] and version["storage"], "LWS v1 is not the served, stored version"
    schema = strict_structural(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def _messages(validator: jsonschema.Draft4Validator, instance: Any, prefix: str = "") -> list[str]:
    """One line per error, its path written from the document's root (``prefix`` for a part of it)."""
    return [f"{prefix + e.json_path[1:] if prefix else e.json_path}: {e.message}"
            for e in validator.iter_errors(instance)]


def lws_errors(doc: dict[str, Any]) -> list[str]:
    """What the API server would refuse in a LeaderWorkerSet, from the CRD and by hand.

    The CRD's schema leaves ``metadata`` an untyped object (the API server checks ObjectMeta
    itself): it is checked against the ObjectMeta of the published Service schema, plus the name
    rule, and apiVersion/kind against the CRD's group, version and kind.
    """
    crd = lws_crd()["spec"]
    out = []
    if (doc.get("apiVersion"), doc.get("kind")) != (f"{crd['group']}/v1", crd["names"]["kind"]):
        out.append(f"$: apiVersion {doc.get('apiVersion')!r} kind {doc.get('kind')!r} is not "
                   f"{crd['group']}/v1 {crd['names']['kind']}")
    meta = doc.get("metadata") or {}
    object_meta = core_validator("v1", "Service").schema["properties"]["metadata"]
    out += _messages(jsonschema.Draft4Validator(object_meta), meta, "$.metadata")
    if not DNS_LABEL.match(str(meta.get("name", ""))):
        out.append(f"$.metadata.name: {meta.get('name')!r} is not a DNS label (it names pods and a Service)")
    return out + _messages(lws_validator(), doc)


def errors(doc: dict[str, Any]) -> list[str]:
    """Every schema error of one manifest document, by its apiVersion and kind; [] when valid."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key[1] == LWS[1]:  # any apiVersion: lws_errors names a version the CRD does not serve
        return lws_errors(doc)
    if key not in CORE:
        return [f"$: no vendored schema for apiVersion {key[0]!r} kind {key[1]!r}"]
    return _messages(core_validator(*key), doc)
