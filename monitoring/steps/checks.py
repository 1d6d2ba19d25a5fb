"""The drift and quality steps. The checks themselves (:mod:`monitoring.drift`, :mod:`monitoring.quality`) load
Evidently, seconds of import, so only the step that runs one imports it."""
from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import mlflow
import pandas as pd

from data.fileio import atomic_write_bytes, parquet_bytes
from data.profiles import prediction_kind
from data.settings import step_function
from data.redaction import redact
from data.storage import resolve
from data.tables import DataFileError, read_table, read_table_source, sketching_chunks
from data.validation import detect_ids, infer_schema, load_schema, schema_roles, validate
from monitoring.drift_policy import DriftPolicy
from monitoring.inference_logs import ID_COLUMN, ROW_COLUMN, parse_since, read_inference_logs
from monitoring.quality_policy import QualityPolicy
from monitoring.records import record_drift_check, record_quality_check
from training.progress import progress
from training.registry.candidates import load_version_predictor
from training.registry.versions import (EVALUATION_ARTIFACT, champion_profile, champion_schema, get_champion,
                                        holdout_metrics)


@dataclass(kw_only=True, slots=True)
class DriftStepResult:
    """A drift check of one data file, with what it was compared against."""

    drift: Any
    """The :class:`monitoring.drift.DriftResult`."""
    data_md5: str
    """md5 (DVC's hash) of the current data file: the trigger dedupes on it."""
    data_version: str
    """The object store's version id or ETag of the current data; empty for a local file."""
    current_uri: str
    """The current data, credentials removed."""
    reference_uri: str
    """The reference data, credentials removed."""
    schema_source: str
    """Where the schema came from: its URI, ``champion vN``, or ``inferred from the reference (target 'COL')``."""
    champion_version: str | None
    reference_profile: bool = False
    """Whether the check compared with the champion's stored profile of ``reference_uri`` (not the file itself)."""
    id_columns: list[str] = field(default_factory=list)
    """The schema's id columns, left out of the check (unique per row, they differ between any two batches)."""

    def summary(self) -> str:
        """The verdict in one line: what was compared with what, drifted or not, and why."""
        against = "the champion's reference profile of " if self.reference_profile else ""
        return (f"drift: {self.current_uri} vs {against}{self.reference_uri}: drifted={self.drift.drifted} "
                f"({self.drift.reason})")

    def to_dict(self) -> dict[str, Any]:
        """``kfloop drift --json``: the DriftResult contract plus data hash and version, reference, schema source
        and champion."""
        return {**self.drift.to_dict(), "data_md5": self.data_md5, "data_version": self.data_version,
                "reference_uri": self.reference_uri, "reference_profile": self.reference_profile,
                "schema_source": self.schema_source, "champion_version": self.champion_version,
                "id_columns": self.id_columns}


def _no_champion_data(model_name: str, champion: Any, what: str) -> str:
    """Why the champion cannot supply ``what``: no model named, no champion, or nothing recorded."""
    if not model_name:
        return f"no --model (model_name) whose champion's {what} to use"
    if champion is None:
        return f"model '{model_name}' has no champion to take the {what} from"
    return f"model '{model_name}' champion v{champion.version} records no {what}"


