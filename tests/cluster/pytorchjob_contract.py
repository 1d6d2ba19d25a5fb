"""What the Kubeflow Training Operator v1.9 does to a PyTorchJob's pod templates, written from its source
(github.com/kubeflow/training-operator at tag v1.9.0) for the test server's operator mode, never from kfloop's code.

Cited files (paths in that repository):

* ``pkg/apis/kubeflow.org/v1/pytorch_defaults.go`` (``SetDefaults_PyTorchJob``): replicas default to 1,
  ``restartPolicy`` to ``OnFailure`` (``PyTorchJobDefaultRestartPolicy`` in ``pytorch_types.go``),
  ``cleanPodPolicy`` to ``None``; the container named ``pytorch`` (else the first, ``getDefaultContainerIndex`` in
  ``defaulting_utils.go``) gets port ``pytorchjob-port`` = 23456 unless it declares one; ``nprocPerNode`` defaults
  to ``auto`` unless ``elasticPolicy.nProcPerNode`` is set; ``elasticPolicy`` min/max replicas default to each
  other, or to the Worker replicas.
* ``pkg/controller.v1/pytorch/envvar.go`` (``setPodEnv``): on EVERY container of the pod, appended after the
  container's own env: ``PYTHONUNBUFFERED=1``; with a Master replica the master variables (``master.go``:
  ``MASTER_PORT``, ``PET_MASTER_PORT`` = the Master's ``pytorchjob-port``, ``MASTER_ADDR``, ``PET_MASTER_ADDR`` =
  ``<job>-master-0``), ``WORLD_SIZE`` = total replicas x int(nprocPerNode) (1 when not an int), ``RANK`` and
  ``PET_NODE_RANK`` = the replica index (+1 for workers); ``PET_NPROC_PER_NODE`` = ``nprocPerNode`` when set;
  then ``elastic.go``'s variables with an ``elasticPolicy`` (``PET_RDZV_ENDPOINT`` = ``rdzvHost`` or
  ``<job>-worker-0``, ``:`` ``rdzvPort`` or the Worker's ``pytorchjob-port``; ``PET_RDZV_BACKEND`` (``c10d``
  default); ``PET_NNODES`` = ``min:max``; ``PET_MAX_RESTARTS``, ``PET_NPROC_PER_NODE``, ``PET_RDZV_ID``,
  ``PET_RDZV_CONF`` (``k=v,...``) and ``PET_STANDALONE`` when set), else ``PET_NNODES`` = total replicas.
* ``pkg/controller.v1/pytorch/initcontainer.go`` (``setInitContainer``): with a Master replica, each Worker pod gets
  the init container ``init-pytorch`` (image ``alpine:3.10``, ``PyTorchInitContainerImageDefault`` in
  ``pkg/config/config.go``; 100 tries, ``PyTorchInitContainerMaxTriesDefault``) that loops on
  ``nslookup <job>-master-0``. It sets no securityContext, so the restricted Pod Security profile rejects it, and
  its requests are below its limits, so the pod is not Guaranteed QoS. The operator's
  ``--pytorch-init-container-template-file`` replaces that template and ``--pytorch-init-container-image`` its
  image (``cmd/training-operator.v1/main.go``).
* ``pkg/controller.v1/common/pod.go`` (``createNewPod``), ``job_controller.go`` (``GenLabels``), ``util.go``
  (``GenGeneralName``), ``pkg/apis/kubeflow.org/v1/common_types.go``: pods and headless services
  (``service.go``) are named ``<job>-<type lowercased>-<index>`` and labelled
  ``training.kubeflow.org/operator-name=pytorchjob-controller``, ``training.kubeflow.org/job-name``,
  ``training.kubeflow.org/replica-type`` (lowercase), ``training.kubeflow.org/replica-index`` and, on the Master,
  ``training.kubeflow.org/job-role=master``; ``pkg/core/pod.go`` (``SetRestartPolicy``): ``ExitCode`` becomes
  the pod's ``Never``.
* ``pkg/controller.v1/control/pod_control.go``: a refused pod creation is the job's Warning event
  ``FailedCreatePod`` with message ``Error creating: <the API error>``; ``service_control.go`` likewise
  ``FailedCreateService`` for a refused headless service (named as the pod).
* ``pkg/webhooks/pytorch/pytorchjob_webhook.go`` (``validatePyTorchJob``, its test cases ported in
  tests/cluster/test_pytorchjob_contract.py) and ``pkg/common/util/webhooks.go`` (``ValidateRunPolicy``,
  ``ValidateRunPolicyUpdate``): the validating webhook ``validator.pytorchjob.training-operator.kubeflow.org``.
"""
from __future__ import annotations

