"""What monitoring leaves behind for people: every drift and quality check of a model as an MLflow run (verdict,
scores, Evidently's HTML report), linked from the champion it checked; and the trigger's cooldown state."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param

from data.fileio import utc_iso
from data.redaction import redact_text
from data.settings import load_environment
from training.registry.experiments import ensure_experiment
from training.registry.versions import DRIFT_REPORT_URI_TAG, QUALITY_REPORT_URI_TAG

DRIFT_EXPERIMENT_SUFFIX = "-drift"
"""Drift checks of model ``M`` are runs of experiment ``M-drift``."""
DRIFT_RESULT_ARTIFACT = "drift.json"
DRIFT_REPORT_ARTIFACT = "drift_report.html"
QUALITY_EXPERIMENT_SUFFIX = "-quality"
"""Quality checks of model ``M`` are runs of experiment ``M-quality``."""
QUALITY_RESULT_ARTIFACT = "quality.json"
QUALITY_REPORT_ARTIFACT = "quality_report.html"


def record_drift_check(model_name: str, checked: Any, *, current_uri: str, report_path: str | None) -> str:
    """Log one drift check (a :class:`monitoring.steps.checks.DriftStepResult`) as a run of ``<model>-drift``: metrics
    ``share_drifted_columns``, ``drifted`` and ``score.<column>``, the JSON verdict and the HTML report as
    artifacts; the champion version it checked gets a ``drift_report_uri`` tag pointing at the report.

    Returns:
        The run id.

    Raises:
        mlflow.exceptions.MlflowException: MLflow refused a call.
    """
    drift = checked.drift
    return _record_check(
        model_name, DRIFT_EXPERIMENT_SUFFIX, champion_version=checked.champion_version,
        metrics={"share_drifted_columns": drift.share_drifted_columns, "drifted": float(drift.drifted),
                 **{f"score.{col}": c.score for col, c in drift.columns.items()}},
        params={"current_uri": current_uri, "reference_uri": checked.reference_uri},
        tags={"kfloop.data_md5": checked.data_md5, "kfloop.drifted": str(drift.drifted).lower()},
        result=(DRIFT_RESULT_ARTIFACT, checked.to_dict()),
        report=(DRIFT_REPORT_ARTIFACT, report_path, DRIFT_REPORT_URI_TAG))


def record_quality_check(model_name: str, checked: Any, *, report_path: str | None) -> str:
    """Log one quality check (a :class:`monitoring.steps.checks.QualityStepResult`) as a run of ``<model>-quality``:
    metrics ``quality_value``, ``quality_baseline`` (each when defined), ``degraded`` and ``insufficient_labels``
    (0/1), tags ``kfloop.degraded`` (``true``/``false``), ``kfloop.verdict`` and ``kfloop.champion_version``,
    the JSON verdict (``kfloop quality --json`` plus
    ``champion_version`` and ``slices``) as ``quality.json`` and Evidently's HTML report; the champion version it
    checked gets a ``quality_report_uri`` tag pointing at the report.

    Returns:
        The run id.

    Raises:
        mlflow.exceptions.MlflowException: MLflow refused a call.
    """
    quality = checked.quality
    return _record_check(
        model_name, QUALITY_EXPERIMENT_SUFFIX, champion_version=checked.champion_version,
        metrics={k: v for k, v in {"quality_value": quality.value, "quality_baseline": quality.baseline,
                                   "degraded": float(quality.degraded),
                                   "insufficient_labels": float(quality.verdict == "insufficient_labels")}.items()
                 if math.isfinite(v)},
        params={"labelled_uri": checked.labelled_uri, "labels_uri": checked.labels_uri, "metric": quality.metric},
        tags={"kfloop.data_md5": checked.data_md5, "kfloop.degraded": str(quality.degraded).lower(),
              "kfloop.verdict": quality.verdict},
        result=(QUALITY_RESULT_ARTIFACT, checked.to_dict()),
        report=(QUALITY_REPORT_ARTIFACT, report_path, QUALITY_REPORT_URI_TAG))


def _record_check(model_name: str, suffix: str, *, champion_version: str | None, metrics: dict[str, float],
                  params: dict[str, str], tags: dict[str, str], result: tuple[str, dict[str, Any]],
                  report: tuple[str, str | None, str]) -> str:
    """One check as a finished run of experiment ``<model><suffix>``: ``result`` and ``report`` are (artifact
    name, content) and (artifact name, local HTML file, version tag that links it from the champion)."""
    client = mlflow.MlflowClient()
    experiment_id = ensure_experiment(model_name + suffix, load_environment())
    run = client.create_run(experiment_id, tags={"kfloop.champion_version": champion_version or "none", **tags})
    run_id = run.info.run_id
    now_ms = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now_ms, 0) for k, v in metrics.items()],
                     params=[Param(k, redact_text(v)[:6000]) for k, v in params.items()])
    client.log_dict(run_id, result[1], result[0])
    artifact, report_path, tag = report
    if report_path and Path(report_path).is_file():
        client.log_text(run_id, Path(report_path).read_text(encoding="utf-8"), artifact)
        if champion_version:
            client.set_model_version_tag(model_name, champion_version, tag, f"{run.info.artifact_uri}/{artifact}")
    client.set_terminated(run_id, "FINISHED")
    return run_id


def drift_checks(model_name: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """The recorded drift checks of ``model_name``, oldest first: ``at`` (UTC ISO), ``run_id``, ``drifted``,
    ``share_drifted_columns``, ``columns`` ({name: {method, score, threshold, drifted}}), ``champion_version``,
    ``data_md5``, ``current_uri``. Empty when none was recorded.

    Raises:
        mlflow.exceptions.MlflowException: MLflow could not be read.
    """
    return [{**head, "drifted": result["drifted"], "share_drifted_columns": result["share_drifted_columns"],
             "columns": result["columns"], "champion_version": result.get("champion_version"),
             "data_md5": result.get("data_md5"), "current_uri": run.data.params.get("current_uri")}
            for head, run, result in _recorded_checks(model_name, DRIFT_EXPERIMENT_SUFFIX, DRIFT_RESULT_ARTIFACT,
                                                      limit)]


def quality_checks(model_name: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """The recorded quality checks of ``model_name``, oldest first: ``at`` (UTC ISO), ``run_id``, ``degraded``,
    ``verdict`` (``degraded`` or ``not_degraded`` for checks recorded before there were others), ``labels``,
    ``metric``, ``value``, ``baseline``, ``ci_low``, ``ci_high``, ``rows``, ``reason``, ``champion_version``,
    ``slices`` (see :class:`monitoring.quality.QualityResult`). Empty when none was recorded.

    Raises:
        mlflow.exceptions.MlflowException: MLflow could not be read.
    """
    keys = ("degraded", "metric", "value", "baseline", "ci_low", "ci_high", "rows", "reason", "champion_version",
            "slices", "labels", "holdout_uncertainty")
    return [{**head, **{k: result.get(k) for k in keys},
             "verdict": result.get("verdict") or ("degraded" if result["degraded"] else "not_degraded")}
            for head, _, result in _recorded_checks(model_name, QUALITY_EXPERIMENT_SUFFIX, QUALITY_RESULT_ARTIFACT,
                                                    limit)]


def _recorded_checks(model_name: str, suffix: str, artifact: str, limit: int) -> list[tuple[dict[str, Any], Any,
                                                                                          dict[str, Any]]]:
    """The last ``limit`` runs of ``<model><suffix>``, oldest first, each as (``{at, run_id}``, the run, its
    ``artifact`` JSON)."""
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(model_name + suffix)
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"],
                              max_results=limit)
    return [({"at": utc_iso(run.info.start_time / 1000), "run_id": run.info.run_id}, run,
             mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/{artifact}")) for run in reversed(runs)]


def trigger_status(store: Any, model_name: str, *, cooldown_seconds: float, now: float) -> dict[str, Any]:
    """The trigger's state for ``model_name`` from ``store`` (a :class:`monitoring.trigger.TriggerStore`): last
    check, last fired run, whether the cooldown holds and until when.

    Raises:
        monitoring.trigger.TriggerStateError: the stored state is unusable.
    """
    entry = store.load()["models"].get(model_name) or {"fired": [], "last_check": None}
    last_fired = max(entry["fired"], key=lambda f: f["at"]) if entry["fired"] else None
    until = last_fired["at"] + cooldown_seconds if last_fired else None
    check = entry["last_check"]
    return {"store": str(store.path),
            "last_check": None if check is None else {**check, "at": utc_iso(check["at"])},
            "last_fired": None if last_fired is None else {"at": utc_iso(last_fired["at"]),
                                                            "run_id": last_fired["run_id"],
                                                            "data_hash": last_fired["data_hash"]},
            "in_cooldown": until is not None and now < until,
            "cooldown_until": None if until is None else utc_iso(until)}

