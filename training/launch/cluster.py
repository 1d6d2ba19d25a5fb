"""Where and how a training job runs on Kubernetes: accelerators, scheduling, NCCL, security, volumes.

One typed :class:`ClusterConfig` (the ``cluster:`` section of ``kfloop.yaml``, or the pipeline's ``cluster`` dict
parameter) that :mod:`training.launch.manifests` turns into a PyTorchJob or TrainJob around a
:class:`~training.launch.jobspec.JobSpec`.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from data.settings import DEFAULT_IMAGE, section_from_dict

GPU_VENDORS = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
"""Device-plugin resource of whole GPUs per vendor (``amd`` for ROCm builds, whose RCCL reads the NCCL_* env)."""
GANG_SCHEDULERS = {"volcano": "volcano", "scheduler-plugins": "scheduler-plugins-scheduler"}
"""Gang schedulers the Training Operator supports (its ``--gang-scheduler-name``) and their default scheduler names."""
CLEAN_POD_POLICIES = ("None", "Running", "All")
NCCL_DEBUG_LEVELS = ("", "VERSION", "WARN", "INFO", "TRACE")
ASYNC_ERROR_HANDLING = (1, 2, 3)
"""``TORCH_NCCL_ASYNC_ERROR_HANDLING`` modes that tear a hung NCCL job down; 0 would leave ranks hanging forever."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TORCH_BUILD_LABEL = "io.kfloop.torch-build"
"""The image label naming its torch build (``cpu``, ``cuda``, ``rocm``): deploy/Dockerfile sets it from ``VARIANT``,
with the same value as ``KFLOOP_TORCH_BUILD`` in the image's environment."""
CUDA_TAG_SUFFIX = "-cuda"
"""The tag suffix of an image's CUDA build: .github/workflows/ci.yaml pushes ``<tag>`` (``VARIANT=cpu``) and
``<tag>-cuda`` (``VARIANT=cuda``) of each commit (deploy/image-ref.sh)."""


def cuda_image(image: str) -> str:
    """The reference of ``image``'s CUDA build: its tag with :data:`CUDA_TAG_SUFFIX` (``latest`` when untagged);
    ``image`` itself when it already is one or is pinned by digest."""
    if "@" in image or image.endswith(CUDA_TAG_SUFFIX):
        return image
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:  # no tag (a colon of the registry's port only)
        return f"{image}:latest{CUDA_TAG_SUFFIX}"
    return f"{name}:{tag}{CUDA_TAG_SUFFIX}"


JOB_KINDS = ("pytorchjob", "trainjob", "rayjob")
"""``cluster.kind``: a PyTorchJob (Training Operator v1.9), a TrainJob (Kubeflow Trainer v2.3) or a RayJob (KubeRay
v1.7)."""
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
"""Kinds a TrainJob's ``runtimeRef`` may name: cluster-wide, or in the job's namespace."""
CREDENTIAL_KEYS = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                   "MLFLOW_TRACKING_TOKEN", "MLFLOW_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                   "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AZURE_STORAGE_CONNECTION_STRING")
"""Keys of the credentials Secret (MLflow tracking and its auth, object-store credentials and endpoints) that
become env of the same name, as ``secretKeyRef``, in the pipeline steps and the training pods."""
RUN_AS_USER = 1000
"""The numeric UID (and GID) of the image's non-root user (deploy/Dockerfile); numeric so runAsNonRoot can verify it."""

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_RESOURCE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_MIG_PROFILE = re.compile(r"[1-9]g\.[1-9][0-9]*gb(\+me)?")
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m|Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?")
_UNITS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_URI = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def quantity(value: str, what: str) -> float:
    """The number a Kubernetes quantity (``500m``, ``8``, ``16Gi``) stands for.

    Raises:
        ValueError: ``value`` is not a quantity; the message names ``what``.
    """
    m = _QUANTITY.fullmatch(str(value))
    if not m:
        raise ValueError(f"{what}={value!r}: use a Kubernetes quantity such as '4', '500m' or '16Gi'")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass(kw_only=True, slots=True)
