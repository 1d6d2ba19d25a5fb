"""The object store of the Kubernetes API test server (tests/cluster/k8s_server.py): resources, Status errors,
merge patches, label and field selectors, resourceVersions and the watch history."""
from __future__ import annotations

import copy
import datetime as dt
import re
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable


HISTORY = 1000
"""Watch events kept for resuming; a watch from an older resourceVersion gets 410 Expired."""


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")
    crd: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pytorchjobs.kubeflow.org`` or ``pods``, as the API server names a resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RBAC_GROUP = "rbac.authorization.k8s.io"
RESOURCES = (
    Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", crd=True),
    Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob", crd=True),
    Resource("", "v1", "pods", "Pod", verbs=("delete", "get", "list", "watch")),
    Resource("", "v1", "events", "Event", verbs=("get", "list", "watch")),
    Resource("", "v1", "secrets", "Secret", verbs=("create", "delete", "get", "list", "patch", "update", "watch")),
    Resource("coordination.k8s.io", "v1", "leases", "Lease"),
    Resource("", "v1", "namespaces", "Namespace", namespaced=False),
    Resource(RBAC_GROUP, "v1", "roles", "Role"),
    Resource(RBAC_GROUP, "v1", "clusterroles", "ClusterRole", namespaced=False),
    Resource(RBAC_GROUP, "v1", "rolebindings", "RoleBinding"),
    Resource(RBAC_GROUP, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    Resource("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime",
             namespaced=False, crd=True),
    Resource("trainer.kubeflow.org", "v1alpha1", "trainingruntimes", "TrainingRuntime"),
    Resource("ray.io", "v1", "rayjobs", "RayJob", crd=True),
    Resource("ray.io", "v1", "rayclusters", "RayCluster", crd=True),
    Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim",
             verbs=("create", "delete", "get", "list", "watch")),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService", crd=True),
    Resource("serving.kserve.io", "v1alpha1", "servingruntimes", "ServingRuntime", crd=True),
    Resource("", "v1", "serviceaccounts", "ServiceAccount"),
)
(PYTORCHJOBS, TRAINJOBS, PODS, EVENTS, SECRETS, LEASES, NAMESPACES, ROLES, CLUSTER_ROLES, ROLE_BINDINGS,
 CLUSTER_ROLE_BINDINGS, CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, RAYJOBS, RAYCLUSTERS,
 PERSISTENT_VOLUME_CLAIMS, CONFIGMAPS, INFERENCESERVICES, SERVINGRUNTIMES, SERVICE_ACCOUNTS) = RESOURCES
_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}


