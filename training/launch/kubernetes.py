"""The Kubernetes rendering of a training launch: a Kubeflow PyTorchJob (Training Operator v1.9), TrainJob
(Trainer v2.3) or KubeRay RayJob (v1.7), as ``cluster.kind`` says, created and followed with the `kubernetes` client
(a kubeconfig, or the in-cluster service account). :data:`JOB_KINDS` holds what differs between them; the guarantees
below hold for all three. A RayJob reports ``jobDeploymentStatus``/``jobStatus`` instead of conditions: Complete with
the Ray job SUCCEEDED is its success, Failed or ValidationFailed (or Complete with the Ray job STOPPED) its failure
with KubeRay's ``reason`` and ``message``, Retrying one restart, Suspended a wait for Kueue; its log is the
submitter's (``ray job logs --follow`` of the entrypoint).

The job is named after the pipeline run (:func:`training.launch.manifests.job_name_for`), so a retried launch step that
finds it already there (409 AlreadyExists) attaches to it instead of starting a second one. Inputs and the model
go through the shared volume (:func:`training.launch.manifests.job_dir`), mounted at the same path in the launch step and
in the job's pods. The launcher follows the job's conditions with a watch resumed from the last resourceVersion
(re-listing after 410 Gone), copies the master's log into the step's log, and ends with exactly one outcome:

* Succeeded (a TrainJob: Complete; a RayJob: Complete with jobStatus SUCCEEDED), and the model is on the shared volume: it is copied to the step's model dir;
* anything else raises one :class:`~training.launch.local.LaunchError` naming the pod, the cause and its last log
  lines: the job Failed; a pod stayed Unschedulable past ``unschedulable_timeout_seconds``; an image cannot be
  pulled or a container cannot be configured; the API refused a pod the operator creates (its FailedCreatePod
  event, e.g. a Pod Security violation, with the fix); a container was OOMKilled; the job restarted more than
  ``restart_cap`` times (the v1 operator retries exit codes >= 128 without applying backoffLimit); or the
  launcher's ``timeout_seconds`` passed. A suspended TrainJob (Kueue has not admitted it yet) waits within that
  timeout.

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
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from data import storage
from data.fileio import atomic_copy, atomic_write_json, atomic_write_text
from data.settings import own_image, own_job_namespace, own_torch_build, section_from_dict, section_mapping
from data.tables import DEFAULT_LIMITS, DataFileError
from training.config import JobShape, TrainingConfig
from training.launch.cluster import CUDA_TAG_SUFFIX, TORCH_BUILD_LABEL, ClusterConfig, cuda_image
from training.launch.jobspec import JobSpec
from training.launch.kube_client import FOLLOW_TIMEOUT, REQUEST_TIMEOUT, api_client, own_namespace, watch_timeout
from training.launch.local import LaunchError, TrainResult, exit_on_sigterm
from training.launch.manifests import (MLFLOW_RUN_ID_FILE, RAY_JOB_LABEL, RAY_SUBMITTER, job_dir, job_manifest,
                                       job_name_for, render)
from training.model_files import MODEL_FILE, MODULE_FILE
from training.progress import progress



@dataclass(frozen=True, slots=True)
class JobKind:
    """What the launcher needs to know about one kind of Kubeflow job and the pods its operator makes."""

    kind: str
    group: str
    version: str
    plural: str
    job_label: str
    """Pod label holding the job's name."""
    master_labels: str
    """Further labels (``k=v,...``) of the node-0 pod, whose log is the job's log."""
    container: str
    """The training container of every pod."""
    succeeded: str
    """The job's condition type of success (empty: the job reports a RayJob's status fields, not conditions)."""
    pod_name: str
    """Regular expression of a pod's name after ``<job>-``; group ``index`` is its node rank, group ``worker`` (if
    any) set when that index counts from 1."""
    master: str
    """Name of the node-0 pod before the operator made one (``{job}`` stands for the job's name)."""
    replaces_failed_pods: bool
    """Whether the operator replaces a failed pod without any job condition saying so (each one a restart)."""
    retries: str
    """Why the launcher caps restarts itself."""
    pod_creator: str
    """Name of the object whose controller creates the pods (``{job}``: the job's name): its events say when the
    API refused a pod."""
    failed_create: str
    """Reason of that controller's event for a pod the API refused."""

    def selector(self, job: str, master: bool = False) -> str:
        """Label selector of the job's pods (only node 0's with ``master``)."""
        return f"{self.job_label}={job}" + (f",{self.master_labels}" if master else "")


