"""Kubeflow's PodDefault admission webhook, a mutating admission of the Kubernetes test server
(tests/cluster/k8s_server.py ``create_pod``) and of the KFP executor's direct engines (tests/cluster/kfp_executor.py
``_admit``), both through :func:`admit`: the API server calls it only for pods of a profile's namespace.

From kubeflow/kubeflow v1.10.0 (90e987bf) ``components/admission-webhook/main.go``: ``mutatePods`` (l. 599-704: a
pod annotated ``poddefault.admission.kubeflow.org/exclude: "true"`` and a mirror pod are left alone; a conflict
refuses the pod), ``filterPodDefaults`` (l. 72-97), ``safeToApplyPodDefaultsOnPod`` (l. 101-150) and
``applyPodDefaultsOnPod`` (l. 480-556) with its merges (l. 170-475) and ``setCommandAndArgs`` (l. 582-597). Lists and
maps a merge leaves empty are omitted, as the ``omitempty`` JSON of upstream's patched pod omits them; conflict
messages name what upstream's do, with Python's reprs for Go's ``%#v``.
"""
from __future__ import annotations

import copy

from cluster.k8s_store import label_matcher
from cluster.k8s_validation import webhook_denied

WEBHOOK = "admission-webhook-deployment.kubeflow.org"
"""The webhook's name in an API server's refusal: ``$(podDefaultsDeploymentName).kubeflow.org`` (manifests/base/
mutating-webhook-configuration.yaml) under the cert-manager overlay's ``namePrefix: admission-webhook-``."""
ANNOTATION_PREFIX = "poddefault.admission.kubeflow.org"
NAMESPACE_SELECTOR = {"matchLabels": {"app.kubernetes.io/part-of": "kubeflow-profile"}}
"""The webhook's ``namespaceSelector`` (kubeflow/manifests v1.10.0 (c1ae8498), unchanged in 26.03,
``apps/admission-webhook/upstream/base/mutating-webhook-configuration.yaml`` l. 17-19; it has no ``objectSelector``,
its rule is pods' CREATE): the label the profile controller gives a profile's namespace
(tests/cluster/kfp_multiuser.py :data:`~cluster.kfp_multiuser.PROFILE_LABELS`)."""
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
"""``corev1.MirrorPodAnnotationKey``: a static pod's mirror, which ``mutatePods`` leaves alone."""
ISTIO_PROXY = "istio-proxy"
"""The container ``setCommandAndArgs`` leaves alone (``istioProxyContainerName``)."""

FIELDS = {"desc", "selector", "volumes", "volumeMounts", "env"}
"""The PodDefault ``spec`` fields the KFP executor's direct engines apply (tests/cluster/kfp_executor.py ``_admit``)."""


class Conflict(ValueError):
    """``safeToApplyPodDefaultsOnPod`` found conflicts: ``mutatePods`` refuses the pod with this message."""

    @property
    def denial(self) -> str:
        """The API server's message for the refusal (``webhookerrors.ToStatusErr``, with the webhook's name)."""
        return webhook_denied(WEBHOOK, str(self))


def checked(default: dict) -> dict:
    """``default`` if it uses only what the KFP executor's direct engines apply (:data:`FIELDS`, a volume being a
    projected ``serviceAccountToken``, an env variable a plain ``value``).

    Raises:
        ValueError: a field they do not apply, named.
    """
    name = default["metadata"]["name"]
    unknown = sorted(set(default["spec"]) - FIELDS)
    for volume in default["spec"].get("volumes", []):
        sources = volume.get("projected", {}).get("sources", [])
        if set(volume) != {"name", "projected"} or len(sources) != 1 or set(sources[0]) != {"serviceAccountToken"}:
            unknown.append(f"volumes[{volume['name']}] (only a projected serviceAccountToken is emulated)")
    unknown += [f"env[{e['name']}] (only a value is emulated)" for e in default["spec"].get("env", [])
                if set(e) != {"name", "value"}]
    if unknown:
        raise ValueError(f"PodDefault {name}: spec fields {unknown} are not emulated by the test cluster")
    return default


def matching(defaults: list[dict], namespace: str, labels: dict[str, str]) -> list[dict]:
    """``filterPodDefaults``: the PodDefaults of ``namespace`` whose selector matches ``labels``."""
    return [d for d in defaults if d["metadata"].get("namespace") == namespace
            and label_matcher(selector_string(d["spec"].get("selector") or {}))(labels)]


def admit(defaults: list[dict], namespace: str, namespace_labels: dict[str, str], pod: dict) -> None:
    """The API server's call of the webhook on a created ``pod``: :func:`apply` where ``namespace_labels`` match
    :data:`NAMESPACE_SELECTOR` (k8s.io/apiserver ``pkg/admission/plugin/webhook/predicates/namespace/matcher.go``
    ``MatchNamespaceSelector``); a pod of any other namespace is not sent to it.

    Raises:
        Conflict: as :func:`apply`.
    """
    if label_matcher(selector_string(NAMESPACE_SELECTOR))(namespace_labels):
        apply(defaults, namespace, pod)


def apply(defaults: list[dict], namespace: str, pod: dict) -> None:
    """``mutatePods``: the matching PodDefaults applied on ``pod`` (a pod object, changed in place).

    Raises:
        Conflict: they conflict with the pod or each other (``safeToApplyPodDefaultsOnPod``), upstream's message.
    """
    annotations = pod["metadata"].get("annotations") or {}
    if annotations.get(f"{ANNOTATION_PREFIX}/exclude") == "true" or MIRROR_ANNOTATION in annotations:
        return
    found = matching(defaults, namespace, pod["metadata"].get("labels") or {})
    mutated, errors = applied(pod, found)
    if errors:
        names = ",".join(d["metadata"].get("name", "") for d in found)
        aggregate = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"  # utilerrors.NewAggregate
        raise Conflict(f"conflict occurred while applying poddefaults: {names} on pod: "
                       f"{pod['metadata'].get('name', '')} err: {aggregate}")
    pod.update(mutated)