class ApiError(Exception):
    """An API error answered as a ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.details = code, reason, details

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": str(self),
                "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ------------------------------------------------------------------------------------------------ selectors

_SET_TERM = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    return [t for t in terms + [current] if t.strip()]


def label_matcher(selector: str) -> Callable[[dict], bool]:
    """A predicate on labels for a label selector (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``,
    ``a notin (x)``).

    Raises:
        ApiError: 400 for a selector it cannot parse.
    """
    checks: list[Callable[[dict], bool]] = []
    for term in _split_terms(selector or ""):
        term = term.strip()
        if m := _SET_TERM.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            checks.append((lambda k, vs: lambda labels: labels.get(k) in vs)(key, values) if op == "in" else
                          (lambda k, vs: lambda labels: labels.get(k) not in vs)(key, values))
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            checks.append(lambda labels, k=term[1:].strip(): k not in labels)
        elif re.fullmatch(r"[\w./-]+", term):
            checks.append(lambda labels, k=term: k in labels)
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return lambda labels: all(check(labels or {}) for check in checks)


def field_matcher(selector: str) -> Callable[[dict], bool]:
    """A predicate on objects for a field selector of ``path=value`` / ``path!=value`` terms."""
    checks = []
    for term in _split_terms(selector or ""):
        negate = "!=" in term
        path, value = (s.strip() for s in term.replace("!=", "=").replace("==", "=").split("=", 1))

        def lookup(obj: dict, path=path) -> str:
            for part in path.split("."):
                obj = obj.get(part) if isinstance(obj, dict) else None
            return "" if obj is None else str(obj)

        checks.append(lambda obj, lookup=lookup, value=value, negate=negate: (lookup(obj) == value) != negate)
    return lambda obj: all(check(obj) for check in checks)


# ------------------------------------------------------------------------------------------------ store

class Store:
    """Objects by (resource, namespace, name), one resourceVersion counter, and the watch event history."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.objects: dict[tuple[Resource, str, str], dict] = {}
        self.events: list[tuple[int, Resource, str, dict]] = []
        self.revision = 0
        self.compacted = 0
        """History up to this resourceVersion is gone: watches from before it get 410 Expired."""
        self.closed = False

    def _record(self, resource: Resource, kind: str, obj: dict) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.events.append((self.revision, resource, kind, copy.deepcopy(obj)))
        if len(self.events) > HISTORY:
            self.compacted = self.events.pop(0)[0]
        self.lock.notify_all()

    def compact(self) -> int:
        """Drop the whole watch history, as etcd compaction does; returns the compacted resourceVersion."""
        with self.lock:
            self.events.clear()
            self.compacted = self.revision
            return self.compacted

    def _missing(self, resource: Resource, name: str) -> ApiError:
        return ApiError(404, "NotFound", f'{resource.qualified} "{name}" not found',
                        {"name": name, "group": resource.group, "kind": resource.plural})

    def create(self, resource: Resource, namespace: str, body: dict) -> dict:
        """Store a new object (server fields set); 409 AlreadyExists when the name is taken."""
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{resource.kind} is invalid: metadata.name: Required value",
                           {"kind": resource.kind, "group": resource.group,
                            "causes": [{"reason": "FieldValueRequired", "field": "metadata.name",
                                        "message": "Required value: name or generateName is required"}]})
        with self.lock:
            if (resource, namespace, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{resource.qualified} "{name}" already exists',
                               {"name": name, "group": resource.group, "kind": resource.plural})
            obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
            if not resource.namespaced:
                del meta["namespace"]
            self.objects[(resource, namespace, name)] = obj
            self._record(resource, "ADDED", obj)
            return copy.deepcopy(obj)

    def get(self, resource: Resource, namespace: str, name: str) -> dict:
        with self.lock:
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                raise self._missing(resource, name)
            return copy.deepcopy(obj)

    def list(self, resource: Resource, namespace: str | None, labels: str = "", fields: str = "") -> tuple[list, int]:
        """Matching objects (all namespaces when ``namespace`` is None) and the store's resourceVersion."""
        match_labels, match_fields = label_matcher(labels), field_matcher(fields)
        with self.lock:
            items = [copy.deepcopy(o) for (r, ns, _), o in sorted(self.objects.items(), key=lambda kv: kv[0][1:])
                     if r == resource and namespace in (None, ns)
                     and match_labels(o["metadata"].get("labels")) and match_fields(o)]
            return items, self.revision

    def update(self, resource: Resource, namespace: str, name: str, change: Callable[[dict], dict | None],
               *, expect_version: str | None = None) -> dict:
        """Apply ``change`` (returns the new object, or mutates in place and returns None) and record MODIFIED.

        Raises:
            ApiError: 404 when missing, 409 Conflict when ``expect_version`` is stale.
        """
        with self.lock:
            current = self.objects.get((resource, namespace, name))
            if current is None:
                raise self._missing(resource, name)
            if expect_version and expect_version != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource.qualified} "{name}": '
                                                "the object has been modified; please apply your changes to the "
                                                "latest version and try again",
                               {"name": name, "group": resource.group, "kind": resource.plural})
            draft = copy.deepcopy(current)
            updated = change(draft)
            updated = draft if updated is None else updated
            if updated == current:
                return copy.deepcopy(current)
            for key in ("uid", "creationTimestamp", "namespace", "name"):
                if key in current["metadata"]:
                    updated["metadata"][key] = current["metadata"][key]
            if updated.get("spec") != current.get("spec"):
                updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
            self.objects[(resource, namespace, name)] = updated
            self._record(resource, "MODIFIED", updated)
            return copy.deepcopy(updated)

    def delete(self, resource: Resource, namespace: str, name: str) -> dict:
        with self.lock:
            obj = self.objects.pop((resource, namespace, name), None)
            if obj is None:
                raise self._missing(resource, name)
            self._record(resource, "DELETED", obj)
            return copy.deepcopy(obj)

    def events_after(self, revision: int) -> list[tuple[int, Resource, str, dict]] | None:
        """Recorded events newer than ``revision``; None when some of them are no longer kept (410)."""
        if revision < self.compacted:
            return None
        return [e for e in self.events if e[0] > revision]

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()
