"""A Kubernetes API test server for the real `kubernetes` client and `kubectl`, with an operator mode.

What it serves (HTTPS with a self-signed certificate the kubeconfig trusts), through the kubeconfig :meth:`K8sServer.write_kubeconfig` writes (a bearer token of the
cluster admin, or of any user or service account):

* discovery (`/version`, `/api`, `/apis`, group and resource lists) as `kubectl` and the client read it;
* custom objects `pytorchjobs` (`kubeflow.org/v1`), `trainjobs` (`trainer.kubeflow.org/v1alpha1`), `rayjobs` and
  `rayclusters` (`ray.io/v1`), and core
  `pods` (read-only for clients), `pods/log`, `events`, `secrets` (`stringData` stored as base64 `data`),
  `persistentvolumeclaims` (one per claim of `volumes`; a created one checked as the API server's
  `ValidatePersistentVolumeClaimSpec` does; no update or patch: a bound claim's spec is immutable),
  `namespaces`, `configmaps`, `leases` (`coordination.k8s.io/v1`) and RBAC's `roles`, `clusterroles`, `rolebindings`,
  `clusterrolebindings`: create / get / list / merge-patch / replace / delete, with `resourceVersion` (a replace
  carrying a stale one gets 409 Conflict, the compare-and-set a Lease lock relies on; a Lease time not in
  MicroTime form gets 400), label and field selectors, Status bodies like the API server's (401 Unauthorized,
  403 Forbidden, 404 NotFound, 409 AlreadyExists or Conflict, 422 Invalid from the real CRD schema via
  tests/cluster/crd_schema.py), server-side `Table` for `kubectl get`, and watch streams
  (`?watch=true&resourceVersion=N`: chunked JSON lines, ADDED / MODIFIED / DELETED, resumed from N; an `ERROR`
  event with code 410 Expired when N is older than the retained history, as the API server sends it).
* authentication and RBAC authorisation of every request by the roles and bindings it holds
  (tests/cluster/k8s_rbac.py), each recorded in ``accesses`` with its caller and attributes (verb, API group,
  resource/subresource, namespace, name: ``k8s_rbac.Access``) for tests that check a step's calls (and a
  controller's pod creations, :meth:`K8sServer.create_pod` with its ``user``); Kubeflow's PodDefault webhook
  (tests/cluster/pod_defaults.py) on every pod created in a profile's namespace (labelled
  `app.kubernetes.io/part-of: kubeflow-profile`); Istio's sidecar
  injection into pods of namespaces labelled `istio-injection: enabled` (tests/cluster/istio_injection.py: the
  sidecar outlives the app container, so such a pod stays Running) and Pod Security admission of pods in namespaces
  labelled `pod-security.kubernetes.io/enforce` (tests/cluster/pod_security.py).

A PyTorchJob passes the Training Operator's validating webhook first (tests/cluster/pytorchjob_contract.py
``validate``, refused with 403 and the webhook's message); its per-pod headless services the API server refuses
(names over 63 characters) are FailedCreateService events, and those names do not resolve.
Operator mode (on by default) plays the Training Operator v1.9 and the kubelet for PyTorchJobs: one pod object
per replica, made as tests/cluster/pytorchjob_contract.py says the operator makes it (names, labels, the env on
every container, the `init-pytorch` init container of workers), admitted like any pod, and one local process
group per container that runs: the init containers in order, then the `pytorch` container (others are not run;
an injected `istio-proxy` is reported running until the pod is deleted),
each with its own `command` + `args` (`$(VAR)` expanded), its env (`secretKeyRef` and `fieldRef` resolved; other env
forms, `envFrom`, and volumes other than claims, emptyDirs and projected ones are a CreateContainerConfigError
naming the field) and a minimal image env (`PATH`, `HOME`, `HOSTNAME`; `PYTHONPATH` at the checkout under test,
which the image holds). Pod names resolve like a cluster's headless services do: each pod process runs in its own
mount and UTS namespaces (`unshare`; hostname = pod name) with a private `/etc/hosts` mapping every pod of its job
(`<job>-master-0`, `<job>-worker-<i>`) to 127.0.0.1 (`nslookup` answers from it), so `MASTER_ADDR` stays the
operator's value.
Differences from a cluster, all deliberate: all pods share the host network, so the operator's port 23456
(declared or defaulted `pytorchjob-port`, or an elastic `rdzvPort` of 23456) becomes a free host port per job,
while any other declared port is used as it is; `volumeMounts` are mapped by rewriting the mount path prefix in
command, args, env values and workingDir to a host dir (a PVC claim -> the dir given in `volumes`, an emptyDir
-> a fresh dir per pod, a projected volume -> a folder of its files); a mount whose top-level folder the host lacks
(``/s3``, ``/kfp-launcher``) is bound at its own path instead, in a root of the host's folders the process is
chrooted into; a securityContext is checked by admission but not applied to the process.
Job status follows the operator: conditions Created, Running, Restarting, Succeeded, Failed; `restartPolicy:
ExitCode` recreates a pod whose exit code is >= 128 (backoffLimit not applied) and fails the job on 1..127;
`OnFailure` restarts the container in place (restartCount, CrashLoopBackOff); `cleanPodPolicy` and
`activeDeadlineSeconds` apply; a pod that admission refuses is a `FailedCreatePod` event on the job, which stays
Created. Scheduling checks the pod's resources against one node's `capacity` less what the bound pods that have not
ended request (kube-scheduler's NodeResourcesFit filter, `fit.go` `fitsRequest`, with its `fit_test.go` cases as
vectors): a pod that does not fit stays Pending/Unschedulable with a FailedScheduling event until room frees.
Images in `unpullable_images` stay in ImagePullBackOff; a pod named in `killed_pods` is SIGKILLed (exit 137) each
time it starts, reporting the reason given there (`OOMKilled`, or `Error` for a plain kill).
That is the default runtime (``cluster.k8s_operator.ProcessRuntime``); ``runtime=DockerRuntime()``
(tests/cluster/docker_kubelet.py) runs each container as a container of its image instead, as ``make e2e`` does.
TrainJobs run the way Kubeflow Trainer v2.3.0 runs them: tests/cluster/trainer_operator.py (its webhook, runtimes,
JobSet and Job controllers, cited from their source); the server holds Trainer's default ClusterTrainingRuntime.
RayJobs and RayClusters run the way KubeRay v1.7.0 runs them: tests/cluster/kuberay_operator.py (the RayJob and
RayCluster controllers, the submitter's Job; the pods run `ray start` and `ray job submit`, cited from KubeRay's
source). InferenceServices run the way KServe v0.20.0 runs them in Knative mode: tests/cluster/kserve_operator.py
(its webhook, the predictor and ingress reconcilers, revisions, the traffic split behind a loopback route at
`status.url`, the payload logger). A pod without `restartPolicy` gets the API server's default, `Always`.
"""
from __future__ import annotations

