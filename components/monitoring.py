"""Monitoring steps: the drift check and the retrain trigger."""
from kfp.dsl import HTML, Artifact, Input, Metrics, Output

from components.base import kfloop_component


@kfloop_component
def check_drift(current_uri: str, reference_uri: str, schema_uri: str, model_name: str, drift_policy: dict,
                report: Output[HTML], metrics: Output[Metrics], result: Output[Artifact]) -> bool:
    """Evidently drift of the schema's features and the champion's predictions, current against reference.
    Returns ``drifted`` (drives ``dsl.If``); ``result`` is the JSON verdict with the data's md5."""
    from monitoring.steps import drift_step
    from training.fileio import atomic_write_json
    from training.settings import from_struct

    checked = drift_step(current_uri=current_uri, reference_uri=reference_uri, schema_uri=schema_uri,
                        model_name=model_name, policy=from_struct(drift_policy), report_out=report.path)
    metrics.log_metric("share_drifted_columns", checked.drift.share_drifted_columns)
    for name, col in checked.drift.columns.items():
        metrics.log_metric(f"drift_score_{name}", col.score)
    atomic_write_json(result.path, checked.to_dict())
    result.metadata["data_md5"] = checked.data_md5
    return checked.drift.drifted


@kfloop_component
def trigger_retraining(model_name: str, dataset_uri: str, drift_result: Input[Artifact], trigger_policy: dict,
                       training_params: dict) -> str:
    """Start a training run on the drifted data unless the cooldown or dedupe says no; returns the run id, or ''
    when skipped. Locally the run is the training pipeline under kfp.local and its id the registered version."""
    from monitoring.steps import trigger_step
    from pipelines.local_start import start_local_training
    from training.settings import from_struct

    def start() -> str:
        settings = {**from_struct(training_params), "dataset_uri": dataset_uri, "model_name": model_name}
        return start_local_training(settings)

    decision = trigger_step(model_name=model_name, data_md5=drift_result.metadata["data_md5"],
                            policy=from_struct(trigger_policy), start=start)
    return decision.run_id or ""
