"""The Kubernetes rendering of a training launch: a Kubeflow PyTorchJob, created and followed with the
`kubernetes` client (a kubeconfig, or the in-cluster service account).

The job is named after the pipeline run (:func:`training.launch.manifests.job_name_for`), so a retried launch step that
finds it already there (409 AlreadyExists) attaches to it instead of starting a second one. Inputs and the model
go through the shared volume (:func:`training.launch.manifests.job_dir`), mounted at the same path in the launch step and
in the job's pods. The launcher follows the job's conditions with a watch resumed from the last resourceVersion
(re-listing after 410 Gone), copies the master's log into the step's log, and ends with exactly one outcome:

* Succeeded, and the model is on the shared volume: it is copied to the step's model dir;
* anything else raises one :class:`~training.launch.local.LaunchError` naming the pod, the cause and its last log
  lines: the job Failed; a pod stayed Unschedulable past ``unschedulable_timeout_seconds``; an image cannot be
  pulled or a container cannot be configured; a container was OOMKilled; the job restarted more than
  ``restart_cap`` times (the operator retries exit codes >= 128 without applying backoffLimit); or the
  launcher's ``timeout_seconds`` passed.

Whenever the launcher gives up or is cancelled (SIGTERM, Ctrl-C), it deletes the job (its pods go with it), so no
pod keeps holding GPUs; a job that ended on its own is left to ``cleanPodPolicy`` and ``ttlSecondsAfterFinished``.
A SIGKILLed launch step cannot clean up: its retry attaches to the job it left behind.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from data import storage
from data.validation import DEFAULT_LIMITS, DataFileError
from training.config import TrainingConfig
from training.fileio import atomic_copy, atomic_write_json, atomic_write_text
from training.launch.cluster import ClusterConfig
from training.launch.kube_client import api_client
from training.launch.local import LaunchError, TrainResult, exit_on_sigterm
from training.launch.manifests import MLFLOW_RUN_ID_FILE, job_dir, job_manifest, job_name_for, render_pytorchjob
from training.model_files import MODEL_FILE, MODULE_FILE
from training.progress import progress
from training.settings import section_from_dict

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
_TORCHRUN_FAILURE = re.compile(r"\] failed \(exitcode: -?\d+\) local_rank: \d+")
"""torchrun's log line that starts its report of a failed worker."""
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError")
"""Container waiting reasons that no amount of waiting fixes."""