import base64
import binascii
import copy
import json
import os
import re
import ssl
import threading
import time
import uuid

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import yaml
from cluster import (istio_injection, kserve_operator, kuberay_operator, pod_defaults, pod_security,
                     pytorchjob_contract, tls, trainer_operator)
from cluster.crd_schema import printer_columns, validate as validate_crd
from cluster.k8s_operator import (JOB_NAME_LABEL, REPLICA_INDEX_LABEL, REPLICA_TYPE_LABEL, ProcessRuntime, Runtime,
                                _JobController, _PodRun, _terminate, quantity)
from cluster.k8s_rbac import ADMIN_USER, BOOTSTRAP, Access, Authorizer, Identities, User, service_account_user
from cluster.k8s_validation import aggregate, claim_refusal, webhook_denied
from cluster.k8s_store import (_BY_PATH, EVENTS, INFERENCESERVICES, LEASES, NAMESPACES, PERSISTENT_VOLUME_CLAIMS, PODS,
                             PYTORCHJOBS, RAYCLUSTERS, RAYJOBS, RESOURCES, SECRETS, TRAINJOBS, ApiError,
                             Resource, Store, field_matcher, label_matcher, merge_patch, now)

__all__ = ["JOB_NAME_LABEL", "REPLICA_INDEX_LABEL", "REPLICA_TYPE_LABEL", "K8sServer"]


