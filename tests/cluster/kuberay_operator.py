"""Operator mode of the Kubernetes API test server (tests/cluster/k8s_server.py) for RayJobs and RayClusters
(``ray.io/v1``): KubeRay v1.7.0's RayJob and RayCluster controllers and the Job controller of the submitter, each
pod a local process group run by the kubelet of tests/cluster/k8s_operator.py, really running Ray.

Everything a pod gets is written here from KubeRay's source at tag v1.7.0 (``ray-operator/controllers/ray/``) and
cited by file and function, never from kfloop's code:

* ``utils/constant.go``: labels, default ports, container and group names, event reasons, ``KUBERAY_VERSION``;
  ``utils/util.go``: names (``PodName``, ``GenerateRayClusterName``, ``GenerateRayJobId``,
  ``GenerateHeadServiceName``, ``GenerateFQDNServiceName``, ``GetContainerCommand``, ``FetchHeadServiceURL``).
* ``common/pod.go``: ``DefaultHeadPodTemplate`` / ``DefaultWorkerPodTemplate`` (the worker's ``wait-gcs-ready``
  init container), ``labelPod``, ``setMissingRayStartParams``, ``generateRayStartCommand`` and ``convertParamMap``
  (the ``ray start`` command), ``BuildPod`` (``ulimit -n ...; ray start ...`` as ``/bin/bash -c --``, the
  ``/dev/shm`` emptyDir), ``setContainerEnvVars`` / ``setInitContainerEnvVars`` (``RAY_ADDRESS``, ``RAY_PORT``,
  ``KUBERAY_GEN_RAY_START_CMD``, ``FQ_RAY_IP`` ...), ``SetContainerTokenAuthEnvVars`` (``RAY_AUTH_MODE``,
  ``RAY_AUTH_TOKEN`` from the cluster's Secret).
* ``common/job.go``: ``BuildJobSubmitCommand`` (wait for the dashboard's GCS health, ``ray job status`` || ``ray job
  submit --no-wait``, then ``ray job logs --follow``), ``GetSubmitterTemplate``.
* ``raycluster_controller.go``: ``reconcileAuthSecret`` / ``createAuthSecret``, ``reconcilePods`` (one head,
  ``replicas`` workers per group within min/max, ``shouldDeletePod``: a pod that ended is deleted and replaced, a
  deleted pod is replaced), ``calculateStatus`` (``state: ready`` once every pod runs, replica counts, the
  ``HeadPodReady`` and ``RayClusterProvisioned`` conditions), and their Events.
* ``rayjob_controller.go``: ``Reconcile``'s state machine of ``jobDeploymentStatus`` (New -> Initializing ->
  Running -> Complete / Failed; Retrying under ``backoffLimit``; Suspending -> Suspended and back to New with
  ``spec.suspend``; ValidationFailed from ``utils/validation.go`` ``ValidateRayJobSpec``), ``initRayJobStatusIfNeed``,
  ``constructRayClusterForRayJob`` (labels), ``getSubmitterTemplate`` / ``configureSubmitterContainer``,
  ``createNewK8sJob`` (the submitter Job named after the RayJob, backoffLimit 2), ``checkSubmitterAndUpdateStatus
  IfNeeded``, ``checkActiveDeadlineAndUpdateStatusIfNeeded``, ``checkBackoffLimitAndUpdateStatusIfNeeded``,
  ``handleShutdownAfterJobFinishes`` (the RayCluster deleted ``ttlSecondsAfterFinished`` after the end; the submitter
  Job and the RayJob stay), ``deleteClusterResources`` / ``deleteSubmitterJob``, and their Events. The Ray job's
  status comes from the head's dashboard (``GET /api/jobs/<id>``, header ``x-ray-authorization``, as
  ``utils/dashboardclient`` asks it).

Token authentication is Ray 2.60's own (read from its wheel): ``ray start`` turns it on only with
``RAY_AUTH_MODE=token`` or a token file (``_private/authentication/authentication_token_setup.py``
``maybe_enable_token_auth_if_token_available``), the dashboard then wants ``Authorization`` or
``X-Ray-Authorization: Bearer <token>`` except on its health paths (``http_token_authentication.py``,
``dashboard/http_server_head.py``), and ``ray job submit`` sends the token of ``RAY_AUTH_TOKEN``
(``get_auth_headers_if_auth_enabled``). Pods get no env from the test process, only their spec's: a RayCluster with
``authOptions.mode: token`` gets KubeRay's Secret and env, one without runs Ray without authentication.

Not played: ``clusterSelector`` (an existing cluster), the HTTP, Interactive and Sidecar submission modes, the
autoscaler, GCS fault tolerance, ``deletionStrategy``'s legacy ``onSuccess``/``onFailure`` and its DeleteWorkers
policy; a deleted RayJob goes at once (KubeRay's finalizer first stops
the Ray job through the dashboard).

Deliberate differences from a cluster, all forced by every pod sharing this host's network and disk:

* Ports: each RayCluster gets free loopback ports for the GCS (``--port``, KubeRay's default 6379), the dashboard
  (``--dashboard-port``, 8265) and the Ray client server (10001), and each Ray pod its own metrics and dashboard agent
  ports (KubeRay fixes 8080 and 52365); every node gets ``--node-ip-address=127.0.0.1`` (a pod's own IP in a
  cluster), which Ray 2.60 turns into this machine's own address (``services.resolve_ip_for_localhost``), so all
  nodes share one address that never leaves the machine; the dashboard binds ``--dashboard-host=127.0.0.1``
  (KubeRay: ``0.0.0.0``); Ray's worker processes take ports from the OS
  (``--min-worker-port=0 --max-worker-port=0``: Ray's default range overlaps the test servers' free ports); and each
  Ray node keeps its session under a short dir of its own (``--temp-dir``: ``/tmp/ray`` would be shared by every pod,
  and a pod's emptyDir path is too long for Ray's Unix sockets). ``--disable-usage-stats``: nothing leaves loopback.
  ``KUBERAY_GEN_RAY_START_CMD`` holds the command as run.
* Services are no objects here: ``<cluster>-head-svc`` and its FQDN resolve to 127.0.0.1 in the pods' hosts file,
  and the operator itself reaches the dashboard at 127.0.0.1.
* The submitter's Kubernetes Job lives in the operator (the server serves no ``batch/v1`` Jobs); its pods are real.
* Probes: the Ray containers get KubeRay's (``initLivenessAndReadinessProbe``, by ``rayVersion``), and a Ray pod
  counts as ready only while its readiness probe passes, run by the operator (:meth:`RayClusterController._ready`):
  an HTTP probe asks the node's port on loopback, an exec probe runs on this host, except that ``wget`` exists only
  in the images :data:`IMAGES_WITH_WGET` names (the pods are local processes, so "the image" is this capability,
  not a file system): a RayCluster of kfloop's image without ``rayVersion`` >= 2.53 never becomes ready, as on a
  cluster. Liveness probes are written, not run (their 30 s delay and 120 failures take 10 minutes).
* Reconciles follow the store's changes, at least every :data:`REQUEUE_SECONDS` (KubeRay: 3 s), and the
  submitter's finish-timeout is KubeRay's 30 s.
"""
from __future__ import annotations

import base64
import copy
import json
import math
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from cluster.k8s_operator import _JobController, quantity
from cluster.k8s_store import PODS, RAYCLUSTERS, RAYJOBS, SECRETS, ApiError, Resource, now
from cluster.kuberay_validation import (Invalid, parse_generic, validate_raycluster_metadata, validate_raycluster_spec,
                                      validate_rayjob)
from cluster.server_process import free_ports

if TYPE_CHECKING:
    from cluster.k8s_server import K8sServer

