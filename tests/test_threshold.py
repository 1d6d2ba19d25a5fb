"""The binary decision threshold: chosen on validation rows by a metric, applied as one rule everywhere."""
from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from training.config import TrainingConfig
from training.linear import fit_linear, linear_scores
from training.threshold import choose_threshold, predicted_index, resolve_threshold_metric

Y = np.array([0, 0, 0, 0, 1, 0, 1, 1])
P = np.array([0.05, 0.1, 0.2, 0.3, 0.3, 0.45, 0.6, 0.9])


def brute_force(metric: str) -> float:
    """The best threshold by trying every distinct score (highest on ties)."""
    def score(t: float) -> float:
        pred = P >= t
        tp, fp = np.sum(pred & (Y == 1)), np.sum(pred & (Y == 0))
        fn, tn = np.sum(~pred & (Y == 1)), np.sum(~pred & (Y == 0))
        return {"f1_macro": (2 * tp / (2 * tp + fp + fn) + 2 * tn / (2 * tn + fn + fp)) / 2,
                "accuracy": (tp + tn) / len(Y),
                "balanced_accuracy": (tp / (tp + fn) + tn / (tn + fp)) / 2}[metric]
    candidates = sorted(set(P.tolist()), reverse=True)
    return max(candidates, key=lambda t: (score(t), t))


@pytest.mark.parametrize("metric", ["f1_macro", "accuracy", "balanced_accuracy"])
def test_the_chosen_threshold_maximises_the_metric(metric):
    assert choose_threshold(Y, P, metric) == brute_force(metric)


def test_hand_checked_f1_threshold_and_the_none_cases():
    # macro F1 (class 1, class 0): at 0.3 (0.75 + 0.75) / 2; at 0.6 (0.8 + 10/11) / 2; at 0.45 (2/3 + 0.8) / 2
    assert choose_threshold(Y, P, "f1_macro") == 0.6
    assert choose_threshold(Y, P, "none") is None
    assert choose_threshold(np.zeros(4, dtype=int), P[:4], "f1_macro") is None
    with pytest.raises(ValueError, match="threshold_metric='auc'"):
        choose_threshold(Y, P, "auc")


def test_predicted_index_applies_the_threshold_only_to_binary_probabilities():
    p = np.array([[0.7, 0.3], [0.4, 0.6], [0.8, 0.2]])
    assert predicted_index(p, None).tolist() == [0, 1, 0]
    assert predicted_index(p, 0.25).tolist() == [1, 1, 0]
    three = np.array([[0.2, 0.3, 0.5]])
    assert predicted_index(three, 0.1).tolist() == [2]


@pytest.mark.parametrize("kw, message", [({"class_weight": "auto"}, "class_weight='auto': use one of"),
                                         ({"threshold_metric": "recall"}, "threshold_metric='recall': use one of")])
def test_training_config_rejects_unknown_imbalance_settings(kw, message):
    with pytest.raises(ValueError, match=message):
        TrainingConfig(**kw)


@pytest.mark.parametrize("counts, metric, words", [
    ([930, 70], "f1_macro", "auto: the rarer class is 7.0% of the training rows (< 20%)"),
    ([70, 930], "f1_macro", "the threshold that maximises macro F1"),
    ([800, 200], "none", "auto: the rarer class is 20.0% of the training rows (>= 20%): the most probable class"),
    ([50, 30, 20], "none", "auto: 3 classes, not a binary target"),
])
def test_auto_tunes_the_threshold_for_macro_f1_only_for_a_rare_binary_class(counts, metric, words):
    chosen, why = resolve_threshold_metric("auto", counts)
    assert chosen == metric and words in why
    assert TrainingConfig().threshold_metric == "auto"
    assert resolve_threshold_metric("accuracy", counts) == ("accuracy", "set in training.threshold_metric=accuracy")
    with pytest.raises(ValueError, match="threshold_metric='auto'"):
        choose_threshold(Y, P, "auto")  # resolved before a threshold is chosen


def test_the_linear_baseline_scores_like_scikit_learn_without_pickling():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4))
    y = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(scale=0.5, size=600) > 1.2).astype(int)
    record = fit_linear(x, y, n_classes=2, seed=0)
    fitted = LogisticRegression(max_iter=1000).fit(x, y)
    assert json.loads(json.dumps(record)) == record and record["kind"] == "logistic_regression"
    assert np.allclose(linear_scores(record, x), fitted.predict_proba(x))
    three = np.digitize(x[:, 0], [-0.5, 0.5])
    assert np.allclose(linear_scores(fit_linear(x, three, n_classes=3, seed=0), x),
                       LogisticRegression(max_iter=1000).fit(x, three).predict_proba(x))
    target = x @ [1.0, -2.0, 0.0, 0.5] + 3
    assert np.allclose(linear_scores(fit_linear(x, target, n_classes=0, seed=0), x)[:, 0], target)
