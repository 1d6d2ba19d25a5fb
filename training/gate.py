"""The evaluation gate: is the challenger good enough to replace the champion on the same holdout?

Pure numpy/pandas/sklearn; nothing here touches MLflow or KFP. The rule, applied by :func:`evaluate`:

* every candidate, the first one included, must beat a trivial baseline on the same holdout: the majority class
  of the training split, with the training class shares as probabilities; beating it means a better primary
  metric and the policy's paired-bootstrap confidence;
* no champion: promote iff the primary metric clears ``floor`` and the baseline is beaten;
* champion present: also the absolute and the relative improvement, every slice of the declared slice
  columns, and the paired-bootstrap confidence against the champion must all pass; a tie keeps the incumbent;
* an undefined (NaN) metric never promotes.

Without ``promotion.primary_metric`` the metric is chosen from the target (:func:`default_primary_metric`).
The baseline is a probability matrix scored like any model, so a regression baseline (the training mean,
scored by rmse) is one more :data:`BASELINES` kind.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterator, NamedTuple

import numpy as np
import pandas as pd
from sklearn.metrics import accuracy_score, f1_score, log_loss, precision_recall_fscore_support, roc_auc_score

from data.settings import section_from_dict
from training.features import encode_target
from training.linear import KINDS as LINEAR_KINDS
from training.threshold import RARE_MINORITY_SHARE, predicted_index

METRICS = ("accuracy", "f1_macro", "roc_auc", "log_loss")
"""Metrics the gate computes for classification; all but ``log_loss`` are higher-is-better."""
REGRESSION_METRICS = ("rmse", "mae", "r2")
"""Metrics the gate computes for regression, in the target's units; ``r2`` is higher-is-better."""
LOWER_IS_BETTER = frozenset({"log_loss", "rmse", "mae"})
BASELINES = {"majority_class": "the majority class, with the training class shares as probabilities",
             "training_mean": "the training split's mean target, predicted for every row"}
"""The trivial model every candidate must beat, by kind."""
_BOOTSTRAP_CHUNK = 100
"""Resamples drawn and scored at once (bounds memory at chunk x rows)."""


