"""A quality check recorded the way ``kfloop quality`` records it (a run of ``<model>-quality``: metrics
``quality_value``, ``quality_baseline``, ``degraded``, tag ``kfloop.degraded``, artifact ``quality.json``), written
with the MLflow client for tests of what reads those records."""
from __future__ import annotations

import mlflow

from data.settings import load_environment
from monitoring.records import QUALITY_EXPERIMENT_SUFFIX, QUALITY_RESULT_ARTIFACT
from training.registry.experiments import ensure_experiment


def record_quality_check(model_name: str, *, degraded: bool, value: float, baseline: float,
                         metric: str = "accuracy", champion_version: str | None = "1") -> str:
    """Record one check; returns its run id."""
    client = mlflow.MlflowClient()
    experiment_id = ensure_experiment(model_name + QUALITY_EXPERIMENT_SUFFIX, load_environment())
    run_id = client.create_run(experiment_id, tags={"kfloop.degraded": str(degraded).lower()}).info.run_id
    for key, number in (("quality_value", value), ("quality_baseline", baseline), ("degraded", float(degraded))):
        client.log_metric(run_id, key, number)
    client.log_dict(run_id, {"degraded": degraded, "metric": metric, "value": value, "baseline": baseline,
                             "ci_low": value - 0.02, "ci_high": value + 0.02, "rows": 500,
                             "reason": f"{metric} {value} vs holdout {baseline}",
                             "champion_version": champion_version}, QUALITY_RESULT_ARTIFACT)
    client.set_terminated(run_id, "FINISHED")
    return run_id
