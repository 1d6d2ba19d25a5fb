"""The quality rule on its own (numpy in, verdict out): the champion's value on labelled rows against its holdout
value, in the metric's direction, made confident by the percentile or the paired bootstrap; and the joining of
labels that arrive separately."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from data.tables import DataFileError
from monitoring.quality import Baseline, check_quality, join_labels, write_quality_report
from monitoring.quality_policy import QualityPolicy
from training.gate import compute_metrics, regression_metrics

CLASSES = [0, 1]
FAST = {"bootstrap_samples": 300}


def _batch(n: int, seed: int, *, share_positive: float = 0.4) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """Labels, a model's probabilities that get about 80% right, and a frame with one categorical column."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < share_positive).astype(int)
    signal = np.where(y == 1, 0.75, 0.25) + rng.normal(0, 0.2, n)
    p1 = np.clip(signal, 0.01, 0.99)
    return y, np.column_stack([1 - p1, p1]), pd.DataFrame({"plan": rng.choice(["basic", "premium"], n)})


def _holdout(metric: str) -> Baseline:
    y, proba, _ = _batch(2000, seed=1)
    recorded = compute_metrics(y, proba, CLASSES)
    trivial = compute_metrics(y, np.tile([0.6, 0.4], (len(y), 1)), CLASSES)
    return Baseline(metric=metric, value=recorded[metric], trivial=trivial[metric], priors=[0.6, 0.4])


def _check(y, proba, frame, metric="accuracy", **policy):
    return check_quality(y_true=y, proba=proba, classes=CLASSES, threshold=None, rows=frame,
                         baseline=_holdout(metric), policy=QualityPolicy.from_dict({**FAST, **policy}))


@pytest.mark.parametrize("bootstrap", ["percentile", "paired"])
@pytest.mark.parametrize("metric", ["accuracy", "roc_auc", "log_loss"])
def test_rows_like_the_holdout_are_fine_and_flipped_labels_are_degraded(metric, bootstrap):
    y, proba, frame = _batch(800, seed=2)
    fine = _check(y, proba, frame, metric, bootstrap=bootstrap)
    assert not fine.degraded and fine.reason.startswith("not degraded:"), fine.reason
    assert fine.rows == 800 and fine.metric == metric and fine.ci_low <= fine.value <= fine.ci_high
    flipped = _check(1 - y, proba, frame, metric, bootstrap=bootstrap)
    assert flipped.degraded and flipped.reason.startswith("degraded:"), flipped.reason
    worse = flipped.value > flipped.baseline if metric == "log_loss" else flipped.value < flipped.baseline
    assert worse, "log_loss is lower-is-better: the gate's direction decides which way a drop goes"
    assert f"{metric} {flipped.value:.3f} on 800 labelled rows vs {flipped.baseline:.3f}" in flipped.reason
    assert (flipped.confidence is not None) == (bootstrap == "paired")


def test_a_drop_that_the_interval_does_not_confirm_is_not_degradation():
    _, proba, frame = _batch(60, seed=3)
    some_wrong = proba.argmax(axis=1)
    some_wrong[:10] ^= 1  # exactly 50 of 60 right: about 7 points below the holdout
    result = _check(some_wrong, proba, frame, max_drop=0.05)
    assert result.baseline - result.value > 0.05
    assert not result.degraded and "but not confidently" in result.reason
    assert result.ci_high > result.baseline - 0.05, "the interval reaches the allowed drop"


def test_the_paired_bootstrap_reads_a_change_of_class_balance_as_no_degradation():
    y, proba, frame = _batch(3000, seed=4, share_positive=0.8)  # same model quality, the rare class now common
    shifted = _check(y, proba, frame, "accuracy", bootstrap="paired", max_drop=0.02)
    assert not shifted.degraded, shifted.reason
    assert "lead over the trivial baseline" in shifted.reason or shifted.reason.startswith("not degraded")


