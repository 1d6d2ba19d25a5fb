"""Monitoring steps: the drift check, the quality check and the retrain trigger."""
from kfp.dsl import HTML, Artifact, Input, Metrics, Output, OutputPath

from components.base import kfloop_component


@kfloop_component
def check_drift(current_uri: str, current_logs_uri: str, retrain_uri: str, reference_uri: str, schema_uri: str,
                model_name: str, drift_policy: dict, report: Output[HTML], metrics: Output[Metrics],
                result: Output[Artifact], dataset_uri: OutputPath(str)) -> bool:
    """Evidently drift of the schema's features and the champion's predictions, current (a table, or the inference
    logs' rows of the policy's ``logs_since`` window) against reference. Returns ``drifted`` (drives ``dsl.If``);
    ``result`` is the JSON verdict with the data's md5; ``dataset_uri`` the data a retraining trains on
    (``retrain_uri``, else the current table)."""
    from pathlib import Path

    from data.fileio import atomic_write_json
    from data.redaction import redact
    from data.settings import from_struct
    from monitoring.steps.checks import drift_step, retrain_data
    from training.progress import progress

    retrain = retrain_data(rows_uri=current_uri, retrain_uri=retrain_uri, no_target=current_logs_uri and (
        f"current_logs_uri={redact(current_logs_uri)} holds served requests, without their target"))
    checked = drift_step(current_uri=current_uri, current_logs_uri=current_logs_uri, reference_uri=reference_uri,
                         schema_uri=schema_uri, model_name=model_name, policy=from_struct(drift_policy),
                         report_out=report.path)
    progress(checked.summary())
    metrics.log_metric("share_drifted_columns", checked.drift.share_drifted_columns)
    for name, col in checked.drift.columns.items():
        metrics.log_metric(f"drift_score_{name}", col.score)
    for name, shares in checked.drift.schema_violations.items():
        metrics.log_metric(f"schema_violation_share_{name}", shares["share"])
    atomic_write_json(result.path, checked.to_dict())
    result.metadata["data_md5"] = checked.data_md5
    Path(dataset_uri).write_text(retrain)
    return checked.drift.drifted


@kfloop_component
def check_quality(labelled_uri: str, labels_uri: str, id_column: str, retrain_uri: str, model_name: str,
                  quality_policy: dict, report: Output[HTML], metrics: Output[Metrics], result: Output[Artifact],
                  dataset_uri: OutputPath(str)) -> bool:
    """The champion's quality on rows whose labels arrived, against its holdout metrics. Returns ``degraded``
    (drives ``dsl.If``); ``dataset_uri`` is the data a retraining trains on (``retrain_uri``, else the labelled
    rows); ``result`` is the JSON verdict with the data's md5."""
    from pathlib import Path

    from data.fileio import atomic_write_json
    from data.settings import from_struct
    from data.redaction import redact
    from monitoring.steps.checks import quality_step, retrain_data

    retrain = retrain_data(rows_uri=labelled_uri, retrain_uri=retrain_uri, no_target=labels_uri and (
        f"labels_uri={redact(labels_uri)} is set, so {redact(labelled_uri)} holds no target to retrain on"))
    checked = quality_step(labelled_uri=labelled_uri, labels_uri=labels_uri, id_column=id_column,
                           model_name=model_name, policy=from_struct(quality_policy), report_out=report.path)
    quality = checked.quality
    if quality.verdict != "insufficient_labels":
        metrics.log_metric("quality_value", quality.value)
    metrics.log_metric("quality_baseline", quality.baseline)
    metrics.log_metric("rows", quality.rows)
    metrics.log_metric("insufficient_labels", float(quality.verdict == "insufficient_labels"))
    atomic_write_json(result.path, checked.to_dict())
    result.metadata["data_md5"] = checked.data_md5
    Path(dataset_uri).write_text(retrain)
    return quality.degraded


@kfloop_component
def trigger_retraining(model_name: str, dataset_uri: str, drift_result: Input[Artifact], trigger_policy: dict,
                       training_params: dict, training_pipeline_version: dict) -> str:
    """Start a training run on ``dataset_uri`` after a drift or quality check (``drift_result``: its verdict, whose
    ``data_md5`` the dedupe keys on) unless the cooldown, the dedupe or a run in flight says no; returns the run id,
    or '' when skipped. The step's backend (:func:`training.launch.backends.step_backend`) decides how: on
    Kubernetes (a KFP step pod) the run is ``training_pipeline_version`` (pinned by ``kfloop run/schedule --host``)
    on the KFP server and the trigger state lives on the registered model in MLflow; on this machine the run is the
    training pipeline under kfp.local (its id the registered version) and the state a file in the workdir."""
    from components.run_starters import run_starter, trigger_store
    from data.settings import from_struct, load_environment
    from monitoring.steps.trigger import trigger_step
    from training.launch.backends import step_backend

    pinned = from_struct(training_pipeline_version)
    backend = step_backend()
    settings = {**from_struct(training_params), "dataset_uri": dataset_uri, "model_name": model_name}
    decision = trigger_step(model_name=model_name, data_md5=drift_result.metadata["data_md5"],
                            policy=from_struct(trigger_policy), start=run_starter(backend, pinned, settings),
                            store=trigger_store(backend, model_name, load_environment().workdir))
    return decision.run_id or ""