def _drift_schema(schema_uri: str, *, model_name: str, champion: Any, target: str, reference: Callable[[], Any],
                  current_columns: list[str], reference_uri: str):
    """The schema of a drift check and where it came from: ``schema_uri``, else the champion's, else one inferred
    from the reference (``reference()`` reads it), else, when the target cannot be told, None: the check then
    compares every column the two tables share.

    Raises:
        ValueError: the ``target`` given is not a column of the reference.
    """
    if schema_uri:
        return load_schema(schema_uri), redact(schema_uri)
    recorded = champion_schema(model_name) if champion is not None else None
    if recorded is not None:
        return load_schema(recorded), f"champion v{champion.version}"
    reference = reference()
    unlabelled = [c for c in reference.columns if c not in current_columns]
    target = target or (unlabelled[0] if len(unlabelled) == 1 else "")
    if not target:
        progress(f"drift: no schema ({_no_champion_data(model_name, champion, 'schema')}) and no target: comparing "
                 "every column the reference and the current data share but the ids (as kfloop infer-schema finds "
                 "them), types from the reference; pass --schema FILE or --set target=COLUMN to check features only "
                 "and apply the schema's rules")
        return None, NO_SCHEMA_SOURCE
    if target not in reference.columns:
        raise ValueError(f"target '{target}' is not a column of the reference {redact(reference_uri)}; columns: "
                         f"{list(reference.columns)}")
    task = "regression" if pd.api.types.is_float_dtype(reference[target]) else "classification"
    source = f"inferred from the reference (target '{target}', {task})"
    progress(f"drift: no schema given: {source}")
    return infer_schema(reference, target=target, task=task), source


NO_SCHEMA_SOURCE = ("none: every column the reference and the current data share but the ids (types from the "
                    "reference, no target)")
"""``schema_source`` of a drift check run without a schema, a champion or a target."""


