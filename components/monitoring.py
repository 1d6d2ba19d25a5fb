"""Monitoring steps: the drift check and the retrain trigger."""
from typing import NamedTuple

from kfp.dsl import HTML, Metrics, Output

from components.base import kfloop_component


@kfloop_component
def check_drift(current_uri: str, reference_uri: str, schema_uri: str, model_name: str, drift_policy: dict,
                report: Output[HTML], metrics: Output[Metrics]
                ) -> NamedTuple("DriftOutputs", [("drifted", bool), ("data_md5", str), ("summary", str)]):
    """Evidently drift of the schema's features and the champion's predictions, current against reference."""
    import json

    from monitoring.steps import drift_step

    result = drift_step(current_uri=current_uri, reference_uri=reference_uri, schema_uri=schema_uri,
                        model_name=model_name, policy=drift_policy, report_out=report.path)
    metrics.log_metric("share_drifted_columns", result.share_drifted_columns)
    metrics.log_metric("drifted", float(result.drifted))
    for name, col in result.columns.items():
        metrics.log_metric(f"drift_score_{name}", col.score)
    return result.drifted, result.data_md5, json.dumps(result.to_dict())


@kfloop_component
def trigger_retraining(model_name: str, dataset_uri: str, data_md5: str, reason: str, trigger_policy: dict,
                       training_params: dict) -> str:
    """Start a training run unless the cooldown or dedupe says no; returns the run id, or '' when skipped."""
    from monitoring.steps import trigger_step

    decision = trigger_step(model_name=model_name, dataset_uri=dataset_uri, data_md5=data_md5, reason=reason,
                            policy=trigger_policy, training_params=training_params)
    return decision.run_id
