"""Pictures of a candidate, logged to its MLflow run by the evaluation step (never inside the DDP ranks):
training curves, confusion matrix, ROC and PR curves (binary) or per-class metrics (multi-class) on the holdout,
or, for regression, residuals and predicted against actual values; and the gate's comparison with the champion
per slice with its bootstrap interval."""
from __future__ import annotations

from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import mlflow
import numpy as np
from sklearn.metrics import (auc, average_precision_score, precision_recall_curve, precision_recall_fscore_support,
                             roc_curve)

from training.gate import LOWER_IS_BETTER
from training.threshold import predicted_index

CURVE_METRICS = ("train_loss", "val_loss", "val_accuracy", "val_rmse")
"""Per-epoch metrics ``training.train`` logs; plotted against the epoch."""


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    matplotlib.use("Agg")
    return plt


def training_curves(history: dict[str, list[tuple[int, float]]]):
    """Loss and the validation metric (accuracy, or RMSE for regression) per epoch from
    ``{metric: [(epoch, value), ...]}``."""
    plt = pyplot()
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(9, 3.4))
    for name, points in sorted(history.items()):
        ax = loss_ax if name.endswith("_loss") else acc_ax
        ax.plot(*zip(*sorted(points)), marker="o", label=name)
    for ax, title in ((loss_ax, "loss"), (acc_ax, "validation metric")):
        ax.set(title=title, xlabel="epoch")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def confusion_matrix(y: np.ndarray, proba: np.ndarray, classes: list, threshold: float | None = None):
    """Counts of (true, predicted) class on the holdout (``threshold``: the model's decision threshold)."""
    plt = pyplot()
    k = len(classes)
    counts = np.zeros((k, k), dtype=int)
    np.add.at(counts, (y, predicted_index(proba, threshold)), 1)
    fig, ax = plt.subplots(figsize=(1.2 * k + 2.5, 1.2 * k + 2))
    ax.imshow(counts, cmap="Blues")
    for i in range(k):
        for j in range(k):
            ax.text(j, i, str(counts[i, j]), ha="center", va="center",
                    color="white" if counts[i, j] > counts.max() / 2 else "black")
    ax.set(xticks=range(k), yticks=range(k), xticklabels=classes, yticklabels=classes, xlabel="predicted",
           ylabel="true", title="confusion matrix (holdout)")
    fig.tight_layout()
    return fig


