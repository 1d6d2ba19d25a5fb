"""A Kubernetes API test server for the real `kubernetes` client and `kubectl`, with an operator mode.

What it serves (HTTP, no auth), through the kubeconfig :meth:`K8sServer.write_kubeconfig` writes:

* discovery (`/version`, `/api`, `/apis`, group and resource lists) as `kubectl` and the client read it;
* custom objects `pytorchjobs` (`kubeflow.org/v1`) and `trainjobs` (`trainer.kubeflow.org/v1alpha1`), and core
  `pods` (read-only for clients), `pods/log`, `events`, `secrets`, and `leases` (`coordination.k8s.io/v1`):
  create / get / list / merge-patch / replace / delete, with `resourceVersion` (a replace carrying a stale one gets
  409 Conflict, the compare-and-set a Lease lock relies on; a Lease time not in MicroTime form gets 400), label
  and field selectors, Status bodies like the API server's (404 NotFound, 409 AlreadyExists or Conflict,
  422 Invalid from the real CRD schema via tests/crd_schema.py), server-side
  `Table` for `kubectl get`, and watch streams (`?watch=true&resourceVersion=N`: chunked JSON lines, ADDED /
  MODIFIED / DELETED, resumed from N; an `ERROR` event with code 410 Expired when N is older than the retained
  history, as the API server sends it).

Operator mode (on by default) plays the Training Operator v1.9 and the kubelet for PyTorchJobs: one pod object
and one local process group per replica, running the container's own `command` + `args` with the env the
operator injects (`JobSpec.pod_env`), the container's `env` (`secretKeyRef` resolved from Secrets in the store)
and a minimal image env (`PATH`, `HOME`, `HOSTNAME`). Pod names resolve like a cluster's headless services do:
each pod process runs in its own mount and UTS namespaces (`unshare`; hostname = pod name) with a private
`/etc/hosts` mapping every pod of its job (`<job>-master-0`, `<job>-worker-<i>`) to 127.0.0.1, so `MASTER_ADDR`
stays the operator's value.
Differences from a cluster, all deliberate: all pods share the host network, so each job gets a free host port
in place of the `pytorchjob-port` 23456 (the injected `MASTER_PORT` says which); `volumeMounts` are mapped by
rewriting the mount path prefix in command, args, env values and workingDir to a host dir (a PVC claim -> the
dir given in `volumes`, an emptyDir -> a fresh dir per pod); securityContext is not enforced.
Job status follows the operator: conditions Created, Running, Restarting, Succeeded, Failed; `restartPolicy:
ExitCode` recreates a pod whose exit code is >= 128 (backoffLimit not applied) and fails the job on 1..127;
`OnFailure` restarts the container in place (restartCount, CrashLoopBackOff); `cleanPodPolicy` and
`activeDeadlineSeconds` apply. Scheduling checks the pod's resources against one node's `capacity`: a pod that
does not fit stays Pending/Unschedulable with a FailedScheduling event. Images in `unpullable_images` stay in
ImagePullBackOff; a pod named in `killed_pods` is SIGKILLed (exit 137) each time it starts, reporting the reason
given there (`OOMKilled`, or `Error` for a plain kill).
TrainJobs are stored and validated but not run.
"""
from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import yaml
from fakes.crd_schema import validate as validate_crd

from training.launch.jobspec import JobSpec
from training.launch.local import free_port

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
HISTORY = 1000
"""Watch events kept for resuming; a watch from an older resourceVersion gets 410 Expired."""
STOP_GRACE_SECONDS = 5.0
"""SIGTERM -> SIGKILL grace for pod processes (the real default terminationGracePeriodSeconds is 30)."""
CRASH_BACKOFF_SECONDS = 0.5
"""First CrashLoopBackOff delay of an in-place restart (the kubelet's is 10 s), doubled per restart up to 8 s."""


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


RESOURCES = (
    Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", crd=True),
    Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob", crd=True),
    Resource("", "v1", "pods", "Pod", verbs=("delete", "get", "list", "watch")),
    Resource("", "v1", "events", "Event", verbs=("get", "list", "watch")),
    Resource("", "v1", "secrets", "Secret", verbs=("create", "delete", "get", "list", "patch", "update", "watch")),
    Resource("coordination.k8s.io", "v1", "leases", "Lease"),
)
PYTORCHJOBS, TRAINJOBS, PODS, EVENTS, SECRETS, LEASES = RESOURCES
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