import copy
from typing import Any

import yaml

from cluster.k8s_validation import dns1035_label_errors, forbidden, invalid, not_supported, required

CONTAINER = "pytorch"
"""``PyTorchJobDefaultContainerName``."""
PORT_NAME = "pytorchjob-port"
"""``PyTorchJobDefaultPortName``."""
DEFAULT_PORT = 23456
"""``PyTorchJobDefaultPort``."""
DEFAULT_RESTART_POLICY = "OnFailure"
DEFAULT_NPROC_PER_NODE = "auto"
INIT_CONTAINER = "init-pytorch"
INIT_CONTAINER_IMAGE = "alpine:3.10"
INIT_CONTAINER_MAX_TRIES = 100
OPERATOR_NAME = "pytorchjob-controller"
FAILED_CREATE_POD = "FailedCreatePod"
FAILED_CREATE_SERVICE = "FailedCreateService"
WEBHOOK = "validator.pytorchjob.training-operator.kubeflow.org"
"""The validating webhook's name (kubebuilder marker in pytorchjob_webhook.go)."""
REPLICA_TYPES = ("Master", "Worker")
"""``validRoleTypes``."""
JOB_CONTROLLERS = ("kueue.x-k8s.io/multikueue", "kubeflow.org/training-operator")
"""``supportedJobControllers`` (``MultiKueueController``, ``KubeflowJobsController``), in ``UnsortedList`` order."""

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"


def replica_name(job: str, rtype: str, index: int) -> str:
    """``GenGeneralName`` / ``replicaName``: ``<job>-<type lowercased>-<index>`` ('/' -> '-')."""
    return f"{job}-{rtype.lower()}-{index}".replace("/", "-")


def default_job(job: dict) -> dict:
    """The job after ``SetDefaults_PyTorchJob`` (a copy)."""
    job = copy.deepcopy(job)
    spec = job["spec"]
    spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "None")
    for rspec in spec["pytorchReplicaSpecs"].values():
        rspec.setdefault("replicas", 1)
        rspec.setdefault("restartPolicy", DEFAULT_RESTART_POLICY)
        containers = rspec["template"]["spec"]["containers"]
        index = next((i for i, c in enumerate(containers) if c.get("name") == CONTAINER), 0)
        ports = containers[index].setdefault("ports", [])
        if not any(p.get("name") == PORT_NAME for p in ports):
            ports.append({"name": PORT_NAME, "containerPort": DEFAULT_PORT})
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        lo, hi = elastic.get("minReplicas"), elastic.get("maxReplicas")
        workers = spec["pytorchReplicaSpecs"].get("Worker", {}).get("replicas")
        elastic["minReplicas"] = lo if lo is not None else (hi if hi is not None else workers)
        elastic["maxReplicas"] = hi if hi is not None else (lo if lo is not None else workers)
    if "nprocPerNode" not in spec and (elastic is None or "nProcPerNode" not in elastic):
        spec["nprocPerNode"] = DEFAULT_NPROC_PER_NODE
    return job


def job_port(job: dict, rtype: str) -> int:
    """``getPortFromPyTorchJob``: the ``pytorchjob-port`` of replica type ``rtype``'s ``pytorch`` container.

    Raises:
        ValueError: "port not found" (the operator's error) when it has none.
    """
    for container in job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"]:
        if container.get("name") == CONTAINER:
            for port in container.get("ports", []):
                if port.get("name") == PORT_NAME:
                    return int(port["containerPort"])
    raise ValueError("port not found")


