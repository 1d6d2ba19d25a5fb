"""The champion's quality on rows whose labels arrived, against what it scored on its holdout.

Pure numpy/pandas (Evidently only renders the report); nothing here touches MLflow or KFP. The rule, applied by
:func:`check_quality`: the primary metric on the labelled rows (``value``) is compared with the champion's
recorded holdout value (``baseline``); the drop is ``baseline - value`` in the metric's worse direction (the
gate's :data:`training.gate.LOWER_IS_BETTER` decides which way that is). The champion is degraded when

* the metric is beyond the policy's ``floor``, or
* the drop exceeds ``max_drop`` and the bootstrap says so with confidence: ``percentile``: even the better end of
  the central ``confidence`` interval of the value lies beyond ``baseline - max_drop``; ``paired``: on at least a
  ``confidence`` share of paired resamples the champion's lead over the trivial baseline (the gate's majority
  class with its training priors, scored on the same resampled rows) fell by more than ``max_drop`` from the lead
  recorded on the holdout, so a mere change of the class balance does not read as degradation (classifiers
  only).

The holdout value is itself an estimate: the bootstrap deviations of the labelled rows are widened by
``sqrt(1 + rows / holdout_rows)``, so the interval is that of the value minus the baseline under the hypothesis
that both come from one distribution (whose per-row variance the labelled rows estimate; a normal approximation
for the holdout's part, since its rows are not kept with the champion); the result's ``holdout_uncertainty``
says whether and how. Resamples on which the metric is undefined count as "no drop" (never dropped, so they widen
the interval on its better side) and are counted in ``undefined_resamples``.

Before any of that, the labels must suffice for the metric (:func:`label_counts`): at least ``min_rows`` rows,
and for ``roc_auc`` and ``f1_macro`` at least ``min_class_rows`` of every class. Short of that the verdict is
``insufficient_labels`` (not degraded; the check ran), with the counts it had and needed.

A regression champion is scored the same way on its predicted values (``classes`` empty, the values as the one
column of ``proba``) with the gate's regression metrics (rmse, mae, r2 in the target's units).
"""
from __future__ import annotations

import html
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from evidently import BinaryClassification, DataDefinition, Dataset, MulticlassClassification, Regression, Report
from evidently.presets import ClassificationPreset, RegressionPreset

from data.fileio import atomic_write_text
from data.tables import DataFileError
from data.validation import rows_named
from training.features import encode_target
from monitoring.quality_policy import QualityPolicy
from training.gate import (LOWER_IS_BETTER, METRICS, REGRESSION_METRICS, Scored, bootstrap_interval,
                           bootstrap_metric, compute_metrics, json_ready, majority_baseline, regression_metrics,
                           slice_masks)

VERDICTS = {"degraded": "DEGRADED", "not_degraded": "Not degraded", "insufficient_labels": "Insufficient labels"}
"""What a quality check can conclude, with its heading in the report; only ``degraded`` triggers a retraining."""
EVERY_CLASS_METRICS = frozenset({"roc_auc", "f1_macro"})
"""Metrics undefined or meaningless without enough rows of every class: ROC AUC ranks each class against the
rest; macro F1 averages the F1 of every class."""
PREDICTION_COLUMN = "prediction"
"""Column the Evidently report adds to the labelled rows: the champion's predicted class (or value)."""


@dataclass(kw_only=True, slots=True)
class Baseline:
    """What the champion's registration recorded, to compare with."""

    metric: str
    """The metric compared (the policy's, else the one the gate decided on)."""
    value: float
    """The champion's value of ``metric`` on its holdout."""
    trivial: float | None = None
    """The trivial baseline's value on the same holdout (needed by ``paired``)."""
    priors: list[float] | None = None
    """The champion's training class shares: the trivial baseline's probabilities (needed by ``paired``)."""
    slices: dict[tuple[str, str | None], float] | None = None
    """The champion's holdout value per (slice column, value), when the gate scored slices on ``metric``."""
    holdout_rows: int | None = None
    """Rows of the holdout ``value`` was measured on (its own sampling error); ``None``: not recorded, and the
    comparison treats ``value`` as exact (and says so)."""