# ---------------------------------------------------------------- KubeRay v1.7.0, utils/constant.go
CLUSTER_LABEL, NODE_TYPE_LABEL, GROUP_LABEL = "ray.io/cluster", "ray.io/node-type", "ray.io/group"
IS_RAY_NODE_LABEL, IDENTIFIER_LABEL = "ray.io/is-ray-node", "ray.io/identifier"
CR_NAME_LABEL, CRD_LABEL = "ray.io/originated-from-cr-name", "ray.io/originated-from-crd"
"""``RayOriginatedFromCRNameLabelKey`` / ``RayOriginatedFromCRDLabelKey`` (value ``RayJob``:
``RayOriginatedFromCRDLabelValue(RayJobCRD)``)."""
SUBMISSION_MODE_LABEL = "ray.io/job-submission-mode"
REPLICA_INDEX_LABEL = "ray.io/worker-group-replica-index"
"""``RayWorkerReplicaIndexKey``, set on worker pods under the ``RayMultiHostIndexing`` feature gate (on by default,
``pkg/features/features.go``)."""
APP_NAME_LABEL, CREATED_BY_LABEL = "app.kubernetes.io/name", "app.kubernetes.io/created-by"
APPLICATION_NAME, COMPONENT_NAME = "kuberay", "kuberay-operator"
HEAD_GROUP = "headgroup"
"""``RayNodeHeadGroupLabelValue``: the head's ``ray.io/group``."""
SUBMITTER_CONTAINER = "ray-job-submitter"
GCS_PORT, DASHBOARD_PORT, CLIENT_PORT, METRICS_PORT, AGENT_PORT = 6379, 8265, 10001, 8080, 52365
"""``DefaultGcsServerPort``, ``DefaultDashboardPort``, ``DefaultClientPort``, ``DefaultMetricsPort``,
``DefaultDashboardAgentListenPort`` (each replaced by a free port here; see the module docstring)."""
GCS_HEALTH_PATH = "api/gcs_healthz"
"""``RayDashboardGCSHealthPath``: whitelisted from token auth by Ray 2.60's dashboard (``http_server_head.py``)."""
PYTHON_HEALTH_COMMAND = ('python -c "import urllib.request; r=urllib.request.urlopen(\'{url}\', timeout={timeout}); '
                         "exit(0 if b'success' in r.read() else 1)\"")
"""``BasePythonHealthCommand`` (args: url, ``RayDashboardGCSHealthCheckTimeoutSeconds`` = 10)."""
WGET_HEALTH_COMMAND = "wget --tries 1 -T {timeout} -q -O- http://localhost:{port}/{path} | grep success"
"""``BaseWgetHealthCommand`` (args: timeout_sec, port, path)."""
RAYLET_HEALTH_PATH, NODE_HEALTH_PATH = "api/local_raylet_healthz", "/api/healthz"
"""``RayAgentRayletHealthPath`` (the exec probes'), ``RayNodeHealthPath`` (the HTTP probe of Ray >= 2.53)."""
READINESS_PROBE = {"initialDelaySeconds": 10, "periodSeconds": 5, "successThreshold": 1, "failureThreshold": 10}
LIVENESS_PROBE = {"initialDelaySeconds": 30, "periodSeconds": 5, "successThreshold": 1, "failureThreshold": 120}
"""``DefaultReadinessProbe*`` / ``DefaultLivenessProbe*``; timeouts 2 s (``DefaultReadinessProbeTimeoutSeconds``),
5 s on the head (``DefaultHeadReadinessProbeTimeoutSeconds``, ``DefaultHeadLivenessProbeTimeoutSeconds``)."""
IMAGES_WITH_WGET = ("rayproject/ray:", "docker.io/rayproject/ray:")
"""The image capability the exec probes need: KubeRay's own Ray images have ``wget``; every other image is taken
to have none, as kfloop's (deploy/Dockerfile, from ``python:3.11-slim-bookworm``, installs no wget) has none."""
CLUSTER_DOMAIN = "cluster.local"
"""``DefaultDomainName`` of ``GetClusterDomainName``."""
KUBERAY_VERSION = "v1.7.0"
AUTH_TOKEN_KEY = "auth_token"
"""``RAY_AUTH_TOKEN_SECRET_KEY``: the key of the token in the cluster's auth Secret."""
SUBMITTER_BACKOFF_LIMIT = 2
"""``createNewK8sJob``: the submitter Job's backoffLimit unless ``submitterConfig.backoffLimit`` says otherwise."""
SUBMITTER_FINISHED_TIMEOUT = 30.0
"""``DefaultSubmitterFinishedTimeout`` (rayjob_controller.go)."""
TERMINAL_JOB_STATUSES = ("SUCCEEDED", "FAILED", "STOPPED")
"""``IsJobTerminal`` (apis/ray/v1/rayjob_types.go)."""
REQUEUE_SECONDS = 0.5
"""The longest a controller waits between reconciles when nothing in the store changes (KubeRay: 3 s)."""
_RAND_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""k8s.io/apimachinery ``rand.String``'s alphabet (``GenerateRayClusterName``, ``generateName`` suffixes)."""


def rand5() -> str:
    """``rand.String(5)``."""
    return "".join(secrets.choice(_RAND_ALPHABET) for _ in range(5))


def check_name(name: str) -> str:
    """``utils.CheckName``: at most 50 characters (the tail kept), no leading digit or punctuation."""
    name = name[-50:]
    return "r" + name[1:] if name[0].isdigit() or not name[0].isalnum() else name


# ------------------------------------------------------------------------------------------------ the Ray pods

def ray_start_command(node_type: str, params: dict[str, str], resources: dict) -> str:
    """``generateRayStartCommand`` + ``convertParamMap``: ``num-cpus`` from the cpu limit (else request) rounded up,
    ``memory`` from the memory limit, ``num-gpus`` from a GPU limit, then ``--key=value`` sorted by key, ``true``
    flags bare and ``false`` ones dropped."""
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    cpu = limits.get("cpu") or requests.get("cpu")
    if "num-cpus" not in params and cpu:
        params["num-cpus"] = str(math.ceil(quantity(cpu)))
    if "memory" not in params and limits.get("memory"):
        params["memory"] = str(int(quantity(limits["memory"])))
    gpus = next((v for k, v in sorted(limits.items()) if k.endswith("gpu")), None)
    if "num-gpus" not in params and gpus and quantity(gpus):
        params["num-gpus"] = str(int(quantity(gpus)))
    flags = ""
    for key in sorted(params):
        value = params[key]
        if value.lower() in ("true", "false") and key not in ("log-color", "include-dashboard", "include-log-monitor"):
            flags += f" --{key} " if value.lower() == "true" else ""
        else:
            flags += f" --{key}={value} "
    return f"ray start --head {flags}" if node_type == "head" else f"ray start {flags}"


def label_pod(node_type: str, cluster: str, group: str, template_labels: dict[str, str]) -> dict[str, str]:
    """``labelPod``: KubeRay's labels, the template's on top except ``ray.io/node-type``, ``group`` and ``cluster``."""
    labels = {IS_RAY_NODE_LABEL: "yes", CLUSTER_LABEL: cluster, NODE_TYPE_LABEL: node_type, GROUP_LABEL: group,
              IDENTIFIER_LABEL: f"{cluster}-{node_type}"[-63:], APP_NAME_LABEL: APPLICATION_NAME,
              CREATED_BY_LABEL: COMPONENT_NAME}
    labels.update({k: v for k, v in template_labels.items() if k not in (NODE_TYPE_LABEL, GROUP_LABEL, CLUSTER_LABEL)})
    return labels


def init_probes(container: dict, node_type: str, params: dict[str, str], ray_version: str) -> None:
    """``initLivenessAndReadinessProbe``: unless the container has its own, readiness and liveness probes that ask
    the node's dashboard agent ``/api/healthz`` over HTTP when ``rayVersion`` >= 2.53 (``supportsUnifiedHealth
    Check``), else exec probes running ``wget`` against the raylet's health (and on the head the GCS's: its timeout
    is ``DefaultReadinessProbeFailureThreshold``, as upstream writes it)."""
    agent, dashboard = params.get("dashboard-agent-listen-port", AGENT_PORT), params.get("dashboard-port",
                                                                                          DASHBOARD_PORT)
    try:
        unified = parse_generic(ray_version) >= (2, 53)
    except ValueError:
        unified = False
    commands = [WGET_HEALTH_COMMAND.format(timeout=2, port=agent, path=RAYLET_HEALTH_PATH)]
    if node_type == "head":
        commands.append(WGET_HEALTH_COMMAND.format(timeout=10, port=dashboard, path=GCS_HEALTH_PATH))
    action = {"httpGet": {"path": NODE_HEALTH_PATH, "port": int(agent)}} if unified else \
        {"exec": {"command": ["bash", "-c", " && ".join(commands)]}}
    timeout = {"timeoutSeconds": 5 if node_type == "head" else 2}
    container.setdefault("livenessProbe", {**LIVENESS_PROBE, **timeout, **action})
    container.setdefault("readinessProbe", {**READINESS_PROBE, **timeout, **action})


