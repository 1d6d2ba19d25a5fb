"""The training pipeline's steps as plain functions. Each component calls one; each runs without KFP."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow.entities import Param

from data.dvc_store import DataStoreConfig, keep
from data.engine import DataEngine
from data.fileio import atomic_write_json, atomic_write_text
from data.holdout import split_holdout, verify_pinned, write_parquet
from data.profiles import ReferenceProfile, profile_table
from data.settings import CODE_ROOT, Environment, load_environment, step_function
from data.storage import record_uri, redact
from data.tables import local_copy, read_table
from data.validation import ValidationError, infer_schema, load_schema, schema_roles, schema_to_yaml, validate
from training.config import TrainingConfig, TrainingSection
from training.figures import log_evaluation_figures
from training.gate import PromotionPolicy, align_proba, evaluate, kfp_metrics
from training.linear import linear_scores
from training.launch.backends import backend_named, step_backend
from training.model import Predictor
from training.model_code import MODULE_PREFIX
from training.model_files import JOB_SHAPE_FILE, MODEL_FILE
from training.progress import progress
from training.registry.experiments import ensure_experiment
from training.registry.versions import (Lineage, champion_schema, get_champion, load_version_predictor, log_candidate,
                                        promote, register_candidate)


# ---------------------------------------------------------------------------------------------------- validate

@dataclass(kw_only=True, slots=True)
class ValidateResult:
    data_md5: str
    """md5 of the data file: the hash DVC records for it."""
    data_version: str
    """The object store's version id or ETag of the data; empty for a local file."""
    target: str
    schema_source: str
    """``schema_uri``, ``champion vN`` or ``inferred`` (first run only)."""
    rows: int


def resolve_schema(read_data, *, dataset_uri: str, schema_uri: str, target: str, model_name: str, task: str = ""):
    """The schema a training run validates against: ``schema_uri``, else the champion's recorded schema, else
    (the very first run, no champion) one inferred for ``task`` (default classification) from this data, which
    ``read_data()`` reads whole.

    Raises:
        ValueError: no schema and no target to infer one, or a target or task that contradicts the schema.
    """
    if schema_uri:
        schema, source = load_schema(schema_uri), schema_uri
    elif (recorded := champion_schema(model_name)) is not None:
        schema, source = load_schema(recorded), f"champion v{get_champion(model_name).version}"
    elif target:
        schema, source = infer_schema(read_data(), target=target, task=task or "classification"), "inferred"
    else:
        raise ValueError(f"{dataset_uri}: model '{model_name}' has no champion schema to validate against; pass "
                         "schema_uri=FILE, or target=COLUMN to infer a schema on this first run")
    roles = schema_roles(schema)
    if target and target != roles.target:
        raise ValueError(f"target '{target}' differs from the schema's target '{roles.target}' ({source}); "
                         f"use another model_name for a different prediction task")
    if task and task != roles.task:
        raise ValueError(f"task '{task}' differs from the schema's task '{roles.task}' ({source}); use another "
                         "model_name for a different prediction task, or set metadata.kfloop.task in the schema")
    return schema, source


@step_function
def validate_step(*, dataset_uri: str, schema_uri: str, target: str, model_name: str,
                  schema_out: str, task: str = "") -> ValidateResult:
    """Validate the dataset before any GPU is spent and write the schema used.

    Raises:
        data.tables.DataFileError: the file is unusable.
        data.validation.ValidationError: every failed rule, in one report.
    """
    with local_copy(dataset_uri) as (path, data):
        schema, source = resolve_schema(lambda: read_table(path), dataset_uri=data.uri, schema_uri=schema_uri,
                                        target=target, model_name=model_name, task=task)
        report = validate(path, schema)
    report.source = data.uri
    if not report.ok:
        for line in [*report.format_diff().splitlines(), *report.format().splitlines()]:
            progress(f"validate: {line}")
        raise ValidationError(report)
    atomic_write_text(schema_out, schema_to_yaml(schema))
    progress(f"validate: {data.uri}: {report.n_rows} rows valid against schema from {redact(source)}")
    return ValidateResult(data_md5=data.md5, data_version=data.version, target=schema_roles(schema).target,
                          schema_source=redact(source), rows=report.n_rows)


def split_step(*, dataset_uri: str, fraction: float, seed: int, train_out: str, holdout_out: str) -> str:
    """Split off the holdout; returns its sha256, which pins the evaluation."""
    train, holdout = split_holdout(read_table(dataset_uri), fraction=fraction, seed=seed)
    write_parquet(train, train_out)
    sha = write_parquet(holdout, holdout_out)
    progress(f"split: {len(train)} training rows, {len(holdout)} holdout rows (sha256 {sha[:12]})")
    return sha


# ---------------------------------------------------------------------------------------------------- train

FAILURE_ARTIFACTS = "training-failure"
IMAGE_TAG = "kfloop.image"
"""Tag of the training run: the image its processes ran (the job's on Kubernetes), copied into the lineage."""
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
        training.launch.local.LaunchError: a rank failed (or, on Kubernetes, the job); the message names it and its error.
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
                           checkpoint_dir=out.parent / f".{out.name}-checkpoints", log_dir=env.workdir / "logs" / f"train-{stamp}", run_name=f"train-{stamp}")


