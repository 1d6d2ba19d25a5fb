"""A :class:`~training.launch.jobspec.JobSpec` plus a :class:`~training.launch.cluster.ClusterConfig` rendered as a Kubernetes job.

Three renderings of the same spec the local launcher runs, picked by ``cluster.kind``: a PyTorchJob
(``kubeflow.org/v1``, Training Operator v1.9), a TrainJob (``trainer.kubeflow.org/v1alpha1``, Kubeflow Trainer
v2.3.0) and a RayJob (``ray.io/v1``, KubeRay v1.7.0). In the first two every node runs :meth:`JobSpec.command`; the
operator injects the ``PET_*``/``MASTER_*`` variables torchrun reads, so the manifests never set them (Trainer's
webhook rejects a TrainJob whose ``trainer.env`` does). A RayJob's entrypoint runs ``training.ray_train`` (Ray
Train's TorchTrainer) with the spec's arguments on the Ray cluster KubeRay makes for the job.
"""
from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import math
import re
import shlex
import warnings
from pathlib import PurePosixPath
from typing import Any

from data.settings import MLFLOW_HTTP_DEFAULTS
from training.launch.cluster import CREDENTIAL_KEYS, GANG_SCHEDULERS, KUEUE_QUEUE_LABEL, ClusterConfig
from training.config import JobShape, TrainingConfig
from training.launch.cluster import quantity
from training.launch.jobspec import DEFAULT_JOB_NAME, MAX_NAME_LENGTH, PYTORCHJOB_PORT, JobSpec, training_run_spec

PYTORCHJOB_API = "kubeflow.org/v1"
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
RAYJOB_API = "ray.io/v1"
RAY_WORKER_GROUP = "workers"
"""``groupName`` of the RayJob's one worker group."""
RAY_TRAIN_MODULE = "training.ray_train"
"""The module a RayJob's entrypoint runs: Ray Train's TorchTrainer around ``training.train``."""
RAY_JOB_LABEL = "ray.io/originated-from-cr-name"
"""KubeRay's label of what a RayJob made (utils/constant.go ``RayOriginatedFromCRNameLabelKey``): KubeRay sets it on
the submitter's pods; the rendering sets it on the Ray cluster's pod templates too, so one selector finds them all."""
RAY_SUBMITTER = "ray-job-submitter"
"""The submitter's container name (KubeRay v1.7.0 ``utils/constant.go`` ``SubmitterContainerName``)."""
RAY_PACKAGE = "ray"
"""The distribution whose pin in kfloop's ``ray`` extra is the Ray of the image (deploy/lock/runtime.txt, with that
extra)."""
TRAINER_NODE = "node"
"""Name of the trainer's replicated job and container in Trainer's torch runtimes (``constants.Node``)."""
RUNTIME_PATCH_MANAGER = "kfloop.dev/launcher"
"""``runtimePatches[].manager`` of kfloop's patch: a domain-prefixed path, as Trainer's webhook requires."""
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
JOBSET_EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
ISTIO_INJECT = "sidecar.istio.io/inject"
"""Istio's per-pod opt-out (``"false"``) of sidecar injection, which a Kubeflow profile's namespace has on
(``istio-injection: enabled``): a classic sidecar outlives the training container, so the pod would stay Running
and its job never complete, and NCCL (or Ray's GCS) traffic would go through Envoy."""
MLFLOW_RUN_ID_FILE = "mlflow_run_id"
"""The file in the job's folder holding the MLflow run the ranks log to (staged by the launcher)."""
LABELS = {"app.kubernetes.io/name": "kfloop", "app.kubernetes.io/component": "training"}
_RAY_PIN = re.compile(rf"{RAY_PACKAGE}(?:\[[^\]]*\])?\s*==\s*([0-9][^;,\s]*)")
_SHM, _TMP, _CKPT, _SHARED = "dshm", "tmp", "checkpoints", "shared"