def probe_failure(probe: dict, image: str) -> str:
    """The kubelet running ``probe`` in a container of ``image`` on this host: "" when it passes, else why not. An
    exec probe calling ``wget`` in an image without it (:data:`IMAGES_WITH_WGET`) fails as bash does."""
    if "httpGet" in probe:
        url = f"http://127.0.0.1:{probe['httpGet']['port']}{probe['httpGet']['path']}"
        try:
            with urllib.request.urlopen(url, timeout=probe["timeoutSeconds"]):
                return ""
        except urllib.error.HTTPError as exc:
            return f"HTTP probe failed with statuscode: {exc.code}"
        except OSError as exc:
            return f'Get "{url}": {exc}'
    command = probe["exec"]["command"]
    if "wget" in command[-1] and not image.startswith(IMAGES_WITH_WGET):
        return "bash: line 1: wget: command not found"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=probe["timeoutSeconds"])
    except subprocess.TimeoutExpired:
        return f"command timed out after {probe['timeoutSeconds']}s"
    return "" if done.returncode == 0 else (done.stdout + done.stderr).strip() or f"exit code {done.returncode}"


def token_auth_env(cluster: dict) -> list[dict]:
    """``SetContainerTokenAuthEnvVars`` for a cluster with ``authOptions.mode: token`` (none otherwise): the mode
    and the token from the cluster's Secret (``authOptions.secretName``, else the cluster's ``CheckName``)."""
    auth = cluster["spec"].get("authOptions") or {}
    if auth.get("mode") != "token":
        return []
    secret = auth.get("secretName") or check_name(cluster["metadata"]["name"])
    return [{"name": "RAY_AUTH_MODE", "value": "token"},
            {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": AUTH_TOKEN_KEY}}}]


def _upsert_env(env: list[dict], items: list[dict]) -> list[dict]:
    """Append ``items`` whose names ``env`` does not hold yet (``utils.EnvVarExists`` checks)."""
    names = {e["name"] for e in env}
    return env + [e for e in items if e["name"] not in names]


class RayClusterController(_JobController):
    """KubeRay's RayCluster reconcile for one RayCluster (its auth Secret, head and worker pods, status); the pods
    run on the kubelet of :class:`cluster.k8s_operator._JobController`."""

    def __init__(self, api: K8sServer, namespace: str, cluster: dict):
        self._setup(api, namespace, cluster)
        self.run_policy: dict = {}  # the kubelet's in-place restarts: no backoffLimit on a Ray pod
        self.refused = ""
        """The validation message of the last Event about this RayCluster being invalid."""
        self.probes: dict[str, tuple[float, str]] = {}
        """Each Ray pod's last readiness probe: when (monotonic) and why it failed ("" when it passed)."""
        self.temp_root = Path(tempfile.mkdtemp(prefix="kr-", dir="/var/tmp"))
        """Each Ray node's ``--temp-dir`` lives under this short path (Unix socket paths hold 107 bytes)."""
        self.gcs_port, self.dashboard_port, self.client_port = free_ports(3)
        self.service = f"{self.name}-head-svc"  # GenerateHeadServiceName(RayClusterCRD, ...)
        self.fqdn = f"{self.service}.{namespace}.svc.{CLUSTER_DOMAIN}"  # GenerateFQDNServiceName
        self._write_pod_files([f"{self.fqdn} {self.service}"])

    @property
    def dashboard_url(self) -> str:
        """``FetchHeadServiceURL(..., DashboardPortName)``: ``<head service FQDN>:<dashboard port>``."""
        return f"{self.fqdn}:{self.dashboard_port}"

    def start(self) -> None:
        threading.Thread(target=self._loop, name=f"raycluster-{self.name}", daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()

    def cleanup(self) -> None:
        """Remove the Ray nodes' session dirs once their pods are gone."""
        shutil.rmtree(self.temp_root, ignore_errors=True)

    def _loop(self) -> None:
        revision = 0
        while not self.stopping.is_set():
            try:
                cluster = self.api.store.get(RAYCLUSTERS, self.namespace, self.name)
            except ApiError:
                return self.stop()
            self._reconcile(cluster)
            revision = _wait_for_change(self.api, revision, self.stopping)

    # -- raycluster_controller.go

    def _reconcile(self, cluster: dict) -> None:
        """``rayClusterReconcile``: an invalid RayCluster gets a Warning Event (once here, where the reconcile runs
        every :data:`REQUEUE_SECONDS`) and nothing else (``ValidateRayClusterMetadata``, ``ValidateRayClusterSpec``)."""
        for reason, what, check in (
                ("InvalidRayClusterMetadata", "metadata", lambda: validate_raycluster_metadata(cluster["metadata"])),
                ("InvalidRayClusterSpec", "spec",
                 lambda: validate_raycluster_spec(cluster["spec"], cluster["metadata"].get("annotations")))):
            try:
                check()
            except Invalid as exc:
                message = f"The RayCluster {what} is invalid {self.namespace}/{self.name}: {exc}"
                if message != self.refused:
                    self._event(cluster, reason, message, "Warning")
                    self.refused = message
                return
        self._auth_secret(cluster)
        error = self._reconcile_pods(cluster)
        self._status(cluster, error)

    def _auth_secret(self, cluster: dict) -> None:
        """``reconcileAuthSecret``: with ``authOptions.mode: token`` and no ``secretName``, a Secret named after the
        cluster holding a random token (``createAuthSecret``: 32 random bytes, base64)."""
        auth = cluster["spec"].get("authOptions") or {}
        if auth.get("mode") != "token" or auth.get("enableK8sTokenAuth") or auth.get("secretName"):
            return
        name = check_name(self.name)
        try:
            self.api.store.get(SECRETS, self.namespace, name)
        except ApiError:
            self.api.create(SECRETS, self.namespace, {
                "metadata": {"name": name, "labels": {CLUSTER_LABEL: self.name},
                             "ownerReferences": [_owner(cluster)]},
                "stringData": {AUTH_TOKEN_KEY: base64.b64encode(secrets.token_bytes(32)).decode()}})

    def auth_token(self) -> str:
        """The token the operator's dashboard client sends (``GetRayDashboardClientFunc``), "" without auth."""
        env = token_auth_env(self.job)
        if not env:
            return ""
        ref = env[1]["valueFrom"]["secretKeyRef"]
        try:
            secret = self.api.store.get(SECRETS, self.namespace, ref["name"])
        except ApiError:
            return ""
        return base64.b64decode(secret.get("data", {}).get(AUTH_TOKEN_KEY, "")).decode()

    def _pods(self, **labels: str) -> list[dict]:
        selector = ",".join(f"{k}={v}" for k, v in {CLUSTER_LABEL: self.name, **labels}.items())
        return self.api.store.list(PODS, self.namespace, selector)[0]

    def _reconcile_pods(self, cluster: dict) -> str:
        """``reconcilePods``: replace a head or worker pod that ended (``shouldDeletePod``), create the missing head
        and workers (each group's ``replicas`` within ``minReplicas``..``maxReplicas``), drop extra workers. Returns
        the reconcile error (KubeRay returns one after deleting pods, and creates their replacements next time)."""
        spec = cluster["spec"]
        heads = self._pods(**{NODE_TYPE_LABEL: "head"})
        for pod in heads:
            if _should_delete(pod):
                self._delete_pod(cluster, pod, "DeletedHeadPod", "head")
                return f"delete unhealthy head Pod {pod['metadata']['name']}"
        if not heads:
            self._create_pod(cluster, "head", spec["headGroupSpec"], HEAD_GROUP)
        for group in spec.get("workerGroupSpecs") or []:
            name = group["groupName"]
            pods = self._pods(**{GROUP_LABEL: name})
            unhealthy = [p for p in pods if _should_delete(p)]
            for pod in unhealthy:
                self._delete_pod(cluster, pod, "DeletedWorkerPod", "worker")
            if unhealthy:
                return f"delete {len(unhealthy)} unhealthy worker Pods"
            wanted = _desired(group)
            used = {int(p["metadata"]["labels"].get(REPLICA_INDEX_LABEL, -1)) for p in pods}
            for _ in range(wanted - len(pods)):
                index = next(i for i in range(wanted + len(pods)) if i not in used)  # the next free replica index
                used.add(index)
                self._create_pod(cluster, "worker", group, name, index)
            for pod in pods[:max(0, len(pods) - wanted)]:
                self.api.delete_pod(self.namespace, pod["metadata"]["name"])
                self._event(cluster, "DeletedWorkerPod", f"Deleted Pod {self.namespace}/{pod['metadata']['name']}")
        return ""

    def _delete_pod(self, cluster: dict, pod: dict, reason: str, node_type: str) -> None:
        self.api.delete_pod(self.namespace, pod["metadata"]["name"])
        status = pod.get("status", {})
        terminated = ((status.get("containerStatuses") or [{}])[0].get("state") or {}).get("terminated")
        self._event(cluster, reason, f"Deleted {node_type} Pod {self.namespace}/{pod['metadata']['name']}; Pod "
                                     f"status: {status.get('phase')}; Pod restart policy: "
                                     f"{pod['spec'].get('restartPolicy')}; Ray container terminated status: "
                                     f"{terminated}")

    def _event(self, cluster: dict, reason: str, message: str, type_: str = "Normal") -> None:
        self.api.record_event(self.namespace, cluster, reason=reason, message=message, type_=type_)

    def _create_pod(self, cluster: dict, node_type: str, group: dict, group_name: str, index: int = 0) -> None:
        """``createHeadPod`` / ``createWorkerPod`` through admission, with its Event; then the kubelet runs it."""
        pod = self.build_pod(cluster, node_type, group, group_name, index)
        kind = "head" if node_type == "head" else "worker"
        try:
            pod = self.api.create_pod(self.namespace, pod)
        except ApiError as exc:
            what = f"head Pod {self.namespace}/{pod['metadata']['name']}" if kind == "head" else \
                f"worker Pod for the cluster {self.namespace}/{self.name}"
            self._event(cluster, f"FailedToCreate{kind.title()}Pod", f"Failed to create {what}, {exc}", "Warning")
            return
        name = pod["metadata"]["name"]
        self._event(cluster, f"Created{kind.title()}Pod", f"Created {kind} Pod {self.namespace}/{name}")
        with self.hosts.open("a") as hosts:  # the pod's own hostname resolves, as in its pod
            hosts.write(f"127.0.0.1 {name}\n")
        threading.Thread(target=self._kubelet, args=(pod, group_name, index), name=f"pod-{name}",
                         daemon=True).start()

    def build_pod(self, cluster: dict, node_type: str, group: dict, group_name: str, index: int = 0) -> dict:
        """The pod KubeRay makes for ``group`` (``buildHeadPod`` / ``buildWorkerPod``: ``DefaultHeadPodTemplate`` /
        ``DefaultWorkerPodTemplate``, then ``BuildPod``), with this host's ports (see the module docstring)."""
        template = copy.deepcopy(group["template"])
        metadata, spec = template.get("metadata") or {}, template["spec"]
        container = spec["containers"][0]  # RayContainerIndex
        prefix = self.name if node_type == "head" else f"{self.name}-{group_name}"
        name = f"{prefix[:50]}-{node_type}-{rand5()}".lower()  # PodName(..., isGenerateName) + the API's suffix
        labels = label_pod(node_type, self.name, group_name, metadata.get("labels") or {})
        head_port = str((cluster["spec"]["headGroupSpec"].get("rayStartParams") or {}).get("port", self.gcs_port))
        params = dict(group.get("rayStartParams") or {})
        auth = token_auth_env(cluster)
        if node_type == "worker":
            labels[REPLICA_INDEX_LABEL] = str(index)
            # DefaultWorkerPodTemplate: wait until the GCS answers (ENABLE_INIT_CONTAINER_INJECTION is on by default)
            wait = f"""
					SECONDS=0
					while true; do
						if (( SECONDS <= 120 )); then
							if ray health-check --address {self.fqdn}:{head_port} > /dev/null 2>&1; then
								echo "GCS is ready."
								break
							fi
							echo "$SECONDS seconds elapsed: Waiting for GCS to be ready."
						else
							if ray health-check --address {self.fqdn}:{head_port}; then
								echo "GCS is ready. Any error messages above can be safely ignored."
								break
							fi
							echo "$SECONDS seconds elapsed: Still waiting for GCS to be ready. For troubleshooting, refer to the FAQ at https://docs.ray.io/en/master/cluster/kubernetes/troubleshooting.html."
						fi
						sleep 5
					done
				"""
            init = {"name": "wait-gcs-ready", "image": container.get("image", ""),
                    "imagePullPolicy": container.get("imagePullPolicy", "IfNotPresent"),
                    "command": ["/bin/bash", "-c", "--"], "args": [wait],
                    "securityContext": copy.deepcopy(container.get("securityContext", {})),
                    "env": copy.deepcopy(container.get("env", [])),
                    "volumeMounts": copy.deepcopy(container.get("volumeMounts", [])),
                    "resources": {"limits": {"cpu": "200m", "memory": "256Mi"},
                                  "requests": {"cpu": "200m", "memory": "256Mi"}}}
            spec["initContainers"] = spec.get("initContainers", []) + [init]
            params.setdefault("address", f"{self.fqdn}:{head_port}")  # setMissingRayStartParams
        else:
            params.setdefault("dashboard-host", "0.0.0.0")
        params.setdefault("metrics-export-port", str(METRICS_PORT))
        params["block"] = "true"
        params.setdefault("dashboard-agent-listen-port", str(AGENT_PORT))
        # this host's network and disk (module docstring): free ports, loopback, a session dir of the node's own
        metrics_port, agent_port = free_ports(2)
        params.update({"metrics-export-port": str(metrics_port), "dashboard-agent-listen-port": str(agent_port),
                       "node-ip-address": "127.0.0.1", "min-worker-port": "0", "max-worker-port": "0",
                       "temp-dir": str(self.temp_root / name.rsplit("-", 1)[1]), "disable-usage-stats": "true"})
        if node_type == "head":
            params.update({"port": head_port, "dashboard-port": str(self.dashboard_port),
                           "ray-client-server-port": str(self.client_port), "dashboard-host": "127.0.0.1"})
        ports = container.setdefault("ports", [])
        if not any(p.get("name") == "metrics" for p in ports):
            ports.append({"name": "metrics", "containerPort": METRICS_PORT})
        # BuildPod: /dev/shm for the object store unless mounted or plasma-directory is set
        mounts = container.setdefault("volumeMounts", [])
        if "plasma-directory" not in params and not any(m["mountPath"] == "/dev/shm" for m in mounts):
            mounts.append({"name": "shared-mem", "mountPath": "/dev/shm"})
            limit = (container.get("resources") or {}).get("limits", {}).get("memory")
            spec.setdefault("volumes", []).append({"name": "shared-mem", "emptyDir": {
                "medium": "Memory", **({"sizeLimit": limit} if limit else {})}})
        init_probes(container, node_type, params, cluster["spec"].get("rayVersion", ""))
        start = ray_start_command(node_type, params, container.get("resources") or {})
        user = " ".join(f" {part} " for part in container.get("command", []) + container.get("args", []))
        generated = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {start}"
        if "ray start" not in user:
            container["command"] = ["/bin/bash", "-c", "--"]  # GetContainerCommand
            container["args"] = [f"{user} && {generated}" if user else generated]
        for init in spec.get("initContainers", []):  # setInitContainerEnvVars
            init["env"] = init.get("env", []) + [{"name": "FQ_RAY_IP", "value": self.fqdn},
                                                 {"name": "RAY_IP", "value": self.service}]
            if init["name"] == "wait-gcs-ready":
                init["env"] = _upsert_env(init["env"], auth)  # configureTokenAuth
        env = container.get("env", [])
        if node_type == "worker":
            env += [{"name": "FQ_RAY_IP", "value": self.fqdn}, {"name": "RAY_IP", "value": self.service}]
        env += [{"name": "RAY_CLUSTER_NAME",
                 "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{CLUSTER_LABEL}']"}}},
                {"name": "RAY_CLUSTER_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "RAY_CLOUD_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "RAY_NODE_TYPE_NAME",
                 "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{GROUP_LABEL}']"}}},
                {"name": "KUBERAY_GEN_RAY_START_CMD", "value": start}]
        address = f"127.0.0.1:{head_port}" if node_type == "head" else f"{self.fqdn}:{head_port}"
        env = _upsert_env(env, [{"name": "RAY_PORT", "value": head_port}, {"name": "RAY_ADDRESS", "value": address},
                                {"name": "RAY_USAGE_STATS_KUBERAY_IN_USE", "value": "1"}])
        if node_type == "head":
            crd = (cluster["metadata"].get("labels") or {}).get(CRD_LABEL, "RayCluster")
            env.append({"name": "RAY_USAGE_STATS_EXTRA_TAGS",
                        "value": f"kuberay_version={KUBERAY_VERSION};kuberay_crd={crd}"})
        container["env"] = _upsert_env(_upsert_env(env, [{"name": "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE",
                                                           "value": "1"}]), auth)
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "labels": labels,
                             "annotations": {**(metadata.get("annotations") or {}),
                                             **({"ray.io/ft-enabled": "false"} if node_type == "head" else {})},
                             "ownerReferences": [_owner(cluster)]},
                "spec": spec, "status": {"phase": "Pending", "conditions": []}}

    def _status(self, cluster: dict, error: str) -> None:
        """``calculateStatus``: replica counts, ``state: ready`` once the head and every desired worker run, the
        ``HeadPodReady`` and ``RayClusterProvisioned`` conditions (``RayClusterStatusConditions`` is on by default)."""
        pods = self._pods()
        workers = [p for p in pods if p["metadata"]["labels"].get(NODE_TYPE_LABEL) == "worker"]
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running" and self._ready(cluster, p)]
        groups = cluster["spec"].get("workerGroupSpecs") or []
        desired = sum(_desired(g) for g in groups)
        status = copy.deepcopy(cluster.get("status") or {})
        status.update(
            readyWorkerReplicas=sum(p in running for p in workers), availableWorkerReplicas=sum(
                p in running for p in workers), desiredWorkerReplicas=desired,
            minWorkerReplicas=sum(g.get("minReplicas", 0) for g in groups),
            maxWorkerReplicas=sum(g.get("maxReplicas", 2**31 - 1) for g in groups),
            observedGeneration=cluster["metadata"].get("generation", 1),
            endpoints={"client": str(self.client_port), "dashboard": str(self.dashboard_port),
                       "gcs-server": str(self.gcs_port), "metrics": str(METRICS_PORT)})
        if not error and len(pods) == desired + 1 and len(running) == len(pods):
            status.update(state="ready", reason="")
        head = next((p for p in pods if p["metadata"]["labels"].get(NODE_TYPE_LABEL) == "head"), None)
        if head is not None:
            status["head"] = {"podName": head["metadata"]["name"], "podIP": head.get("status", {}).get("podIP", ""),
                              "serviceName": self.service, "serviceIP": "127.0.0.1"}
        conditions = {c["type"]: c for c in status.get("conditions", [])}
        head_ready = head is not None and head in running
        _set_condition(conditions, "HeadPodReady", head_ready, "HeadPodRunningAndReady" if head_ready else
                       "HeadPodNotFound" if head is None else "Unknown", "" if head else "Head Pod not found")
        if conditions.get("RayClusterProvisioned", {}).get("status") != "True":
            provisioned = bool(pods) and len(running) == len(pods) == desired + 1
            _set_condition(conditions, "RayClusterProvisioned", provisioned,
                           "AllPodRunningAndReadyFirstTime" if provisioned else "RayClusterPodsProvisioning",
                           "All Ray Pods are ready for the first time" if provisioned else
                           "RayCluster Pods are being provisioned for first time")
        status["conditions"] = list(conditions.values())
        if status == (cluster.get("status") or {}):
            return
        if status.get("state") != (cluster.get("status") or {}).get("state"):
            status.setdefault("stateTransitionTimes", {})[status.get("state", "")] = now()
        status["lastUpdateTime"] = now()
        try:
            self.api.store.update(RAYCLUSTERS, self.namespace, self.name, lambda c: c.update(status=status))
        except ApiError:
            self.stop()

    def _ready(self, cluster: dict, pod: dict) -> bool:
        """The Ray container's readiness probe, run every ``periodSeconds`` once it passed, at every reconcile while
        it fails (``initialDelaySeconds`` is not waited: readiness shows no later than on a cluster); its first
        failure gets the kubelet's ``Unhealthy`` Event."""
        name, container = pod["metadata"]["name"], pod["spec"]["containers"][0]
        probe = container.get("readinessProbe")
        if probe is None:
            return True
        at, failure = self.probes.get(name, (-math.inf, ""))
        if failure or time.monotonic() - at >= probe["periodSeconds"]:
            failure = probe_failure(probe, container.get("image", ""))
            if failure and not self.probes.get(name, (0, ""))[1]:
                self.api.record_event(self.namespace, pod, reason="Unhealthy", type_="Warning",
                                      message=f"Readiness probe failed: {failure}")
            self.probes[name] = (time.monotonic(), failure)
        return not failure

    # -- the kubelet's hooks

    def _master_running(self) -> bool:
        return False  # no job conditions: the RayCluster's status comes from _status

    def _pod_finished(self, rtype: str, index: int, name: str, exit_code: int) -> None:
        """A Ray pod that ended (``restartPolicy: Never``) is the reconcile's to replace (``shouldDeletePod``)."""


