"""The training step: DDP training in one MLflow run, on the backend the shape names (torchrun here, a Kubernetes
job, Ray), and ``kfloop train``'s training without the registry."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Param

from data.fileio import atomic_write_json
from data.settings import Environment, load_environment, step_function
from data.validation import ValidationError, load_schema, validate
from training.config import TrainingSection
from training.launch.backends import backend_named
from training.model_files import JOB_SHAPE_FILE, MODEL_FILE
from training.progress import progress
from training.registry.experiments import IMAGE_TAG, ensure_experiment


FAILURE_ARTIFACTS = "training-failure"
"""Artifact folder of a failed training run: the launch's logs and error files."""


@dataclass(kw_only=True, slots=True)
class TrainStepResult:
    run_id: str
    """MLflow run holding params, per-epoch metrics and (after registration) the model."""
    metrics: dict[str, float]
    world_size: int


def _unfinished_run(client, experiment_id: str, pipeline_run_id: str) -> str | None:
    """The MLflow run a killed launch step of this pipeline run left RUNNING: its retry attaches to that step's
    Kubernetes job, which logs into this run."""
    runs = client.search_runs([experiment_id], max_results=1, filter_string=(
        f"tags.`kfloop.pipeline_run_id` = '{pipeline_run_id}' and attributes.status = 'RUNNING'"))
    return runs[0].info.run_id if runs else None


@step_function
def train_step(*, train_path: str, schema_path: str, model_name: str, config: dict[str, Any], nnodes: int,
               nproc_per_node: int, backend: str, pipeline_run_id: str, model_dir: str,
               cluster: dict[str, Any] | None = None, model: dict[str, Any] | None = None) -> TrainStepResult:
    """Train in one MLflow run (rank 0 logs params and per-epoch metrics); on error the launch's logs and error
    files become the run's ``training-failure`` artifacts and the run is marked FAILED. ``model`` is the model
    plug-in (:class:`training.config.ModelSpec`; default the built-in MLP). ``backend=kubernetes``
    runs a PyTorchJob on ``cluster`` (training/launch/kubernetes.py); a retry of the step reuses the run it left.

    Raises:
        training.launch.local.LaunchError: a rank failed (or, on Kubernetes, the job); the message names it and
            its error.
        ValueError: a bad training or cluster config.
    """
    settings = TrainingSection.from_dict({**config, "nnodes": nnodes, "nproc_per_node": nproc_per_node,
                                          "backend": backend, "model": model or {}})
    shape = settings.shape
    launcher = backend_named(shape.backend, cluster)
    env = load_environment()
    client = mlflow.MlflowClient()
    experiment_id = ensure_experiment(model_name, env)
    run_id = _unfinished_run(client, experiment_id, pipeline_run_id) if launcher.attaches_to_unfinished_run else None
    if run_id is None:
        run_id = client.create_run(experiment_id, tags={"kfloop.pipeline_run_id": pipeline_run_id,
                                                        "kfloop.git_commit": env.git_commit,
                                                        IMAGE_TAG: launcher.image}).info.run_id
        client.log_batch(run_id, params=[Param(k, str(v)) for k, v in shape.to_dict().items()])
    progress(f"train: {shape.nnodes} node(s) x {shape.nproc_per_node} rank(s), MLflow run {run_id}")
    log_dir = env.workdir / "logs" / pipeline_run_id
    try:
        result = launcher.launch(settings.config, shape, train_path, schema_path, model_dir=Path(model_dir),
                                 checkpoint_dir=env.workdir / "checkpoints" / pipeline_run_id, log_dir=log_dir,
                                 run_name=pipeline_run_id, mlflow_run_id=run_id)
    except BaseException:
        if log_dir.is_dir():  # node logs and torchrun's error files, for the post-mortem
            client.log_artifacts(run_id, str(log_dir), FAILURE_ARTIFACTS)
        client.set_terminated(run_id, "FAILED")
        raise
    atomic_write_json(Path(model_dir) / JOB_SHAPE_FILE, shape.to_dict())
    client.set_terminated(run_id, "FINISHED")
    progress(f"train: done in {result.seconds:.1f} s, " +
              ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.metrics.items())))
    choice = json.loads((Path(model_dir) / MODEL_FILE).read_text()).get("threshold_choice")
    if choice:
        label = "the most probable class" if choice["metric"] == "none" else f"threshold for {choice['metric']}"
        progress(f"train: decision: {label} ({choice['reason']})")
    return TrainStepResult(run_id=run_id, metrics=result.metrics, world_size=result.world_size)


def train_only(*, data: str, schema: str, training: dict[str, Any], env: Environment, model_dir: str | None,
               cluster: dict[str, Any] | None = None):
    """``kfloop train``: validate, then train on the whole file, no registry (``backend=kubernetes``: as a
    PyTorchJob on ``cluster``).

    Raises:
        data.validation.ValidationError: the data does not match the schema.
        training.launch.local.LaunchError: a rank (or the Kubernetes job) failed.
    """
    settings = TrainingSection.from_dict(training)
    launcher = backend_named(settings.shape.backend, cluster)
    report = validate(data, load_schema(schema))
    if not report.ok:
        raise ValidationError(report)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(model_dir) if model_dir else env.workdir / "models" / stamp
    return launcher.launch(settings.config, settings.shape, data, schema, model_dir=out,
                           checkpoint_dir=out.parent / f".{out.name}-checkpoints",
                           log_dir=env.workdir / "logs" / f"train-{stamp}", run_name=f"train-{stamp}")