@dataclass(kw_only=True, slots=True)
class LaunchPolicy:
    """How the launcher follows a job: its own caps on top of the operator's, and the optional preflight."""

    kubeconfig: str = ""
    """Kubeconfig file; empty: ``$KUBECONFIG`` or ``~/.kube/config`` when present, else the in-cluster config."""
    restart_cap: int = 3
    """Job restarts (operator Restarting transitions plus container restarts) before the launcher deletes the job
    and fails: the operator itself retries exit codes >= 128 forever."""
    timeout_seconds: int = 86400
    """Deadline from submitting (or attaching to) the job until it has finished."""
    unschedulable_timeout_seconds: int = 600
    """How long a pod may stay Unschedulable (no node fits it) before the launch fails."""
    poll_seconds: float = 2.0
    """Interval of the pod checks; also how long one watch request stays open."""
    log_tail_lines: int = 20
    """Last log lines of the failing pod quoted in the error."""
    preflight_min_busbw_gbps: float = 0.0
    """Before training, run ``training.collectives --preflight`` as a job of the same shape and fail fast when its
    all_reduce bus bandwidth (GB/s) is below this floor; 0 skips the preflight."""
    preflight_timeout_seconds: int = 600
    """Deadline of the preflight job."""

    def __post_init__(self) -> None:
        for name in ("timeout_seconds", "unschedulable_timeout_seconds", "log_tail_lines", "preflight_timeout_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"launcher.{name}={value!r}: use an integer >= 1")
        if not isinstance(self.restart_cap, int) or isinstance(self.restart_cap, bool) or self.restart_cap < 0:
            raise ValueError(f"launcher.restart_cap={self.restart_cap!r}: use an integer >= 0 (0: no restarts)")
        if not self.poll_seconds > 0:
            raise ValueError(f"launcher.poll_seconds={self.poll_seconds!r}: use a positive number such as 2")
        if not self.preflight_min_busbw_gbps >= 0:
            raise ValueError(f"launcher.preflight_min_busbw_gbps={self.preflight_min_busbw_gbps!r}: use a bandwidth "
                             "in GB/s, or 0 to skip the preflight")
        if self.kubeconfig and not Path(self.kubeconfig).is_file():
            raise ValueError(f"launcher.kubeconfig={self.kubeconfig!r}: file not found; give a kubeconfig path or "
                             "leave it empty for $KUBECONFIG / in-cluster")


@dataclass(kw_only=True, slots=True)
class KubernetesSettings:
    """kfloop.yaml's ``cluster:`` section (the pipeline's ``cluster_config``): the job's :class:`ClusterConfig`
    fields, and the :class:`LaunchPolicy` under the ``launcher`` key."""

    cluster: ClusterConfig
    """Where and how the job runs."""
    launcher: LaunchPolicy
    """How the launcher follows it."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "KubernetesSettings":
        """Split a ``cluster`` settings dict.

        Raises:
            ValueError: an unknown or invalid key (the message lists the valid ones).
        """
        settings = dict(d or {})
        launcher = dict(settings.pop("launcher", None) or {})
        return cls(cluster=ClusterConfig.from_dict(settings),
                   launcher=section_from_dict(LaunchPolicy, launcher, "cluster.launcher"))


# ------------------------------------------------------------------------------------------------ one job

class _MasterLog(threading.Thread):
    """Copies the master pod's log (every container start of it) to a file and to stderr with a ``[master]``
    prefix; follows the pod across restarts by uid. A follow ends when the container does."""

    def __init__(self, core, namespace: str, pod: str, path: Path, stop: threading.Event, poll: float):
        super().__init__(name=f"log-{pod}", daemon=True)
        self.core, self.namespace, self.pod, self.path, self.stop, self.poll = core, namespace, pod, path, stop, poll
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"")

    def run(self) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        followed: set[str] = set()
        while not self.stop.is_set():
            try:
                pod = self.core.read_namespaced_pod(self.pod, self.namespace)
                uid = pod.metadata.uid
                if uid in followed or pod.status.phase == "Pending":
                    self.stop.wait(self.poll)
                    continue
                stream = self.core.read_namespaced_pod_log(self.pod, self.namespace, container="pytorch",
                                                           follow=True, _preload_content=False)
                followed.add(uid)
                with self.path.open("ab") as out:
                    for line in stream:
                        out.write(line)
                        out.flush()
                        sys.stderr.write("[master] " + line.decode(errors="replace"))
                stream.release_conn()
            except (ApiException, HTTPError, OSError):
                self.stop.wait(self.poll)


@dataclass(kw_only=True, slots=True)
class _Seen:
    """What the launcher has seen of one job and its pods (the pod watch thread writes, the main thread reads)."""

    restarts: int = 0
    """Restarting transitions of the job."""
    restarting: bool = False
    """Whether the job's Restarting condition was True in the last state seen."""
    container_restarts: int = 0
    """Most restarts of one container (restartPolicy OnFailure/Always restart in place)."""
    restarted_pod: str = ""
    """The pod of that container."""
    unschedulable: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Pod -> (monotonic time first seen Unschedulable, the scheduler's message)."""
    fatal: tuple[str, str, int | None] | None = None
    """(cause, pod, exit code) of the first pod problem that waiting will not fix."""


class _PodWatch(threading.Thread):
    """Watches the job's pods from ``revision`` (the job's, so that no pod event after it is missed; re-listing
    after 410) and records what it sees: a watch sees every state, e.g. the OOMKilled status of a pod the operator
    deletes and recreates at once."""

    def __init__(self, core, namespace: str, job: str, revision: str, seen: _Seen, stop: threading.Event,
                 poll: float):
        super().__init__(name=f"pods-{job}", daemon=True)
        self.core, self.namespace, self.seen, self.stop, self.poll = core, namespace, seen, stop, poll
        self.selector, self.revision = f"{JOB_NAME_LABEL}={job}", revision

    def run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        revision = self.revision
        while not self.stop.is_set():
            try:
                if revision is None:
                    pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
                    for pod in pods.items:
                        self.observe(pod)
                    revision = pods.metadata.resource_version
                for event in watch.Watch().stream(self.core.list_namespaced_pod, self.namespace,
                                                  label_selector=self.selector, resource_version=revision,
                                                  timeout_seconds=max(1, round(self.poll))):
                    revision = event["object"].metadata.resource_version
                    if event["type"] == "DELETED":
                        self.seen.unschedulable.pop(event["object"].metadata.name, None)
                    else:
                        self.observe(event["object"])
                    if self.stop.is_set():
                        return
            except ApiException as exc:
                revision = None  # 410 Gone: re-list
                if exc.status != 410:
                    self.stop.wait(self.poll)
            except (HTTPError, OSError):
                self.stop.wait(self.poll)

    def observe(self, pod) -> None:
        name, seen = pod.metadata.name, self.seen
        unschedulable = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"
                              and c.status == "False" and c.reason == "Unschedulable"), None)
        if unschedulable is None:
            seen.unschedulable.pop(name, None)
        elif name not in seen.unschedulable:
            seen.unschedulable[name] = (time.monotonic(), unschedulable.message or "")
        for status in pod.status.container_statuses or []:
            waiting = status.state.waiting if status.state else None
            if waiting and waiting.reason in FATAL_WAITING and seen.fatal is None:
                seen.fatal = (f"pod {name}: {waiting.reason}: {waiting.message}", name, None)
            for state in (status.state, status.last_state):
                terminated = state.terminated if state else None
                if terminated and terminated.reason == "OOMKilled" and seen.fatal is None:
                    seen.fatal = (f"pod {name} was OOMKilled (exit code {terminated.exit_code}): raise "
                                  "cluster.memory or lower training.batch_size", name, terminated.exit_code)
            if status.restart_count > seen.container_restarts:
                seen.container_restarts, seen.restarted_pod = status.restart_count, name
                if waiting and waiting.reason == "CrashLoopBackOff":
                    progress(f"kubernetes: pod {name} in CrashLoopBackOff ({status.restart_count} restarts)")