def _should_delete(pod: dict) -> bool:
    """``shouldDeletePod``: the pod ended (Failed, Succeeded), or its Ray container ended under ``Never``."""
    status = pod.get("status", {})
    if status.get("phase") in ("Failed", "Succeeded"):
        return True
    terminated = ((status.get("containerStatuses") or [{}])[0].get("state") or {}).get("terminated")
    return status.get("phase") == "Running" and terminated is not None and pod["spec"].get("restartPolicy") == "Never"


def _desired(group: dict) -> int:
    """``GetWorkerGroupDesiredReplicas``: ``replicas`` within ``minReplicas``..``maxReplicas``, 0 when suspended."""
    if group.get("suspend"):
        return 0
    low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
    replicas = group.get("replicas")
    wanted = low if replicas is None or replicas < low else min(replicas, high)
    return wanted * group.get("numOfHosts", 1)


def _set_condition(conditions: dict[str, dict], kind: str, true: bool, reason: str, message: str) -> None:
    """``meta.SetStatusCondition``: the transition time changes only with the status."""
    value = "True" if true else "False"
    old = conditions.get(kind)
    stamp = old["lastTransitionTime"] if old and old["status"] == value else now()
    conditions[kind] = {"type": kind, "status": value, "reason": reason, "message": message,
                        "lastTransitionTime": stamp}


