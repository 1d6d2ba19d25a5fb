"""The decision threshold of a binary classifier: chosen on the validation split, stored in ``model.json``, and
the one rule turning probabilities into a predicted class for the gate, ``Predictor`` and the pyfunc."""
from __future__ import annotations

import numpy as np

THRESHOLD_METRICS = ("auto", "none", "f1_macro", "balanced_accuracy", "accuracy")
"""What the threshold maximises on the validation split (each weighs both classes, whichever is rare);
``none`` keeps the most probable class; ``auto`` picks one of them from the target
(:func:`resolve_threshold_metric`)."""
RARE_MINORITY_SHARE = 0.2
"""A binary target whose smaller class holds less than this share of the training rows is imbalanced: its
default primary metric is ROC AUC and ``threshold_metric: auto`` tunes its threshold for macro F1."""


def resolve_threshold_metric(setting: str, class_counts: list[int]) -> tuple[str, str]:
    """``(metric, why)``: the metric the threshold is chosen for, given ``training.threshold_metric`` and the
    training split's rows per class. ``auto``: ``f1_macro`` for a binary target whose rarer class is under
    :data:`RARE_MINORITY_SHARE` of the rows (the most probable class would rarely be the rare one), else
    ``none``.

    Raises:
        ValueError: an unknown ``setting``.
    """
    if setting not in THRESHOLD_METRICS:
        raise ValueError(f"threshold_metric={setting!r}: use one of {list(THRESHOLD_METRICS)}")
    if setting != "auto":
        return setting, f"set in training.threshold_metric={setting}"
    if len(class_counts) != 2:
        return "none", (f"auto: {len(class_counts)} classes, not a binary target: the most probable class")
    share = min(class_counts) / sum(class_counts)
    if share < RARE_MINORITY_SHARE:
        return "f1_macro", (f"auto: the rarer class is {share:.1%} of the training rows (< {RARE_MINORITY_SHARE:.0%}): "
                            "the threshold that maximises macro F1 on the validation split")
    return "none", (f"auto: the rarer class is {share:.1%} of the training rows (>= {RARE_MINORITY_SHARE:.0%}): "
                    "the most probable class")


def predicted_index(proba: np.ndarray, threshold: float | None) -> np.ndarray:
    """Class index per row: the positive class (column 1) where its probability is >= ``threshold``, else 0;
    without a threshold (``None``, or more than two classes) the most probable class."""
    proba = np.asarray(proba)
    if threshold is None or proba.shape[1] != 2:
        return proba.argmax(axis=1)
    return (proba[:, 1] >= threshold).astype(np.int64)


def choose_threshold(y: np.ndarray, positive_proba: np.ndarray, metric: str) -> float | None:
    """The probability of the positive class at or above which ``metric`` of the predictions on (``y``,
    ``positive_proba``) is highest (the highest such threshold on ties); ``None`` for ``metric="none"`` or when
    ``y`` lacks either class (nothing to choose from).

    Raises:
        ValueError: an unknown ``metric``.
    """
    if metric not in THRESHOLD_METRICS or metric == "auto":
        raise ValueError(f"threshold_metric={metric!r}: use one of {list(THRESHOLD_METRICS)}")
    positive = np.asarray(y) == 1
    n_pos, n = int(positive.sum()), len(positive)
    if metric == "none" or n_pos in (0, n):
        return None
    order = np.argsort(-np.asarray(positive_proba, dtype=np.float64), kind="stable")
    p, pos = np.asarray(positive_proba, dtype=np.float64)[order], positive[order]
    last = np.r_[p[1:] != p[:-1], True]  # the last row of each run of equal probabilities
    tp = np.cumsum(pos)[last].astype(np.float64)
    fp = np.cumsum(~pos)[last].astype(np.float64)
    tn, fn = (n - n_pos) - fp, n_pos - tp
    score = {"f1_macro": (2 * tp / (2 * tp + fp + fn) + 2 * tn / (2 * tn + fn + fp)) / 2,
             "balanced_accuracy": (tp / n_pos + tn / (n - n_pos)) / 2,
             "accuracy": (tp + tn) / n}[metric]
    return float(p[last][int(np.argmax(score))])