JOB_KINDS = {
    "PyTorchJob": JobKind(
        kind="PyTorchJob", group="kubeflow.org", version="v1", plural="pytorchjobs",
        job_label="training.kubeflow.org/job-name", master_labels="training.kubeflow.org/replica-type=master",
        container="pytorch", succeeded="Succeeded", pod_name=r"(?:master|(?P<worker>worker))-(?P<index>\d+)",
        master="{job}-master-0", replaces_failed_pods=False,
        retries="the operator retries exit codes >= 128 without a limit",
        pod_creator="{job}", failed_create="FailedCreatePod"),
    "TrainJob": JobKind(
        kind="TrainJob", group="trainer.kubeflow.org", version="v1alpha1", plural="trainjobs",
        job_label="jobset.sigs.k8s.io/jobset-name", master_labels="batch.kubernetes.io/job-completion-index=0",
        container="node", succeeded="Complete", pod_name=r"node-0-(?P<index>\d+)-[a-z0-9]+",
        master="{job}-node-0-0", replaces_failed_pods=True,
        retries="the runtime's Job restarts failed pods up to its backoffLimit, 6 by default",
        pod_creator="{job}-node-0", failed_create="FailedCreate"),
    "RayJob": JobKind(
        kind="RayJob", group="ray.io", version="v1", plural="rayjobs",
        job_label=RAY_JOB_LABEL, master_labels="ray.io/originated-from-crd=RayJob",
        container=RAY_SUBMITTER, succeeded="", pod_name=r"(?P<index>)[a-z0-9]{5}",
        master="{job}", replaces_failed_pods=True,
        retries="KubeRay's submitter Job retries `ray job submit` up to twice, and the RayJob's backoffLimit "
                "retries the whole job on a new Ray cluster",
        pod_creator="{job}", failed_create="FailedCreate"),
}
"""A job body's ``kind`` -> its :class:`JobKind` (labels from Training Operator v1.9 and from JobSet v0.12 / the Job
controller, which run a TrainJob's pods ``<job>-node-0-<index>-<suffix>``). A RayJob's log is its submitter's
(``ray job submit`` then ``ray job logs --follow``: the entrypoint's output), the pod of the Kubernetes Job KubeRay
names after the RayJob (KubeRay v1.7.0 rayjob_controller.go ``createNewK8sJob``, labels from ``getSubmitterTemplate``);
the Ray cluster's pods carry :data:`~training.launch.manifests.RAY_JOB_LABEL` from their templates."""
RAY_ACTIVE = ("", "Initializing", "Running", "Waiting", "Retrying", "Suspending", "Suspended")
"""A RayJob's ``jobDeploymentStatus`` values on the way to ``Complete``, ``Failed`` or ``ValidationFailed`` (KubeRay
v1.7.0 apis/ray/v1/rayjob_types.go; rayjob_controller.go moves Running to Complete when the Ray job is terminal and
the submitter has finished, to Failed when the Ray job FAILED (reason AppFailed), and a Failed job with retries
left under ``backoffLimit`` to Retrying, then New on a new Ray cluster)."""
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
                raise ValueError(f"cluster.launcher.{name}={value!r}: use an integer >= 1")
        if not isinstance(self.restart_cap, int) or isinstance(self.restart_cap, bool) or self.restart_cap < 0:
            raise ValueError(f"cluster.launcher.restart_cap={self.restart_cap!r}: use an integer >= 0 (0: no restarts)")
        if not self.poll_seconds > 0:
            raise ValueError(f"cluster.launcher.poll_seconds={self.poll_seconds!r}: use a positive number such as 2")
        if not self.preflight_min_busbw_gbps >= 0:
            raise ValueError(f"cluster.launcher.preflight_min_busbw_gbps={self.preflight_min_busbw_gbps!r}: use a bandwidth "
                             "in GB/s, or 0 to skip the preflight")
        if self.kubeconfig and not Path(self.kubeconfig).is_file():
            raise ValueError(f"cluster.launcher.kubeconfig={self.kubeconfig!r}: file not found; give a kubeconfig path or "
                             "leave it empty for $KUBECONFIG / in-cluster")


