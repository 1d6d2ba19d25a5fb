"""The evaluate step: challenger against champion on the pinned holdout, the gate's decision with its reason."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from data.fileio import atomic_write_json
from data.holdout import verify_pinned
from data.settings import step_function
from data.tables import read_table
from training.figures import log_evaluation_figures
from training.gate import PromotionPolicy, align_proba, evaluate, kfp_metrics
from training.linear import linear_scores
from training.model import Predictor
from training.progress import progress
from training.registry.candidates import load_version_predictor
from training.registry.versions import get_champion


@dataclass(kw_only=True, slots=True)
class EvaluateResult:
    blessed: bool
    champion_version: str
    """The champion compared against; empty when there was none."""
    reason: str
    kfp_metrics: dict[str, float]


def score_against_champion(*, model_dir: str, holdout_path: str, holdout_sha256: str, model_name: str,
                           policy: dict[str, Any], champion=None):
    """Score challenger and ``champion`` (default: the current one) on the pinned holdout and decide.

    The baseline's priors are the challenger's training-split class shares (``class_counts`` in its
    ``model.json``); for regression the baseline predicts its training mean and the models are scored on their
    predicted values. Returns ``(decision, champion_info)``.

    Raises:
        ValueError: the holdout is not the pinned one, or the models disagree on the classes.
    """
    verify_pinned(holdout_path, holdout_sha256)
    holdout = read_table(holdout_path)
    challenger = Predictor.load(model_dir)
    target = challenger.description["target"]
    schema_categorical = challenger.transform.categorical
    rules = PromotionPolicy.from_dict({"slice_columns": list(schema_categorical), **policy})
    champion = champion if champion is not None else get_champion(model_name)
    if challenger.task == "regression":
        incumbent = None if champion is None else load_version_predictor(model_name, champion.version)
        decision = evaluate(y_true=holdout[target].to_numpy(), challenger_proba=_values(challenger, holdout),
                            champion_proba=None if incumbent is None else _values(incumbent, holdout), classes=[],
                            holdout=holdout, policy=rules,
                            train_mean=challenger.description["target_scale"]["mean"],
                            linear=_linear_baseline(challenger, holdout))
        return decision, champion
    champion_proba = champion_threshold = None
    if champion is not None:
        incumbent = load_version_predictor(model_name, champion.version)
        champion_proba = align_proba(incumbent.predict_proba(holdout), incumbent.classes, challenger.classes)
        champion_threshold = incumbent.threshold if incumbent.classes == challenger.classes else None
    counts = challenger.description.get("class_counts")  # absent from models trained before baselines
    decision = evaluate(y_true=holdout[target].to_numpy(), challenger_proba=challenger.predict_proba(holdout),
                        champion_proba=champion_proba, classes=challenger.classes, holdout=holdout, policy=rules,
                        train_priors=None if counts is None else np.asarray(counts) / sum(counts),
                        challenger_threshold=challenger.threshold, champion_threshold=champion_threshold,
                        linear=_linear_baseline(challenger, holdout))
    return decision, champion


def _linear_baseline(challenger: Predictor, rows) -> dict[str, Any] | None:
    """The linear baseline the challenger's training fitted (:mod:`training.linear`), scored on ``rows`` through
    the challenger's own preprocessing; ``None`` for a model trained before it was recorded."""
    record = challenger.description.get("linear_baseline")
    if record is None:
        return None
    out = linear_scores(record, challenger.transform.transform(rows).astype(np.float64))
    if challenger.task == "regression":
        scale = challenger.description["target_scale"]
        out = out * scale["std"] + scale["mean"]
    return {"kind": record["kind"], "rows": record["rows"], "threshold": record.get("threshold"), "proba": out}


def _values(predictor, rows):
    """A regression model's predictions as the gate's one-column matrix.

    Raises:
        ValueError: the model is a classifier (a champion of another task).
    """
    if predictor.task != "regression":
        raise ValueError("the champion is a classifier and the challenger a regression model; use another "
                         "model_name for a different prediction task")
    return predictor.predict_values(rows)[:, None]


@step_function
def evaluate_step(*, model_dir: str, holdout_path: str, holdout_sha256: str, model_name: str,
                  policy: dict[str, Any], report_out: str, run_id: str = "") -> EvaluateResult:
    """The gate: decision with its reason, written as the evaluation report JSON; with ``run_id`` the
    candidate's pictures (:func:`training.figures.log_evaluation_figures`) are logged to its training run."""
    decision, champion = score_against_champion(model_dir=model_dir, holdout_path=holdout_path,
                                                holdout_sha256=holdout_sha256, model_name=model_name,
                                                policy=policy)
    version = champion.version if champion is not None else ""
    atomic_write_json(report_out, decision.to_dict())
    if run_id:
        challenger = Predictor.load(model_dir)
        y, scored = challenger.scored(read_table(holdout_path))
        log_evaluation_figures(run_id, y=y, proba=scored, classes=challenger.classes, decision=decision.to_dict(),
                               threshold=challenger.threshold)
    progress(f"evaluate: {'blessed' if decision.blessed else 'not blessed'}: {decision.reason}")
    return EvaluateResult(blessed=decision.blessed, champion_version=version, reason=decision.reason,
                          kfp_metrics=kfp_metrics(decision))

