"""The quality check's policy (:class:`QualityPolicy`, the ``quality`` settings section): when the champion counts
as degraded on labelled rows (the rule: :mod:`monitoring.quality`). Apart from it so that checking settings does
not import Evidently, which the check's report needs."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping

from data.settings import section_from_dict
from training.gate import METRICS, REGRESSION_METRICS

BOOTSTRAP_METHODS = ("percentile", "paired")


@dataclass(kw_only=True, slots=True)
class QualityPolicy:
    """When the champion counts as degraded on labelled rows (see the module docstring for the rule)."""

    primary_metric: str | None = None
    """A metric of :data:`training.gate.METRICS` (classification) or :data:`training.gate.REGRESSION_METRICS`;
    ``None``: the one the gate promoted the champion on."""
    max_drop: float = 0.05
    """Largest drop below the holdout value (absolute, in the metric's worse direction) that is not degradation."""
    floor: float | None = None
    """Absolute bound the metric must clear on the labelled rows: a minimum, or for a lower-is-better metric a
    maximum. ``None``: no bound."""
    bootstrap: Literal["percentile", "paired"] = "percentile"
    """How the drop is made confident: ``percentile`` interval of the value, or ``paired`` resamples of the
    champion and the trivial baseline (see the module docstring)."""
    confidence: float = 0.9
    """``percentile``: the interval's coverage (0.9: 5th to 95th percentile); ``paired``: the share of resamples
    on which the drop must exceed ``max_drop``."""
    bootstrap_samples: int = 1000
    """Bootstrap resamples of the labelled rows."""
    bootstrap_seed: int = 0
    """Seed of the resampling; the same seed gives the same verdict."""
    min_rows: int = 50
    """Fewest labelled rows for a verdict: on fewer the verdict is ``insufficient_labels`` (neither degraded nor
    fine)."""
    min_class_rows: int = 10
    """For ``roc_auc`` and ``f1_macro``: fewest labelled rows of every class (of the champion's classes) for a
    verdict; on fewer the verdict is ``insufficient_labels``. Ten keeps resamples lacking a class below one in
    twenty thousand."""
    slice_columns: tuple[str, ...] | None = None
    """Categorical columns whose every value is scored on its own; ``None``: the champion's categorical features."""
    min_slice_rows: int = 30
    """Slices with fewer labelled rows get no value (reported as skipped)."""

    def __post_init__(self) -> None:
        if self.primary_metric is not None and self.primary_metric not in (*METRICS, *REGRESSION_METRICS):
            raise ValueError(f"primary_metric={self.primary_metric!r}: use one of {list(METRICS)} (classification) "
                             f"or {list(REGRESSION_METRICS)} (regression), or null for the metric the champion was "
                             "promoted on")
        if isinstance(self.max_drop, bool) or not (math.isfinite(self.max_drop) and self.max_drop >= 0):
            raise ValueError(f"max_drop={self.max_drop!r}: use a finite number >= 0, e.g. 0.05")
        if self.floor is not None and (isinstance(self.floor, bool) or not math.isfinite(self.floor)):
            raise ValueError(f"floor={self.floor!r}: use a finite number, or null for no floor")
        if self.bootstrap not in BOOTSTRAP_METHODS:
            raise ValueError(f"bootstrap={self.bootstrap!r}: use one of {list(BOOTSTRAP_METHODS)}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence!r}: use a share in (0, 1), e.g. 0.9")
        for name in ("bootstrap_samples", "min_rows", "min_class_rows", "min_slice_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: use an integer >= 1")
        if isinstance(self.slice_columns, str):
            raise ValueError(f"slice_columns={self.slice_columns!r}: use a list of column names, "
                             f"e.g. [{self.slice_columns!r}]")
        if self.slice_columns is not None:
            self.slice_columns = tuple(self.slice_columns)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> QualityPolicy:
        """Build from a ``kfloop.yaml`` section or a pipeline parameter.

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        return section_from_dict(cls, data, "quality")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "slice_columns": None if self.slice_columns is None else list(self.slice_columns)}