@dataclass(kw_only=True, slots=True)
class KubernetesSettings:
    """kfloop.yaml's ``cluster:`` section (the pipeline's ``cluster_config``): the job's :class:`ClusterConfig`
    fields, and the :class:`LaunchPolicy` under the ``launcher`` key. Unless ``cluster.image`` names one, the job
    runs the image of the process that launches it (``KFLOOP_IMAGE``: a compiled step's own image), or that image's
    CUDA build (:func:`~training.launch.cluster.cuda_image`) when the job asks for NVIDIA GPUs; the pods also get
    that step's image pull secrets (``KFLOOP_IMAGE_PULL_SECRETS``) besides ``cluster.image_pull_secrets``."""

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
        settings = dict(section_mapping(d, "cluster", [*(f.name for f in fields(ClusterConfig)), "launcher"]))
        launcher = dict(settings.pop("launcher", None) or {})
        image, secrets = own_image()  # the launching step's: the job runs the commit's image the step runs
        own = bool(image) and "image" not in settings
        if own:
            settings["image"] = image
        if own_job_namespace() and not settings.get("namespace"):  # kfloop compile --namespace
            settings["namespace"] = own_job_namespace()
        if secrets:
            settings["image_pull_secrets"] = list(dict.fromkeys([*settings.get("image_pull_secrets", []), *secrets]))
        cluster = ClusterConfig.from_dict(settings)
        if own and cluster.uses_gpus and cluster.gpu_vendor == "nvidia":  # the commit's CUDA build, beside its own
            cluster = replace(cluster, image=cuda_image(image))
        return cls(cluster=cluster, launcher=section_from_dict(LaunchPolicy, launcher, "cluster.launcher"))


# ------------------------------------------------------------------------------------------------ one job

class _MasterLog(threading.Thread):
    """Copies the master pod's log (node 0, every container start of it) to a file and to stderr with a
    ``[master]`` prefix; follows the pod across restarts and recreations by uid. A follow ends when the container
    does."""

    def __init__(self, core, namespace: str, job: str, kind: JobKind, path: Path, stop: threading.Event,
                 poll: float):
        super().__init__(name=f"log-{job}", daemon=True)
        self.core, self.namespace, self.path, self.stop, self.poll = core, namespace, path, stop, poll
        self.kind, self.selector = kind, kind.selector(job, master=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"")

    def run(self) -> None:
        followed: set[str] = set()
        while True:
            last = self.stop.is_set()  # one more pass once stopped: a pod that ended before it was followed
            try:
                pod = _newest(self.core.list_namespaced_pod(self.namespace, label_selector=self.selector,
                                                             _request_timeout=REQUEST_TIMEOUT).items)
                if pod is not None and pod.metadata.uid not in followed and pod.status.phase != "Pending":
                    stream = self.core.read_namespaced_pod_log(pod.metadata.name, self.namespace,
                                                               container=self.kind.container, follow=not last,
                                                               _preload_content=False,
                                                               _request_timeout=FOLLOW_TIMEOUT)
                    followed.add(pod.metadata.uid)
                    with self.path.open("ab") as out:
                        for line in stream:
                            out.write(line)
                            out.flush()
                            sys.stderr.write("[master] " + line.decode(errors="replace"))
                    stream.release_conn()
                    continue
            except (ApiException, HTTPError, OSError):
                pass
            if last:
                return
            self.stop.wait(self.poll)


def _newest(pods: list) -> Any:
    """The most recently created pod of ``pods`` (None when there is none)."""
    def created(pod) -> tuple[float, str]:
        stamp = pod.metadata.creation_timestamp
        return (stamp.timestamp() if stamp else 0.0), pod.metadata.name

    return max(pods, key=created, default=None)