def applied(pod: dict, defaults: list[dict]) -> tuple[dict, list[str]]:
    """``applyPodDefaultsOnPod``: a copy of ``pod`` with ``defaults`` applied, and the conflicts
    ``safeToApplyPodDefaultsOnPod`` finds (the same merges, its conflicts in its order; any refuses the pod)."""
    if not defaults:
        return pod, []
    pod, defaults = copy.deepcopy(pod), copy.deepcopy(defaults)  # the pod shares nothing with the PodDefaults
    meta, spec = pod.setdefault("metadata", {}), pod.setdefault("spec", {})
    errors: list[str] = []

    def put(target: dict, key: str, merge: tuple[list | dict, list[str]]) -> None:
        value, conflicts = merge
        errors.extend(conflicts)
        if value:
            target[key] = value
        else:
            target.pop(key, None)

    put(spec, "volumes", merged(spec.get("volumes", []), defaults, "volumes"))
    put(spec, "tolerations", merged(spec.get("tolerations", []), defaults, "tolerations", ("key",)))
    put(spec, "imagePullSecrets", merged(spec.get("imagePullSecrets", []), defaults, "imagePullSecrets"))
    for default in defaults:
        if default["spec"].get("automountServiceAccountToken") is not None:
            spec["automountServiceAccountToken"] = default["spec"]["automountServiceAccountToken"]
        if default["spec"].get("serviceAccountName"):
            spec["serviceAccountName"] = default["spec"]["serviceAccountName"]
    # safeToApplyPodDefaultsOnPod judges sidecars against the containers as they come (l. 145); the list holds them
    sidecars = merged(spec.get("containers", []), defaults, "sidecars")
    for container in spec.get("containers", []):  # applyPodDefaultsOnContainer
        put(container, "env", merged(container.get("env", []), defaults, "env"))
        put(container, "volumeMounts", merged(container.get("volumeMounts", []), defaults, "volumeMounts",
                                              ("name", "mountPath")))
        put(container, "envFrom", ([*container.get("envFrom", []),
                                    *(e for d in defaults for e in d["spec"].get("envFrom", []))], []))
        set_command_and_args(container, defaults)
    for field in ("annotations", "labels"):
        put(meta, field, merged_map(meta.get(field) or {}, [d["spec"].get(field) or {} for d in defaults]))
    put(spec, "initContainers", merged(spec.get("initContainers", []), defaults, "initContainers"))
    put(spec, "containers", sidecars)
    meta.setdefault("annotations", {}).update(
        {f"{ANNOTATION_PREFIX}/poddefault-{d['metadata'].get('name', '')}": d["metadata"].get("resourceVersion", "")
         for d in defaults})
    return pod, errors


def merged(items: list[dict], defaults: list[dict], field: str,
           keys: tuple[str, ...] = ("name",)) -> tuple[list[dict], list[str]]:
    """``mergeVolumes``, ``mergeEnv``, ``mergeImagePullSecrets``, ``mergeContainers`` (by name),
    ``mergeTolerations`` (by key), ``mergeVolumeMounts`` (by name and mount path): ``items`` and the PodDefaults'
    ``field`` items new by the first key, and a conflict for each item unequal to one it shares a key with."""
    seen = {key: {item.get(key): item for item in items} for key in keys}
    out, conflicts = list(items), []
    for default in defaults:
        for item in default["spec"].get(field, []):
            if item.get(keys[0]) not in seen[keys[0]]:
                out.append(item)
            for key in keys:
                found = seen[key].setdefault(item.get(key), item)
                if found != item:
                    conflicts.append(f"merging {field} for {default['metadata'].get('name', '')} has a conflict on "
                                     f"{key} {item.get(key)}: {item!r} does not match {found!r}")
    return out, conflicts


def merged_map(existing: dict[str, str], defaults: list[dict[str, str]]) -> tuple[dict[str, str], list[str]]:
    """``mergeMap``: ``existing`` with the keys of ``defaults`` added, and a conflict for each value that differs."""
    out, conflicts = dict(existing), []
    for default in defaults:
        for key, value in default.items():
            if out.setdefault(key, value) != value:
                conflicts.append(f"merging has conflict on {key}: {value!r} does not match {out[key]!r} in pod")
    return out, conflicts


def set_command_and_args(container: dict, defaults: list[dict]) -> None:
    """``setCommandAndArgs``: the first PodDefault's ``command`` and ``args`` where the container has none (an
    ``istio-proxy`` container is left alone)."""
    if container.get("name") == ISTIO_PROXY:
        return
    for default in defaults:
        for field in ("command", "args"):
            if container.get(field) is None and default["spec"].get(field) is not None:
                container[field] = default["spec"][field]


def selector_string(selector: dict) -> str:
    """A ``metav1.LabelSelector`` as the selector string ``LabelSelectorAsSelector`` makes of it."""
    ops = {"In": "{key} in ({values})", "NotIn": "{key} notin ({values})", "Exists": "{key}",
           "DoesNotExist": "!{key}"}
    return ",".join([*(f"{k}={v}" for k, v in sorted(selector.get("matchLabels", {}).items())),
                     *(ops[e["operator"]].format(key=e["key"], values=",".join(e.get("values", [])))
                       for e in selector.get("matchExpressions", []))])