def job_name_for(run_id: str) -> str:
    """The job name of a pipeline run: the same run id always gives the same name, so a retried launch step finds
    the job it created. A DNS-1035 label of at most :data:`~training.launch.jobspec.MAX_NAME_LENGTH` characters
    (within every kind's limit): ``kfloop-<readable part>-<8 hex of the whole run id's sha256>``, so two run ids
    whose readable parts are cut alike still get distinct names.

    Raises:
        ValueError: ``run_id`` is empty.
    """
    if not run_id:
        raise ValueError("run_id is empty: pass the pipeline run's id (e.g. KFP's run id)")
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    room = MAX_NAME_LENGTH - len("kfloop--") - len(digest)
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower())[:room].strip("-")
    return f"kfloop-{slug}-{digest}" if slug else f"kfloop-{digest}"


def image_ray_version() -> str:
    """The Ray the image runs, for a RayJob's ``rayVersion``: the version kfloop's ``ray`` extra pins (read from
    kfloop's package metadata, without importing Ray), which the image installs.

    Raises:
        ValueError: kfloop is not installed, or its ``ray`` extra does not pin one version.
    """
    try:
        requirements = importlib.metadata.requires("kfloop") or []
    except importlib.metadata.PackageNotFoundError:
        raise ValueError("a RayJob's rayVersion comes from kfloop's pin of Ray, but kfloop is not installed: "
                         "pip install -e '.[ray]' (the image installs it)") from None
    pins = [m.group(1) for r in requirements if (m := _RAY_PIN.match(r))]
    if len(pins) != 1:
        raise ValueError(f"kfloop's requirements {requirements} pin {RAY_PACKAGE} {len(pins)} times; a RayJob's "
                         "rayVersion needs exactly one pin such as 'ray[default,train]==2.60.0' in the ray extra")
    return pins[0]


def job_dir(name: str, cluster: ClusterConfig) -> PurePosixPath:
    """The job's folder on the shared volume, as the pods see it: the launch step puts ``schema.yaml``,
    ``config.json`` (:meth:`TrainingConfig.to_dict`) and the data file there, and finds the model in ``model/``.

    Raises:
        ValueError: ``cluster`` has no shared volume.
    """
    if not cluster.shared_volume_claim:
        raise ValueError("a training job needs the shared volume to read its inputs and hand back the model: set "
                         "cluster.shared_volume_claim to a ReadWriteMany PersistentVolumeClaim")
    return PurePosixPath(cluster.shared_mount_path) / name


def training_job_spec(config: TrainingConfig, shape: JobShape, cluster: ClusterConfig, *, name: str,
                      data_file: str = "data.parquet", env: dict[str, str] | None = None) -> JobSpec:
    """The JobSpec of one ``training.train`` run on ``cluster``: inputs, model, checkpoints and the MLflow run id in
    :func:`job_dir` (checkpoints in ``cluster.checkpoint_dir`` when set), topology and restarts from ``shape``.

    Raises:
        ValueError: no shared volume, or an invalid name or env (see :class:`JobSpec`).
    """
    root = job_dir(name, cluster)
    return training_run_spec(config, shape, data=str(root / data_file), schema=str(root / "schema.yaml"),
                             model_dir=str(root / "model"),
                             checkpoint_dir=str(cluster.checkpoint_dir or root / "checkpoints"),
                             config_file=str(root / "config.json"), name=name, env=env,
                             mlflow_run_id_file=str(root / MLFLOW_RUN_ID_FILE))


def job_manifest(config: TrainingConfig, shape: JobShape, cluster: ClusterConfig, *, run_id: str | None = None,
                 data_file: str = "data.parquet") -> dict[str, Any]:
    """The one job builder: the manifest (of ``cluster.kind``) of pipeline run ``run_id``'s training job (named
    ``kfloop-train`` without one), exactly what the launcher submits and ``kfloop render-job`` prints. The ranks
    reach MLflow and object storage through ``cluster.credentials_secret`` (``secretKeyRef``); the MLflow run id is
    staged in the job's folder, not written into the job.

    Raises:
        ValueError: ``shape`` and ``cluster`` do not fit together (the message says the fix).
    """
    name = job_name_for(run_id) if run_id else DEFAULT_JOB_NAME
    return render(training_job_spec(config, shape, cluster, name=name, data_file=data_file), cluster)


def render(spec: JobSpec, cluster: ClusterConfig) -> dict[str, Any]:
    """``spec`` as the job of ``cluster.kind``.

    Raises:
        ValueError: ``spec`` and ``cluster`` do not fit together (the message says the fix).
    """
    return JOB_KINDS[cluster.kind](spec, cluster)


