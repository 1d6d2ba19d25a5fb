"""The linear baseline every decision reports: scikit-learn's logistic regression (classification) or linear
regression, fitted on the challenger's own preprocessed features and training split, stored as plain numbers in
``model.json`` (no pickle) and scored on the holdout beside the challenger.

A network that cannot beat it is worth a look; ``promotion.require_beat_linear`` makes beating it a rule.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.linear_model import LinearRegression, LogisticRegression

MAX_ROWS = 200_000
"""Training rows the linear model is fitted on at most (a seeded sample beyond): it is a yardstick, not a
second training job."""
KINDS = {"logistic_regression": "scikit-learn LogisticRegression (L2, C=1) on the challenger's preprocessed "
                                "features and training split",
         "linear_regression": "scikit-learn LinearRegression on the challenger's preprocessed features and "
                              "training split"}


def fit_linear(x: np.ndarray, y: np.ndarray, *, n_classes: int, seed: int) -> dict[str, Any]:
    """The linear model of ``y`` (class indices, or the encoded regression target with ``n_classes`` 0) on the
    preprocessed features ``x``, as a JSON-ready record: ``kind``, ``coef`` (outputs x features), ``intercept``,
    ``rows`` (fitted on) and ``classes_seen`` (class indices present; a class absent from the rows gets
    probability 0)."""
    if len(y) > MAX_ROWS:
        keep = np.sort(np.random.default_rng(seed).choice(len(y), MAX_ROWS, replace=False))
        x, y = x[keep], y[keep]
    if n_classes == 0:
        model = LinearRegression().fit(x, y)
        return {"kind": "linear_regression", "coef": [model.coef_.tolist()], "intercept": [float(model.intercept_)],
                "rows": len(y), "classes_seen": []}
    model = LogisticRegression(max_iter=1000).fit(x, y)
    return {"kind": "logistic_regression", "coef": model.coef_.tolist(), "intercept": model.intercept_.tolist(),
            "rows": len(y), "classes_seen": [int(c) for c in model.classes_], "n_classes": n_classes}


def linear_scores(record: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """The fitted model's output on preprocessed features ``x``: class probabilities (rows x ``n_classes``, in
    the gate's class order) or, for regression, the encoded target as one column."""
    logits = x @ np.asarray(record["coef"], dtype=np.float64).T + np.asarray(record["intercept"], dtype=np.float64)
    if record["kind"] == "linear_regression":
        return logits
    if logits.shape[1] == 1:  # binary: scikit-learn keeps one column, the second class's log-odds
        logits = np.hstack([np.zeros_like(logits), logits])
    proba = np.exp(logits - logits.max(axis=1, keepdims=True))
    proba /= proba.sum(axis=1, keepdims=True)
    out = np.zeros((len(x), record["n_classes"]))
    out[:, record["classes_seen"]] = proba
    return out
