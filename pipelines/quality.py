"""The quality pipeline: score the champion on rows whose labels arrived, trigger retraining when it degraded."""
from kfp import dsl
from kfp.dsl import Artifact

from components.monitoring import check_quality, trigger_retraining
from data.settings import DEFAULT_MODEL_NAME
from pipelines import kubernetes_options

PIPELINE_NAME = "kfloop-quality"


@dsl.pipeline(name=PIPELINE_NAME, description="The champion's quality on rows whose labels arrived, against its "
                                              "holdout metrics; retrain when it degraded.")
def quality_pipeline(
    labelled_uri: str,
    labels_uri: str = "",
    id_column: str = "",
    retrain_uri: str = "",
    model_name: str = DEFAULT_MODEL_NAME,
    quality_policy: dict = {},
    trigger_policy: dict = {},
    training_params: dict = {},
    training_pipeline_version: dict = {},
) -> Artifact:
    quality = check_quality(labelled_uri=labelled_uri, labels_uri=labels_uri, id_column=id_column,
                            retrain_uri=retrain_uri, model_name=model_name, quality_policy=quality_policy)
    quality.set_display_name("check quality")
    with dsl.If(quality.outputs["Output"] == True, name="degraded"):  # noqa: E712 (KFP condition, not Python)
        trigger = trigger_retraining(
            model_name=model_name, dataset_uri=quality.outputs["dataset_uri"],
            drift_result=quality.outputs["result"], trigger_policy=trigger_policy, training_params=training_params,
            training_pipeline_version=training_pipeline_version).set_display_name("trigger retraining")
    kubernetes_options.apply(api_step=trigger)
    return quality.outputs["result"]
