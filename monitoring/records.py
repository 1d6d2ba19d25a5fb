"""What monitoring leaves behind for people: every drift check of a model as an MLflow run (verdict, per-column
scores, Evidently's HTML report), linked from the champion it checked; the quality checks' runs; and the trigger's
cooldown state."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from monitoring.trigger import utc_iso
from training.registry.versions import DRIFT_REPORT_URI_TAG

DRIFT_EXPERIMENT_SUFFIX = "-drift"
"""Drift checks of model ``M`` are runs of experiment ``M-drift``."""
DRIFT_RESULT_ARTIFACT = "drift.json"
DRIFT_REPORT_ARTIFACT = "drift_report.html"
QUALITY_EXPERIMENT_SUFFIX = "-quality"
"""Quality checks of model ``M`` (its champion scored on rows whose labels arrived) are runs of ``M-quality``."""
QUALITY_RESULT_ARTIFACT = "quality.json"


def record_drift_check(model_name: str, checked: Any, *, current_uri: str, report_path: str | None) -> str:
    """Log one drift check (a :class:`monitoring.steps.DriftStepResult`) as a run of ``<model>-drift``: metrics
    ``share_drifted_columns``, ``drifted`` and ``score.<column>``, the JSON verdict and the HTML report as
    artifacts; the champion version it checked gets a ``drift_report_uri`` tag pointing at the report.

    Returns:
        The run id.

    Raises:
        mlflow.exceptions.MlflowException: MLflow refused a call.
    """
    import mlflow
    from mlflow.entities import Metric, Param, RunTag

    from training.settings import load_environment
    from training.steps import ensure_experiment

    client = mlflow.MlflowClient()
    experiment_id = ensure_experiment(model_name + DRIFT_EXPERIMENT_SUFFIX, load_environment())
    drift = checked.drift
    run = client.create_run(experiment_id, tags={"kfloop.champion_version": checked.champion_version or "none",
                                                 "kfloop.data_md5": checked.data_md5})
    run_id = run.info.run_id
    now_ms = int(time.time() * 1000)
    metrics = {"share_drifted_columns": drift.share_drifted_columns, "drifted": float(drift.drifted),
               **{f"score.{col}": c.score for col, c in drift.columns.items()}}
    client.log_batch(run_id, metrics=[Metric(k, float(v), now_ms, 0) for k, v in metrics.items()],
                     params=[Param("current_uri", current_uri[:6000]),
                             Param("reference_uri", checked.reference_uri[:6000])],
                     tags=[RunTag("kfloop.drifted", str(drift.drifted).lower())])
    client.log_dict(run_id, checked.to_dict(), DRIFT_RESULT_ARTIFACT)
    if report_path and Path(report_path).is_file():
        client.log_text(run_id, Path(report_path).read_text(encoding="utf-8"), DRIFT_REPORT_ARTIFACT)
        report_uri = f"{run.info.artifact_uri}/{DRIFT_REPORT_ARTIFACT}"
        if checked.champion_version:
            client.set_model_version_tag(model_name, checked.champion_version, DRIFT_REPORT_URI_TAG, report_uri)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def drift_checks(model_name: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """The recorded drift checks of ``model_name``, oldest first: ``at`` (UTC ISO), ``run_id``, ``drifted``,
    ``share_drifted_columns``, ``columns`` ({name: {method, score, threshold, drifted}}), ``champion_version``,
    ``data_md5``, ``current_uri``. Empty when none was recorded.

    Raises:
        mlflow.exceptions.MlflowException: MLflow could not be read.
    """
    return [{"at": utc_iso(run.info.start_time / 1000), "run_id": run.info.run_id,
             "drifted": result["drifted"], "share_drifted_columns": result["share_drifted_columns"],
             "columns": result["columns"], "champion_version": result.get("champion_version"),
             "data_md5": result.get("data_md5"), "current_uri": run.data.params.get("current_uri")}
            for run, result in _checks(model_name + DRIFT_EXPERIMENT_SUFFIX, DRIFT_RESULT_ARTIFACT, limit)]


def quality_checks(model_name: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """The recorded quality checks of ``model_name``, oldest first: ``at`` (UTC ISO), ``run_id``, ``degraded``,
    ``metric``, ``value``, ``baseline``, ``ci_low``, ``ci_high``, ``rows``, ``reason``, ``champion_version``. Empty
    when none was recorded.

    Raises:
        mlflow.exceptions.MlflowException: MLflow could not be read.
    """
    return [{"at": utc_iso(run.info.start_time / 1000), "run_id": run.info.run_id,
             **{key: result.get(key) for key in ("degraded", "metric", "value", "baseline", "ci_low", "ci_high",
                                                 "rows", "reason", "champion_version")}}
            for run, result in _checks(model_name + QUALITY_EXPERIMENT_SUFFIX, QUALITY_RESULT_ARTIFACT, limit)]


def _checks(experiment_name: str, artifact: str, limit: int) -> list[tuple[Any, dict[str, Any]]]:
    """The last ``limit`` runs of ``experiment_name``, oldest first, each with its JSON ``artifact``."""
    import mlflow

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"],
                              max_results=limit)
    return [(run, mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/{artifact}")) for run in reversed(runs)]


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

