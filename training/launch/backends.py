"""Local or cluster, decided once: a backend chosen by the type of its config (as the Kubeflow SDK's TrainerClient
picks one by its backend config's type), then asked everything that differs between the two.

* :class:`LocalConfig` -> :class:`LocalBackend`: this machine. Training as torchrun agents here, a file lock on
  ``champion`` in the workdir.
* :class:`RayConfig` -> :class:`RayBackend`: training as Ray Train's TorchTrainer on ``training.ray_address`` (or
  a local Ray started for the run), driven from this machine; lock as :class:`LocalBackend`'s.
* :class:`~training.launch.kubernetes.KubernetesSettings` (the ``cluster:`` section) -> :class:`KubernetesBackend`:
  a Kubernetes cluster. Training as a PyTorchJob or TrainJob (``cluster.kind``), a Lease on ``champion``.

The retrain trigger's part (where it keeps its state, how it starts a training run) belongs to the step layer:
``components/run_starters.py`` picks it by the same backend's type, so training/ knows nothing of monitoring/.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from data.settings import own_image
from training.config import BACKENDS, JobShape, TrainingConfig
from training.launch.kubernetes import KubernetesSettings, train_kubernetes
from training.launch.local import TrainResult, train_local
from training.launch.ray import train_ray
from training.registry.lock import promotion_lock


@dataclass(kw_only=True, slots=True, frozen=True)
class LocalConfig:
    """Run on this machine: nothing to configure beyond the workdir every path already has."""


class Backend(ABC):
    """Where the loop's work runs: how training is launched, which lock guards ``champion``. Build one with
    :func:`backend_for`."""

    attaches_to_unfinished_run: ClassVar[bool]
    """Whether a retried launch step continues the MLflow run its killed attempt left RUNNING (the job that
    attempt started outlives it and logs into that run)."""

    @abstractmethod
    def launch(self, config: TrainingConfig, shape: JobShape, data: str, schema: str, *, model_dir: Path,
               checkpoint_dir: Path, log_dir: Path, run_name: str, mlflow_run_id: str | None = None) -> TrainResult:
        """Train ``config`` on ``data`` into ``model_dir`` as a job of ``shape``; ``run_name`` names the job (the
        pipeline run id).

        Raises:
            training.launch.local.LaunchError: a rank (or the job) failed; the message names it and its error.
            ValueError: ``shape`` does not fit the backend (the message says the fix).
        """

    @property
    @abstractmethod
    def image(self) -> str:
        """The image the training processes run (recorded in the lineage); empty when not known (outside a step)."""

    @abstractmethod
    def promotion_lock(self, model_name: str, workdir: Path, *, timeout_s: float = 600) -> AbstractContextManager:
        """The lock held while ``champion`` of ``model_name`` moves (:mod:`training.registry.lock`)."""


class LocalBackend(Backend):
    """This machine (see the module docstring)."""

    attaches_to_unfinished_run = False

    def __init__(self, config: LocalConfig):
        self.config = config

    def launch(self, config: TrainingConfig, shape: JobShape, data: str, schema: str, *, model_dir: Path,
               checkpoint_dir: Path, log_dir: Path, run_name: str, mlflow_run_id: str | None = None) -> TrainResult:
        return train_local(data, schema, model_dir=model_dir, checkpoint_dir=checkpoint_dir, config=config,
                           shape=shape, mlflow_run_id=mlflow_run_id, log_dir=log_dir)

    @property
    def image(self) -> str:
        """This process's own image (torchrun runs beside it): ``KFLOOP_IMAGE`` of a compiled step."""
        return own_image()[0]

    def promotion_lock(self, model_name: str, workdir: Path, *, timeout_s: float = 600) -> AbstractContextManager:
        return promotion_lock(model_name, workdir, timeout_s=timeout_s, kind="file")


@dataclass(kw_only=True, slots=True, frozen=True)
class RayConfig:
    """Train on Ray from this machine: the cluster is the job shape's ``ray_address``, nothing else to configure."""


class RayBackend(LocalBackend):
    """Ray Train on a Ray cluster (see the module docstring); the steps still act on this machine."""

    def launch(self, config: TrainingConfig, shape: JobShape, data: str, schema: str, *, model_dir: Path,
               checkpoint_dir: Path, log_dir: Path, run_name: str, mlflow_run_id: str | None = None) -> TrainResult:
        return train_ray(data, schema, model_dir=model_dir, checkpoint_dir=checkpoint_dir, config=config,
                         shape=shape, log_dir=log_dir, mlflow_run_id=mlflow_run_id, run_name=run_name)


