"""``kfloop run``: run a pipeline locally and summarise it from the registry and the trigger's state."""
from __future__ import annotations

import time
from typing import Any

from pipelines.drift import drift_pipeline
from pipelines.local import run_local
from pipelines.params import pipeline_params
from training.settings import DEFAULT_MODEL_NAME, Environment, load_environment
from pipelines.training import training_pipeline

PIPELINES = {"training": training_pipeline, "drift": drift_pipeline}


def run_pipeline(name: str, settings: dict[str, Any], *, workdir: str | None = None,
                 env: Environment | None = None, quiet: bool = False) -> dict[str, Any]:
    """Run the ``training`` or ``drift`` pipeline with kfp.local and return its summary.

    Raises:
        ValueError: bad settings.
        pipelines.local.PipelineFailed: a step failed.
    """
    env = env or load_environment(workdir)
    params = pipeline_params(PIPELINES[name], settings)
    model_name = params.get("model_name", DEFAULT_MODEL_NAME)
    started = time.time()
    run = run_local(PIPELINES[name], params, env, quiet=quiet)
    if name == "training":
        summary = training_summary(model_name, run.output)
    else:
        summary = drift_summary(model_name, run.output, since=started)
    return {**summary, "seconds": round(run.seconds, 2)}


def training_summary(model_name: str, version: str) -> dict[str, Any]:
    """The contract fields of a training run: version, decision, champion, metrics, reason."""
    from training.registry import version_summary

    info = version_summary(model_name, version)
    return {"model_name": model_name, "model_version": version, "promoted": info.champion_version == version,
            "champion_version": info.champion_version, "metrics": info.metrics, "reason": info.reason,
            "decision": info.decision}


def drift_summary(model_name: str, drift_json: str, *, since: float) -> dict[str, Any]:
    """Verdict, per-column drift and what the trigger did (and the training run it started, if any)."""
    import json

    from monitoring.steps import last_trigger

    result = json.loads(drift_json)
    trigger = last_trigger(model_name, since=since)
    retrain = None
    if trigger is not None and trigger.get("model_version"):
        retrain = training_summary(model_name, trigger["model_version"])
    return {"model_name": model_name, **result, "trigger": trigger, "retrain": retrain}