@dataclass(kw_only=True, slots=True)
class _Seen:
    """What the launcher has seen of one job and its pods (the pod watch thread writes, the main thread reads)."""

    restarts: int = 0
    """Restarting transitions of the job."""
    restarting: bool = False
    """Whether the job's Restarting condition was True in the last state seen."""
    failed_pods: set[str] = field(default_factory=set)
    """Pods seen Failed, by uid: a TrainJob's Job replaces them (its restarts; no job condition says so)."""
    suspended: bool = False
    """Whether the job's Suspended condition was True in the last state seen."""
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

    def __init__(self, core, namespace: str, selector: str, revision: str, seen: _Seen, stop: threading.Event,
                 poll: float):
        super().__init__(name=f"pods-{selector}", daemon=True)
        self.core, self.namespace, self.seen, self.stop, self.poll = core, namespace, seen, stop, poll
        self.selector, self.revision = selector, revision

    def run(self) -> None:
        revision = self.revision
        while not self.stop.is_set():
            try:
                if revision is None:
                    pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector,
                                                         _request_timeout=REQUEST_TIMEOUT)
                    for pod in pods.items:
                        self.observe(pod)
                    revision = pods.metadata.resource_version
                for event in watch.Watch().stream(self.core.list_namespaced_pod, self.namespace,
                                                  label_selector=self.selector, resource_version=revision,
                                                  timeout_seconds=max(1, round(self.poll)),
                                                  _request_timeout=watch_timeout(max(1, round(self.poll)))):
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
        if pod.status.phase == "Failed":
            seen.failed_pods.add(pod.metadata.uid)
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
    """One PyTorchJob or TrainJob from creation (or attachment) to its outcome; see the module docstring."""

    def __init__(self, api, body: dict[str, Any], *, policy: LaunchPolicy, log_path: Path, timeout: int,
                 artifact: Path | None = None):
        """``artifact``: a file the job must have written (on the shared volume) for Succeeded to count."""
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        body = in_namespace(body, policy.kubeconfig)
        self.body, self.policy, self.log_path, self.timeout = body, policy, Path(log_path), timeout
        self.artifact = artifact
        self.namespace, self.name = body["metadata"]["namespace"], body["metadata"]["name"]
        self.kind = JOB_KINDS[body["kind"]]
        self.api_path = (self.kind.group, self.kind.version, self.namespace, self.kind.plural)
        self.title = f"{self.kind.kind} {self.namespace}/{self.name}"
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
            threads = [_MasterLog(self.core, self.namespace, self.name, self.kind, self.log_path, stop, poll),
                       _PodWatch(self.core, self.namespace, self.kind.selector(self.name),
                                 job["metadata"]["resourceVersion"], self.seen, stop, poll)]
            for thread in threads:
                thread.start()
            job = self._follow(job)
            if self.artifact is not None and not self.artifact.is_file():
                self.ended = True
                raise self._error(f"Succeeded, but {self.artifact} is not on the shared volume: check that rank 0 "
                                  "writes it and that every pod mounts the same volume", pod=self.master())
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
        try:
            job = self.custom.create_namespaced_custom_object(*self.api_path, self.body,
                                                              _request_timeout=REQUEST_TIMEOUT)
            progress(f"kubernetes: created {self.title}")
            return job
        except ApiException as exc:
            if exc.status != 409:
                raise
        job = self._get_job()
        progress(f"kubernetes: {self.title} already exists (a retried launch): attaching to it")
        return job

    def _get_job(self) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(*self.api_path, self.name, _request_timeout=REQUEST_TIMEOUT)

    def _delete(self) -> None:
        try:
            self.custom.delete_namespaced_custom_object(*self.api_path, self.name,
                                                        body=client.V1DeleteOptions(propagation_policy="Foreground"),
                                                        _request_timeout=REQUEST_TIMEOUT)
            progress(f"kubernetes: deleted {self.title}")
        except ApiException as exc:
            if exc.status != 404:
                progress(f"kubernetes: could not delete {self.title}: {exc.reason}")

    def _follow(self, job: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        revision = job["metadata"]["resourceVersion"]
        while True:
            if self._judge(job):
                return job
            self._check_pods()
            self._check_pod_creation()
            if time.monotonic() > deadline:
                raise self._error(f"not finished after the launcher's timeout of {self.timeout} s", pod=self.master())
            try:
                for event in watch.Watch().stream(
                        self.custom.list_namespaced_custom_object, *self.api_path,
                        field_selector=f"metadata.name={self.name}", resource_version=revision,
                        timeout_seconds=max(1, round(self.policy.poll_seconds)),
                        _request_timeout=watch_timeout(max(1, round(self.policy.poll_seconds)))):
                    job = event["object"]
                    revision = job["metadata"]["resourceVersion"]
                    if event["type"] == "DELETED":
                        raise self._error("the job was deleted by someone else", pod=self.master())
                    if self._judge(job):
                        return job
                    self._check_pods()
            except ApiException as exc:
                if exc.status != 410:
                    raise
                job = self._get_job()
                revision = job["metadata"]["resourceVersion"]
                progress(f"kubernetes: watch expired (410 Gone); re-listed at resourceVersion {revision}")

    def _judge(self, job: dict[str, Any]) -> bool:
        """True when Succeeded (Complete); raises when Failed or over the restart cap; counts restarts."""
        if not self.kind.succeeded:
            return self._judge_rayjob(job.get("status", {}))
        conditions = {c["type"]: c for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"}
        suspended = "Suspended" in conditions
        if suspended and not self.seen.suspended:
            progress(f"kubernetes: {self.title} is suspended until Kueue admits it (or spec.suspend is cleared): "
                     f"{conditions['Suspended'].get('message', '')}")
        self.seen.suspended = suspended
        restarting = "Restarting" in conditions
        if restarting and not self.seen.restarting:
            self.seen.restarts += 1
            progress(f"kubernetes: job restarting ({self.seen.restarts} of at most {self.policy.restart_cap}): "
                     f"{conditions['Restarting'].get('message', '')}")
        self.seen.restarting = restarting
        if self.kind.succeeded in conditions:
            return True
        if "Failed" in conditions:
            failed = conditions["Failed"]
            self.ended = True
            raise self._error(f"{failed.get('reason')}: {failed.get('message')}", pod=self._failed_pod())
        self._check_restarts()
        return False

    def _judge_rayjob(self, status: dict[str, Any]) -> bool:
        """A RayJob's ``_judge``: ``jobDeploymentStatus`` says where the job is and ``jobStatus`` what its Ray job
        did (see :data:`RAY_ACTIVE`); Complete with the Ray job SUCCEEDED is success, Complete with it STOPPED is
        not. ``reason`` and ``message`` go into the error."""
        deployment, app = status.get("jobDeploymentStatus", ""), status.get("jobStatus", "")
        why = ": ".join(part for part in (status.get("reason", ""), status.get("message", "")) if part)
        suspended = deployment in ("Suspending", "Suspended")
        if suspended and not self.seen.suspended:
            progress(f"kubernetes: {self.title} is {deployment.lower()} until Kueue admits it (or spec.suspend is "
                     "cleared)")
        self.seen.suspended = suspended
        retrying = deployment == "Retrying"
        if retrying and not self.seen.restarting:
            self.seen.restarts += 1
            progress(f"kubernetes: RayJob retrying on a new Ray cluster ({self.seen.restarts} of at most "
                     f"{self.policy.restart_cap}): {why}")
        self.seen.restarting = retrying
        if deployment == "Complete" and app == "SUCCEEDED":
            return True
        if deployment not in RAY_ACTIVE:
            self.ended = True
            raise self._error(f"{deployment} (Ray job {app or 'never submitted'})" + (f": {why}" if why else ""),
                              pod=self.master())
        self._check_restarts()
        return False

    def _check_restarts(self, pod: str | None = None) -> None:
        total = self.seen.restarts + self.seen.container_restarts
        if self.kind.replaces_failed_pods:
            total += len(self.seen.failed_pods)
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
                              f"({self.kind.retries})", pod=pod,
                              exit_code=exit_code)

    def _last_exit(self) -> tuple[str, int] | None:
        """Pod and exit code of the operator's latest ``ExitedWithCode`` event: a pod restarted under
        ``restartPolicy: ExitCode`` is deleted and recreated, so its own status is gone."""
        events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={self.name}",
                                              _request_timeout=REQUEST_TIMEOUT)
        exits = [re.fullmatch(r"Pod: [^.]+\.(\S+) exited with code (\d+)", e.message or "") for e in events.items
                 if e.reason == "ExitedWithCode"]
        exits = [m for m in exits if m]
        return (exits[-1].group(1), int(exits[-1].group(2))) if exits else None

    def master(self) -> str:
        """The name of the job's node-0 pod (the newest one, or the name it would have when there is none yet)."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.kind.selector(self.name, True),
                                           _request_timeout=REQUEST_TIMEOUT).items
        newest = _newest(pods)
        return self.kind.master.format(job=self.name) if newest is None else newest.metadata.name

    def _failed_pod(self) -> str:
        """The pod that failed last (else the master)."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.kind.selector(self.name),
                                           _request_timeout=REQUEST_TIMEOUT).items
        failed = [(s.state.terminated.finished_at or "", p.metadata.name) for p in pods
                  for s in (p.status.container_statuses or []) if s.state and s.state.terminated
                  and s.state.terminated.exit_code]
        return max(failed)[1] if failed else self.master()

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

    def _check_pod_creation(self) -> None:
        """Raise when the API refused a pod the operator tried to create (the creating controller's event: the
        PyTorchJob's ``FailedCreatePod``, the TrainJob's Job's ``FailedCreate``): the controller retries forever
        and the job stays unstarted, so waiting cannot help."""
        creator = self.kind.pod_creator.format(job=self.name)
        events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={creator}",
                                              _request_timeout=REQUEST_TIMEOUT)
        refused = [e.message or "" for e in events.items if e.reason == self.kind.failed_create]
        if refused:
            raise self._error(f"the operator cannot create its pods: {refused[-1]}{_admission_hint(refused[-1])}",
                              pod=self.master())

    def _events(self, pod: str, reason: str) -> str:
        try:
            events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={pod}",
                                                  _request_timeout=REQUEST_TIMEOUT)
        except ApiException:
            return ""
        messages = [e.message for e in events.items if e.reason == reason]
        return f" (event {reason}: {messages[-1]})" if messages else ""

    def _error(self, cause: str, *, pod: str, exit_code: int | None = None) -> LaunchError:
        """One LaunchError: the job, the cause, the exit code, and the last log lines of ``pod`` and the master."""
        # the node from the pod's name (<job>-<master|worker>-<index>, <job>-node-0-<index>-<suffix>): a pod
        # being recreated under restartPolicy ExitCode may already be gone
        named = re.fullmatch(rf"{re.escape(self.name)}-{self.kind.pod_name}", pod)
        node = int(named["index"] or 0) + bool(named.groupdict().get("worker")) if named else 0
        code = exit_code
        try:
            found = self.core.read_namespaced_pod(pod, self.namespace, _request_timeout=REQUEST_TIMEOUT)
            for status in found.status.container_statuses or []:
                for state in (status.state, status.last_state):
                    if code is None and state and state.terminated:
                        code = state.terminated.exit_code
        except ApiException:
            pass
        master = self.master()
        logs = "".join(f"\nlast log lines of {name}:\n{self._log_tail(name, master)}"
                       for name in dict.fromkeys((pod, master)))
        return LaunchError(node=node, rank=None, exit_code=1 if code is None else code, log=self.log_path,
                           error=f"{self.title}: {cause}{logs}")

    def _log_tail(self, pod: str, master: str) -> str:
        """The pod's last output before torchrun's own failure report (which follows a failed worker's error),
        plus the report's first line; indented."""
        try:
            text = self.core.read_namespaced_pod_log(pod, self.namespace, container=self.kind.container,
                                                   _request_timeout=REQUEST_TIMEOUT)
        except ApiException:
            text = self.log_path.read_text(errors="replace") if pod == master and self.log_path.is_file() else ""
        lines = [line for line in text.splitlines() if line.strip()]
        report = next((i for i, line in enumerate(lines) if _TORCHRUN_FAILURE.search(line)), None)
        if report is not None:
            lines = lines[:report + 1]
        tail = lines[-self.policy.log_tail_lines:]
        return "\n".join(f"  {line}" for line in tail) or "  (no log: the container never started, or the pod is gone)"