def test_floor_degrades_by_itself_in_the_metric_direction():
    y, proba, frame = _batch(800, seed=5)
    high_floor = _check(y, proba, frame, floor=0.95, max_drop=0.5)
    assert high_floor.degraded and re.search(r"accuracy 0\.\d{3} < floor 0\.950", high_floor.reason)
    ceiling = _check(y, proba, frame, "log_loss", floor=0.05, max_drop=5.0)
    assert ceiling.degraded and "> ceiling 0.050" in ceiling.reason


def test_slices_report_value_interval_and_skip_small_ones():
    y, proba, frame = _batch(400, seed=6)
    frame.loc[:19, "plan"] = "legacy"
    baseline = _holdout("accuracy")
    baseline.slices = {("plan", "basic"): 0.9}
    result = check_quality(y_true=y, proba=proba, classes=CLASSES, threshold=None, rows=frame, baseline=baseline,
                           policy=QualityPolicy(slice_columns=["plan"], **FAST))
    by_value = {s["value"]: s for s in result.slices}
    assert sorted(by_value) == ["basic", "legacy", "premium"]
    mask = (frame["plan"] == "basic").to_numpy()
    basic = by_value["basic"]
    assert basic["rows"] == mask.sum() and basic["score"] == compute_metrics(y[mask], proba[mask], CLASSES)["accuracy"]
    assert basic["drop"] == pytest.approx(0.9 - basic["score"]) and len(basic["interval"]) == 2
    assert by_value["premium"]["baseline"] is None and by_value["premium"]["drop"] is None
    assert by_value["legacy"]["skipped"] == "20 rows < min_slice_rows 30" and by_value["legacy"]["score"] is None
    assert result.to_dict()["slices"] == result.slices


def test_too_few_rows_is_insufficient_labels_not_a_failure():
    """Issue 29 item 1 changed this on purpose: too few rows used to raise (the check failed); now the check runs
    and says it cannot decide, with the counts it had and needed."""
    y, proba, frame = _batch(40, seed=7)
    result = _check(y, proba, frame)
    assert result.verdict == "insufficient_labels" and not result.degraded, result.reason
    assert result.labels["rows"] == 40 and result.labels["min_rows"] == 50
    assert result.labels["short"] == ["40 labelled rows < quality.min_rows 50"]
    assert result.to_dict()["verdict"] == "insufficient_labels"


def test_fifty_rows_with_one_positive_are_insufficient_labels_for_roc_auc_not_degraded():
    """Issue 29 item 1: 50 rows with one positive gave a ROC AUC interval [0.378, 0.622] and ``degraded: true``."""
    y, proba, frame = _batch(50, seed=9)
    y[:] = 0
    y[0] = 1
    result = _check(y, proba, frame, "roc_auc")
    assert result.verdict == "insufficient_labels" and not result.degraded, result.reason
    assert result.labels["per_class"] == {"0": 49, "1": 1} and result.labels["min_per_class"] == 10
    assert "roc_auc needs >= 10 labelled rows of every class (quality.min_class_rows); had 1 of class '1'" \
        in result.reason
    assert result.ci_low is None and result.ci_high is None
    macro = _check(y, proba, frame, "f1_macro")
    assert macro.verdict == "insufficient_labels", macro.reason
    accuracy = _check(y, proba, frame, "accuracy")  # accuracy needs no count per class
    assert accuracy.verdict != "insufficient_labels" and accuracy.labels["min_per_class"] is None


def test_the_holdout_values_own_error_widens_the_interval_and_the_result_says_so():
    y, proba, frame = _batch(800, seed=10)
    exact = _check(y, proba, frame)
    baseline = _holdout("accuracy")
    baseline.holdout_rows = 800
    widened = check_quality(y_true=y, proba=proba, classes=CLASSES, threshold=None, rows=frame, baseline=baseline,
                            policy=QualityPolicy(slice_columns=[], **FAST))
    assert exact.holdout_uncertainty.startswith("not accounted")
    assert "sqrt(1 + 800/800) = 1.414" in widened.holdout_uncertainty
    width = lambda r: r.ci_high - r.ci_low  # noqa: E731
    assert width(widened) == pytest.approx(np.sqrt(2) * width(exact), rel=1e-9)