@dataclass(kw_only=True, slots=True)
class QualityResult:
    """The verdict of one quality check; :meth:`to_dict` is ``kfloop quality --json``."""

    degraded: bool
    verdict: str
    """One of :data:`VERDICTS`: ``insufficient_labels`` when the labels do not suffice for ``metric``."""
    metric: str
    value: float
    """The metric on the labelled rows (NaN: undefined on them)."""
    baseline: float
    """The champion's holdout value."""
    ci_low: float | None
    """Lower end of the value's central ``confidence`` percentile interval, widened for the holdout's own error
    (``None``: not computed, or unbounded because resamples were undefined)."""
    ci_high: float | None
    rows: int
    """Labelled rows scored."""
    labels: dict[str, Any]
    """The labels the metric had and needed: ``rows``, ``min_rows``, ``per_class`` ({class: rows}; ``None`` for
    regression), ``min_per_class`` (``None`` when the metric needs no class count), ``short`` (what fell short)."""
    holdout_uncertainty: str
    """How the holdout value's own sampling error entered the comparison."""
    undefined_resamples: int = 0
    """Resamples on which the metric was undefined (counted as no drop)."""
    reason: str
    """Why (not) degraded, with the numbers."""
    confidence: float | None = None
    """``paired``: the share of resamples on which the drop exceeded ``max_drop``."""
    slices: list[dict[str, Any]]
    """Per slice: column, value, rows, score, baseline (holdout, when recorded), drop, interval, skipped."""
    policy: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: NaN becomes ``None``."""
        return json_ready(asdict(self))


def check_quality(*, y_true: Any, proba: np.ndarray, classes: list, threshold: float | None, rows: pd.DataFrame,
                  baseline: Baseline, policy: QualityPolicy) -> QualityResult:
    """Score the champion (``proba``: rows x classes in ``classes`` order, its decision ``threshold``; for a
    regression champion ``classes`` is empty and ``proba`` its predicted values as one column) on the labelled
    ``rows`` (``y_true`` their labels or true values) and apply ``policy`` against ``baseline``. Too few labels
    for the metric give the verdict ``insufficient_labels`` (see the module docstring).

    Raises:
        ValueError: a label the champion does not know, a metric of the other task, a slice column missing from
            ``rows``, the metric undefined on rows with enough labels (non-finite scores, a constant regression
            target), or ``paired`` without the recorded trivial baseline (or for a regression champion).
    """
    metric, champ = baseline.metric, Scored(np.asarray(proba, dtype=np.float64), threshold)
    if (metric in REGRESSION_METRICS) == bool(classes):
        task, metrics = ("a classifier", METRICS) if classes else ("a regression model", REGRESSION_METRICS)
        raise ValueError(f"quality.primary_metric={metric!r} does not score {task}: use one of {list(metrics)}")
    if not classes and policy.bootstrap == "paired":
        raise ValueError("bootstrap=paired compares a classifier's lead over its majority-class baseline; check a "
                         "regression champion with quality.bootstrap=percentile")
    y = (encode_target(pd.Series(np.asarray(y_true, dtype=object), name="target"), classes) if classes
         else np.asarray(y_true, dtype=np.float64))
    labels = label_counts(y, classes, metric, policy)
    widen, uncertainty = _holdout_widening(len(y), baseline.holdout_rows)
    common = {"metric": metric, "baseline": baseline.value, "rows": len(y), "labels": labels,
              "holdout_uncertainty": uncertainty, "policy": policy.to_dict()}
    if labels["short"]:
        value = _score(y, champ, classes, metric) if len(y) else math.nan
        return QualityResult(degraded=False, verdict="insufficient_labels", value=value, ci_low=None, ci_high=None,
                             reason=f"insufficient_labels: {'; '.join(labels['short'])}: no verdict on these rows, "
                                    "check again when more labels arrived (or lower quality.min_rows / "
                                    "min_class_rows)", slices=[], **common)
    value = _score(y, champ, classes, metric)
    if not math.isfinite(value):
        raise ValueError(f"{metric} is undefined on these {len(y)} labelled rows (non-finite scores, or a constant "
                         "target); choose another quality.primary_metric or check more rows")
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    limit = baseline.value - sign * policy.max_drop
    drop = sign * (baseline.value - value)
    raw = bootstrap_metric(y, champ, metric, samples=policy.bootstrap_samples, seed=policy.bootstrap_seed)
    undefined = int(np.count_nonzero(~np.isfinite(raw)))
    # the value minus the baseline, resample by resample; an undefined resample counts as no drop at all
    values = np.where(np.isfinite(raw), value + widen * (raw - value), sign * math.inf)
    tail = 50 * (1 - policy.confidence)
    ci_low, ci_high = (float(v) if math.isfinite(v) else None for v in np.percentile(values, [tail, 100 - tail]))
    head = (f"{metric} {value:.3f} on {len(y)} labelled rows vs {baseline.value:.3f} on the holdout "
            f"(drop {drop:+.3f}, max_drop {policy.max_drop:.3f})")
    share = None
    if policy.bootstrap == "paired":
        share = _paired_share(y, champ, classes, baseline, policy, widen)
        confident = share >= policy.confidence
        evidence = (f"the lead over the trivial baseline fell by more than {policy.max_drop:.3f} on "
                    f"{share:.1%} of paired resamples ({'>=' if confident else '<'} {policy.confidence:.0%})")
    else:
        better_end = ci_low if sign < 0 else ci_high
        confident = better_end is not None and sign * (limit - better_end) > 0
        shown = f"[{_fmt(ci_low)}, {_fmt(ci_high)}]"
        evidence = (f"{policy.confidence:.0%} interval {shown} {'lies wholly' if confident else 'does not lie wholly'}"
                    f" {'above' if sign < 0 else 'below'} {limit:.3f}")
    if undefined:
        evidence += f" ({undefined} of {policy.bootstrap_samples} resamples undefined, counted as no drop)"
    dropped = drop > policy.max_drop and confident
    below_floor = policy.floor is not None and sign * (policy.floor - value) > 0
    reasons = []
    if below_floor:
        reasons.append(f"{metric} {value:.3f} {'>' if sign < 0 else '<'} {'ceiling' if sign < 0 else 'floor'} "
                       f"{policy.floor:.3f}")
    if dropped:
        reasons.append(f"{head}; {evidence}")
    if reasons:
        reason = "degraded: " + "; ".join(reasons)
    elif drop > policy.max_drop:
        reason = f"not degraded: {head}, but not confidently: {evidence}"
    else:
        reason = f"not degraded: {head}"
    degraded = below_floor or dropped
    return QualityResult(degraded=degraded, verdict="degraded" if degraded else "not_degraded", value=value,
                         ci_low=ci_low, ci_high=ci_high, reason=reason, confidence=share,
                         undefined_resamples=undefined,
                         slices=_slices(y, champ, classes, rows, metric, baseline, policy), **common)


def label_counts(y: np.ndarray, classes: list, metric: str, policy: QualityPolicy) -> dict[str, Any]:
    """The labels ``metric`` had on the rows (``y``: class indices, or true values with ``classes`` empty) and
    those it needs (see :class:`QualityResult`'s ``labels``); ``short`` lists what fell short, empty when
    enough."""
    per_class = ({str(c): int(n) for c, n in zip(classes, np.bincount(y, minlength=len(classes)))} if classes
                 else None)
    needs_every = bool(classes) and metric in EVERY_CLASS_METRICS
    short = []
    if len(y) < policy.min_rows:
        short.append(f"{len(y)} labelled rows < quality.min_rows {policy.min_rows}")
    if needs_every:
        few = {c: n for c, n in per_class.items() if n < policy.min_class_rows}
        if few:
            short.append(f"{metric} needs >= {policy.min_class_rows} labelled rows of every class "
                         f"(quality.min_class_rows); had " + ", ".join(f"{n} of class {c!r}" for c, n in few.items()))
    return {"rows": len(y), "min_rows": policy.min_rows, "per_class": per_class,
            "min_per_class": policy.min_class_rows if needs_every else None, "short": short}


def _holdout_widening(rows: int, holdout_rows: int | None) -> tuple[float, str]:
    """The factor the labelled rows' bootstrap deviations are widened by for the holdout value's own error, and
    the sentence saying so."""
    if not holdout_rows:
        return 1.0, ("not accounted: the champion did not record its holdout's row count, so the holdout value is "
                     "treated as exact")
    factor = math.sqrt(1 + rows / holdout_rows)
    return factor, (f"widened: the bootstrap of the {rows} labelled rows scaled by sqrt(1 + {rows}/{holdout_rows}) "
                    f"= {factor:.3f}, the holdout's ({holdout_rows} rows) own error under the same per-row variance")


def _fmt(v: float | None) -> str:
    return "unbounded" if v is None else f"{v:.3f}"


def _paired_share(y: np.ndarray, champ: Scored, classes: list, baseline: Baseline, policy: QualityPolicy,
                  widen: float) -> float:
    """Share of paired resamples on which the champion's lead over the trivial baseline fell by more than
    ``max_drop`` from its recorded lead on the holdout (deviations widened by ``widen`` for the holdout's own
    error; undefined resamples count as not fallen)."""
    metric = baseline.metric
    if baseline.trivial is None or baseline.priors is None:
        raise ValueError(f"bootstrap=paired needs the trivial baseline's holdout {metric} and the champion's "
                         "training class shares, which this champion's registration did not record; use "
                         "quality.bootstrap=percentile")
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    trivial = majority_baseline(np.asarray(baseline.priors), len(y))
    resampled = [bootstrap_metric(y, scored, metric, samples=policy.bootstrap_samples, seed=policy.bootstrap_seed)
                 for scored in (champ, trivial)]  # one seed: the same rows for both, resample for resample
    recorded = sign * (baseline.value - baseline.trivial)
    point = recorded - sign * (_score(y, champ, classes, metric) - _score(y, trivial, classes, metric))
    lost = point + widen * ((recorded - sign * (resampled[0] - resampled[1])) - point)
    return float(np.count_nonzero(lost > policy.max_drop)) / policy.bootstrap_samples


def _slices(y: np.ndarray, champ: Scored, classes: list, rows: pd.DataFrame, metric: str, baseline: Baseline,
            policy: QualityPolicy) -> list[dict[str, Any]]:
    columns = policy.slice_columns or ()
    missing = [c for c in columns if c not in rows.columns]
    if missing:
        raise ValueError(f"slice columns {missing} are not in the labelled rows; columns are {list(rows.columns)}")
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    out = []
    for col, value, mask in slice_masks(rows, columns):
        n = int(mask.sum())
        recorded = (baseline.slices or {}).get((col, value))
        if n < policy.min_slice_rows:
            out.append({"column": col, "value": value, "rows": n, "score": None, "baseline": recorded, "drop": None,
                        "interval": None, "skipped": f"{n} rows < min_slice_rows {policy.min_slice_rows}"})
            continue
        part = champ.rows(mask)
        score = _score(y[mask], part, classes, metric)
        values = bootstrap_metric(y[mask], part, metric, samples=policy.bootstrap_samples,
                                  seed=policy.bootstrap_seed)
        out.append({"column": col, "value": value, "rows": n, "score": score, "baseline": recorded,
                    "drop": None if recorded is None else sign * (recorded - score),
                    "interval": bootstrap_interval(values, policy.confidence),
                    "skipped": None if math.isfinite(score) else f"{metric} undefined on this slice"})
    return out


def _score(y: np.ndarray, scored: Scored, classes: list, metric: str) -> float:
    """``metric`` of ``scored`` on the rows: a classifier's, or a regression model's on its predicted values."""
    if classes:
        return compute_metrics(y, scored.proba, classes, scored.threshold)[metric]
    return regression_metrics(y, scored.proba[:, 0])[metric]


def join_labels(data: pd.DataFrame, labels: pd.DataFrame, *, id_column: str, target: str, data_uri: str,
                labels_uri: str) -> tuple[pd.DataFrame, int]:
    """The rows of ``data`` whose label arrived in ``labels`` (joined on ``id_column``), and how many rows of
    ``data`` have none yet (they are left out).

    Raises:
        data.tables.DataFileError: a file lacks ``id_column`` (or ``labels`` the target), holds null or
            duplicate ids, or ``labels`` holds ids that are not in ``data``; the message names file, column and
            values.
    """
    for uri, frame, needed in ((data_uri, data, [id_column]), (labels_uri, labels, [id_column, target])):
        missing = [c for c in needed if c not in frame.columns]
        if missing:
            raise DataFileError(uri, f"column(s) {missing} missing; its columns are {list(frame.columns)}")
        ids = frame[id_column]
        if ids.isna().any():
            rows = frame.index[ids.isna()].tolist()[:5]
            raise DataFileError(uri, f"column '{id_column}' has {int(ids.isna().sum())} null id(s), at "
                                     f"{rows_named(rows)}")
        repeated = ids[ids.duplicated()].unique().tolist()[:5]
        if repeated:
            raise DataFileError(uri, f"column '{id_column}' repeats ids {repeated}: each row needs its own id")
    unknown = labels.loc[~labels[id_column].isin(data[id_column]), id_column].tolist()
    if unknown:
        raise DataFileError(labels_uri, f"{len(unknown)} label(s) for '{id_column}' values not in {data_uri}, "
                                        f"e.g. {unknown[:5]}: join labels to the rows they belong to")
    if target in data.columns:
        data = data.drop(columns=[target])
    joined = data.merge(labels[[id_column, target]], on=id_column, how="inner", validate="one_to_one")
    return joined, len(data) - len(joined)


def write_quality_report(path: str | Path, rows: pd.DataFrame, *, target: str, proba: np.ndarray, classes: list,
                         predicted: np.ndarray, result: QualityResult) -> Path:
    """Evidently's classification (or, with no ``classes``, regression) quality report of the champion on the
    labelled ``rows``, with the verdict on top, written atomically to ``path``."""
    preset = ClassificationPreset() if classes else RegressionPreset()
    frame, definition = (_classification_data(rows, target, proba, classes, predicted) if classes
                         else _regression_data(rows, target, predicted))
    snapshot = Report([preset]).run(Dataset.from_pandas(frame, data_definition=definition), None)
    page = snapshot.get_html_str(as_iframe=False)
    body = page.index(">", page.index("<body")) + 1
    verdict = (f'<section id="kfloop-quality-verdict" style="font-family:sans-serif;margin:1em">'
               f"<h2>{VERDICTS[result.verdict]}</h2><p>{html.escape(result.reason)}</p>"
               "</section>")
    return atomic_write_text(path, page[:body] + verdict + page[body:])


def _regression_data(rows: pd.DataFrame, target: str, predicted: np.ndarray) -> tuple[pd.DataFrame, DataDefinition]:
    """The true and predicted values as Evidently's regression input."""
    frame = pd.DataFrame({target: pd.to_numeric(rows[target]).to_numpy(dtype=np.float64),
                          PREDICTION_COLUMN: np.asarray(predicted, dtype=np.float64)})
    return frame, DataDefinition(numerical_columns=[target, PREDICTION_COLUMN],
                                 regression=[Regression(target=target, prediction=PREDICTION_COLUMN)])


def _classification_data(rows: pd.DataFrame, target: str, proba: np.ndarray, classes: list,
                         predicted: np.ndarray) -> tuple[pd.DataFrame, DataDefinition]:
    """The labels, predicted classes and probabilities as Evidently's classification input."""
    frame = pd.DataFrame({target: rows[target].astype(str).to_numpy(),
                          PREDICTION_COLUMN: pd.Series(predicted).astype(str).to_numpy()})
    names = [str(c) for c in classes]
    if len(classes) == 2:
        frame[names[1]] = proba[:, 1]
        task = BinaryClassification(target=target, prediction_labels=PREDICTION_COLUMN,
                                    prediction_probas=names[1], pos_label=names[1])
    else:
        for j, name in enumerate(names):
            frame[name] = proba[:, j]
        task = MulticlassClassification(target=target, prediction_labels=PREDICTION_COLUMN, prediction_probas=names)
    return frame, DataDefinition(categorical_columns=[target, PREDICTION_COLUMN], classification=[task])