def _admission_hint(message: str) -> str:
    """The fix for a Pod Security refusal the operator or kfloop's own settings cause."""
    hints = []
    if "violates PodSecurity" in message and '"init-pytorch"' in message:
        hints.append("the Training Operator v1 adds its init container init-pytorch, which sets no securityContext, "
                     "to every Worker pod: run the operator with --pytorch-init-container-template-file and "
                     "deploy/operator-restricted-init.yaml's template, or enforce "
                     "pod-security.kubernetes.io/enforce=baseline in this namespace, or train on one node")
    if "violates PodSecurity" in message and '"IPC_LOCK"' in message:
        hints.append("cluster.rdma_resource adds the IPC_LOCK capability RDMA needs, which the baseline and "
                     "restricted profiles forbid: run the job in a namespace labelled "
                     "pod-security.kubernetes.io/enforce=privileged (or exempted from Pod Security), or drop "
                     "cluster.rdma_resource (NCCL then uses TCP sockets)")
    return "".join(f"\n  fix: {hint}" for hint in hints)


# ------------------------------------------------------------------------------------------------ training

def in_namespace(body: dict[str, Any], kubeconfig: str) -> dict[str, Any]:
    """The job ``body`` in its namespace: ``cluster.namespace`` as rendered, else this pod's own (or the
    kubeconfig's, :func:`~training.launch.kube_client.own_namespace`).

    Raises:
        kubernetes.config.ConfigException: the namespace is empty and the kubeconfig cannot be read.
    """
    if body["metadata"].get("namespace"):
        return body
    return {**body, "metadata": {**body["metadata"], "namespace": own_namespace(kubeconfig)}}