def test_undefined_resamples_count_as_no_drop_instead_of_narrowing_the_interval():
    """Two positives in 60 rows (the class minimum lowered to allow it): about one resample in eight lacks a
    positive, so ROC AUC is undefined there; those resamples push the interval's better end to unbounded (no
    confident drop) instead of silently leaving the interval."""
    y, proba, frame = _batch(60, seed=11)
    y[:] = 0
    y[:2] = 1
    proba[:2] = [0.9, 0.1]  # the positives ranked low: ROC AUC far below the holdout's
    result = _check(y, proba, frame, "roc_auc", min_class_rows=2, bootstrap_samples=1000)
    assert 60 < result.undefined_resamples < 250, result.undefined_resamples
    assert f"{result.undefined_resamples} of 1000 resamples undefined, counted as no drop" in result.reason
    assert result.ci_high is None and not result.degraded, result.reason
    assert result.value < result.baseline - 0.05, "without the undefined resamples this would read as a drop"


def test_paired_needs_the_recorded_trivial_baseline():
    y, proba, frame = _batch(200, seed=8)
    with pytest.raises(ValueError, match="use quality.bootstrap=percentile"):
        check_quality(y_true=y, proba=proba, classes=CLASSES, threshold=None, rows=frame,
                      baseline=Baseline(metric="accuracy", value=0.8),
                      policy=QualityPolicy(bootstrap="paired", slice_columns=[], **FAST))


def _regression(n: int, seed: int, *, noise: float = 5.0) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """True values around 150 and predictions off by ``noise`` (rmse about ``noise``), as one column."""
    rng = np.random.default_rng(seed)
    y = rng.normal(150, 40, n)
    return y, (y + rng.normal(0, noise, n))[:, None], pd.DataFrame({"sex": rng.choice(["f", "m"], n)})


@pytest.mark.parametrize("metric", ["rmse", "mae", "r2"])
def test_a_regression_champion_is_checked_on_its_values_in_the_metrics_direction(metric):
    y_hold, pred_hold, _ = _regression(2000, seed=1)
    holdout = Baseline(metric=metric, value=regression_metrics(y_hold, pred_hold[:, 0])[metric])
    policy = QualityPolicy.from_dict({**FAST, "max_drop": 2.0 if metric != "r2" else 0.05,
                                      "slice_columns": ["sex"]})
    y, pred, frame = _regression(600, seed=2)
    fine = check_quality(y_true=y, proba=pred, classes=[], threshold=None, rows=frame, baseline=holdout,
                         policy=policy)
    assert not fine.degraded and fine.ci_low <= fine.value <= fine.ci_high, fine.reason
    assert {s["value"] for s in fine.slices} == {"f", "m"} and all(s["score"] is not None for s in fine.slices)
    y, pred, frame = _regression(600, seed=3, noise=25.0)  # five times the error
    worse = check_quality(y_true=y, proba=pred, classes=[], threshold=None, rows=frame, baseline=holdout,
                          policy=policy)
    assert worse.degraded and worse.reason.startswith("degraded:"), worse.reason
    assert (worse.value > worse.baseline) == (metric in ("rmse", "mae")), "rmse and mae are lower-is-better"


def test_a_regression_champion_needs_a_regression_metric_and_the_percentile_bootstrap():
    y, pred, frame = _regression(200, seed=4)
    with pytest.raises(ValueError, match="primary_metric='accuracy' does not score a regression model"):
        check_quality(y_true=y, proba=pred, classes=[], threshold=None, rows=frame,
                      baseline=Baseline(metric="accuracy", value=0.8), policy=QualityPolicy(**FAST))
    with pytest.raises(ValueError, match="bootstrap=percentile"):
        check_quality(y_true=y, proba=pred, classes=[], threshold=None, rows=frame,
                      baseline=Baseline(metric="rmse", value=5.0),
                      policy=QualityPolicy(bootstrap="paired", slice_columns=[], **FAST))
    yc, proba, framec = _batch(200, seed=5)
    with pytest.raises(ValueError, match="primary_metric='rmse' does not score a classifier"):
        check_quality(y_true=yc, proba=proba, classes=CLASSES, threshold=None, rows=framec,
                      baseline=Baseline(metric="rmse", value=5.0), policy=QualityPolicy(**FAST))


