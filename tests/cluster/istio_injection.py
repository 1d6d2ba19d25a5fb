"""Istio's sidecar injector (istio/istio at tag 1.29.0) in the test cluster's pod admission, as a Kubeflow profile's
namespace (labelled ``istio-injection: enabled`` by the profile controller) has it. Written from Istio's source:

* ``manifests/charts/istio-control/istio-discovery/templates/mutatingwebhook.yaml``: the webhook is called for pods
  of namespaces labelled ``istio-injection: enabled`` whose label ``sidecar.istio.io/inject`` is not ``"false"``.
* ``pkg/kube/inject/inject.go`` ``injectRequired``: no injection for a pod with ``hostNetwork``, in the ignored
  namespaces (``initializer.go`` ``IgnoredNamespaces``), or whose label ``sidecar.istio.io/inject`` (preferred over
  the annotation of the same name) or annotation says ``"false"``; under the default policy ``enabled`` anything
  else (unset, ``"true"``, an invalid value) injects.
* ``manifests/charts/istio-control/istio-discovery/files/injection-template.yaml``: the classic sidecar (native
  sidecars off): a regular container ``istio-proxy`` (``proxyv2``, ``proxy sidecar``, port 15090, UID/GID 1337,
  read-only root, all capabilities dropped), and the ``sidecar.istio.io/status`` annotation
  (``inject.go``, ``annotation.SidecarStatus``).

What the test cluster's kubelet does with it (tests/cluster/k8s_operator.py): ``istio-proxy`` runs until the pod is
deleted, as pilot-agent does when the app container exits (nothing tells it to quit), so a pod whose app container
ended stays Running, and the job that waits for it never completes.
Not emulated: the ``istio-init`` init container (absent with Istio CNI, which restricted profiles need), traffic
through Envoy, revisions (``istio.io/rev``), Never/AlwaysInjectSelector, native sidecars.
"""
from __future__ import annotations

import copy
import json

NAMESPACE_LABEL = "istio-injection"
"""The namespace label the webhook's ``namespaceSelector`` matches (value ``enabled``)."""
INJECT = "sidecar.istio.io/inject"
"""``label.SidecarInject`` / ``annotation.SidecarInject``."""
STATUS = "sidecar.istio.io/status"
"""``annotation.SidecarStatus``: what was injected."""
PROXY = "istio-proxy"
IGNORED_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "local-path-storage")
PROXY_IMAGE = "docker.io/istio/proxyv2:1.29.0"
SIDECAR = {
    "name": PROXY, "image": PROXY_IMAGE, "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
    "ports": [{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}],
    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "privileged": False,
                        "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": 1337, "runAsGroup": 1337},
}
"""The injected container (injection-template.yaml, default values; env, probes and volumes left out)."""


def injection_required(namespace: str, namespace_labels: dict, pod: dict) -> bool:
    """Whether Istio injects a sidecar into ``pod`` in ``namespace`` (the webhook's selectors, then
    ``injectRequired`` under the default policy)."""
    labels = pod["metadata"].get("labels") or {}
    if namespace_labels.get(NAMESPACE_LABEL) != "enabled" or labels.get(INJECT) == "false":
        return False  # the webhook is not called
    if pod["spec"].get("hostNetwork") or namespace in IGNORED_NAMESPACES:
        return False
    selector = labels.get(INJECT, (pod["metadata"].get("annotations") or {}).get(INJECT, ""))
    return selector != "false"


def inject(pod: dict) -> None:
    """Add the classic sidecar and the status annotation to ``pod``."""
    pod["spec"]["containers"] = [*pod["spec"]["containers"], copy.deepcopy(SIDECAR)]
    pod["metadata"].setdefault("annotations", {})[STATUS] = json.dumps(
        {"initContainers": None, "containers": [PROXY], "volumes": None, "imagePullSecrets": None})


def injected(pod: dict) -> bool:
    """Whether ``pod`` carries the injected sidecar."""
    return STATUS in (pod["metadata"].get("annotations") or {})