def check_image_build(cluster: ClusterConfig) -> None:
    """Refuse a job that asks for GPUs on an image whose torch build is known to be CPU: the launching step's own
    image (its ``KFLOOP_TORCH_BUILD``, baked with the label ``io.kfloop.torch-build``) when the job runs it. A tag
    ending in ``-cuda`` counts as a CUDA build; any other image's build is not known here (no registry is read) and
    goes unchecked.

    Raises:
        ValueError: GPUs on a CPU build (the image and both builds named, with the fix).
    """
    if not cluster.uses_gpus or cluster.image.endswith(CUDA_TAG_SUFFIX) or cluster.image != own_image()[0]:
        return
    build = own_torch_build()
    if build == "cpu":
        raise ValueError(f"cluster.image {cluster.image} is torch's CPU build ({TORCH_BUILD_LABEL}=cpu) but the job "
                         f"asks for GPUs ({cluster.accelerator[0] if cluster.accelerator else 'MIG/shared GPUs'}): "
                         "torchrun would train on the CPU while holding them, and Ray Train's nccl backend fails; run "
                         f"its CUDA build {cuda_image(cluster.image)} ({TORCH_BUILD_LABEL}=cuda, deploy/Dockerfile "
                         "VARIANT=cuda; leave cluster.image unset and the launcher picks it)")


