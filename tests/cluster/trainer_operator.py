"""Operator mode of the Kubernetes API test server (tests/cluster/k8s_server.py) for TrainJobs: Kubeflow Trainer
v2.3.0 with JobSet v0.12.0 and the Job controller, each pod a local process group run by the kubelet of
tests/cluster/k8s_operator.py.

Everything a pod gets is written here from the upstream source and cited (file, function), never from kfloop's
code: the tables below are what a test checks a TrainJob's pods against.

What it plays, in order:

* The CRD's CEL rules on the name (RFC 1035 label, at most 63 characters; ``trainjob_types.go``), refused with 422.
* Trainer's admission webhooks (``pkg/webhooks/trainjob_webhook.go``): the runtime of ``runtimeRef`` must exist, the
  torch plugin rejects ``trainer.env`` setting a torchrun name, the JobSet plugin checks ``runtimePatches``; a
  rejection is a 403 ``admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: ...``.
* Trainer's controller (``pkg/controller/trainjob_controller.go``): resolves the runtime, applies ``runtimePatches``
  as strategic merge patches, then the torch plugin's env and the JobSet builder's trainer values; a suspended
  TrainJob makes no pods until ``spec.suspend`` is cleared (Kueue's admission); ``activeDeadlineSeconds`` fails it.
* JobSet's webhook (v0.12.0 ``pkg/webhooks/jobset_webhook.go``) on the names the JobSet generates: a refusal is
  the TrainJob's ``TrainJobResourcesCreationFailed`` event, and no pods.
* JobSet and the Job controller: Job ``<trainjob>-node-0`` (Indexed, ``numNodes`` completions, backoffLimit 6, pods
  ``restartPolicy: OnFailure`` by JobSet's default), pods ``<trainjob>-node-0-<index>-<suffix>`` with hostname
  ``<trainjob>-node-0-<index>`` in subdomain ``<trainjob>`` and their labels and annotations; all indexes succeeded
  -> Complete, the Job failed -> Failed, as JobSet's conditions reach the TrainJob.

Deliberate differences from a cluster: pods share the host network, so each TrainJob gets a free host port in place
of 29500 (its ``PET_MASTER_PORT`` says which); the Job's backoffLimit counts one pod's in-place restarts (the Job
controller sums them over the Job's pods); Kueue itself is not played (a test clears ``spec.suspend`` as Kueue would).
"""
from __future__ import annotations

import copy
import math
import re
import secrets
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cluster.k8s_operator import _JobController, quantity
from cluster.server_process import free_port
from cluster.k8s_store import CLUSTER_TRAINING_RUNTIMES, PODS, TRAINING_RUNTIMES, TRAINJOBS, ApiError, Store, now
from cluster.k8s_validation import (DNS1035_LABEL_MAX_LENGTH, aggregate, dns1035_label_errors, invalid, invalid_object,
                                  max_len_error, webhook_denied)

if TYPE_CHECKING:
    from cluster.k8s_server import K8sServer

SPECS = Path(__file__).resolve().parent / "specs"
DEFAULT_RUNTIMES = ("trainer-v2.3.0-torch-distributed-runtime.yaml",)
"""Runtimes Trainer v2.3.0 installs with itself (``manifests/base/runtimes/``): the server holds them from the start."""