def pod_env(job: dict, rtype: str, index: int) -> list[dict[str, str]]:
    """``setPodEnv``: the env entries the operator appends to every container of replica ``rtype`` ``index``
    of a defaulted job (:func:`default_job`), in the operator's order (duplicates included, as it appends them)."""
    spec, replicas = job["spec"], job["spec"]["pytorchReplicaSpecs"]
    name = job["metadata"]["name"]
    total = sum(int(r["replicas"]) for r in replicas.values())
    nproc = spec.get("nprocPerNode")
    nproc_int = int(nproc) if nproc is not None and str(nproc).lstrip("-").isdigit() else 1
    env = [("PYTHONUNBUFFERED", "1")]
    if "Master" in replicas:
        port, addr = str(job_port(job, "Master")), replica_name(name, "Master", 0)
        rank = index + 1 if rtype == "Worker" else index
        env += [("MASTER_PORT", port), ("PET_MASTER_PORT", port), ("MASTER_ADDR", addr), ("PET_MASTER_ADDR", addr),
                ("WORLD_SIZE", str(total * nproc_int)), ("RANK", str(rank)), ("PET_NODE_RANK", str(rank))]
    if nproc is not None:
        env.append(("PET_NPROC_PER_NODE", str(nproc)))
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        host = elastic.get("rdzvHost") or f"{name}-worker-0"
        port = elastic.get("rdzvPort") or job_port(job, "Worker")
        env += [("PET_RDZV_ENDPOINT", f"{host}:{port}"), ("PET_RDZV_BACKEND", elastic.get("rdzvBackend") or "c10d"),
                ("PET_NNODES", f"{elastic['minReplicas']}:{elastic['maxReplicas']}")]
        for key, var in (("maxRestarts", "PET_MAX_RESTARTS"), ("nProcPerNode", "PET_NPROC_PER_NODE"),
                         ("rdzvId", "PET_RDZV_ID")):
            if elastic.get(key) is not None:
                env.append((var, str(elastic[key])))
        if elastic.get("rdzvConf"):
            env.append(("PET_RDZV_CONF", ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])))
        if elastic.get("standalone"):
            env.append(("PET_STANDALONE", ""))
    else:
        env.append(("PET_NNODES", str(total)))
    return [{"name": k, "value": v} for k, v in env]


DEFAULT_INIT_CONTAINER_TEMPLATE = """
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  command: ['sh', '-c', 'err=1;for i in $(seq {{.MaxTries}}); do if nslookup {{.MasterAddr}}; then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err']"""
"""``initContainerTemplate`` (initcontainer.go), used unless the operator runs with
``--pytorch-init-container-template-file``."""


def init_containers(job: dict, rtype: str, template: str | None = None,
                    image: str = INIT_CONTAINER_IMAGE) -> list[dict[str, Any]]:
    """``setInitContainer``: the init containers of ``template`` (the operator's template file, else the default)
    on Worker pods of a job with a Master, its ``{{.MasterAddr}}``, ``{{.InitContainerImage}}`` (``image``: the
    operator's ``--pytorch-init-container-image``) and ``{{.MaxTries}}`` filled in."""
    if rtype != "Worker" or "Master" not in job["spec"]["pytorchReplicaSpecs"]:
        return []
    text = (template or DEFAULT_INIT_CONTAINER_TEMPLATE).replace(
        "{{.MasterAddr}}", replica_name(job["metadata"]["name"], "Master", 0)).replace(
        "{{.InitContainerImage}}", image).replace("{{.MaxTries}}", str(INIT_CONTAINER_MAX_TRIES))
    return yaml.safe_load(text)


def pod_labels(job: dict, rtype: str, index: int) -> dict[str, str]:
    """``GenLabels`` + replica type/index (+ job role on the Master), added over the template's labels."""
    labels = {OPERATOR_NAME_LABEL: OPERATOR_NAME, JOB_NAME_LABEL: job["metadata"]["name"].replace("/", "-"),
              REPLICA_TYPE_LABEL: rtype.lower(), REPLICA_INDEX_LABEL: str(index)}
    if rtype == "Master":
        labels[JOB_ROLE_LABEL] = "master"
    return labels