def check_shared_claim(api, namespace: str, claim: str, pods: int) -> None:
    """Refuse a job of ``pods`` pods (more than one) on the shared ``claim`` when the claim, read through the API,
    is not ``ReadWriteMany`` (its bound access modes, else those it asks for): the pods land on several nodes and
    a ReadWriteOnce volume attaches to one (the others fail with Multi-Attach errors). A claim this process may not
    read (403) or cannot find (404) goes unchecked, with a log line saying so.

    Raises:
        ValueError: the claim is visible and not ReadWriteMany (claim, namespace and its modes named).
        kubernetes.client.ApiException: the API failed otherwise.
    """
    if pods < 2:
        return
    try:
        found = client.CoreV1Api(api).read_namespaced_persistent_volume_claim(claim, namespace)
    except ApiException as exc:
        if exc.status not in (403, 404):
            raise
        progress(f"kubernetes: cannot read persistentvolumeclaim {namespace}/{claim} ({exc.status} {exc.reason}): "
                 f"its access modes are not checked; the job's {pods} pods need it ReadWriteMany")
        return
    modes = (found.status and found.status.access_modes) or found.spec.access_modes or []
    if "ReadWriteMany" not in modes:
        raise ValueError(f"persistentvolumeclaim {namespace}/{claim} has accessModes {modes}, but the job's {pods} "
                         "pods mount it from several nodes, which needs ReadWriteMany (a ReadWriteOnce volume "
                         "attaches to one node: the other pods fail with Multi-Attach errors); set "
                         "cluster.shared_volume_claim to a ReadWriteMany claim (NFS, CephFS, EFS, Filestore, "
                         "Azure Files)")


