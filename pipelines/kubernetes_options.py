"""How the compiled steps run on Kubernetes: credentials from a Secret as env, KFP API access, caching, GPU
placement of the launch step.

The pipelines call :func:`apply` at the end of their body; :func:`using` makes other options active while
``pipelines.compile`` rebuilds a pipeline, so the options are chosen at compile time (``kfloop compile
--credentials-secret NAME --enable-caching --gpus N --gpu-node-selector KEY=VALUE --gpu-toleration
KEY=VALUE:EFFECT --shared-volume-claim NAME --image-pull-secret NAME``). Only Secret *names* go into the YAML:
the values stay in the cluster.
"""
from __future__ import annotations

import contextlib
import contextvars
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from kfp import kubernetes as kfp_k8s  # aliased: ``kubernetes`` is the Kubernetes client package
from kfp.dsl import PipelineTask
from kfp.dsl.pipeline_context import Pipeline

from data.settings import JOB_NAMESPACE_ENV, PULL_SECRETS_ENV
from training.launch.cluster import CREDENTIAL_KEYS

DEFAULT_SECRET = "kfloop-mlflow"
REQUIRED_KEYS = ("MLFLOW_TRACKING_URI",)
"""Secret keys every step needs: the pod does not start without them (a silent local SQLite would lose data)."""
OPTIONAL_KEYS = tuple(key for key in CREDENTIAL_KEYS if key not in REQUIRED_KEYS)
"""Secret keys set as env of the same name when present (tracking-server auth, artifact-store credentials)."""
KFP_API_ACCESS_LABEL = ("access-ml-pipeline", "true")
"""Pod label that Kubeflow's ``access-ml-pipeline`` PodDefault (in every profile namespace) selects to project the
service-account token with audience ``pipelines.kubeflow.org`` at ``/var/run/secrets/kubeflow/pipelines/token``,
which :func:`components.kfp_client.connect` presents to the KFP API. Only the trigger step starts runs, so only it
carries the label: no other step gets a token for the KFP API."""
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(kw_only=True, slots=True, frozen=True)
class KubernetesOptions:
    """Kubernetes settings of the compiled pipelines."""

    credentials_secret: str = DEFAULT_SECRET
    """Secret whose keys (``REQUIRED_KEYS``, ``OPTIONAL_KEYS``) become env of every step."""
    enable_caching: bool = False
    """Let KFP reuse a step's earlier outputs. Off: every kfloop step reads what its parameters do not show (the
    content behind a URI, the registry, the current champion, the trigger state) or changes it, and KFP's cache key
    (``backend/src/v2/cacheutils/cache.go``: parameter values, input artifact names, outputs, image, command) would
    serve a stale verdict: a scheduled drift check on a fixed URI would repeat its first answer forever."""
    gpus: int = 0
    """``nvidia.com/gpu`` limit of the training launch step (``backend=local``: torchrun runs in that pod; with
    ``backend=kubernetes`` the PyTorchJob's pods take their GPUs from ``cluster:`` instead)."""
    gpu_node_selector: dict[str, str] = field(default_factory=dict)
    """Node labels the training launch step must run on, e.g. ``{"nvidia.com/gpu.present": "true"}``."""
    gpu_tolerations: tuple[dict[str, Any], ...] = ()
    """Tolerations of the launch step, e.g. ``{"key": "nvidia.com/gpu", "operator": "Exists", "effect":
    "NoSchedule"}``."""
    shared_volume_claim: str = ""
    """PersistentVolumeClaim mounted in every step at ``shared_mount_path``, so validate, split and check-drift read
    data kept on it, and with ``backend=kubernetes`` the launch step stages inputs for the job and collects its model
    there: it is the claim (and path) of the run's ``cluster_config``
    (:attr:`training.launch.cluster.ClusterConfig.shared_volume_claim`), which ``kfloop compile`` takes from the
    ``cluster:`` settings. Empty: none."""
    shared_mount_path: str = "/shared"
    """Where the steps see ``shared_volume_claim``."""
    image_pull_secrets: tuple[str, ...] = ()
    """docker-registry Secrets every step's pod pulls its image with (a private registry, e.g. a new GHCR package).
    The steps also pass them on (``KFLOOP_IMAGE_PULL_SECRETS``) to the training job they launch, which runs their
    image: ``kfloop compile`` takes them from ``cluster.image_pull_secrets`` when no flag names one."""
    job_namespace: str = ""
    """Namespace of the training jobs the steps launch (``KFLOOP_JOB_NAMESPACE`` on every step, which a run's
    ``cluster.namespace`` overrides). Empty: each step pod's own."""

    def __post_init__(self) -> None:
        if not _DNS1123_SUBDOMAIN.fullmatch(self.credentials_secret):
            raise ValueError(f"credentials_secret={self.credentials_secret!r}: use a Kubernetes Secret name "
                             "(lower-case letters, digits, '-' and '.'), e.g. kfloop-mlflow")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise ValueError(f"gpus={self.gpus!r}: use the number of GPUs of the training step, e.g. 8 (0: none)")
        for tol in self.gpu_tolerations:
            if tol.get("effect") not in TOLERATION_EFFECTS or tol.get("operator") not in ("Equal", "Exists"):
                raise ValueError(f"gpu toleration {tol}: use KEY=VALUE:EFFECT or KEY:EFFECT with EFFECT one of "
                                 f"{list(TOLERATION_EFFECTS)}")
        if self.shared_volume_claim and not _DNS1123_SUBDOMAIN.fullmatch(self.shared_volume_claim):
            raise ValueError(f"shared_volume_claim={self.shared_volume_claim!r}: use the PersistentVolumeClaim's "
                             "name, e.g. kfloop-shared")
        for name in self.image_pull_secrets:
            if not _DNS1123_SUBDOMAIN.fullmatch(name):
                raise ValueError(f"image pull secret {name!r}: use a Kubernetes Secret name (lower-case letters, "
                                 "digits, '-' and '.'), e.g. ghcr-pull")
        if not self.shared_mount_path.startswith("/"):
            raise ValueError(f"shared_mount_path={self.shared_mount_path!r}: use an absolute path, e.g. /shared")
        if self.job_namespace and not _DNS1123_LABEL.fullmatch(self.job_namespace):
            raise ValueError(f"job_namespace={self.job_namespace!r}: use a namespace name (a DNS-1123 label of at "
                             "most 63 characters), e.g. kubeflow-user-example-com")

    @classmethod
    def from_flags(cls, *, credentials_secret: str | None = None, gpus: int | None = None,
                   node_selector: Sequence[str] = (), tolerations: Sequence[str] = (),
                   shared_volume_claim: str | None = None, shared_mount_path: str | None = None,
                   enable_caching: bool = False, image_pull_secrets: Sequence[str] = (),
                   job_namespace: str | None = None) -> KubernetesOptions:
        """Options from ``kfloop compile`` flags: ``KEY=VALUE`` selectors, ``KEY[=VALUE]:EFFECT`` tolerations.

        Raises:
            ValueError: a malformed flag value, naming the expected form.
        """
        selector = {}
        for item in node_selector:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ValueError(f"--gpu-node-selector {item!r}: use KEY=VALUE, e.g. nvidia.com/gpu.present=true")
            selector[key] = value
        tols = []
        for item in tolerations:
            taint, sep, effect = item.rpartition(":")
            key, eq, value = taint.partition("=")
            if not sep or not key:
                raise ValueError(f"--gpu-toleration {item!r}: use KEY=VALUE:EFFECT or KEY:EFFECT, e.g. "
                                 "nvidia.com/gpu:NoSchedule")
            tols.append({"key": key, "operator": "Equal" if eq else "Exists", "effect": effect,
                         **({"value": value} if eq else {})})
        return cls(credentials_secret=credentials_secret or DEFAULT_SECRET, gpus=gpus or 0, gpu_node_selector=selector,
                   gpu_tolerations=tuple(tols), shared_volume_claim=shared_volume_claim or "",
                   shared_mount_path=shared_mount_path or "/shared", enable_caching=enable_caching,
                   image_pull_secrets=tuple(dict.fromkeys(image_pull_secrets)), job_namespace=job_namespace or "")


