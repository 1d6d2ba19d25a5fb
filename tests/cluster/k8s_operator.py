"""Operator mode of the Kubernetes API test server (tests/cluster/k8s_server.py): the Training Operator v1.9 and the
kubelet for PyTorchJobs, each pod a local process group (see that module's docstring for what it plays and
how it differs from a cluster). What the operator puts into each pod comes from tests/cluster/pytorchjob_contract.py,
written from the operator's source; nothing here imports the code under test."""
from __future__ import annotations

import base64
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol


from cluster import istio_injection
from cluster import pytorchjob_contract as operator
from cluster.k8s_store import PODS, PYTORCHJOBS, SECRETS, ApiError, now
from cluster.k8s_validation import aggregate, service_refusal
from cluster.kuberay_validation import label_key_errors
from cluster.server_process import free_port

if TYPE_CHECKING:
    from cluster.k8s_server import K8sServer

JOB_NAME_LABEL, REPLICA_TYPE_LABEL = operator.JOB_NAME_LABEL, operator.REPLICA_TYPE_LABEL
REPLICA_INDEX_LABEL = operator.REPLICA_INDEX_LABEL
CODE_ROOT = Path(__file__).resolve().parents[2]
IMAGE_PATHS = tuple(dict.fromkeys(str(p) for p in (Path(sys.prefix), Path(sys.executable).parent, CODE_ROOT)))
"""Host paths that stand for the image's own files (the interpreter, its packages, the code under test): never
mapped into a volume, wherever the checkout lives (in a real pod an emptyDir at /tmp hides only the image's /tmp,
not its /usr/local or /app; here the checkout itself may sit under /tmp)."""
"""The checkout under test: what the test image holds (``PYTHONPATH`` of every pod process)."""
STOP_GRACE_SECONDS = 5.0
"""SIGTERM -> SIGKILL grace for pod processes (the real default terminationGracePeriodSeconds is 30)."""
CRASH_BACKOFF_SECONDS = 0.5
"""First CrashLoopBackOff delay of an in-place restart (the kubelet's is 10 s), doubled per restart up to 8 s."""


class Container(Protocol):
    """One started container, as the kubelet sees it through its runtime."""

    @property
    def id(self) -> str: ...
    """``containerID`` as the pod status shows it (``<runtime>://<id>``)."""
    @property
    def pid(self) -> int | None: ...
    """Host pid of the container's first process while it runs."""
    def wait(self) -> int: ...
    """Its exit code, once it ended (128 + signal when killed), its output all in the pod's log."""
    def running(self) -> bool: ...
    def oom_killed(self) -> bool: ...
    def kill(self) -> None: ...
    """SIGKILL, as a node's OOM killer or a crash would."""
    def stop(self) -> None: ...
    """SIGTERM, SIGKILL after STOP_GRACE_SECONDS, and reap."""


class Runtime(Protocol):
    """What runs a pod's containers for the kubelet: :class:`ProcessRuntime` (local process groups, the default)
    or ``cluster.docker_kubelet.DockerRuntime`` (containers of the pod's image)."""

    def has_image(self, image: str) -> bool: ...
    def start(self, job: "_JobController", pod: dict, container: dict, log: Path, attempt: int) -> Container: ...
    """Start ``container`` of ``pod`` (``attempt``: its restart count), its output appended to ``log``.

    Raises:
        ValueError: what the kubelet reports as CreateContainerConfigError (a missing Secret, key or claim).
    """


