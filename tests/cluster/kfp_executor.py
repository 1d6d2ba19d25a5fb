"""Executes what the KFP API test server (tests/cluster/kfp_server.py) holds, as KFP's backend does.

A created run, and a recurring run each time its trigger fires, executes the stored pipeline version's IR: the
root DAG's tasks in dependency order, a sub-DAG only when its ``triggerPolicy.condition`` (``dsl.If``) holds, each
container task as one "pod" given what KFP's backend gives a step pod, its inputs resolved from the run's
parameters and the upstream tasks' outputs, its artifacts under the pipeline root. Behaviour taken from
kubeflow/pipelines 2.17 (cited where used):

- ``backend/src/v2/driver/driver.go``: the driver resolves a task's inputs (runtime constants, the parent DAG's
  inputs, upstream output parameters and artifacts), evaluates the condition as CEL (tests/cluster/kfp_expression.py:
  a false one skips the task or sub-DAG, one that cannot be evaluated fails the task and the run) and
  looks the task up in the cache when ``cachingOptions.enableCache`` is set (``backend/src/v2/cacheutils/cache.go``:
  the key hashes the input parameter values, input artifact names, output spec, image and command); a hit reuses
  the recorded outputs and the task is reported ``SKIPPED``.
- ``backend/src/v2/component/launcher_v2.go``: the launcher builds the executor input (input artifacts by URI,
  output artifact URIs under ``<pipeline_root>/<run>/<task>/``), runs the command with the placeholders replaced,
  and reads the outputs back. kfp.local builds and reads the same executor input
  (``kfp/local/executor_input_utils.py``, ``placeholder_utils.py``, ``executor_output_utils.py``): used here. With
  an object-store pipeline root (``s3://bucket/prefix``, ``minio://``) the step pod's command is wrapped in
  tests/cluster/kfp_launcher.py, which downloads the input artifacts to their local paths (``/s3/...``,
  ``/minio/...``: kfp ``dsl/types/artifact_types.py``) before the command and uploads the outputs after it, with
  the object store's keys from the namespace's ``mlpipeline-minio-artifact`` Secret
  (``backend/src/v2/objectstore/object_store.go``); the executor output and parameter files go there too, and are
  read back from it.
- Argo's workflow controller creates each step pod (``backend/src/v2/compiler/argocompiler/container.go``,
  ``common.go``: the ``main`` container with ``KFP_POD_NAME`` and ``KFP_POD_UID`` from the downward API and the
  container's own ``env``, its command run by Argo's emissary (tests/cluster/argo_emissary.py, ``argoexec emissary --
  CMD``: a deleted pod's SIGTERM reaches the command's process group), with an object-store root the template's
  emptyDirs (``/kfp-launcher``, scratch at ``/s3``, ``/minio``, ``/gcs``, ``/.local``, ``/.cache``, ``/.config``); the
  pod runs as the run's service account in the profile's namespace). With a cluster
  (``KfpExecutor(cluster=K8sServer)``) the pod is created through the cluster's API as the controller's own
  ServiceAccount ``kubeflow/argo`` (RBAC: KFP's manifests bind Argo's ClusterRole to it, :func:`install_argo`), so the
  API server's admission applies: the PodDefault webhook (tests/cluster/pod_defaults.py, kubeflow/kubeflow
  ``components/admission-webhook/main.go``: the PodDefaults given, e.g. deploy/kubeflow-profile.yaml's
  ``access-ml-pipeline``, project the service-account token of the audience they name; nothing else gives a pod a KFP
  API token), Istio's injection and Pod Security; a refusal fails the task with the API's message (the main
  container's security context, :data:`USER_CONTAINER_SECURITY`, satisfies ``restricted`` only with the admin's
  non-root defaults). The cluster's kubelet (its ``runtime``: processes, or containers of the image) runs the pod, and
  the task ends with the main container (Argo's ``assessNodeStatus``: an Istio sidecar may keep the pod Running); the
  task records ``pod_name`` (and as ``child_tasks[].pod_name``), the pod's log is the ``pods/log`` API's. Every pod
  mounts its service account's token, ``ca.crt`` and namespace at ``/var/run/secrets/kubernetes.io/serviceaccount``
  and has ``KUBERNETES_SERVICE_HOST``/``PORT`` (what Kubernetes' ServiceAccount admission and kubelet add).
- ``backend/src/v2/driver/driver.go`` (``extendPodSpecPatch``, ``initPodSpecPatch``) applies the task's Kubernetes
  platform spec (kfp-kubernetes): ``podMetadata`` labels, ``pvcMount`` as a volume of the claim at its
  ``mountPath``, ``secretAsEnv`` as ``secretKeyRef`` env (a missing Secret or key that is not ``optional`` fails
  the pod with the kubelet's CreateContainerConfigError), ``imagePullSecret``, and the container's ``resources``.
- ``backend/src/apiserver/resource/resource_manager.go`` (``TerminateRun``): a terminated run is ``CANCELING``
  until its pods stop, then ``CANCELED``; a failed task fails the run with its error.
- ``backend/src/crd/controller/scheduledworkflow/`` (``util/cron_schedule.go``, ``util/periodic_schedule.go``,
  ``scheduled_workflow.go``): cron with six fields (seconds first, robfig/cron) or every ``interval_second``;
  ``max_concurrency`` caps the schedule's active runs (a fire while at the cap is skipped); ``no_catchup`` starts
  only the latest missed fire, else every missed fire runs.

Without a cluster, an engine runs each step: :class:`DockerEngine` as a container of the image the IR names,
:class:`ProcessEngine` as a subprocess (its own process group) with the pod's environment, the checkout's
virtualenv standing in for the image. The executor then applies the PodDefaults itself, as a cluster's admission
would (in a profile's namespace, its ``namespace_labels``; a conflicting pod refused with the API server's message;
a token file under the pod's directory, its path in ``KF_PIPELINES_SA_TOKEN_PATH``, the variable the kfp SDK
reads), but not the platform spec's Secrets, claims, pull secrets or resources (a run using the last two fails
naming them); the engine's ``env`` stands in for the Secrets, and the pipeline root must be a host folder.
"""
from __future__ import annotations

import base64
import contextlib
import copy
import functools
import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence
from urllib.parse import urlsplit

import docker
import requests
import s3fs
from croniter import croniter
from google.protobuf import json_format
from kfp.local import executor_input_utils, executor_output_utils, graph_utils, io, placeholder_utils
from kfp.local.orchestrator.orchestrator_utils import OrchestratorUtils
from kfp.local.orchestrator.task_spec_utils import build_nested_dag_arguments
from kfp.pipeline_spec import pipeline_spec_pb2