def pod_restart_policy(replica_restart_policy: str) -> str:
    """``SetRestartPolicy``: ``ExitCode`` is the operator's own; the pod gets ``Never``."""
    return "Never" if replica_restart_policy == "ExitCode" else replica_restart_policy


def pod_template(job: dict, rtype: str, index: int, init_template: str | None = None,
                 init_image: str = INIT_CONTAINER_IMAGE) -> dict[str, Any]:
    """``createNewPod`` + ``SetClusterSpec``: the pod (metadata and spec) the operator creates for replica ``rtype``
    ``index`` of a defaulted job (``init_template``: the operator's init container template file, if any;
    ``init_image``: its init container image)."""
    rspec = job["spec"]["pytorchReplicaSpecs"][rtype]
    template = copy.deepcopy(rspec["template"])
    meta, spec = template.get("metadata") or {}, template["spec"]
    for container in spec["containers"]:
        container["env"] = list(container.get("env") or []) + pod_env(job, rtype, index)
    spec["initContainers"] = list(spec.get("initContainers") or []) + init_containers(job, rtype, init_template, init_image)
    if not spec["initContainers"]:
        del spec["initContainers"]
    spec["restartPolicy"] = pod_restart_policy(rspec["restartPolicy"])
    return {"metadata": {"name": replica_name(job["metadata"]["name"], rtype, index),
                         "labels": {**(meta.get("labels") or {}), **pod_labels(job, rtype, index)},
                         "annotations": dict(meta.get("annotations") or {})},
            "spec": spec}


def validate(job: dict, old: dict | None = None) -> tuple[list[str], list[str]]:
    """``validatePyTorchJob``: (warnings, errors) of the webhook on create (``old`` None) or update."""
    errors: list[str] = []
    warnings: list[str] = []
    name = job["metadata"].get("name", "")
    problems = dns1035_label_errors(name)
    if problems:
        errors.append(invalid("metadata.name", name, f"should match: {','.join(problems)}"))
    spec = job.get("spec") or {}
    manager = (spec.get("runPolicy") or {}).get("managedBy")
    if old is not None:  # ValidateImmutableField
        before = ((old.get("spec") or {}).get("runPolicy") or {}).get("managedBy")
        if manager != before:
            errors.append(invalid("spec.runPolicy.managedBy", manager, "field is immutable"))
    if manager is not None and manager not in JOB_CONTROLLERS:
        errors.append(not_supported("spec.runPolicy.managedBy", manager, list(JOB_CONTROLLERS)))
    replicas = spec.get("pytorchReplicaSpecs")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if "Worker" not in (replicas or {}):
            errors.append(required("spec.pytorchReplicaSpecs[Worker]", "must be configured if elastic policy is used"))
        if elastic.get("nProcPerNode") is not None:
            warnings.append("spec.elasticPolicy.nProcPerNode is deprecated, use spec.nprocPerNode instead")
            if spec.get("nprocPerNode") is not None:
                errors.append(forbidden("spec.elasticPolicy.nProcPerNode", "must not be used with spec.nprocPerNode"))
    if replicas is None:
        errors.append(required("spec.pytorchReplicaSpecs", "must be required"))
    for rtype, rspec in (replicas or {}).items():
        role = f"spec.pytorchReplicaSpecs[{rtype}]"
        containers_path = f"{role}.template.spec.containers"
        if rtype not in REPLICA_TYPES:
            errors.append(not_supported(role, rtype, list(REPLICA_TYPES)))
        containers = ((((rspec or {}).get("template") or {}).get("spec") or {}).get("containers")) or []
        if not containers:
            errors.append(required(containers_path, "must be specified"))
        for index, container in enumerate(containers):
            if not container.get("image"):
                errors.append(required(f"{containers_path}[{index}].image", "must be required"))
        if not any(container.get("name") == CONTAINER for container in containers):
            errors.append(required(containers_path, f"must have at least one container with name {CONTAINER}"))
        count = (rspec or {}).get("replicas")
        if rtype == "Master":
            if count is None or int(count) != 1:
                errors.append(forbidden(f"{role}.replicas", "must be 1"))
        elif count is not None and int(count) < 1:
            errors.append(forbidden(f"{role}.replicas", "must be at least 1"))
    return warnings, errors