class RayHead:
    """The head pod of a RayJob's Ray cluster: the GCS, the dashboard and the job's driver (``ray job submit`` runs
    the entrypoint there); no training worker (``num-cpus: 0``), so no GPUs and no GPU node selector."""

    cpu: str = "1"
    """CPU request of the head pod (a quantity)."""
    memory: str = "4Gi"
    """Memory request and limit of the head pod; larger than ``cluster.shm_size`` (its /dev/shm counts against it)."""

    def __post_init__(self) -> None:
        self.cpu, self.memory = str(self.cpu), str(self.memory)
        if quantity(self.cpu, "cluster.ray.head.cpu") <= 0 or quantity(self.memory, "cluster.ray.head.memory") <= 0:
            raise ValueError(f"cluster.ray.head cpu={self.cpu!r}, memory={self.memory!r}: both must be positive "
                             "(e.g. cpu: '1', memory: 4Gi)")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "RayHead":
        """Build from ``cluster.ray.head``.

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        return section_from_dict(cls, d, "cluster.ray.head")


@dataclass(kw_only=True, slots=True)
class RaySettings:
    """``kind: rayjob`` only: the Ray cluster KubeRay makes for the job, and where Ray Train keeps checkpoints."""

    head: RayHead = field(default_factory=RayHead)
    """The head pod's own resources (``cpu``, ``memory``): never the workers' CPUs, memory, GPUs or node selector."""
    storage_path: str = ""
    """Ray Train's ``storage_path`` (checkpoints under ``<storage_path>/<job name>``): a URI such as
    ``s3://bucket/checkpoints``, handed to Ray as is (pyarrow's S3 filesystem, credentials and endpoint from the
    pods' ``AWS_*`` env: ``credentials_secret`` or ``secret_env``), or an absolute path every pod mounts. Empty: the
    job's checkpoint dir on the shared volume (``checkpoint_dir``)."""

    def __post_init__(self) -> None:
        if isinstance(self.head, dict):
            self.head = RayHead.from_dict(self.head)
        if self.storage_path and not (_URI.fullmatch(self.storage_path) or self.storage_path.startswith("/")):
            raise ValueError(f"cluster.ray.storage_path={self.storage_path!r}: give a URI such as "
                             "'s3://bucket/checkpoints' or an absolute path on a volume every pod mounts")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "RaySettings":
        """Build from ``cluster.ray``.

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        return section_from_dict(cls, d, "cluster.ray")


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """Kubernetes settings of the training job; the job's size and command come from its JobSpec."""

    kind: str = "pytorchjob"
    """The job that runs training: ``pytorchjob`` (``kubeflow.org/v1``, the Training Operator v1.9, in
    maintenance), ``trainjob`` (``trainer.kubeflow.org/v1alpha1``, Kubeflow Trainer v2.3 with JobSet) or ``rayjob``
    (``ray.io/v1``, KubeRay v1.7: Ray Train's TorchTrainer on a Ray cluster made for the job). Pick the operator
    your cluster runs; ``kfloop render-job --kind`` overrides it for a dry run."""
    namespace: str = ""
    """Namespace of the job (and of the RBAC in deploy/rbac.yaml). Empty: the launching step pod's own (in a
    Kubeflow profile, the profile's namespace, where the run's service account may create jobs), outside a pod the
    kubeconfig context's, else ``default``; ``kfloop compile|upload|run --namespace`` sets it."""
    image: str = DEFAULT_IMAGE
    """Image with kfloop and its pins installed (deploy/Dockerfile); pin a digest or a tag per release. Unset: the
    image of the pipeline step that launches the job (``KFLOOP_IMAGE``, the commit's; its CUDA build, tag
    ``<tag>-cuda``, when the job asks for NVIDIA GPUs), else the kfloop image."""
    image_pull_policy: str = "IfNotPresent"
    """``IfNotPresent``, ``Always`` or ``Never``."""
    image_pull_secrets: list[str] = field(default_factory=list)
    """Names of docker-registry Secrets for a private registry (e.g. GHCR); the launching step's own
    (``kfloop compile --image-pull-secret``) are added."""
    service_account_name: str = ""
    """Service account of the training pods (e.g. for workload identity to object storage); empty: the namespace's
    default. The pods never call the Kubernetes API, so its token is not mounted."""

    cpu: str = "2"
    """CPU request of each node's pod (a quantity: ``8``, ``500m``)."""
    memory: str = "8Gi"
    """Memory request and limit of each node's pod; the memory-backed /dev/shm counts against it."""
    gpus_per_node: int = 0
    """Whole GPUs per node (``<vendor>/gpu``); 0 trains on CPU with gloo. Run one process per GPU."""
    gpu_vendor: str = "nvidia"
    """``nvidia`` (``nvidia.com/gpu``, NCCL) or ``amd`` (``amd.com/gpu``, ROCm/RCCL)."""
    mig_profile: str = ""
    """NVIDIA MIG profile such as ``1g.18gb``: each node requests ``mig_devices_per_node`` of
    ``nvidia.com/mig-<profile>`` (the GPU operator's ``mixed`` MIG strategy) instead of whole GPUs."""
    mig_devices_per_node: int = 1
    """MIG devices per node with ``mig_profile``; a process can use only one, so run one process per device: each
    local rank is shown its own device (``CUDA_VISIBLE_DEVICES=<MIG UUID>`` from ``NVIDIA_VISIBLE_DEVICES``, see
    training/devices.py). NCCL cannot put two ranks on MIG devices of the same physical GPU (NVIDIA/nccl#1716):
    with more than one per node, the devices must come from different GPUs."""
    shared_gpu_resource: str = ""
    """Resource name of a time-sliced or MPS-shared GPU (e.g. ``nvidia.com/gpu.shared`` with the device plugin's
    ``renameByDefault``); each node requests ``shared_gpu_slices_per_node`` of it. The slices of a pod are shares of
    one physical GPU (its memory too), and NCCL refuses two ranks of one job on the same GPU ("Duplicate GPU
    detected", NVIDIA/nccl#418, also under MPS): a node runs one process (``nproc_per_node: 1``)."""
    shared_gpu_slices_per_node: int = 1
    """Slices of ``shared_gpu_resource`` per node: a larger share of the one GPU, never more processes."""
    numa_aligned: bool = False
    """Whole CPUs with requests equal to limits in the training container, so a kubelet with the static CPU manager
    and the ``single-numa-node`` topology manager policy pins the pod's CPUs, GPUs and NICs to one NUMA node. That
    needs Guaranteed QoS, which holds only when every container of the pod, init containers included, has requests
    equal to limits: the Training Operator v1 adds its own init container (``init-pytorch``, requests below limits)
    to Worker pods, which makes them Burstable unless the operator runs with deploy/operator-restricted-init.yaml's
    template (the PyTorchJob rendering warns)."""
    rdma_resource: str = ""
    """Extended resource of an RDMA device for NCCL over InfiniBand or RoCE, e.g. ``rdma/rdma_shared_device_a`` (the
    RDMA shared device plugin) or ``nvidia.com/hostdev``; each node requests ``rdma_devices_per_node`` of it and the
    training container gets the ``IPC_LOCK`` capability to pin memory for RDMA. An explicit exception to the
    restricted Pod Security profile: both the baseline and restricted profiles forbid adding ``IPC_LOCK``, so the
    job's namespace must be labelled ``pod-security.kubernetes.io/enforce: privileged`` (or be exempted). Empty: no
    RDMA; NCCL uses TCP sockets between nodes."""
    rdma_devices_per_node: int = 1
    """Devices of ``rdma_resource`` per node."""
    shm_size: str = "2Gi"
    """Size of the memory-backed emptyDir at /dev/shm (DataLoader workers and NCCL use shared memory; the
    container runtime's default is 64Mi)."""

    nccl_debug: str = "WARN"
    """``NCCL_DEBUG`` (``VERSION``, ``WARN``, ``INFO``, ``TRACE``); empty leaves it unset."""
    nccl_socket_ifname: str = ""
    """``NCCL_SOCKET_IFNAME``: the interface(s) for NCCL's bootstrap and socket transport, e.g. ``eth0`` or ``^lo``."""
    nccl_ib_disable: bool = False
    """``NCCL_IB_DISABLE=1``: no InfiniBand/RoCE, TCP sockets only (clusters without RDMA NICs)."""
    nccl_ib_hca: str = ""
    """``NCCL_IB_HCA``: which RDMA devices NCCL may use, e.g. ``mlx5_0,mlx5_1`` or ``^mlx5_2``."""
    nccl_async_error_handling: int = 3
    """``TORCH_NCCL_ASYNC_ERROR_HANDLING``: what a rank does when a collective times out or fails. 3 (torch's own
    default) kills the process at once, without a communicator cleanup that could hang too; 1 cleans up, then
    kills; 2 cleans up and raises in the training thread. Either way torchrun and the operator see the failure and
    restart from the last checkpoint. 0 is refused: hung ranks would hold their GPUs until the job deadline."""
    nccl_trace_buffer_size: int = 2000
    """``TORCH_NCCL_TRACE_BUFFER_SIZE``: collective events the flight recorder keeps. ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``
    is always set on GPUs: a watchdog timeout writes them, per rank, to ``<job dir>/nccl_trace_rank_<rank>`` on the
    shared volume (else /tmp), for ``torchfrtrace`` to show which rank stalled in which collective."""

    elastic_min_nodes: int = 0
    """Elastic training (``elasticPolicy``, c10d rendezvous on the master): the job runs with any node count from
    this to ``elastic_max_nodes``. 0 trains on exactly ``nnodes`` nodes."""
    elastic_max_nodes: int = 0
    """Upper bound of the node count with ``elastic_min_nodes``; 0 means ``nnodes``."""

    clean_pod_policy: str = "None"
    """``runPolicy.cleanPodPolicy``: which pods the operator deletes when the job ends (``None`` keeps them for
    their logs, ``Running``, ``All``)."""
    ttl_seconds_after_finished: int | None = 86400
    """``runPolicy.ttlSecondsAfterFinished``: delete the finished job after this long; None keeps it. A RayJob's Ray
    cluster goes as soon as it ends, and the RayJob itself (with its submitter's Job, the driver's log) after this
    long (KubeRay's ``deletionStrategy.deletionRules``); a RayJob queued in Kueue (``kueue_queue``) cannot have it."""
    active_deadline_seconds: int | None = None
    """``runPolicy.activeDeadlineSeconds``: fail the job after this long, restarts included. The operator does not
    apply ``backoff_limit`` to exit codes >= 128 (OOM kills, signals), so this is the cap that always holds."""
    backoff_limit: int | None = 3
    """``runPolicy.backoffLimit``: pod restarts before the job fails (exit codes 1-127 only under ExitCode)."""
    gang_scheduler: str = ""
    """``volcano`` or ``scheduler-plugins``: all nodes are scheduled together or not at all (``schedulingPolicy``);
    the operator must run with the matching ``--gang-scheduler-name``. Empty: the default scheduler."""
    gang_queue: str = ""
    """Volcano queue of the job (``schedulingPolicy.queue``)."""
    gang_schedule_timeout_seconds: int | None = None
    """``schedulingPolicy.scheduleTimeoutSeconds``: how long the gang may wait for all its pods to fit."""
    scheduler_name: str = ""
    """Pod ``schedulerName``; defaults to the gang scheduler's (``volcano``, ``scheduler-plugins-scheduler``)."""
    kueue_queue: str = ""
    """Kueue LocalQueue: sets the ``kueue.x-k8s.io/queue-name`` label, so Kueue admits the whole job at once (a
    TrainJob is also created suspended; Kueue resumes it on admission)."""
    topology_required: str = ""
    """Kueue Topology Aware Scheduling: the node label of the topology level (e.g. ``cloud.provider.com/topology-rack``)
    all pods must share (``kueue.x-k8s.io/podset-required-topology`` on the pod template); needs ``kueue_queue``."""
    topology_preferred: str = ""
    """As :attr:`topology_required`, but Kueue may spread the pods wider when the level has no room
    (``kueue.x-k8s.io/podset-preferred-topology``)."""
    exclusive_topology: str = ""
    """TrainJob only: JobSet exclusive placement, one job per domain of this node label (e.g.
    ``cloud.google.com/gke-nodepool``; ``alpha.jobset.sigs.k8s.io/exclusive-topology`` on the JobSet)."""
    priority_class_name: str = ""
    """PriorityClass of the pods (and of the gang with a gang scheduler)."""
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    """Pod tolerations, as in the Kubernetes API, e.g.
    ``[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]``."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Pod nodeSelector, e.g. ``{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}``."""
    affinity: dict[str, Any] = field(default_factory=dict)
    """Pod affinity, as in the Kubernetes API (e.g. keep all nodes in one rack or NVLink domain)."""

    credentials_secret: str = "kfloop-mlflow"
    """Secret (in ``namespace``) whose :data:`CREDENTIAL_KEYS` every training pod gets as env of the same name
    through optional ``secretKeyRef``s: the keys it holds arrive, the others stay unset. The steps' Secret
    (``kfloop compile --credentials-secret``) usually has the same name. Empty: none."""
    secret_env: dict[str, str] = field(default_factory=dict)
    """Environment variables read from Secrets: ``{VAR: "<secret-name>/<key>"}``, rendered as ``secretKeyRef`` so
    the value never appears in the manifest (a variable here overrides the same one of ``credentials_secret``)."""
    shared_volume_claim: str = "kfloop-shared"
    """PersistentVolumeClaim (ReadWriteMany) mounted in every pod at ``shared_mount_path``: the launch step and the
    job exchange data, config and the model through it (``<shared_mount_path>/<job name>/``). Empty: no shared
    volume (manifests for other commands only; a training job needs it)."""
    shared_mount_path: str = "/shared"
    """Mount path of ``shared_volume_claim``."""
    checkpoint_dir: str = ""
    """Checkpoint folder in the pods. Empty: ``<job dir>/checkpoints`` on the shared volume, which every node sees
    and which outlives pod restarts (a retried launch step, same job name, resumes from it). A path outside the
    shared volume becomes an emptyDir (the root filesystem is read-only): lost with the pod, single-node jobs only."""
    run_as_user: int = RUN_AS_USER
    """Numeric UID (and GID, fsGroup) the containers run as; never 0."""
    trainjob_runtime: str = "torch-distributed"
    """The runtime a TrainJob refers to (``spec.runtimeRef.name``); Trainer installs ``torch-distributed``. It
    carries what a TrainJob cannot set: image pull policy, priority, scheduler and gang policy, backoff and TTL."""
    trainjob_runtime_kind: str = "ClusterTrainingRuntime"
    """``ClusterTrainingRuntime`` (cluster-wide) or ``TrainingRuntime`` (one in :attr:`namespace`)."""
    ray: RaySettings = field(default_factory=RaySettings)
    """``kind: rayjob`` only: the Ray head's resources (``ray.head.cpu``, ``ray.head.memory``) and Ray Train's
    ``ray.storage_path``."""

    def __post_init__(self) -> None:
        if isinstance(self.ray, dict):
            self.ray = RaySettings.from_dict(self.ray)
        self.cpu, self.memory, self.shm_size = str(self.cpu), str(self.memory), str(self.shm_size)
        self._check_names()
        self._check_resources()
        self._check_nccl()
        self._check_scheduling()
        self._check_env_and_volumes()

    def _check_names(self) -> None:
        if self.namespace and (len(self.namespace) > 63 or not _DNS1123_LABEL.fullmatch(self.namespace)):
            raise ValueError(f"namespace={self.namespace!r}: use a DNS-1123 label such as 'ml-training', or leave it "
                             "empty for the launching pod's own namespace")
        if not self.image or any(c.isspace() for c in self.image):
            raise ValueError(f"image={self.image!r}: give an image reference such as 'registry.example.com/kfloop:1.0'")
        if self.image_pull_policy not in ("IfNotPresent", "Always", "Never"):
            raise ValueError(f"image_pull_policy={self.image_pull_policy!r}: use IfNotPresent, Always or Never")
        for name in (*self.image_pull_secrets, self.service_account_name, self.priority_class_name,
                     self.trainjob_runtime, self.credentials_secret):
            if name and not _DNS1123_SUBDOMAIN.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid object name: use lowercase letters, digits, '-' and '.'")
        if not self.trainjob_runtime:
            raise ValueError("trainjob_runtime is empty: name the ClusterTrainingRuntime, e.g. 'torch-distributed'")
        if self.kind not in JOB_KINDS:
            raise ValueError(f"kind={self.kind!r}: use pytorchjob (Training Operator v1.9), trainjob (Kubeflow "
                             "Trainer v2.3) or rayjob (KubeRay v1.7), whichever operator the cluster runs")
        if self.trainjob_runtime_kind not in RUNTIME_KINDS:
            raise ValueError(f"trainjob_runtime_kind={self.trainjob_runtime_kind!r}: use one of {RUNTIME_KINDS}")
        if not isinstance(self.run_as_user, int) or self.run_as_user < 1:
            raise ValueError(f"run_as_user={self.run_as_user!r}: use a numeric non-root UID such as {RUN_AS_USER}")

    def _check_resources(self) -> None:
        cpu = quantity(self.cpu, "cpu")
        memory = quantity(self.memory, "memory")
        if cpu <= 0 or memory <= 0:
            raise ValueError(f"cpu={self.cpu!r}, memory={self.memory!r}: both must be positive")
        if quantity(self.shm_size, "shm_size") >= memory:
            raise ValueError(f"shm_size={self.shm_size!r} counts against memory={self.memory!r} and must be smaller; "
                             "raise memory or lower shm_size")
        if self.kind == "rayjob" and quantity(self.shm_size, "shm_size") >= quantity(self.ray.head.memory, "memory"):
            raise ValueError(f"shm_size={self.shm_size!r} counts against the Ray head's ray.head.memory="
                             f"{self.ray.head.memory!r} and must be smaller; raise ray.head.memory or lower shm_size")
        if self.numa_aligned and not cpu.is_integer():
            raise ValueError(f"numa_aligned needs whole CPUs for Guaranteed QoS and CPU pinning; cpu={self.cpu!r}: "
                             "use an integer such as cpu: '8'")
        for name in ("gpus_per_node", "mig_devices_per_node", "shared_gpu_slices_per_node", "rdma_devices_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r}: use an integer >= 0")
        if self.gpu_vendor not in GPU_VENDORS:
            raise ValueError(f"gpu_vendor={self.gpu_vendor!r}: use one of {sorted(GPU_VENDORS)}")
        if self.mig_profile:
            if not _MIG_PROFILE.fullmatch(self.mig_profile):
                raise ValueError(f"mig_profile={self.mig_profile!r}: give a MIG profile such as '1g.18gb' or '3g.71gb'")
            if self.gpu_vendor != "nvidia":
                raise ValueError("mig_profile is an NVIDIA feature: set gpu_vendor: nvidia or drop mig_profile")
            if self.mig_devices_per_node < 1:
                raise ValueError("mig_devices_per_node must be >= 1 with mig_profile")
        if self.shared_gpu_resource:
            if not _RESOURCE_NAME.fullmatch(self.shared_gpu_resource):
                raise ValueError(f"shared_gpu_resource={self.shared_gpu_resource!r}: give an extended resource name "
                                 "such as 'nvidia.com/gpu.shared'")
            if self.shared_gpu_slices_per_node < 1:
                raise ValueError("shared_gpu_slices_per_node must be >= 1 with shared_gpu_resource")
        kinds = [n for n, on in (("gpus_per_node", self.gpus_per_node > 0), ("mig_profile", bool(self.mig_profile)),
                                 ("shared_gpu_resource", bool(self.shared_gpu_resource))) if on]
        if len(kinds) > 1:
            raise ValueError(f"{' and '.join(kinds)} are set: a node uses whole GPUs, MIG devices or shared GPU "
                             "slices, not a mix; keep one (e.g. gpus_per_node: 0 with mig_profile)")

    def _check_nccl(self) -> None:
        if self.nccl_debug not in NCCL_DEBUG_LEVELS:
            raise ValueError(f"nccl_debug={self.nccl_debug!r}: use one of {NCCL_DEBUG_LEVELS}")
        if self.nccl_async_error_handling not in ASYNC_ERROR_HANDLING:
            raise ValueError(f"nccl_async_error_handling={self.nccl_async_error_handling!r}: use 3 (kill the rank on "
                             "a collective timeout), 1 or 2; 0 would leave hung ranks holding their GPUs")
        if not isinstance(self.nccl_trace_buffer_size, int) or self.nccl_trace_buffer_size < 1:
            raise ValueError(f"nccl_trace_buffer_size={self.nccl_trace_buffer_size!r}: use an integer >= 1 so the "
                             "timeout dump has content")
        if self.nccl_ib_disable and self.nccl_ib_hca:
            raise ValueError("nccl_ib_hca selects RDMA devices but nccl_ib_disable turns RDMA off: drop one")
        if self.rdma_resource:
            if not _RESOURCE_NAME.fullmatch(self.rdma_resource):
                raise ValueError(f"rdma_resource={self.rdma_resource!r}: give an extended resource name such as "
                                 "'rdma/rdma_shared_device_a'")
            if self.rdma_devices_per_node < 1:
                raise ValueError("rdma_devices_per_node must be >= 1 with rdma_resource")
            if self.nccl_ib_disable:
                raise ValueError("rdma_resource requests RDMA devices but nccl_ib_disable turns RDMA off: drop one")
        if (self.nccl_socket_ifname or self.nccl_ib_hca or self.nccl_ib_disable or self.rdma_resource) \
                and not self.uses_gpus:
            raise ValueError("NCCL settings are set but the job has no GPUs (it trains with gloo): set gpus_per_node, "
                             "mig_profile or shared_gpu_resource, or drop the nccl_* and rdma_resource settings")

    def _check_scheduling(self) -> None:
        for name in ("elastic_min_nodes", "elastic_max_nodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r}: use an integer >= 0 (0: not elastic)")
        if self.elastic_max_nodes and not self.elastic_min_nodes:
            raise ValueError("elastic_max_nodes is set without elastic_min_nodes: set elastic_min_nodes (>= 1) too")
        if self.elastic_max_nodes and self.elastic_max_nodes < self.elastic_min_nodes:
            raise ValueError(f"elastic_max_nodes={self.elastic_max_nodes} < elastic_min_nodes="
                             f"{self.elastic_min_nodes}: the maximum must be at least the minimum")
        if self.clean_pod_policy not in CLEAN_POD_POLICIES:
            raise ValueError(f"clean_pod_policy={self.clean_pod_policy!r}: use one of {CLEAN_POD_POLICIES}")
        for name in ("ttl_seconds_after_finished", "backoff_limit"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name}={value!r}: use an integer >= 0, or null to leave it unset")
        for name in ("active_deadline_seconds", "gang_schedule_timeout_seconds"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r}: use an integer >= 1, or null to leave it unset")
        if self.gang_scheduler and self.gang_scheduler not in GANG_SCHEDULERS:
            raise ValueError(f"gang_scheduler={self.gang_scheduler!r}: use one of {sorted(GANG_SCHEDULERS)}, "
                             "or empty for the default scheduler")
        if (self.gang_queue or self.gang_schedule_timeout_seconds) and not self.gang_scheduler:
            raise ValueError("gang_queue/gang_schedule_timeout_seconds need a gang scheduler: set gang_scheduler")
        if self.gang_queue and self.gang_scheduler != "volcano":
            raise ValueError("gang_queue is a Volcano queue; scheduler-plugins has no queues: drop gang_queue or use "
                             "gang_scheduler: volcano")
        if self.kueue_queue:
            if not _DNS1123_SUBDOMAIN.fullmatch(self.kueue_queue):
                raise ValueError(f"kueue_queue={self.kueue_queue!r}: give the LocalQueue's name")
            if self.gang_scheduler:
                raise ValueError("kueue_queue and gang_scheduler both decide when the job may start (Kueue admits "
                                 "all its pods at once by quota): two queues for one job, keep one of them")
        for name in ("topology_required", "topology_preferred", "exclusive_topology"):
            value = getattr(self, name)
            if value and not _LABEL_KEY.fullmatch(value):
                raise ValueError(f"{name}={value!r}: give a node label key such as 'cloud.provider.com/topology-rack'")
        if self.topology_required and self.topology_preferred:
            raise ValueError("topology_required and topology_preferred are both set: Kueue takes one per pod set; "
                             "keep one")
        if (self.topology_required or self.topology_preferred) and not self.kueue_queue:
            raise ValueError("topology_required/topology_preferred are read by Kueue's Topology Aware Scheduling: "
                             "set kueue_queue too")
        if self.exclusive_topology and self.kind != "trainjob":
            raise ValueError("exclusive_topology is JobSet exclusive placement, which only a TrainJob has: set "
                             "kind: trainjob, or use affinity for a PyTorchJob")
        if self.scheduler_name and not _DNS1123_SUBDOMAIN.fullmatch(self.scheduler_name):
            raise ValueError(f"scheduler_name={self.scheduler_name!r}: give a scheduler's name")
        for name, value in (("tolerations", self.tolerations), ("node_selector", self.node_selector),
                            ("affinity", self.affinity)):
            if not isinstance(value, list if name == "tolerations" else dict):
                raise ValueError(f"{name}={value!r}: write it as in the Kubernetes pod spec")

    def _check_env_and_volumes(self) -> None:
        for var, ref in self.secret_env.items():
            secret, sep, key = str(ref).partition("/")
            if not _ENV_NAME.fullmatch(var) or not sep or not _DNS1123_SUBDOMAIN.fullmatch(secret) \
                    or not _SECRET_KEY.fullmatch(key):
                raise ValueError(f"secret_env {var}={ref!r}: map an environment variable to '<secret-name>/<key>', "
                                 "e.g. AWS_SECRET_ACCESS_KEY: s3-credentials/secret-key (never the value itself)")
        if self.shared_volume_claim and not _DNS1123_SUBDOMAIN.fullmatch(self.shared_volume_claim):
            raise ValueError(f"shared_volume_claim={self.shared_volume_claim!r}: give the PersistentVolumeClaim's name")
        for name in ("shared_mount_path", "checkpoint_dir"):
            path = getattr(self, name)
            if name == "checkpoint_dir" and not path:
                continue
            if not path.startswith("/") or path.rstrip("/") in ("", "/tmp", "/dev/shm"):
                raise ValueError(f"{name}={path!r}: use an absolute path of its own such as '/checkpoints'")

    @property
    def uses_gpus(self) -> bool:
        """Whether the nodes get accelerators (whole, MIG or shared): NCCL instead of gloo."""
        return bool(self.gpus_per_node or self.mig_profile or self.shared_gpu_resource)

    @property
    def accelerator(self) -> tuple[str, int] | None:
        """The accelerator resource of each node and how many, or None on CPU."""
        if self.gpus_per_node:
            return GPU_VENDORS[self.gpu_vendor], self.gpus_per_node
        if self.mig_profile:
            return f"nvidia.com/mig-{self.mig_profile}", self.mig_devices_per_node
        if self.shared_gpu_resource:
            return self.shared_gpu_resource, self.shared_gpu_slices_per_node
        return None

    @property
    def devices_per_node(self) -> int | None:
        """The processes a node runs, one per device (whole GPU or MIG device): the default and the only fitting
        ``nproc_per_node``; None on CPU or with shared GPU slices (any count fits)."""
        return None if self.shared_gpu_resource or not self.accelerator else self.accelerator[1]

    @property
    def checkpoint_scratch(self) -> bool:
        """Whether :attr:`checkpoint_dir` is a pod-local emptyDir (set, and not on the shared volume)."""
        root = self.shared_mount_path.rstrip("/") + "/"
        on_shared = bool(self.shared_volume_claim) and (self.checkpoint_dir.rstrip("/") + "/").startswith(root)
        return bool(self.checkpoint_dir) and not on_shared

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; :meth:`from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "ClusterConfig":
        """Build from the ``cluster:`` section of ``kfloop.yaml`` or a pipeline dict parameter.

        Raises:
            ValueError: an unknown key (the message lists the valid ones) or an invalid value or combination.
        """
        return section_from_dict(cls, d, "cluster")