def render_pytorchjob(spec: JobSpec, cluster: ClusterConfig) -> dict[str, Any]:
    """The PyTorchJob of ``spec`` on ``cluster``: a Master (replica 1) and ``nnodes - 1`` Workers (none for one
    node), container ``pytorch``, ``nprocPerNode`` as a string, ``restartPolicy: ExitCode`` (exit codes >= 128 are
    retried, 1-127 fail the job), and ``elasticPolicy``/``runPolicy`` from ``cluster``.

    Elastic jobs rendezvous with c10d on the master (``<name>-master-0``, the one replica scaling never removes;
    the operator's default would be ``worker-0``), with ``PET_NNODES`` = ``min:max``.

    Raises:
        ValueError: ``spec`` and ``cluster`` do not fit together (the message says the fix).
    """
    _check_fit(spec, cluster)
    replicas = {"Master": 1, **({"Worker": spec.nnodes - 1} if spec.nnodes > 1 else {})}
    if cluster.numa_aligned and "Worker" in replicas:
        warnings.warn("numa_aligned: the Training Operator v1 adds the init container init-pytorch (requests 50m/10Mi, "
                      "limits 100m/20Mi) to every Worker pod, which makes them Burstable, not Guaranteed, so the "
                      "static CPU manager does not pin their CPUs, unless the operator runs with "
                      "--pytorch-init-container-template-file and deploy/operator-restricted-init.yaml's template "
                      "(requests equal to limits)", stacklevel=2)
    body: dict[str, Any] = {
        "apiVersion": PYTORCHJOB_API,
        "kind": "PyTorchJob",
        "metadata": _metadata(spec, cluster),
        "spec": {
            "nprocPerNode": str(spec.nproc_per_node),
            "runPolicy": _run_policy(spec, cluster),
            "pytorchReplicaSpecs": {
                rtype: {"replicas": n, "restartPolicy": "ExitCode",
                        "template": {"metadata": _pod_metadata(cluster), "spec": _pod_spec(spec, cluster)}}
                for rtype, n in replicas.items()
            },
        },
    }
    if cluster.elastic_min_nodes:
        body["spec"]["elasticPolicy"] = {
            "rdzvBackend": "c10d",
            "rdzvHost": f"{spec.name}-master-0",
            "rdzvPort": PYTORCHJOB_PORT,
            "minReplicas": cluster.elastic_min_nodes,
            "maxReplicas": cluster.elastic_max_nodes or spec.nnodes,
            "maxRestarts": spec.max_restarts,
        }
    return body


def render_trainjob(spec: JobSpec, cluster: ClusterConfig) -> dict[str, Any]:
    """The TrainJob of ``spec`` on ``cluster`` for Kubeflow Trainer v2.3.0, on the runtime ``cluster.trainjob_runtime``
    (a ClusterTrainingRuntime, or a TrainingRuntime of the namespace): its torch plugin runs ``numNodes`` pods of
    container ``node`` and sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``
    (``<name>-node-0-0.<name>``) and ``PET_MASTER_PORT`` (29500) itself.

    The pod settings (security contexts of the restricted profile, volumes, service account, pull secrets, node
    selector, tolerations, affinity, labels, Kueue topology annotations) and the JobSet's exclusive placement go in
    one ``runtimePatches`` entry; with ``cluster.kueue_queue`` the job is created suspended for Kueue to admit.

    Raises:
        ValueError: ``spec`` and ``cluster`` do not fit together, or ``cluster`` sets an option only the runtime can
            carry (the message says where to set it instead).
    """
    _check_fit(spec, cluster)
    defaults = ClusterConfig()
    unsupported = [name for name in _RUNTIME_ONLY if getattr(cluster, name) != getattr(defaults, name)]
    if unsupported:
        raise ValueError(f"a TrainJob cannot set {', '.join(unsupported)}: set them in the "
                         f"{cluster.trainjob_runtime_kind} '{cluster.trainjob_runtime}', or use kind pytorchjob")
    pod = _pod_spec(spec, cluster)
    (container,) = pod.pop("containers")
    settings = {key: pod[key] for key in _PATCHABLE_POD_FIELDS if key in pod}
    settings["containers"] = [{"name": TRAINER_NODE, "securityContext": container["securityContext"],
                               "volumeMounts": container["volumeMounts"]}]
    runtime_template: dict[str, Any] = {"spec": {"replicatedJobs": [{"name": TRAINER_NODE, "template": {"spec": {
        "template": {"metadata": _pod_metadata(cluster), "spec": settings}}}}]}}
    if cluster.exclusive_topology:
        runtime_template["metadata"] = {"annotations": {JOBSET_EXCLUSIVE_TOPOLOGY: cluster.exclusive_topology}}
    launch, args = container["command"][:len(container["command"]) - len(spec.args)], spec.args
    body: dict[str, Any] = {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": _metadata(spec, cluster),
        "spec": {
            "runtimeRef": {"name": cluster.trainjob_runtime, "apiGroup": "trainer.kubeflow.org",
                           "kind": cluster.trainjob_runtime_kind},
            "trainer": {
                "image": cluster.image,
                "command": launch,
                "args": list(args),
                "env": container["env"],
                "numNodes": spec.nnodes,
                "numProcPerNode": spec.nproc_per_node,
                "resourcesPerNode": container["resources"],
            },
            "runtimePatches": [{"manager": RUNTIME_PATCH_MANAGER,
                                "trainingRuntimeSpec": {"template": runtime_template}}],
        },
    }
    if cluster.kueue_queue:
        body["spec"]["suspend"] = True
    if cluster.active_deadline_seconds:
        body["spec"]["activeDeadlineSeconds"] = cluster.active_deadline_seconds
    return body


