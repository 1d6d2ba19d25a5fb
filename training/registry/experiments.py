"""The MLflow experiments kfloop's runs go into: training runs under the model's name, drift and quality checks
under ``<model>-drift`` / ``<model>-quality``."""
from __future__ import annotations

import mlflow

from data.settings import Environment

IMAGE_TAG = "kfloop.image"
"""Tag of a training run: the image its processes ran (the job's on Kubernetes), copied into the lineage."""


def ensure_experiment(name: str, env: Environment) -> str:
    """The MLflow experiment ``name`` (created on first use; artifacts under the workdir when the
    tracking store is a local database)."""
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = env.artifact_root.as_uri() if env.tracking_uri.startswith("sqlite:") else None
    return client.create_experiment(name, artifact_location=location)