def _owner(obj: dict) -> dict:
    """``SetControllerReference`` to ``obj``."""
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _wait_for_change(api: K8sServer, revision: int, stopping: threading.Event) -> int:
    """Wait until the store changes after ``revision`` (or :data:`REQUEUE_SECONDS`); the store's revision."""
    store = api.store
    with store.lock:
        if store.revision == revision and not store.closed and not stopping.is_set():
            store.lock.wait(REQUEUE_SECONDS)
        if store.closed:
            stopping.set()
        return store.revision


# ------------------------------------------------------------------------------------------------ the submitter

class SubmitterJob(_JobController):
    """The submitter's Kubernetes Job (``createNewK8sJob``) and the Job controller's handling of its pods
    (``<rayjob>-<suffix>``, restartPolicy Never): Complete when a pod succeeds, a new pod per failure until the
    failures pass ``backoffLimit`` (Failed, BackoffLimitExceeded)."""

    def __init__(self, api: K8sServer, namespace: str, rayjob: dict, template: dict, cluster: RayClusterController):
        self._setup(api, namespace, rayjob, f"{rayjob['metadata']['name']}-submitter-")
        self.run_policy: dict = {}
        self._write_pod_files([f"{cluster.fqdn} {cluster.service}"])
        self.template = template
        self.backoff_limit = ((rayjob["spec"].get("submitterConfig") or {}).get("backoffLimit")
                              if (rayjob["spec"].get("submitterConfig") or {}).get("backoffLimit") is not None
                              else SUBMITTER_BACKOFF_LIMIT)
        self.uid = secrets.token_hex(16)
        self.failures = 0
        self.condition: dict | None = None
        """The Job's Complete or Failed condition once it has one (type, reason, message, lastTransitionTime)."""

    def start(self) -> None:
        self._start_pod()

    def _start_pod(self) -> None:
        template = copy.deepcopy(self.template)
        labels = {**(template.get("metadata") or {}).get("labels", {}), "batch.kubernetes.io/controller-uid": self.uid,
                  "batch.kubernetes.io/job-name": self.name, "controller-uid": self.uid, "job-name": self.name}
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": self.name, "uid": self.uid}}
        try:
            pod = self.api.create_pod(self.namespace, {
                "metadata": {"name": f"{self.name}-{rand5()}", "labels": labels,
                             "annotations": (template.get("metadata") or {}).get("annotations", {}),
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": self.name,
                                                  "uid": self.uid, "controller": True}]},
                "spec": template["spec"], "status": {"phase": "Pending", "conditions": []}})
        except ApiError as exc:  # kubernetes pkg/controller/controller_utils.go, RealPodControl.createPods
            self.api.record_event(self.namespace, job, reason="FailedCreate", message=f"Error creating: {exc}",
                                  type_="Warning")
            return
        name = pod["metadata"]["name"]
        self.api.record_event(self.namespace, job, reason="SuccessfulCreate", message=f"Created pod: {name}")
        threading.Thread(target=self._kubelet, args=(pod, "submitter", 0), name=f"pod-{name}", daemon=True).start()

    def _master_running(self) -> bool:
        return False

    def _pod_finished(self, rtype: str, index: int, name: str, exit_code: int) -> None:
        if self.stopping.is_set() or self.condition:
            return
        if exit_code == 0:
            self.condition = {"type": "Complete", "reason": "CompletionsReached",
                              "message": "Reached expected number of succeeded pods", "at": time.time()}
            return
        self.failures += 1
        if self.failures > self.backoff_limit:
            self.condition = {"type": "Failed", "reason": "BackoffLimitExceeded",
                              "message": "Job has reached the specified backoff limit", "at": time.time()}
            return
        self._start_pod()

    def delete(self) -> None:
        """The Job deleted with its pods (background propagation)."""
        self.stop()
        for pod in self.api.store.list(PODS, self.namespace, f"job-name={self.name}")[0]:
            self.api.delete_pod(self.namespace, pod["metadata"]["name"])