def render_rayjob(spec: JobSpec, cluster: ClusterConfig) -> dict[str, Any]:
    """The RayJob of ``spec`` on ``cluster`` for KubeRay v1.7.0: a Ray cluster of one head (``num-cpus: 0``, so
    no training worker lands there) and one worker group of ``nnodes`` pods, and an entrypoint running
    :data:`RAY_TRAIN_MODULE` with the spec's arguments against that cluster (``--address auto``): one Ray Train worker
    per GPU (``nnodes * nproc_per_node``, one CPU each), or on CPU clusters ``nproc_per_node`` workers per pod sharing
    its whole CPUs (``rayStartParams.num-cpus``).

    ``submissionMode: K8sJobMode``: KubeRay runs ``ray job submit`` in a Kubernetes Job named after the RayJob
    (rayjob_controller.go ``createNewK8sJob``), from :data:`RAY_SUBMITTER` in ``submitterPodTemplate`` (the
    restricted security context; KubeRay fills in its command, common/job.go ``BuildJobSubmitCommand``).
    KubeRay's ``deletionStrategy.deletionRules`` (rayjob_controller.go ``handleDeletionRules``) delete the Ray cluster
    as soon as the job ends (Ray job SUCCEEDED or FAILED, or the deployment Failed), so no idle cluster keeps its
    GPUs, and the RayJob itself (with the submitter's Job and the driver's log) ``cluster.ttl_seconds_after_finished``
    later (never, with None). A Kueue-queued RayJob is created suspended, which KubeRay allows only with
    ``shutdownAfterJobFinishes`` (validation.go ``ValidateRayJobSpec``), and that excludes deletion rules: its cluster
    goes at the end (``ttlSecondsAfterFinished: 0``) and the RayJob stays, so ``ttl_seconds_after_finished`` must be
    None there. ``authOptions.mode: token``: KubeRay makes a Secret with a random token and gives it to every Ray
    container and the submitter (``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN``), so only they can reach the dashboard's job API
    and the GCS (Ray 2.60 has token auth on by default for clusters it starts itself, not for ``ray start``); KubeRay
    accepts token auth only with ``rayVersion`` >= 2.52 (:func:`image_ray_version`), which also gives probes that need
    no ``wget`` (common/pod.go, Ray >= 2.53). The head has its own ``cluster.ray.head`` resources, no accelerators
    and no node selector; every pod template opts out of Istio's sidecar (:data:`ISTIO_INJECT`). ``backoffLimit``
    is the number of times KubeRay retries the whole RayJob on a new cluster (status ``Retrying``), while
    ``spec.max_restarts`` worker-group restarts within one run are Ray Train's ``FailureConfig(max_failures)``. With
    ``cluster.kueue_queue`` the job is created suspended for Kueue to admit.

    Raises:
        ValueError: ``spec`` and ``cluster`` do not fit together, or ``cluster`` sets an option a RayJob cannot
            express (the message says why and what to use instead).
    """
    _check_fit(spec, cluster)
    if cluster.kueue_queue and cluster.ttl_seconds_after_finished is not None:
        raise ValueError(f"ttl_seconds_after_finished={cluster.ttl_seconds_after_finished} with kueue_queue: a "
                         "Kueue-queued RayJob needs shutdownAfterJobFinishes, which rules out KubeRay's deletion "
                         "rules, so nothing would delete the RayJob after a TTL; set ttl_seconds_after_finished: null "
                         "(the Ray cluster still goes when the job ends; the RayJob stays) or drop kueue_queue")
    defaults = ClusterConfig()
    unsupported = [name for name in _RAYJOB_UNSUPPORTED if getattr(cluster, name) != getattr(defaults, name)]
    if unsupported:
        raise ValueError(f"a RayJob cannot set {', '.join(unsupported)}: KubeRay has no cleanPodPolicy (the Ray "
                         "cluster goes with shutdownAfterJobFinishes), Ray Train's elastic training is not torchrun's "
                         "elasticPolicy, and KubeRay picks a gang scheduler by its own --batch-scheduler flag, not "
                         "per job; unset them, or use kind pytorchjob")
    # Ray's logical CPUs per worker pod: the whole CPUs of the request (KubeRay's pod.go would round a fraction up)
    cpus = math.floor(quantity(cluster.cpu, "cpu"))
    if cpus < spec.nproc_per_node:
        raise ValueError(f"cpu={cluster.cpu!r} gives {cpus} whole CPU(s) for nproc_per_node={spec.nproc_per_node} Ray "
                         "Train workers per pod, and each reserves at least one: raise cpu (e.g. to "
                         f"'{spec.nproc_per_node}') or lower nproc_per_node")
    cpus_per_worker = 1 if cluster.uses_gpus else cpus // spec.nproc_per_node
    entrypoint = ["python", "-m", RAY_TRAIN_MODULE, *spec.args, "--num-workers", str(spec.world_size),
                  "--cpus-per-worker", str(cpus_per_worker), "--max-failures", str(spec.max_restarts),
                  "--address", "auto", "--name", spec.name]
    if cluster.ray.storage_path:
        entrypoint += ["--storage-path", cluster.ray.storage_path]
    pod = _pod_spec(spec, cluster)
    (container,) = pod["containers"]
    del container["command"]  # KubeRay's pod.go writes the `ray start` command of each group
    container["env"] = [e for e in container["env"] if e["name"] != "PET_MAX_RESTARTS"]  # torchrun's, not Ray's
    head = cluster.ray.head
    head_resources = {"requests": {"cpu": head.cpu, "memory": head.memory}, "limits": {"memory": head.memory}}
    head_pod = {key: value for key, value in pod.items() if key != "nodeSelector"}

    def template(name: str, pod: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
        """A pod template of its own (no YAML anchors shared between the groups)."""
        metadata = _pod_metadata(cluster)
        metadata["labels"][RAY_JOB_LABEL] = spec.name
        return copy.deepcopy({"metadata": metadata, "spec": {
            **pod, "containers": [{**container, "name": name, "resources": resources}]}})

    submitter = {"name": RAY_SUBMITTER, "image": cluster.image, "imagePullPolicy": cluster.image_pull_policy,
                 "resources": copy.deepcopy(_SUBMITTER_RESOURCES),
                 "securityContext": copy.deepcopy(container["securityContext"]),
                 "volumeMounts": [{"name": _TMP, "mountPath": "/tmp"}], "env": [{"name": "HOME", "value": "/tmp"}]}
    submitter_pod = {key: copy.deepcopy(pod[key]) for key in ("automountServiceAccountToken", "enableServiceLinks",
                                               "securityContext", "serviceAccountName", "imagePullSecrets",
                                               "priorityClassName", "tolerations") if key in pod}
    body: dict[str, Any] = {
        "apiVersion": RAYJOB_API,
        "kind": "RayJob",
        "metadata": _metadata(spec, cluster),
        "spec": {
            "entrypoint": shlex.join(entrypoint),
            "submissionMode": "K8sJobMode",
            **_rayjob_deletion(cluster),
            "rayClusterSpec": {
                "rayVersion": image_ray_version(),
                "authOptions": {"mode": "token"},
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0"},
                    "template": template("ray-head", head_pod, head_resources),
                },
                "workerGroupSpecs": [{
                    "groupName": RAY_WORKER_GROUP,
                    "replicas": spec.nnodes, "minReplicas": spec.nnodes, "maxReplicas": spec.nnodes,
                    "rayStartParams": {"num-cpus": str(cpus)},
                    "template": template("ray-worker", pod, container["resources"]),
                }],
            },
            "submitterPodTemplate": {
                "metadata": {"labels": dict(LABELS), "annotations": {ISTIO_INJECT: "false"}},
                "spec": {**submitter_pod, "restartPolicy": "Never", "containers": [submitter],
                         "volumes": [{"name": _TMP, "emptyDir": {}}]}},
        },
    }
    for key, value in (("activeDeadlineSeconds", cluster.active_deadline_seconds),
                       ("backoffLimit", cluster.backoff_limit)):
        if value is not None:
            body["spec"][key] = value
    if cluster.kueue_queue:
        body["spec"]["suspend"] = True
    return body