# ------------------------------------------------------------------------------------------------ HTTP

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_HTTPServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (BaseHTTPRequestHandler's signature)
        self.server.api.requests.append(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise ApiError(400, "BadRequest", f"the body is neither JSON nor YAML: {exc}") from exc

    def _send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_chunked(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            self.server.api.handle(self, method, url.path.rstrip("/") or "/", query, body)
        except ApiError as exc:
            self._send_json(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    api: "K8sServer"


_NS_PATH = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))"
                      r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


@dataclass
class _PodRun:
    """The local process (group) behind one pod, and its log file."""

    log: Path
    proc: subprocess.Popen | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Orders starting a process against stopping the pod: no process starts once ``stopped`` is set."""


class K8sServer:
    """The test API server (see the module docstring). Use as a context manager; :meth:`close` stops every pod.

    Args:
        workdir: where pod logs, hosts files and emptyDirs go.
        namespace: the kubeconfig's default namespace.
        volumes: PVC claim name -> host dir of that volume.
        capacity: the one node's allocatable resources (``cpu`` in cores, ``memory`` in bytes, extended
            resources by name); pods that do not fit stay Unschedulable.
        operator: run PyTorchJobs as local processes.
    """

    def __init__(self, workdir: Path, *, namespace: str = "default", volumes: dict[str, Path] | None = None,
                 capacity: dict[str, float] | None = None, operator: bool = True):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.namespace = namespace
        self.volumes = {claim: Path(path) for claim, path in (volumes or {}).items()}
        self.capacity = {"cpu": float(os.cpu_count() or 2) * 8, "memory": 256 * 2**30, **(capacity or {})}
        self.operator = operator
        self.unpullable_images: set[str] = set()
        """Images whose pods stay in ImagePullBackOff."""
        self.forbidden: set[tuple[str, str]] = set()
        """``(resource, verb)`` pairs answered 403 Forbidden, as RBAC answers a service account without the grant."""
        self.killed_pods: dict[str, str] = {}
        """Pod name -> terminated reason (``OOMKilled``, ``Error``): SIGKILLed every time it starts."""
        self.requests: list[str] = []
        """``METHOD path -> status`` of every request answered, in order."""
        self.store = Store()
        self._runs: dict[tuple[str, str], _PodRun] = {}
        self._jobs: dict[tuple[str, str], _JobController] = {}
        self._http = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._http.api = self
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="k8s-test-server", daemon=True)

    # -- lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def __enter__(self) -> "K8sServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop every job and pod process, end the watches, shut the HTTP server down."""
        for controller in list(self._jobs.values()):
            controller.stop()
        for run in list(self._runs.values()):
            _terminate(run)
        self.store.close()
        self._http.shutdown()
        self._http.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig whose current context points at this server and namespace."""
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "k8s-test",
                  "clusters": [{"name": "k8s-test", "cluster": {"server": self.url}}],
                  "users": [{"name": "k8s-test", "user": {}}],
                  "contexts": [{"name": "k8s-test",
                                "context": {"cluster": "k8s-test", "user": "k8s-test", "namespace": self.namespace}}]}
        Path(path).write_text(yaml.safe_dump(config))
        return Path(path)

    # -- test helpers (what a test reads besides the API)

    def live_pids(self) -> list[int]:
        """Pids of pod processes still running."""
        return [run.proc.pid for run in list(self._runs.values()) if run.proc and run.proc.poll() is None]

    # -- request handling

    def handle(self, h: _Handler, method: str, path: str, query: dict[str, str], body: Any) -> None:
        if path in ("/version", "/api", "/apis") or path.startswith("/api/v1") and path.count("/") == 2 \
                or path.startswith("/apis/") and path.count("/") <= 3:
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on {path}")
            return h._send_json(200, self._discovery(path))
        m = _NS_PATH.match(path)
        resource = _BY_PATH.get((m.group("g") or "", m.group("v") or m.group("cv"), m.group("plural"))) if m else None
        if resource is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace, name, sub = m.group("ns"), m.group("name"), m.group("sub")
        if name and not namespace:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub == "log" and resource is PODS and method == "GET":
            return self._log(h, namespace, name, query)
        if sub not in (None, "status"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(method)
        if method == "GET":
            verb = "get" if name else ("watch" if query.get("watch", "").lower() in ("true", "1") else "list")
        if verb not in resource.verbs or (verb == "create" and name):
            raise ApiError(405, "MethodNotAllowed", f"{verb} is not supported on {resource.qualified}")
        if (resource.plural, verb) in self.forbidden:
            raise ApiError(403, "Forbidden", f'{resource.qualified} is forbidden: User "system:serviceaccount:'
                                             f'{namespace}:default" cannot {verb} resource "{resource.plural}" in API '
                                             f'group "{resource.group}" in the namespace "{namespace}"',
                           {"group": resource.group, "kind": resource.plural})
        if verb == "get":
            return h._send_json(200, self.store.get(resource, namespace, name))
        if verb == "list":
            return self._list(h, resource, namespace, query)
        if verb == "watch":
            return self._watch(h, resource, namespace, query)
        if verb == "create":
            return h._send_json(201, self.create(resource, namespace, body))
        if verb in ("patch", "update"):
            return h._send_json(200, self._modify(resource, namespace, name, body, sub, method,
                                                  h.headers.get("Content-Type", "")))
        return h._send_json(200, self.delete(resource, namespace, name))

    def _discovery(self, path: str) -> dict:
        groups = sorted({r.group for r in RESOURCES if r.group})
        if path == "/version":
            return {"major": "1", "minor": "30", "gitVersion": "v1.30.0-kfloop-test", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}

        def group_entry(group: str) -> dict:
            version = next(r.version for r in RESOURCES if r.group == group)
            gv = {"groupVersion": f"{group}/{version}", "version": version}
            return {"name": group, "versions": [gv], "preferredVersion": gv}

        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_entry(g) for g in groups]}
        parts = path.strip("/").split("/")
        if parts[0] == "apis" and len(parts) == 2:
            if parts[1] not in groups:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return {"kind": "APIGroup", "apiVersion": "v1", **group_entry(parts[1])}
        group, version = ("", "v1") if parts[0] == "api" else (parts[1], parts[2])
        members = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
        if not members:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        listed = [{"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced, "kind": r.kind,
                   "verbs": list(r.verbs)} for r in members]
        if group == "":
            listed.append({"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod",
                           "verbs": ["get"]})
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": members[0].api_version,
                "resources": listed}

    def _list(self, h: _Handler, resource: Resource, namespace: str | None, query: dict[str, str]) -> None:
        items, revision = self.store.list(resource, namespace, query.get("labelSelector", ""),
                                          query.get("fieldSelector", ""))
        if "as=Table" in h.headers.get("Accept", ""):
            return h._send_json(200, _table(resource, items, revision))
        h._send_json(200, {"apiVersion": resource.api_version, "kind": f"{resource.kind}List",
                           "metadata": {"resourceVersion": str(revision)}, "items": items})

    def _watch(self, h: _Handler, resource: Resource, namespace: str | None, query: dict[str, str]) -> None:
        match_labels = label_matcher(query.get("labelSelector", ""))
        match_fields = field_matcher(query.get("fieldSelector", ""))
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        start = query.get("resourceVersion") or "0"
        if not start.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {start!r}")
        revision = int(start)

        def wanted(res: Resource, obj: dict) -> bool:
            return (res == resource and namespace in (None, obj["metadata"]["namespace"])
                    and match_labels(obj["metadata"].get("labels")) and match_fields(obj))

        h._start_chunked("application/json")
        store = self.store
        with store.lock:
            if revision == 0:  # "any": the current state as ADDED, then changes
                pending = [(store.revision, resource, "ADDED", copy.deepcopy(o))
                           for (r, _, _), o in store.objects.items() if wanted(r, o)]
                revision = store.revision
            else:
                pending = store.events_after(revision)
        if pending is None:
            gone = ApiError(410, "Expired", f"too old resource version: {revision} ({store.compacted})").status()
            h._chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return h._chunk(b"")
        try:
            while True:
                for event_revision, res, kind, obj in pending:
                    revision = max(revision, event_revision)
                    if wanted(res, obj):
                        h._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                with store.lock:
                    while not store.closed and store.revision == revision and time.monotonic() < deadline:
                        store.lock.wait(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                    if store.closed or time.monotonic() >= deadline:
                        break
                    pending = store.events_after(revision)
                if pending is None:  # compacted while we waited: the client must re-list
                    gone = ApiError(410, "Expired", f"too old resource version: {revision} ({store.compacted})")
                    h._chunk(json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n")
                    break
            h._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _log(self, h: _Handler, namespace: str, name: str, query: dict[str, str]) -> None:
        pod = self.store.get(PODS, namespace, name)
        run = self._runs.get((namespace, name))
        if run is None or not run.log.exists():
            reason = (pod.get("status", {}).get("containerStatuses") or [{}])[0].get("state", {}).get("waiting", {})
            why = f"is waiting to start: {reason.get('reason', 'ContainerCreating')}"
            container = pod["spec"]["containers"][0]["name"]
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" {why}')
        text = run.log.read_bytes()
        if "tailLines" in query:
            lines = text.splitlines(keepends=True)
            text = b"".join(lines[-int(query["tailLines"]):]) if int(query["tailLines"]) else b""
        if query.get("follow", "").lower() not in ("true", "1"):
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(len(text)))
            h.end_headers()
            return h.wfile.write(text)
        h._start_chunked("text/plain")
        offset = run.log.stat().st_size
        try:
            if text:
                h._chunk(text)
            with run.log.open("rb") as log:
                log.seek(offset)
                while True:
                    finished = run.stopped.is_set() or run.proc is None or run.proc.poll() is not None
                    data = log.read()
                    if data:
                        h._chunk(data)
                    elif finished or self.store.closed:
                        break
                    else:
                        run.stopped.wait(0.1)
            h._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            pass

    # -- verbs (also used by the operator)

    def create(self, resource: Resource, namespace: str, body: Any) -> dict:
        """Validate (CRDs: the real schema, strictly) and store; PyTorchJobs start in operator mode."""
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        if resource.crd:
            body.setdefault("apiVersion", resource.api_version)
            body.setdefault("kind", resource.kind)
            self._validate(resource, body)
        _check_micro_times(resource, body)
        obj = self.store.create(resource, namespace, body)
        if resource is PYTORCHJOBS and self.operator:
            controller = _JobController(self, namespace, obj)
            self._jobs[(namespace, obj["metadata"]["name"])] = controller
            controller.start()
        return obj

    def _validate(self, resource: Resource, body: dict) -> None:
        if (body.get("apiVersion"), body.get("kind")) != (resource.api_version, resource.kind):
            raise ApiError(400, "BadRequest", f"the API version in the data ({body.get('apiVersion')}) and kind "
                                              f"({body.get('kind')}) do not match {resource.api_version} "
                                              f"{resource.kind}")
        problems = validate_crd(body)
        if problems:
            name = (body.get("metadata") or {}).get("name", "")
            causes = [{"reason": "FieldValueInvalid", "message": p, "field": p.split(":", 1)[0]} for p in problems]
            raise ApiError(422, "Invalid", f'{resource.kind}.{resource.group} "{name}" is invalid: '
                                           f"[{', '.join(problems)}]",
                           {"name": name, "group": resource.group, "kind": resource.kind, "causes": causes})

    def _modify(self, resource: Resource, namespace: str, name: str, body: Any, sub: str | None, method: str,
                content_type: str) -> dict:
        if not isinstance(body, dict):
            raise ApiError(415 if "json-patch" in content_type else 400, "BadRequest",
                           "only merge patches (a JSON object) are supported by this test server")

        def change(current: dict) -> dict:
            if method == "PUT":
                updated = copy.deepcopy(body)
                updated.setdefault("metadata", {})
                if sub == "status":
                    return {**current, "status": updated.get("status", {})}
                kept = {"status": current["status"]} if "status" in current else {}
                return {**updated, **kept, "apiVersion": current["apiVersion"], "kind": current["kind"]}
            patch = {"status": body.get("status")} if sub == "status" else {k: v for k, v in body.items()
                                                                            if k != "status"}
            updated = merge_patch(current, patch)
            if resource.crd and sub != "status":
                candidate = {k: v for k, v in updated.items() if k != "status"}
                candidate["metadata"] = {k: v for k, v in updated["metadata"].items()
                                         if k in ("name", "namespace", "labels", "annotations")}
                self._validate(resource, candidate)
            return updated

        _check_micro_times(resource, body)
        expect = (body.get("metadata") or {}).get("resourceVersion") if method == "PUT" else None
        return self.store.update(resource, namespace, name, change, expect_version=expect)

    def delete(self, resource: Resource, namespace: str, name: str) -> dict:
        """Delete; a PyTorchJob's pods go with it (their processes are stopped), as owner references make them."""
        obj = self.store.delete(resource, namespace, name)
        if resource is PYTORCHJOBS:
            controller = self._jobs.pop((namespace, name), None)
            if controller:
                controller.stop()
            for pod in self.store.list(PODS, namespace, f"{JOB_NAME_LABEL}={name}")[0]:
                self.delete_pod(namespace, pod["metadata"]["name"])
        elif resource is PODS:
            run = self._runs.pop((namespace, name), None)
            if run:
                _terminate(run)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": resource.group, "kind": resource.plural,
                            "uid": obj["metadata"]["uid"]}}

    def delete_pod(self, namespace: str, name: str) -> None:
        """Stop a pod's process and delete the pod object (no error when it is already gone)."""
        try:
            self.delete(PODS, namespace, name)
        except ApiError as exc:
            if exc.code != 404:
                raise

    def record_event(self, namespace: str, involved: dict, *, reason: str, message: str,
                     type_: str = "Normal") -> None:
        """An Event about ``involved`` (a pod or job object), as the scheduler, kubelet or operator writes it."""
        meta = involved["metadata"]
        self.store.create(EVENTS, namespace, {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
            "involvedObject": {"kind": involved["kind"], "name": meta["name"], "namespace": namespace,
                               "uid": meta["uid"], "apiVersion": involved["apiVersion"]},
            "reason": reason, "message": message, "type": type_, "count": 1, "firstTimestamp": now(),
            "lastTimestamp": now(), "source": {"component": "kfloop-test-server"}})


_MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")


def _check_micro_times(resource: Resource, body: dict) -> None:
    """A Lease's MicroTime fields parse only as RFC 3339 with six fraction digits: 400 otherwise, as the API
    server's decoder answers."""
    if resource is not LEASES:
        return
    for key in ("acquireTime", "renewTime"):
        value = (body.get("spec") or {}).get(key)
        if value is not None and not (isinstance(value, str) and _MICRO_TIME.fullmatch(value)):
            raise ApiError(400, "BadRequest", f'Lease in version "v1" cannot be handled as a Lease: parsing time '
                                              f'{json.dumps(value)} as "2006-01-02T15:04:05.000000Z07:00": cannot '
                                              f"parse spec.{key}")


def _table(resource: Resource, items: list[dict], revision: int) -> dict:
    """The server-side Table `kubectl get` asks for: NAME, the CRD's printer columns (State), AGE."""
    columns = [{"name": "Name", "type": "string", "format": "name", "description": "Name"}]
    if resource.crd:
        columns.append({"name": "State", "type": "string", "format": "", "description": "last condition"})
    columns.append({"name": "Age", "type": "string", "format": "", "description": "creation time"})
    rows = []
    for obj in items:
        cells = [obj["metadata"]["name"]]
        if resource.crd:
            conditions = obj.get("status", {}).get("conditions") or [{}]
            cells.append(conditions[-1].get("type", ""))
        cells.append(obj["metadata"].get("creationTimestamp", ""))
        rows.append({"cells": cells, "object": {"kind": "PartialObjectMetadata",
                                                "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(revision)},
            "columnDefinitions": columns, "rows": rows}


# ------------------------------------------------------------------------------------------------ operator

_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40}


def quantity(value: Any) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``4Gi``) as a number."""
    m = _QUANTITY.match(str(value))
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"quantity {value!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def _terminate(run: _PodRun) -> None:
    """SIGTERM the pod's process group, SIGKILL it after STOP_GRACE_SECONDS, and reap it."""
    with run.lock:
        run.stopped.set()
        proc = run.proc
    if proc is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            continue
    try:  # whatever the group left behind
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _unshare_prefix() -> list[str]:
    """``unshare`` arguments giving a process its own mount and UTS (hostname) namespaces, like a pod (and a user
    namespace when not root)."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--uts", "--"]


class _JobController:
    """The operator's reconcile loop for one PyTorchJob, and the kubelet of its pods."""

    def __init__(self, api: K8sServer, namespace: str, job: dict):
        self.api, self.namespace, self.job = api, namespace, job
        self.name = job["metadata"]["name"]
        self.port = free_port()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.finished = False
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=api.workdir))
        spec = job["spec"]
        self.replicas = {rtype: rspec for rtype, rspec in spec["pytorchReplicaSpecs"].items()}
        self.run_policy = spec.get("runPolicy", {})
        self.hosts = self.dir / "hosts"
        pods = [self.pod_name(rtype, i) for rtype, rspec in self.replicas.items()
                for i in range(rspec.get("replicas", 1))]
        self.hosts.write_text("127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {p}\n" for p in pods))

    def pod_name(self, rtype: str, index: int) -> str:
        return f"{self.name}-{rtype.lower()}-{index}"

    def start(self) -> None:
        self.set_condition("Created", "PyTorchJobCreated", f"PyTorchJob {self.name} is created.")
        for rtype, rspec in self.replicas.items():
            for index in range(rspec.get("replicas", 1)):
                self.start_pod(rtype, index)
        deadline = self.run_policy.get("activeDeadlineSeconds")
        if deadline:
            threading.Thread(target=self._deadline, args=(float(deadline),), daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()

    # -- job status

    def set_condition(self, kind: str, reason: str, message: str, **status_fields: Any) -> None:
        def change(job: dict) -> None:
            status = job.setdefault("status", {})
            conditions = status.setdefault("conditions", [])
            stamp = now()
            for condition in conditions:
                if kind in ("Running", "Restarting", "Succeeded", "Failed") and condition["type"] in (
                        {"Running": ("Restarting",), "Restarting": ("Running",)}.get(kind, ("Running",))):
                    if condition["status"] == "True":
                        condition.update(status="False", lastTransitionTime=stamp, lastUpdateTime=stamp)
            existing = next((c for c in conditions if c["type"] == kind), None)
            if existing and existing["status"] == "True" and existing["reason"] == reason:
                existing.update(message=message, lastUpdateTime=stamp)
            else:
                if existing:
                    conditions.remove(existing)
                conditions.append({"type": kind, "status": "True", "reason": reason, "message": message,
                                   "lastUpdateTime": stamp, "lastTransitionTime": stamp})
            status.setdefault("startTime", stamp)
            status.update(status_fields)
            status["replicaStatuses"] = self._replica_statuses()

        try:
            self.api.store.update(PYTORCHJOBS, self.namespace, self.name, change)
        except ApiError:
            self.stopping.set()  # the job is gone

    def _replica_statuses(self) -> dict:
        counts = {}
        for rtype in self.replicas:
            pods = self.api.store.list(PODS, self.namespace, f"{JOB_NAME_LABEL}={self.name},"
                                                             f"{REPLICA_TYPE_LABEL}={rtype.lower()}")[0]
            phases = [p.get("status", {}).get("phase") for p in pods]
            counts[rtype] = {"active": phases.count("Running"), "succeeded": phases.count("Succeeded"),
                             "failed": phases.count("Failed")}
        return counts

    def finish(self, kind: str, reason: str, message: str) -> None:
        with self.lock:
            if self.finished or self.stopping.is_set():
                return
            self.finished = True
        self.set_condition(kind, reason, message, completionTime=now())
        self.api.record_event(self.namespace, self.job, reason=reason, message=message,
                              type_="Normal" if kind == "Succeeded" else "Warning")
        policy = self.run_policy.get("cleanPodPolicy", "None")
        for pod in self.api.store.list(PODS, self.namespace, f"{JOB_NAME_LABEL}={self.name}")[0]:
            phase = pod.get("status", {}).get("phase")
            if policy == "All" or (policy == "Running" and phase in ("Running", "Pending")):
                self.api.delete_pod(self.namespace, pod["metadata"]["name"])

    def _deadline(self, seconds: float) -> None:
        if not self.stopping.wait(seconds) and not self.finished:
            self.finish("Failed", "DeadlineExceeded",
                        f"PyTorchJob {self.name} has failed because it has reached the specified active deadline")

    # -- pods

    def start_pod(self, rtype: str, index: int) -> None:
        name = self.pod_name(rtype, index)
        template = copy.deepcopy(self.replicas[rtype]["template"])
        spec = template.get("spec", {})
        node_rank = 0 if rtype == "Master" else index + (1 if "Master" in self.replicas else 0)
        operator_env = self._operator_env(node_rank)
        for container in spec.get("containers", []):
            if container.get("name") == "pytorch":
                container["env"] = container.get("env", []) + [{"name": k, "value": v} for k, v in operator_env.items()]
                container.setdefault("ports", []).append({"name": "pytorchjob-port", "containerPort": self.port,
                                                          "protocol": "TCP"})
        restart = self.replicas[rtype].get("restartPolicy", "Never")
        spec["restartPolicy"] = "Never" if restart == "ExitCode" else restart
        labels = {**template.get("metadata", {}).get("labels", {}), JOB_NAME_LABEL: self.name,
                  REPLICA_TYPE_LABEL: rtype.lower(), REPLICA_INDEX_LABEL: str(index),
                  OPERATOR_NAME_LABEL: "pytorchjob-controller"}
        if rtype == "Master":
            labels[JOB_ROLE_LABEL] = "master"
        pod = self.api.store.create(PODS, self.namespace, {
            "metadata": {"name": name, "labels": labels,
                         "annotations": template.get("metadata", {}).get("annotations", {}),
                         "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": self.name,
                                              "uid": self.job["metadata"]["uid"], "controller": True}]},
            "spec": spec, "status": {"phase": "Pending", "conditions": []}})
        self.api.record_event(self.namespace, self.job, reason="SuccessfulCreatePod",
                              message=f"Created pod: {name}")
        threading.Thread(target=self._kubelet, args=(pod, rtype, index), name=f"pod-{name}", daemon=True).start()

    def _operator_env(self, node_rank: int) -> dict[str, str]:
        """What the operator injects (training/launch/jobspec.py's JobSpec.pod_env, plus the elastic variables)."""
        spec = self.job["spec"]
        nnodes = sum(r.get("replicas", 1) for r in self.replicas.values())
        nproc = str(spec.get("nprocPerNode", "1"))
        elastic = spec.get("elasticPolicy")
        job_spec = JobSpec(nnodes=nnodes, nproc_per_node=int(nproc) if nproc.isdigit() else 1)
        env = job_spec.pod_env(node_rank, f"{self.name}-master-0", self.port)
        if not nproc.isdigit():
            env.update(PET_NPROC_PER_NODE=nproc, WORLD_SIZE=str(nnodes))
        if elastic:
            env["PET_NNODES"] = f"{elastic.get('minReplicas', nnodes)}:{elastic.get('maxReplicas', nnodes)}"
            env["PET_RDZV_ENDPOINT"] = f"{self.name}-master-0:{self.port}"
            env["PET_RDZV_BACKEND"] = elastic.get("rdzvBackend", "c10d")
            if "maxRestarts" in elastic:
                env["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])
        return env

    def _update_pod(self, name: str, change: Callable[[dict], None]) -> dict | None:
        try:
            return self.api.store.update(PODS, self.namespace, name, change)
        except ApiError:
            return None  # deleted meanwhile

    def _kubelet(self, pod: dict, rtype: str, index: int) -> None:
        """Schedule, pull, run (restarting in place for OnFailure/Always) and report one pod."""
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        container = next((c for c in pod["spec"]["containers"] if c.get("name") == "pytorch"),
                         pod["spec"]["containers"][0])
        unfit = self._unfit(pod)
        if unfit:
            message = f"0/1 nodes are available: 1 Insufficient {unfit}. preemption: 0/1 nodes are available: " \
                      "1 No preemption victims found for incoming pod."
            self._update_pod(name, lambda p: p["status"].update(conditions=[
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                 "lastTransitionTime": now()}]))
            self.api.record_event(self.namespace, pod, reason="FailedScheduling", message=message, type_="Warning")
            return
        self._update_pod(name, lambda p: p["status"].update(
            conditions=[{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}],
            hostIP="127.0.0.1", podIP="127.0.0.1"))
        self.api.record_event(self.namespace, pod, reason="Scheduled",
                              message=f"Successfully assigned {self.namespace}/{name} to kfloop-test-node")
        image = container.get("image", "")
        if image in self.api.unpullable_images:
            self._waiting(name, container, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            self.api.record_event(self.namespace, pod, reason="Failed", type_="Warning",
                                  message=f'Failed to pull image "{image}": not found')
            return
        try:
            argv, env, cwd = self._container_process(pod, container)
        except ValueError as exc:
            self._waiting(name, container, "CreateContainerConfigError", str(exc))
            self.api.record_event(self.namespace, pod, reason="Failed", message=f"Error: {exc}", type_="Warning")
            return
        run = _PodRun(log=self.dir / f"{name}-{uid[:8]}.log")
        self.api._runs[(self.namespace, name)] = run
        restarts = 0
        while True:
            started = now()
            with run.lock, run.log.open("ab") as log:
                if self.stopping.is_set() or run.stopped.is_set():
                    return
                run.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
            self._update_pod(name, lambda p: p["status"].update(phase="Running", startTime=p["status"].get(
                "startTime", started), containerStatuses=[{
                    "name": container["name"], "image": image, "imageID": "", "ready": True, "started": True,
                    "restartCount": restarts, "state": {"running": {"startedAt": started}},
                    **({"lastState": p["status"]["containerStatuses"][0]["lastState"]} if restarts else {})}]))
            if self._master_running():
                self.set_condition("Running", "PyTorchJobRunning", f"PyTorchJob {self.name} is running.")
            if name in self.api.killed_pods:
                os.killpg(run.proc.pid, signal.SIGKILL)
            code = run.proc.wait()
            exit_code = code if code >= 0 else 128 - code
            if run.stopped.is_set():
                return
            reason = "Completed" if exit_code == 0 else self.api.killed_pods.get(name, "Error")
            terminated = {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": now(),
                          "containerID": f"local://{run.proc.pid}"}
            in_place = pod["spec"]["restartPolicy"] == "Always" or (
                pod["spec"]["restartPolicy"] == "OnFailure" and exit_code != 0)
            if not in_place:
                phase = "Succeeded" if exit_code == 0 else "Failed"
                self._update_pod(name, lambda p: p["status"].update(phase=phase, containerStatuses=[{
                    "name": container["name"], "image": image, "imageID": "", "ready": False, "started": False,
                    "restartCount": restarts, "state": {"terminated": terminated}}]))
                return self._pod_finished(rtype, index, name, exit_code)
            restarts += 1
            backoff = min(8.0, CRASH_BACKOFF_SECONDS * 2 ** (restarts - 1))
            self._update_pod(name, lambda p: p["status"].update(containerStatuses=[{
                "name": container["name"], "image": image, "imageID": "", "ready": False, "started": False,
                "restartCount": restarts, "lastState": {"terminated": terminated},
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                                      "message": f"back-off {backoff:g}s restarting failed container="
                                                 f"{container['name']} pod={name}"}}}]))
            limit = self.run_policy.get("backoffLimit")
            if limit is not None and restarts > int(limit):
                return self.finish("Failed", "BackoffLimitExceeded",
                                   f"PyTorchJob {self.name} has failed because it has reached the specified "
                                   "backoff limit")
            if self.stopping.wait(backoff):
                return

    def _master_running(self) -> bool:
        """The operator's rule: the job is Running while its master pod runs."""
        try:
            master = self.api.store.get(PODS, self.namespace, self.pod_name("Master", 0))
        except ApiError:
            return False
        return master.get("status", {}).get("phase") == "Running"

    def _pod_finished(self, rtype: str, index: int, name: str, exit_code: int) -> None:
        """The operator's reaction to a terminated pod (restartPolicy Never / ExitCode)."""
        if self.stopping.is_set() or self.finished:
            return
        if exit_code == 0:
            if rtype == "Master":
                self.finish("Succeeded", "PyTorchJobSucceeded", f"PyTorchJob {self.name} is successfully completed.")
            return
        retryable = self.replicas[rtype].get("restartPolicy") == "ExitCode" and exit_code >= 128
        if retryable:
            self.set_condition("Restarting", "PyTorchJobRestarting",
                               f"PyTorchJob {self.name} is restarting because 1 {rtype} replica(s) failed.")
            self.api.record_event(self.namespace, self.job, reason="ExitedWithCode",
                                  message=f"Pod: {self.namespace}.{name} exited with code {exit_code}")
            self.api.record_event(self.namespace, self.job, reason="PyTorchJobRestarting", type_="Warning",
                                  message=f"PyTorchJob {self.name} is restarting because 1 {rtype} replica(s) "
                                          f"failed.")
            self.api.delete_pod(self.namespace, name)
            if not self.stopping.is_set():
                self.start_pod(rtype, index)
            return
        self.finish("Failed", "PyTorchJobFailed", f"PyTorchJob {self.name} is failed because 1 {rtype} replica(s) "
                                                  "failed.")

    def _unfit(self, pod: dict) -> str | None:
        """The first resource the node lacks for this pod (requests, or limits where no request is set)."""
        wanted: dict[str, float] = {}
        for container in pod["spec"].get("containers", []):
            resources = container.get("resources", {})
            for key, value in {**resources.get("limits", {}), **resources.get("requests", {})}.items():
                wanted[key] = wanted.get(key, 0.0) + quantity(value)
        for key, value in wanted.items():
            if value > self.api.capacity.get(key, 0.0):
                return key
        return None

    def _waiting(self, name: str, container: dict, reason: str, message: str) -> None:
        self._update_pod(name, lambda p: p["status"].update(containerStatuses=[{
            "name": container["name"], "image": container.get("image", ""), "imageID": "", "ready": False,
            "started": False,
            "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}]))

    def _container_process(self, pod: dict, container: dict) -> tuple[list[str], dict[str, str], str]:
        """argv, env and working dir of the container, with volume mount paths mapped to host dirs.

        Raises:
            ValueError: a referenced Secret or key is missing, or a PVC claim has no host dir.
        """
        mounts = self._mounts(pod, container)

        def local(text: str) -> str:
            for mount_path, host in mounts:
                if text == mount_path or text.startswith(mount_path.rstrip("/") + "/"):
                    return str(host) + text[len(mount_path.rstrip("/")):]
                text = text.replace("=" + mount_path.rstrip("/") + "/", "=" + str(host) + "/")
            return text

        env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
               "HOME": str(self.dir), "HOSTNAME": pod["metadata"]["name"]}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = local(str(item["value"]))
            elif "secretKeyRef" in item.get("valueFrom", {}):
                ref = item["valueFrom"]["secretKeyRef"]
                try:
                    secret = self.api.store.get(SECRETS, self.namespace, ref["name"])
                except ApiError:
                    if ref.get("optional"):
                        continue
                    raise ValueError(f'secret "{ref["name"]}" not found') from None
                data = {**{k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()},
                        **secret.get("stringData", {})}
                if ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise ValueError(f"couldn't find key {ref['key']} in Secret {self.namespace}/{ref['name']}")
                env[item["name"]] = data[ref["key"]]
        argv = [local(a) for a in container.get("command", []) + container.get("args", [])]
        if not argv:
            raise ValueError("the container has no command (the test server runs no image entrypoints)")
        script = 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"'
        wrapper = [*_unshare_prefix(), "sh", "-c", script, str(self.hosts), pod["metadata"]["name"]]
        cwd = local(container.get("workingDir", "")) or str(self.dir)
        return wrapper + argv, env, cwd

    def _mounts(self, pod: dict, container: dict) -> list[tuple[str, Path]]:
        """(mount path, host dir), longest path first."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        mounts = []
        for mount in container.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if claim not in self.api.volumes:
                    raise ValueError(f'persistentvolumeclaim "{claim}" not found')
                host = self.api.volumes[claim]
            elif "emptyDir" in volume:
                host = self.dir / pod["metadata"]["name"] / "emptydir" / mount["name"]
                host.mkdir(parents=True, exist_ok=True)
            else:
                continue
            mounts.append((mount["mountPath"], host / mount.get("subPath", "")))
        return sorted(mounts, key=lambda m: -len(m[0]))
