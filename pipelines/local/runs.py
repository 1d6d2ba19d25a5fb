"""``kfloop run``: run a pipeline locally and summarise it from the registry and the trigger's state."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import mlflow

from data.settings import DEFAULT_MODEL_NAME, Environment, load_environment
from monitoring.steps.trigger import trigger_store
from pipelines.compile import PIPELINES
from pipelines.config import pipeline_params
from pipelines.local.runner import run_local
from training.registry.versions import VersionRecord, get_champion, holdout_metrics


def run_pipeline(name: str, settings: dict[str, Any], *, workdir: str | None = None,
                 env: Environment | None = None, quiet: bool = False) -> dict[str, Any]:
    """Run the ``training``, ``drift`` or ``quality`` pipeline with kfp.local and return its summary.

    Raises:
        ValueError: bad settings.
        pipelines.local.runner.PipelineFailed: a step failed.
    """
    env = env or load_environment(workdir)
    params = pipeline_params(PIPELINES[name], settings)
    model_name = params.get("model_name", DEFAULT_MODEL_NAME)
    started = time.time()
    run = run_local(PIPELINES[name], params, env, quiet=quiet)
    if name == "training":
        summary = training_summary(model_name, run.output)
    else:
        summary = check_summary(model_name, run.output, since=started)
    return {**summary, "seconds": round(run.seconds, 2),
            "step_seconds": {step: round(t, 2) for step, t in run.step_seconds.items()}}


def training_summary(model_name: str, version: str) -> dict[str, Any]:
    """The contract fields of a training run: version, decision, champion, metrics, reason."""
    client = mlflow.MlflowClient()
    mv = client.get_model_version(model_name, version)
    champion = get_champion(model_name, client=client)
    champion_version = champion.version if champion else None
    record = VersionRecord.of(mv)
    return {"model_name": model_name, "model_version": version, "promoted": champion_version == version,
            "champion_version": champion_version, "decision": record.decision, "reason": record.reason,
            "metrics": holdout_metrics(client, mv.run_id)}


def check_summary(model_name: str, check_result: Any, *, since: float) -> dict[str, Any]:
    """A drift or quality check's verdict (its JSON result) and what the trigger did (and the training run it
    started, if any)."""
    result = json.loads(Path(check_result.path).read_text())
    trigger = trigger_store(model_name).last_check(model_name, since=since)
    retrain = None
    if trigger is not None and trigger["run_id"]:  # a local run's id is the version it registered
        retrain = training_summary(model_name, trigger["run_id"])
    return {"model_name": model_name, **result, "trigger": trigger, "retrain": retrain}