def _rayjob_deletion(cluster: ClusterConfig) -> dict[str, Any]:
    """When KubeRay deletes what a finished RayJob leaves (see :func:`render_rayjob`): the Ray cluster at the end,
    the RayJob ``ttl_seconds_after_finished`` later; a Kueue-queued (suspended) one only its cluster."""
    if cluster.kueue_queue:
        return {"shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 0}
    ends = ({"jobStatus": "SUCCEEDED"}, {"jobStatus": "FAILED"}, {"jobDeploymentStatus": "Failed"})
    rules = [{"policy": "DeleteCluster", "condition": {**end, "ttlSeconds": 0}} for end in ends]
    if cluster.ttl_seconds_after_finished is not None:
        rules += [{"policy": "DeleteSelf", "condition": {**end, "ttlSeconds": cluster.ttl_seconds_after_finished}}
                  for end in ends]
    return {"shutdownAfterJobFinishes": False, "deletionStrategy": {"deletionRules": rules}}


_RAYJOB_UNSUPPORTED = ("clean_pod_policy", "elastic_min_nodes", "gang_scheduler")
"""ClusterConfig fields a RayJob (KubeRay v1.7.0) has no place for."""
_SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
"""The submitter's resources: KubeRay's own default (common/job.go ``GetDefaultSubmitterContainer``)."""
_RUNTIME_ONLY = ("image_pull_policy", "priority_class_name", "gang_scheduler", "scheduler_name", "elastic_min_nodes",
                 "clean_pod_policy", "ttl_seconds_after_finished", "backoff_limit")
"""ClusterConfig fields a TrainJob cannot carry (its runtime does: Trainer v2.3 has no field for them)."""
_PATCHABLE_POD_FIELDS = ("securityContext", "serviceAccountName", "imagePullSecrets", "nodeSelector", "tolerations",
                         "affinity", "volumes")
"""Pod fields of :func:`_pod_spec` a TrainJob's ``runtimePatches`` may set (the v2.3.0 CRD's pod spec patch)."""


def _check_fit(spec: JobSpec, cluster: ClusterConfig) -> None:
    if cluster.checkpoint_scratch and spec.nnodes > 1:
        raise ValueError(f"checkpoint_dir={cluster.checkpoint_dir!r} is a pod-local emptyDir the other nodes cannot "
                         "read: leave checkpoint_dir empty (checkpoints on the shared volume) or put it under "
                         f"shared_mount_path={cluster.shared_mount_path!r}")
    if cluster.elastic_min_nodes:
        if spec.nnodes < 2:
            raise ValueError("elastic training needs Worker replicas: set nnodes >= 2, or drop elastic_min_nodes")
        top = cluster.elastic_max_nodes or spec.nnodes
        if not cluster.elastic_min_nodes <= spec.nnodes <= top:
            raise ValueError(f"nnodes={spec.nnodes} is outside elastic_min_nodes..elastic_max_nodes "
                             f"({cluster.elastic_min_nodes}..{top}): start the job within its bounds")
    if cluster.shared_gpu_resource and spec.nproc_per_node > 1:
        raise ValueError(f"nproc_per_node={spec.nproc_per_node} with shared_gpu_resource="
                         f"{cluster.shared_gpu_resource!r}: the {cluster.shared_gpu_slices_per_node} slice(s) a node "
                         "requests are shares of one physical GPU, and NCCL refuses two ranks of one job on the same "
                         "GPU (\"Duplicate GPU detected\", also under MPS): set nproc_per_node: 1 (more slices only "
                         "reserve a larger share), or use whole GPUs (gpus_per_node) or MIG devices (mig_profile)")
    count = cluster.devices_per_node
    if count and spec.nproc_per_node != count:
        raise ValueError(f"nproc_per_node={spec.nproc_per_node} but each node gets {count} {cluster.accelerator[0]}: "
                         f"run one process per device, set nproc_per_node={count} (or leave it unset)")


def _metadata(spec: JobSpec, cluster: ClusterConfig) -> dict[str, Any]:
    labels = dict(LABELS)
    if cluster.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = cluster.kueue_queue
    # no namespace: the launcher's own (training.launch.kubernetes.in_namespace), as kubectl's context gives one
    return {"name": spec.name, **({"namespace": cluster.namespace} if cluster.namespace else {}), "labels": labels}


def _pod_metadata(cluster: ClusterConfig) -> dict[str, Any]:
    """Labels of every pod, Istio's opt-out of sidecar injection, and Kueue's Topology Aware Scheduling annotation
    when asked for."""
    annotations = {ISTIO_INJECT: "false"}
    for key, level in ((KUEUE_REQUIRED_TOPOLOGY, cluster.topology_required),
                       (KUEUE_PREFERRED_TOPOLOGY, cluster.topology_preferred)):
        if level:
            annotations[key] = level
    return {"labels": dict(LABELS), "annotations": annotations}


def _run_policy(spec: JobSpec, cluster: ClusterConfig) -> dict[str, Any]:
    policy: dict[str, Any] = {"cleanPodPolicy": cluster.clean_pod_policy}
    for key, value in (("ttlSecondsAfterFinished", cluster.ttl_seconds_after_finished),
                       ("activeDeadlineSeconds", cluster.active_deadline_seconds),
                       ("backoffLimit", cluster.backoff_limit)):
        if value is not None:
            policy[key] = value
    if cluster.gang_scheduler:
        gang: dict[str, Any] = {"minAvailable": cluster.elastic_min_nodes or spec.nnodes}
        for key, value in (("queue", cluster.gang_queue), ("priorityClass", cluster.priority_class_name),
                           ("scheduleTimeoutSeconds", cluster.gang_schedule_timeout_seconds)):
            if value:
                gang[key] = value
        policy["schedulingPolicy"] = gang
    return policy


def _pod_spec(spec: JobSpec, cluster: ClusterConfig) -> dict[str, Any]:
    volumes, mounts = _volumes(cluster)
    container = {
        "name": "pytorch",
        "image": cluster.image,
        "imagePullPolicy": cluster.image_pull_policy,
        "command": spec.command(),
        "env": _env(spec, cluster),
        "resources": _resources(cluster),
        "volumeMounts": mounts,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": cluster.run_as_user,
            "runAsGroup": cluster.run_as_user,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            # IPC_LOCK (pinned memory for RDMA) is the one exception to the restricted profile: see rdma_resource
            "capabilities": {"drop": ["ALL"], **({"add": ["IPC_LOCK"]} if cluster.rdma_resource else {})},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": cluster.run_as_user,
            "runAsGroup": cluster.run_as_user,
            "fsGroup": cluster.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    scheduler = cluster.scheduler_name or GANG_SCHEDULERS.get(cluster.gang_scheduler, "")
    for key, value in (("serviceAccountName", cluster.service_account_name),
                       ("imagePullSecrets", [{"name": s} for s in cluster.image_pull_secrets]),
                       ("priorityClassName", cluster.priority_class_name), ("schedulerName", scheduler),
                       ("nodeSelector", cluster.node_selector), ("tolerations", cluster.tolerations),
                       ("affinity", cluster.affinity)):
        if value:
            pod[key] = value
    return pod


def _env(spec: JobSpec, cluster: ClusterConfig) -> list[dict[str, Any]]:
    values = {"HOME": "/tmp"}  # the root filesystem is read-only; libraries write caches under $HOME
    if spec.max_restarts and not cluster.elastic_min_nodes:
        # The operator sets PET_MAX_RESTARTS only from elasticPolicy; without one, torchrun needs it from here.
        values["PET_MAX_RESTARTS"] = str(spec.max_restarts)
    if cluster.uses_gpus:
        values |= {"TORCH_NCCL_ASYNC_ERROR_HANDLING": str(cluster.nccl_async_error_handling),
                   "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   "TORCH_NCCL_TRACE_BUFFER_SIZE": str(cluster.nccl_trace_buffer_size)}
        if cluster.shared_volume_claim:  # the flight recorder's dump outlives the pod there
            values["TORCH_FR_DUMP_TEMP_FILE"] = f"{job_dir(spec.name, cluster)}/nccl_trace_rank_"
        for key, value in (("NCCL_DEBUG", cluster.nccl_debug), ("NCCL_SOCKET_IFNAME", cluster.nccl_socket_ifname),
                           ("NCCL_IB_DISABLE", "1" if cluster.nccl_ib_disable else ""),
                           ("NCCL_IB_HCA", cluster.nccl_ib_hca)):
            if value:
                values[key] = value
    credentials = {key: {"name": cluster.credentials_secret, "key": key, "optional": True}
                   for key in CREDENTIAL_KEYS if cluster.credentials_secret and key not in cluster.secret_env}
    refs = credentials | {var: dict(zip(("name", "key"), ref.split("/", 1))) for var, ref in cluster.secret_env.items()}
    clashes = sorted((set(values) | set(refs)) & set(spec.env) | set(values) & set(refs))
    if clashes:
        raise ValueError(f"environment variable(s) {clashes} are set twice (job env, cluster secret_env or "
                         "credentials_secret, and the cluster's own NCCL/runtime settings): set each in one place")
    bounds = {k: v for k, v in MLFLOW_HTTP_DEFAULTS.items() if k not in refs}  # MLflow's calls bounded there too
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted((bounds | spec.env | values).items())]
    env += [{"name": var, "valueFrom": {"secretKeyRef": ref}} for var, ref in sorted(refs.items())]
    return env


def _resources(cluster: ClusterConfig, devices: bool = True) -> dict[str, dict[str, Any]]:
    """The pod's CPU and memory, and (with ``devices``) its accelerators and RDMA devices."""
    requests: dict[str, Any] = {"cpu": cluster.cpu, "memory": cluster.memory}
    limits: dict[str, Any] = {"memory": cluster.memory}
    if cluster.numa_aligned:
        limits["cpu"] = cluster.cpu
    for resource, count in (cluster.accelerator or ("", 0), (cluster.rdma_resource, cluster.rdma_devices_per_node)):
        if resource and devices:
            requests[resource] = limits[resource] = count
    return {"requests": requests, "limits": limits}


def _volumes(cluster: ClusterConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pod volumes and the container's mounts: memory-backed /dev/shm, writable /tmp (the root filesystem is
    read-only), a pod-local checkpoint dir when asked for, and the shared claim."""
    volumes = [{"name": _SHM, "emptyDir": {"medium": "Memory", "sizeLimit": cluster.shm_size}},
               {"name": _TMP, "emptyDir": {}}]
    mounts = [{"name": _SHM, "mountPath": "/dev/shm"}, {"name": _TMP, "mountPath": "/tmp"}]
    if cluster.checkpoint_scratch:
        volumes.append({"name": _CKPT, "emptyDir": {}})
        mounts.append({"name": _CKPT, "mountPath": cluster.checkpoint_dir})
    if cluster.shared_volume_claim:
        volumes.append({"name": _SHARED, "persistentVolumeClaim": {"claimName": cluster.shared_volume_claim}})
        mounts.append({"name": _SHARED, "mountPath": cluster.shared_mount_path})
    return volumes, mounts


JOB_KINDS = {"pytorchjob": render_pytorchjob, "trainjob": render_trainjob, "rayjob": render_rayjob}
"""``kfloop render-job --kind`` -> its rendering."""
