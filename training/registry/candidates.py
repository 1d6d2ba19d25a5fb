"""Candidates into the MLflow registry and versions back out as predictors: :func:`log_candidate` logs a trained
model directory as a models-from-code pyfunc model (:mod:`training.pyfunc_model`) with its decision, lineage and
reference profile, :func:`register_candidate` makes it a version, :func:`load_version_predictor` scores a version
from its verified model directory. Apart from :mod:`training.registry.versions` because these load torch (the
predictor) and the gate: a step that only looks versions up (validation, the trigger) does without them.
"""
from __future__ import annotations

import math
import tempfile
import time
from contextlib import nullcontext
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.entities import Metric, RunTag
from mlflow.models import ModelSignature
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

from data.fileio import file_digest
from data.profiles import PROFILE_ARTIFACT, ReferenceProfile
from data.redaction import redact_text
from data.schema_rules import ON_VIOLATION_MODES, ON_VIOLATION_PARAM, VIOLATIONS_COLUMN
from data.text import shorten
from training.gate import Decision, kfp_metrics
from training.model import Predictor
from training.model_files import WEIGHTS_FILE
from training.registry.manifest import MANIFEST_SHA_TAG, MANIFEST_TAG, TamperedModelError, manifest_sha256
from training.registry.versions import (EVALUATION_ARTIFACT, LINEAGE_ARTIFACT, MODEL_ARTIFACT, MODULE_TAG,
                                        PYFUNC_MODEL_FILE, SCHEMA_ARTIFACT, WEIGHTS_TAG, MAX_TAG_CHARS,
                                        Lineage, download_model_dir, ensure_registered_model, logged_manifest,
                                        registry_client)

SERVING_REQUIREMENTS = ("mlflow", "torch", "safetensors", "numpy", "pandas", "pandera", "pyyaml")
"""Distributions the pyfunc model needs at load time, pinned to the installed versions (local part dropped)."""


def log_candidate(run_id: str, model_dir: str | Path, *, decision: dict[str, Any], lineage: Lineage,
                  profile: ReferenceProfile | None = None) -> str:
    """Log the model directory (the model module's source included) as a pyfunc model into the existing run
    ``run_id``, the module's sha256 in its ``model_config`` (checked at load), with ``schema.yaml``,
    ``evaluation.json`` (``decision``), ``lineage.json``, the reference ``profile`` of its training data (as
    ``reference_profile.json``, what drift checks of this version compare with), the gate's scalars as ``eval_*``
    metrics, and the weights' sha256, lineage and the sha256 of the logged model's manifest (every file's sha256:
    :mod:`training.registry.manifest`, read back right after logging) as ``kfloop.*`` run tags. Uses the tracking
    URI MLflow resolves (``MLFLOW_TRACKING_URI`` / ``mlflow.set_tracking_uri``).

    Returns:
        The logged model's URI (``models:/<model_id>``), for :func:`register_candidate`.

    Raises:
        FileNotFoundError: ``model_dir`` is not a complete model directory.
        ValueError: ``decision`` is not a :meth:`training.gate.Decision.to_dict` result.
        mlflow.exceptions.MlflowException: the run does not exist, or another run is active in this process.
    """
    model_dir = Path(model_dir)
    predictor = Predictor.load(model_dir)
    scalars = kfp_metrics(_decision(decision))
    weights_sha = file_digest(model_dir / WEIGHTS_FILE)
    module_sha = predictor.description["model"]["sha256"]
    if lineage.model_module_sha256 and lineage.model_module_sha256 != module_sha:
        raise ValueError(f"lineage.model_module_sha256={lineage.model_module_sha256} differs from {model_dir}'s "
                         f"module sha256 {module_sha}: record the lineage of this model directory")
    client = mlflow.MlflowClient()
    active = mlflow.active_run()
    with (nullcontext() if active is not None and active.info.run_id == run_id else mlflow.start_run(run_id=run_id)),\
            tempfile.TemporaryDirectory() as tmp:
        schema_file = Path(tmp) / SCHEMA_ARTIFACT
        schema_file.write_text(lineage.schema_yaml, encoding="utf-8")
        info = mlflow.pyfunc.log_model(
            name=MODEL_ARTIFACT, **served_model(model_dir, predictor, schema_file),
            pip_requirements=[f"{d}=={dist_version(d).split('+')[0]}" for d in SERVING_REQUIREMENTS])
    client.log_text(run_id, lineage.schema_yaml, SCHEMA_ARTIFACT)
    manifest = logged_manifest(info.model_uri, client=client)
    client.log_dict(run_id, decision, EVALUATION_ARTIFACT)
    client.log_dict(run_id, lineage.to_dict(), LINEAGE_ARTIFACT)
    if profile is not None:
        client.log_text(run_id, profile.to_json(), PROFILE_ARTIFACT)
    now_ms = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(f"eval_{k}", v, now_ms, 0) for k, v in scalars.items()],
                     tags=[RunTag(f"kfloop.{k}", v) for k, v in {**lineage.tags(), WEIGHTS_TAG: weights_sha,
                                                                 MODULE_TAG: module_sha,
                                                                 MANIFEST_SHA_TAG: manifest_sha256(manifest)}.items()])
    return info.model_uri


