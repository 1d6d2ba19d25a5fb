"""How often the quality check is wrong: false alarms on labelled batches from the holdout's own distribution, and
detections of a true drop, over seeded repetitions of :func:`monitoring.quality.check_quality`.

    .venv/bin/python benchmarks/quality_calibration.py [--repetitions 200]
        [--out benchmarks/results/quality_calibration.json]

One scored population, fixed for every repetition (a logistic regression fitted once on scikit-learn's
``make_classification``, 30% positives, scoring 40,000 rows it did not train on): no retraining per repetition.
Each repetition draws a holdout of ``--holdout-rows`` rows (its value is the recorded baseline, with its own
sampling error, as a real champion's is) and a labelled batch of 100, 300 or 1,000 other rows, then checks the
batch. A true drop flips the labels of a random share of the batch's rows, the share chosen so the population's
accuracy falls by 10 points (or its ROC AUC by 0.05).

The policy is the default (confidence 0.9, percentile bootstrap, 1,000 resamples) with ``max_drop: 0``: any
confident drop alarms, so the false-alarm rate is the test's own size; the default ``max_drop`` of 0.05 only makes
alarms rarer. Nominal rate: the interval's one-sided tail, ``(1 - confidence) / 2`` = 0.05. Goals: false alarms
<= nominal at every size, detection of the 10-point accuracy drop >= 0.9 at 1,000 rows. The same false alarms
with the holdout treated as exact (its row count unknown) are reported too, to show what the widening buys.

A measured rate is itself an estimate: a check whose true rate is exactly 0.05 reads 14 alarms in 200
repetitions (0.070) one time in eight. So each false-alarm rate comes with its exact (Clopper-Pearson) 95%
interval, and the goal counts as missed only where the rate is significantly above nominal (one-sided binomial
test, p < 0.05); the default 500 repetitions keep the interval near +-0.02.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import binomtest
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from data.fileio import atomic_write_json
from monitoring.quality import Baseline, check_quality
from monitoring.quality_policy import QualityPolicy
from training.gate import compute_metrics

CLASSES = [0, 1]
NULL_ROWS = (100, 300, 1000)
DROP_ROWS = (300, 1000)
DROPS = {"accuracy": 0.10, "roc_auc": 0.05}
DETECTION_GOAL = 0.9
POLICY = {"max_drop": 0.0, "slice_columns": []}


def population(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels and a fitted model's probabilities for 40,000 rows it did not train on."""
    x, y = make_classification(n_samples=50_000, n_features=10, n_informative=5, weights=[0.7], flip_y=0.05,
                               class_sep=0.8, random_state=seed)
    model = LogisticRegression(max_iter=1000).fit(x[:10_000], y[:10_000])
    return y[10_000:], model.predict_proba(x[10_000:])


def flip_share(y: np.ndarray, proba: np.ndarray, metric: str, drop: float) -> float:
    """The share of rows whose labels, flipped at random, lower the population's ``metric`` by ``drop``."""
    if metric == "accuracy":  # flipping a label flips whether the prediction is right: a - q (2a - 1)
        a = compute_metrics(y, proba, CLASSES)["accuracy"]
        return drop / (2 * a - 1)
    target = roc_auc_score(y, proba[:, 1]) - drop
    rng = np.random.default_rng(1)
    low, high = 0.0, 0.5
    for _ in range(25):  # bisect on the population, one fixed flip pattern
        mid = (low + high) / 2
        flipped = np.where(rng.random(len(y)) < mid, 1 - y, y)
        low, high = (mid, high) if roc_auc_score(flipped, proba[:, 1]) > target else (low, mid)
    return (low + high) / 2


def alarm_rate(y: np.ndarray, proba: np.ndarray, metric: str, rows: int, *, repetitions: int, holdout_rows: int,
               flip: float = 0.0, known_holdout: bool = True) -> dict[str, float]:
    """Share of repetitions the check calls degraded (and share it found the labels insufficient)."""
    alarms = insufficient = 0
    for rep in range(repetitions):
        rng = np.random.default_rng(10_000 + rep)
        order = rng.permutation(len(y))
        hold, batch = order[:holdout_rows], order[holdout_rows:holdout_rows + rows]
        labels = np.where(rng.random(rows) < flip, 1 - y[batch], y[batch])
        baseline = Baseline(metric=metric, value=compute_metrics(y[hold], proba[hold], CLASSES)[metric],
                            holdout_rows=holdout_rows if known_holdout else None)
        result = check_quality(y_true=labels, proba=proba[batch], classes=CLASSES, threshold=None,
                               rows=pd.DataFrame(index=range(rows)), baseline=baseline,
                               policy=QualityPolicy(**POLICY, bootstrap_seed=rep))
        alarms += result.degraded
        insufficient += result.verdict == "insufficient_labels"
    return {"rate": alarms / repetitions, "alarms": alarms, "insufficient": insufficient / repetitions}