# ------------------------------------------------------------------------------------------------ HTTP

CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError)
"""What writing to a client that hung up raises (over TLS: an unexpected EOF)."""


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
        self.server.api.received.append((self.command, self.path, raw))
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
        except CLIENT_GONE:
            pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    api: "K8sServer"


_NS_PATH = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))"
                      r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


class K8sServer:
    """The test API server (see the module docstring). Use as a context manager; :meth:`close` stops every pod.

    Args:
        workdir: where pod logs, hosts files and emptyDirs go.
        namespace: the kubeconfig's default namespace.
        volumes: PVC claim name -> host dir of that volume; each claim is also a PersistentVolumeClaim object in
            ``namespace``, Bound, ``ReadWriteMany`` (replace it through the API to give it other access modes).
        capacity: the one node's allocatable resources (``cpu`` in cores, ``memory`` in bytes, ``pods`` a count,
            extended resources by name), shared by every pod bound to it; pods that do not fit stay Unschedulable
            (kube-scheduler's NodeResourcesFit, ``cluster.k8s_operator.fits_request``).
        operator: run PyTorchJobs as local processes.
        pytorch_init_container_template: the operator's ``--pytorch-init-container-template-file`` (its text);
            None: the operator's default ``init-pytorch``.
        pytorch_init_container_image: the operator's ``--pytorch-init-container-image`` (default ``alpine:3.10``).
        runtime: what runs the pods' containers: local process groups (default), or
            ``cluster.docker_kubelet.DockerRuntime``'s containers of each pod's image.
    """

    def __init__(self, workdir: Path, *, namespace: str = "default", volumes: dict[str, Path] | None = None,
                 capacity: dict[str, float] | None = None, operator: bool = True,
                 pytorch_init_container_template: str | None = None,
                 pytorch_init_container_image: str = pytorchjob_contract.INIT_CONTAINER_IMAGE,
                 runtime: Runtime | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.namespace = namespace
        self.volumes = {claim: Path(path) for claim, path in (volumes or {}).items()}
        self.capacity = {"cpu": float(os.cpu_count() or 2) * 8, "memory": 256 * 2**30, **(capacity or {})}
        self.scheduling = threading.Lock()
        """Held while a pod is checked against the node's room and bound to it."""
        self.operator = operator
        self.pytorch_init_container_template = pytorch_init_container_template
        self.pytorch_init_container_image = pytorch_init_container_image
        self.runtime: Runtime = runtime or ProcessRuntime()
        self.unpullable_images: set[str] = set()
        """Images whose pods stay in ImagePullBackOff."""
        self.killed_pods: dict[str, str] = {}
        """Pod name -> terminated reason (``OOMKilled``, ``Error``): SIGKILLed every time it starts."""
        self.requests: list[str] = []
        """``METHOD path -> status`` of every request answered, in order."""
        self.received: list[tuple[str, str, bytes]] = []
        """``(METHOD, path, body as sent)`` of every request with a body, in order."""
        self.pod_defaults: list[dict] = []
        """The PodDefaults (kubeflow.org/v1alpha1, checked by ``pod_defaults.checked``) the admission webhook applies
        to the pods created (tests/cluster/pod_defaults.py)."""
        self.token_audiences: dict[str, Callable[[str, str], str]] = {}
        """Audience -> issuer of a service account's token (namespace, name) the service of that audience accepts;
        any other audience gets a token of this API server (:meth:`service_account_token`)."""
        self.accesses: list[Access] = []
        """Every authenticated request's authorization attributes, its user and RBAC's answer, in order."""
        self.store = Store()
        self.identities = Identities()
        self.authorizer = Authorizer(self.store)
        for resource, body in BOOTSTRAP:
            self.store.create(resource, "", body)
        for name in dict.fromkeys(("default", "kube-system", namespace)):
            self.store.create(NAMESPACES, "", {"metadata": {"name": name,
                                                            "labels": {"kubernetes.io/metadata.name": name}}})
        for claim in self.volumes:
            self.store.create(PERSISTENT_VOLUME_CLAIMS, namespace, {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Bound", "accessModes": ["ReadWriteMany"], "capacity": {"storage": "1Gi"}}})
        if operator:
            trainer_operator.install_runtimes(self.store)
        self._runs: dict[tuple[str, str], _PodRun] = {}
        self._jobs: dict[tuple[str, ...], Any] = {}
        """The controllers of the jobs (and RayClusters) in operator mode, by (kind plural,) namespace and name."""
        self._http = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._http.api = self
        self.ca_pem, context = tls.self_signed(self.workdir)
        self._http.socket = context.wrap_socket(self._http.socket, server_side=True, do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="k8s-test-server", daemon=True)

    # -- lifecycle

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._http.server_address[1]}"

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
        for controller in list(self._jobs.values()):
            if isinstance(controller, kuberay_operator.RayClusterController):
                controller.cleanup()
        self.store.close()
        self._http.shutdown()
        self._http.server_close()

    def write_kubeconfig(self, path: Path, user: User = ADMIN_USER, namespace: str | None = None) -> Path:
        """A kubeconfig whose current context points at this server and ``namespace`` (default: the server's), with
        a bearer token of ``user`` (default: the cluster admin, group ``system:masters``; for a service account
        :func:`cluster.k8s_rbac.service_account_user`)."""
        namespace = namespace or self.namespace
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "k8s-test",
                  "clusters": [{"name": "k8s-test", "cluster": {
                      "server": self.url, "certificate-authority-data": base64.b64encode(self.ca_pem).decode()}}],
                  "users": [{"name": "k8s-test", "user": {"token": self.identities.issue(user)}}],
                  "contexts": [{"name": "k8s-test",
                                "context": {"cluster": "k8s-test", "user": "k8s-test", "namespace": namespace}}]}
        Path(path).write_text(yaml.safe_dump(config))
        return Path(path)

    # -- test helpers (what a test reads besides the API)

    def pod_log(self, namespace: str, name: str) -> str:
        """The pod's container log so far ("" before it started), as ``GET pods/log`` answers it."""
        run = self._runs.get((namespace, name))
        return run.log.read_text(errors="replace") if run is not None and run.log.exists() else ""

    def live_pids(self) -> list[int]:
        """Host pids of pod containers still running."""
        return [pid for run in list(self._runs.values()) if run.container and (pid := run.container.pid)]

    # -- request handling

    def handle(self, h: _Handler, method: str, path: str, query: dict[str, str], body: Any) -> None:
        user = self.identities.authenticate(h.headers.get("Authorization", ""))
        if path in ("/version", "/api", "/apis") or path.startswith("/api/v1") and path.count("/") == 2 \
                or path.startswith("/apis/") and path.count("/") <= 3:
            self.accesses.append(Access(user, method.lower(), "", "", "", "", method, path,
                                self.authorizer.allows_path(user, method.lower(), path)))
            self.authorizer.authorize_path(user, method.lower(), path)
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on {path}")
            return h._send_json(200, self._discovery(path))
        m = _NS_PATH.match(path)
        resource = _BY_PATH.get((m.group("g") or "", m.group("v") or m.group("cv"), m.group("plural"))) if m else None
        if resource is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace, name, sub = m.group("ns"), m.group("name"), m.group("sub")
        if (resource.namespaced and name and not namespace) or (namespace and not resource.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace = namespace if resource.namespaced else ""
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(method)
        if method == "GET":
            verb = "get" if name else ("watch" if query.get("watch", "").lower() in ("true", "1") else "list")
        self._authorize(user, verb, resource, sub, namespace, name, method, path)
        if sub == "log" and resource is PODS and method == "GET":
            return self._log(h, namespace, name, query)
        if sub not in (None, "status"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if verb not in resource.verbs or (verb == "create" and name):
            raise ApiError(405, "MethodNotAllowed", f"{verb} is not supported on {resource.qualified}")
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
            return (res == resource and namespace in (None, obj["metadata"].get("namespace", ""))
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
        except CLIENT_GONE:
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
                    finished = run.stopped.is_set() or run.container is None or not run.container.running()
                    data = log.read()
                    if data:
                        h._chunk(data)
                    elif finished or self.store.closed:
                        break
                    else:
                        run.stopped.wait(0.1)
            h._chunk(b"")
        except CLIENT_GONE:
            pass

    # -- verbs (also used by the operator)

    def create(self, resource: Resource, namespace: str, body: Any) -> dict:
        """Validate (CRDs: the real schema, strictly) and store; PyTorchJobs, TrainJobs, RayJobs and RayClusters
        start in operator mode."""
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        if resource.crd:
            body.setdefault("apiVersion", resource.api_version)
            body.setdefault("kind", resource.kind)
            self._validate(resource, body)
        _check_micro_times(resource, body)
        if resource is SECRETS:
            _encode_string_data(body)
        if resource is PERSISTENT_VOLUME_CLAIMS and (refusal := claim_refusal(body)):
            raise ApiError(422, "Invalid", refusal, {"name": body["metadata"].get("name", ""),
                                                     "kind": "PersistentVolumeClaim"})
        if resource is PYTORCHJOBS:
            _admit_pytorchjob(body)
        if resource is TRAINJOBS:
            return trainer_operator.create(self, namespace, body)
        if resource in (RAYJOBS, RAYCLUSTERS):
            return kuberay_operator.create(self, resource, namespace, body)
        if resource is INFERENCESERVICES:
            return kserve_operator.create(self, namespace, body)
        obj = self.store.create(resource, namespace, body)
        if resource is PYTORCHJOBS and self.operator:
            self.start_controller(PYTORCHJOBS, namespace, _JobController(self, namespace, obj))
        return obj

    def start_controller(self, resource: Resource, namespace: str, controller: Any) -> None:
        """Keep ``controller`` (of the object it was made for, ``controller.name``) under ``(plural, namespace,
        name)`` and start it; :meth:`stop_controller` ends it."""
        self._jobs[(resource.plural, namespace, controller.name)] = controller
        controller.start()

    def controller(self, resource: Resource, namespace: str, name: str) -> Any:
        """The controller of ``name`` (None when none runs): its test helpers (e.g. a KServe route's counts)."""
        return self._jobs.get((resource.plural, namespace, name))

    def stop_controller(self, resource: Resource, namespace: str, name: str) -> Any:
        """Stop and forget the controller of ``name``, if one runs; returns it (None when none did)."""
        controller = self._jobs.pop((resource.plural, namespace, name), None)
        if controller is not None:
            controller.stop()
        return controller

    def service_account_token(self, namespace: str, name: str, audience: str = "") -> str:
        """A token of service account ``namespace/name`` for ``audience`` (TokenRequest, as the kubelet asks it for a
        projected ``serviceAccountToken``): the audience's issuer in :attr:`token_audiences`, else this server's."""
        issuer = self.token_audiences.get(audience)
        return issuer(namespace, name) if issuer else self.identities.issue(service_account_user(namespace, name))

    def _authorize(self, user: User, verb: str, resource: Resource, sub: str | None, namespace: str | None,
                   name: str | None, method: str, path: str) -> None:
        """RBAC asked once about a resource request: its answer recorded in :attr:`accesses`, the API server's 403
        raised when it refuses (kubernetes ``staging/src/k8s.io/apiserver/pkg/endpoints/filters/authorization.go``
        ``WithAuthorization``: authorization before the request reaches its handler)."""
        refusal = self.authorizer.refusal(user, verb, resource, sub, namespace, name)
        what = f"{resource.plural}/{sub}" if sub else resource.plural
        self.accesses.append(Access(user, verb, resource.group, what, namespace, name or "", method, path,
                                    refusal is None))
        if refusal is not None:
            raise refusal

    def create_pod(self, namespace: str, pod: dict, *, user: User | None = None) -> dict:
        """Admit and store a pod, as the API server does for a controller's pod creation: RBAC's ``create pods`` of
        ``user`` (a controller's service account; None: an operator of this server, not authorized), recorded in
        :attr:`accesses`; the mutating webhooks where the namespace has them, Kubeflow's PodDefaults (a profile's,
        tests/cluster/pod_defaults.py) and Istio's sidecar injection (tests/cluster/istio_injection.py); then Pod
        Security of the namespace's ``pod-security.kubernetes.io/enforce`` label.

        Raises:
            ApiError: 403 Forbidden when RBAC denies ``user`` or the namespace's Pod Security level refuses the pod;
                400 when the PodDefaults conflict with the pod.
        """
        if user is not None:
            self._authorize(user, "create", PODS, None, namespace, None, "POST", f"/api/v1/namespaces/{namespace}/pods")
        try:
            labels = self.store.get(NAMESPACES, "", namespace)["metadata"].get("labels") or {}
        except ApiError:
            labels = {}
        try:
            pod_defaults.admit(self.pod_defaults, namespace, labels, pod)
        except pod_defaults.Conflict as err:  # main.go toAdmissionResponse: a Result with no code, which
            # apiserver webhook/errors/statuserror.go ToStatusErr answers as 400 with the webhook's name
            raise ApiError(400, "", err.denial) from None
        if istio_injection.injection_required(namespace, labels, pod):  # mutating admission, before validating
            istio_injection.inject(pod)
        refusal = pod_security.admit(labels, pod)
        if refusal:
            raise ApiError(403, "Forbidden", refusal, {"name": pod["metadata"]["name"], "kind": "pods"})
        pod["spec"].setdefault("restartPolicy", "Always")  # the API server's default (core/v1 SetDefaults_PodSpec)
        pod.setdefault("status", {})["qosClass"] = qos_class(pod["spec"])
        return self.store.create(PODS, namespace, pod)

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
                updated = {**updated, **kept, "apiVersion": current["apiVersion"], "kind": current["kind"]}
            else:
                patch = {"status": body.get("status")} if sub == "status" else {k: v for k, v in body.items()
                                                                                if k != "status"}
                updated = merge_patch(current, patch)
            if resource.crd and sub != "status":  # an update by PUT or PATCH: the schema, then the webhooks
                candidate = {k: v for k, v in updated.items() if k != "status"}
                candidate["metadata"] = {k: v for k, v in updated["metadata"].items()
                                         if k in ("name", "namespace", "labels", "annotations")}
                self._validate(resource, candidate)
                if resource is PYTORCHJOBS:
                    _admit_pytorchjob(candidate, current)
                if resource is INFERENCESERVICES:
                    kserve_operator.admit(candidate, current)
            return updated

        _check_micro_times(resource, body)
        if resource is SECRETS:
            _encode_string_data(body)
        expect = (body.get("metadata") or {}).get("resourceVersion") if method == "PUT" else None
        return self.store.update(resource, namespace, name, change, expect_version=expect)

    def delete(self, resource: Resource, namespace: str, name: str) -> dict:
        """Delete; a job's pods go with it (their processes are stopped), as owner references make them (a RayJob's
        RayCluster and submitter too)."""
        obj = self.store.delete(resource, namespace, name)
        if resource is PYTORCHJOBS:
            self.stop_controller(PYTORCHJOBS, namespace, name)
            for pod in self.store.list(PODS, namespace, f"{JOB_NAME_LABEL}={name}")[0]:
                self.delete_pod(namespace, pod["metadata"]["name"])
        elif resource is TRAINJOBS:
            trainer_operator.deleted(self, namespace, name)
        elif resource in (RAYJOBS, RAYCLUSTERS):
            kuberay_operator.deleted(self, resource, namespace, name)
        elif resource is INFERENCESERVICES:
            kserve_operator.deleted(self, namespace, name)
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


def _admit_pytorchjob(job: dict, old: dict | None = None) -> None:
    """The Training Operator's validating webhook (tests/cluster/pytorchjob_contract.py ``validate``).

    Raises:
        ApiError: 403 with the webhook's denial, as the API server answers it.
    """
    _, errors = pytorchjob_contract.validate(job, old)
    if errors:
        raise ApiError(403, "Forbidden", webhook_denied(pytorchjob_contract.WEBHOOK, aggregate(errors)))


def qos_class(pod_spec: dict) -> str:
    """The pod's QoS class as the API server sets ``status.qosClass`` (kubernetes ``pkg/apis/core/helper/qos``,
    ``ComputePodQOS``): Guaranteed when every container, init containers included, has cpu and memory limits and
    requests equal to them (a missing request defaults to the limit); BestEffort with no cpu or memory request or
    limit anywhere; else Burstable."""
    containers = [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]
    guaranteed, best_effort = True, True
    for container in containers:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for name in ("cpu", "memory"):
            limit, request = limits.get(name), requests.get(name, limits.get(name))
            best_effort = best_effort and limit is None and request is None
            guaranteed = guaranteed and limit is not None and quantity(request) == quantity(limit)
    return "BestEffort" if best_effort else "Guaranteed" if guaranteed else "Burstable"


def _encode_string_data(secret: dict) -> None:
    """A Secret's write-only ``stringData`` merged into ``data`` as base64 (its keys win), as the API server
    stores it; ``data`` values must be base64.

    Raises:
        ApiError: 400 when a ``data`` value is not base64.
    """
    data = secret.get("data") or {}
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise ApiError(400, "BadRequest", f"Secret in version \"v1\" cannot be handled as a Secret: illegal "
                                              f"base64 data in data.{key}") from None
    for key, value in (secret.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    if data:
        secret["data"] = data


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
    """The server-side Table `kubectl get` asks for: NAME, then a CRD's ``additionalPrinterColumns`` (an ``age``
    column shows the creation time), or AGE."""
    printed = printer_columns(resource.api_version, resource.kind) if resource.crd else []
    printed = printed or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    columns = [{"name": "Name", "type": "string", "format": "name", "description": "Name"}]
    columns += [{"name": c["name"], "type": c["type"], "format": "", "description": c.get("description", "")}
                for c in printed]
    rows = []
    for obj in items:
        cells = [obj["metadata"]["name"]] + [_json_path(obj, c["jsonPath"]) for c in printed]
        rows.append({"cells": cells, "object": {"kind": "PartialObjectMetadata",
                                                "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(revision)},
            "columnDefinitions": columns, "rows": rows}


def _json_path(obj: dict, path: str) -> Any:
    """A printer column's value: a dotted path (``.status.head.podIP``), ``[-1:]`` taking a list's last item;
    "" when absent."""
    value: Any = obj
    for part in path.strip(".").split("."):
        name, last = (part[:-5], True) if part.endswith("[-1:]") else (part, False)
        value = value.get(name) if isinstance(value, dict) else None
        if last:
            value = value[-1] if isinstance(value, list) and value else None
    return "" if value is None else value
