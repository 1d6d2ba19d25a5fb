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
  (``kfp/local/executor_input_utils.py``, ``placeholder_utils.py``, ``executor_output_utils.py``): used here.
- ``backend/src/v2/compiler/argocompiler/common.go``: every step pod carries ``KFP_POD_NAME`` and ``KFP_POD_UID``
  (downward API) and the container's own ``env``; the pod runs as the run's service account, in the profile's
  namespace.
- Kubeflow's PodDefault admission webhook (kubeflow/kubeflow ``components/admission-webhook/main.go``
  ``filterPodDefaults``: a PodDefault applies to a pod of its own namespace whose labels its ``spec.selector``
  matches, ``metav1.LabelSelectorAsSelector``; ``applyPodDefaultsOnPod`` adds its volumes, mounts and env): the
  PodDefaults given (e.g. deploy/kubeflow-profile.yaml's ``access-ml-pipeline``) project the service-account token
  of the audience they name at the path they mount; nothing else gives a pod a KFP API token. A PodDefault field
  this emulation does not apply (volumes other than a projected ``serviceAccountToken``, ``annotations``,
  ``labels``, ``command``, ...) is refused with its name.
- ``backend/src/v2/driver/driver.go`` (``extendPodSpecPatch``) applies the task's Kubernetes platform spec
  (kfp-kubernetes): ``podMetadata`` labels, ``pvcMount`` as a volume of the claim at its ``mountPath``,
  ``secretAsEnv`` as ``secretKeyRef`` env (a missing Secret or key that is not ``optional`` fails the pod with
  the kubelet's CreateContainerConfigError). Every pod mounts its service account's token, ``ca.crt`` and
  namespace at ``/var/run/secrets/kubernetes.io/serviceaccount`` and has ``KUBERNETES_SERVICE_HOST``/``PORT``
  (Kubernetes' ServiceAccount admission and kubelet), which is how a step reaches the cluster's API.
- ``backend/src/apiserver/resource/resource_manager.go`` (``TerminateRun``): a terminated run is ``CANCELING``
  until its pods stop, then ``CANCELED``; a failed task fails the run with its error.
- ``backend/src/crd/controller/scheduledworkflow/`` (``util/cron_schedule.go``, ``util/periodic_schedule.go``,
  ``scheduled_workflow.go``): cron with six fields (seconds first, robfig/cron) or every ``interval_second``; ``max_concurrency`` caps the schedule's active runs (a fire while
  at the cap is skipped); ``no_catchup`` starts only the latest missed fire, else every missed fire runs.

The platform spec and the service-account mount need the Kubernetes test cluster the pods run in
(``KfpExecutor(cluster=K8sServer)``: its claims' folders, its Secrets, tokens it issues); without one they are not
applied and the engine's ``env`` stands in for the Secrets.

Engines: :class:`DockerEngine` runs each task as a container of the image the IR names (``make e2e``);
:class:`ProcessEngine` runs a task's command as a subprocess (its own process group) with the pod's
environment; the checkout's virtualenv stands in for the image. A pod file (the projected token) is written under
the pod's directory and its path given by the variable the kfp SDK reads for it (``KF_PIPELINES_SA_TOKEN_PATH``);
a process has no in-pod paths, so it gets neither claims nor the service-account mount.
"""
from __future__ import annotations

import contextlib
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
from typing import Any, Iterator, Protocol, Sequence
from urllib.parse import urlsplit

import docker
import requests
from croniter import croniter
from google.protobuf import json_format
from kfp.local import executor_input_utils, executor_output_utils, graph_utils, io, placeholder_utils
from kfp.local.orchestrator.orchestrator_utils import OrchestratorUtils
from kfp.local.orchestrator.task_spec_utils import build_nested_dag_arguments
from kfp.pipeline_spec import pipeline_spec_pb2

from cluster import kfp_expression
from cluster.k8s_operator import container_env
from cluster.k8s_rbac import service_account_user
from cluster.k8s_server import K8sServer
from cluster.k8s_store import label_matcher
from cluster.kfp_server import FINAL_STATES, KfpApiServer, _now, split_spec

TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
"""The variable the kfp SDK reads the token's path from (``kfp/client/token_credentials_base.py``)."""
ACCESS_LABEL = "access-ml-pipeline"
POD_DEFAULT_FIELDS = {"desc", "selector", "volumes", "volumeMounts", "env"}
"""The PodDefault ``spec`` fields this emulation applies."""
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
    """In-pod path -> content: the service-account mount."""
    mounts: dict[str, Path] = field(default_factory=dict)
    """In-pod path -> host folder: the claims the platform spec mounts."""


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
        if pod.mounts:
            raise ValueError(f"pod {pod.name} mounts claims at {sorted(pod.mounts)}: a process has no in-pod paths; "
                             "run it with the DockerEngine")
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
        volumes = {str(self.pipeline_root): {"bind": str(self.pipeline_root), "mode": "rw"},
                   **{str(host): {"bind": target, "mode": "rw"} for target, host in pod.mounts.items()}}
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
    handles: list[Any] = field(default_factory=list)


class KfpExecutor:
    """``with KfpApiServer() as kfp, KfpExecutor(kfp, ProcessEngine(root=...), pipeline_root=...):``."""

    def __init__(self, server: KfpApiServer, engine: Engine, *, pipeline_root: Path, namespace: str = "kubeflow",
                 default_service_account: str = "pipeline-runner", pod_defaults: Sequence[dict] = (),
                 token: str | None = None, cluster: K8sServer | None = None):
        self.server, self.engine, self.cluster = server, engine, cluster
        self.pipeline_root = pipeline_root
        self.namespace, self.default_service_account = namespace, default_service_account
        self.pod_defaults = [_checked_pod_default(d) for d in pod_defaults]
        """The PodDefaults of the cluster (kubeflow.org/v1alpha1), applied to matching pods."""
        self.token = token
        """The token a PodDefault projects when the server is single-user; a multi-user server issues each pod's
        own (its service account, the PodDefault's audience)."""
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
        unmodelled = unemulated_fields(spec, platform)
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
            for handle in ctx.handles:
                self.engine.stop(handle)

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
        command = placeholder_utils.replace_placeholders(
            full_command=[*container.command, *container.args],
            executor_input_dict=executor_input_utils.executor_input_to_dict(executor_input, spec),
            pipeline_resource_name=prefix, task_resource_name=name, pipeline_root=ctx.pipeline_root,
            unique_pipeline_id=ctx.run["run_id"])
        pod_name, pod_uid = f"{prefix}-{name}-{uuid.uuid4().hex[:5]}", str(uuid.uuid4())
        platform = ctx.kubernetes.get(spec.executor_label, {})
        pod = Pod(name=pod_name, uid=pod_uid, namespace=self.namespace,
                  service_account=ctx.run.get("service_account") or self.default_service_account,
                  image=container.image, command=command,
                  env={"KFP_POD_NAME": pod_name, "KFP_POD_UID": pod_uid, **{e.name: e.value for e in container.env}},
                  labels=dict(platform.get("podMetadata", {}).get("labels", {})), token=None,
                  log=self.pipeline_root.with_name(f"{self.pipeline_root.name}-pods") / f"{pod_name}.log",
                  files={f"{SERVICE_ACCOUNT_DIR}/namespace": self.namespace})
        self._admit(pod)
        pod.log.parent.mkdir(parents=True, exist_ok=True)
        detail = self._record(ctx, name, "RUNNING", pod_name=pod_name)
        if self.cluster is not None:
            try:
                self._on_cluster(pod, platform)
            except ValueError as err:  # the kubelet does not start the container
                with self.server.lock:
                    message = f"CreateContainerConfigError: {err}"
                    detail.update(state="FAILED", end_time=_now(), error={"code": 2, "message": message,
                                                                          "details": []})
                raise TaskFailed(name, message) from None
        with self.server.lock:
            if ctx.canceled.is_set():
                raise Canceled()
            handle = self.engine.start(pod)
            ctx.handles.append(handle)
        code = self.engine.wait(handle)
        with self.server.lock:
            ctx.handles.remove(handle)
            detail["end_time"] = _now()
            if ctx.canceled.is_set():
                detail["state"] = "CANCELED"
                raise Canceled()
            if code != 0:
                message = _last_error(pod.log) or f"exit code {code}"
                detail.update(state="FAILED", error={"code": 2, "message": message, "details": []})
                raise TaskFailed(name, message)
            detail["state"] = "SUCCEEDED"
        outputs = executor_output_utils.get_outputs_for_task(executor_input=executor_input, component_spec=spec)
        if key is not None:
            self.cache[key] = outputs
        return outputs

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
        """The PodDefault admission webhook: each PodDefault of the pod's namespace whose selector matches its labels
        (``filterPodDefaults``) adds its projected token, mount and env (``applyPodDefaultsOnPod``)."""
        for default in self.pod_defaults:
            selector = default["spec"].get("selector") or {}
            if default["metadata"].get("namespace") != pod.namespace \
                    or not label_matcher(_selector_string(selector))(pod.labels):
                continue
            for volume in default["spec"].get("volumes", []):
                (source,) = volume["projected"]["sources"]
                token = source["serviceAccountToken"]
                (mount,) = [m for m in default["spec"]["volumeMounts"] if m["name"] == volume["name"]]
                pod.token_path = f"{mount['mountPath'].rstrip('/')}/{token['path']}"
                pod.token = (self.server.multi_user.service_account_token(
                    pod.namespace, pod.service_account, audience=token.get("audience", ""))
                    if self.server.multi_user is not None else self.token)
            pod.env.update({e["name"]: e["value"] for e in default["spec"].get("env", [])})

    def _on_cluster(self, pod: Pod, platform: dict) -> None:
        """Give ``pod`` what the cluster adds: the platform spec's claims and Secret env, the service account's
        token and CA, the API's address.

        Raises:
            ValueError: a claim without a folder, or a Secret or key that is missing and not ``optional``.
        """
        env = [{"name": item["envVar"], "valueFrom": {"secretKeyRef": {
                   "name": ref.get("secretNameParameter", {}).get("runtimeValue", {}).get("constant")
                   or ref["secretName"], "key": item["secretKey"], "optional": bool(ref.get("optional"))}}}
               for ref in platform.get("secretAsEnv", []) for item in ref["keyToEnv"]]
        pod.env.update(container_env(self.cluster, pod.namespace, {"metadata": {"name": pod.name}}, {"env": env}))
        for mount in platform.get("pvcMount", []):
            claim = mount.get("pvcNameParameter", {}).get("runtimeValue", {}).get("constant") or mount["constant"]
            if claim not in self.cluster.volumes:
                raise ValueError(f'persistentvolumeclaim "{claim}" not found')
            pod.mounts[mount["mountPath"]] = self.cluster.volumes[claim]
        api = urlsplit(self.cluster.url)
        pod.env.update(KUBERNETES_SERVICE_HOST=api.hostname, KUBERNETES_SERVICE_PORT=str(api.port))
        pod.files[f"{SERVICE_ACCOUNT_DIR}/token"] = self.cluster.identities.issue(
            service_account_user(pod.namespace, pod.service_account))
        pod.files[f"{SERVICE_ACCOUNT_DIR}/ca.crt"] = self.cluster.ca_pem.decode()

    def _record(self, ctx: _RunContext, name: str, state: str, **extra: str) -> dict:
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
tolerations, image pull secrets, ...) would be silently ignored, so a run using one fails naming it."""


def unemulated_fields(spec: dict, platform: dict) -> list[str]:
    """The fields of a pipeline ``spec`` and its ``platform`` spec that :data:`EMULATED` lacks, as paths."""
    found = [f"{k}" for k in spec if k not in EMULATED["spec"]]
    for label, executor in spec.get("deploymentSpec", {}).get("executors", {}).items():
        found += [f"deploymentSpec.executors.{label}.{k}" for k in executor if k not in EMULATED["executor"]]
        found += [f"deploymentSpec.executors.{label}.container.{k}" for k in executor.get("container", {})
                  if k not in EMULATED["container"]]
    for where, component in [("root", spec.get("root", {})), *((f"components.{n}", c) for n, c in
                                                                 spec.get("components", {}).items())]:
        found += [f"{where}.{k}" for k in component if k not in EMULATED["component"]]
        for name, task in component.get("dag", {}).get("tasks", {}).items():
            found += [f"{where}.dag.tasks.{name}.{k}" for k in task if k not in EMULATED["task"]]
            found += [f"{where}.dag.tasks.{name}.triggerPolicy.{k}" for k in task.get("triggerPolicy", {})
                      if k not in EMULATED["triggerPolicy"]]
    for name, value in platform.get("platforms", {}).items():
        if name != "kubernetes":
            found.append(f"platforms.{name}")
            continue
        found += [f"platforms.kubernetes.{k}" for k in value if k != "deploymentSpec"]
        for label, executor in value.get("deploymentSpec", {}).get("executors", {}).items():
            where = f"platforms.kubernetes.deploymentSpec.executors.{label}"
            found += [f"{where}.{k}" for k in executor if k not in EMULATED["kubernetes"]]
            found += [f"{where}.podMetadata.{k}" for k in executor.get("podMetadata", {})
                      if k not in EMULATED["podMetadata"]]
    return found


def _checked_pod_default(default: dict) -> dict:
    """``default`` if it uses only what :meth:`KfpExecutor._admit` applies.

    Raises:
        ValueError: a field it does not apply, named.
    """
    name = default["metadata"]["name"]
    unknown = sorted(set(default["spec"]) - POD_DEFAULT_FIELDS)
    for volume in default["spec"].get("volumes", []):
        sources = volume.get("projected", {}).get("sources", [])
        if set(volume) != {"name", "projected"} or len(sources) != 1 or set(sources[0]) != {"serviceAccountToken"}:
            unknown.append(f"volumes[{volume['name']}] (only a projected serviceAccountToken is emulated)")
    if unknown:
        raise ValueError(f"PodDefault {name}: spec fields {unknown} are not emulated by the test executor")
    return default


def _selector_string(selector: dict) -> str:
    """A ``metav1.LabelSelector`` as the selector string ``LabelSelectorAsSelector`` makes of it."""
    ops = {"In": "{key} in ({values})", "NotIn": "{key} notin ({values})", "Exists": "{key}",
           "DoesNotExist": "!{key}"}
    return ",".join([*(f"{k}={v}" for k, v in sorted(selector.get("matchLabels", {}).items())),
                     *(ops[e["operator"]].format(key=e["key"], values=",".join(e.get("values", [])))
                       for e in selector.get("matchExpressions", []))])


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


def _last_error(log: Path) -> str:
    """The last ``SomethingError: message`` line of a task's log (what a step's traceback ends with)."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if ("Error" in line or "Exception" in line) and ": " in line]
    return (errors or lines or [""])[-1][:2000]