def above_nominal(alarms: int, repetitions: int, nominal: float) -> bool:
    """Whether ``alarms`` in ``repetitions`` show a true rate above ``nominal`` (one-sided binomial, p < 0.05)."""
    return bool(binomtest(alarms, repetitions, nominal, alternative="greater").pvalue < 0.05)


def interval(alarms: int, repetitions: int) -> list[float]:
    """The exact 95% interval of the rate behind ``alarms`` in ``repetitions``."""
    ci = binomtest(alarms, repetitions).proportion_ci(confidence_level=0.95, method="exact")
    return [round(ci.low, 4), round(ci.high, 4)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=500)
    parser.add_argument("--holdout-rows", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/quality_calibration.json"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    y, proba = population()
    policy = QualityPolicy(**POLICY)
    nominal = round((1 - policy.confidence) / 2, 12)  # 0.05, not 0.04999...
    reps, hold = args.repetitions, args.holdout_rows
    table, by_metric = [], {}
    for metric, drop in DROPS.items():
        flip = flip_share(y, proba, metric, drop)
        null = {n: alarm_rate(y, proba, metric, n, repetitions=reps, holdout_rows=hold) for n in NULL_ROWS}
        exact = {n: alarm_rate(y, proba, metric, n, repetitions=reps, holdout_rows=hold, known_holdout=False)
                 for n in NULL_ROWS}
        detect = {n: alarm_rate(y, proba, metric, n, repetitions=reps, holdout_rows=hold, flip=flip)
                  for n in DROP_ROWS}
        by_metric[metric] = {"population_value": compute_metrics(y, proba, CLASSES)[metric], "true_drop": drop,
                             "flip_share": flip,
                             "false_alarm_rate": {n: r["rate"] for n, r in null.items()},
                             "false_alarm_ci95": {n: interval(r["alarms"], reps) for n, r in null.items()},
                             "false_alarm_above_nominal": {n: above_nominal(r["alarms"], reps, nominal)
                                                           for n, r in null.items()},
                             "false_alarm_rate_holdout_as_exact": {n: r["rate"] for n, r in exact.items()},
                             "insufficient_labels_rate": {n: r["insufficient"] for n, r in null.items()},
                             "detection_rate": {n: r["rate"] for n, r in detect.items()}}
        for n in NULL_ROWS:
            table.append((metric, n, null[n]["rate"], interval(null[n]["alarms"], reps), exact[n]["rate"],
                          detect[n]["rate"] if n in detect else None, null[n]["insufficient"]))
    false_alarm = {n: max(m["false_alarm_rate"][n] for m in by_metric.values()) for n in NULL_ROWS}
    detection = by_metric["accuracy"]["detection_rate"]
    result = {
        "nominal_rate": nominal, "false_alarm_rate": false_alarm, "detection_rate": detection,
        "detection_rate_roc_auc": by_metric["roc_auc"]["detection_rate"], "detection_goal": DETECTION_GOAL,
        "false_alarms_within_nominal": not any(above for m in by_metric.values()
                                               for above in m["false_alarm_above_nominal"].values()),
        "detection_within_goal": detection[max(DROP_ROWS)] >= DETECTION_GOAL,
        "by_metric": by_metric,
        "config": {"repetitions": reps, "holdout_rows": hold, "policy": policy.to_dict() | {"bootstrap_seed": "rep"},
                   "population_rows": len(y), "positive_share": float(y.mean())},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(f"quality check calibration: {reps} repetitions each, holdout {hold} rows, nominal false-alarm rate "
          f"{nominal:.3f}")
    print(f"{'metric':<9} {'rows':>5} {'false alarms':>13} {'95% interval':>14} {'holdout exact':>14} "
          f"{'detection':>10} {'insufficient':>13}")
    for metric, n, fa, (low, high), ex, det, ins in table:
        print(f"{metric:<9} {n:>5} {fa:>13.3f} {f'{low:.3f}-{high:.3f}':>14} {ex:>14.3f} "
              f"{'-' if det is None else f'{det:.3f}':>10} {ins:>13.3f}")
    print(f"drops: accuracy -{DROPS['accuracy']:.2f}, roc_auc -{DROPS['roc_auc']:.2f}; goals: false alarms <= "
          f"{nominal:.2f}, none significantly above ({'met' if result['false_alarms_within_nominal'] else 'NOT met'}"
          f"), accuracy detection at "
          f"{max(DROP_ROWS)} rows >= {DETECTION_GOAL} ({'met' if result['detection_within_goal'] else 'NOT met'}); "
          f"{result['wall_s']} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