def submit_command(rayjob: dict, dashboard_url: str) -> str:
    """``BuildJobSubmitCommand`` for K8sJobMode, joined with spaces as ``configureSubmitterContainer`` does."""
    spec, status = rayjob["spec"], rayjob["status"]
    address = dashboard_url if dashboard_url.startswith("http://") else f"http://{dashboard_url}"
    job_id = status["jobId"]
    health = PYTHON_HEALTH_COMMAND.format(url=f"{address}/{GCS_HEALTH_PATH}", timeout=10)
    cmd = ["until", health, ">/dev/null", "2>&1", ";", "do", "echo",
           json.dumps(f"Waiting for Ray Dashboard GCS to become healthy at {address} ..."), ";", "sleep", "2", ";",
           "done", ";", "if", "!", "ray", "job", "status", "--address", address, job_id, ">/dev/null", "2>&1", ";",
           "then", "ray", "job", "submit", "--address", address, "--no-wait"]
    if spec.get("runtimeEnvYAML"):  # getRuntimeEnvJson
        cmd += ["--runtime-env-json", json.dumps(json.dumps(yaml.safe_load(spec["runtimeEnvYAML"]),
                                                            separators=(",", ":")))]
    if spec.get("metadata"):
        cmd += ["--metadata-json", json.dumps(json.dumps(spec["metadata"], separators=(",", ":")))]
    cmd += ["--submission-id", job_id]
    for key, flag in (("entrypointNumCpus", "--entrypoint-num-cpus"), ("entrypointNumGpus", "--entrypoint-num-gpus")):
        if spec.get(key, 0) > 0:
            cmd += [flag, f"{float(spec[key]):f}"]
    if spec.get("entrypointResources"):
        cmd += ["--entrypoint-resources", json.dumps(spec["entrypointResources"])]
    cmd += ["--", spec["entrypoint"].strip(), ";", "fi", ";", "ray", "job", "logs", "--address", address, "--follow",
            job_id]
    return " ".join(cmd)


