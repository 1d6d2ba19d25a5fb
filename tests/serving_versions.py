"""A registered version for the serving tests: a small model trained on :func:`test_registry_versions.make_frame`
rows, logged and registered as kfloop's pipeline does, with the features' inferred schema (so the served check
flags real violations)."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from test_registry_versions import TARGET, Env, build_model, make_frame

from data.validation import infer_schema, schema_to_yaml
from training.registry.candidates import log_candidate, register_candidate


def register_version(name: str, *, experiment_id: str, root: Path) -> tuple[str, pd.DataFrame]:
    """Register a version of ``name`` in the current MLflow (its artifacts in ``experiment_id``'s location); the
    version and holdout rows without the target."""
    client = mlflow.MlflowClient()
    train, holdout = make_frame(600, seed=0), make_frame(300, seed=1)
    env = Env(root=root, client=client, experiment_id=experiment_id, train=train, holdout=holdout,
              good=build_model(root / "good", train, steps=60), medium=root, bad=root)
    lineage = dataclasses.replace(env.lineage(), schema_yaml=schema_to_yaml(
        infer_schema(train, target=TARGET, task="classification")))
    run_id, decision = env.run(), env.decide(env.good, None).to_dict()
    uri = log_candidate(run_id, env.good, decision=decision, lineage=lineage)
    version = register_candidate(name, run_id=run_id, model_uri=uri, decision=decision, lineage=lineage)
    return version, holdout.drop(columns=[TARGET])


@contextmanager
def tracking(url: str, experiment: str) -> Iterator[str]:
    """MLflow (the environment and the client) pointed at ``url`` while inside; the id of a new ``experiment``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", url)
        mlflow.set_tracking_uri(url)
        try:
            yield mlflow.MlflowClient().create_experiment(experiment)
        finally:
            mlflow.set_tracking_uri(None)