class JobRun:
    """One PyTorchJob from creation (or attachment) to its outcome; see the module docstring."""

    def __init__(self, api, body: dict[str, Any], *, policy: LaunchPolicy, log_path: Path, timeout: int,
                 artifact: Path | None = None):
        """``artifact``: a file the job must have written (on the shared volume) for Succeeded to count."""
        from kubernetes import client

        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.body, self.policy, self.log_path, self.timeout = body, policy, Path(log_path), timeout
        self.artifact = artifact
        self.namespace, self.name = body["metadata"]["namespace"], body["metadata"]["name"]
        self.master = f"{self.name}-master-0"
        self.seen = _Seen()
        self.ended = False
        """The job ended by itself (Failed, or Succeeded without the artifact): it stays for inspection."""

    def run(self) -> dict[str, Any]:
        """Create or attach, follow to Succeeded (with ``artifact`` written) and return the job; raise otherwise,
        deleting the job unless it ended by itself.

        Raises:
            LaunchError: the job failed, or the launcher gave up on it (see the module docstring).
            kubernetes.client.ApiException: the API refused the job (e.g. 422 Invalid, 403 Forbidden).
        """
        stop = threading.Event()
        threads: list[threading.Thread] = []
        succeeded = False
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, exit_on_sigterm) if in_main_thread else None
        try:
            job = self._submit()
            poll = self.policy.poll_seconds
            threads = [_MasterLog(self.core, self.namespace, self.master, self.log_path, stop, poll),
                       _PodWatch(self.core, self.namespace, self.name, job["metadata"]["resourceVersion"], self.seen,
                                 stop, poll)]
            for thread in threads:
                thread.start()
            job = self._follow(job)
            if self.artifact is not None and not self.artifact.is_file():
                self.ended = True
                raise self._error(f"Succeeded, but {self.artifact} is not on the shared volume: check that rank 0 "
                                  "writes it and that every pod mounts the same volume", pod=self.master)
            succeeded = True
        finally:
            stop.set()
            if not succeeded and not self.ended:
                self._delete()  # also when cancelled while creating: the job may exist
            if in_main_thread:
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
            for thread in threads:
                thread.join(timeout=self.policy.poll_seconds + 5)
        return job

    def _submit(self) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            job = self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.body)
            progress(f"kubernetes: created PyTorchJob {self.namespace}/{self.name}")
            return job
        except ApiException as exc:
            if exc.status != 409:
                raise
        job = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        progress(f"kubernetes: PyTorchJob {self.namespace}/{self.name} already exists (a retried launch): "
                 f"attaching to it")
        return job

    def _delete(self) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name,
                                                        body=client.V1DeleteOptions(propagation_policy="Foreground"))
            progress(f"kubernetes: deleted PyTorchJob {self.namespace}/{self.name}")
        except ApiException as exc:
            if exc.status != 404:
                progress(f"kubernetes: could not delete PyTorchJob {self.namespace}/{self.name}: {exc.reason}")

    def _follow(self, job: dict[str, Any]) -> dict[str, Any]:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + self.timeout
        revision = job["metadata"]["resourceVersion"]
        while True:
            if self._judge(job):
                return job
            self._check_pods()
            if time.monotonic() > deadline:
                raise self._error(f"not finished after the launcher's timeout of {self.timeout} s", pod=self.master)
            try:
                for event in watch.Watch().stream(
                        self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                        field_selector=f"metadata.name={self.name}", resource_version=revision,
                        timeout_seconds=max(1, round(self.policy.poll_seconds))):
                    job = event["object"]
                    revision = job["metadata"]["resourceVersion"]
                    if event["type"] == "DELETED":
                        raise self._error("the job was deleted by someone else", pod=self.master)
                    if self._judge(job):
                        return job
                    self._check_pods()
            except ApiException as exc:
                if exc.status != 410:
                    raise
                job = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
                revision = job["metadata"]["resourceVersion"]
                progress(f"kubernetes: watch expired (410 Gone); re-listed at resourceVersion {revision}")

    def _judge(self, job: dict[str, Any]) -> bool:
        """True when Succeeded; raises when Failed or over the restart cap; counts restarts."""
        conditions = {c["type"]: c for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"}
        restarting = "Restarting" in conditions
        if restarting and not self.seen.restarting:
            self.seen.restarts += 1
            progress(f"kubernetes: job restarting ({self.seen.restarts} of at most {self.policy.restart_cap}): "
                     f"{conditions['Restarting'].get('message', '')}")
        self.seen.restarting = restarting
        if "Succeeded" in conditions:
            return True
        if "Failed" in conditions:
            failed = conditions["Failed"]
            self.ended = True
            raise self._error(f"{failed.get('reason')}: {failed.get('message')}", pod=self._failed_pod())
        self._check_restarts()
        return False

    def _check_restarts(self, pod: str | None = None) -> None:
        total = self.seen.restarts + self.seen.container_restarts
        if total > self.policy.restart_cap:
            # the pod watch can lag the job's conditions: let it catch up on the cause (e.g. OOMKilled) first
            deadline = time.monotonic() + 4 * self.policy.poll_seconds
            while not self.seen.fatal and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.seen.fatal:  # the cause the pods showed (e.g. OOMKilled) says more than the count
                self._check_pods()
            exit_code = None
            if pod is None and self.seen.container_restarts:
                pod = self.seen.restarted_pod
            elif pod is None:
                pod, exit_code = self._last_exit() or (self._failed_pod(), None)
            raise self._error(f"restarted {total} times, over the launcher's cap of {self.policy.restart_cap} "
                              "(the operator retries exit codes >= 128 without a limit)", pod=pod,
                              exit_code=exit_code)

    def _last_exit(self) -> tuple[str, int] | None:
        """Pod and exit code of the operator's latest ``ExitedWithCode`` event: a pod restarted under
        ``restartPolicy: ExitCode`` is deleted and recreated, so its own status is gone."""
        events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={self.name}")
        exits = [re.fullmatch(r"Pod: [^.]+\.(\S+) exited with code (\d+)", e.message or "") for e in events.items
                 if e.reason == "ExitedWithCode"]
        exits = [m for m in exits if m]
        return (exits[-1].group(1), int(exits[-1].group(2))) if exits else None

    def _failed_pod(self) -> str:
        """The pod that failed last (else the master)."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{JOB_NAME_LABEL}={self.name}").items
        failed = [(s.state.terminated.finished_at or "", p.metadata.name) for p in pods
                  for s in (p.status.container_statuses or []) if s.state and s.state.terminated
                  and s.state.terminated.exit_code]
        return max(failed)[1] if failed else self.master

    def _check_pods(self) -> None:
        """Raise for what the pod watch saw that waiting will not fix (see the module docstring)."""
        seen = self.seen
        if seen.fatal:
            cause, pod, exit_code = seen.fatal
            reason = "Failed" if "OOMKilled" not in cause else ""
            raise self._error(cause + (self._events(pod, reason) if reason else ""), pod=pod, exit_code=exit_code)
        for pod, (since, message) in list(seen.unschedulable.items()):
            if time.monotonic() - since > self.policy.unschedulable_timeout_seconds:
                raise self._error(f"pod {pod} Unschedulable for over {self.policy.unschedulable_timeout_seconds} s: "
                                  f"{message}{self._events(pod, 'FailedScheduling')}", pod=pod)
        if seen.container_restarts:
            self._check_restarts(pod=seen.restarted_pod)

    def _events(self, pod: str, reason: str) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={pod}")
        except ApiException:
            return ""
        messages = [e.message for e in events.items if e.reason == reason]
        return f" (event {reason}: {messages[-1]})" if messages else ""

    def _error(self, cause: str, *, pod: str, exit_code: int | None = None) -> LaunchError:
        """One LaunchError: the job, the cause, the exit code, and the last log lines of ``pod`` and the master."""
        from kubernetes.client.exceptions import ApiException

        # the node from the pod's name, which the operator makes <job>-<master|worker>-<index>: a pod being
        # recreated under restartPolicy ExitCode may already be gone
        named = re.fullmatch(rf"{re.escape(self.name)}-(master|worker)-(\d+)", pod)
        node, code = (int(named[2]) + (named[1] == "worker") if named else 0), exit_code
        try:
            found = self.core.read_namespaced_pod(pod, self.namespace)
            for status in found.status.container_statuses or []:
                for state in (status.state, status.last_state):
                    if code is None and state and state.terminated:
                        code = state.terminated.exit_code
        except ApiException:
            pass
        logs = "".join(f"\nlast log lines of {name}:\n{self._log_tail(name)}"
                       for name in dict.fromkeys((pod, self.master)))
        return LaunchError(node=node, rank=None, exit_code=1 if code is None else code, log=self.log_path,
                           error=f"PyTorchJob {self.namespace}/{self.name}: {cause}{logs}")

    def _log_tail(self, pod: str) -> str:
        """The pod's last output before torchrun's own failure report (which follows a failed worker's error),
        plus the report's first line; indented."""
        from kubernetes.client.exceptions import ApiException

        try:
            text = self.core.read_namespaced_pod_log(pod, self.namespace, container="pytorch")
        except ApiException:
            text = self.log_path.read_text(errors="replace") if pod == self.master and self.log_path.is_file() else ""
        lines = [line for line in text.splitlines() if line.strip()]
        report = next((i for i, line in enumerate(lines) if _TORCHRUN_FAILURE.search(line)), None)
        if report is not None:
            lines = lines[:report + 1]
        tail = lines[-self.policy.log_tail_lines:]
        return "\n".join(f"  {line}" for line in tail) or "  (no log: the container never started, or the pod is gone)"


# ------------------------------------------------------------------------------------------------ training

def preflight(config: TrainingConfig, cluster: ClusterConfig, policy: LaunchPolicy, *, pipeline_run_id: str,
              log_dir: Path, api=None) -> None:
    """Run the collective benchmark (``python -m training.collectives --preflight``) as a job of the training
    job's shape, and fail when its all_reduce bus bandwidth is below ``policy.preflight_min_busbw_gbps``.

    Raises:
        LaunchError: the bandwidth is below the floor (the benchmark's message is in the log lines), or the
            preflight job failed otherwise.
    """
    from training.launch.jobspec import JobSpec

    spec = JobSpec(name=job_name_for(f"{pipeline_run_id}/preflight"), nnodes=config.nnodes,
                   nproc_per_node=config.nproc_per_node, module="training.collectives",
                   args=["--preflight", "--min-busbw-gbps", f"{policy.preflight_min_busbw_gbps:g}"],
                   env={"OMP_NUM_THREADS": str(config.threads_per_rank)},
                   rdzv_timeout_seconds=config.rdzv_timeout_seconds)
    progress(f"kubernetes: preflight {spec.name}: all_reduce busbw floor {policy.preflight_min_busbw_gbps:g} GB/s")
    JobRun(api or api_client(policy.kubeconfig), render_pytorchjob(spec, cluster), policy=policy,
           log_path=Path(log_dir) / "preflight-master.log", timeout=policy.preflight_timeout_seconds).run()
    progress("kubernetes: preflight passed")


def _stage(source: str | Path, target: Path) -> None:
    """Copy an input of the job into its folder on the shared volume, from a local path or object storage
    (streamed under the data read limit; ``target`` appears whole or not at all).

    Raises:
        DataFileError: the object is missing, too large or unreadable (the URI without credentials says which).
    """
    if not storage.is_remote(source):
        atomic_copy(source, target)
        return
    with tempfile.TemporaryDirectory(prefix=".stage-", dir=target.parent) as tmp:
        try:
            storage.download(str(source), Path(tmp) / target.name, max_bytes=DEFAULT_LIMITS.max_bytes)
        except storage.StorageError as exc:
            raise DataFileError(exc.uri, exc.problem) from exc
        os.replace(Path(tmp) / target.name, target)


def train_kubernetes(data: str | Path, schema: str | Path, *, model_dir: str | Path, config: TrainingConfig,
                     cluster: ClusterConfig, policy: LaunchPolicy, pipeline_run_id: str, log_dir: str | Path,
                     mlflow_run_id: str | None = None) -> TrainResult:
    """Train with ``training.train`` as a PyTorchJob named after ``pipeline_run_id``; see the module docstring.

    Stages the data, schema, config and a model module given as a file in the job's folder on the shared volume (this process must see it at
    ``cluster.shared_mount_path``), runs the preflight when asked, follows the job, and copies the model to
    ``model_dir``. The ranks log into ``mlflow_run_id`` on the tracking server of ``cluster.credentials_secret``
    (a ``secretKeyRef``, never a copied value).

    Raises:
        LaunchError: the job (or the preflight) failed, or the launcher gave up on it and deleted it.
        ValueError: the cluster has no shared volume, or config and cluster do not fit together.
    """
    started = time.monotonic()
    name = job_name_for(pipeline_run_id)
    root = Path(job_dir(name, cluster))
    data_file = "data" + (Path(data).suffix or ".parquet")
    body = job_manifest(config, cluster, run_id=pipeline_run_id, data_file=data_file)
    root.mkdir(parents=True, exist_ok=True)
    for source, target in ((data, data_file), (schema, "schema.yaml")):
        _stage(source, root / target)
    if config.model.is_file:  # a dotted module comes with the image (FROM the kfloop image, plus the team's code)
        _stage(config.model.module, root / MODULE_FILE)
        config = replace(config, model=replace(config.model, module=str(root / MODULE_FILE)))
    atomic_write_json(root / "config.json", config.to_dict())
    if mlflow_run_id:
        atomic_write_text(root / MLFLOW_RUN_ID_FILE, mlflow_run_id)
    api = api_client(policy.kubeconfig)
    log_dir = Path(log_dir)
    if policy.preflight_min_busbw_gbps:
        preflight(config, cluster, policy, pipeline_run_id=pipeline_run_id, log_dir=log_dir, api=api)
    model = root / "model"
    JobRun(api, body, policy=policy, log_path=log_dir / "master.log", timeout=policy.timeout_seconds,
           artifact=model / MODEL_FILE).run()
    shutil.copytree(model, model_dir, dirs_exist_ok=True)
    description = json.loads((Path(model_dir) / MODEL_FILE).read_text())
    progress(f"kubernetes: model copied from {model} to {model_dir}")
    return TrainResult(model_dir=Path(model_dir), metrics=description["metrics"],
                       world_size=description["world_size"], seconds=time.monotonic() - started)
