"""The drift pipeline: check drift against the champion's reference, trigger retraining when it moved."""
from kfp import dsl
from kfp.dsl import Artifact

from components.monitoring import check_drift, trigger_retraining
from data.settings import DEFAULT_MODEL_NAME
from pipelines import kubernetes_options

PIPELINE_NAME = "kfloop-drift"


@dsl.pipeline(name=PIPELINE_NAME, description="Evidently drift of features and champion predictions; "
                                              "retrain when the data has moved.")
def drift_pipeline(
    current_uri: str = "",
    current_logs_uri: str = "",
    retrain_uri: str = "",
    reference_uri: str = "",
    schema_uri: str = "",
    model_name: str = DEFAULT_MODEL_NAME,
    drift_policy: dict = {},
    trigger_policy: dict = {},
    training_params: dict = {},
    training_pipeline_version: dict = {},
) -> Artifact:
    drift = check_drift(current_uri=current_uri, current_logs_uri=current_logs_uri, retrain_uri=retrain_uri,
                        reference_uri=reference_uri, schema_uri=schema_uri, model_name=model_name,
                        drift_policy=drift_policy)
    drift.set_display_name("check drift")
    with dsl.If(drift.outputs["Output"] == True, name="drifted"):  # noqa: E712 (KFP condition, not Python)
        trigger = trigger_retraining(
            model_name=model_name, dataset_uri=drift.outputs["dataset_uri"], drift_result=drift.outputs["result"],
            trigger_policy=trigger_policy, training_params=training_params,
            training_pipeline_version=training_pipeline_version).set_display_name("trigger retraining")
    kubernetes_options.apply(api_step=trigger)
    return drift.outputs["result"]
