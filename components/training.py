"""The training step: torchrun processes locally, a PyTorchJob on Kubernetes."""
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components.base import kfloop_component


@kfloop_component
def launch_training(train_data: Input[Dataset], schema: Input[Artifact], model_name: str, training_config: dict,
                    nnodes: int, nproc_per_node: int, backend: str, pipeline_run_id: str, model: Output[Model],
                    metrics: Output[Metrics], cluster_config: dict = {}, model_config: dict = {}) -> str:
    """Train the ``model_config`` module (:class:`training.config.ModelSpec`) with DDP on ``nnodes`` x
    ``nproc_per_node`` ranks (``backend=kubernetes``: a PyTorchJob on ``cluster_config``); returns the MLflow run
    id."""
    from data.settings import from_struct
    from training.steps.train import train_step

    result = train_step(train_path=train_data.path, schema_path=schema.path, model_name=model_name,
                        config=from_struct(training_config), nnodes=nnodes, nproc_per_node=nproc_per_node,
                        backend=backend, pipeline_run_id=pipeline_run_id, model_dir=model.path,
                        cluster=from_struct(cluster_config), model=from_struct(model_config))
    for name, value in result.metrics.items():
        metrics.log_metric(name, value)
    model.metadata.update({"mlflow_run_id": result.run_id, "world_size": result.world_size})
    return result.run_id
