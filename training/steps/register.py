"""The register step: the candidate, its decision, lineage and reference profile, as a model version."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow

from data.dvc_store import DataStoreConfig, keep
from data.engine import DataEngine
from data.profiles import ReferenceProfile, profile_table
from data.settings import CODE_ROOT, load_environment, step_function
from data.redaction import redact
from data.storage import record_uri
from data.validation import load_schema
from training.config import TrainingConfig
from training.model import Predictor
from training.model_code import MODULE_PREFIX
from training.model_files import JOB_SHAPE_FILE
from training.progress import progress
from training.registry.experiments import IMAGE_TAG
from training.registry.candidates import log_candidate, register_candidate
from training.registry.versions import Lineage


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

