"""The training pipeline: validate -> split -> train -> evaluate vs champion -> register -> promote if blessed ->
roll out on KServe (``serving.rollout``)."""
from kfp import dsl

from components.data import split_holdout, validate_data
from components.evaluation import evaluate_vs_champion
from components.registry import promote, register_candidate, rollout
from components.training import launch_training
from data.holdout import DEFAULT_HOLDOUT_FRACTION, DEFAULT_SPLIT_SEED
from data.settings import DEFAULT_MODEL_NAME
from pipelines import kubernetes_options
from training.config import JobShape

PIPELINE_NAME = "kfloop-training"
DEFAULT_SHAPE = JobShape()
"""The job shape's defaults, the pipeline parameters' defaults (one home: :class:`JobShape`)."""


@dsl.pipeline(name=PIPELINE_NAME, description="Validate data, train with DDP, gate against the champion, "
                                              "register every candidate, promote the blessed one, roll it out.")
def training_pipeline(
    dataset_uri: str,
    schema_uri: str = "",
    target: str = "",
    task: str = "",
    model_name: str = DEFAULT_MODEL_NAME,
    nnodes: int = DEFAULT_SHAPE.nnodes,
    nproc_per_node: int = DEFAULT_SHAPE.nproc_per_node,
    backend: str = DEFAULT_SHAPE.backend,
    holdout_fraction: float = DEFAULT_HOLDOUT_FRACTION,
    seed: int = DEFAULT_SPLIT_SEED,
    training_config: dict = {},
    model_config: dict = {},
    promotion_policy: dict = {},
    cluster_config: dict = {},
    data_store_config: dict = {},
    drift_policy: dict = {},
    serving_config: dict = {},
) -> str:
    validated = validate_data(dataset_uri=dataset_uri, schema_uri=schema_uri, target=target, model_name=model_name,
                              task=task)
    validated.set_display_name("validate data")
    split = split_holdout(dataset_uri=dataset_uri, holdout_fraction=holdout_fraction, seed=seed)
    split.after(validated).set_display_name("split holdout")
    trained = launch_training(train_data=split.outputs["train_data"], schema=validated.outputs["schema"],
                              model_name=model_name, training_config=training_config, nnodes=nnodes,
                              nproc_per_node=nproc_per_node, backend=backend,
                              pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, cluster_config=cluster_config,
                              model_config=model_config)
    trained.set_display_name("train (DDP)")
    gate = evaluate_vs_champion(model=trained.outputs["model"], holdout_data=split.outputs["holdout_data"],
                                holdout_sha256=split.outputs["Output"], model_name=model_name,
                                promotion_policy=promotion_policy)
    gate.set_display_name("evaluate vs champion")
    registered = register_candidate(model=trained.outputs["model"], report=gate.outputs["report"],
                                    schema=validated.outputs["schema"], run_id=trained.outputs["Output"],
                                    model_name=model_name, dataset_uri=dataset_uri,
                                    data_md5=validated.outputs["data_md5"],
                                    data_version=validated.outputs["data_version"],
                                    holdout_sha256=split.outputs["Output"],
                                    holdout_fraction=holdout_fraction, split_seed=seed,
                                    data_store_config=data_store_config, drift_policy=drift_policy,
                                    pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    registered.set_display_name("register candidate")
    with dsl.If(gate.outputs["Output"] == True, name="blessed"):  # noqa: E712 (KFP condition, not Python)
        promoted = promote(model_name=model_name, version=registered.output, report=gate.outputs["report"],
                           model=trained.outputs["model"], holdout_data=split.outputs["holdout_data"],
                           holdout_sha256=split.outputs["Output"], promotion_policy=promotion_policy)
        promoted.set_display_name("promote to champion")
        rollout(model_name=model_name, version=registered.output, promoted=promoted.output,
                holdout_data=split.outputs["holdout_data"], serving_config=serving_config,
                cluster_config=cluster_config).set_display_name("roll out on KServe")
    kubernetes_options.apply(gpu_step=trained)
    return registered.output
