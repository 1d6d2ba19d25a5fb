"""The drift check's policy (:class:`DriftPolicy`, the ``drift`` settings section): when a batch counts as drifted,
which Evidently stattest and threshold each column gets, what the report holds and which engine reads the data.
Apart from :mod:`monitoring.drift` so that checking settings does not import Evidently: its stattest registry is
loaded only to check a method a policy names."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from data.engine import DataEngine
from data.settings import section_from_dict
from monitoring.inference_logs import parse_since

P_VALUE_METHODS = frozenset({"anderson", "chisquare", "cramer_von_mises", "empirical_mmd", "es", "fisher_exact",
                             "g_test", "ks", "mannw", "t_test", "TVD", "z"})
"""Evidently stattests whose score is a p-value: lower means drift (drifted when score < threshold)."""
DISTANCE_METHODS = frozenset({"ed", "hellinger", "jensenshannon", "kl_div", "psi", "wasserstein"})
"""Evidently stattests whose score is a distance: higher means drift (drifted when score >= threshold)."""
REPORT_KINDS = ("summary", "evidently_sample", "evidently_full")
"""What the HTML report holds (:attr:`DriftPolicy.report`)."""


def registered_kinds(method: str) -> list[str]:
    """Column kinds Evidently's stattest registry allows ``method`` for (empty when it is not registered). Loads
    Evidently (seconds of import) on first use: only a policy that names a method asks, so a config without one is
    checked without it."""
    from evidently.legacy.calculations.stattests.registry import get_registered_stattest
    from evidently.legacy.core import ColumnType

    kinds = []
    for kind, column_type in (("numeric", ColumnType.Numerical), ("categorical", ColumnType.Categorical)):
        try:
            get_registered_stattest(method, column_type)
        except ValueError:  # StatTestNotFoundError or StatTestInvalidFeatureTypeError
            continue
        kinds.append(kind)
    return kinds


def score_direction(method: str) -> Literal["p_value", "distance"]:
    """Which way an Evidently stattest's score points: ``p_value`` (drift when score < threshold) or ``distance``
    (drift when score >= threshold).

    Raises:
        ValueError: ``method`` is not an Evidently stattest for numeric or categorical columns.
    """
    _check_method(method, "method")
    return "p_value" if method in P_VALUE_METHODS else "distance"


def _check_method(method: Any, where: str) -> None:
    if not isinstance(method, str) or not registered_kinds(method):
        raise ValueError(f"{where}={method!r} is not an Evidently drift method for numeric or categorical columns; "
                         f"use one of {sorted(P_VALUE_METHODS | DISTANCE_METHODS)}, or None for Evidently's choice")
    assert method in P_VALUE_METHODS | DISTANCE_METHODS, f"Evidently stattest {method!r} has no known direction"


def _check_threshold(threshold: Any, method: str | None, where: str) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < math.inf:
        raise ValueError(f"{where}={threshold!r}: use a positive number, e.g. 0.05 for a p-value method or 0.1 for "
                         "a distance")
    if method is None:
        raise ValueError(f"{where}={threshold!r} is set without a method: Evidently then picks p-value tests (lower "
                         "means drift) for references up to 1000 rows and distances (higher means drift) above, so "
                         "the threshold would flip meaning; set the method too")
    if method in P_VALUE_METHODS and threshold >= 1:
        raise ValueError(f"{where}={threshold!r}: {method!r} scores a p-value, so use a threshold in (0, 1), "
                         "e.g. 0.05")


@dataclass(kw_only=True, slots=True)
class ColumnDriftOverride:
    """Drift method and/or threshold for one column, replacing the policy-wide ones."""

    method: str | None = None
    """Evidently stattest for this column (a name in ``P_VALUE_METHODS`` or ``DISTANCE_METHODS``); None keeps the
    policy's ``method``."""
    threshold: float | None = None
    """Threshold for this column; None keeps the policy's ``threshold`` (or the method's default)."""

    def __post_init__(self) -> None:
        if self.method is None and self.threshold is None:
            raise ValueError("a column override needs a method, a threshold or both; drop it to use the policy's")
        if self.method is not None:
            _check_method(self.method, "column override method")