def roc_pr_curves(y: np.ndarray, proba: np.ndarray, classes: list):
    """ROC and precision-recall curves of the positive class ``classes[1]`` (binary tasks)."""
    plt = pyplot()
    positive, score = y == 1, proba[:, 1]
    fpr, tpr, _ = roc_curve(positive, score)
    precision, recall, _ = precision_recall_curve(positive, score)
    fig, (roc_ax, pr_ax) = plt.subplots(1, 2, figsize=(9, 3.8))
    roc_ax.plot(fpr, tpr, label=f"AUC {auc(fpr, tpr):.3f}")
    roc_ax.plot([0, 1], [0, 1], ls="--", color="grey")
    roc_ax.set(title=f"ROC (positive: {classes[1]})", xlabel="false positive rate", ylabel="true positive rate")
    pr_ax.plot(recall, precision, label=f"AP {average_precision_score(positive, score):.3f}")
    pr_ax.axhline(positive.mean(), ls="--", color="grey", label="base rate")
    pr_ax.set(title="precision-recall", xlabel="recall", ylabel="precision")
    for ax in (roc_ax, pr_ax):
        ax.legend(loc="lower right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def per_class_metrics(y: np.ndarray, proba: np.ndarray, classes: list):
    """Precision, recall and F1 per class (multi-class tasks)."""
    plt = pyplot()
    p, r, f, _ = precision_recall_fscore_support(y, proba.argmax(axis=1), labels=range(len(classes)),
                                                 zero_division=0)
    x = np.arange(len(classes))
    fig, ax = plt.subplots(figsize=(max(5, len(classes) * 1.2), 3.6))
    for i, (name, values) in enumerate((("precision", p), ("recall", r), ("f1", f))):
        ax.bar(x + (i - 1) * 0.27, values, width=0.27, label=name)
    ax.set(xticks=x, xticklabels=classes, ylim=(0, 1), title="per-class metrics (holdout)")
    ax.legend()
    fig.tight_layout()
    return fig


def residuals(y: np.ndarray, predicted: np.ndarray):
    """Regression: predicted against actual values (the diagonal is perfect) and residuals against predictions."""
    plt = pyplot()
    fig, (fit_ax, res_ax) = plt.subplots(1, 2, figsize=(9, 3.6))
    fit_ax.scatter(y, predicted, s=8, alpha=0.5)
    low, high = float(min(y.min(), predicted.min())), float(max(y.max(), predicted.max()))
    fit_ax.plot([low, high], [low, high], color="grey", ls="--")
    fit_ax.set(xlabel="actual", ylabel="predicted", title="predicted vs actual (holdout)")
    res_ax.scatter(predicted, y - predicted, s=8, alpha=0.5)
    res_ax.axhline(0, color="grey", ls="--")
    res_ax.set(xlabel="predicted", ylabel="actual - predicted", title="residuals (holdout)")
    fig.tight_layout()
    return fig


def gate_comparison(decision: dict[str, Any]):
    """Challenger minus champion on the primary metric, overall and per slice, with the 5-95% paired
    bootstrap interval; red where a slice failed the gate. ``decision`` is a Decision's ``to_dict()``."""
    plt = pyplot()
    metric = decision["primary_metric"]
    rows = [("overall", decision["improvement"] if metric not in LOWER_IS_BETTER else -decision["improvement"],
             _raw(decision.get("interval"), metric), True)]
    rows += [(f"{s['column']}={s['value']} (n={s['rows']})", s["delta"], s.get("interval"), s["ok"])
             for s in decision["slices"]]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.5))
    for i, (label, delta, interval, ok) in enumerate(rows):
        color = "tab:blue" if ok else "tab:red"
        if interval:
            ax.plot(interval, [i, i], color=color, lw=2, alpha=0.5)
        ax.plot([delta], [i], "o", color=color)
    ax.axvline(0, color="grey", ls="--")
    ax.set(yticks=range(len(rows)), yticklabels=[r[0] for r in rows], xlabel=f"{metric}: challenger - champion",
           title=f"gate: {'blessed' if decision['blessed'] else 'not blessed'} (bootstrap 5-95%)")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def _raw(interval: list[float] | None, metric: str) -> list[float] | None:
    """An improvement interval (positive is better) as raw challenger-minus-champion."""
    if interval is None or metric not in LOWER_IS_BETTER:
        return interval
    return sorted(-v for v in interval)


def log_evaluation_figures(run_id: str, *, y: np.ndarray, proba: np.ndarray, classes: list,
                           decision: dict[str, Any], threshold: float | None = None) -> list[str]:
    """Log the candidate's pictures to MLflow run ``run_id`` under ``figures/``; returns the artifact paths.
    ``threshold``: the candidate's decision threshold (binary), applied in the confusion matrix. Regression
    (``classes`` empty): ``y`` holds the true values and ``proba`` the predicted ones (one column).

    Raises:
        mlflow.exceptions.MlflowException: MLflow refused a call.
    """
    plt = pyplot()
    client = mlflow.MlflowClient()
    history = {m: [(h.step, h.value) for h in client.get_metric_history(run_id, m)] for m in CURVE_METRICS}
    if not classes:
        figures = {"figures/residuals.png": residuals(y, proba[:, 0])}
    else:
        figures = {"figures/confusion_matrix.png": confusion_matrix(y, proba, classes, threshold),
                   ("figures/roc_pr.png" if len(classes) == 2 else "figures/per_class.png"):
                       (roc_pr_curves if len(classes) == 2 else per_class_metrics)(y, proba, classes)}
    if any(history.values()):
        figures["figures/training_curves.png"] = training_curves({k: v for k, v in history.items() if v})
    if decision.get("champion_metrics") is not None and decision.get("improvement") is not None:
        figures["figures/gate_vs_champion.png"] = gate_comparison(decision)
    for path, fig in figures.items():
        client.log_figure(run_id, fig, path)
        plt.close(fig)
    return sorted(figures)