class KubernetesBackend(Backend):
    """A Kubernetes cluster (see the module docstring); ``config.launcher.kubeconfig`` reaches its API."""

    attaches_to_unfinished_run = True

    def __init__(self, config: KubernetesSettings):
        self.config = config

    def launch(self, config: TrainingConfig, shape: JobShape, data: str, schema: str, *, model_dir: Path,
               checkpoint_dir: Path, log_dir: Path, run_name: str, mlflow_run_id: str | None = None) -> TrainResult:
        """A PyTorchJob or TrainJob (``cluster.kind``) named after ``run_name``; its checkpoints live in the job's
        folder on the shared volume, not in ``checkpoint_dir``."""
        return train_kubernetes(data, schema, model_dir=model_dir, config=config, shape=shape,
                                cluster=self.config.cluster,
                                policy=self.config.launcher, pipeline_run_id=run_name, log_dir=log_dir,
                                mlflow_run_id=mlflow_run_id)

    @property
    def image(self) -> str:
        """The job's image: ``cluster.image``, else the launching step's."""
        return self.config.cluster.image

    def promotion_lock(self, model_name: str, workdir: Path, *, timeout_s: float = 600) -> AbstractContextManager:
        return promotion_lock(model_name, workdir, timeout_s=timeout_s, kind="lease",
                              kubeconfig=self.config.launcher.kubeconfig)


BACKEND_ENV = "KFLOOP_BACKEND"
"""``local`` or ``kubernetes``: where this process's steps act (:func:`step_backend`); unset: ``kubernetes`` in a
KFP step pod, else ``local`` (any other pod, e.g. a CI runner's, stays local: it has no Role for Leases)."""
KFP_POD_ENV = "KFP_POD_NAME"
"""Set by Kubeflow Pipelines in every step's pod (the pod's name)."""

BACKEND_TYPES: dict[type, type[Backend]] = {LocalConfig: LocalBackend, RayConfig: RayBackend,
                                            KubernetesSettings: KubernetesBackend}
"""Config type -> its backend."""


def backend_for(config: LocalConfig | RayConfig | KubernetesSettings) -> Backend:
    """The backend of ``config``'s type.

    Raises:
        TypeError: ``config`` is of no backend's type.
    """
    if type(config) not in BACKEND_TYPES:
        raise TypeError(f"{type(config).__name__} is no backend config: use one of "
                        f"{sorted(t.__name__ for t in BACKEND_TYPES)}")
    return BACKEND_TYPES[type(config)](config)


def backend_named(name: str, cluster: dict[str, Any] | None = None) -> Backend:
    """The backend of the ``backend`` setting (``local``, ``kubernetes`` or ``ray``, as :class:`JobShape` checks it),
    a Kubernetes one configured by the ``cluster`` settings.

    Raises:
        ValueError: an unknown name, or invalid ``cluster`` settings.
    """
    if name == "kubernetes":
        return backend_for(KubernetesSettings.from_dict(cluster))
    if name == "local":
        return backend_for(LocalConfig())
    if name == "ray":
        return backend_for(RayConfig())
    raise ValueError(f"backend={name!r}: use one of {BACKENDS}")


def step_backend() -> Backend:
    """The backend of the place this process acts: ``KFLOOP_BACKEND`` (``local`` or ``kubernetes``), else
    Kubernetes in a KFP step pod, else this machine. Steps take their promotion lock from it (and the step layer
    their trigger store, by its type), and so do ``kfloop rollback`` and ``kfloop status``
    (``KFLOOP_BACKEND=kubernetes`` with a kubeconfig on a laptop takes the cluster's Lease and reads the trigger
    state kept on the registered model).

    Raises:
        ValueError: ``KFLOOP_BACKEND`` is neither ``local`` nor ``kubernetes``.
    """
    name = os.environ.get(BACKEND_ENV) or ("kubernetes" if os.environ.get(KFP_POD_ENV) else "local")
    if name not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={name!r}: use one of {BACKENDS}")
    return backend_named(name)