@dataclass(kw_only=True, slots=True)
class DriftPolicy:
    """When a current batch counts as drifted from the reference."""

    drift_share: float = 0.5
    """Share of checked columns that must drift for the dataset to count as drifted, in (0, 1]."""
    method: str | None = None
    """Evidently stattest for every column (must suit both numeric and categorical ones, e.g. ``psi``); None lets
    Evidently choose per column: p-value tests for references up to 1000 rows, distances above."""
    threshold: float | None = None
    """Threshold for ``method``; None uses the method's default. Needs ``method``."""
    column_overrides: dict[str, ColumnDriftOverride] = field(default_factory=dict)
    """Per-column method and/or threshold; a plain mapping such as ``{"age": {"method": "psi", "threshold": 0.2}}``
    is accepted too."""
    include_predictions: bool = True
    """Also check the ``prediction`` column (the champion's predicted class) when both frames have it."""
    min_rows: int = 30
    """Fewest rows the reference and the current batch must each have: a verdict on fewer is noise, so the
    check fails (status unknown) instead of calling the batch stable."""
    max_schema_violation_share: float | None = 0.01
    """Share of the current rows outside the schema in one column (unseen category, out of range, unexpected
    null, wrong type) above which the batch counts as drifted by itself, whatever the stattests say; None turns
    the rule off."""
    report: Literal["summary", "evidently_sample", "evidently_full"] = "summary"
    """The HTML report: ``summary`` a page built from the verdicts and both sides' summaries (null shares, mean,
    standard deviation, percentiles, top categories), fast at any size; ``evidently_sample`` Evidently's
    ``DataDriftPreset`` report on a seeded sample of ``report_sample_rows`` rows of each side; ``evidently_full``
    Evidently's report on every row, its verdicts checked against kfloop's (minutes and gigabytes at millions of
    rows; needs the reference table, not a profile)."""
    report_sample_rows: int = 20_000
    """Rows of each side in Evidently's sampled report."""
    engine: Literal["local", "ray"] = "local"
    """Who reads and sketches the data: ``local`` this process, chunk by chunk; ``ray`` Ray Data on the Ray
    cluster at ``ray_address``, block by block with the same per-chunk code, the partial results merged here
    (``pip install 'kfloop[ray]'``; the same verdicts, :mod:`monitoring.ray_drift`). Also the engine of the
    reference profile built at registration and of ``kfloop validate`` (:mod:`data.engine`)."""
    logs_since: str = "24h"
    """With inference logs as the current batch (``kfloop drift --current-logs``, the drift pipeline's
    ``current_logs_uri``): the requests logged in this window before now, e.g. ``24h``, ``30m``, ``7d``."""
    ray_address: str = ""
    """The Ray cluster of ``engine: ray``: a head's ``host:port``, ``ray://<head>:10001`` (the KubeRay head
    service, ``ray://<cluster>-head-svc.<namespace>.svc:10001``), ``auto`` inside a Ray pod; empty starts a local
    Ray for the check."""

    def __post_init__(self) -> None:
        share = self.drift_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"drift_share={share!r}: use a share in (0, 1], e.g. 0.5 for half of the columns")
        if self.method is not None:
            _check_method(self.method, "method")
        if self.threshold is not None:
            _check_threshold(self.threshold, self.method, "threshold")
        if not isinstance(self.include_predictions, bool):
            raise ValueError(f"include_predictions={self.include_predictions!r}: use true or false")
        if isinstance(self.min_rows, bool) or not isinstance(self.min_rows, int) or self.min_rows < 1:
            raise ValueError(f"min_rows={self.min_rows!r}: use an integer >= 1, e.g. 30")
        DataEngine(engine=self.engine, ray_address=self.ray_address)
        parse_since(self.logs_since)
        if self.report not in REPORT_KINDS:
            raise ValueError(f"report={self.report!r}: use one of {list(REPORT_KINDS)}")
        rows = self.report_sample_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < self.min_rows:
            raise ValueError(f"report_sample_rows={rows!r}: use an integer >= min_rows ({self.min_rows}), e.g. 20000")
        share = self.max_schema_violation_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 <= share < 1):
            raise ValueError(f"max_schema_violation_share={share!r}: use a share in [0, 1), e.g. 0.01 for 1% of "
                             "the rows, or null to turn the rule off")
        if not isinstance(self.column_overrides, Mapping):
            raise ValueError(f"column_overrides={self.column_overrides!r}: use a mapping of column name to "
                             '{"method": ..., "threshold": ...}')
        overrides = {}
        for column, override in self.column_overrides.items():
            if not isinstance(column, str) or not column:
                raise ValueError(f"column_overrides key {column!r}: use a column name")
            if isinstance(override, Mapping):
                unknown = sorted(set(override) - {"method", "threshold"})
                if unknown:
                    raise ValueError(f"column_overrides[{column!r}] has unknown keys {unknown}; use method and/or "
                                     "threshold")
                override = ColumnDriftOverride(**override)
            if not isinstance(override, ColumnDriftOverride):
                raise ValueError(f"column_overrides[{column!r}]={override!r}: use a ColumnDriftOverride or a "
                                 'mapping like {"method": "psi", "threshold": 0.2}')
            if override.threshold is not None:
                _check_threshold(override.threshold, override.method or self.method,
                                 f"column_overrides[{column!r}].threshold")
            overrides[column] = override
        self.column_overrides = overrides

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DriftPolicy:
        """Build a policy from a plain mapping (YAML, JSON or pipeline parameters).

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        return section_from_dict(cls, data, "drift")

    def method_for(self, column: str) -> str | None:
        """The stattest configured for ``column`` (its override, else ``method``); None means Evidently's choice."""
        override = self.column_overrides.get(column)
        return override.method if override is not None and override.method is not None else self.method

    def threshold_for(self, column: str) -> float | None:
        """The threshold configured for ``column`` (its override, else ``threshold``); None means the default."""
        override = self.column_overrides.get(column)
        return override.threshold if override is not None and override.threshold is not None else self.threshold