def preflight(config: TrainingConfig, shape: JobShape, cluster: ClusterConfig, policy: LaunchPolicy, *,
              pipeline_run_id: str, log_dir: Path, api=None) -> None:
    """Run the collective benchmark (``python -m training.collectives --preflight``) as a job of the training
    job's shape, and fail when its all_reduce bus bandwidth is below ``policy.preflight_min_busbw_gbps``.

    Raises:
        LaunchError: the bandwidth is below the floor (the benchmark's message is in the log lines), or the
            preflight job failed otherwise.
    """
    spec = JobSpec(name=job_name_for(f"{pipeline_run_id}/preflight"), nnodes=shape.nnodes,
                   nproc_per_node=shape.nproc_per_node, module="training.collectives",
                   args=["--preflight", "--min-busbw-gbps", f"{policy.preflight_min_busbw_gbps:g}"],
                   env={"OMP_NUM_THREADS": str(config.threads_per_rank)},
                   rdzv_timeout_seconds=shape.rdzv_timeout_seconds)
    progress(f"kubernetes: preflight {spec.name}: all_reduce busbw floor {policy.preflight_min_busbw_gbps:g} GB/s")
    JobRun(api or api_client(policy.kubeconfig), render(spec, cluster), policy=policy,
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
            storage.download(storage.resolve(source), Path(tmp) / target.name, max_bytes=DEFAULT_LIMITS.max_bytes)
        except storage.StorageError as exc:
            raise DataFileError(exc.uri, exc.problem) from None  # the same (redacted) text, no library chain
        os.replace(Path(tmp) / target.name, target)


def train_kubernetes(data: str | Path, schema: str | Path, *, model_dir: str | Path, config: TrainingConfig,
                     shape: JobShape, cluster: ClusterConfig, policy: LaunchPolicy, pipeline_run_id: str,
                     log_dir: str | Path, mlflow_run_id: str | None = None) -> TrainResult:
    """Train with ``training.train`` as the job of ``cluster.kind`` named after ``pipeline_run_id``; see the
    module docstring.

    Stages the data, schema, config and a model module given as a file in the job's folder on the shared volume (this process must see it at
    ``cluster.shared_mount_path``), runs the preflight when asked, follows the job, and copies the model to
    ``model_dir``. The ranks log into ``mlflow_run_id`` on the tracking server of ``cluster.credentials_secret``
    (a ``secretKeyRef``, never a copied value).

    Raises:
        LaunchError: the job (or the preflight) failed, or the launcher gave up on it and deleted it.
        ValueError: the cluster has no shared volume, the job's shape and the cluster do not fit together, the job
            asks for GPUs on a CPU build of torch (:func:`check_image_build`), or the shared claim of a job of
            several pods is not ReadWriteMany (:func:`check_shared_claim`).
    """
    started = time.monotonic()
    name = job_name_for(pipeline_run_id)
    root = Path(job_dir(name, cluster))
    data_file = "data" + (Path(data).suffix or ".parquet")
    body = job_manifest(config, shape, cluster, run_id=pipeline_run_id, data_file=data_file)
    check_image_build(cluster)
    api = api_client(policy.kubeconfig)
    check_shared_claim(api, in_namespace(body, policy.kubeconfig)["metadata"]["namespace"],
                       cluster.shared_volume_claim, shape.nnodes + (cluster.kind == "rayjob"))  # and a Ray head
    root.mkdir(parents=True, exist_ok=True)
    for source, target in ((data, data_file), (schema, "schema.yaml")):
        _stage(source, root / target)
    if config.model.is_file:  # a dotted module comes with the image (FROM the kfloop image, plus the team's code)
        _stage(config.model.module, root / MODULE_FILE)
        config = replace(config, model=replace(config.model, module=str(root / MODULE_FILE)))
    atomic_write_json(root / "config.json", config.to_dict())
    if mlflow_run_id:
        atomic_write_text(root / MLFLOW_RUN_ID_FILE, mlflow_run_id)
    log_dir = Path(log_dir)
    if policy.preflight_min_busbw_gbps:
        preflight(config, shape, cluster, policy, pipeline_run_id=pipeline_run_id, log_dir=log_dir, api=api)
    model = root / "model"
    JobRun(api, body, policy=policy, log_path=log_dir / "master.log", timeout=policy.timeout_seconds,
           artifact=model / MODEL_FILE).run()
    shutil.copytree(model, model_dir, dirs_exist_ok=True)
    description = json.loads((Path(model_dir) / MODEL_FILE).read_text())
    progress(f"kubernetes: model copied from {model} to {model_dir}")
    return TrainResult(model_dir=Path(model_dir), metrics=description["metrics"],
                       world_size=description["world_size"], seconds=time.monotonic() - started)