_ACTIVE: contextvars.ContextVar[KubernetesOptions] = contextvars.ContextVar("kfloop_k8s",
                                                                            default=KubernetesOptions())


@contextlib.contextmanager
def using(options: KubernetesOptions) -> Iterator[None]:
    """Make ``options`` the ones :func:`apply` uses while a pipeline is (re)built."""
    token = _ACTIVE.set(options)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def apply(*, gpu_step: PipelineTask | None = None, api_step: PipelineTask | None = None) -> None:
    """Give every step of the pipeline being built the credentials Secret as env, the caching choice, the shared
    volume and the image pull secrets (as ``imagePullSecrets`` and, for the training job it may launch, as
    ``KFLOOP_IMAGE_PULL_SECRETS``), the training jobs' namespace (``KFLOOP_JOB_NAMESPACE``); ``gpu_step`` its GPUs,
    node selector and tolerations, and ``api_step`` (the trigger step, which starts runs) the KFP API access label.
    Call it last in a ``@dsl.pipeline`` body."""
    options = _ACTIVE.get()
    for task in Pipeline.get_default_pipeline().tasks.values():
        task.set_caching_options(options.enable_caching)
        kfp_k8s.use_secret_as_env(task, options.credentials_secret, {k: k for k in REQUIRED_KEYS})
        kfp_k8s.use_secret_as_env(task, options.credentials_secret, {k: k for k in OPTIONAL_KEYS}, optional=True)
        if options.shared_volume_claim:
            kfp_k8s.mount_pvc(task, options.shared_volume_claim, options.shared_mount_path)
        if options.image_pull_secrets:
            kfp_k8s.set_image_pull_secrets(task, list(options.image_pull_secrets))
            task.set_env_variable(PULL_SECRETS_ENV, ",".join(options.image_pull_secrets))
        if options.job_namespace:
            task.set_env_variable(JOB_NAMESPACE_ENV, options.job_namespace)
    if api_step is not None:
        kfp_k8s.add_pod_label(api_step, *KFP_API_ACCESS_LABEL)
    if gpu_step is not None:
        if options.gpus:
            gpu_step.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(options.gpus)
        for key, value in sorted(options.gpu_node_selector.items()):
            kfp_k8s.add_node_selector(gpu_step, key, value)
        for tol in options.gpu_tolerations:
            kfp_k8s.add_toleration(gpu_step, key=tol["key"], operator=tol["operator"], value=tol.get("value"),
                                   effect=tol["effect"])