def register_candidate(model_name: str, *, run_id: str, model_uri: str, decision: dict[str, Any],
                       lineage: Lineage, client: "mlflow.MlflowClient | None" = None) -> str:
    """Register the candidate logged by :func:`log_candidate` as a new version of ``model_name`` (created if
    needed), tagged with its decision (``promote``/``reject``), reason, lineage, weights sha256 and the manifest of
    its files (:data:`training.registry.manifest.MANIFEST_TAG`, computed again from the stored model and checked
    against the digest :func:`log_candidate` recorded on the run); the full reason is the version's description.
    Idempotent: a version already registered from ``run_id`` is returned as is. Waits until the version is READY.

    Returns:
        The version number, as a string.

    Raises:
        ValueError: ``decision`` is malformed, the run carries no weights or manifest sha256 (run
            :func:`log_candidate` first); nothing is registered then.
        training.registry.manifest.TamperedModelError: the stored model's files changed since it was logged;
            nothing is registered.
        mlflow.exceptions.MlflowException: the version did not become READY, or MLflow refused a call.
    """
    client = registry_client(client)
    gate = _decision(decision)
    existing = client.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
    if existing:
        return str(min(int(mv.version) for mv in existing))
    run = client.get_run(run_id)
    weights_sha = run.data.tags.get(f"kfloop.{WEIGHTS_TAG}")
    module_sha = run.data.tags.get(f"kfloop.{MODULE_TAG}")
    logged_sha = run.data.tags.get(f"kfloop.{MANIFEST_SHA_TAG}")
    if not weights_sha or not module_sha or not logged_sha:
        raise ValueError(f"run {run_id} has no kfloop.{WEIGHTS_TAG}, kfloop.{MODULE_TAG} or "
                         f"kfloop.{MANIFEST_SHA_TAG} tag: log the model with log_candidate() before registering it")
    manifest = logged_manifest(model_uri, client=client)
    if manifest_sha256(manifest) != logged_sha:
        raise TamperedModelError(f"{model_uri}: its files' manifest has sha256 {manifest_sha256(manifest)} but run "
                                 f"{run_id} recorded {logged_sha} when it was logged; the stored model changed since, "
                                 "so it is not registered: log it again")
    tags = {"decision": "promote" if gate.blessed else "reject",
            "reason": shorten(redact_text(gate.reason), MAX_TAG_CHARS),
            "primary_metric": gate.primary_metric,
            **lineage.tags(), WEIGHTS_TAG: weights_sha, MODULE_TAG: module_sha, MANIFEST_TAG: manifest,
            "kfloop_experiment": client.get_experiment(run.info.experiment_id).name}
    ensure_registered_model(model_name, client=client)
    model_id = model_uri.removeprefix("models:/") if model_uri.startswith("models:/m-") else None
    mv = client.create_model_version(model_name, source=model_uri, run_id=run_id, tags=tags,
                                     description=gate.reason, model_id=model_id, await_creation_for=300)
    return str(mv.version)