# ---------------------------------------------------------------- Trainer v2.3.0, pkg/constants/constants.go
NODE = "node"
"""``constants.Node``: the trainer's replicated job and its container."""
ANCESTOR_LABEL, ANCESTOR_TRAINER = "trainer.kubeflow.org/trainjob-ancestor-step", "trainer"
"""``constants.LabelTrainJobAncestor`` / ``AncestorTrainer``: marks the runtime's trainer job."""
TRAINER_PORT = 29500
"""``constants.ContainerTrainerPort``: ``PET_MASTER_PORT`` and the trainer container's port."""
RESERVED_ENV = ("PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE")
"""``constants.TorchRunReservedEnvNames`` (sorted, as ``sets.List`` prints them)."""
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""``batchv1.JobCompletionIndexAnnotation``, set on each pod of an Indexed Job."""
INDEX_FIELD_PATH = f"metadata.annotations['{COMPLETION_INDEX}']"
"""``constants.JobCompletionIndexFieldPath``: the node rank's fieldRef."""
CONDITIONS = {
    "suspended": ("Suspended", "True", "Suspended", "TrainJob is suspended"),
    "resumed": ("Suspended", "False", "Resumed", "TrainJob is resumed"),
    "deadline": ("Failed", "True", "DeadlineExceeded", "TrainJob exceeded its active deadline"),
    # JobSet v0.12.0 pkg/constants/constants.go, copied to the TrainJob by the JobSet plugin's Status (jobset.go)
    "complete": ("Complete", "True", "AllJobsCompleted", "jobset completed successfully"),
    "failed": ("Failed", "True", "FailedJobs", "jobset failed due to one or more job failures"),
}
"""TrainJob conditions: (type, status, reason, message); Suspended/Resumed/DeadlineExceeded from
``trainjob_controller.go`` (``setSuspendedCondition``, ``reconcileDeadline``) with ``constants.TrainJob*Message``."""
TRAINJOB_WEBHOOK = "validator.trainjob.trainer.kubeflow.org"
"""The validating webhook's name (``pkg/webhooks/trainjob_webhook.go``, kubebuilder marker)."""
RUNTIME_KINDS = {"ClusterTrainingRuntime.trainer.kubeflow.org": CLUSTER_TRAINING_RUNTIMES,
                 "TrainingRuntime.trainer.kubeflow.org": TRAINING_RUNTIMES}
"""``runtime.RuntimeRefToRuntimeRegistryKey`` (GroupKind) -> where the runtime lives."""

