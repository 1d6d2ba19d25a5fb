"""The ``training:`` settings, split by who reads them: :class:`TrainingConfig` (how the model is trained, what
``train.py`` reads on every rank) and :class:`JobShape` (where and on how many processes the job runs, what the
launchers read); :class:`TrainingSection` is the one mapping users write, holding both."""
from __future__ import annotations

import keyword
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from data.settings import check_ints, section_from_dict, section_mapping
from training.threshold import THRESHOLD_METRICS

BACKENDS = ("local", "kubernetes", "ray")
DEVICES = ("auto", "cpu", "cuda")
CLASS_WEIGHTS = ("none", "balanced")
REGRESSION_LOSSES = ("mse", "huber")
SHAPE_PARAMETERS = ("nnodes", "nproc_per_node", "backend")
"""The fields of :class:`JobShape` that are the training pipeline's own parameters: settable in ``kfloop.yaml`` at
the top level or in ``training:`` (never inside ``training_config``)."""


BUILTIN_MODEL = "training.mlp"
"""The default model module: kfloop's MLP (``params``: ``hidden``, a list of widths, and ``dropout``)."""


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """The model plug-in (``model:`` in ``kfloop.yaml``): a module whose builder makes the ``torch.nn.Module``
    kfloop trains, called as ``build(n_inputs, n_outputs, **params)``; it maps the preprocessed float features
    ``[batch, n_inputs]`` to ``[batch, n_outputs]`` (logits per class, or one value for regression). An optional
    ``loss(outputs, targets) -> Tensor`` in the same module replaces kfloop's loss."""

    module: str = BUILTIN_MODEL
    """A Python file (``path/to/model.py``: relative to the folder of the ``kfloop.yaml`` that names it; given with
    ``--set``, to the directory kfloop runs in) or an importable dotted module (``my_team.models.tabular``). One self-contained file: it is copied into every version it trains and
    imported from that copy, after its sha256 is checked, wherever the version is loaded."""
    builder: str = "build"
    """Name of the builder function in the module."""
    params: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the builder (``--set model.params.hidden=[128,64]``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.module, str) or not self.module.strip():
            raise ValueError(f"model.module={self.module!r}: name a Python file (model.py) or a dotted module")
        if not isinstance(self.builder, str) or not self.builder.isidentifier() or keyword.iskeyword(self.builder):
            raise ValueError(f"model.builder={self.builder!r}: give the name of a function in the module, e.g. build")
        if not isinstance(self.params, dict) or not all(isinstance(k, str) and k.isidentifier() for k in self.params):
            raise ValueError(f"model.params={self.params!r}: use a mapping of keyword arguments of the builder, "
                             "e.g. --set model.params.width=64")

    @property
    def is_file(self) -> bool:
        """Whether ``module`` names a file rather than a dotted module."""
        return self.module.endswith(".py") or "/" in self.module

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "ModelSpec":
        """Build from the ``model`` section; missing keys take their defaults.

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        return section_from_dict(cls, d, "model")


def with_module_path(settings: dict[str, Any], base: Path) -> dict[str, Any]:
    """``settings`` with a relative ``model.module`` file path made absolute against ``base`` (the folder of the
    ``kfloop.yaml`` that names it, or the working directory for ``--set``), so every step finds the same file."""
    model = settings.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("module"), str) or not model["module"].strip():
        return settings
    if not ModelSpec(module=model["module"]).is_file:
        return settings
    return {**settings, "model": {**model, "module": str((base / Path(model["module"]).expanduser()).resolve())}}


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """How the model is trained: what ``train.py`` reads on every rank (``config.json``), whatever the job's shape."""

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
    model: ModelSpec = field(default_factory=ModelSpec)
    """The model module (set as the top-level ``model:`` section; the training pipeline's ``model_config``)."""
    regression_loss: str = "mse"
    """Regression targets (standardised for training): ``mse``, or ``huber`` (quadratic within ``huber_delta``
    standard deviations of the target, linear beyond: robust to outliers). A module's own ``loss`` wins."""
    huber_delta: float = 1.0
    """Where the Huber loss turns linear, in standard deviations of the target."""
    class_weight: str = "none"
    """``balanced`` weighs each class's loss by ``rows / (classes * rows of the class)``, counted on the
    training split (rare classes count more); ``none`` weighs every row alike."""
    threshold_metric: str = "auto"
    """Binary targets: choose the decision threshold (the probability of the second class, in sorted order, at
    or above which it is predicted) that maximises this metric on the validation split: ``f1_macro``,
    ``balanced_accuracy`` or ``accuracy``; ``none`` predicts the most probable class; ``auto`` (default) takes
    ``f1_macro`` when the rarer class is under 20% of the training rows, else ``none``. Stored in ``model.json``
    (with what was chosen and why) and used for the served ``prediction``; probabilities are unchanged."""
    seed: int = 42
    """Seeds the validation split, the weight init, the sampler order and every RNG."""
    val_fraction: float = 0.15
    """Share of the training file held out (seeded) for the per-epoch validation metrics."""
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
    collective_timeout_seconds: int = 600
    """How long a rank waits in a collective (all-reduce, broadcast) for the others before the job fails: a
    stalled or lost rank ends the job after this long instead of hanging it."""

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            self.model = ModelSpec.from_dict(self.model)
        check_ints(self, ("epochs", "batch_size", "threads_per_rank", "collective_timeout_seconds"), least=1)
        check_ints(self, ("seed",), least=0)
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
        if self.regression_loss not in REGRESSION_LOSSES:
            raise ValueError(f"regression_loss={self.regression_loss!r}: use one of {REGRESSION_LOSSES}")
        if not self.huber_delta > 0:
            raise ValueError(f"huber_delta={self.huber_delta!r}: use a positive number of standard deviations")
        if not 0 < self.val_fraction <= 0.5:
            raise ValueError(f"val_fraction={self.val_fraction!r}: use a share in (0, 0.5], e.g. 0.15")
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``model`` as a mapping); :meth:`from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainingConfig":
        """Build from a mapping such as :meth:`to_dict`'s output; missing keys take their defaults.

        Raises:
            ValueError: an unknown key (the message lists the valid ones) or an invalid value.
        """
        return section_from_dict(cls, d, "training")


@dataclass(kw_only=True, slots=True)
class JobShape:
    """Where and on how many processes a training job runs: what the launchers read (``train.py`` learns its rank
    and world size from torchrun). Resolved once for every path by ``pipelines.config.job_shape``."""

    nnodes: int = 1
    """Nodes (pods, or local torchrun agents)."""
    nproc_per_node: int = 2
    """Training processes per node (one per GPU on GPU nodes)."""
    backend: str = "local"
    """``local`` runs torchrun agents on this machine; ``kubernetes`` submits a training job; ``ray`` runs Ray
    Train's TorchTrainer on ``ray_address`` (or a local Ray started for the run)."""
    max_restarts: int = 0
    """How often torchrun restarts the workers of a node after a failure; they resume from the last checkpoint."""
    rdzv_timeout_seconds: int = 60
    """How long a node waits for the others to join before failing."""
    ray_address: str = ""
    """The Ray cluster ``backend: ray`` trains on (``ray://HEAD:10001``; ``auto`` inside a Ray pod); empty: a local
    Ray started for the run. Only ``backend: ray`` reads it. Ray Train runs ``nnodes * nproc_per_node`` workers; ``max_restarts`` is its
    ``FailureConfig(max_failures)``."""

    def __post_init__(self) -> None:
        check_ints(self, ("nnodes", "nproc_per_node", "rdzv_timeout_seconds"), least=1)
        check_ints(self, ("max_restarts",), least=0)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: use one of {BACKENDS}")

    @property
    def world_size(self) -> int:
        """Training processes in all: ``nnodes * nproc_per_node``."""
        return self.nnodes * self.nproc_per_node

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; :meth:`from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "JobShape":
        """Build from a mapping such as :meth:`to_dict`'s output; missing keys take their defaults.

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        return section_from_dict(cls, d, "training")


SHAPE_FIELDS = frozenset(f.name for f in fields(JobShape))


@dataclass(kw_only=True, slots=True)
class TrainingSection:
    """The ``training:`` section as users write it (and the ``training_config`` pipeline parameter): one mapping
    holding both the model's training settings and the job's shape, split here by field name."""

    config: TrainingConfig = field(default_factory=TrainingConfig)
    shape: JobShape = field(default_factory=JobShape)

    def to_dict(self) -> dict[str, Any]:
        """The one mapping; :meth:`from_dict` reads it back."""
        return {**self.config.to_dict(), **self.shape.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "TrainingSection":
        """Split the mapping into :class:`TrainingConfig` and :class:`JobShape`; missing keys take their defaults.

        Raises:
            ValueError: not a mapping, an unknown key (the message lists every valid one), or an invalid value.
        """
        values = section_mapping(d, "training", SHAPE_FIELDS | {f.name for f in fields(TrainingConfig)})
        return cls(config=TrainingConfig.from_dict({k: v for k, v in values.items() if k not in SHAPE_FIELDS}),
                   shape=JobShape.from_dict({k: v for k, v in values.items() if k in SHAPE_FIELDS}))