@dataclass(kw_only=True, slots=True)
class PromotionPolicy:
    """When a challenger may replace the champion (see the module docstring for the rule)."""

    primary_metric: str | None = None
    """Classification: ``accuracy``, ``f1_macro``, ``roc_auc`` (higher is better) or ``log_loss`` (lower is
    better); regression: ``rmse``, ``mae`` (lower is better) or ``r2``. ``None``: chosen from the target
    (:func:`default_primary_metric`; ``rmse`` for regression), and the decision says why."""
    floor: float | None = None
    """Absolute bound the primary metric must clear for any promotion, in the metric's own units: a minimum in
    [0, 1] for ``accuracy``, ``f1_macro``, ``roc_auc``; a minimum <= 1 for ``r2``; for an error metric a maximum
    >= 0 (``rmse``, ``mae`` in the target's units, e.g. ``5`` means RMSE <= 5; ``log_loss`` in nats). ``None``: no
    bound. Checked against the metric when the policy names it, else when the gate has chosen it."""
    min_improvement: float = 0.0
    """Absolute gain over the champion the challenger must reach, in the metric's better direction and its own
    units (target units for ``rmse``/``mae``; at most 1 for a probability metric). A gain of exactly 0 (a tie)
    never promotes."""
    min_relative_improvement: float = 0.0
    """Gain divided by the champion's value (absolute) the challenger must reach."""
    slice_columns: tuple[str, ...] = ()
    """Categorical holdout columns whose every value (null included) is a slice checked on its own."""
    max_slice_regression: float = 0.05
    """Largest absolute loss on the primary metric any checked slice may show against the champion."""
    min_slice_rows: int = 30
    """Slices with fewer holdout rows are skipped (and reported as skipped)."""
    bootstrap_samples: int = 1000
    """Paired bootstrap resamples of the holdout used for ``confidence``."""
    bootstrap_seed: int = 0
    """Seed of the resampling; the same seed gives the same decision."""
    required_confidence: float = 0.9
    """Share of resamples on which the challenger must strictly beat the champion on the primary metric."""
    require_beat_linear: bool = False
    """Also require the challenger to beat the linear baseline (logistic or linear regression on the same
    features and training split) as it must beat the trivial one: a better primary metric with
    ``required_confidence``. ``False``: the comparison is reported in every decision but does not gate."""

    def __post_init__(self) -> None:
        if self.primary_metric is not None and self.primary_metric not in (*METRICS, *REGRESSION_METRICS):
            raise ValueError(f"primary_metric={self.primary_metric!r}: use one of {list(METRICS)} (classification) "
                             f"or {list(REGRESSION_METRICS)} (regression)")
        if self.floor is not None and (isinstance(self.floor, bool) or not math.isfinite(self.floor)):
            raise ValueError(f"floor={self.floor}: use a finite number, or null for no floor")
        for name in ("min_improvement", "min_relative_improvement", "max_slice_regression"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value}: use a finite number >= 0")
        if self.primary_metric is not None:
            check_units(self.primary_metric, floor=self.floor, min_improvement=self.min_improvement)
        if isinstance(self.slice_columns, str):
            raise ValueError(f"slice_columns={self.slice_columns!r}: use a list of column names, "
                             f"e.g. [{self.slice_columns!r}]")
        self.slice_columns = tuple(self.slice_columns)
        if len(set(self.slice_columns)) != len(self.slice_columns):
            raise ValueError(f"slice_columns={list(self.slice_columns)}: list each column once")
        if self.min_slice_rows < 1:
            raise ValueError(f"min_slice_rows={self.min_slice_rows}: use an integer >= 1")
        if self.bootstrap_samples < 1:
            raise ValueError(f"bootstrap_samples={self.bootstrap_samples}: use an integer >= 1 (1000 is typical)")
        if not 0 <= self.required_confidence <= 1:
            raise ValueError(f"required_confidence={self.required_confidence}: use a share in [0, 1], e.g. 0.9")
        if not isinstance(self.require_beat_linear, bool):
            raise ValueError(f"require_beat_linear={self.require_beat_linear!r}: use true or false")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (see :meth:`from_dict`)."""
        return {**asdict(self), "slice_columns": list(self.slice_columns)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PromotionPolicy":
        """Build from a mapping such as :meth:`to_dict`'s output or a ``kfloop.yaml`` section.

        Raises:
            ValueError: an unknown key, or a value :meth:`__post_init__` rejects.
        """
        return section_from_dict(cls, d, "promotion")


def metric_units(metric: str) -> str:
    """What ``metric``'s values are: ``error`` (rmse, mae in the target's units; log_loss in nats: >= 0, lower
    is better), ``r2`` (at most 1, higher is better) or ``probability`` (accuracy, f1_macro, roc_auc: in
    [0, 1], higher is better)."""
    return "error" if metric in LOWER_IS_BETTER else "r2" if metric == "r2" else "probability"


def check_units(metric: str, *, floor: float | None, min_improvement: float) -> None:
    """Refuse a ``floor`` or ``min_improvement`` that cannot be a value of ``metric``, saying what the metric's
    values are. Checked when the policy names its metric, else once the gate has chosen it.

    Raises:
        ValueError: an error metric's ceiling below 0, an r2 floor above 1, a probability metric's floor outside
            [0, 1], or a probability metric's ``min_improvement`` above 1.
    """
    units = metric_units(metric)
    if floor is not None:
        if units == "error" and floor < 0:
            raise ValueError(f"promotion.floor={floor}: {metric} is an error metric (>= 0, "
                             f"{'in nats' if metric == 'log_loss' else 'in the target units'}, lower is better) and "
                             "its floor is a ceiling: use a maximum >= 0, e.g. the largest error you accept, or null")
        if units == "r2" and floor > 1:
            raise ValueError(f"promotion.floor={floor}: r2 is at most 1 (1 = perfect, 0 = the mean's error): use a "
                             "minimum <= 1, or null")
        if units == "probability" and not 0 <= floor <= 1:
            raise ValueError(f"promotion.floor={floor}: {metric} is a probability metric that lies in [0, 1]: use "
                             "a minimum in that range, or null")
    if units == "probability" and min_improvement > 1:
        raise ValueError(f"promotion.min_improvement={min_improvement}: {metric} is a probability metric that lies "
                         "in [0, 1], so no gain exceeds 1: use an absolute gain such as 0.01")


@dataclass(kw_only=True, slots=True)
class Decision:
    """The gate's verdict and the evidence behind it."""

    blessed: bool
    """Whether the challenger may be promoted."""
    reason: str
    """One or two sentences, with the numbers, saying why."""
    primary_metric: str
    """The primary metric the decision is about (the policy's, or the default for the target)."""
    metric_reason: str = ""
    """Why this primary metric: set in the policy, or what about the target chose it."""
    challenger_metrics: dict[str, float]
    """Every metric of :data:`METRICS` for the challenger on the holdout (NaN where undefined)."""
    champion_metrics: dict[str, float] | None = None
    """The same for the champion; ``None`` when there is no champion."""
    baseline_metrics: dict[str, float] | None = None
    """The same for the trivial baseline (see ``baseline``)."""
    linear_metrics: dict[str, float] | None = None
    """The same for the linear baseline (see ``linear``); ``None`` when the challenger recorded none."""
    linear: dict[str, Any] | None = None
    """The linear baseline: kind (a key of :data:`training.linear.KINDS`), description, threshold, rows fitted
    on, ``improvement`` of the challenger over it on the primary metric (positive is better), ``confidence``
    (share of paired resamples on which the challenger strictly beat it), ``beaten`` and ``gating``
    (``promotion.require_beat_linear``), ``detail``."""
    baseline: dict[str, Any] | None = None
    """The baseline: kind (a key of :data:`BASELINES`), description, ``predicts`` (the majority class),
    ``priors`` (training class shares), ``improvement`` over it on the primary metric (positive is better) and
    ``confidence`` (share of paired bootstrap resamples on which the challenger strictly beat it)."""
    improvement: float | None = None
    """Challenger minus champion on the primary metric, signed so that positive is better (for
    ``log_loss``: champion minus challenger)."""
    relative_improvement: float | None = None
    """``improvement`` over the champion's value (absolute)."""
    confidence: float | None = None
    """Share of paired bootstrap resamples on which the challenger strictly beat the champion."""
    interval: list[float] | None = None
    """5th and 95th percentile of ``improvement`` over the paired bootstrap resamples (``None`` without a
    champion)."""
    per_class: list[dict[str, Any]] = field(default_factory=list)
    """Per class: class, support (holdout rows), challenger and champion (``None`` without one) as
    ``{precision, recall, f1}`` of the predicted classes (the model's decision threshold applied)."""
    slices: list[dict[str, Any]] = field(default_factory=list)
    """Per slice: column, value, rows, challenger, champion, delta (challenger minus champion, raw), interval
    (5th and 95th percentile of delta over paired bootstrap resamples of the slice's rows), ok, skipped (why the
    slice was not checked, else ``None``), minority (the rarest training class on the slice: class, support,
    challenger and champion ``{precision, recall}``)."""
    checks: list[dict[str, Any]] = field(default_factory=list)
    """Per rule: name, passed, detail."""
    policy: dict[str, Any] = field(default_factory=dict)
    """The :class:`PromotionPolicy` applied, as a dict."""
    holdout_rows: int | None = None
    """Rows of the holdout every metric here was measured on (a quality check widens its interval by it)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: NaN becomes ``None`` (see :meth:`from_dict`)."""
        return json_ready(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Decision":
        """Inverse of :meth:`to_dict` (undefined metrics come back as NaN)."""
        def metrics(m: dict[str, Any] | None) -> dict[str, float] | None:
            return None if m is None else {k: math.nan if v is None else float(v) for k, v in m.items()}

        return cls(**{**d, "challenger_metrics": metrics(d["challenger_metrics"]),
                      "champion_metrics": metrics(d["champion_metrics"]),
                      "baseline_metrics": metrics(d.get("baseline_metrics")),
                      "linear_metrics": metrics(d.get("linear_metrics"))})


class Scored(NamedTuple):
    """One model's holdout probabilities (columns in the gate's class order) and its decision threshold."""

    proba: np.ndarray
    threshold: float | None = None
    """Binary models: the positive class is predicted at or above it; ``None``: the most probable class."""

    @property
    def predicted(self) -> np.ndarray:
        """Predicted class index per row."""
        return predicted_index(self.proba, self.threshold)

    def rows(self, mask: np.ndarray) -> "Scored":
        """The same model on a subset of rows."""
        return Scored(self.proba[mask], self.threshold)


def default_primary_metric(priors: np.ndarray) -> tuple[str, str]:
    """``(metric, why)`` for a target whose training class shares are ``priors``: ROC AUC for a binary target
    with a rare minority class (below :data:`RARE_MINORITY_SHARE`), macro F1 for multi-class, else accuracy."""
    k, minority = len(priors), float(np.min(priors))
    if k > 2:
        return "f1_macro", (f"default for a multi-class target ({k} classes): macro F1 weighs every class "
                            "alike, so always answering the majority scores low")
    if minority < RARE_MINORITY_SHARE:
        return "roc_auc", (f"default for a binary target whose minority class is rare ({minority:.1%} of training "
                           f"rows < {RARE_MINORITY_SHARE:.0%}): accuracy would reward always answering the "
                           "majority; ROC AUC ranks")
    return "accuracy", (f"default for a binary target with minority class share {minority:.1%} "
                        f">= {RARE_MINORITY_SHARE:.0%}")


def majority_baseline(priors: np.ndarray, n_rows: int) -> Scored:
    """The ``majority_class`` baseline on ``n_rows`` rows: every row gets the training class shares."""
    return Scored(np.tile(np.asarray(priors, dtype=np.float64), (n_rows, 1)))


def compute_metrics(y_true_idx: np.ndarray, proba: np.ndarray, classes: list,
                    threshold: float | None = None) -> dict[str, float]:
    """Accuracy, macro F1, ROC AUC and log loss of ``proba`` (rows x classes, columns in ``classes`` order).

    Accuracy and F1 score the predicted classes (:func:`training.threshold.predicted_index` with ``threshold``).
    ROC AUC: binary uses ``classes[1]`` as the positive class; multi-class is one-vs-rest, macro-averaged.
    A metric that is undefined on these rows (ROC AUC when a class is absent from ``y_true_idx``, or every
    metric when ``proba`` holds non-finite values) is NaN.

    Regression (``classes`` empty): ``y_true_idx`` holds the true values and ``proba`` the predicted ones (one
    column); see :func:`regression_metrics`.

    Raises:
        ValueError: shapes disagree or a label index is out of range.
    """
    if not classes:
        return regression_metrics(np.asarray(y_true_idx, dtype=np.float64), np.asarray(proba, dtype=np.float64)[:, 0])
    y, p = _check_inputs(y_true_idx, proba, classes)
    if not np.isfinite(p).all():
        return {m: math.nan for m in METRICS}
    labels = np.arange(len(classes))
    pred = predicted_index(p, threshold)
    out = {"accuracy": float(accuracy_score(y, pred)),
           "f1_macro": float(f1_score(y, pred, average="macro", zero_division=0)),
           "roc_auc": math.nan,
           "log_loss": float(log_loss(y, p, labels=labels))}
    if np.unique(y).size == len(classes):
        out["roc_auc"] = float(roc_auc_score(y, p[:, 1]) if len(classes) == 2 else
                               roc_auc_score(y, p, multi_class="ovr", average="macro", labels=labels))
    return out


def regression_metrics(y: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """RMSE, MAE (the target's units) and R² of ``predicted`` against ``y``; all NaN when a prediction is not
    finite, R² NaN when ``y`` is constant.

    Raises:
        ValueError: no rows, or lengths differ.
    """
    if len(y) == 0 or len(y) != len(predicted):
        raise ValueError(f"{len(y)} true values and {len(predicted)} predictions: pass the same, non-empty rows")
    if not np.isfinite(predicted).all():
        return {m: math.nan for m in REGRESSION_METRICS}
    w = np.ones((1, len(y)))
    return {m: float(_resampled_metric(m, w, y, predicted[:, None])[0]) for m in REGRESSION_METRICS}


def class_figures(y_true_idx: np.ndarray, predicted: np.ndarray, n_classes: int) -> dict[str, np.ndarray]:
    """Per class index: ``precision``, ``recall``, ``f1`` (0 where undefined) and ``support`` (true rows)."""
    p, r, f, support = precision_recall_fscore_support(y_true_idx, predicted, labels=range(n_classes),
                                                       zero_division=0)
    return {"precision": p, "recall": r, "f1": f, "support": support}


def align_proba(proba: np.ndarray, proba_classes: list, classes: list) -> np.ndarray:
    """Reorder ``proba`` (columns in ``proba_classes`` order) into ``classes`` order, e.g. to score a
    champion trained on a different class set; a class the model does not know gets probability 0.

    Raises:
        ValueError: the model predicts a class outside ``classes`` (gate models on the same class set).
    """
    extra = [c for c in proba_classes if c not in classes]
    if extra:
        raise ValueError(f"the model predicts classes {extra} that are not in {classes}; evaluate both models "
                         "on the same class set")
    out = np.zeros((proba.shape[0], len(classes)), dtype=np.float64)
    for j, c in enumerate(proba_classes):
        out[:, classes.index(c)] = proba[:, j]
    return out


def evaluate(*, y_true: Any, challenger_proba: np.ndarray, champion_proba: np.ndarray | None, classes: list,
             holdout: pd.DataFrame, policy: PromotionPolicy, train_priors: np.ndarray | None = None,
             challenger_threshold: float | None = None, champion_threshold: float | None = None,
             train_mean: float | None = None, linear: dict[str, Any] | None = None) -> Decision:
    """Apply ``policy`` to the challenger (and the champion, if any) scored on the same holdout rows.

    ``y_true`` holds the holdout's labels (values of ``classes``); both probability matrices have their
    columns in ``classes`` order (see :func:`align_proba`); ``holdout`` supplies the slice columns.
    Regression: ``classes`` is empty, ``y_true`` holds the true values, the "probability matrices" one column of
    predicted values, and the baseline predicts ``train_mean`` (``None``: the holdout's own mean).
    ``train_priors`` are the class shares of the challenger's training split (the baseline's probabilities and
    what the default metric is chosen from); ``None`` takes the holdout's own shares, a baseline at least as
    strong. The thresholds are the models' decision thresholds (binary; ``None``: most probable class).
    ``linear``: the linear baseline's record (:func:`training.linear.fit_linear`'s, without its coefficients)
    with ``proba`` (its holdout probabilities or values, like the challenger's) and ``threshold``; compared in
    every decision, gating with ``policy.require_beat_linear``.

    Raises:
        ValueError: a label is not in ``classes``, shapes disagree, or a slice column is not in ``holdout``.
    """
    regression = not classes
    y = (np.asarray(y_true, dtype=np.float64) if regression else
         encode_target(pd.Series(np.asarray(y_true, dtype=object), name="y_true"), classes))
    if len(holdout) != len(y):
        raise ValueError(f"holdout has {len(holdout)} rows but y_true has {len(y)}; pass the same rows")
    missing = [c for c in policy.slice_columns if c not in holdout.columns]
    if missing:
        raise ValueError(f"slice columns {missing} are not in the holdout; columns are {list(holdout.columns)}")
    if regression:
        priors = np.ones(0)
        mean = float(np.mean(y)) if train_mean is None else float(train_mean)
        if policy.primary_metric in METRICS:
            raise ValueError(f"primary_metric={policy.primary_metric!r} is a classification metric; this is a "
                             f"regression target: use one of {list(REGRESSION_METRICS)}")
    else:
        priors = (np.bincount(y, minlength=len(classes)) / len(y) if train_priors is None else
                  np.asarray(train_priors, dtype=np.float64))
        if priors.shape != (len(classes),):
            raise ValueError(f"train_priors has {priors.size} shares; expected one per class of {classes}")
        if policy.primary_metric in REGRESSION_METRICS:
            raise ValueError(f"primary_metric={policy.primary_metric!r} is a regression metric; this is a "
                             f"classification target: use one of {list(METRICS)}")
    if policy.primary_metric is None:
        metric, why = (("rmse", "default for a regression target: root mean squared error, in the target's units")
                       if regression else default_primary_metric(priors))
        check_units(metric, floor=policy.floor, min_improvement=policy.min_improvement)
        policy = replace(policy, primary_metric=metric)
    else:
        metric, why = policy.primary_metric, "set in promotion.primary_metric"
    chal_s = Scored(np.asarray(challenger_proba, dtype=np.float64), challenger_threshold)
    champ_s = None if champion_proba is None else Scored(np.asarray(champion_proba, dtype=np.float64),
                                                         champion_threshold)
    base_s = Scored(np.full((len(y), 1), mean)) if regression else majority_baseline(priors, len(y))
    chal = compute_metrics(y, chal_s.proba, classes, chal_s.threshold)
    champ = None if champ_s is None else compute_metrics(y, champ_s.proba, classes, champ_s.threshold)
    base = compute_metrics(y, base_s.proba, classes)
    if policy.require_beat_linear and linear is None:
        raise ValueError("promotion.require_beat_linear is set but the challenger recorded no linear baseline "
                         "(trained before kfloop fitted one): retrain it, or set require_beat_linear: false")
    lin_s = None if linear is None else Scored(np.asarray(linear["proba"], dtype=np.float64), linear["threshold"])
    lin = None if lin_s is None else compute_metrics(y, lin_s.proba, classes, lin_s.threshold)
    common = {"primary_metric": metric, "metric_reason": why, "challenger_metrics": chal, "champion_metrics": champ,
              "baseline_metrics": base, "linear_metrics": lin,
              "per_class": _per_class(y, chal_s, champ_s, classes),
              "policy": policy.to_dict(), "holdout_rows": len(y)}
    undefined = {"improvement": None, "relative_improvement": None, "confidence": None}
    defined = _defined_check({"challenger": chal[metric]} if champ is None else
                             {"challenger": chal[metric], "champion": champ[metric]}, metric)
    if not defined["passed"]:
        return Decision(blessed=False, reason=f"reject: {defined['detail']}", checks=[defined], **undefined,
                        **common)
    floor = _floor_check(metric, chal[metric], policy.floor)
    baseline, beats_baseline = _baseline(y, chal_s, base_s, chal[metric], base[metric], classes, priors, policy)
    common["baseline"] = baseline
    gating = []
    if lin_s is not None:
        common["linear"], beats_linear = _linear(y, chal_s, lin_s, chal[metric], lin[metric], linear, policy)
        gating = [beats_linear] if policy.require_beat_linear else []
    if champ is None:
        checks = [defined, floor, beats_baseline, *gating]
        blessed = all(c["passed"] for c in checks)
        reason = (f"promote: {floor['detail']} (no champion)" if blessed else
                  "reject: " + "; ".join(c["detail"] for c in checks if not c["passed"]) + " (no champion)")
        return Decision(blessed=blessed, reason=reason + _linear_note(common), checks=checks, **undefined,
                        **common)

    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    improvement = sign * (chal[metric] - champ[metric])
    relative = improvement / abs(champ[metric]) if champ[metric] != 0 else (math.inf if improvement > 0 else 0.0)
    slices = _slices(y, chal_s, champ_s, classes, holdout, policy,
                     minority=None if regression else int(np.argmin(priors)))
    gains = _bootstrap_improvements(y, chal_s, champ_s, metric, policy)
    confidence = float(np.count_nonzero(gains > 0)) / policy.bootstrap_samples
    checks = [defined, floor, beats_baseline, *gating,
              _improvement_check(metric, chal[metric], champ[metric], improvement, policy.min_improvement),
              {"name": "min_relative_improvement", "passed": relative >= policy.min_relative_improvement,
               "detail": f"relative improvement {relative:+.3%} "
                         f"{'>=' if relative >= policy.min_relative_improvement else '<'} "
                         f"{policy.min_relative_improvement:.3%}"},
              _slice_check(metric, slices, policy.max_slice_regression),
              {"name": "confidence", "passed": confidence >= policy.required_confidence,
               "detail": f"confidence {confidence:.3f} {'>=' if confidence >= policy.required_confidence else '<'} "
                         f"{policy.required_confidence}"}]
    blessed = all(c["passed"] for c in checks)
    if blessed:
        by_name = {c["name"]: c["detail"] for c in checks}
        reason = f"promote: {by_name['min_improvement']}, {by_name['confidence']}, {by_name['slices']}"
    else:
        reason = "reject: " + "; ".join(c["detail"] for c in checks if not c["passed"])
    return Decision(blessed=blessed, reason=reason + _linear_note(common), improvement=improvement,
                    relative_improvement=relative,
                    confidence=confidence, interval=bootstrap_interval(gains), slices=slices, checks=checks,
                    **common)


def kfp_metrics(decision: Decision) -> dict[str, float]:
    """Flat scalars for a KFP Metrics artifact: ``blessed`` (0/1), ``challenger_<metric>``,
    ``champion_<metric>``, ``baseline_<metric>``, ``improvement``, ``relative_improvement``, ``confidence``,
    ``linear_<metric>``, ``confidence_vs_baseline``, ``confidence_vs_linear``, ``slices_failed``,
    ``slices_skipped``. Undefined values (NaN, no champion,
    infinite) are left out."""
    out: dict[str, float] = {"blessed": float(decision.blessed)}
    for role, metrics in (("challenger", decision.challenger_metrics), ("champion", decision.champion_metrics),
                          ("baseline", decision.baseline_metrics), ("linear", decision.linear_metrics)):
        out.update({f"{role}_{k}": float(v) for k, v in (metrics or {}).items()})
    out.update(improvement=decision.improvement, relative_improvement=decision.relative_improvement,
               confidence=decision.confidence,
               confidence_vs_baseline=(decision.baseline or {}).get("confidence"),
               confidence_vs_linear=(decision.linear or {}).get("confidence"))
    if decision.champion_metrics is not None:
        out["slices_failed"] = float(sum(not s["ok"] for s in decision.slices))
        out["slices_skipped"] = float(sum(s["skipped"] is not None for s in decision.slices))
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


def _check_inputs(y_true_idx: np.ndarray, proba: np.ndarray, classes: list) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y_true_idx)
    p = np.asarray(proba, dtype=np.float64)
    if p.ndim != 2 or p.shape != (len(y), len(classes)):
        raise ValueError(f"proba has shape {p.shape}; expected (rows={len(y)}, classes={len(classes)}) "
                         f"for classes {classes}")
    if len(y) == 0:
        raise ValueError("no rows to evaluate: the holdout is empty")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= len(classes):
        raise ValueError(f"y_true_idx must be class indices in [0, {len(classes)}); got dtype {y.dtype}, "
                         f"values {np.unique(y)[:5].tolist()}")
    return y, p


def _better(metric: str, a: float, b: float) -> bool:
    return a < b if metric in LOWER_IS_BETTER else a > b


def _defined_check(values: dict[str, float], metric: str) -> dict[str, Any]:
    undefined = [role for role, v in values.items() if not math.isfinite(v)]
    detail = (f"{metric} is defined for {' and '.join(values)}" if not undefined else
              f"{' and '.join(undefined)} {metric} is undefined (NaN: non-finite probabilities, or a class "
              "absent from the holdout)")
    return {"name": "metrics_defined", "passed": not undefined, "detail": detail}


def _floor_check(metric: str, value: float, floor: float | None) -> dict[str, Any]:
    if floor is None:
        return {"name": "floor", "passed": True, "detail": f"{metric} {value:.3f} (no floor set)"}
    lower = metric in LOWER_IS_BETTER
    passed = bool(value <= floor if lower else value >= floor)
    op = ("<=" if passed else ">") if lower else (">=" if passed else "<")
    return {"name": "floor", "passed": passed,
            "detail": f"{metric} {value:.3f} {op} {'ceiling' if lower else 'floor'} {floor:.3f}"}


def _improvement_check(metric: str, chal: float, champ: float, improvement: float, minimum: float) -> dict:
    head = f"{metric} {chal:.3f} vs champion {champ:.3f}"
    if improvement == 0:
        return {"name": "min_improvement", "passed": False, "detail": f"{head} is a tie; the incumbent stays"}
    passed = improvement > 0 and improvement >= minimum
    return {"name": "min_improvement", "passed": passed,
            "detail": f"{head} ({improvement:+.3f} {'>=' if passed else '<'} {minimum:.3f})"}


def _baseline(y: np.ndarray, chal: Scored, base: Scored, chal_value: float, base_value: float, classes: list,
              priors: np.ndarray, policy: PromotionPolicy) -> tuple[dict[str, Any], dict[str, Any]]:
    """The baseline's record for the decision, and the check that the challenger beats it (strictly on the
    holdout, and on at least ``required_confidence`` of the paired bootstrap resamples)."""
    metric = policy.primary_metric
    improvement = (base_value - chal_value) if metric in LOWER_IS_BETTER else (chal_value - base_value)
    confidence = float(np.count_nonzero(_bootstrap_improvements(y, chal, base, metric, policy) > 0)
                       ) / policy.bootstrap_samples
    if classes:
        kind, predicts, how = "majority_class", classes[int(np.argmax(priors))], "training priors"
    else:
        kind, predicts, how = "training_mean", float(base.proba[0, 0]), "the training mean"
    record = {"kind": kind, "description": BASELINES[kind], "predicts": predicts,
              "priors": [float(v) for v in priors], "improvement": improvement, "confidence": confidence}
    passed = bool(improvement > 0 and confidence >= policy.required_confidence)
    head = f"{metric} {chal_value:.3f} vs baseline {base_value:.3f} (always {predicts!r}, {how})"
    detail = (f"{head}: beaten with confidence {confidence:.3f} >= {policy.required_confidence}" if passed else
              f"{head}: not beaten ({improvement:+.3f}, confidence {confidence:.3f} "
              f"{'>=' if confidence >= policy.required_confidence else '<'} {policy.required_confidence})")
    return record, {"name": "baseline", "passed": passed, "detail": detail}


def _linear(y: np.ndarray, chal: Scored, lin: Scored, chal_value: float, lin_value: float, record: dict[str, Any],
            policy: PromotionPolicy) -> tuple[dict[str, Any], dict[str, Any]]:
    """The linear baseline's record for the decision, and the check that the challenger beats it (as the trivial
    baseline must be beaten); the check gates only with ``require_beat_linear``."""
    metric = policy.primary_metric
    improvement = (lin_value - chal_value) if metric in LOWER_IS_BETTER else (chal_value - lin_value)
    confidence = float(np.count_nonzero(_bootstrap_improvements(y, chal, lin, metric, policy) > 0)
                       ) / policy.bootstrap_samples
    beaten = bool(improvement > 0 and confidence >= policy.required_confidence)
    head = f"{metric} {chal_value:.3f} vs linear baseline {lin_value:.3f} ({record['kind']})"
    detail = (f"{head}: beaten with confidence {confidence:.3f} >= {policy.required_confidence}" if beaten else
              f"{head}: not beaten ({improvement:+.3f}, confidence {confidence:.3f}); a linear model does as well "
              "or better")
    out = {"kind": record["kind"], "description": LINEAR_KINDS[record["kind"]], "threshold": record["threshold"],
           "rows": record.get("rows"), "improvement": improvement, "confidence": confidence, "beaten": beaten,
           "gating": policy.require_beat_linear, "detail": detail}
    return out, {"name": "linear_baseline", "passed": beaten, "detail": detail}


def _linear_note(common: dict[str, Any]) -> str:
    """The reason's last sentence when the linear baseline was not beaten and does not gate (else nothing)."""
    lin = common.get("linear")
    return "" if lin is None or lin["beaten"] or lin["gating"] else f". Note: {lin['detail']}"


def _per_class(y: np.ndarray, chal: Scored, champ: Scored | None, classes: list) -> list[dict[str, Any]]:
    """Precision, recall and F1 per class of the challenger (and the champion), with the class's support (none
    for regression)."""
    if not classes:
        return []

    def figures(s: Scored | None) -> list[dict[str, float]] | None:
        if s is None or not np.isfinite(s.proba).all():
            return None
        f = class_figures(y, s.predicted, len(classes))
        return [{k: float(f[k][i]) for k in ("precision", "recall", "f1")} for i in range(len(classes))]

    support = np.bincount(y, minlength=len(classes))
    chal_f, champ_f = figures(chal), figures(champ)
    return [{"class": c, "support": int(support[i]), "challenger": None if chal_f is None else chal_f[i],
             "champion": None if champ_f is None else champ_f[i]} for i, c in enumerate(classes)]


def _slices(y: np.ndarray, chal: Scored, champ: Scored, classes: list, holdout: pd.DataFrame,
            policy: PromotionPolicy, *, minority: int | None) -> list[dict[str, Any]]:
    """Each value of each slice column scored for both models (regression: on the per-row errors, so
    ``minority`` is ``None``)."""
    metric, out = policy.primary_metric, []
    for col, value, mask in slice_masks(holdout, policy.slice_columns):
        rows = int(mask.sum())
        a, b = chal.rows(mask), champ.rows(mask)
        chal_value = compute_metrics(y[mask], a.proba, classes, a.threshold)[metric]
        champ_value = compute_metrics(y[mask], b.proba, classes, b.threshold)[metric]
        regression = (chal_value - champ_value) if metric in LOWER_IS_BETTER else (champ_value - chal_value)
        skipped = (f"{rows} rows < min_slice_rows {policy.min_slice_rows}" if rows < policy.min_slice_rows
                   else f"{metric} undefined on this slice" if not math.isfinite(regression) else None)
        sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
        deltas = sign * _bootstrap_improvements(y[mask], a, b, metric, policy)
        out.append({"column": col, "value": value, "rows": rows,
                    "challenger": chal_value, "champion": champ_value, "delta": chal_value - champ_value,
                    "interval": bootstrap_interval(deltas),
                    "ok": skipped is not None or regression <= policy.max_slice_regression,
                    "skipped": skipped, "minority": None if minority is None else _minority(y[mask], a, b, classes, minority)})
    return out


def slice_masks(frame: pd.DataFrame, columns: tuple[str, ...] | list[str]) -> Iterator[tuple[str, str | None,
                                                                                              np.ndarray]]:
    """``(column, value, row mask)`` for every value of each of ``columns`` (as text; null is ``None``), in
    sorted order: the slices the gate and the quality check score on their own."""
    for col in columns:
        keys = frame[col].astype("string").fillna("<null>").to_numpy(dtype=object)
        for value in sorted(set(keys.tolist())):
            yield col, None if value == "<null>" else value, keys == value


def _minority(y: np.ndarray, chal: Scored, champ: Scored, classes: list, k: int) -> dict[str, Any]:
    """Precision and recall of class index ``k`` for both models on these rows."""
    def figures(s: Scored) -> dict[str, float]:
        f = class_figures(y, s.predicted, len(classes))
        return {"precision": float(f["precision"][k]), "recall": float(f["recall"][k])}

    return {"class": classes[k], "support": int(np.count_nonzero(y == k)), "challenger": figures(chal),
            "champion": figures(champ)}


def _slice_check(metric: str, slices: list[dict[str, Any]], max_regression: float) -> dict[str, Any]:
    failed = [s for s in slices if not s["ok"]]
    skipped = sum(s["skipped"] is not None for s in slices)
    tail = f" ({skipped} small or undefined slice(s) skipped)" if skipped else ""
    if not slices:
        return {"name": "slices", "passed": True, "detail": "no slice columns declared"}
    if not failed:
        return {"name": "slices", "passed": True,
                "detail": f"no slice regressed more than {max_regression:.3f}{tail}"}
    verb = "rose" if metric in LOWER_IS_BETTER else "fell"
    parts = [f"slice {s['column']}={s['value']} {metric} {verb} {abs(s['delta']):.3f} > {max_regression:.3f} "
             f"({s['challenger']:.3f} vs champion {s['champion']:.3f}, {s['rows']} rows)" for s in failed]
    return {"name": "slices", "passed": False, "detail": "; ".join(parts)}


def _bootstrap_improvements(y: np.ndarray, chal: Scored, champ: Scored, metric: str,
                            policy: PromotionPolicy) -> np.ndarray:
    """The challenger's improvement over ``champ`` (positive is better) on each paired resample (the same rows
    for both models); NaN where the metric is undefined on a resample."""
    gains = []
    for w in resample_weights(len(y), policy.bootstrap_samples, policy.bootstrap_seed):
        a = _resampled_metric(metric, w, y, chal.proba, chal.threshold)
        c = _resampled_metric(metric, w, y, champ.proba, champ.threshold)
        gains.append(c - a if metric in LOWER_IS_BETTER else a - c)
    return np.concatenate(gains)


def resample_weights(n: int, samples: int, seed: int) -> Iterator[np.ndarray]:
    """``samples`` bootstrap resamples of ``n`` rows, in chunks of row weights (resamples x rows: how often each
    row was drawn); the same seed gives the same resamples, so models scored on them are paired."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < samples:
        b = min(_BOOTSTRAP_CHUNK, samples - done)
        idx = rng.integers(0, n, size=(b, n))
        counts = np.bincount((idx + n * np.arange(b)[:, None]).ravel(), minlength=b * n).reshape(b, n)
        yield counts.astype(np.float64)
        done += b


def bootstrap_metric(y_true_idx: np.ndarray, scored: Scored, metric: str, *, samples: int,
                     seed: int) -> np.ndarray:
    """``metric`` of one model on each of :func:`resample_weights`' resamples (NaN where undefined): with the
    same ``seed``, resample for resample the rows the gate's paired bootstrap scores."""
    return np.concatenate([_resampled_metric(metric, w, y_true_idx, scored.proba, scored.threshold)
                           for w in resample_weights(len(y_true_idx), samples, seed)])


def bootstrap_interval(values: np.ndarray, level: float = 0.9) -> list[float] | None:
    """The central ``level`` interval (default: 5th and 95th percentile) of the finite ``values``; ``None`` when
    there are none."""
    finite = values[np.isfinite(values)]
    tail = 50 * (1 - level)
    return [float(v) for v in np.percentile(finite, [tail, 100 - tail])] if finite.size else None


def _resampled_metric(metric: str, w: np.ndarray, y: np.ndarray, p: np.ndarray,
                      threshold: float | None = None) -> np.ndarray:
    """``metric`` on each resample, given row weights ``w`` (resamples x rows: how often each row was drawn).
    Regression metrics read the predicted values from ``p[:, 0]`` and the true values from ``y``."""
    if metric in REGRESSION_METRICS:
        errors, total = p[:, 0] - y, w.sum(axis=1)
        squared = w @ errors ** 2
        if metric == "rmse":
            return np.sqrt(squared / total)
        if metric == "mae":
            return w @ np.abs(errors) / total
        spread = (w * (y[None, :] - (w @ y / total)[:, None]) ** 2).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(spread > 0, 1 - squared / spread, np.nan)
    n_classes = p.shape[1]
    if metric == "accuracy":
        return w @ (predicted_index(p, threshold) == y).astype(np.float64) / w.sum(axis=1)
    if metric == "log_loss":
        eps = np.finfo(np.float64).eps
        return w @ -np.log(np.clip(p[np.arange(len(y)), y], eps, 1.0)) / w.sum(axis=1)
    if metric == "f1_macro":
        onehot_true = np.eye(n_classes)[y]
        onehot_pred = np.eye(n_classes)[predicted_index(p, threshold)]
        tp = w @ (onehot_true * onehot_pred)
        support = w @ onehot_true + w @ onehot_pred
        present = support > 0
        f1 = np.divide(2 * tp, support, out=np.zeros_like(tp), where=present)
        return f1.sum(axis=1) / present.sum(axis=1)
    assert metric == "roc_auc", metric
    if n_classes == 2:
        return _weighted_auc(w, y == 1, p[:, 1])
    return np.mean([_weighted_auc(w, y == k, p[:, k]) for k in range(n_classes)], axis=0)


def _weighted_auc(w: np.ndarray, positive: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Mann-Whitney AUC per resample (ties count one half); NaN where a resample lacks a class."""
    order = np.argsort(score, kind="stable")
    s = score[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ws, pos = w[:, order], positive[order]
    p_w = np.add.reduceat(ws * pos, starts, axis=1)
    n_w = np.add.reduceat(ws, starts, axis=1) - p_w
    below = np.cumsum(n_w, axis=1) - n_w
    with np.errstate(invalid="ignore", divide="ignore"):
        return (p_w * (below + 0.5 * n_w)).sum(axis=1) / (p_w.sum(axis=1) * n_w.sum(axis=1))


def json_ready(obj: Any) -> Any:
    """``obj`` with numpy scalars as Python ones and NaN or infinite floats as ``None``, for JSON."""
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