# ---------------------------------------------------------------- JobSet v0.12.0 and the Job controller
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""``jobset.JobSetNameKey`` (api/jobset/v1alpha2/jobset_types.go), set on every pod by ``labelAndAnnotateObject``."""
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
"""``jobset.ExclusiveKey``: a JobSet annotation ``labelAndAnnotateObject`` copies to each pod."""
JOB_BACKOFF_LIMIT = 6
"""``batch/v1`` JobSpec.backoffLimit default (the runtime's Job template sets none)."""
JOBSET_WEBHOOK = "vjobset.kb.io"
"""JobSet's validating webhook (kubebuilder marker in ``pkg/webhooks/jobset_webhook.go``)."""
JOB_NAME_TOO_LONG = "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
POD_NAME_TOO_LONG = "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"
"""``jobNameTooLongErrorMsg`` / ``podNameTooLongErrorMsg`` (jobset_webhook.go)."""
RESOURCES_FAILED = "TrainJobResourcesCreationFailed"
"""The TrainJob's Warning event when its JobSet cannot be made (trainjob_controller.go ``Reconcile``)."""
MERGE_KEYS = {"replicatedJobs": "name", "containers": "name", "initContainers": "name", "volumes": "name",
              "imagePullSecrets": "name", "env": "name", "volumeMounts": "mountPath", "ports": "containerPort"}
"""Lists a strategic merge patch merges by key (``patchMergeKey`` in jobset_types.go and k8s.io/api core/v1
types.go); other lists (tolerations ...) are replaced."""


def strategic_merge(target: Any, patch: Any, key: str = "") -> Any:
    """``strategicpatch.StrategicMergePatch`` for the fields of :data:`MERGE_KEYS` (what ``mergeRuntimePatches``
    in ``pkg/runtime/core/trainingruntime.go`` applies per runtimePatches entry)."""
    if isinstance(patch, dict) and isinstance(target, dict):
        merged = copy.deepcopy(target)
        for name, value in patch.items():
            merged[name] = None if value is None else strategic_merge(target.get(name), value, name)
        return {k: v for k, v in merged.items() if v is not None}
    if isinstance(patch, list) and isinstance(target, list) and key in MERGE_KEYS:
        field = MERGE_KEYS[key]
        merged = copy.deepcopy(target)
        for item in patch:
            at = next((i for i, old in enumerate(merged) if old.get(field) == item.get(field)), None)
            if at is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[at] = strategic_merge(merged[at], item, "")
        return merged
    return copy.deepcopy(patch)


def upsert(items: list[dict], new: list[dict], field: str = "name") -> list[dict]:
    """``apply.UpsertEnvVars`` / ``UpsertPort`` (pkg/apply/apply.go): replace the item of the same key, else append."""
    out = list(items)
    for item in new:
        at = next((i for i, old in enumerate(out) if old.get(field) == item.get(field)), None)
        if at is None:
            out.append(item)
        else:
            out[at] = item
    return out


def torch_env(trainjob: dict, num_nodes: int, resources: dict, port: int = TRAINER_PORT) -> list[dict]:
    """The env the torch plugin puts on the trainer container (``Torch.EnforceMLPolicy``, torch.go): node count,
    processes per node (``numProcPerNode``, else ``auto``: the CPU count when ``resources`` hold no GPU, as
    ``getNumCPUPerNode``), node rank from the Job's completion index, master ``<trainjob>-node-0-0.<trainjob>``."""
    name = trainjob["metadata"]["name"]
    nproc = (trainjob["spec"].get("trainer") or {}).get("numProcPerNode")
    if nproc is None:
        gpus = [q for part in ("requests", "limits") for r, q in (resources.get(part) or {}).items() if "gpu" in r]
        cpu = (resources.get("requests") or {}).get("cpu") or (resources.get("limits") or {}).get("cpu") or 0
        nproc = "auto" if gpus else max(1, math.ceil(quantity(cpu)))
    return [{"name": "PET_NNODES", "value": str(num_nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
            {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD_PATH}}},
            {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
            {"name": "PET_MASTER_PORT", "value": str(port)}]


def install_runtimes(store: Store) -> None:
    """Store the runtimes Trainer installs (:data:`DEFAULT_RUNTIMES`), as on a cluster with Trainer v2.3.0."""
    for file_name in DEFAULT_RUNTIMES:
        runtime = yaml.safe_load((SPECS / file_name).read_text())
        store.create(CLUSTER_TRAINING_RUNTIMES, "", runtime)


# ------------------------------------------------------------------------------------------------ webhook

def _go_env(env: list[dict]) -> str:
    """``%#v`` of a ``[]v1.EnvVar``, as ``field.Invalid`` prints a struct value."""
    items = ", ".join(f'v1.EnvVar{{Name:"{e["name"]}", Value:"{e.get("value", "")}", ValueFrom:(*v1.EnvVarSource)'
                      f'({"0xc000100000" if "valueFrom" in e else "nil"})}}' for e in env)
    return f"[]v1.EnvVar{{{items}}}"


def _runtime(store: Store, namespace: str, trainjob: dict) -> tuple[dict | None, str]:
    """The runtime of ``runtimeRef`` (defaults from the CRD), or None and why (the webhook's words)."""
    ref = trainjob["spec"].get("runtimeRef") or {}
    key = f"{ref.get('kind', 'ClusterTrainingRuntime')}.{ref.get('apiGroup', 'trainer.kubeflow.org')}"
    if key not in RUNTIME_KINDS:  # trainjob_webhook.go ValidateCreate
        return None, f"unsupported runtime: {key}"
    resource = RUNTIME_KINDS[key]
    try:
        return store.get(resource, "" if resource is CLUSTER_TRAINING_RUNTIMES else namespace, ref["name"]), ""
    except ApiError as exc:  # clustertrainingruntime.go / trainingruntime.go ValidateObjects
        # %#v of the RuntimeRef; apiGroup and kind are set (the CRD defaults them), so their pointers are not nil
        value = (f'v1alpha1.RuntimeRef{{Name:"{ref["name"]}", APIGroup:(*string)(0xc000100000), '
                 "Kind:(*string)(0xc000100010)}")
        if resource is CLUSTER_TRAINING_RUNTIMES:
            return None, (f"spec.RuntimeRef: Invalid value: {value}: {exc}: specified clusterTrainingRuntime must be "
                          "created before the TrainJob is created")
        return None, (f"spec.runtimeRef: Invalid value: {value}: {exc}: specified trainingRuntime must be created "
                      "before the TrainJob is created")


NAME_RULES = ((lambda name: bool(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)),
               "metadata.name must match RFC 1035 DNS label format"),
              (lambda name: len(name) <= DNS1035_LABEL_MAX_LENGTH, "metadata.name must be no more than 63 characters"))
"""The TrainJob CRD's CEL rules on its name (``trainjob_types.go``, ``+kubebuilder:validation:XValidation``)."""


def check_name(trainjob: dict) -> None:
    """The API server's CEL validation of :data:`NAME_RULES` (a failed root rule is reported at ``<nil>`` with the
    value ``"object"``, apiextensions-apiserver ``schema/cel/validation.go``).

    Raises:
        ApiError: 422 Invalid with the failed rules' messages.
    """
    name = trainjob["metadata"].get("name", "")
    failed = [invalid("<nil>", "object", message) for rule, message in NAME_RULES if not rule(name)]
    if failed:
        raise ApiError(422, "Invalid", invalid_object("TrainJob.trainer.kubeflow.org", name, failed),
                       {"name": name, "group": "trainer.kubeflow.org", "kind": "TrainJob"})


def admit(store: Store, namespace: str, trainjob: dict) -> None:
    """Trainer's validating webhook on create (``TrainJobValidator.ValidateCreate``; the torch and JobSet plugins'
    ``Validate``), answered as the API server answers a webhook's denial.

    Raises:
        ApiError: 403 with the webhook's message.
    """
    runtime, problem = _runtime(store, namespace, trainjob)
    problems = [problem] if problem else []
    spec = trainjob["spec"]
    if runtime is not None:
        env = (spec.get("trainer") or {}).get("env") or []
        reserved = sorted({e["name"] for e in env} & set(RESERVED_ENV))
        if reserved and "torch" in (runtime["spec"].get("mlPolicy") or {}):  # torch.go Torch.Validate
            problems.append(f"spec.trainer.env: Invalid value: {_go_env(env)}: must not have reserved envs, invalid "
                            f"envs configured: [{' '.join(reserved)}]")
        problems += runtime_patch_problems(spec.get("runtimePatches") or [], runtime)
    if problems:
        raise ApiError(403, "Forbidden", webhook_denied(TRAINJOB_WEBHOOK, aggregate(problems)))


def runtime_patch_problems(patches: list[dict], runtime: dict) -> list[str]:
    """``JobSet.Validate`` (plugins/jobset/jobset.go) on ``runtimePatches``."""
    jobs = {job["name"]: {c["name"] for part in ("initContainers", "containers")
                          for c in job["template"]["spec"]["template"]["spec"].get(part) or []}
            for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    problems = []
    for patch in patches:
        manager = patch.get("manager", "")
        host, _, path = manager.partition("/")
        if not host or not path:  # validation.IsDomainPrefixedPath
            problems.append(f'spec.runtimePatches.manager: Invalid value: "{manager}": must be a domain-prefixed '
                            'path (such as "acme.io/foo")')
        template = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        for job in template.get("replicatedJobs") or []:
            if job["name"] not in jobs:
                problems.append("spec.runtimePatches: Invalid value: must not have replicated job that doesn't "
                                "exist in the runtime job template")
                continue
            pod = (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for container in pod.get("initContainers") or []:
                if container["name"] not in jobs[job["name"]]:
                    problems.append("spec.runtimePatches: Invalid value: must not have initContainer that doesn't "
                                    f"exist in the runtime job {job['name']}")
            for container in pod.get("containers") or []:
                if container["name"] not in jobs[job["name"]]:
                    problems.append("spec.runtimePatches: Invalid value: must not have container that doesn't exist "
                                    f"in the runtime job {job['name']}")
                elif container.get("env") and container["name"] == NODE:
                    problems.append("spec.runtimePatches: Invalid value: must not have envs for the "
                                    "dataset-initializer, model-initializer, node containers")
    return problems


def jobset_problems(name: str, replicated_jobs: list[dict]) -> list[str]:
    """JobSet's webhook (``jobSetWebhook.ValidateCreate``) on the names a JobSet ``name`` generates: each replicated
    job's last Job ``<jobset>-<replicated job>-<replicas - 1>`` and, when Indexed (JobSet's defaulting makes it so)
    with completions, its last pod ``<job>-<completions - 1>-abcde`` (5 characters for the random suffix) must be
    DNS-1035 labels; a name over 63 characters reads as JobSet's own message."""
    problems = []
    too_long = max_len_error(DNS1035_LABEL_MAX_LENGTH)
    for at, rjob in enumerate(replicated_jobs):
        path = f"spec.replicatedJobs[{at}].name"
        longest_job = f"{name}-{rjob['name']}-{rjob.get('replicas', 1) - 1}"
        problems += [invalid(path, longest_job, JOB_NAME_TOO_LONG if too_long in error else error)
                     for error in dns1035_label_errors(longest_job)]
        spec = rjob["template"]["spec"]
        if spec.get("completionMode", "Indexed") == "Indexed" and spec.get("completions") is not None:
            longest_pod = f"{longest_job}-{spec['completions'] - 1}-abcde"
            problems += [invalid(path, longest_job, POD_NAME_TOO_LONG if too_long in error else error)
                         for error in dns1035_label_errors(longest_pod)]
    return problems


# ------------------------------------------------------------------------------------------------ controller

def trainer_job(trainjob: dict, runtime: dict, port: int) -> tuple[dict, dict, dict, int]:
    """(JobSet metadata, JobSet spec, the trainer Job's template in it, numNodes) of ``trainjob`` on ``runtime``: the
    runtime's JobSet template with ``runtimePatches`` merged (``newRuntimeInfo``, ``mergeRuntimePatches``), then the
    trainer's image, command, args, env, resources (``jobset/builder.go`` ``Trainer``, ``trainingruntime.go``), its
    parallelism and completions = numNodes (jobset.go ``Build``) and the torch plugin's env and port (torch.go)."""
    template = runtime["spec"]["template"]
    metadata = copy.deepcopy(template.get("metadata") or {})
    jobset = copy.deepcopy(template["spec"])
    for patch in trainjob["spec"].get("runtimePatches") or []:
        patched = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
        for key in ("labels", "annotations"):
            metadata[key] = {**metadata.get(key, {}), **(patched.get("metadata") or {}).get(key, {})}
        if patched.get("spec"):
            jobset = strategic_merge(jobset, patched["spec"])
    job = next(j for j in jobset["replicatedJobs"]
               if j["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL) == ANCESTOR_TRAINER)
    trainer = trainjob["spec"].get("trainer") or {}
    num_nodes = trainer.get("numNodes") or (runtime["spec"].get("mlPolicy") or {}).get("numNodes") or 1
    job["template"]["spec"].update(parallelism=num_nodes, completions=num_nodes)
    pod = job["template"]["spec"]["template"]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == NODE)
    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            container[key] = trainer[key]
    resources = container.get("resources") or {}
    if trainer.get("resourcesPerNode"):  # MergeResourceRequirements: the TrainJob's values win
        override = trainer["resourcesPerNode"]
        resources = {part: {**resources.get(part, {}), **override.get(part, {})} for part in ("requests", "limits")
                     if resources.get(part) or override.get(part)}
        container["resources"] = resources
    pet = torch_env(trainjob, num_nodes, resources, port)
    container["env"] = upsert(upsert(container.get("env") or [], trainer.get("env") or []), pet)
    container["ports"] = upsert(container.get("ports") or [], [{"containerPort": port}], "containerPort")
    injection = ((runtime["spec"].get("mlPolicy") or {}).get("torch") or {}).get("envInjection") or {}
    for target in injection.get("targets") or []:
        target_job = next(j for j in jobset["replicatedJobs"] if j["name"] == target["jobName"])
        target_pod = target_job["template"]["spec"]["template"]["spec"]
        for extra in target_pod.get("initContainers", []) + target_pod.get("containers", []):
            if extra["name"] in target.get("containerNames", []):
                extra["env"] = upsert(extra.get("env") or [], pet)
    return metadata, jobset, job, num_nodes


class TrainJobController(_JobController):
    """Trainer's reconcile of one TrainJob, JobSet's and the Job controller's for its trainer Job; the pods run on
    the kubelet of :class:`cluster.k8s_operator._JobController`."""

    def __init__(self, api: K8sServer, namespace: str, trainjob: dict, runtime: dict):
        self._setup(api, namespace, trainjob)
        self.port = free_port()  # the rendezvous port: below the ephemeral range
        self.jobset_metadata, jobset, self.trainer, self.num_nodes = trainer_job(trainjob, runtime, self.port)
        self.jobset_refusal = jobset_problems(self.name, jobset["replicatedJobs"])
        """What JobSet's webhook says against the JobSet; non-empty: no JobSet, no pods."""
        job_spec = self.trainer["template"]["spec"]
        self.backoff_limit = job_spec.get("backoffLimit", JOB_BACKOFF_LIMIT)
        self.run_policy = {"backoffLimit": self.backoff_limit}  # read by the kubelet for in-place restarts
        self.job_name, self.job_uid, self.jobset_uid = f"{self.name}-{NODE}-0", str(uuid.uuid4()), str(uuid.uuid4())
        self.failures = 0
        self.succeeded: set[int] = set()
        self._write_pod_files([f"{self.job_name}-{i}.{self.name} {self.job_name}-{i}" for i in range(self.num_nodes)])

    def start(self) -> None:
        threading.Thread(target=self._reconcile, name=f"trainjob-{self.name}", daemon=True).start()

    # -- Trainer's reconcile

    def _reconcile(self) -> None:
        """Suspended -> no pods until ``spec.suspend`` is cleared (Kueue's admission), then run; the deadline counts
        from creation, or from the resume (``reconcileDeadline``)."""
        revision = 0
        suspended = False
        while not self.stopping.is_set():
            try:
                trainjob = self.api.store.get(TRAINJOBS, self.namespace, self.name)
            except ApiError:
                return self.stop()
            if not trainjob["spec"].get("suspend"):
                break
            if not suspended:
                self._set_condition("suspended")
                suspended = True
            store = self.api.store
            with store.lock:
                while store.revision == revision and not store.closed and not self.stopping.is_set():
                    store.lock.wait(0.5)
                revision = store.revision
                if store.closed:
                    return
        if self.stopping.is_set():
            return
        if suspended:
            self._set_condition("resumed")
        if self.jobset_refusal:  # the JobSet's apply fails: an event each reconcile, no JobSet, no pods
            refusal = webhook_denied(JOBSET_WEBHOOK, invalid_object("JobSet.jobset.x-k8s.io", self.name,
                                                                    self.jobset_refusal))
            message = f"TrainJob resources reconciliation failed: {refusal[:950]}" + (
                " ..." if len(refusal) > 950 else "")
            return self.api.record_event(self.namespace, self.job, reason=RESOURCES_FAILED, message=message,
                                         type_="Warning")
        deadline = self.job["spec"].get("activeDeadlineSeconds")
        if deadline:
            threading.Thread(target=self._deadline, args=(float(deadline),), daemon=True).start()
        for index in range(self.num_nodes):
            self._start_index(index)

    def _set_condition(self, which: str, **status: Any) -> None:
        """``meta.SetStatusCondition`` of a :data:`CONDITIONS` entry, plus the Job's counts in ``jobsStatus``."""
        kind, value, reason, message = CONDITIONS[which]

        def change(trainjob: dict) -> None:
            conditions = trainjob.setdefault("status", {}).setdefault("conditions", [])
            existing = next((c for c in conditions if c["type"] == kind), None)
            stamp = now() if existing is None or existing["status"] != value else existing["lastTransitionTime"]
            entry = {"type": kind, "status": value, "reason": reason, "message": message, "lastTransitionTime": stamp}
            if existing is None:
                conditions.append(entry)
            else:
                existing.update(entry)
            pods = self.api.store.list(PODS, self.namespace, f"{JOBSET_NAME_LABEL}={self.name}")[0]
            phases = [p.get("status", {}).get("phase") for p in pods]
            trainjob["status"]["jobsStatus"] = [{
                "name": NODE, "active": phases.count("Running") + phases.count("Pending"),
                "ready": phases.count("Running"),
                "succeeded": phases.count("Succeeded"), "failed": phases.count("Failed"),
                "suspended": int(which == "suspended")}]
            trainjob["status"].update(status)

        try:
            self.api.store.update(TRAINJOBS, self.namespace, self.name, change)
        except ApiError:
            self.stopping.set()  # the TrainJob is gone

    def _deadline(self, seconds: float) -> None:
        """``reconcileDeadline``: Failed (DeadlineExceeded) and the JobSet deleted, its pods with it."""
        if self.stopping.wait(seconds) or self.finished:
            return
        with self.lock:
            self.finished = True
        self._set_condition("deadline")
        self._delete_pods(all_pods=True)

    def finish(self, kind: str, reason: str, message: str) -> None:
        """The trainer Job ended (``Complete``, or ``Failed`` with the Job controller's reason): JobSet's Completed or
        Failed condition, which the JobSet plugin copies to the TrainJob. A failed Job's active pods are deleted."""
        with self.lock:
            if self.finished or self.stopping.is_set():
                return
            self.finished = True
        self._set_condition("complete" if kind == "Complete" else "failed")
        if kind != "Complete":
            self._delete_pods(all_pods=False)

    def _delete_pods(self, *, all_pods: bool) -> None:
        for pod in self.api.store.list(PODS, self.namespace, f"{JOBSET_NAME_LABEL}={self.name}")[0]:
            if all_pods or pod.get("status", {}).get("phase") in ("Running", "Pending"):
                self.api.delete_pod(self.namespace, pod["metadata"]["name"])

    # -- the Job controller

    def _start_index(self, index: int) -> None:
        """One pod of the Indexed Job: ``<job>-<index>-<suffix>``, hostname ``<job>-<index>`` in the JobSet's
        subdomain; labels and annotations of JobSet's ``labelAndAnnotateObject`` and the Job controller."""
        template = copy.deepcopy(self.trainer["template"]["spec"]["template"])
        spec = template.get("spec", {})
        spec.setdefault("restartPolicy", "OnFailure")  # JobSet's webhook default
        spec.update(hostname=f"{self.job_name}-{index}", subdomain=self.name)
        for container in spec.get("containers", []):  # Job controller: addCompletionIndexEnvVariables
            container["env"] = upsert(container.get("env") or [], [{"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                "fieldRef": {"fieldPath": INDEX_FIELD_PATH}}}])
        jobset = {JOBSET_NAME_LABEL: self.name, "jobset.sigs.k8s.io/jobset-uid": self.jobset_uid,
                  "jobset.sigs.k8s.io/replicatedjob-name": self.trainer["name"],
                  "jobset.sigs.k8s.io/restart-attempt": "0", "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
                  "jobset.sigs.k8s.io/job-index": "0", "jobset.sigs.k8s.io/job-global-index": "0"}
        job = {"batch.kubernetes.io/controller-uid": self.job_uid, "batch.kubernetes.io/job-name": self.job_name,
               "controller-uid": self.job_uid, "job-name": self.job_name, COMPLETION_INDEX: str(index)}
        annotations = {**template.get("metadata", {}).get("annotations", {}), **jobset, COMPLETION_INDEX: str(index)}
        exclusive = (self.jobset_metadata.get("annotations") or {}).get(EXCLUSIVE_TOPOLOGY)
        if exclusive:
            annotations[EXCLUSIVE_TOPOLOGY] = exclusive
        try:  # through admission (Pod Security); a refusal is the Job controller's FailedCreate event on the Job
            # (kubernetes pkg/controller/controller_utils.go, RealPodControl.createPods: "Error creating: %v")
            pod = self.api.create_pod(self.namespace, {
                "metadata": {"name": f"{self.job_name}-{index}-{secrets.token_hex(3)[:5]}",
                             "labels": {**template.get("metadata", {}).get("labels", {}), **jobset, **job},
                             "annotations": annotations,
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": self.job_name,
                                                  "uid": self.job_uid, "controller": True}]},
                "spec": spec, "status": {"phase": "Pending", "conditions": []}})
        except ApiError as exc:
            job_object = {"apiVersion": "batch/v1", "kind": "Job",
                          "metadata": {"name": self.job_name, "uid": self.job_uid}}
            self.api.record_event(self.namespace, job_object, reason="FailedCreate", type_="Warning",
                                  message=f"Error creating: {exc}")
            return
        threading.Thread(target=self._kubelet, args=(pod, NODE, index), name=f"pod-{pod['metadata']['name']}",
                         daemon=True).start()

    def _master_running(self) -> bool:
        return False  # Trainer sets no Running condition

    def _pod_finished(self, rtype: str, index: int, name: str, exit_code: int) -> None:
        """The Job controller on a terminated pod (``restartPolicy: Never``, or exit 0): Complete once every index
        succeeded; a failed pod is replaced until the failures pass ``backoffLimit`` (BackoffLimitExceeded)."""
        if self.stopping.is_set() or self.finished:
            return
        if exit_code == 0:
            self.succeeded.add(index)
            if len(self.succeeded) == self.num_nodes:
                self.finish("Complete", "CompletionsReached", "Reached expected number of succeeded pods")
            return
        self.failures += 1
        if self.failures > self.backoff_limit:
            return self.finish("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
        self._start_index(index)


def create(server: K8sServer, namespace: str, body: dict) -> dict:
    """Admit (the CRD's name rules, then Trainer's webhook), store, and run a TrainJob in operator mode."""
    check_name(body)
    admit(server.store, namespace, body)
    obj = server.store.create(TRAINJOBS, namespace, body)
    if server.operator:
        runtime, _ = _runtime(server.store, namespace, obj)
        server.start_controller(TRAINJOBS, namespace, TrainJobController(server, namespace, obj, runtime))
    return obj


def deleted(server: K8sServer, namespace: str, name: str) -> None:
    """A deleted TrainJob takes its JobSet, Job and pods with it (owner references)."""
    server.stop_controller(TRAINJOBS, namespace, name)
    for pod in server.store.list(PODS, namespace, f"{JOBSET_NAME_LABEL}={name}")[0]:
        server.delete_pod(namespace, pod["metadata"]["name"])
