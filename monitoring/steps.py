"""The drift pipeline's steps as plain functions. Each component calls one; each runs without KFP."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from data.storage import redact
from training.progress import progress
from training.settings import load_environment, step_function


@dataclass(kw_only=True, slots=True)
class DriftStepResult:
    """A drift check of one data file, with what it was compared against."""

    drift: Any
    """The :class:`monitoring.drift.DriftResult`."""
    data_md5: str
    """md5 (DVC's hash) of the current data file: the trigger dedupes on it."""
    data_version: str
    """The object store's version id or ETag of the current data; empty for a local file."""
    reference_uri: str
    """The reference data, credentials removed."""
    champion_version: str | None

    def to_dict(self) -> dict[str, Any]:
        """``kfloop drift --json``: the DriftResult contract plus data hash and version, reference and champion."""
        return {**self.drift.to_dict(), "data_md5": self.data_md5, "data_version": self.data_version,
                "reference_uri": self.reference_uri, "champion_version": self.champion_version}


@step_function
def drift_step(*, current_uri: str, reference_uri: str, schema_uri: str, model_name: str, policy: dict[str, Any],
               report_out: str) -> DriftStepResult:
    """Evidently drift of the schema's features, and of the champion's predictions, current against reference,
    and the share of current rows outside the schema per feature.

    Without ``reference_uri``/``schema_uri`` the champion's recorded training data and schema are used. With a
    ``model_name`` the check is recorded in MLflow (:func:`monitoring.records.record_drift_check`).

    Raises:
        ValueError: no reference or schema given and no champion to take them from.
        data.validation.DataFileError: a data file is unusable.
    """
    from monitoring.drift import DriftPolicy, check_drift
    from data.validation import load_schema, read_table, read_table_source, schema_roles
    from training.registry.versions import champion_schema, get_champion, load_version_predictor

    rules = DriftPolicy.from_dict(policy)
    champion = get_champion(model_name) if model_name else None
    reference_uri = reference_uri or ((champion.record.data_uri or "") if champion else "")
    schema_text = schema_uri or (champion_schema(model_name) if champion else None)
    if not reference_uri or not schema_text:
        raise ValueError(f"model '{model_name}' has no champion to take the reference data and schema from; "
                         "pass reference_uri and schema_uri")
    schema = load_schema(schema_text)
    roles = schema_roles(schema)
    reference, (current, source) = read_table(reference_uri), read_table_source(current_uri)
    if champion is not None and rules.include_predictions:
        predictor = load_version_predictor(model_name, champion.version)
        for frame in (reference, current):  # classes as categories, regression values as numbers
            predicted = predictor.predict(frame)
            frame["prediction"] = predicted if predictor.task == "regression" else predicted.astype(str)
    result = check_drift(reference, current, numeric=roles.numeric, categorical=roles.categorical, policy=rules,
                         report_path=report_out or None, schema=schema)
    progress(f"drift: {redact(current_uri)} vs {redact(reference_uri)}: drifted={result.drifted} ({result.reason})")
    checked = DriftStepResult(drift=result, data_md5=source.md5, data_version=source.version,
                              reference_uri=redact(reference_uri),
                              champion_version=champion.version if champion else None)
    if model_name:
        from monitoring.records import record_drift_check

        record_drift_check(model_name, checked, current_uri=redact(current_uri), report_path=report_out or None)
    return checked


def trigger_store(model_name: str):
    """The trigger state of ``model_name`` in the workdir (a file that survives restarts of the step)."""
    from monitoring.trigger import TriggerStore

    return TriggerStore.in_workdir(load_environment().workdir, model_name)


@step_function
def trigger_step(*, model_name: str, data_md5: str, policy: dict[str, Any], start: Callable[[], str],
                 store: Any = None):
    """Retrain unless the cooldown or the dedupe on (model, data hash, window) says no; ``start()`` starts a
    training run and returns its id. ``store`` defaults to the workdir's file (:func:`trigger_store`). Returns the
    :class:`monitoring.trigger.TriggerDecision` (with ``run_id``)."""
    import time

    from monitoring.trigger import TriggerPolicy, maybe_trigger

    decision = maybe_trigger(store or trigger_store(model_name), model=model_name, data_hash=data_md5,
                             now=time.time(), policy=TriggerPolicy.from_dict(policy), start=start)
    progress(f"trigger: {'fired, run ' + str(decision.run_id) if decision.fire else 'skipped'}: {decision.reason}")
    return decision


def last_trigger(model_name: str, *, since: float) -> dict[str, Any] | None:
    """The trigger's last decision for ``model_name`` if made at or after ``since``: fire, reason, run_id, at."""
    entry = trigger_store(model_name).load()["models"].get(model_name)
    if not entry or not entry["last_check"] or entry["last_check"]["at"] < since:
        return None
    check = entry["last_check"]
    runs = [f["run_id"] for f in entry["fired"] if f["key"] == check["key"] and f["at"] == check["at"]]
    return {**check, "run_id": runs[0] if check["fire"] and runs else None}