@dataclass
class _PodRun:
    """The running container behind one pod, and its log file."""

    log: Path
    container: Container | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Orders starting a container against stopping the pod: none starts once ``stopped`` is set."""


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


def field_value(pod: dict, path: str) -> str:
    """An env var's ``fieldRef`` as the kubelet resolves it (kubernetes ``pkg/kubelet/kubelet_pods.go``
    ``podFieldSelectorRuntimeValue``): ``spec.*`` and ``status.*`` fields (``spec.serviceAccountName``,
    ``status.podIP`` ...) read from ``pod`` ("" when unset), the metadata ones as a volume's
    (:func:`extract_field_path`).

    Raises:
        ValueError: a metadata path :func:`extract_field_path` refuses.
    """
    if not path.startswith(("spec.", "status.")):
        return extract_field_path(pod, path)
    value: Any = pod
    for part in path.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return str(value)


def pod_requests(pod: dict) -> dict[str, int]:
    """What the scheduler counts for a pod, in milli-units (``cpu`` in millicores, every other resource in
    thousandths of its unit, so sums are exact): each container's requests, its limits where no request is set
    (the API server's defaulting, kubernetes ``pkg/apis/core/v1/defaults.go`` ``SetDefaults_Pod``); the containers
    summed, and the largest init container where it is larger (kube-scheduler ``computePodResourceRequest``: init
    containers run one at a time, before the others)."""
    def requests(container: dict) -> dict[str, int]:
        resources = container.get("resources", {})
        return {k: round(quantity(v) * 1000)
                for k, v in {**resources.get("limits", {}), **resources.get("requests", {})}.items()}

    wanted: dict[str, int] = {}
    for container in pod["spec"].get("containers", []):
        for key, value in requests(container).items():
            wanted[key] = wanted.get(key, 0) + value
    for init in pod["spec"].get("initContainers", []):
        for key, value in requests(init).items():
            wanted[key] = max(wanted.get(key, 0), value)
    return wanted


DEFAULT_MAX_PODS = 110
"""The node's ``pods`` allocatable unless ``capacity`` sets it: the kubelet's ``--max-pods`` default."""


def fits_request(pod: dict, bound: list[dict], allocatable: dict[str, float]) -> list[str]:
    """Why ``pod`` does not fit a node whose ``allocatable`` resources (``cpu`` in cores, ``memory`` and others in
    their units, ``pods`` a count) are shared with the ``bound`` pods: kube-scheduler's NodeResourcesFit filter
    (kubernetes ``pkg/scheduler/framework/plugins/noderesources/fit.go``, ``fitsRequest``). ``Too many pods`` when
    the node holds its ``pods`` already; a pod requesting nothing fits otherwise; then ``Insufficient <resource>``
    for cpu, memory, ephemeral-storage and each other (extended) resource the pod requests more of than is left, a
    zero request never counting. Empty when it fits. Not modelled: pod overhead (RuntimeClass), the plugin's
    ``ignoredResources``/``ignoredResourceGroups`` arguments, DRA-backed extended resources."""
    reasons = []
    if len(bound) + 1 > allocatable.get("pods", DEFAULT_MAX_PODS):
        reasons.append("Too many pods")
    wanted = {k: v for k, v in pod_requests(pod).items() if k != "pods"}
    if not any(wanted.values()):
        return reasons
    used: dict[str, int] = {}
    for other in bound:
        for key, value in pod_requests(other).items():
            used[key] = used.get(key, 0) + value
    first = [k for k in ("cpu", "memory", "ephemeral-storage") if k in wanted]
    for key in first + [k for k in wanted if k not in first]:
        if wanted[key] > 0 and wanted[key] > round(allocatable.get(key, 0) * 1000) - used.get(key, 0):
            reasons.append(f"Insufficient {key}")
    return reasons


def unschedulable_message(reasons: list[str]) -> str:
    """The FailedScheduling message of a pod the one node refused for ``reasons`` (kube-scheduler's
    ``FitError.Error``, ``pkg/scheduler/framework/types.go``: each reason counted over the nodes, sorted, then the
    preemption post-filter's verdict)."""
    return (f"0/1 nodes are available: {', '.join(sorted(f'1 {r}' for r in reasons))}. preemption: 0/1 nodes are "
            "available: 1 No preemption victims found for incoming pod.")


def _terminate(run: _PodRun) -> None:
    """Stop the pod's container (SIGTERM, SIGKILL after STOP_GRACE_SECONDS); none starts after this."""
    with run.lock:
        run.stopped.set()
        container = run.container
    if container is not None:
        container.stop()


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion (kubernetes ``third_party/forked/golang/expansion/expand.go``,
    ``Expand``): ``$(VAR)`` becomes ``env``'s value, or stays as written when ``VAR`` is undefined; ``$$`` is an
    escaped ``$``; any other ``$`` (an unclosed ``$(`` too) stays."""
    out, at = [], 0
    while at < len(text):
        if text[at] == "$" and at + 1 < len(text):
            if text[at + 1] == "$":
                out.append("$")
                at += 2
                continue
            end = text.find(")", at + 2) if text[at + 1] == "(" else -1
            if end != -1:
                name = text[at + 2:end]
                out.append(env.get(name, text[at:end + 1]))
                at = end + 1
                continue
        out.append(text[at])
        at += 1
    return "".join(out)


SUPPORTED_VOLUMES = ("persistentVolumeClaim", "emptyDir", "projected")
"""Volume kinds the test cluster's kubelets mount; a pod with any other is refused, never run without it."""


def container_volumes(pod: dict, container: dict) -> list[tuple[dict, dict]]:
    """(volume mount, volume) of each of the container's ``volumeMounts``.

    Raises:
        ValueError: a mount names no volume of the pod (the API server's ``Not found``), or a volume is of a kind
            the test cluster does not emulate (its field named).
    """
    volumes = {v["name"]: (i, v) for i, v in enumerate(pod["spec"].get("volumes", []))}
    found = []
    for index, mount in enumerate(container.get("volumeMounts", [])):
        if mount["name"] not in volumes:
            raise ValueError(f"spec.containers[{container['name']}].volumeMounts[{index}].name: Not found: "
                             f"\"{mount['name']}\"")
        at, volume = volumes[mount["name"]]
        kinds = [key for key in volume if key != "name"]
        if not kinds or any(kind not in SUPPORTED_VOLUMES for kind in kinds):
            raise ValueError(f"spec.volumes[{at}] ({mount['name']!r}): {', '.join(kinds) or 'no source'} is not "
                             f"emulated by the test cluster's kubelet (only {', '.join(SUPPORTED_VOLUMES)})")
        found.append((mount, volume))
    return found


PROJECTED_DEFAULT_MODE = 0o644
"""``projected.defaultMode`` when the pod sets none: the API server's default (kubernetes
``pkg/apis/core/v1/defaults.go`` ``SetDefaults_ProjectedVolumeSource``, ``v1.ProjectedVolumeSourceDefaultMode``)."""
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
"""The ConfigMap kube-controller-manager publishes in every namespace (``pkg/controller/certificates/
rootcacertpublisher/publisher.go``): its one key ``ca.crt`` is the cluster's CA, the only ConfigMap emulated."""


def fs_user(pod: dict) -> int | None:
    """The user a pod's volume files are given to (kubernetes ``pkg/volume/util/util.go`` ``FsUserFrom``, as
    ``operation_generator.go`` passes it to ``SetUp``): the ``runAsUser`` every container runs as (its own, else the
    pod's, ``securitycontext.DetermineEffectiveRunAsUser``); None when one has none or two differ."""
    default = (pod["spec"].get("securityContext") or {}).get("runAsUser")
    users = {(c.get("securityContext") or {}).get("runAsUser", default)
             for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]}
    return next(iter(users)) if len(users) == 1 else None


def extract_field_path(pod: dict, path: str) -> str:
    """What a ``downwardAPI`` volume item's ``fieldRef`` reads, and an env var's of the pod's metadata (kubernetes
    ``pkg/fieldpath/fieldpath.go`` ``ExtractFieldPathAsString``, ``SplitMaybeSubscriptedPath``, ``FormatMap``):
    ``metadata.name``, ``.namespace``, ``.uid``, a label or annotation by key, or all of them as sorted
    ``key="value"`` lines.

    Raises:
        ValueError: upstream's errors: a subscript that is no qualified name, a subscript on another field, or
            another field.
    """
    meta = pod["metadata"]
    name, subscripted, key = path.removesuffix("']").partition("['")
    if path.endswith("']") and subscripted and name:
        if name not in ("metadata.annotations", "metadata.labels"):
            raise ValueError(f"fieldPath {json.dumps(name)} does not support subscript")
        errors = label_key_errors(key.lower() if name == "metadata.annotations" else key)
        if errors:
            raise ValueError(f"invalid key subscript in {path}: {';'.join(errors)}")
        return (meta.get(name.split(".")[1]) or {}).get(key, "")
    if path in ("metadata.annotations", "metadata.labels"):
        values = meta.get(path.split(".")[1]) or {}
        return "\n".join(f"{k}={json.dumps(values[k], ensure_ascii=False)}" for k in sorted(values))
    if path in ("metadata.name", "metadata.namespace", "metadata.uid"):
        return meta.get(path.split(".")[1], "")
    raise ValueError(f"unsupported fieldPath: {path}")


def _key_payload(source: dict, data: dict[str, str], default_mode: int) -> dict[str, tuple[str, int]]:
    """A ConfigMap source's files (kubernetes ``pkg/volume/configmap/configmap.go`` ``MakePayload``): every key
    with no ``items``, else each item's key at its ``path`` with its ``mode``; a missing key skipped when
    ``optional``.

    Raises:
        ValueError: an item names a key the ConfigMap lacks (upstream's words).
    """
    if not source.get("items"):
        return {key: (value, default_mode) for key, value in data.items()}
    payload = {}
    for item in source["items"]:
        if item["key"] in data:
            payload[item["path"]] = (data[item["key"]], item.get("mode", default_mode))
        elif not source.get("optional"):
            raise ValueError(f"configmap references non-existent config key: {item['key']}")
    return payload


def _projection_refusal(volume: dict, source: dict) -> str | None:
    """Why the test cluster's kubelet does not emulate a ``projected`` source (None when it does): a ``secret``,
    another ConfigMap, a ``clusterTrustBundle`` or ``podCertificate``; a ``downwardAPI`` item's
    ``resourceFieldRef``."""
    where = f"spec.volumes[{volume['name']}].projected"
    if "downwardAPI" in source:
        refused = [item["path"] for item in source["downwardAPI"].get("items") or [] if "fieldRef" not in item]
        return (f"{where} downwardAPI item {refused[0]!r}: only a fieldRef is emulated by the test cluster's kubelet"
                if refused else None)
    if "serviceAccountToken" in source or source.get("configMap", {}).get("name") == ROOT_CA_CONFIGMAP:
        return None
    return (f"{where} source {sorted(source)} is not emulated by the test cluster's kubelet (only "
            f"serviceAccountToken, the {ROOT_CA_CONFIGMAP} ConfigMap and downwardAPI)")


def _projection(job: "_JobController", pod: dict, source: dict,
                default_mode: int) -> dict[str, tuple[str, int, int | None]]:
    """One emulated source's files: path -> (content, mode, owner or None), as :func:`projected_folder` says.

    Raises:
        ValueError: upstream's error for the source (a missing key, a field path it does not read).
    """
    if "serviceAccountToken" in source:
        token, user = source["serviceAccountToken"], fs_user(pod)
        group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
        content = job.api.service_account_token(job.namespace, pod["spec"].get("serviceAccountName") or "default",
                                                token.get("audience", ""))
        return {token["path"]: (content, 0o600 if user is not None or group is not None else default_mode, user)}
    if "configMap" in source:
        payload = _key_payload(source["configMap"], {"ca.crt": job.api.ca_pem.decode()}, default_mode)
        return {path: (content, mode, None) for path, (content, mode) in payload.items()}
    return {posixpath.normpath(item["path"]): (extract_field_path(pod, item["fieldRef"]["fieldPath"]),
                                               item.get("mode", default_mode), None)
            for item in source["downwardAPI"].get("items") or []}


def projected_folder(job: "_JobController", pod: dict, volume: dict) -> Path:
    """A ``projected`` volume's files in a folder of the pod, as the kubelet collects them (kubernetes
    ``pkg/volume/projected/projected.go`` ``projectedVolumeMounter.collectData``; read at kubernetes master
    059ce4e8a1d958959595b970acaf846259348518 as mirrored in sanposhiho/kubernetes), for the sources emulated:

    * ``serviceAccountToken``: a TokenRequest of the pod's service account for its ``audience``
      (``K8sServer.service_account_token``) at ``path``, mode ``defaultMode``, or ``0600`` given to :func:`fs_user`
      when the pod has one or an ``fsGroup`` ("we depend on SetVolumeOwnership to change from 0600 to 0640");
      ``expirationSeconds`` is not emulated: the test cluster's tokens do not expire;
    * the ``kube-root-ca.crt`` ConfigMap (key ``ca.crt``) as ``configmap.MakePayload`` projects one
      (:func:`_key_payload`);
    * ``downwardAPI`` items' ``fieldRef`` (:func:`extract_field_path`) at their cleaned ``path``
      (``pkg/volume/downwardapi/downwardapi.go`` ``CollectData``).

    A file's mode is its item's ``mode``, else ``defaultMode`` (:data:`PROJECTED_DEFAULT_MODE`). Every source's
    errors are gathered and fail the mount together (``utilerrors.NewAggregate``). Unlike the kubelet's
    ``AtomicWriter`` (``pkg/volume/util/atomic_writer.go``) the files are written in place, with no ``..data`` link
    to a timestamped folder; only a root kubelet gives the token to :func:`fs_user` (a non-root one runs every pod
    as its own user).

    Raises:
        ValueError: the gathered errors, or a source or item form not emulated, named (:func:`_projection_refusal`).
    """
    sources = volume["projected"].get("sources") or []
    refusal = next(filter(None, (_projection_refusal(volume, source) for source in sources)), None)
    if refusal:
        raise ValueError(refusal)
    default_mode = volume["projected"].get("defaultMode", PROJECTED_DEFAULT_MODE)
    files: dict[str, tuple[str, int, int | None]] = {}
    errors = []
    for source in sources:
        try:
            files.update(_projection(job, pod, source, default_mode))
        except ValueError as err:
            errors.append(str(err))
    if errors:
        raise ValueError(aggregate(errors))
    folder = job.dir / pod["metadata"]["name"] / "projected" / volume["name"]
    for path, (content, mode, owner) in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).unlink(missing_ok=True)  # a read-only file of the last setup (``RequiresRemount``)
        (folder / path).write_text(content)
        (folder / path).chmod(mode)
        if owner is not None and os.geteuid() == 0:
            os.chown(folder / path, owner, -1)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def container_env(api: K8sServer, namespace: str, pod: dict, container: dict,
                  local: Callable[[str], str] = str) -> dict[str, str]:
    """The container's ``env`` as the kubelet resolves it: values with ``$(VAR)`` of the variables before them
    expanded (:func:`expand`; then through ``local``, the process runtime's mount mapping), ``fieldRef``
    (:func:`field_value`) and ``secretKeyRef`` from the Secrets in the store.

    Raises:
        ValueError: a referenced Secret or key is missing (and not ``optional``), or the container uses an env form
            the test cluster does not emulate (``envFrom``, ``configMapKeyRef``, ``resourceFieldRef``: named).
    """
    if container.get("envFrom"):
        raise ValueError(f"spec.containers[{container['name']}].envFrom is not emulated by the test cluster's "
                         "kubelet: list the variables under env")
    env: dict[str, str] = {}
    for index, item in enumerate(container.get("env", [])):
        source = item.get("valueFrom") or {}
        unknown = sorted(set(source) - {"fieldRef", "secretKeyRef"})
        if unknown:
            raise ValueError(f"spec.containers[{container['name']}].env[{index}].valueFrom.{unknown[0]} "
                             f"({item['name']}) is not emulated by the test cluster's kubelet (only fieldRef and "
                             "secretKeyRef)")
        if not source:
            env[item["name"]] = local(expand(str(item.get("value", "")), env))
        elif "fieldRef" in source:
            env[item["name"]] = field_value(pod, item["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            try:
                secret = api.store.get(SECRETS, namespace, ref["name"])
            except ApiError:
                if ref.get("optional"):
                    continue
                raise ValueError(f'secret "{ref["name"]}" not found') from None
            data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise ValueError(f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
            env[item["name"]] = data[ref["key"]]
    return env


@dataclass
class _Process:
    """A container of :class:`ProcessRuntime`: a local process group."""

    proc: subprocess.Popen

    @property
    def id(self) -> str:
        return f"local://{self.proc.pid}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc.poll() is None else None

    def wait(self) -> int:
        code = self.proc.wait()
        return code if code >= 0 else 128 - code

    def running(self) -> bool:
        return self.proc.poll() is None

    def oom_killed(self) -> bool:
        return False

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                continue
        try:  # whatever the group left behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


def _unshare_prefix() -> list[str]:
    """``unshare`` arguments giving a process its own mount and UTS (hostname) namespaces, like a pod (and a user
    namespace when not root)."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--uts", "--"]


class _JobController:
    """The operator's reconcile loop for one PyTorchJob, and the kubelet of its pods."""

    def __init__(self, api: K8sServer, namespace: str, job: dict):
        self._setup(api, namespace, job)
        self.port = free_port()
        self.defaulted = self._host_ports(operator.default_job(job))
        spec = self.defaulted["spec"]
        self.replicas = spec["pytorchReplicaSpecs"]
        self.run_policy = spec["runPolicy"]
        names = [self.pod_name(rtype, i) for rtype, rspec in self.replicas.items()
                 for i in range(rspec.get("replicas", 1))]
        self.refused_services = {name: refusal for name in names if (refusal := service_refusal(name))}
        """Headless services (one per pod, named as it) the API server refuses: their names do not resolve."""
        self._write_pod_files([name for name in names if name not in self.refused_services])

    def _setup(self, api: K8sServer, namespace: str, job: dict, dir_prefix: str = "") -> None:
        """The state every controller of pods shares with its kubelet: the API, the owning object, the stop flag,
        and a fresh folder for its pods' logs, hosts file and emptyDirs (named ``dir_prefix``, else after it)."""
        self.api, self.namespace, self.job = api, namespace, job
        self.name = job["metadata"]["name"]
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.finished = False
        self.dir = Path(tempfile.mkdtemp(prefix=dir_prefix or f"{self.name}-", dir=api.workdir))

    def _write_pod_files(self, hostnames: list[str]) -> None:
        """What every pod of the job sees in place of the cluster DNS: ``hosts`` (each line's names on loopback)
        and ``bin/nslookup`` answering from it (the image's nslookup asks the cluster DNS)."""
        self.hosts = self.dir / "hosts"
        self.hosts.write_text("127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {h}\n" for h in hostnames))
        self.bin = self.dir / "bin"
        self.bin.mkdir()
        nslookup = self.bin / "nslookup"
        nslookup.write_text('#!/bin/sh\nexec getent hosts "$1"\n')
        nslookup.chmod(0o755)

    def pod_name(self, rtype: str, index: int) -> str:
        return operator.replica_name(self.name, rtype, index)

    def _host_ports(self, job: dict) -> dict:
        """The operator's port 23456 (declared or defaulted) as this job's free host port: all pods share the host
        network here, where each pod has its own in a cluster. Any other declared port is kept as it is."""
        for rspec in job["spec"]["pytorchReplicaSpecs"].values():
            for container in rspec["template"]["spec"]["containers"]:
                for port in container.get("ports", []):
                    if port.get("name") == operator.PORT_NAME and port.get("containerPort") == operator.DEFAULT_PORT:
                        port["containerPort"] = self.port
        elastic = job["spec"].get("elasticPolicy") or {}
        if elastic.get("rdzvPort") == operator.DEFAULT_PORT:
            elastic["rdzvPort"] = self.port
        return job

    def start(self) -> None:
        self.set_condition("Created", "PyTorchJobCreated", f"PyTorchJob {self.name} is created.")
        for refusal in self.refused_services.values():
            self.api.record_event(self.namespace, self.job, reason=operator.FAILED_CREATE_SERVICE, type_="Warning",
                                  message=f"Error creating: {refusal}")
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
        """Create the pod of replica ``rtype`` ``index`` as the operator does, and run it; a pod the API refuses
        (Pod Security admission) is a FailedCreatePod event on the job instead."""
        pod = operator.pod_template(self.defaulted, rtype, index, self.api.pytorch_init_container_template,
                                    self.api.pytorch_init_container_image)
        name = pod["metadata"]["name"]
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                               "name": self.name, "uid": self.job["metadata"]["uid"],
                                               "controller": True}]
        pod["status"] = {"phase": "Pending", "conditions": []}
        try:
            pod = self.api.create_pod(self.namespace, pod)
        except ApiError as exc:
            self.api.record_event(self.namespace, self.job, reason=operator.FAILED_CREATE_POD, type_="Warning",
                                  message=f"Error creating: {exc}")
            return
        self.api.record_event(self.namespace, self.job, reason="SuccessfulCreatePod",
                              message=f"Created pod: {name}")
        threading.Thread(target=self._kubelet, args=(pod, rtype, index), name=f"pod-{name}", daemon=True).start()

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
        if not self._schedule(pod):
            return
        self.api.record_event(self.namespace, pod, reason="Scheduled",
                              message=f"Successfully assigned {self.namespace}/{name} to kfloop-test-node")
        image = container.get("image", "")
        if image in self.api.unpullable_images or not self.api.runtime.has_image(image):
            self._waiting(name, container, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            self.api.record_event(self.namespace, pod, reason="Failed", type_="Warning",
                                  message=f'Failed to pull image "{image}": not found')
            return
        run = _PodRun(log=self.dir / f"{name}-{uid[:8]}.log")
        self.api._runs[(self.namespace, name)] = run
        # Istio's classic sidecar: running from the pod's start until the pod is deleted
        sidecar = [{"name": istio_injection.PROXY, "image": istio_injection.PROXY_IMAGE, "imageID": "", "ready": True,
                    "started": True, "restartCount": 0, "state": {"running": {"startedAt": now()}}}
                   ] if istio_injection.injected(pod) else []
        for init in pod["spec"].get("initContainers", []):
            code = self._run_init(pod, init, run)
            if code is None:
                return
            if code:
                self._update_pod(name, lambda p: p["status"].update(phase="Failed", reason="Init:Error"))
                return self._pod_finished(rtype, index, name, code)
        restarts = 0
        while True:
            started = now()
            with run.lock:
                if self.stopping.is_set() or run.stopped.is_set():
                    return
                try:
                    run.container = self.api.runtime.start(self, pod, container, run.log, restarts)
                except ValueError as exc:
                    self._waiting(name, container, "CreateContainerConfigError", str(exc))
                    self.api.record_event(self.namespace, pod, reason="Failed", message=f"Error: {exc}",
                                          type_="Warning")
                    return
            self._update_pod(name, lambda p: p["status"].update(phase="Running", startTime=p["status"].get(
                "startTime", started), containerStatuses=[{
                    "name": container["name"], "image": image, "imageID": "", "ready": True, "started": True,
                    "restartCount": restarts, "state": {"running": {"startedAt": started}},
                    "containerID": run.container.id,
                    **({"lastState": p["status"]["containerStatuses"][0]["lastState"]} if restarts else {})},
                    *sidecar]))
            if self._master_running():
                self.set_condition("Running", "PyTorchJobRunning", f"PyTorchJob {self.name} is running.")
            if name in self.api.killed_pods:
                run.container.kill()
            exit_code = run.container.wait()
            if run.stopped.is_set():
                return
            reason = "Completed" if exit_code == 0 else "OOMKilled" if run.container.oom_killed() else \
                self.api.killed_pods.get(name, "Error")
            terminated = {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": now(),
                          "containerID": run.container.id}
            in_place = pod["spec"]["restartPolicy"] == "Always" or (
                pod["spec"]["restartPolicy"] == "OnFailure" and exit_code != 0)
            if not in_place:
                # a running sidecar keeps the pod Running (the kubelet's getPhase): the operator sees no end
                phase = "Running" if sidecar else "Succeeded" if exit_code == 0 else "Failed"
                self._update_pod(name, lambda p: p["status"].update(phase=phase, containerStatuses=[{
                    "name": container["name"], "image": image, "imageID": "", "ready": False, "started": False,
                    "restartCount": restarts, "state": {"terminated": terminated},
                    **({"lastState": p["status"]["containerStatuses"][0]["lastState"]} if restarts else {})},
                    *sidecar]))
                if not sidecar:
                    self._pod_finished(rtype, index, name, exit_code)
                return
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

    def _run_init(self, pod: dict, init: dict, run: _PodRun) -> int | None:
        """Run one init container to its end (its output in its own log); its exit code, or None when it could not
        start or the pod was stopped meanwhile."""
        name = pod["metadata"]["name"]
        started = now()
        self._update_pod(name, lambda p: p["status"].update(phase="Pending", initContainerStatuses=[{
            "name": init["name"], "image": init.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
            "state": {"running": {"startedAt": started}}}]))
        with run.lock:
            if self.stopping.is_set() or run.stopped.is_set():
                return None
            try:
                run.container = self.api.runtime.start(self, pod, init, run.log.with_suffix(f".{init['name']}.log"),
                                                       0)
            except ValueError as exc:
                self._waiting(name, init, "CreateContainerConfigError", str(exc))
                return None
        exit_code = run.container.wait()
        if run.stopped.is_set():
            return None
        self._update_pod(name, lambda p: p["status"].update(initContainerStatuses=[{
            "name": init["name"], "image": init.get("image", ""), "imageID": "", "ready": exit_code == 0,
            "restartCount": 0, "state": {"terminated": {"exitCode": exit_code, "startedAt": started,
                                                        "finishedAt": now(),
                                                        "reason": "Completed" if exit_code == 0 else "Error"}}}]))
        return exit_code

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

    def _schedule(self, pod: dict) -> bool:
        """The scheduler: bind the pod once the node's ``capacity``, less what its bound and unfinished pods request,
        fits it (checked and bound under one lock, as the scheduler's cache assumes a pod); until then the pod is
        Unschedulable with a FailedScheduling event, and retried at each change of the cluster. False when the pod
        or its job went away first."""
        name = pod["metadata"]["name"]
        store, revision, reported = self.api.store, -1, False
        while not self.stopping.is_set():
            with self.api.scheduling:
                unfit = self._unfit(pod)
                if not unfit:
                    return self._update_pod(name, lambda p: p["status"].update(
                        conditions=[{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}],
                        hostIP="127.0.0.1", podIP="127.0.0.1")) is not None
            if not reported:
                message = unschedulable_message(unfit)
                if self._update_pod(name, lambda p: p["status"].update(conditions=[
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                         "lastTransitionTime": now()}])) is None:
                    return False
                self.api.record_event(self.namespace, pod, reason="FailedScheduling", message=message,
                                      type_="Warning")
                reported = True
            with store.lock:
                while store.revision == revision and not store.closed and not self.stopping.is_set():
                    store.lock.wait(0.5)
                if store.closed:
                    return False
                revision = store.revision
            try:
                store.get(PODS, self.namespace, name)
            except ApiError:
                return False  # deleted while it waited
        return False

    def _unfit(self, pod: dict) -> list[str]:
        """:func:`fits_request` of this pod on the node, next to the pods bound to it that have not ended."""
        bound = []
        for other in self.api.store.list(PODS, None)[0]:
            status = other.get("status") or {}
            scheduled = any(c["type"] == "PodScheduled" and c["status"] == "True"
                            for c in status.get("conditions", []))
            if scheduled and status.get("phase") not in ("Succeeded", "Failed") and \
                    other["metadata"]["uid"] != pod["metadata"]["uid"]:
                bound.append(other)
        return fits_request(pod, bound, self.api.capacity)

    def _waiting(self, name: str, container: dict, reason: str, message: str) -> None:
        self._update_pod(name, lambda p: p["status"].update(containerStatuses=[{
            "name": container["name"], "image": container.get("image", ""), "imageID": "", "ready": False,
            "started": False,
            "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}]))


class ProcessRuntime:
    """Each container a local process group of this checkout's Python (see the module docstring): its own mount
    and UTS namespaces, the job's hosts file, volume mount paths rewritten to host dirs."""

    def has_image(self, image: str) -> bool:
        return True

    def start(self, job: _JobController, pod: dict, container: dict, log: Path, attempt: int) -> Container:
        argv, env, cwd = _process(job, pod, container)
        with log.open("ab") as out:
            return _Process(subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True))


def _process(job: _JobController, pod: dict, container: dict) -> tuple[list[str], dict[str, str], str]:
    """argv (``$(VAR)`` of the container's env expanded, as the kubelet does), env and working dir of the
    container, with volume mount paths mapped to host dirs.

    Raises:
        ValueError: a referenced Secret or key is missing, a PVC claim has no host dir, or the container uses a
            volume or env form the test cluster does not emulate.
    """
    mounts = _mounts(job, pod, container)
    rooted = [(path, host) for path, host in mounts if not Path("/", *Path(path).parts[1:2]).exists()]
    mounts = [m for m in mounts if m not in rooted]

    def local(text: str) -> str:
        if any(text == p or text.startswith(p + "/") for p in IMAGE_PATHS):
            return text
        for mount_path, host in mounts:
            if text == mount_path or text.startswith(mount_path.rstrip("/") + "/"):
                return str(host) + text[len(mount_path.rstrip("/")):]
            text = text.replace("=" + mount_path.rstrip("/") + "/", "=" + str(host) + "/")
        return text

    env = {"PATH": f"{job.bin}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "HOME": str(job.dir), "HOSTNAME": pod["metadata"]["name"],
           "PYTHONPATH": str(CODE_ROOT)}  # the image holds the code under test (not whatever the venv has)
    own = container_env(job.api, job.namespace, pod, container, local)
    env.update(own)
    argv = [local(expand(a, own)) for a in container.get("command", []) + container.get("args", [])]
    if not argv:
        raise ValueError("the container has no command (the test server runs no image entrypoints)")
    cwd = local(container.get("workingDir", "")) or str(job.dir)
    script = 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && ' + (
        _rooted_exec(Path(tempfile.mkdtemp(prefix="root-", dir=job.dir)), rooted, cwd) if rooted else 'exec "$@"')
    wrapper = [*_unshare_prefix(), "sh", "-c", script, str(job.hosts), pod["metadata"]["name"]]
    return wrapper + argv, env, cwd


CHROOT = shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin") or "chroot"
"""``chroot`` by its path: a pod's ``PATH`` lacks the sbin folders."""


def _rooted_exec(root: Path, rooted: list[tuple[str, Path]], cwd: str) -> str:
    """Shell text that runs ``"$@"`` in ``cwd`` chrooted into ``root``: the host's top-level folders bound there
    (``mount --rbind``, links copied), and each mount whose path's top-level folder the host lacks (``/s3``,
    ``/kfp-launcher``) bound at that path, so the container sees it where the pod spec mounts it."""
    top = shlex.quote(str(root))
    binds = " && ".join(f"mkdir -p {shlex.quote(f'{root}{target}')} && mount --bind {shlex.quote(str(host))} "
                        f"{shlex.quote(f'{root}{target}')}" for target, host in rooted)
    return (f'for d in /*; do n="${{d#/}}"; if [ -L "$d" ]; then ln -s "$(readlink "$d")" {top}/"$n"; '
            f'elif [ -d "$d" ]; then mkdir {top}/"$n" && mount --rbind "$d" {top}/"$n"; fi; done && {binds} && '
            f'exec {CHROOT} {top} sh -c \'cd "$0" && exec "$@"\' {shlex.quote(cwd)} "$@"')



def _mounts(job: _JobController, pod: dict, container: dict) -> list[tuple[str, Path]]:
    """(mount path, host dir), longest path first."""
    mounts = []
    for mount, volume in container_volumes(pod, container):
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in job.api.volumes:
                raise ValueError(f'persistentvolumeclaim "{claim}" not found')
            host = job.api.volumes[claim]
        elif "projected" in volume:
            host = projected_folder(job, pod, volume)
        else:
            host = job.dir / pod["metadata"]["name"] / "emptydir" / mount["name"]
            host.mkdir(parents=True, exist_ok=True)
        mounts.append((mount["mountPath"], host / mount.get("subPath", "")))
    return sorted(mounts, key=lambda m: -len(m[0]))