from cluster import kfp_expression
from cluster import pod_defaults as poddefault_webhook
from cluster.k8s_operator import ProcessRuntime, _JobController
from cluster.k8s_rbac import service_account_user
from cluster.k8s_server import K8sServer
from cluster.k8s_store import CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, PODS, SECRETS, ApiError
from cluster.kfp_multiuser import TOKEN_AUDIENCE
from cluster.kfp_server import FINAL_STATES, KfpApiServer, _now, split_spec

TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
"""The variable the kfp SDK reads the token's path from (``kfp/client/token_credentials_base.py``)."""
ACCESS_LABEL = "access-ml-pipeline"
MAIN = "main"
"""The step pod's container (Argo's main container)."""
FAILED_WAITING = ("CreateContainerConfigError",)
"""A waiting reason of the main container that fails the node (Argo's ``assessNodeStatus``)."""
ARGO_USER = service_account_user("kubeflow", "argo")
"""Who creates the step pods: Argo's workflow controller, the ``argo`` ServiceAccount of KFP's manifests
(``manifests/kustomize/third-party/argo``), not the run's service account, which the pod runs as."""
ARGO_CLUSTER_ROLE = {"metadata": {"name": "argo-cluster-role"}, "rules": [
    {"apiGroups": [""], "resources": ["pods", "pods/exec"],
     "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get", "watch"]}]}
"""The pod rules of Argo's ``argo-cluster-role`` (its workflow-controller ClusterRole in KFP's manifests)."""
USER_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                           "seccompProfile": {"type": "RuntimeDefault"}}
"""The main container's security context (``argocompiler/security_context.go``
``applySecurityContextToExecutorTemplate``: not ``runAsNonRoot``, as a user's image may run as root; the pod gets
the ``RuntimeDefault`` seccomp profile): a restricted namespace refuses the pod unless the admin's defaults
(``KfpExecutor(security_defaults=...)``) make it non-root."""
OBJECT_STORE_SECRET = "mlpipeline-minio-artifact"
"""The Secret KFP's launcher reads the object store's ``accesskey`` and ``secretkey`` from
(``backend/src/v2/objectstore/object_store.go``)."""
LOCAL_PREFIXES = {"s3": "/s3/", "minio": "/minio/"}
"""The local path prefix of an artifact URI's scheme (kfp ``dsl/types/artifact_types.py``)."""
LAUNCHER_DIR = "/kfp-launcher"
"""The launcher's emptyDir in a step pod (``argocompiler/container.go``), where it keeps the executor output."""
STEP_EMPTY_DIRS = {"kfp-launcher": LAUNCHER_DIR, "gcs-scratch": "/gcs", "s3-scratch": "/s3", "minio-scratch": "/minio",
                   "dot-local-scratch": "/.local", "dot-cache-scratch": "/.cache", "dot-config-scratch": "/.config"}
"""The emptyDirs every step pod's main container mounts, by volume name (``argocompiler/container.go`` 2.17.0
``Container``, lines 469-564): the launcher's, and scratch space for the artifacts' local paths and a home-less
user's ``.local``, ``.cache`` and ``.config``."""
LAUNCHER = (Path(__file__).parent / "kfp_launcher.py").read_text()
"""tests/cluster/kfp_launcher.py, the step pod's launcher with an object-store root."""
EMISSARY = (Path(__file__).parent / "argo_emissary.py").read_text()
"""tests/cluster/argo_emissary.py, the main container's entry (Argo's ``argoexec emissary -- CMD``)."""
VAR_RUN_ARGO = "/var/run/argo"
"""Argo's ``var-run-argo`` emptyDir in every step pod (``workflow/controller/workflowpod.go``), where ``argoexec``
lives and the emissary writes ``ctr/main/exitcode``."""
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Every pod's service-account mount: ``namespace`` (the pod's), ``token`` and ``ca.crt`` (with a cluster)."""


@dataclass(kw_only=True)
class Pod:
    """One step pod as KFP's backend makes it."""

    name: str
    uid: str
    namespace: str
    service_account: str
    image: str
    command: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    token: str | None
    """The projected service-account token a PodDefault added, or None."""
    token_path: str = ""
    """Where the PodDefault mounts ``token`` in the pod."""
    log: Path
    files: dict[str, str] = field(default_factory=dict)
    """In-pod path -> content: the service-account mount's ``namespace``."""


class Engine(Protocol):
    def start(self, pod: Pod) -> Any: ...
    def wait(self, handle: Any) -> int: ...
    def stop(self, handle: Any) -> None: ...


