"""Registry steps: every candidate becomes a version; only ``promote`` moves ``champion`` (and ``rollout`` moves it
back when the new champion fails on KServe)."""
from kfp.dsl import Artifact, Dataset, Input, Model

from components.base import kfloop_component


@kfloop_component
def register_candidate(model: Input[Model], report: Input[Artifact], schema: Input[Artifact], run_id: str,
                       model_name: str, dataset_uri: str, data_md5: str, data_version: str, holdout_sha256: str,
                       pipeline_run_id: str, holdout_fraction: float, split_seed: int,
                       data_store_config: dict, drift_policy: dict = {}) -> str:
    """Keep the training data where DVC finds it by md5, then register the candidate with its decision, reason and
    lineage (the reference profile built by ``drift_policy``'s engine); returns the version."""
    from data.settings import from_struct
    from training.steps.register import register_step

    return register_step(model_dir=model.path, report_path=report.path, schema_path=schema.path, run_id=run_id,
                         model_name=model_name, dataset_uri=dataset_uri, data_md5=data_md5,
                         data_version=data_version, holdout_sha256=holdout_sha256, pipeline_run_id=pipeline_run_id,
                         champion_version=report.metadata["champion_version"], holdout_fraction=holdout_fraction,
                         split_seed=split_seed, data_store=from_struct(data_store_config),
                         drift_policy=from_struct(drift_policy))


@kfloop_component
def promote(model_name: str, version: str, report: Input[Artifact], model: Input[Model],
            holdout_data: Input[Dataset], holdout_sha256: str, promotion_policy: dict) -> bool:
    """Move ``champion`` to ``version`` under the lock, after re-reading the champion and re-checking."""
    from data.settings import from_struct
    from training.steps.promote import promote_step

    return promote_step(model_name=model_name, version=version, compared_against=report.metadata["champion_version"],
                        model_dir=model.path, holdout_path=holdout_data.path, holdout_sha256=holdout_sha256,
                        policy=from_struct(promotion_policy)).promoted


@kfloop_component
def rollout(model_name: str, version: str, promoted: bool, holdout_data: Input[Dataset], serving_config: dict,
            cluster_config: dict) -> str:
    """With ``serving.rollout``: the new champion on KServe as a canary, smoke-tested with the holdout's first rows,
    then given all traffic, or traffic and ``champion`` rolled back; returns the outcome."""
    from data.settings import from_struct
    from training.steps.rollout import rollout_step

    return rollout_step(model_name=model_name, version=version, promoted=promoted, holdout_path=holdout_data.path,
                        serving=from_struct(serving_config), cluster=from_struct(cluster_config))