def test_the_regression_report_is_evidentlys_regression_preset_with_the_verdict(tmp_path):
    y, pred, frame = _regression(300, seed=6)
    frame["target"] = y
    result = check_quality(y_true=y, proba=pred, classes=[], threshold=None, rows=frame,
                           baseline=Baseline(metric="rmse", value=5.0), policy=QualityPolicy(**FAST))
    page = write_quality_report(tmp_path / "q.html", frame, target="target", proba=pred, classes=[],
                                predicted=pred[:, 0], result=result).read_text()
    assert 'id="kfloop-quality-verdict"' in page and result.reason.split(":")[0] in page
    assert "Mean Absolute Error" in page or "MAE" in page


@pytest.mark.parametrize("values, message", [
    ({"primary_metric": "precision"}, r"primary_metric='precision': use one of .* \(classification\) or "
                                      r"\['rmse', 'mae', 'r2'\] \(regression\)"),
    ({"max_drop": -0.1}, "max_drop=-0.1: use a finite number >= 0"),
    ({"bootstrap": "bca"}, r"bootstrap='bca': use one of \['percentile', 'paired'\]"),
    ({"confidence": 1.0}, r"confidence=1.0: use a share in \(0, 1\)"),
    ({"min_rows": 0}, "min_rows=0: use an integer >= 1"),
    ({"slice_columns": "plan"}, "use a list of column names"),
    ({"max_dorp": 0.1}, r"unknown quality key\(s\) \['max_dorp'\]"),
])
def test_invalid_policy_states_the_fix(values, message):
    with pytest.raises(ValueError, match=message):
        QualityPolicy.from_dict(values)


def test_labels_join_on_the_id_and_leave_unlabelled_rows_out():
    data = pd.DataFrame({"id": [1, 2, 3, 4], "x": [0.1, 0.2, 0.3, 0.4], "y": [9, 9, 9, 9]})
    labels = pd.DataFrame({"id": [3, 1], "y": [1, 0]})
    joined, unlabelled = join_labels(data, labels, id_column="id", target="y", data_uri="rows.csv",
                                     labels_uri="labels.csv")
    assert unlabelled == 2 and joined.sort_values("id")[["id", "x", "y"]].values.tolist() == [[1, 0.1, 0], [3, 0.3, 1]]


@pytest.mark.parametrize("data, labels, message", [
    ({"key": [1]}, {"id": [1], "y": [0]}, r"rows\.csv: column\(s\) \['id'\] missing; its columns are \['key'\]"),
    ({"id": [1]}, {"id": [1], "label": [0]}, r"labels\.csv: column\(s\) \['y'\] missing"),
    ({"id": [1, None]}, {"id": [1], "y": [0]},
     r"rows\.csv: column 'id' has 1 null id\(s\), at data rows \[1\] \(counted from 0, header excluded\)"),
    ({"id": [1, 2]}, {"id": [2, 2], "y": [0, 1]}, r"labels\.csv: column 'id' repeats ids \[2\]"),
    ({"id": [1, 2]}, {"id": [2, 7], "y": [0, 1]},
     r"labels\.csv: 1 label\(s\) for 'id' values not in rows\.csv, e\.g\. \[7\]"),
])
def test_labels_that_cannot_be_joined_name_file_column_and_values(data, labels, message):
    with pytest.raises(DataFileError, match=message):
        join_labels(pd.DataFrame(data), pd.DataFrame(labels), id_column="id", target="y", data_uri="rows.csv",
                    labels_uri="labels.csv")
