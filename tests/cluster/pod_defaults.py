"""Kubeflow's PodDefault admission webhook, a mutating admission of the Kubernetes test server
(tests/cluster/k8s_server.py ``create_pod``) and of the KFP executor's direct engines.

kubeflow/kubeflow ``components/admission-webhook/main.go``: ``filterPodDefaults`` (a PodDefault applies to a pod of
its own namespace whose labels its ``spec.selector`` matches, ``metav1.LabelSelectorAsSelector``) and
``applyPodDefaultsOnPod`` (its volumes join the pod's, its volume mounts and env every container's). A PodDefault
field this emulation does not apply (volumes other than a projected ``serviceAccountToken``, ``annotations``,
``labels``, ``command``, ...) is refused with its name.
"""
from __future__ import annotations

from cluster.k8s_store import label_matcher

FIELDS = {"desc", "selector", "volumes", "volumeMounts", "env"}
"""The PodDefault ``spec`` fields this emulation applies."""


def checked(default: dict) -> dict:
    """``default`` if it uses only what :func:`apply` applies.

    Raises:
        ValueError: a field it does not apply, named.
    """
    name = default["metadata"]["name"]
    unknown = sorted(set(default["spec"]) - FIELDS)
    for volume in default["spec"].get("volumes", []):
        sources = volume.get("projected", {}).get("sources", [])
        if set(volume) != {"name", "projected"} or len(sources) != 1 or set(sources[0]) != {"serviceAccountToken"}:
            unknown.append(f"volumes[{volume['name']}] (only a projected serviceAccountToken is emulated)")
    if unknown:
        raise ValueError(f"PodDefault {name}: spec fields {unknown} are not emulated by the test cluster")
    return default


def matching(defaults: list[dict], namespace: str, labels: dict[str, str]) -> list[dict]:
    """``filterPodDefaults``: the PodDefaults of ``namespace`` whose selector matches ``labels``."""
    return [d for d in defaults if d["metadata"].get("namespace") == namespace
            and label_matcher(selector_string(d["spec"].get("selector") or {}))(labels)]


def apply(defaults: list[dict], namespace: str, pod: dict) -> None:
    """``applyPodDefaultsOnPod`` of the matching PodDefaults on ``pod`` (a pod object, changed in place)."""
    for default in matching(defaults, namespace, pod["metadata"].get("labels") or {}):
        spec = pod["spec"]
        known = {v["name"] for v in spec.get("volumes", [])}
        spec["volumes"] = [*spec.get("volumes", []), *(v for v in default["spec"].get("volumes", [])
                                                       if v["name"] not in known)]
        for container in spec["containers"]:
            container["volumeMounts"] = [*container.get("volumeMounts", []),
                                         *default["spec"].get("volumeMounts", [])]
            container["env"] = [*container.get("env", []), *default["spec"].get("env", [])]


def selector_string(selector: dict) -> str:
    """A ``metav1.LabelSelector`` as the selector string ``LabelSelectorAsSelector`` makes of it."""
    ops = {"In": "{key} in ({values})", "NotIn": "{key} notin ({values})", "Exists": "{key}",
           "DoesNotExist": "!{key}"}
    return ",".join([*(f"{k}={v}" for k, v in sorted(selector.get("matchLabels", {}).items())),
                     *(ops[e["operator"]].format(key=e["key"], values=",".join(e.get("values", [])))
                       for e in selector.get("matchExpressions", []))])
