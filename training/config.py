"""The training configuration: one typed object shared by the launcher, ``train.py`` and the pipeline parameters."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from training.settings import section_from_dict
from training.threshold import THRESHOLD_METRICS

BACKENDS = ("local", "kubernetes")
DEVICES = ("auto", "cpu", "cuda")
CLASS_WEIGHTS = ("none", "balanced")
JOB_SHAPE_KEYS = ("nnodes", "nproc_per_node", "backend")
"""The job's shape: settable in ``kfloop.yaml`` at the top level or in ``training:``, carried as the training
pipeline's own parameters (never inside ``training_config``)."""


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """How to train the classifier and on how many processes."""

    epochs: int = 8
    """Passes over the training part of the data. Raising it and re-running with the same checkpoint dir resumes."""
    batch_size: int = 256
    """Rows per optimizer step on each rank; the global batch is ``batch_size * world size``."""
    learning_rate: float = 3e-3
    """AdamW learning rate at epoch 0."""
    lr_gamma: float = 0.9
    """Per-epoch multiplicative learning-rate decay (ExponentialLR). The schedule does not depend on ``epochs``,
    so a run extended by resuming follows the same schedule as one started with more epochs."""
    weight_decay: float = 1e-4
    """AdamW decoupled weight decay."""
    hidden: tuple[int, ...] = (64, 32)
    """Widths of the MLP's hidden layers."""
    dropout: float = 0.0
    """Dropout after each hidden layer; 0 disables it."""
    class_weight: str = "none"
    """``balanced`` weighs each class's loss by ``rows / (classes * rows of the class)``, counted on the
    training split (rare classes count more); ``none`` weighs every row alike."""
    threshold_metric: str = "none"
    """Binary targets: choose the decision threshold (the probability of the second class, in sorted order, at
    or above which it is predicted) that maximises this metric on the validation split: ``f1_macro``,
    ``balanced_accuracy`` or ``accuracy``; ``none`` predicts the most probable class. Stored in ``model.json``
    and used for the served ``prediction``; probabilities are unchanged."""
    seed: int = 42
    """Seeds the validation split, the weight init, the sampler order and every RNG."""
    val_fraction: float = 0.15
    """Share of the training file held out (seeded) for the per-epoch validation metrics."""
    nnodes: int = 1
    """Nodes (pods, or local torchrun agents)."""
    nproc_per_node: int = 2
    """Training processes per node (one per GPU on GPU nodes)."""
    max_restarts: int = 0
    """How often torchrun restarts the workers of a node after a failure; they resume from the last checkpoint."""
    backend: str = "local"
    """``local`` runs torchrun agents on this machine; ``kubernetes`` submits a training job."""
    device: str = "auto"
    """``cuda`` (NCCL), ``cpu`` (gloo), or ``auto``: CUDA when available."""
    threads_per_rank: int = 1
    """Intra-op CPU threads of each rank (``torch.set_num_threads``)."""
    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size in MiB: each bucket's all-reduce starts as soon as its gradients are ready, so
    smaller buckets overlap more with the backward pass and larger ones pay less per-collective latency."""
    bf16_autocast: bool = True
    """On CUDA, run forward and loss under bf16 autocast (tensor cores); CPU training stays float32."""
    checkpoint_keep: int = 2
    """Complete checkpoints kept; at least 2, so a corrupt newest one leaves one to fall back on."""
    rdzv_timeout_seconds: int = 60
    """How long a node waits for the others to join before failing."""
    collective_timeout_seconds: int = 600
    """How long a rank waits in a collective (all-reduce, broadcast) for the others before the job fails: a
    stalled or lost rank ends the job after this long instead of hanging it."""

    def __post_init__(self) -> None:
        self.hidden = tuple(self.hidden)
        positive_ints = ("epochs", "batch_size", "nnodes", "nproc_per_node", "threads_per_rank", "rdzv_timeout_seconds",
                         "collective_timeout_seconds")
        for name in positive_ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: use an integer >= 1")
        for name in ("seed", "max_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r}: use an integer >= 0")
        if isinstance(self.bucket_cap_mb, bool) or not isinstance(self.bucket_cap_mb, (int, float)) \
                or not self.bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb={self.bucket_cap_mb!r}: use a positive size in MiB, e.g. 25")
        if not isinstance(self.bf16_autocast, bool):
            raise ValueError(f"bf16_autocast={self.bf16_autocast!r}: use true or false")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate!r}: use a positive number such as 3e-3")
        if not 0 < self.lr_gamma <= 1:
            raise ValueError(f"lr_gamma={self.lr_gamma!r}: use a factor in (0, 1]; 1 keeps the rate constant")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay={self.weight_decay!r}: use a number >= 0")
        if not self.hidden or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in self.hidden):
            raise ValueError(f"hidden={self.hidden!r}: give one or more layer widths >= 1, e.g. (64, 32)")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r}: use a probability in [0, 1)")
        if not 0 < self.val_fraction <= 0.5:
            raise ValueError(f"val_fraction={self.val_fraction!r}: use a share in (0, 0.5], e.g. 0.15")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: use one of {BACKENDS}")
        if self.class_weight not in CLASS_WEIGHTS:
            raise ValueError(f"class_weight={self.class_weight!r}: use one of {CLASS_WEIGHTS}")
        if self.threshold_metric not in THRESHOLD_METRICS:
            raise ValueError(f"threshold_metric={self.threshold_metric!r}: use one of {THRESHOLD_METRICS}")
        if self.device not in DEVICES:
            raise ValueError(f"device={self.device!r}: use one of {DEVICES}")
        if isinstance(self.checkpoint_keep, bool) or not isinstance(self.checkpoint_keep, int) \
                or self.checkpoint_keep < 2:
            raise ValueError(f"checkpoint_keep={self.checkpoint_keep!r}: keep at least 2 checkpoints so a corrupt "
                             "newest one has a fallback")

    @property
    def world_size(self) -> int:
        """Training processes in all: ``nnodes * nproc_per_node``."""
        return self.nnodes * self.nproc_per_node

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``hidden`` as a list); :meth:`from_dict` reads it back."""
        return {**asdict(self), "hidden": list(self.hidden)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainingConfig":
        """Build from a mapping such as :meth:`to_dict`'s output; missing keys take their defaults.

        Raises:
            ValueError: an unknown key (the message lists the valid ones) or an invalid value.
        """
        return section_from_dict(cls, d, "training")