# ---------------------------------------------------------------------------------------------------- evaluate

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


# ---------------------------------------------------------------------------------------------------- registry

@step_function
def register_step(*, model_dir: str, report_path: str, schema_path: str, run_id: str, model_name: str,
                  dataset_uri: str, data_md5: str, holdout_sha256: str, pipeline_run_id: str,
                  champion_version: str, holdout_fraction: float, split_seed: int, data_version: str = "",
                  data_store: dict[str, Any] | None = None, drift_policy: dict[str, Any] | None = None) -> str:
    """Log the model into its training run and register it as a version with decision, reason, lineage (the
    split's fraction and seed included, so ``kfloop reproduce`` splits the same way) and the reference profile of
    its training data with its predictions on it (one streaming pass, on Ray with ``drift_policy``'s ``engine: ray``:
    :func:`reference_profile`; drift checks compare with it). First the
    training data is kept where DVC finds it by its md5 (:func:`data.dvc_store.keep`, the ``data_store``
    settings), so ``kfloop reproduce`` can fetch it whatever it was read from; nothing is logged or registered when
    that fails.

    Raises:
        data.dvc_store.DataStoreError: the data is over ``data_store.max_bytes``, changed during the run, or
            cannot be written to the data store.
        data.storage.StorageError: the data cannot be read.
        ValueError: ``drift_policy`` names an unknown engine.
    """
    engine = DataEngine.of_policy(drift_policy)
    kept = keep(dataset_uri, data_md5, config=DataStoreConfig.from_dict(data_store),
                workdir=load_environment().workdir, repo_root=CODE_ROOT)
    progress(f"register: data md5 {data_md5} {'copied into' if kept.copied else 'already in'} {kept.location}")
    decision = json.loads(Path(report_path).read_text())
    predictor = Predictor.load(model_dir)
    description = predictor.description
    profile = reference_profile(dataset_uri, load_schema(Path(schema_path).read_text()), predict=predictor.predict,
                                engine=engine)
    config = description["config"]
    lineage = Lineage(data_md5=data_md5, data_uri=record_uri(dataset_uri), data_version=data_version,
                      holdout_sha256=holdout_sha256,
                      git_commit=load_environment().git_commit, pipeline_run_id=pipeline_run_id,
                      seed=TrainingConfig.from_dict(config).seed, schema_yaml=Path(schema_path).read_text(),
                      previous_champion=champion_version or None, training_config=config,
                      job_shape=json.loads((Path(model_dir) / JOB_SHAPE_FILE).read_text()),
                      decision_threshold=description.get("decision_threshold"),
                      threshold_choice=description.get("threshold_choice", {}),
                      holdout_fraction=holdout_fraction, split_seed=split_seed, data_store=kept.data_store,
                      model_module=description["model"]["module"],
                      model_module_sha256=description["model"]["sha256"],
                      image=mlflow.MlflowClient().get_run(run_id).data.tags.get(IMAGE_TAG, ""))
    model_uri = log_candidate(run_id, model_dir, decision=decision, lineage=lineage, profile=profile)
    version = register_candidate(model_name, run_id=run_id, model_uri=model_uri, decision=decision, lineage=lineage)
    progress(f"register: {model_name} v{version} ({'promote' if decision['blessed'] else 'reject'})")
    return version


def reference_profile(dataset_uri: str, schema: Any, *, predict: Any, engine: DataEngine) -> ReferenceProfile:
    """The reference profile of the training data registered with a version: read here chunk by chunk
    (:func:`data.profiles.profile_table`), or with ``engine: ray`` by Ray Data on ``engine.ray_address`` (a local
    Ray when empty), each block profiled there by the same per-chunk code, the model's code shipped to the workers
    (:func:`data.ray_blocks.profile_table_on_ray`)."""
    if engine.engine == "local":
        return profile_table(dataset_uri, schema, predict=predict)
    from data.ray_blocks import profile_table_on_ray, ship_modules  # Ray: the optional ray extra, engine: ray only
    from data.ray_cluster import ray_session
    with ray_session(engine.ray_address):
        progress(f"register: profile on Ray ({redact(engine.ray_address) if engine.ray_address else 'a local Ray'})")
        ship_modules(MODULE_PREFIX)
        return profile_table_on_ray(dataset_uri, schema, predict=predict)


@step_function
def promote_step(*, model_name: str, version: str, compared_against: str, model_dir: str, holdout_path: str,
                 holdout_sha256: str, policy: dict[str, Any]):
    """Move ``champion`` under the lock; if the champion changed since the gate, re-decide against it first."""
    def recheck(current):
        decision, _ = score_against_champion(model_dir=model_dir, holdout_path=holdout_path,
                                             holdout_sha256=holdout_sha256, model_name=model_name,
                                             policy=policy, champion=current)
        return decision

    result = promote(model_name, version, compared_against=compared_against or None, recheck=recheck,
                     lock=step_backend().promotion_lock(model_name, load_environment().workdir))
    progress(f"promote: {model_name} v{version}: {'champion' if result.promoted else 'not promoted'}"
              f" ({result.reason})")
    return result