def load_version_predictor(model_name: str, version: str) -> "Predictor":
    """Version ``version`` as a :class:`training.model.Predictor`, from its verified model directory
    (:func:`training.registry.versions.download_model_dir`; the logged pyfunc code is never run).

    Raises:
        ForeignModelError, training.registry.manifest.TamperedModelError: the stored files are not the ones
            recorded at registration.
    """
    client = registry_client(None)
    with tempfile.TemporaryDirectory() as tmp:
        local = download_model_dir(model_name, version, Path(tmp), client=client)
        return Predictor.load(local, module_sha256=client.get_model_version(model_name, str(version)).tags[MODULE_TAG])


def _decision(decision: dict[str, Any]) -> "Decision":
    try:
        gate = Decision.from_dict(decision)
    except (KeyError, TypeError) as e:
        raise ValueError(f"decision is not a training.gate.Decision.to_dict() result ({e!r}); pass the gate's "
                         "evaluation report") from e
    value = gate.challenger_metrics.get(gate.primary_metric, math.nan)
    if gate.blessed and not math.isfinite(value):
        raise ValueError(f"decision is blessed but its primary metric {gate.primary_metric!r} is "
                         f"{'missing' if gate.primary_metric not in gate.challenger_metrics else value}; a "
                         "missing or NaN metric never promotes: re-run the evaluation step")
    return gate


def served_model(model_dir: str | Path, predictor: Predictor, schema_file: str | Path) -> dict[str, Any]:
    """What ``mlflow.pyfunc.log_model`` (and ``save_model``) takes to serve the model directory ``model_dir``
    (loaded: ``predictor``) with the schema check of ``schema_file``: the pyfunc file, its artifacts, the module's
    sha256, the signature and an input example."""
    return {"python_model": str(PYFUNC_MODEL_FILE), "artifacts": {"model_dir": str(model_dir),
                                                                  "schema": str(schema_file)},
            "model_config": {MODULE_TAG: predictor.description["model"]["sha256"]},
            "input_example": _input_example(predictor), "signature": _signature(predictor)}


def _input_example(predictor: "Predictor") -> pd.DataFrame:
    """Two rows: typical values (medians, first category), then all nulls (object columns keep JSON nulls)."""
    t = predictor.transform
    typical = {**{c: s.median for c, s in t.numeric.items()},
               **{c: (v[0] if v else None) for c, v in t.categorical.items()}}
    return pd.DataFrame({c: pd.Series([v, None], dtype=object) for c, v in typical.items()})


def _signature(predictor: "Predictor") -> "mlflow.models.ModelSignature":
    """Outputs (the prediction frame) and the param ``on_schema_violation`` (default ``flag``) of
    :mod:`data.schema_rules`; no input schema, on purpose: MLflow enforces one before ``predict`` runs, dropping
    columns it does not name and refusing rows that lack one with its own error, so the served model could neither
    flag an unexpected column nor name a missing one. The schema check does both (the ``schema`` artifact holds the
    input columns and their rules; the input example shows them)."""
    label_type = ("double" if predictor.task == "regression" else
                  {str: "string", bool: "boolean", int: "long", float: "double"}[type(predictor.classes[0])])
    return ModelSignature(
        outputs=Schema([ColSpec(label_type, "prediction"),
                        *(ColSpec("double", f"proba_{c}") for c in predictor.classes),
                        ColSpec("string", VIOLATIONS_COLUMN, required=False)]),
        params=ParamSchema([ParamSpec(ON_VIOLATION_PARAM, "string", ON_VIOLATION_MODES[0])]))