def shared_columns(reference: pd.DataFrame,
                   current_columns: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The numeric and the categorical columns of ``reference`` that the current data has too (numbers and bools
    numeric, anything else categorical), in the reference's order, and the shared columns left out as ids (those
    :func:`data.validation.detect_ids` finds, as ``kfloop infer-schema`` would: unique per row, they always
    differ between batches)."""
    ids = detect_ids(reference[[c for c in reference.columns if c in current_columns]])
    shared = [c for c in reference.columns if c in current_columns and c not in ids]
    numeric = [c for c in shared if pd.api.types.is_numeric_dtype(reference[c]) or
               pd.api.types.is_bool_dtype(reference[c])]
    return numeric, [c for c in shared if c not in numeric], ids


@step_function
def drift_step(*, current_uri: str, reference_uri: str, schema_uri: str, model_name: str, policy: dict[str, Any],
               report_out: str, target: str = "", current_logs_uri: str = "", since: str = "") -> DriftStepResult:
    """Evidently drift of the schema's features, and of the champion's predictions, current against reference,
    and the share of current rows outside the schema per feature.

    The current batch is ``current_uri``, or with ``current_logs_uri`` the rows of the requests logged there in
    the ``since`` window before now (default: the policy's ``logs_since``; :mod:`monitoring.inference_logs`).

    Without ``reference_uri``/``schema_uri`` the champion's recorded training data and schema are used: its
    stored reference profile when it has one (the current data is then read in chunks and the training data not
    at all), else the training data itself (versions registered before profiles). With a reference but neither a
    schema nor a champion, the schema is inferred from the reference (its target: ``target``, else the one
    reference column the current data lacks); when no target can be told either, every column the two share is
    compared (types from the reference, no schema rules) and ``schema_source`` says so. With a ``model_name`` the
    check is recorded in MLflow (:func:`monitoring.records.record_drift_check`).

    Raises:
        ValueError: no reference data, or a ``target`` the reference lacks; the message names what is missing;
            both or neither of ``current_uri`` and ``current_logs_uri``; no request logged in the window.
        data.tables.DataFileError: a data file is unusable.
        monitoring.inference_logs.InferenceLogError: a logged request or response in the window is unreadable.
    """
    rules = DriftPolicy.from_dict(policy)
    if bool(current_uri) == bool(current_logs_uri):
        raise ValueError("give the current batch as current_uri (a table) or current_logs_uri (inference logs), "
                         "one of them")
    with _served_batch(current_logs_uri, since or rules.logs_since, "drift") if current_logs_uri else \
            contextlib.nullcontext(current_uri) as table:
        shown = f"{redact(current_logs_uri)} (since {since or rules.logs_since})" if current_logs_uri else ""
        return _drift(current_uri=table, shown=shown or redact(table), reference_uri=reference_uri,
                      schema_uri=schema_uri, model_name=model_name, rules=rules, report_out=report_out,
                      target=target)


@contextlib.contextmanager
def _served_batch(logs_uri: str, since: str, check: str) -> Iterator[str]:
    """The requests' inputs logged under ``logs_uri`` in the ``since`` window with their ids (for ``check``'s
    progress line), as a Parquet file for the check's readers, removed afterwards: the check treats them as a table
    (the champion's predictions computed on both sides alike), and its md5 dedupes equal batches in the trigger."""
    served = read_inference_logs(logs_uri, since=parse_since(since))
    if served.rows.empty:
        raise ValueError(f"{redact(logs_uri)}: no request logged in the last {since} ({served.blobs} log blob(s) "
                         "read); widen the window (--since, drift.logs_since) or check the logger's storage URI")
    progress(f"{check}: {served.requests} logged request(s), {len(served.rows)} rows, from {redact(logs_uri)} in the "
             f"last {since} ({served.request_only} without a response, {served.response_only} response(s) without "
             "a request dropped)")
    with tempfile.TemporaryDirectory(prefix="kfloop-served-") as tmp:
        rows = served.rows[[*served.inputs, ID_COLUMN, ROW_COLUMN]]
        yield str(atomic_write_bytes(Path(tmp) / "served.parquet", parquet_bytes(rows)))


def _drift(*, current_uri: str, shown: str, reference_uri: str, schema_uri: str, model_name: str,
           rules: DriftPolicy, report_out: str, target: str) -> DriftStepResult:
    """:func:`drift_step` on the table at ``current_uri`` (recorded as ``shown``)."""
    from monitoring.drift import check_drift, check_drift_profile
    champion = get_champion(model_name) if model_name else None
    profile = champion_profile(model_name) if champion is not None and not reference_uri else None
    reference_uri = reference_uri or ((champion.record.data_uri or "") if champion else "")
    if not (reference_uri or profile):
        raise ValueError(f"no reference data: {_no_champion_data(model_name, champion, 'training data')}; set "
                         "reference_uri (kfloop run drift: --set reference_uri=FILE; kfloop drift: --reference FILE)")
    if rules.engine == "ray":
        return _drift_on_ray(current_uri=current_uri, shown=shown, reference_uri=reference_uri,
                             schema_uri=schema_uri, model_name=model_name, rules=rules, report_out=report_out,
                             target=target, champion=champion, profile=profile)
    if profile is None:
        reference, (current, source) = read_table(reference_uri), read_table_source(current_uri)
        columns, read_reference = list(current.columns), lambda: reference
    else:
        columns, read_reference = [], lambda: read_table(reference_uri)
    schema, schema_source = _drift_schema(schema_uri, model_name=model_name, champion=champion, target=target,
                                          reference=read_reference, current_columns=columns,
                                          reference_uri=reference_uri)
    if schema is not None:
        roles = schema_roles(schema)
        numeric, categorical, kind, ids = roles.numeric, roles.categorical, prediction_kind(roles.task), roles.ids
    else:
        (numeric, categorical, ids), kind = shared_columns(read_reference(), columns), "categorical"
    predictor = (load_version_predictor(model_name, champion.version)
                 if champion is not None and rules.include_predictions else None)
    report_path = report_out or None
    if profile is not None:
        with sketching_chunks(current_uri, categorical) as (chunks, source):
            result = check_drift_profile(profile, chunks, numeric=numeric, categorical=categorical,
                                         policy=rules, report_path=report_path, schema=schema,
                                         predict=predictor.predict if predictor is not None else None)
    else:
        if predictor is not None:
            for frame in (reference, current):
                predictions = predictor.predict(frame)
                frame["prediction"] = predictions.astype(str) if kind == "categorical" else predictions
        result = check_drift(reference, current, numeric=numeric, categorical=categorical,
                             policy=rules, report_path=report_path, schema=schema, prediction_kind=kind)
    return _recorded(result, source=source, current_uri=shown, reference_uri=reference_uri, profile=profile,
                     schema_source=schema_source, champion=champion, ids=ids,
                     model_name=model_name, report_path=report_path)


def _drift_on_ray(*, current_uri: str, shown: str, reference_uri: str, schema_uri: str, model_name: str,
                  rules: Any, report_out: str, target: str, champion: Any, profile: Any) -> DriftStepResult:
    """:func:`drift_step` with ``engine: ray`` (joining or starting Ray for the check): Ray Data reads and
    sketches the current data, and the reference when it is a file (profiled there by the per-chunk code of
    registration); only a schema inferred from the reference reads the reference here."""
    from data.ray_cluster import ray_session  # Ray: the ray extra, loaded by checks with engine: ray only
    from monitoring.ray_drift import RayTable
    with ray_session(rules.ray_address):
        progress(f"drift: engine ray, on {redact(rules.ray_address) if rules.ray_address else 'a local Ray'}: Ray "
                 "Data reads and sketches the data in blocks")
        read_reference, columns = functools.cache(lambda: read_table(reference_uri)), RayTable(current_uri).columns
        schema, schema_source = _drift_schema(schema_uri, model_name=model_name, champion=champion, target=target,
                                              reference=read_reference, current_columns=columns,
                                              reference_uri=reference_uri)
        if schema is not None:
            roles = schema_roles(schema)
            numeric, categorical, ids = roles.numeric, roles.categorical, roles.ids
            kind = prediction_kind(roles.task)
        else:
            (numeric, categorical, ids), kind = shared_columns(read_reference(), columns), "categorical"
        predictor = (load_version_predictor(model_name, champion.version)
                     if champion is not None and rules.include_predictions else None)
        predict = predictor.predict if predictor is not None else None
        kinds = {c: "numeric" for c in numeric} | {c: "categorical" for c in categorical}
        reference = profile or RayTable(reference_uri, text_columns=categorical).profile(
            kinds, predict=predict, prediction_kind=kind, source=redact(reference_uri))
        current = RayTable(current_uri, text_columns=categorical)
        report_path = report_out or None
        result = current.drift(reference, numeric=numeric, categorical=categorical, policy=rules,
                               report_path=report_path, schema=schema, predict=predict)
        return _recorded(result, source=resolve(current_uri), current_uri=shown, reference_uri=reference_uri,
                         profile=profile, schema_source=schema_source, champion=champion, ids=ids,
                         model_name=model_name, report_path=report_path)


def _recorded(result: Any, *, source: Any, current_uri: str, reference_uri: str, profile: Any, schema_source: str,
              champion: Any, ids: list[str], model_name: str, report_path: str | None) -> DriftStepResult:
    """The step's result, recorded in MLflow with a ``model_name``; ``current_uri`` as shown (redacted)."""
    checked = DriftStepResult(drift=result, data_md5=source.md5, data_version=source.version,
                              current_uri=current_uri, reference_uri=redact(reference_uri),
                              reference_profile=profile is not None, schema_source=schema_source,
                              champion_version=champion.version if champion else None, id_columns=ids)
    if model_name:
        record_drift_check(model_name, checked, current_uri=checked.current_uri, report_path=report_path)
    return checked


@dataclass(kw_only=True, slots=True)
class QualityStepResult:
    """A quality check of the champion on one batch of labelled rows."""

    quality: Any
    """The :class:`monitoring.quality.QualityResult`."""
    champion_version: str
    data_md5: str
    """md5 (DVC's hash) of the labelled file (with separate labels: of both files' md5s): the trigger dedupes on
    it."""
    labelled_uri: str
    """The rows, credentials removed."""
    labels_uri: str
    """The labels joined to them, credentials removed; empty when the rows hold them."""
    unlabelled_rows: int
    """Rows of ``labelled_uri`` whose label has not arrived in ``labels_uri`` (left out)."""

    def to_dict(self) -> dict[str, Any]:
        """``kfloop quality --json`` (the :class:`monitoring.quality.QualityResult` contract) plus champion,
        data hash and where the rows came from."""
        return {**self.quality.to_dict(), "champion_version": self.champion_version, "data_md5": self.data_md5,
                "labelled_uri": self.labelled_uri, "labels_uri": self.labels_uri,
                "unlabelled_rows": self.unlabelled_rows}


@step_function
def quality_step(*, labelled_uri: str, labels_uri: str, id_column: str, model_name: str, policy: dict[str, Any],
                 report_out: str, current_logs_uri: str = "", since: str = "") -> QualityStepResult:
    """Score the champion of ``model_name`` on rows whose labels arrived (``labelled_uri`` holds the schema's
    features and target; or its features, with the labels in ``labels_uri`` joined on ``id_column``), compare
    with its recorded holdout metrics, and record the check in MLflow with Evidently's report
    (:func:`monitoring.records.record_quality_check`); the report is also written to ``report_out`` if given.

    With ``current_logs_uri`` instead of ``labelled_uri`` the rows are the requests served in the ``since`` window
    (:mod:`monitoring.inference_logs`), the labels joined by ``request_id`` (default) or ``row_id``.

    Raises:
        ValueError: no champion, ``labels_uri`` without ``id_column``, both or neither of ``labelled_uri`` and
            ``current_logs_uri`` (which needs ``labels_uri`` and ``since``), or a metric undefined on enough labels
            (see :func:`monitoring.quality.check_quality`; too few labels are the verdict ``insufficient_labels``).
        data.tables.DataFileError: a file is unusable, lacks a column or holds values outside the champion's
            schema; nothing is recorded then.
    """
    if bool(labelled_uri) == bool(current_logs_uri):
        raise ValueError("give the rows as labelled_uri (a table) or current_logs_uri (inference logs), one of them")
    if not current_logs_uri:
        return _quality(labelled_uri=labelled_uri, shown="", labels_uri=labels_uri, id_column=id_column,
                        model_name=model_name, policy=policy, report_out=report_out)
    if not (labels_uri and since):
        raise ValueError(f"current_logs_uri={redact(current_logs_uri)!r} needs labels_uri (the labels that arrived, "
                         f"with {ID_COLUMN} or {ROW_COLUMN}) and since (the window, e.g. 7d)")
    with _served_batch(current_logs_uri, since, "quality") as table:
        return _quality(labelled_uri=table, shown=f"{redact(current_logs_uri)} (since {since})",
                        labels_uri=labels_uri, id_column=id_column or ID_COLUMN, model_name=model_name,
                        policy=policy, report_out=report_out)


def _quality(*, labelled_uri: str, shown: str, labels_uri: str, id_column: str, model_name: str,
             policy: dict[str, Any], report_out: str) -> QualityStepResult:
    """:func:`quality_step` on the table at ``labelled_uri`` (recorded as ``shown``, else its own name)."""
    from monitoring.quality import check_quality, join_labels, write_quality_report
    rules = QualityPolicy.from_dict(policy)
    if labels_uri and not id_column:
        raise ValueError("labels_uri is set without id_column: name the id column both files share")
    champion = get_champion(model_name)
    if champion is None:
        raise ValueError(f"model '{model_name}' has no champion to check; train and promote one first")
    schema = load_schema(champion_schema(model_name))
    target = schema_roles(schema).target
    rows, source = read_table_source(labelled_uri)
    shown = shown or source.uri
    md5, where, labels_record, unlabelled = source.md5, shown, "", 0
    if labels_uri:
        labels, labels_source = read_table_source(labels_uri)
        rows, unlabelled = join_labels(rows, labels, id_column=id_column, target=target, data_uri=shown,
                                       labels_uri=labels_source.uri)
        md5 = hashlib.md5(f"{source.md5}:{labels_source.md5}".encode()).hexdigest()
        where = f"{shown} joined with {labels_source.uri} on '{id_column}'"
        labels_record = labels_source.uri
    _require_valid(rows, schema, where)
    predictor = load_version_predictor(model_name, champion.version)
    rules = replace(rules, slice_columns=(list(predictor.transform.categorical) if rules.slice_columns is None
                                          else rules.slice_columns))
    regression = predictor.task == "regression"  # scored on its predicted values, as one column
    scores = predictor.predict_values(rows)[:, None] if regression else predictor.predict_proba(rows)
    classes = [] if regression else predictor.classes
    result = check_quality(y_true=rows[target].to_numpy(), proba=scores, classes=classes,
                           threshold=None if regression else predictor.threshold, rows=rows, policy=rules,
                           baseline=_champion_baseline(champion, predictor, rules.primary_metric))
    progress(f"quality: {model_name} v{champion.version} on {where}: {result.reason}")
    checked = QualityStepResult(quality=result, champion_version=champion.version, data_md5=md5,
                                labelled_uri=shown, labels_uri=labels_record,
                                unlabelled_rows=unlabelled)
    with tempfile.TemporaryDirectory(prefix="kfloop-quality-") as tmp:
        report = write_quality_report(report_out or Path(tmp) / "quality_report.html", rows, target=target,
                                      proba=scores, classes=classes,
                                      predicted=scores[:, 0] if regression else predictor.labels(scores),
                                      result=result)
        record_quality_check(model_name, checked, report_path=str(report))
    return checked


def retrain_data(*, rows_uri: str, retrain_uri: str, no_target: str = "") -> str:
    """The data a retraining after a check trains on: ``retrain_uri``, else the checked rows (``rows_uri``) unless
    ``no_target`` says why they hold no target.

    Raises:
        ValueError: ``no_target`` and no ``retrain_uri``: the rows alone lack the target.
    """
    if retrain_uri or not no_target:
        return retrain_uri or rows_uri
    raise ValueError(f"{no_target}: set retrain_uri to the data a retraining trains on")


def _require_valid(rows, schema, where: str) -> None:
    """The labelled rows against the champion's schema, as validation checks training data (extra columns and
    the table-level row-count checks aside: ``quality.min_rows`` decides how few rows are too few).

    Raises:
        data.tables.DataFileError: every failure, naming file, column, rule and values.
    """
    relaxed = copy.deepcopy(schema)
    relaxed.checks, relaxed.strict = [], False
    report = validate(rows, relaxed)
    if not report.ok:
        raise DataFileError(where, "; ".join(f.describe() for f in report.failures))


def _champion_baseline(champion: Any, predictor: Any, metric: str | None):
    """What the champion's registration recorded for ``metric`` (default: the gate's primary metric): its
    holdout value, the trivial baseline's, its training class shares and its holdout slices.

    Raises:
        ValueError: the champion recorded no holdout value of the metric.
    """
    from monitoring.quality import Baseline
    client = mlflow.MlflowClient()
    metric = metric or champion.record.primary_metric
    recorded = holdout_metrics(client, champion.run_id) if champion.run_id else {}
    if metric not in recorded:
        raise ValueError(f"champion v{champion.version} recorded no holdout {metric!r} (it has {sorted(recorded)}); "
                         "set quality.primary_metric to one of them")
    decision = mlflow.artifacts.load_dict(f"runs:/{champion.run_id}/{EVALUATION_ARTIFACT}")
    slices = ({(s["column"], s["value"]): s["challenger"] for s in decision.get("slices", [])
               if s["challenger"] is not None} if decision.get("primary_metric") == metric else None)
    counts = predictor.description.get("class_counts")
    return Baseline(metric=metric, value=recorded[metric],
                    trivial=holdout_metrics(client, champion.run_id, "baseline").get(metric),
                    priors=None if counts is None else [c / sum(counts) for c in counts], slices=slices,
                    holdout_rows=decision.get("holdout_rows"))
