"""Data steps: validate against the schema before any GPU is spent, then split off the pinned holdout."""
from typing import NamedTuple

from kfp.dsl import Artifact, Dataset, Output

from components.base import kfloop_component


@kfloop_component
def validate_data(dataset_uri: str, schema_uri: str, target: str, model_name: str,
                  schema: Output[Artifact], task: str = "") -> NamedTuple("ValidateOutputs", [("data_md5", str), ("data_version", str),
                                                                ("target", str)]):
    """Validate the dataset (schema_uri, else the champion's schema, else inferred on the very first run, for
    ``task``: classification unless given); fails the run listing every failure."""
    from training.steps.validate import validate_step

    result = validate_step(dataset_uri=dataset_uri, schema_uri=schema_uri, target=target, model_name=model_name,
                           schema_out=schema.path, task=task)
    schema.metadata.update({"source": result.schema_source, "rows": result.rows})
    return result.data_md5, result.data_version, result.target


@kfloop_component
def split_holdout(dataset_uri: str, holdout_fraction: float, seed: int, train_data: Output[Dataset],
                  holdout_data: Output[Dataset]) -> str:
    """Seeded train/holdout split; returns the holdout's sha256, which pins the evaluation."""
    from training.steps.split import split_step

    return split_step(dataset_uri=dataset_uri, fraction=holdout_fraction, seed=seed,
                      train_out=train_data.path, holdout_out=holdout_data.path)