def submitter_template(rayjob: dict, cluster: dict, dashboard_url: str) -> dict:
    """``getSubmitterTemplate``: ``submitterPodTemplate`` (else ``GetDefaultSubmitterContainer``'s), its first
    container running :func:`submit_command` under ``/bin/bash -ce --`` unless it has a command, with
    ``PYTHONUNBUFFERED``, ``RAY_DASHBOARD_ADDRESS``, ``RAY_JOB_SUBMISSION_ID``, the cluster's token auth env, and the
    labels tying it to the RayJob."""
    spec = rayjob["spec"]
    template = copy.deepcopy(spec.get("submitterPodTemplate") or {"spec": {"restartPolicy": "Never", "containers": [{
        "name": SUBMITTER_CONTAINER,
        "image": cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].get("image", ""),
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m", "memory": "200Mi"}}}]}})
    container = template["spec"]["containers"][0]
    if not container.get("command"):
        container["command"] = ["/bin/bash", "-ce", "--"]
        container["args"] = [submit_command(rayjob, dashboard_url)]
    container["env"] = container.get("env", []) + [
        {"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "RAY_DASHBOARD_ADDRESS", "value": dashboard_url},
        {"name": "RAY_JOB_SUBMISSION_ID", "value": rayjob["status"]["jobId"]}]
    container["env"] = _upsert_env(container["env"], token_auth_env(cluster))
    metadata = template.setdefault("metadata", {})
    metadata["labels"] = {**metadata.get("labels", {}), CR_NAME_LABEL: rayjob["metadata"]["name"],
                          CRD_LABEL: "RayJob", CREATED_BY_LABEL: COMPONENT_NAME}
    return template


# ------------------------------------------------------------------------------------------------ the RayJob

class RayJobController:
    """KubeRay's RayJob reconcile for one RayJob (K8sJobMode with its own RayCluster): see the module docstring."""

    def __init__(self, api: K8sServer, namespace: str, rayjob: dict):
        self.api, self.namespace, self.job = api, namespace, rayjob
        self.name = rayjob["metadata"]["name"]
        self.stopping = threading.Event()
        self.submitter: SubmitterJob | None = None
        self._started = self._ended = time.monotonic()
        """When the RayJob was initialized (its deadlines count from there) and when it ended (its TTL does)."""

    def start(self) -> None:
        threading.Thread(target=self._loop, name=f"rayjob-{self.name}", daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()
        if self.submitter:
            self.submitter.stop()

    def _event(self, reason: str, message: str, type_: str = "Normal") -> None:
        self.api.record_event(self.namespace, self.job, reason=reason, message=message, type_=type_)

    def _loop(self) -> None:
        revision = 0
        while not self.stopping.is_set():
            try:
                rayjob = self.api.store.get(RAYJOBS, self.namespace, self.name)
            except ApiError:
                return self.stop()
            old = rayjob.get("status") or {}
            status = copy.deepcopy(old)
            rayjob["status"] = status
            done = self._reconcile(rayjob, status)
            if status != old:
                try:
                    self.api.store.update(RAYJOBS, self.namespace, self.name, lambda j: j.update(status=status))
                except ApiError:
                    return self.stop()
            if done:
                return
            revision = _wait_for_change(self.api, revision, self.stopping)

    def _reconcile(self, rayjob: dict, status: dict) -> bool:
        """One pass of ``Reconcile``; True when the RayJob needs no more passes."""
        spec, deployment = rayjob["spec"], status.get("jobDeploymentStatus", "")
        if deployment == "ValidationFailed":
            return True
        reason, problem = validate_rayjob(rayjob)
        if problem:
            self._event(reason, f"{self.namespace}/{self.name}: {problem}", "Warning")
            status.update(jobDeploymentStatus="ValidationFailed", reason="ValidationFailed", message=problem)
            return True
        if deployment == "":  # initRayJobStatusIfNeed
            status.setdefault("jobId", spec.get("jobId") or f"{self.name}-{rand5()}")
            status.setdefault("rayClusterName", f"{self.name}-{rand5()}")
            status.setdefault("jobStatus", "")
            status.update(jobDeploymentStatus="Initializing", startTime=now())
            self._started = time.monotonic()
        elif deployment == "Initializing":
            if not (self._suspending(spec, status) or self._deadline(spec, status, "activeDeadlineSeconds")
                    or self._deadline(spec, status, "preRunningDeadlineSeconds")):
                cluster = self._cluster(rayjob, status)
                cluster_status = _cluster_status(self.api, self.namespace, cluster.name) if cluster else {}
                if cluster is not None and cluster_status.get("state") != "ready":
                    status["rayClusterStatus"] = cluster_status
                elif cluster is not None:
                    status["dashboardURL"] = cluster.dashboard_url
                    self._create_submitter(rayjob, cluster)
                    status["jobDeploymentStatus"] = "Running"
        elif deployment == "Running":
            if not (self._suspending(spec, status) or self._deadline(spec, status, "activeDeadlineSeconds")):
                self._running(rayjob, status)
        elif deployment in ("Suspending", "Retrying"):
            self._delete_cluster(status)
            self._delete_submitter()
            for key in ("rayClusterStatus", "rayClusterName", "dashboardURL", "jobId", "message", "reason",
                        "rayJobInfo"):
                status.pop(key, None)
            status.update(jobStatus="", jobDeploymentStatus="Suspended" if deployment == "Suspending" else "")
        elif deployment == "Suspended":
            if spec.get("suspend"):
                return False
            status.update(jobStatus="", jobDeploymentStatus="")
        elif deployment in ("Complete", "Failed"):
            return self._finished(spec, status)
        check_backoff_limit(spec, status)
        if status.get("jobDeploymentStatus") in ("Complete", "Failed") and deployment not in ("Complete", "Failed"):
            status["endTime"] = now()  # updateRayJobStatus
            self._ended = time.monotonic()
        return False

    def _suspending(self, spec: dict, status: dict) -> bool:
        """``updateStatusToSuspendingIfNeeded``."""
        if spec.get("suspend"):
            status["jobDeploymentStatus"] = "Suspending"
            return True
        return False

    def _deadline(self, spec: dict, status: dict, key: str) -> bool:
        """``checkActiveDeadlineAndUpdateStatusIfNeeded`` / ``checkPreRunningDeadlineAndUpdateStatusIfNeeded``."""
        if spec.get(key) is None or time.monotonic() - self._started < spec[key]:
            return False
        reason, name = (("DeadlineExceeded", "activeDeadlineSeconds") if key == "activeDeadlineSeconds" else
                        ("PreRunningDeadlineExceeded", "preRunningDeadlineSeconds"))
        label = name[0].upper() + name[1:]
        status.update(jobDeploymentStatus="Failed", reason=reason,
                      message=f"The RayJob has passed the {name}. StartTime: {status.get('startTime')}. "
                              f"{label}: {spec[key]}")
        return True

    def _cluster(self, rayjob: dict, status: dict) -> RayClusterController | None:
        """``getOrCreateRayClusterInstance`` with ``constructRayClusterForRayJob``'s labels and owner, and its
        Event."""
        name = status["rayClusterName"]
        controller = self.api._jobs.get((RAYCLUSTERS.plural, self.namespace, name))
        if controller is not None:
            return controller
        labels = {**(rayjob["metadata"].get("labels") or {}), CR_NAME_LABEL: self.name, CRD_LABEL: "RayJob",
                  SUBMISSION_MODE_LABEL: rayjob["spec"].get("submissionMode", "K8sJobMode")}
        body = {"apiVersion": RAYCLUSTERS.api_version, "kind": RAYCLUSTERS.kind,
                "metadata": {"name": name, "labels": labels,
                             "annotations": dict(rayjob["metadata"].get("annotations") or {}),
                             "ownerReferences": [_owner(rayjob)]},
                "spec": copy.deepcopy(rayjob["spec"]["rayClusterSpec"])}
        try:
            self.api.create(RAYCLUSTERS, self.namespace, body)
        except ApiError as exc:
            self._event("FailedToCreateRayCluster", f"Failed to create RayCluster {self.namespace}/{name}: {exc}",
                        "Warning")
            return None
        self._event("CreatedRayCluster", f"Created RayCluster {self.namespace}/{name}")
        return self.api._jobs.get((RAYCLUSTERS.plural, self.namespace, name))

    def _create_submitter(self, rayjob: dict, cluster: RayClusterController) -> None:
        """``createK8sJobIfNeed`` -> ``createNewK8sJob``: the Job named after the RayJob, and its Event."""
        if self.submitter is not None:
            return
        template = submitter_template(rayjob, cluster.job, cluster.dashboard_url)
        self.submitter = SubmitterJob(self.api, self.namespace, rayjob, template, cluster)
        self.submitter.start()
        self._event("CreatedRayJobSubmitter", f"Created Kubernetes Job {self.namespace}/{self.name}")

    def _running(self, rayjob: dict, status: dict) -> None:
        """The Running case: the submitter Job's end (``checkSubmitterAndUpdateStatusIfNeeded``, the 30 s
        finish-timeout), then the Ray job's status from the dashboard: terminal and the submitter done -> Complete, or
        Failed (AppFailed) when the Ray job FAILED."""
        condition = self.submitter.condition if self.submitter else None
        if condition and condition["type"] == "Failed":
            status["jobDeploymentStatus"] = "Failed"
            if status.get("jobStatus") == "FAILED":
                status["reason"] = "AppFailed"
            else:
                status.update(reason="SubmissionFailed", message=f"Job submission has failed. Reason: "
                                                                 f"{condition['reason']}. Message: "
                                                                 f"{condition['message']}")
            return
        finished = condition is not None
        if finished and time.time() - condition["at"] > SUBMITTER_FINISHED_TIMEOUT:
            status.update(jobStatus="FAILED", jobDeploymentStatus="Failed",
                          reason="JobDeploymentStatusTransitionGracePeriodExceeded",
                          message=f"The RayJob submitter finished at {time.strftime('%Y-%m-%d %H:%M:%S')} but the "
                                  f"ray job did not reach terminal state within 30s")
            return
        cluster = self.api._jobs.get((RAYCLUSTERS.plural, self.namespace, status["rayClusterName"]))
        if cluster is None:
            return
        info = job_info(cluster, status["jobId"])
        if info is None:
            if finished:
                status.update(jobDeploymentStatus="Failed", reason="AppFailed",
                              message="Submitter completed but Ray job not found in RayCluster.")
            return
        if not info:
            return  # the dashboard did not answer: requeue
        deployment, reason = "Running", ""
        if info["status"] in TERMINAL_JOB_STATUSES and finished:
            deployment = "Failed" if info["status"] == "FAILED" else "Complete"
            reason = "AppFailed" if info["status"] == "FAILED" else ""
        status.update(rayClusterStatus=_cluster_status(self.api, self.namespace, cluster.name),
                      jobStatus=info["status"], jobDeploymentStatus=deployment, reason=reason,
                      message=info.get("message") or "")
        times = {key: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(info[field] / 1000))
                 for key, field in (("startTime", "start_time"), ("endTime", "end_time")) if info.get(field)}
        if times:
            status["rayJobInfo"] = times

    def _finished(self, spec: dict, status: dict) -> bool:
        """The terminal case: nothing with ``clusterSelector``; else ``handleDeletionRules`` with
        ``deletionStrategy.deletionRules``, else ``handleShutdownAfterJobFinishes`` (the RayCluster deleted
        ``ttlSecondsAfterFinished`` after the end; the submitter Job stays, with the driver's logs). True once
        nothing is left to do."""
        if spec.get("clusterSelector"):
            return True
        if (spec.get("deletionStrategy") or {}).get("deletionRules") is not None:
            return self._deletion_rules(spec["deletionStrategy"]["deletionRules"], status)
        if not spec.get("shutdownAfterJobFinishes"):
            return True
        if time.monotonic() - self._ended < spec.get("ttlSecondsAfterFinished", 0):
            return False
        self._delete_cluster(status)
        return True

    def _deletion_rules(self, rules: list[dict], status: dict) -> bool:
        """``handleDeletionRules``: of the rules that match the status (``isDeletionRuleMatched``) and whose
        ``ttlSeconds`` since the end have passed, the most impactful not yet done (``selectMostImpactfulRule``:
        DeleteSelf, DeleteCluster, DeleteWorkers, DeleteNone; ``isDeletionActionCompleted``) runs, one per pass
        (``executeDeletionPolicy``). True once no matching rule is pending (DeleteWorkers is refused at creation:
        :func:`unplayed`)."""
        matched = [r for r in rules if r["condition"].get("jobStatus", status.get("jobStatus")) == status.get(
            "jobStatus") and r["condition"].get("jobDeploymentStatus", status["jobDeploymentStatus"]) ==
            status["jobDeploymentStatus"]]
        age = time.monotonic() - self._ended
        due = {r["policy"] for r in matched if age >= r["condition"].get("ttlSeconds", 0)}
        if "DeleteSelf" in due:
            self.api.delete(RAYJOBS, self.namespace, self.name)
            return True
        if "DeleteCluster" in due and self._cluster_exists(status):
            self._delete_cluster(status)
        return all(age >= r["condition"].get("ttlSeconds", 0) for r in matched)

    def _cluster_exists(self, status: dict) -> bool:
        try:
            self.api.store.get(RAYCLUSTERS, self.namespace, status.get("rayClusterName", ""))
        except ApiError:
            return False
        return True

    def _delete_cluster(self, status: dict) -> None:
        """``deleteClusterResources``, with its Event."""
        name = status.get("rayClusterName")
        if not name:
            return
        try:
            self.api.delete(RAYCLUSTERS, self.namespace, name)
        except ApiError:
            return
        self._event("DeletedRayCluster", f"Deleted cluster {self.namespace}/{name}")

    def _delete_submitter(self) -> None:
        """``deleteSubmitterJob``, with its Event."""
        if self.submitter is None:
            return
        self.submitter.delete()
        self.submitter = None
        self._event("DeletedRayJobSubmitter", f"Deleted submitter K8s Job {self.namespace}/{self.name}")


def check_backoff_limit(spec: dict, status: dict) -> None:
    """``checkBackoffLimitAndUpdateStatusIfNeeded``: count the attempt; a Failed one with retries left under
    ``backoffLimit`` (not for a deadline) becomes Retrying."""
    failed, succeeded = status.get("failed", 0), status.get("succeeded", 0)
    if status.get("jobDeploymentStatus") == "Failed":
        failed += 1
    if status.get("jobStatus") == "SUCCEEDED" and status.get("jobDeploymentStatus") == "Complete":
        succeeded += 1
    status.update(failed=failed, succeeded=succeeded)
    limit = spec.get("backoffLimit")
    if (status.get("jobDeploymentStatus") == "Failed" and limit is not None and failed < limit + 1
            and status.get("reason") not in ("DeadlineExceeded", "JobStatusCheckTimeoutExceeded")):
        status["jobDeploymentStatus"] = "Retrying"


def _cluster_status(api: K8sServer, namespace: str, name: str) -> dict:
    try:
        status = api.store.get(RAYCLUSTERS, namespace, name).get("status") or {}
    except ApiError:
        return {}
    return {k: v for k, v in status.items() if k != "lastUpdateTime"}


def job_info(cluster: RayClusterController, job_id: str) -> dict | None:
    """``GetJobInfo``: the Ray job's info from the head's dashboard; None when it does not know the job (404), {}
    when the dashboard does not answer."""
    request = urllib.request.Request(f"http://127.0.0.1:{cluster.dashboard_port}/api/jobs/{job_id}")
    token = cluster.auth_token()
    if token:
        request.add_header("x-ray-authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return None if exc.code == 404 else {}
    except (OSError, ValueError):
        return {}


# ------------------------------------------------------------------------------------------------ the server's hooks

def unplayed(rayjob: dict) -> list[str]:
    """What of a RayJob this emulation does not play (see the module docstring)."""
    spec = rayjob.get("spec") or {}
    strategy, cluster = spec.get("deletionStrategy") or {}, spec.get("rayClusterSpec") or {}
    return [name for name, used in (
        ("spec.clusterSelector", bool(spec.get("clusterSelector"))),
        (f"spec.submissionMode: {spec.get('submissionMode')}",
         spec.get("submissionMode", "K8sJobMode") != "K8sJobMode"),
        ("spec.deletionStrategy.onSuccess/onFailure", "onSuccess" in strategy or "onFailure" in strategy),
        ("the DeleteWorkers deletion rule", any(r.get("policy") == "DeleteWorkers"
                                                for r in strategy.get("deletionRules") or [])),
        ("spec.rayClusterSpec.enableInTreeAutoscaling", bool(cluster.get("enableInTreeAutoscaling"))),
        ("spec.rayClusterSpec.gcsFaultToleranceOptions", "gcsFaultToleranceOptions" in cluster)) if used]


def create(server: K8sServer, resource: Resource, namespace: str, body: dict) -> dict:
    """Store a RayJob or a RayCluster (validated by the server against the CRD) and, in operator mode, reconcile
    it: a RayCluster's pods run Ray. A RayJob KubeRay would accept but that uses what this emulation does not play
    is refused (501, naming it: no real server answers so), never run as something else.

    Raises:
        ApiError: 501, see :func:`unplayed`.
    """
    if server.operator and resource is RAYJOBS and not validate_rayjob(body)[1] and (missing := unplayed(body)):
        raise ApiError(501, "NotImplemented", f"the KubeRay emulation does not play {', '.join(missing)}")
    obj = server.store.create(resource, namespace, body)
    if server.operator:
        controller = RayJobController if resource is RAYJOBS else RayClusterController
        server.start_controller(resource, namespace, controller(server, namespace, obj))
    return obj


def deleted(server: K8sServer, resource: Resource, namespace: str, name: str) -> None:
    """Owner references at work: a deleted RayJob takes its RayCluster and submitter Job (with their pods), a
    deleted RayCluster its pods and auth Secret."""
    controller = server.stop_controller(resource, namespace, name)
    if resource is RAYJOBS:
        if isinstance(controller, RayJobController) and controller.submitter:
            controller.submitter.delete()
        for cluster in server.store.list(RAYCLUSTERS, namespace, f"{CR_NAME_LABEL}={name},{CRD_LABEL}=RayJob")[0]:
            server.delete(RAYCLUSTERS, namespace, cluster["metadata"]["name"])
        return
    for pod in server.store.list(PODS, namespace, f"{CLUSTER_LABEL}={name}")[0]:
        server.delete_pod(namespace, pod["metadata"]["name"])
    for secret in server.store.list(SECRETS, namespace, f"{CLUSTER_LABEL}={name}")[0]:
        server.store.delete(SECRETS, namespace, secret["metadata"]["name"])
    if isinstance(controller, RayClusterController):
        controller.cleanup()