@dataclass(kw_only=True)
class ProcessEngine:
    """Each pod a subprocess of this checkout's Python (the "image"), in its own process group."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    """What the cluster adds to every pod besides KFP (e.g. ``MLFLOW_TRACKING_URI``, ``AWS_*`` from Secrets)."""

    def start(self, pod: Pod) -> subprocess.Popen:
        home = self.root / pod.name
        (home / "tmp").mkdir(parents=True)
        env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "HOME": str(home / "tmp"),
               "TMPDIR": str(home / "tmp"), "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **self.env, **pod.env}
        if pod.token is not None:
            token = home / "token"
            token.write_text(pod.token)
            env[TOKEN_PATH_ENV] = str(token)
        with pod.log.open("wb") as log:
            return subprocess.Popen(pod.command, cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def wait(self, handle: subprocess.Popen) -> int:
        return handle.wait()

    def stop(self, handle: subprocess.Popen) -> None:
        try:
            os.killpg(handle.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


@dataclass(kw_only=True)
class DockerEngine:
    """Each pod a container of its image (the docker SDK; ``DOCKER_HOST`` names the daemon), as the image's user,
    with a read-only root and a ``/tmp`` tmpfs (``read_only``: a restricted profile's pods), the host's network
    (the test servers listen on loopback), the pipeline root mounted at its own path (it must be writable by the
    image's user), the pod's namespace and projected token at their in-pod paths. Containers are labelled
    ``kfloop.run_pod`` with the pod's name and kept after they end, so their exit code, user and image can be read
    back from the daemon."""

    pipeline_root: Path
    env: dict[str, str] = field(default_factory=dict)
    """What the cluster adds to every pod besides KFP (as :class:`ProcessEngine`'s)."""
    read_only: bool = True
    network_mode: str = "host"

    def __post_init__(self) -> None:
        self.client = docker.from_env()

    def start(self, pod: Pod) -> tuple[Any, Pod]:
        volumes = {str(self.pipeline_root): {"bind": str(self.pipeline_root), "mode": "rw"}}
        files = {**pod.files, **({pod.token_path: pod.token} if pod.token is not None else {})}
        for index, (target, content) in enumerate(sorted(files.items())):
            source = pod.log.with_suffix(f".file{index}")
            source.write_text(content)
            source.chmod(0o644)
            volumes[str(source)] = {"bind": target, "mode": "ro"}
        container = self.client.containers.run(
            pod.image, pod.command, name=pod.name, detach=True, environment={**self.env, **pod.env},
            labels={**pod.labels, "kfloop.run_pod": pod.name}, read_only=self.read_only,
            tmpfs={"/tmp": "rw,exec"} if self.read_only else {}, network_mode=self.network_mode, volumes=volumes)
        return container, pod

    def wait(self, handle: tuple[Any, Pod]) -> int:
        container, pod = handle
        code = container.wait()["StatusCode"]
        pod.log.write_bytes(container.logs())
        return code

    def stop(self, handle: tuple[Any, Pod]) -> None:
        """A deleted pod's end: Argo's emissary, PID 1 of a step's main container
        (``cmd/argoexec/commands/emissary.go``), forwards the SIGTERM to its command's process group, and the kubelet
        kills what still runs after the pod's grace period. Here the command's ``sh`` is PID 1 (which ignores a
        SIGTERM it has no handler for), so every other process of the container gets it, then the container is
        killed after :data:`TERMINATION_GRACE_SECONDS`."""
        container = handle[0]
        try:
            container.exec_run(["sh", "-c", "kill -TERM -1"])
            container.wait(timeout=TERMINATION_GRACE_SECONDS)
        except (docker.errors.APIError, requests.exceptions.RequestException):  # ended meanwhile, or past the grace
            with contextlib.suppress(docker.errors.APIError):
                container.kill()


TERMINATION_GRACE_SECONDS = 30
"""A pod's ``terminationGracePeriodSeconds`` by default (Kubernetes ``DefaultTerminationGracePeriodSeconds``)."""


class Canceled(Exception):
    """The run was terminated while a task ran."""


class TaskFailed(Exception):
    def __init__(self, task: str, message: str):
        super().__init__(f"task '{task}' failed: {message}")


@dataclass
class _RunContext:
    run: dict
    spec: pipeline_spec_pb2.PipelineSpec
    deployment: pipeline_spec_pb2.PipelineDeploymentConfig
    pipeline_root: str
    kubernetes: dict[str, dict]
    """Executor label -> its Kubernetes platform spec (kfp-kubernetes)."""
    canceled: threading.Event = field(default_factory=threading.Event)
    stops: list[Callable[[], None]] = field(default_factory=list)
    """What stops each running pod (the engine's stop, or the pod's deletion)."""
    workflow: _Workflow | None = None
    """Argo's controller of the run's step pods, with a cluster."""


class KfpExecutor:
    """``with KfpApiServer() as kfp, KfpExecutor(kfp, ProcessEngine(root=...), pipeline_root=...):``."""

    def __init__(self, server: KfpApiServer, engine: Engine | None, *, pipeline_root: Path | str,
                 namespace: str = "kubeflow", default_service_account: str = "pipeline-runner",
                 pod_defaults: Sequence[dict] = (), namespace_labels: dict[str, str] | None = None,
                 token: str | None = None, cluster: K8sServer | None = None, object_store: str = "",
                 security_defaults: dict[str, Any] | None = None):
        """
        Args:
            pipeline_root: a host folder, or ``s3://bucket/prefix`` (``minio://`` too) of the object store at
                ``object_store`` (its S3 endpoint URL), which needs ``cluster``: the step pods' launcher moves the
                artifacts, with the namespace's :data:`OBJECT_STORE_SECRET` keys.
            engine: what runs each step as a process or container without a ``cluster`` (unused with one).
            cluster: the Kubernetes test cluster the step pods are created in and run by; None: the ``engine``
                runs each step.
            namespace_labels: without a cluster, the labels of ``namespace`` (with one, its namespace object's):
                the PodDefault webhook fires only in a profile's (tests/cluster/kfp_multiuser.py ``PROFILE_LABELS``).
            security_defaults: the admin's ``defaultSecurityContextRunAsUser``, ``...RunAsGroup``,
                ``...RunAsNonRoot`` of ``pipeline-install-config``, as ``runAsUser``, ``runAsGroup``,
                ``runAsNonRoot``: set on every step pod's main container.

        Raises:
            ValueError: neither an engine nor a cluster, an object-store root without a cluster or endpoint, a
                host-folder root with a cluster whose kubelet runs containers (they cannot see it), namespace
                labels with a cluster, a PodDefault field not emulated.
        """
        self.server, self.engine, self.cluster = server, engine, cluster
        if engine is None and cluster is None:
            raise ValueError("KfpExecutor needs an engine or a cluster to run the steps")
        self.pipeline_root = pipeline_root
        remote = str(pipeline_root).split("://", 1)[0] in LOCAL_PREFIXES
        if remote and (cluster is None or not object_store):
            raise ValueError(f"pipeline root {pipeline_root}: an object-store root needs the cluster's step pods and "
                             "the object store's endpoint (KfpExecutor(cluster=..., object_store=URL))")
        if not remote and cluster is not None and not isinstance(cluster.runtime, ProcessRuntime):
            raise ValueError(f"pipeline root {pipeline_root}: the cluster's kubelet runs containers, which cannot see "
                             "a host folder; use an s3:// pipeline root")
        if namespace_labels is not None and cluster is not None:
            raise ValueError(f"namespace {namespace}: its labels are the cluster's namespace object's "
                             "(patch it through the cluster's API)")
        self.object_store = object_store if remote else ""
        """The object store's endpoint when the pipeline root is in it; "" for a host folder."""
        self.security_defaults = dict(security_defaults or {})
        self.namespace, self.default_service_account = namespace, default_service_account
        self.pod_defaults = [poddefault_webhook.checked(d) for d in pod_defaults]
        """The PodDefaults of the cluster (kubeflow.org/v1alpha1): with a cluster its admission applies them."""
        self.namespace_labels = dict(namespace_labels or {})
        """Without a cluster, the labels of :attr:`namespace`."""
        self.token = token
        """The token a PodDefault projects when the server is single-user; a multi-user server issues each pod's
        own (its service account, the PodDefault's audience)."""
        if cluster is not None:
            cluster.pod_defaults.extend(self.pod_defaults)
            cluster.token_audiences[TOKEN_AUDIENCE] = self._kfp_token
            install_argo(cluster)
        self.cache: dict[str, dict[str, Any]] = {}
        self._runs: dict[str, _RunContext] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._fired: dict[str, datetime] = {}
        self._scheduler = threading.Thread(target=self._schedule_loop, daemon=True)

    def __enter__(self) -> KfpExecutor:
        self.server.on_run_created = self.submit
        self.server.on_run_terminated = self.cancel
        self._scheduler.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._scheduler.join()
        for run_id in list(self._runs):
            self.cancel(run_id)
        for thread in list(self._threads):
            thread.join()
        self.server.on_run_created = self.server.on_run_terminated = None

    # -- runs ----------------------------------------------------------------------------------------------------
    def submit(self, run: dict) -> None:
        spec, platform = split_spec(run.get("pipeline_spec") or self.server.store.versions[
            run["pipeline_version_reference"]["pipeline_version_id"]]["pipeline_spec"])
        unmodelled = unemulated_fields(spec, platform, pods=self.cluster is not None)
        if unmodelled:
            with self.server.lock:
                run["error"] = {"code": 3, "message": "the test executor does not emulate " + ", ".join(unmodelled)
                                + ": it would ignore them", "details": []}
            self.server.set_run_state(run["run_id"], "FAILED")
            return
        ctx = _RunContext(run, json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec()),
                          json_format.ParseDict(spec["deploymentSpec"], pipeline_spec_pb2.PipelineDeploymentConfig()),
                          str(self.pipeline_root),
                          platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get(
                              "executors", {}))
        if self.cluster is not None:
            ctx.workflow = _Workflow(self.cluster, self.namespace, run)
        self._runs[run["run_id"]] = ctx
        thread = threading.Thread(target=self._execute, args=(ctx,), daemon=True)
        self._threads.append(thread)
        thread.start()

    def cancel(self, run_id: str) -> None:
        """``TerminateRun``: the run turns ``CANCELING``, its pods are stopped, then it is ``CANCELED``."""
        ctx = self._runs.get(run_id)
        if ctx is None or ctx.run["state"] in FINAL_STATES:
            return
        with self.server.lock:
            if ctx.run["state"] != "CANCELING":
                self.server.set_run_state(run_id, "CANCELING")
            ctx.canceled.set()
            for stop in ctx.stops:
                stop()

    def _execute(self, ctx: _RunContext) -> None:
        run_id = ctx.run["run_id"]
        with self.server.lock:
            ctx.run["run_details"] = {"task_details": []}
            if ctx.canceled.is_set():
                self.server.set_run_state(run_id, "CANCELED")
                return
            self.server.set_run_state(run_id, "RUNNING")
        params = (ctx.run.get("runtime_config") or {}).get("parameters", {})
        try:
            self._run_dag(ctx, ctx.spec.root, params, None, f"run-{run_id[:8]}")
        except Canceled:
            self.server.set_run_state(run_id, "CANCELED")
        except Exception as err:  # a task's error, or one of this server's: either fails the run, never hangs it
            with self.server.lock:
                ctx.run["error"] = {"code": 2, "message": str(err), "details": []}
            self.server.set_run_state(run_id, "CANCELED" if ctx.canceled.is_set() else "FAILED")
        else:
            self.server.set_run_state(run_id, "CANCELED" if ctx.canceled.is_set() else "SUCCEEDED")

    def _run_dag(self, ctx: _RunContext, component: pipeline_spec_pb2.ComponentSpec, arguments: dict[str, Any],
                 parent: io.IOStore | None, prefix: str) -> dict[str, Any]:
        store = io.IOStore(parent=parent)
        for name, value in OrchestratorUtils.join_user_inputs_and_defaults(
                arguments, component.input_definitions).items():
            store.put_parent_input(name, value)
        order = graph_utils.topological_sort_tasks(component.dag.tasks)
        while order:
            name = order.pop()
            task = component.dag.tasks[name]
            spec = ctx.spec.components[task.component_ref.name]
            if spec.WhichOneof("implementation") == "dag":
                args = build_nested_dag_arguments(name, task, spec, store)
                if not self._triggers(ctx, name, task, spec, args):
                    continue
                outputs = self._run_dag(ctx, spec, args, store, prefix)
            else:
                outputs = self._run_task(ctx, name, task, spec, store, prefix)
            for key, value in outputs.items():
                store.put_task_output(name, key, value)
        return OrchestratorUtils.get_dag_outputs(component.dag.outputs, store) if component.dag.outputs else {}

    def _run_task(self, ctx: _RunContext, name: str, task: pipeline_spec_pb2.PipelineTaskSpec,
                  spec: pipeline_spec_pb2.ComponentSpec, store: io.IOStore, prefix: str) -> dict[str, Any]:
        if ctx.canceled.is_set():
            raise Canceled()
        arguments = OrchestratorUtils.make_task_arguments(task.inputs, store)
        if not self._triggers(ctx, name, task, spec, arguments):
            return {}
        container = ctx.deployment.executors[spec.executor_label].container
        key = _cache_key(arguments, spec, container) if task.caching_options.enable_cache else None
        if key in self.cache:
            self._record(ctx, name, "SKIPPED")  # cacheutils/cache.go: a hit reuses the recorded outputs
            return self.cache[key]
        task_root = executor_input_utils.construct_local_task_root(
            pipeline_root=ctx.pipeline_root, pipeline_resource_name=prefix, task_resource_name=name)
        executor_input = executor_input_utils.construct_executor_input(
            component_spec=spec, arguments=arguments, task_root=task_root, block_input_artifact=False)
        pod_input = _launcher_local(executor_input) if self.object_store else executor_input
        command = placeholder_utils.replace_placeholders(
            full_command=[*container.command, *container.args],
            executor_input_dict=executor_input_utils.executor_input_to_dict(pod_input, spec),
            pipeline_resource_name=prefix, task_resource_name=name, pipeline_root=ctx.pipeline_root,
            unique_pipeline_id=ctx.run["run_id"])
        if self.object_store:
            command = ["python3", "-c", LAUNCHER, json.dumps(_transfers(executor_input, pod_input)), *command]
        pod_name = f"{prefix}-{name}-{uuid.uuid4().hex[:5]}"
        platform = ctx.kubernetes.get(spec.executor_label, {})
        detail = self._record(ctx, name, "RUNNING", pod_name=pod_name, child_tasks=[{"pod_name": pod_name}])
        try:
            if self.cluster is None:
                error = self._run_on_engine(ctx, pod_name, container, command, platform)
            else:
                error = self._run_step_pod(ctx, pod_name, container, command, platform)
        except Canceled:  # the run terminated (CANCELED below), or else its pod vanished (Argo: "pod deleted")
            error = "pod deleted"
        with self.server.lock:
            detail["end_time"] = _now()
            if ctx.canceled.is_set():
                detail["state"] = "CANCELED"
                raise Canceled()
            if error is not None:
                detail.update(state="FAILED", error={"code": 2, "message": error, "details": []})
                raise TaskFailed(name, error)
            detail["state"] = "SUCCEEDED"
        if self.object_store:
            executor_input = self._fetch_outputs(executor_input, pod_name)
        outputs = executor_output_utils.get_outputs_for_task(executor_input=executor_input, component_spec=spec)
        if key is not None:
            self.cache[key] = outputs
        return outputs

    def _run_on_engine(self, ctx: _RunContext, pod_name: str,
                       container: pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec,
                       command: list[str], platform: dict) -> str | None:
        """Run the step as a process or container of the engine; its failure message, None when it succeeded."""
        pod_uid = str(uuid.uuid4())
        pod = Pod(name=pod_name, uid=pod_uid, namespace=self.namespace,
                  service_account=ctx.run.get("service_account") or self.default_service_account,
                  image=container.image, command=command,
                  env={"KFP_POD_NAME": pod_name, "KFP_POD_UID": pod_uid, **{e.name: e.value for e in container.env}},
                  labels=dict(platform.get("podMetadata", {}).get("labels", {})), token=None,
                  log=Path(f"{self.pipeline_root}-pods") / f"{pod_name}.log",
                  files={f"{SERVICE_ACCOUNT_DIR}/namespace": self.namespace})
        try:
            self._admit(pod)
        except poddefault_webhook.Conflict as err:  # the API server's refusal, as a cluster's create_pod answers
            return err.denial
        pod.log.parent.mkdir(parents=True, exist_ok=True)
        with self.server.lock:
            if ctx.canceled.is_set():
                raise Canceled()
            handle = self.engine.start(pod)
            stop = functools.partial(self.engine.stop, handle)
            ctx.stops.append(stop)
        code = self.engine.wait(handle)
        with self.server.lock:
            ctx.stops.remove(stop)
        return None if code == 0 else _last_error(pod.log.read_text(errors="replace")) or f"exit code {code}"

    def _run_step_pod(self, ctx: _RunContext, pod_name: str,
                      container: pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec,
                      command: list[str], platform: dict) -> str | None:
        """Argo's workflow controller: create the step pod (:func:`step_pod`) through the cluster's API as its own
        service account (:data:`ARGO_USER`), have the cluster's kubelet run it, and follow its main container
        (Argo's ``assessNodeStatus``: the node ends with the main container, whatever a sidecar does). Its failure
        message (the API's refusal, the kubelet's CreateContainerConfigError, the log's last error), None when it
        succeeded."""
        pod = step_pod(pod_name, container, command, platform, workflow=ctx.workflow.name,
                       service_account=ctx.run.get("service_account") or self.default_service_account,
                       api_url=self.cluster.url, object_store=self.object_store,
                       security_defaults=self.security_defaults)
        with self.server.lock:
            if ctx.canceled.is_set():
                raise Canceled()
            try:
                created = self.cluster.create_pod(self.namespace, pod, user=ARGO_USER)
            except ApiError as err:
                return str(err)
            stop = functools.partial(self.cluster.delete_pod, self.namespace, pod_name)
            ctx.stops.append(stop)
        threading.Thread(target=ctx.workflow._kubelet, args=(created, MAIN, 0), name=f"pod-{pod_name}",
                         daemon=True).start()
        try:
            state = self._main_state(ctx, pod_name)
        finally:
            with self.server.lock:
                ctx.stops.remove(stop)
        if "waiting" in state:
            return f"{state['waiting']['reason']}: {state['waiting']['message']}"
        code = state["terminated"]["exitCode"]
        return None if code == 0 else _last_error(self.cluster.pod_log(self.namespace, pod_name)) or \
            f"exit code {code}"

    def _main_state(self, ctx: _RunContext, pod_name: str) -> dict:
        """The main container's ``state`` once it is ``terminated``, or ``waiting`` for a reason that fails the
        node (:data:`FAILED_WAITING`), watching the store's changes.

        Raises:
            Canceled: the run was terminated, or the pod deleted.
        """
        store = self.cluster.store
        while not ctx.canceled.is_set():
            with store.lock:
                revision = store.revision
            try:
                pod = store.get(PODS, self.namespace, pod_name)
            except ApiError:
                break
            status = next((c for c in pod.get("status", {}).get("containerStatuses", []) if c["name"] == MAIN), {})
            state = status.get("state", {})
            if "terminated" in state or state.get("waiting", {}).get("reason") in FAILED_WAITING:
                return state
            with store.lock:
                while store.revision == revision and not store.closed and not ctx.canceled.is_set():
                    store.lock.wait(0.5)
        raise Canceled()

    def _fetch_outputs(self, executor_input: pipeline_spec_pb2.ExecutorInput,
                       pod_name: str) -> pipeline_spec_pb2.ExecutorInput:
        """``executor_input`` with its executor output and output parameter files read back from the object store
        into a local folder (what KFP's launcher reports to MLMD), its artifacts' URIs as they are."""
        local = pipeline_spec_pb2.ExecutorInput()
        local.CopyFrom(executor_input)
        folder = self.cluster.workdir / "kfp-outputs" / pod_name
        folder.mkdir(parents=True)
        store = self._store()
        files = [(local.outputs, "executor_output.json"),
                 *((param, name) for name, param in local.outputs.parameters.items())]
        for holder, name in files:
            remote = holder.output_file.split("://", 1)[1]
            holder.output_file = str(folder / name)
            if store.exists(remote):
                store.get(remote, holder.output_file)
        return local

    def _store(self) -> s3fs.S3FileSystem:
        """The object store as KFP's backend reaches it: the endpoint, the namespace's
        :data:`OBJECT_STORE_SECRET` keys."""
        secret = self.cluster.store.get(SECRETS, self.namespace, OBJECT_STORE_SECRET)["data"]
        key, token = (base64.b64decode(secret[k]).decode() for k in ("accesskey", "secretkey"))
        return s3fs.S3FileSystem(key=key, secret=token, client_kwargs={"endpoint_url": self.object_store},
                                 skip_instance_cache=True)

    def _triggers(self, ctx: _RunContext, name: str, task: pipeline_spec_pb2.PipelineTaskSpec,
                  spec: pipeline_spec_pb2.ComponentSpec, arguments: dict[str, Any]) -> bool:
        """Whether task ``name`` runs: its ``triggerPolicy.condition`` evaluated as the driver does
        (``driver/dag.go``, ``driver/container.go``: ``expr.Condition`` over the task's executor input); false
        records it ``SKIPPED``.

        Raises:
            TaskFailed: the condition cannot be evaluated (the driver returns the error: the task and run fail).
        """
        if not task.trigger_policy.condition:
            return True
        params = {k: v for k, v in arguments.items() if k in spec.input_definitions.parameters}
        artifacts = {k: {"artifacts": [{"name": a.name, "uri": a.uri, "metadata": a.metadata} for a in
                                       (v if isinstance(v, list) else [v])]}
                     for k, v in arguments.items() if k in spec.input_definitions.artifacts}
        try:
            runs = kfp_expression.condition({"inputs": {"parameter_values": params, "artifacts": artifacts}},
                                            task.trigger_policy.condition)
        except kfp_expression.ConditionError as err:
            detail = self._record(ctx, name, "FAILED")
            with self.server.lock:
                detail["error"] = {"code": 2, "message": str(err), "details": []}
            raise TaskFailed(name, str(err)) from None
        if not runs:
            self._record(ctx, name, "SKIPPED")
        return runs

    def _admit(self, pod: Pod) -> None:
        """Without a cluster, the PodDefault webhook on an engine's pod as the API server calls it
        (tests/cluster/pod_defaults.py ``admit``, in a namespace labelled as :attr:`namespace_labels`): the pod as
        a manifest of one container (:data:`MAIN`, its env), the PodDefaults merged in, their env and projected token
        (at its mount path) taken back.

        Raises:
            pod_defaults.Conflict: the PodDefaults conflict with the pod or each other (e.g. an env var of its own).
        """
        manifest = {"metadata": {"name": pod.name, "labels": pod.labels}, "spec": {"containers": [
            {"name": MAIN, "env": [{"name": name, "value": value} for name, value in pod.env.items()]}]}}
        poddefault_webhook.admit(self.pod_defaults, pod.namespace, self.namespace_labels, manifest)
        (container,) = manifest["spec"]["containers"]
        pod.env = {e["name"]: e["value"] for e in container["env"]}
        for volume in manifest["spec"].get("volumes", []):
            (source,) = volume["projected"]["sources"]
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
            pod.token_path = f"{mount['mountPath'].rstrip('/')}/{source['serviceAccountToken']['path']}"
            pod.token = self._kfp_token(pod.namespace, pod.service_account)

    def _kfp_token(self, namespace: str, service_account: str) -> str:
        """A projected token of the KFP API's audience: the multi-user server's TokenReview accepts it; a
        single-user server's is :attr:`token`."""
        if self.server.multi_user is not None:
            return self.server.multi_user.service_account_token(namespace, service_account, audience=TOKEN_AUDIENCE)
        return self.token or ""

    def _record(self, ctx: _RunContext, name: str, state: str, **extra: Any) -> dict:
        detail = {"run_id": ctx.run["run_id"], "task_id": str(uuid.uuid4()), "display_name": name,
                  "create_time": _now(), "start_time": _now(), "state": state, **extra}
        if state in FINAL_STATES:
            detail["end_time"] = detail["start_time"]
        with self.server.lock:
            ctx.run["run_details"]["task_details"].append(detail)
        return detail

    # -- recurring runs ------------------------------------------------------------------------------------------
    def _schedule_loop(self) -> None:
        while not self._stop.wait(0.2):
            now = datetime.now(timezone.utc)
            with self.server.lock:
                recurring = [r for r in self.server.store.recurring_runs.values() if r.get("status") == "ENABLED"]
            for rec in recurring:
                for fire in self._due(rec, now):
                    self._fire(rec, fire)

    def _due(self, rec: dict, now: datetime) -> list[datetime]:
        """The fire times of ``rec`` since its last one (its creation at first), up to ``now``: its cron
        (``cron_schedule``) or every ``interval_second`` (``periodic_schedule``)."""
        trigger = rec.get("trigger") or {}
        since = self._fired.get(rec["recurring_run_id"]) or _parse(rec["created_at"])
        due = list(itertools.takewhile(lambda fire: fire <= now, _fire_times(trigger, since)))
        if due:
            self._fired[rec["recurring_run_id"]] = due[-1]
        return due[-1:] if rec.get("no_catchup") else due

    def _fire(self, rec: dict, fire: datetime) -> None:
        with self.server.lock:
            active = [r for r in self.server.store.runs.values()
                      if r.get("recurring_run_id") == rec["recurring_run_id"] and r["state"] not in FINAL_STATES]
            if len(active) >= int(rec.get("max_concurrency") or 10):
                return  # scheduled_workflow.go: at max_concurrency a fire starts nothing
            body = {k: rec[k] for k in ("pipeline_version_reference", "pipeline_spec", "runtime_config",
                                        "service_account", "experiment_id") if k in rec}
            self.server.add_run({**body, "display_name": f"{rec['display_name']}-{fire:%Y%m%d%H%M%S}",
                                 "recurring_run_id": rec["recurring_run_id"]},
                                created_by=self.server.store.created_by.get(rec["recurring_run_id"]))


EMULATED = {
    "spec": {"components", "deploymentSpec", "pipelineInfo", "root", "schemaVersion", "sdkVersion"},
    "executor": {"container"},
    "container": {"image", "command", "args", "env"},
    "component": {"dag", "executorLabel", "inputDefinitions", "outputDefinitions"},
    "task": {"cachingOptions", "componentRef", "dependentTasks", "inputs", "taskInfo", "triggerPolicy"},
    "triggerPolicy": {"condition"},
    "kubernetes": {"podMetadata", "secretAsEnv", "pvcMount"},
    "podMetadata": {"labels"},
}
"""The IR and kfp-kubernetes fields the executor applies, by where they sit: any other (``retryPolicy``,
``container.resources`` and accelerators, ``triggerPolicy.strategy`` of exit handlers, iterators, node selectors,
tolerations, ...) would be silently ignored, so a run using one fails naming it."""
POD_EMULATED = {"container": {"resources"}, "kubernetes": {"imagePullSecret"}}
"""What the step pods of a cluster apply besides :data:`EMULATED` (an engine would ignore them)."""


def unemulated_fields(spec: dict, platform: dict, *, pods: bool = False) -> list[str]:
    """The fields of a pipeline ``spec`` and its ``platform`` spec that :data:`EMULATED` lacks (with ``pods``, the
    cluster's step pods, and :data:`POD_EMULATED`), as paths."""
    emulated = {k: v | POD_EMULATED.get(k, set()) for k, v in EMULATED.items()} if pods else EMULATED
    found = [f"{k}" for k in spec if k not in emulated["spec"]]
    for label, executor in spec.get("deploymentSpec", {}).get("executors", {}).items():
        found += [f"deploymentSpec.executors.{label}.{k}" for k in executor if k not in emulated["executor"]]
        found += [f"deploymentSpec.executors.{label}.container.{k}" for k in executor.get("container", {})
                  if k not in emulated["container"]]
    for where, component in [("root", spec.get("root", {})), *((f"components.{n}", c) for n, c in
                                                                 spec.get("components", {}).items())]:
        found += [f"{where}.{k}" for k in component if k not in emulated["component"]]
        for name, task in component.get("dag", {}).get("tasks", {}).items():
            found += [f"{where}.dag.tasks.{name}.{k}" for k in task if k not in emulated["task"]]
            found += [f"{where}.dag.tasks.{name}.triggerPolicy.{k}" for k in task.get("triggerPolicy", {})
                      if k not in emulated["triggerPolicy"]]
    for name, value in platform.get("platforms", {}).items():
        if name != "kubernetes":
            found.append(f"platforms.{name}")
            continue
        found += [f"platforms.kubernetes.{k}" for k in value if k != "deploymentSpec"]
        for label, executor in value.get("deploymentSpec", {}).get("executors", {}).items():
            where = f"platforms.kubernetes.deploymentSpec.executors.{label}"
            found += [f"{where}.{k}" for k in executor if k not in emulated["kubernetes"]]
            found += [f"{where}.podMetadata.{k}" for k in executor.get("podMetadata", {})
                      if k not in emulated["podMetadata"]]
    return found


class _Workflow(_JobController):
    """Argo's Workflow of one run in the test cluster: its step pods run on the kubelet of
    :class:`cluster.k8s_operator._JobController` (a folder for their logs, no hosts of their own); the executor
    follows each pod's main container."""

    def __init__(self, cluster: K8sServer, namespace: str, run: dict):
        self._setup(cluster, namespace, {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                                         "metadata": {"name": f"run-{run['run_id'][:8]}", "uid": run["run_id"]}})
        self.run_policy: dict = {}
        self._write_pod_files([])

    def _master_running(self) -> bool:
        return False  # a Workflow has no job status of its own here

    def _pod_finished(self, rtype: str, index: int, name: str, exit_code: int) -> None:
        """Nothing: :meth:`KfpExecutor._main_state` reads the pod's end from the store."""


def install_argo(cluster: K8sServer) -> None:
    """KFP's install of Argo in ``cluster``: :data:`ARGO_CLUSTER_ROLE` bound to :data:`ARGO_USER`'s ServiceAccount
    (``argo-binding``); one already there is kept."""
    binding = {"metadata": {"name": "argo-binding"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "argo-cluster-role"},
               "subjects": [{"kind": "ServiceAccount", "name": "argo", "namespace": "kubeflow"}]}
    for resource, body in ((CLUSTER_ROLES, ARGO_CLUSTER_ROLE), (CLUSTER_ROLE_BINDINGS, binding)):
        try:
            cluster.store.create(resource, "", copy.deepcopy(body))
        except ApiError as err:
            if err.code != 409:
                raise


def step_pod(pod_name: str, container: pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec,
             command: list[str], platform: dict, *, workflow: str, service_account: str, api_url: str,
             object_store: str = "", security_defaults: dict[str, Any] | None = None) -> dict:
    """The step pod as Argo creates it from KFP's compiled workflow and the driver's pod spec patch (see the
    module docstring): the run's service account, ``restartPolicy: Never``, the ``main`` container running the
    command under Argo's emissary (:data:`EMISSARY`) with ``KFP_POD_NAME``/``KFP_POD_UID`` (downward API), the
    container's env and resources, the platform spec's labels, Secret env, claims and image pull secrets; the
    service-account mount and API address Kubernetes adds; with an object-store root the compiled template's
    emptyDirs (:data:`STEP_EMPTY_DIRS`) and the object store's credentials.

    Args:
        workflow: the run's Argo Workflow (the pod's ``workflows.argoproj.io/workflow`` label).
        api_url: the cluster's API server, as the pod's ``KUBERNETES_SERVICE_HOST``/``PORT``.
        object_store: the object store's endpoint with an ``s3://``/``minio://`` ``pipeline_root``, else "".
        security_defaults: the admin's ``runAsUser``, ``runAsGroup``, ``runAsNonRoot`` (see :class:`KfpExecutor`).
    """
    api = urlsplit(api_url)
    env = [{"name": "KFP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "KFP_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
           *({"name": e.name, "value": e.value} for e in container.env),
           *({"name": item["envVar"], "valueFrom": {"secretKeyRef": {
               "name": ref.get("secretNameParameter", {}).get("runtimeValue", {}).get("constant")
               or ref["secretName"], "key": item["secretKey"], "optional": bool(ref.get("optional"))}}}
             for ref in platform.get("secretAsEnv", []) for item in ref["keyToEnv"]),
           {"name": "KUBERNETES_SERVICE_HOST", "value": api.hostname},
           {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)}]
    volumes = [{"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}]
    mounts = [{"name": "kube-api-access", "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}]
    for index, claim in enumerate(platform.get("pvcMount", [])):
        name = claim.get("pvcNameParameter", {}).get("runtimeValue", {}).get("constant") or claim["constant"]
        volumes.append({"name": f"pvc-{index}", "persistentVolumeClaim": {"claimName": name}})
        mounts.append({"name": f"pvc-{index}", "mountPath": claim["mountPath"]})
    if object_store:
        volumes += [{"name": name, "emptyDir": {}} for name in STEP_EMPTY_DIRS]
        mounts += [{"name": name, "mountPath": path} for name, path in STEP_EMPTY_DIRS.items()]
        env += [{"name": "AWS_ENDPOINT_URL", "value": object_store},
                *({"name": var, "valueFrom": {"secretKeyRef": {"name": OBJECT_STORE_SECRET, "key": key}}}
                  for var, key in (("AWS_ACCESS_KEY_ID", "accesskey"), ("AWS_SECRET_ACCESS_KEY", "secretkey"))),
                {"name": "AWS_DEFAULT_REGION", "value": "us-east-1"},
                {"name": "AWS_EC2_METADATA_DISABLED", "value": "true"}]
    volumes.append({"name": "var-run-argo", "emptyDir": {}})
    mounts.append({"name": "var-run-argo", "mountPath": VAR_RUN_ARGO})
    env.append({"name": "ARGO_CONTAINER_NAME", "value": MAIN})
    main = {"name": MAIN, "image": container.image,
            "command": ["python3", "-c", EMISSARY, f"{VAR_RUN_ARGO}/argoexec", "--", *command],
            "env": env, "volumeMounts": mounts,
            "securityContext": {**USER_CONTAINER_SECURITY, **(security_defaults or {})}}
    resources = _resources(container.resources)
    if resources:
        main["resources"] = resources
    spec = {"serviceAccountName": service_account,
            "restartPolicy": "Never", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [main], "volumes": volumes}
    if platform.get("imagePullSecret"):
        spec["imagePullSecrets"] = [{"name": s["secretName"]} for s in platform["imagePullSecret"]]
    labels = {"pipelines.kubeflow.org/v2_component": "true", "workflows.argoproj.io/workflow": workflow,
              **platform.get("podMetadata", {}).get("labels", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name, "labels": labels},
            "spec": spec, "status": {"phase": "Pending", "conditions": []}}


def _launcher_local(executor_input: pipeline_spec_pb2.ExecutorInput) -> pipeline_spec_pb2.ExecutorInput:
    """The executor input the command gets in a step pod with an object-store root: the executor output and output
    parameter files under :data:`LAUNCHER_DIR` (``launcher_v2.go`` keeps them local), the artifacts' URIs as they
    are (the kfp SDK reads and writes them at their local paths)."""
    local = pipeline_spec_pb2.ExecutorInput()
    local.CopyFrom(executor_input)
    local.outputs.output_file = f"{LAUNCHER_DIR}/outputs/executor_output.json"
    for name, param in local.outputs.parameters.items():
        param.output_file = f"{LAUNCHER_DIR}/outputs/{name}"
    return local


def _transfers(remote: pipeline_spec_pb2.ExecutorInput, local: pipeline_spec_pb2.ExecutorInput) -> dict:
    """The launcher's plan (tests/cluster/kfp_launcher.py): the input artifacts to download to their local paths,
    the output artifacts and the files :func:`_launcher_local` moved to upload where ``remote`` has them."""
    download = {_local_path(a.uri): a.uri for found in remote.inputs.artifacts.values() for a in found.artifacts}
    upload = {_local_path(a.uri): a.uri for found in remote.outputs.artifacts.values() for a in found.artifacts}
    upload[local.outputs.output_file] = remote.outputs.output_file
    upload.update({local.outputs.parameters[name].output_file: param.output_file
                   for name, param in remote.outputs.parameters.items()})
    return {"download": download, "upload": upload}


def _local_path(uri: str) -> str:
    """An artifact's local path in the pod (kfp ``Artifact._get_path``).

    Raises:
        ValueError: a scheme the test launcher cannot read (not in :data:`LOCAL_PREFIXES`).
    """
    scheme, _, rest = uri.partition("://")
    if scheme not in LOCAL_PREFIXES:
        raise ValueError(f"artifact {uri}: the test launcher moves only {', '.join(LOCAL_PREFIXES)} URIs")
    return LOCAL_PREFIXES[scheme] + rest


def _resources(spec: pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec.ResourceSpec) -> dict:
    """The main container's ``resources`` as the driver sets them (``driver.go`` ``initPodSpecPatch``, lines
    358-445): the ``resource*`` quantities, else the older numbers (cores, GB), an accelerator's ``resourceCount``
    (else its older ``count`` when positive) of its ``resourceType`` (else ``type``) as a limit."""
    limits = {"cpu": spec.resource_cpu_limit or (f"{spec.cpu_limit:g}" if spec.cpu_limit else ""),
              "memory": spec.resource_memory_limit or (f"{spec.memory_limit:g}G" if spec.memory_limit else "")}
    requests = {"cpu": spec.resource_cpu_request or (f"{spec.cpu_request:g}" if spec.cpu_request else ""),
                "memory": spec.resource_memory_request or (f"{spec.memory_request:g}G" if spec.memory_request else "")}
    accelerator = spec.accelerator
    kind = accelerator.resource_type or accelerator.type
    count = accelerator.resource_count or (str(accelerator.count) if accelerator.count > 0 else "")
    if kind and count:
        limits[kind] = count
    found = {"limits": {k: v for k, v in limits.items() if v}, "requests": {k: v for k, v in requests.items() if v}}
    return {k: v for k, v in found.items() if v}


def _fire_times(trigger: dict, since: datetime) -> Iterator[datetime]:
    """The fire times of a recurring run's ``trigger`` after ``since``."""
    if "cron_schedule" in trigger:
        times = croniter(trigger["cron_schedule"]["cron"], since, second_at_beginning=True)
        while True:
            yield times.get_next(datetime)
    interval = timedelta(seconds=int(trigger["periodic_schedule"]["interval_second"]))
    while True:
        since += interval
        yield since


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _cache_key(arguments: dict[str, Any], spec: pipeline_spec_pb2.ComponentSpec,
               container: pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec) -> str:
    """cacheutils/cache.go's inputs: parameter values, input artifact names, output spec, image, command."""
    params = {k: v for k, v in arguments.items() if k in spec.input_definitions.parameters}
    artifacts = sorted(k for k in arguments if k in spec.input_definitions.artifacts)
    material = {"parameters": params, "artifacts": artifacts,
                "outputs": json_format.MessageToDict(spec.output_definitions), "image": container.image,
                "command": [*container.command, *container.args]}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _last_error(log: str) -> str:
    """The last ``SomethingError: message`` line of a task's log (what a step's traceback ends with)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if ("Error" in line or "Exception" in line) and ": " in line]
    return (errors or lines or [""])[-1][:2000]
