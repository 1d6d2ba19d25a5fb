"""Validate PyTorchJob / TrainJob / ClusterTrainingRuntime / RayJob / RayCluster / InferenceService / ServingRuntime bodies
against the real CRD openAPIV3Schema in
tests/cluster/specs/.

Mirrors what the Kubernetes API server does on create with strict field validation (kubectl's default since
1.27): the CRD's structural schema is checked (types, required, enum, pattern, int-or-string) and every field the
schema does not declare is reported as an unknown field, except below `x-kubernetes-preserve-unknown-fields`.
`metadata` is checked against the ObjectMeta fields a client may set. Of the CEL rules
(`x-kubernetes-validations`) the CRDs carry, `self in [...]` becomes an enum; `self == oldSelf` immutability rules
only apply to updates, and the rest (e.g. the TrainJob's RFC 1035 name of at most 63 characters, the runtimes'
rules across fields) are not checked here.
"""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SPECS = Path(__file__).resolve().parent / "specs"
CRD_FILES = ("kubeflow.org_pytorchjobs.v1.9.0.yaml", "trainer.kubeflow.org_trainjobs.v2.3.0.yaml",
             "trainer.kubeflow.org_clustertrainingruntimes.v2.3.0.yaml", "ray.io_rayjobs.v1.7.0.yaml",
             "ray.io_rayclusters.v1.7.0.yaml", "serving.kserve.io_inferenceservices.v0.20.0.yaml",
             "serving.kserve.io_servingruntimes.v0.20.0.yaml")

_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
# ObjectMeta as a client sends it on create (the server owns uid, resourceVersion, creationTimestamp ...).
_OBJECT_META = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _DNS_SUBDOMAIN},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63, "pattern": _DNS_SUBDOMAIN},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {
            "type": "object", "required": ["apiVersion", "kind", "name", "uid"],
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "name": {"type": "string"},
                           "uid": {"type": "string"}, "controller": {"type": "boolean"},
                           "blockOwnerDeletion": {"type": "boolean"}}}},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer"},
        "creationTimestamp": {"type": ["string", "null"]},
        "deletionTimestamp": {"type": ["string", "null"]},
        "managedFields": {"type": "array"},
    },
}


def _structural(node: Any) -> Any:
    """A CRD schema node rewritten as plain JSON Schema with the API server's strict unknown-field rule."""
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _structural(value) for key, value in node.items()
           if key not in ("properties", "x-kubernetes-validations", "default", "description")}
    if "properties" in node:
        out["properties"] = {name: _structural(sub) for name, sub in node["properties"].items()}
    for rule in node.get("x-kubernetes-validations", []):
        allowed = re.fullmatch(r"self in \[(.*)\]", rule["rule"])
        if allowed:
            out["enum"] = [value.strip().strip("'") for value in allowed.group(1).split(",")]
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    is_object = node.get("type") == "object"
    if is_object and not node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in node:
        out["additionalProperties"] = False  # structural schema: anything undeclared is an unknown field
    return out


@functools.cache
def _schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> JSON Schema of every served version of the CRDs in tests/cluster/specs/."""
    found = {}
    for file_name in CRD_FILES:
        # libyaml's loader: the RayJob and RayCluster CRDs (full pod specs per group) take seconds in pure Python
        crd = yaml.load((SPECS / file_name).read_text(), Loader=yaml.CSafeLoader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if not version.get("served", True):
                continue
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = _OBJECT_META
            found[(f"{group}/{version['name']}", kind)] = _structural(schema)
    return found


@functools.cache
def printer_columns(api_version: str, kind: str) -> list[dict]:
    """The CRD's ``additionalPrinterColumns`` of ``api_version``/``kind`` (name, type, jsonPath), [] when none."""
    for file_name in CRD_FILES:
        crd = yaml.load((SPECS / file_name).read_text(), Loader=yaml.CSafeLoader)
        for version in crd["spec"]["versions"]:
            if (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"]) == (api_version, kind):
                return version.get("additionalPrinterColumns", [])
    return []


def supported() -> list[tuple[str, str]]:
    """The (apiVersion, kind) pairs this module can validate."""
    return sorted(_schemas())


def _path(parts) -> str:
    return ".".join(f"[{part}]" if isinstance(part, int) else str(part) for part in parts).replace(".[", "[")


def _message(error: jsonschema.ValidationError) -> str:
    path = _path(error.absolute_path)
    if error.validator == "additionalProperties":
        declared = set(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - declared)
        prefix = f"{path}." if path else ""
        return "; ".join(f'{prefix}{name}: unknown field "{prefix}{name}"' for name in unknown)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        prefix = f"{path}." if path else ""
        return f"{prefix}{missing}: Required value"
    if error.validator == "anyOf" and error.schema.get("anyOf") == [{"type": "integer"}, {"type": "string"}]:
        return f"{path or '<root>'}: Invalid value: {error.instance!r}: must be an integer or a string"
    return f"{path or '<root>'}: Invalid value: {error.message}"


def validate(body: dict) -> list[str]:
    """Check a PyTorchJob or TrainJob body against its real CRD schema; an empty list means valid.

    Each message starts with the dotted field path (e.g. `spec.pytorchReplicaSpecs.Master.replicas`).
    An apiVersion/kind with no CRD in tests/cluster/specs/ is itself reported.
    """
    if not isinstance(body, dict):
        return [f"<root>: Invalid value: body must be an object, got {type(body).__name__}"]
    key = (body.get("apiVersion"), body.get("kind"))
    schema = _schemas().get(key)
    if schema is None:
        return [f"apiVersion/kind: no CRD for apiVersion={key[0]!r} kind={key[1]!r}; known: {supported()}"]
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(body), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    messages = [_message(error) for error in errors]
    if not (body.get("metadata") or {}).get("name") and not (body.get("metadata") or {}).get("generateName"):
        messages.insert(0, "metadata.name: Required value: name or generateName is required")
    return messages
