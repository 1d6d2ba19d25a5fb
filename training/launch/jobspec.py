"""One description of a distributed training job, rendered as local torchrun agents (training/launch/local.py) or as
a Kubernetes manifest.

Every node runs the same :meth:`JobSpec.command` with the environment the Kubeflow Training Operator gives a
PyTorchJob pod (:meth:`JobSpec.pod_env`); torchrun reads its topology flags from the ``PET_*`` variables there.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from data.settings import check_ints
from training.config import JobShape, TrainingConfig

PYTORCHJOB_PORT = 23456
"""The port the Training Operator opens on the master pod (``pytorchjob-port``) and puts into ``MASTER_PORT``."""

OPERATOR_ENV = ("PYTHONUNBUFFERED", "MASTER_ADDR", "PET_MASTER_ADDR", "MASTER_PORT", "PET_MASTER_PORT",
                "WORLD_SIZE", "RANK", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_NNODES", "PET_MAX_RESTARTS")
"""Variables the operator sets in every pod; a job's own ``env`` must not set them."""

MAX_NAME_LENGTH = 45
"""The longest job name every kind takes with room for node indexes of 4 digits: a TrainJob's pods
``<name>-node-0-<index>-<5 random>`` are DNS-1035 labels of at most 63 characters (JobSet v0.12.0
``pkg/webhooks/jobset_webhook.go``, ``podNameTooLongErrorMsg``), a PyTorchJob's services ``<name>-worker-<index>``
too (the API server's Service name rule), and a RayJob name at most 47 (KubeRay ``MaxRayJobNameLength``)."""
DEFAULT_JOB_NAME = "kfloop-train"
"""The job's name when no pipeline run names it."""
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(kw_only=True, slots=True)
class JobSpec:
    """What to run on how many nodes; independent of where it runs."""

    name: str = DEFAULT_JOB_NAME
    """Job name: a DNS-1035 label (lowercase letters, digits, '-'), at most :data:`MAX_NAME_LENGTH` characters so
    the pod and service names each kind derives from it stay valid."""
    nnodes: int = 1
    """Nodes: PyTorchJob replicas (1 master + ``nnodes - 1`` workers), or local torchrun agents."""
    nproc_per_node: int = 1
    """Training processes torchrun starts on each node."""
    module: str = "training.train"
    """Python module each training process runs (``python -m <module>``)."""
    args: list[str] = field(default_factory=list)
    """Arguments of the module."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every node (e.g. ``MLFLOW_TRACKING_URI``); never an operator-managed variable."""
    max_restarts: int = 0
    """Worker-group restarts torchrun allows on each node after a failure."""
    rdzv_timeout_seconds: int = 60
    """How long a node waits for the others to join."""

    def __post_init__(self) -> None:
        if len(self.name) > MAX_NAME_LENGTH or not _DNS1035.fullmatch(self.name):
            raise ValueError(f"job name {self.name!r}: use lowercase letters, digits and '-', starting with a "
                             f"letter, at most {MAX_NAME_LENGTH} characters (e.g. 'kfloop-train')")
        check_ints(self, ("nnodes", "nproc_per_node", "rdzv_timeout_seconds"), least=1)
        check_ints(self, ("max_restarts",), least=0)
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", self.module):
            raise ValueError(f"module={self.module!r}: give a dotted Python module name such as 'training.train'")
        if not all(isinstance(a, str) for a in self.args):
            raise ValueError(f"args={self.args!r}: every argument must be a string")
        for key, value in self.env.items():
            if key in OPERATOR_ENV:
                raise ValueError(f"env sets {key}, which the Training Operator sets in every pod; remove it from env")
            if not _ENV_NAME.fullmatch(key) or not isinstance(value, str):
                raise ValueError(f"env {key}={value!r}: names must be identifiers and values strings")

    @property
    def world_size(self) -> int:
        """Training processes in all."""
        return self.nnodes * self.nproc_per_node

    def pod_env(self, node_rank: int, master_addr: str, master_port: int) -> dict[str, str]:
        """The environment the Training Operator (v1.9) gives the PyTorchJob pod of ``node_rank`` (master = 0).

        ``RANK`` is the node rank here, not a process rank: torchrun sets each worker's ``RANK``, ``LOCAL_RANK`` and
        ``WORLD_SIZE`` itself.

        Raises:
            ValueError: ``node_rank`` is not in ``[0, nnodes)`` or ``master_port`` is not a valid port.
        """
        if not 0 <= node_rank < self.nnodes:
            raise ValueError(f"node_rank={node_rank}: this job has nodes 0..{self.nnodes - 1}")
        if not 0 < master_port < 65536:
            raise ValueError(f"master_port={master_port}: use a TCP port in 1..65535")
        env = {
            "PYTHONUNBUFFERED": "1",
            "MASTER_ADDR": master_addr,
            "PET_MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "PET_MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(node_rank),
            "PET_NODE_RANK": str(node_rank),
            "PET_NPROC_PER_NODE": str(self.nproc_per_node),
            "PET_NNODES": str(self.nnodes),
        }
        if self.max_restarts > 0:
            env["PET_MAX_RESTARTS"] = str(self.max_restarts)
        return env

    def command(self, python: str = "python") -> list[str]:
        """The container command of every node: torchrun (flags from the ``PET_*`` env) running :attr:`module`.

        Only the rendezvous timeout is a flag, since the operator has no variable for it.
        """
        return [python, "-m", "torch.distributed.run", f"--rdzv-conf=timeout={self.rdzv_timeout_seconds}",
                "-m", self.module, *self.args]


def training_run_spec(config: TrainingConfig, shape: JobShape, *, data: str, schema: str, model_dir: str, checkpoint_dir: str,
                      config_file: str, name: str = DEFAULT_JOB_NAME, env: dict[str, str] | None = None,
                      mlflow_run_id: str | None = None, mlflow_run_id_file: str | None = None) -> JobSpec:
    """The JobSpec of one ``training.train`` run: its file arguments (paths as the nodes see them); topology,
    restarts and rendezvous timeout from ``shape``; threads per rank from ``config``; ``env`` added to every node's.

    Raises:
        ValueError: an invalid name or env (see :class:`JobSpec`).
    """
    args = ["--data", data, "--schema", schema, "--model-dir", model_dir, "--checkpoint-dir", checkpoint_dir,
            "--config", config_file]
    if mlflow_run_id:
        args += ["--mlflow-run-id", mlflow_run_id]
    if mlflow_run_id_file:
        args += ["--mlflow-run-id-file", mlflow_run_id_file]
    return JobSpec(name=name, nnodes=shape.nnodes, nproc_per_node=shape.nproc_per_node, args=[str(a) for a in args],
                   env={"OMP_NUM_THREADS": str(config.threads_per_rank), **(env or {})},
                   max_restarts=shape.max_restarts, rdzv_timeout_seconds=shape.rdzv_timeout_seconds)
