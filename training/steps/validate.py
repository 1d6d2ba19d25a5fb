"""The validate step: the dataset against its schema before any GPU is spent."""
from __future__ import annotations

from dataclasses import dataclass

from data.fileio import atomic_write_text
from data.settings import step_function
from data.redaction import redact
from data.tables import local_copy, read_table
from data.validation import ValidationError, infer_schema, load_schema, schema_roles, schema_to_yaml, validate
from training.progress import progress
from training.registry.versions import champion_schema, get_champion

@dataclass(kw_only=True, slots=True)
class ValidateResult:
    data_md5: str
    """md5 of the data file: the hash DVC records for it."""
    data_version: str
    """The object store's version id or ETag of the data; empty for a local file."""
    target: str
    schema_source: str
    """``schema_uri``, ``champion vN`` or ``inferred`` (first run only)."""
    rows: int


def resolve_schema(read_data, *, dataset_uri: str, schema_uri: str, target: str, model_name: str, task: str = ""):
    """The schema a training run validates against: ``schema_uri``, else the champion's recorded schema, else
    (the very first run, no champion) one inferred for ``task`` (default classification) from this data, which
    ``read_data()`` reads whole.

    Raises:
        ValueError: no schema and no target to infer one, or a target or task that contradicts the schema.
    """
    if schema_uri:
        schema, source = load_schema(schema_uri), schema_uri
    elif (recorded := champion_schema(model_name)) is not None:
        schema, source = load_schema(recorded), f"champion v{get_champion(model_name).version}"
    elif target:
        schema, source = infer_schema(read_data(), target=target, task=task or "classification"), "inferred"
    else:
        raise ValueError(f"{dataset_uri}: model '{model_name}' has no champion schema to validate against; pass "
                         "schema_uri=FILE, or target=COLUMN to infer a schema on this first run")
    roles = schema_roles(schema)
    if target and target != roles.target:
        raise ValueError(f"target '{target}' differs from the schema's target '{roles.target}' ({source}); "
                         f"use another model_name for a different prediction task")
    if task and task != roles.task:
        raise ValueError(f"task '{task}' differs from the schema's task '{roles.task}' ({source}); use another "
                         "model_name for a different prediction task, or set metadata.kfloop.task in the schema")
    return schema, source


@step_function
def validate_step(*, dataset_uri: str, schema_uri: str, target: str, model_name: str,
                  schema_out: str, task: str = "") -> ValidateResult:
    """Validate the dataset before any GPU is spent and write the schema used.

    Raises:
        data.tables.DataFileError: the file is unusable.
        data.validation.ValidationError: every failed rule, in one report.
    """
    with local_copy(dataset_uri) as (path, data):
        schema, source = resolve_schema(lambda: read_table(path), dataset_uri=data.uri, schema_uri=schema_uri,
                                        target=target, model_name=model_name, task=task)
        report = validate(path, schema)
    report.source = data.uri
    if not report.ok:
        for line in [*report.format_diff().splitlines(), *report.format().splitlines()]:
            progress(f"validate: {line}")
        raise ValidationError(report)
    atomic_write_text(schema_out, schema_to_yaml(schema))
    progress(f"validate: {data.uri}: {report.n_rows} rows valid against schema from {redact(source)}")
    return ValidateResult(data_md5=data.md5, data_version=data.version, target=schema_roles(schema).target,
                          schema_source=redact(source), rows=report.n_rows)


