"""Data validation with pandera: infer a schema from good data, validate a file chunk by chunk and report every
failure.

The schema is a pandera ``DataFrameSchema`` stored as YAML (:func:`schema_to_yaml`, :func:`load_schema`). It carries
``metadata: {kfloop: {target, task, id_columns}}``, which :func:`schema_roles` turns into the column roles that
training and drift checks use. Two table-level checks are registered with pandera when this module is imported, so
they survive the YAML round trip: ``kfloop_min_rows`` and ``kfloop_min_classes``.
"""
from __future__ import annotations

import copy
import csv
import io
import math
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pandera.pandas as pa
import yaml
from pandera.errors import SchemaDefinitionError, SchemaErrors
from pandera.extensions import register_check_method
from pandera.io import pandas_io
from pandera.io._flat_checks import COMPONENT_RESERVED_KEYS

from data import storage
from data.errors import EXIT_FINDING, KfloopError
from data.schema_rules import RuleSet
from data.tables import DEFAULT_LIMITS, DataFileError, ReadLimits, iter_table, local_copy, non_numbers

META_KEY = "kfloop"
TASKS = ("classification", "regression")
MAX_EXAMPLES = 5
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
"""Cell starts that spreadsheets read as a formula (CSV injection)."""
SCHEMA_MAX_BYTES = 16 << 20
"""The largest schema YAML read from object storage."""
# Keys pandera's deserializer reads at the top level of a schema; it ignores any other key without a word.
SCHEMA_KEYS = frozenset({
    "schema_type", "version", "api", "dataframe_library", "columns", "checks", "index", "multiindex", "dtype",
    "coerce", "strict", "name", "ordered", "unique", "report_duplicates", "unique_column_names",
    "add_missing_columns", "title", "description", "drop_invalid_rows", "metadata",
})


def kfloop_min_rows(df: pd.DataFrame, *, min_rows: int) -> bool:
    """Table-level check: the data has at least ``min_rows`` rows."""
    return len(df) >= min_rows


def kfloop_min_classes(df: pd.DataFrame, *, column: str, min_classes: int) -> bool:
    """Table-level check: ``column`` holds at least ``min_classes`` distinct non-null values.

    A missing ``column`` passes here: the schema reports the missing column on its own.
    """
    return column not in df.columns or df[column].nunique() >= min_classes


# Registered once per process; a second import of this file under another module name finds them registered.
for _check_fn, _stats in ((kfloop_min_rows, ["min_rows"]), (kfloop_min_classes, ["column", "min_classes"])):
    if not hasattr(pa.Check, _check_fn.__name__):
        register_check_method(_check_fn, statistics=_stats, supported_types=pd.DataFrame)



@dataclass(frozen=True, kw_only=True, slots=True)
class SchemaRoles:
    """The role of every column of a kfloop schema, in schema column order."""

    target: str
    """The column the model predicts."""
    task: str
    """``classification`` or ``regression``."""
    numeric: list[str]
    """Feature columns of int, float or bool dtype."""
    categorical: list[str]
    """Feature columns of string dtype."""
    ids: list[str]
    """Identifier columns: validated (unique), never used as features."""


ROW_NUMBERS = "data rows counted from 0, header excluded"
"""How every message, report and JSON field numbers a file's rows: like pandas' default index (``df.iloc[7]``),
whatever the format, so a spreadsheet shows data row 7 of a CSV file on its line 9."""


def rows_named(rows: list) -> str:
    """``data rows [0, 7] (counted from 0, header excluded)``: how every message names rows of a file
    (:data:`ROW_NUMBERS`)."""
    return f"data rows {rows} (counted from 0, header excluded)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    """One rule that failed, summarised over all the rows it failed on."""

    column: str | None
    """The column the rule belongs to; None for a rule on the whole table."""
    rule: str
    """``required`` (column missing), ``strict`` (column not in the schema), ``dtype('int64')``, ``not_nullable``,
    ``unique``, or a check such as ``in_range(18, 90)``, ``isin([...])``, ``min_rows(50)``."""
    examples: list
    """Up to five distinct failing values (for a table-level rule: the observed value(s))."""
    count: int
    """How many values failed (0 for a missing or extra column)."""
    rows: list = field(default_factory=list)
    """Index labels of up to five failing rows: for a file, data rows counted from 0 (:func:`rows_named`)."""

    def describe(self) -> str:
        """The failure as one line without the file name."""
        if self.column is None:
            return f"dataframe failed {self.rule}: observed {self.examples}"
        where = f"column '{self.column}' failed {self.rule}"
        if self.rule == "required":
            return f"{where}: the column is missing"
        if self.rule == "strict":
            return f"{where}: the column is not in the schema"
        text = f"{where}: {self.count} value(s), e.g. {self.examples}"
        return f"{text} at {rows_named(self.rows)}" if self.rows else text


@dataclass(kw_only=True, slots=True)
class ValidationReport:
    """Every failure found in one validation run."""

    source: str
    """The validated file, or ``<dataframe>``."""
    n_rows: int
    """Rows in the validated data."""
    failures: list[Failure]
    """All failed rules; empty when the data is valid."""
    schema_diff: list[str] = field(default_factory=list)
    """Column-level skew between schema and data (:func:`schema_diff`); empty when the columns line up."""

    @property
    def ok(self) -> bool:
        """True when no rule failed."""
        return not self.failures

    def format(self) -> str:
        """One line per failure: ``<file>: column '<c>' failed <rule>: <count> value(s), e.g. [...]``."""
        return "\n".join(f"{self.source}: {failure.describe()}" for failure in self.failures)

    def format_diff(self) -> str:
        """One line per skewed column: ``<file>: schema diff: - 'c' (dtype): missing from the data``."""
        return "\n".join(f"{self.source}: schema diff: {line}" for line in self.schema_diff)

    def to_csv(self) -> str:
        """The failures as CSV (file, column, rule, count, examples and rows ``;``-separated, :data:`ROW_NUMBERS`) for
        spreadsheets.

        A cell starting with ``=``, ``+``, ``-``, ``@``, tab or carriage return gets a leading ``'``, so a
        spreadsheet shows it as text instead of running it as a formula (CSV injection)."""
        out = io.StringIO()
        writer = csv.writer(out)  # RFC 4180: CRLF rows, so a CR or LF inside a cell gets quoted
        writer.writerow(["file", "column", "rule", "count", "examples", "data_rows_from_0"])
        for f in self.failures:
            row = [self.source, f.column or "", f.rule, f.count, "; ".join(map(str, f.examples)),
                   "; ".join(map(str, f.rows))]
            writer.writerow([_inert_cell(str(cell)) for cell in row])
        return out.getvalue()


def _inert_cell(text: str) -> str:
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


class ValidationError(KfloopError):
    """Raised by callers that treat a failed :class:`ValidationReport` as an error: invalid data is a finding."""

    exit_code = EXIT_FINDING

    def __init__(self, report: ValidationReport):
        self.report = report
        super().__init__(report.format())


# ------------------------------------------------------------------------------------------------- schema inference

def _python(value: Any) -> Any:
    """A YAML-safe Python scalar for a NumPy/pandas scalar; None for nulls."""
    if value is None or (not isinstance(value, (list, tuple, str)) and pd.isna(value)):
        return None
    return value.item() if isinstance(value, np.generic) else value


def _widened_range(series: pd.Series, margin: float, integer: bool) -> tuple[float, float]:
    lo, hi = float(series.min()), float(series.max())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"column '{series.name}' holds infinite values: replace them before inferring a schema")
    pad = margin * (hi - lo) if hi > lo else max(abs(hi) * margin, 1.0)
    new_lo, new_hi = lo - pad, hi + pad
    if lo >= 0:
        new_lo = max(new_lo, 0.0)
    if integer:
        return int(math.floor(new_lo)), int(math.ceil(new_hi))
    if pad == 0:
        return lo, hi
    step = 10.0 ** (math.floor(math.log10(pad)) - 2)
    decimals = max(0, -int(math.floor(math.log10(step))))
    return round(math.floor(new_lo / step) * step, decimals), round(math.ceil(new_hi / step) * step, decimals)


def _kind(series: pd.Series) -> str:
    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "float"
    if isinstance(dtype, pd.CategoricalDtype) or pd.api.types.is_string_dtype(dtype) or dtype == object:
        return "str"
    raise ValueError(f"column '{series.name}' has dtype {dtype}; kfloop schemas support int, float, bool and string "
                     "columns: convert the column or drop it")


_DTYPES = {"bool": "bool", "int": "int64", "float": "float64", "str": "str"}
_NULLABLE_DTYPES = {**_DTYPES, "bool": "boolean", "int": "Int64"}  # NumPy bool and int64 cannot hold nulls


def detect_ids(df: pd.DataFrame, target: str = "") -> list[str]:
    """The columns :func:`infer_schema` calls ids: named ``id`` or ``*_id``, int or text, no nulls, all unique
    (``target`` never)."""
    ids = []
    for name in df.columns:
        lowered = str(name).lower()
        if name == target or not (lowered == "id" or lowered.endswith("_id")):
            continue
        series = df[name]
        if _kind(series) in ("int", "str") and series.notna().all() and series.is_unique:
            ids.append(name)
    return ids


def infer_schema(
    df: pd.DataFrame,
    *,
    target: str,
    task: str = "classification",
    id_columns: list[str] | None = None,
    min_rows: int = 50,
    margin: float = 0.1,
    max_categories: int = 200,
) -> pa.DataFrameSchema:
    """A strict, coercing pandera schema describing ``df`` (a known-good data set).

    Every column is required and typed; a column is nullable only where ``df`` has nulls. Numeric features get an
    ``in_range`` check (observed min/max widened by ``margin`` of the range, never below 0 for non-negative columns);
    string features with at most ``max_categories`` values get ``isin``; id columns (``id_columns``, or when None
    the all-unique int/string columns named ``id`` / ``*_id``) are unique; the target is non-null, ``isin`` the
    observed classes for classification or ranged for regression. Table checks: at least ``min_rows`` rows and,
    for classification, at least 2 target classes. ``metadata.kfloop`` records target, task and id columns.

    Raises:
        ValueError: unknown task or bad numbers, empty ``df``, missing target/id column, nulls in the target,
            fewer than 2 classes, a non-numeric regression target, non-unique id column, or a column dtype
            kfloop does not support.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if min_rows < 1 or margin < 0 or max_categories < 1:
        raise ValueError(f"min_rows and max_categories must be >= 1 and margin >= 0, got min_rows={min_rows}, "
                         f"margin={margin}, max_categories={max_categories}")
    if df.empty:
        raise ValueError("cannot infer a schema from an empty table: give the training data")
    if target not in df.columns:
        raise ValueError(f"target column '{target}' is not in the data; columns: {list(df.columns)}")
    nulls = int(df[target].isna().sum())
    if nulls:
        raise ValueError(f"target column '{target}' has {nulls} null(s): drop those rows before inferring a schema")
    if id_columns is None:
        id_columns = detect_ids(df, target)
    for name in id_columns:
        if name not in df.columns or name == target:
            raise ValueError(f"id column '{name}' is not a non-target column of the data")
        if not df[name].is_unique:
            raise ValueError(f"id column '{name}' has duplicate values: pass the right id_columns")
    if task == "regression" and _kind(df[target]) not in ("int", "float"):
        raise ValueError(f"regression target '{target}' has dtype {df[target].dtype}: it must be numeric")
    classes = None
    if task == "classification":
        classes = sorted(_python(v) for v in df[target].unique())
        if len(classes) < 2:
            raise ValueError(f"target column '{target}' has a single class {classes}: classification needs >= 2")

    columns = {}
    for name in df.columns:
        series = df[name]
        kind = _kind(series)
        checks = []
        if name == target and classes is not None:
            checks.append(pa.Check.isin(classes))
        elif name in id_columns:
            pass
        elif kind in ("int", "float") and series.notna().any():
            lo, hi = _widened_range(series.dropna(), margin, integer=kind == "int")
            checks.append(pa.Check.in_range(lo, hi))
        elif kind == "str" and series.nunique() <= max_categories:
            checks.append(pa.Check.isin(sorted(str(v) for v in series.dropna().unique())))
        nullable = bool(series.isna().any())
        columns[name] = pa.Column(
            (_NULLABLE_DTYPES if nullable else _DTYPES)[kind],
            checks=checks or None,
            nullable=nullable,
            unique=name in id_columns,
        )
    table_checks = [pa.Check.kfloop_min_rows(min_rows=min_rows, error=f"min_rows({min_rows})")]
    if task == "classification":
        table_checks.append(pa.Check.kfloop_min_classes(column=target, min_classes=2,
                                                        error=f"min_classes('{target}', 2)"))
    return pa.DataFrameSchema(
        columns,
        checks=table_checks,
        strict=True,
        coerce=True,
        metadata={META_KEY: {"target": target, "task": task, "id_columns": list(id_columns)}},
    )


# ------------------------------------------------------------------------------------------------------ schema I/O

def schema_to_yaml(schema: pa.DataFrameSchema) -> str:
    """The schema as pandera YAML, including its schema-level ``metadata`` (which ``schema.to_yaml()`` drops)."""
    serialized = pandas_io.serialize_schema(schema)
    if schema.metadata:
        serialized = {**serialized, "metadata": schema.metadata}
    return yaml.safe_dump(serialized, sort_keys=False, width=120)


def load_schema(path_or_text: str | Path) -> pa.DataFrameSchema:
    """Load a schema from a YAML file path, an object-storage URI or YAML text (a string holding a newline or ``:``).

    Raises:
        DataFileError: the file is missing or unreadable, or the YAML is not a valid pandera DataFrameSchema.
    """
    if storage.is_remote(path_or_text):
        source = storage.redact(path_or_text)
        try:
            text = storage.read_bytes(path_or_text, max_bytes=SCHEMA_MAX_BYTES).decode("utf-8")
        except storage.StorageError as exc:
            raise DataFileError(source, f"schema {exc.problem}") from exc
        except UnicodeDecodeError as exc:
            raise DataFileError(source, f"unreadable schema file: {exc}") from exc
    elif isinstance(path_or_text, Path) or not ("\n" in path_or_text or ":" in path_or_text):
        source = str(path_or_text)
        try:
            text = Path(path_or_text).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise DataFileError(source, "schema file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise DataFileError(source, f"unreadable schema file: {exc}") from exc
    else:
        source, text = "<schema text>", path_or_text
    try:
        serialized = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DataFileError(source, f"schema is not valid YAML: {exc}") from exc
    if not isinstance(serialized, dict) or serialized.get("schema_type") != "dataframe":
        raise DataFileError(source, "not a pandera DataFrameSchema YAML (no 'schema_type: dataframe'): write it "
                                    "with schema_to_yaml or `kfloop infer-schema`")
    unknown = _unknown_keys(serialized)
    if unknown:
        raise DataFileError(source, f"unknown schema key(s) {unknown}: neither a pandera option nor a registered "
                                    "check (pandera would silently ignore them); fix the spelling")
    try:
        return pandas_io.deserialize_schema(serialized)
    except (SchemaDefinitionError, AttributeError, TypeError, ValueError) as exc:
        raise DataFileError(source, f"invalid pandera schema: {exc}") from exc


def _unknown_keys(serialized: dict) -> list[str]:
    """Keys pandera's YAML reader would drop silently, e.g. a misspelt check name on a column."""
    unknown = [key for key in serialized if key not in SCHEMA_KEYS]
    columns = serialized.get("columns")
    for name, column in (columns.items() if isinstance(columns, dict) else ()):
        for key in column if isinstance(column, dict) else ():
            if key not in COMPONENT_RESERVED_KEYS and not callable(getattr(pa.Check, key, None)):
                unknown.append(f"columns.{name}.{key}")
    return unknown


def schema_roles(schema: pa.DataFrameSchema) -> SchemaRoles:
    """Target, task, id, numeric and categorical feature columns of a kfloop schema, in schema column order.

    Raises:
        ValueError: the schema lacks ``metadata.kfloop`` or names columns it does not have, or a feature column's
            dtype is neither numeric/bool nor string.
    """
    meta = (schema.metadata or {}).get(META_KEY)
    if not isinstance(meta, dict) or "target" not in meta:
        raise ValueError("schema has no metadata.kfloop {target, task, id_columns}: create it with infer_schema "
                         "(`kfloop infer-schema`)")
    target, task, ids = meta["target"], meta.get("task", "classification"), list(meta.get("id_columns") or [])
    if task not in TASKS:
        raise ValueError(f"schema metadata.kfloop.task must be one of {TASKS}, got {task!r}")
    unknown = [name for name in [target, *ids] if name not in schema.columns]
    if unknown:
        raise ValueError(f"schema metadata.kfloop names columns {unknown} that the schema does not define")
    numeric, categorical = [], []
    for name, column in schema.columns.items():
        if name == target or name in ids:
            continue
        dtype = column.dtype.type if column.dtype is not None else None
        if dtype is not None and (pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_numeric_dtype(dtype)):
            numeric.append(name)
        elif dtype is not None and (pd.api.types.is_string_dtype(dtype) or isinstance(dtype, pd.CategoricalDtype)):
            categorical.append(name)
        else:
            raise ValueError(f"schema column '{name}' has dtype {column.dtype}; features must be numeric, bool or "
                             "string")
    return SchemaRoles(target=target, task=task, numeric=numeric, categorical=categorical, ids=ids)


# ------------------------------------------------------------------------------------------------------- validation

def _example(value: Any) -> Any:
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    return _python(value)


def _summarise(column: str | None, rule: str, values: pd.Series, labels: pd.Series, rows: pd.Index | None) -> Failure:
    """A Failure from the failing ``values`` of one rule at index ``labels``, keeping a few examples.

    With ``rows`` (the data's index, when unique) the failures are first put in row order.
    """
    if rows is not None:
        order = np.argsort(rows.get_indexer(labels), kind="stable")
        values, labels = values.iloc[order], labels.iloc[order]
    examples = []
    for value in values.head(10_000):  # enough to find five distinct values without hashing every failure
        value = _example(value)
        if value not in examples:
            examples.append(value)
            if len(examples) == MAX_EXAMPLES:
                break
    row_labels = [_python(label) for label in labels.head(MAX_EXAMPLES)]
    return Failure(column=column, rule=rule, examples=examples, count=len(values), rows=row_labels)


def _rule_name(check: str) -> str:
    if check.startswith("coerce_dtype("):
        return check.removeprefix("coerce_")
    return {"field_uniqueness": "unique", "column_in_dataframe": "required", "column_in_schema": "strict"}.get(
        check, check)


_FAMILY = {"boolean": "number", "integer": "number", "floating": "number", "mixed-integer-float": "number",
           "decimal": "number", "empty": None}


def _family(values: pd.Series) -> str | None:
    """``number`` or ``text`` for the non-null values (None when there are none)."""
    return _FAMILY.get(pd.api.types.infer_dtype(values.dropna(), skipna=True), "text")


def schema_diff(schema: pa.DataFrameSchema, df: pd.DataFrame) -> list[str]:
    """How the data's columns differ from the schema's: ``- 'c' (dtype): missing from the data``, ``+ 'c' (dtype):
    not in the schema``, ``~ 'c': schema dtype, data holds <kind> values``. Retyped means numbers where the schema
    has text or the other way round; a column without values is never called retyped."""
    lines = [f"- '{name}' ({column.dtype}): missing from the data" for name, column in schema.columns.items()
             if name not in df.columns]
    lines += [f"+ '{name}' ({df[name].dtype}): not in the schema" for name in df.columns if name not in schema.columns]
    for name, column in schema.columns.items():
        if name not in df.columns or column.dtype is None:
            continue
        dtype = column.dtype.type
        wanted = "text" if pd.api.types.is_string_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype) else "number"
        found = _family(df[name])
        if found is not None and found != wanted:
            examples = non_numbers(df[name]) if wanted == "number" else df[name].dropna().head(3).tolist()
            lines.append(f"~ '{name}': schema {column.dtype}, data holds {found} values (e.g. {examples})")
    return lines


TABLE_CHECKS = ("kfloop_min_rows", "kfloop_min_classes")
"""Table-level checks counted over the whole file while it is validated chunk by chunk."""


def validate(df_or_path: pd.DataFrame | str | Path, schema: pa.DataFrameSchema | str | Path, *,
             limits: ReadLimits = DEFAULT_LIMITS) -> ValidationReport:
    """Validate a table, or a Parquet/CSV file read chunk by chunk (``limits.chunk_rows`` rows at a time), against
    ``schema`` (or a schema YAML file/text).

    Every failed rule is reported once with its failing-value count, up to five distinct example values and up to
    five row labels (a file's rows are numbered from 0 over the whole file): missing and extra columns, dtype
    coercion (plus, for a numeric column, its other checks on the values that do parse), nulls, ranges, categories,
    duplicate ids (also across chunks) and the table-level checks (over the whole file). The report does not depend
    on the chunk size.

    Raises:
        DataFileError: the data or schema file cannot be read (see :func:`data.tables.read_table`,
            :func:`load_schema`).
        data.storage.StorageError: the data URI is not one kfloop reads (:func:`data.storage.check_uri`).
    """
    if not isinstance(schema, pa.DataFrameSchema):
        schema = load_schema(schema)
    if isinstance(df_or_path, pd.DataFrame):
        return StreamedValidation(schema).run(lambda: [df_or_path], "<dataframe>")
    storage.check_uri(df_or_path)  # an http(s) or ftp URI is refused, not read as a local path
    if storage.is_remote(df_or_path):
        with local_copy(df_or_path, limits=limits) as (path, source):
            return replace(validate(path, schema, limits=limits), source=source.uri)
    return StreamedValidation(schema).run(lambda: iter_table(df_or_path, limits=limits), str(df_or_path))


@dataclass(kw_only=True, slots=True)
class ChunkValidation:
    """What validating one chunk finds (:meth:`StreamedValidation.check_chunk`), merged in file order by
    :meth:`StreamedValidation.add`: whichever engine reads the chunks, each runs this per chunk."""

    rows: int
    columns: list[str]
    failures: list[Failure]
    """The chunk's failures, rows labelled by the chunk's index."""
    hashes: dict[str, np.ndarray]
    """64-bit hashes of each unique column's values (8 bytes a row), for duplicates across chunks."""
    classes: dict[str, list]
    """Distinct values of each ``min_classes`` column (at most :data:`MAX_CLASSES_KEPT`)."""
    diff: dict[str, str]
    """:func:`schema_diff` lines by column."""


class StreamedValidation:
    """One validation of chunks of a table: per chunk the row-level rules and pandera's column checks
    (:meth:`check_chunk`); across chunks, in file order (:meth:`add`), the failures, duplicate keys (the chunks'
    key hashes: :meth:`repeated`, then :meth:`duplicate_failures` per chunk in a second pass), the row count and the
    classes."""

    def __init__(self, schema: pa.DataFrameSchema):
        self.schema = schema
        self.chunk_schema = copy.deepcopy(schema)
        self.chunk_schema.checks = [check for check in schema.checks if check.name not in TABLE_CHECKS]
        for column in self.chunk_schema.columns.values():  # :class:`RuleSet` runs the column checks, faster
            column.unique, column.checks = False, []
        self.unique = [name for name, column in schema.columns.items() if column.unique]
        self.classes = {check.statistics["column"]: set() for check in schema.checks
                        if check.name == "kfloop_min_classes"}
        self.columns: list[str] | None = None
        self.rows = 0
        self.hashes: dict[str, list[np.ndarray]] = {name: [] for name in self.unique}
        self.found: dict[tuple[str | None, str], Failure] = {}
        self.diff: dict[str, str] = {}

    def run(self, chunks: Callable[[], Iterable[pd.DataFrame]], source: str) -> ValidationReport:
        """Validate the chunks ``chunks()`` yields (indexed by their rows' labels in the whole table); a second
        pass collects duplicate keys, when there are any."""
        for chunk in chunks():
            self.add(self.check_chunk(chunk))
        repeated = self.repeated()
        if repeated:
            for chunk in chunks():
                for failure in self.duplicate_failures(chunk, repeated):
                    self._add(failure)
        return self.report(source)

    def check_chunk(self, chunk: pd.DataFrame) -> ChunkValidation:
        """What one chunk fails, its key hashes and its classes: pure, so any engine runs it where the chunk is."""
        rules, failures, diff = RuleSet(self.schema, list(chunk.columns)), [], {}
        for failed in rules.check(chunk):
            failures.append(_summarise(failed.rule.column, failed.rule.name, failed.values,
                                       failed.values.index.to_series(), None))
        try:
            with warnings.catch_warnings():  # pandera's own concat of failure cases; nothing the caller can act on
                warnings.filterwarnings("ignore", "The behavior of DataFrame concatenation", FutureWarning)
                self.chunk_schema.validate(chunk, lazy=True)
        except SchemaErrors as exc:
            failures.extend(_failures(exc.failure_cases, self.chunk_schema, chunk, rules))
        for line in schema_diff(self.schema, chunk):
            diff.setdefault(line.split(":")[0], line)
        hashes = {name: pd.util.hash_pandas_object(chunk[name], index=False).to_numpy()
                  for name in self.unique if name in chunk.columns}
        classes = {name: [_python(v) for v in chunk[name].dropna().unique()[:MAX_CLASSES_KEPT]]
                   for name in self.classes if name in chunk.columns}
        return ChunkValidation(rows=len(chunk), columns=list(chunk.columns), failures=failures, hashes=hashes,
                               classes=classes, diff=diff)

    def add(self, part: ChunkValidation, *, offset: int = 0) -> None:
        """Merge the next chunk's :class:`ChunkValidation` (in file order), its row labels moved by ``offset``
        (a chunk numbered from 0 that starts at row ``offset`` of the table)."""
        if self.columns is None:
            self.columns = part.columns
        self.rows += part.rows
        for failure in part.failures:
            self._add(_shifted(failure, offset))
        for name, hashes in part.hashes.items():
            self.hashes[name].append(hashes)
        for name, values in part.classes.items():
            if len(self.classes[name]) < MAX_CLASSES_KEPT:
                self.classes[name].update(values)
        for key, line in part.diff.items():
            self.diff.setdefault(key, line)

    def repeated(self) -> dict[str, np.ndarray]:
        """The key hashes that occur more than once in the whole table, per unique column that has any."""
        repeated = {name: _repeated(parts) for name, parts in self.hashes.items() if parts}
        return {name: hashes for name, hashes in repeated.items() if len(hashes)}

    @staticmethod
    def duplicate_failures(chunk: pd.DataFrame, repeated: dict[str, np.ndarray]) -> list[Failure]:
        """The ``unique`` failures of one chunk: its rows whose key hash is in ``repeated`` (:meth:`repeated`)."""
        failures = []
        for name, hashes in repeated.items():
            values = chunk[name]
            mask = np.isin(pd.util.hash_pandas_object(values, index=False).to_numpy(), hashes)
            if mask.any():
                failures.append(_summarise(name, "unique", values[mask], values.index[mask].to_series(), None))
        return failures

    def add_failures(self, failures: Iterable[Failure], *, offset: int = 0) -> None:
        """Merge failures found in a second pass (:meth:`duplicate_failures`), in file order."""
        for failure in failures:
            self._add(_shifted(failure, offset))

    def report(self, source: str) -> ValidationReport:
        """The report of everything merged, the table-level checks decided on the whole table."""
        self._table_checks(self.rows)
        rules = RuleSet(self.schema, self.columns) if self.columns is not None else None
        order = {name: i for i, name in enumerate(self.schema.columns)}
        rule_order = {(name, rule.name): i for name, column in (rules.columns.items() if rules else ())
                      for i, rule in enumerate(column.rules)}
        failures = sorted(self.found.values(), key=lambda f: (
            f.column is None, order.get(f.column, len(order)), f.rule != "required",
            rule_order.get((f.column, f.rule), len(rule_order)), f.column is None or f.rule))
        return ValidationReport(source=source, n_rows=self.rows, failures=failures,
                                schema_diff=list(self.diff.values()) if failures else [])

    def _add(self, failure: Failure) -> None:
        """Record ``failure`` of one chunk, merged with the same rule's failures in earlier chunks."""
        key = (failure.column, failure.rule)
        before = self.found.get(key)
        if before is None:
            self.found[key] = failure
        elif failure.column is not None and failure.count:
            examples = before.examples + [v for v in failure.examples if v not in before.examples]
            self.found[key] = replace(before, count=before.count + failure.count,
                                      examples=examples[:MAX_EXAMPLES],
                                      rows=(before.rows + failure.rows)[:MAX_EXAMPLES])

    def _table_checks(self, rows: int) -> None:
        for check in self.schema.checks:
            rule = _rule_name(str(check.error or check.name))
            if check.name == "kfloop_min_rows" and rows < check.statistics["min_rows"]:
                self._add(Failure(column=None, rule=rule, examples=[rows], count=1))
            elif check.name == "kfloop_min_classes":
                column, seen = check.statistics["column"], self.classes[check.statistics["column"]]
                if column in (self.columns or []) and len(seen) < check.statistics["min_classes"]:
                    self._add(Failure(column=None, rule=rule, examples=sorted(seen, key=repr)[:MAX_EXAMPLES],
                                      count=1))


def _shifted(failure: Failure, offset: int) -> Failure:
    return replace(failure, rows=[row + offset for row in failure.rows]) if offset and failure.rows else failure


MAX_CLASSES_KEPT = 1000
"""Distinct values of a ``min_classes`` column kept while streaming: enough to decide any sensible minimum."""


def _repeated(parts: list[np.ndarray]) -> np.ndarray:
    """The hash values that occur more than once in ``parts``."""
    hashes = np.sort(np.concatenate(parts))
    return np.unique(hashes[1:][hashes[1:] == hashes[:-1]])


def _failures(cases: pd.DataFrame, schema: pa.DataFrameSchema, df: pd.DataFrame, rules: RuleSet) -> list[Failure]:
    """Group pandera's failure cases (one row per failing value) into one Failure per (column, rule), leaving out
    the row-level rules ``rules`` reports (:mod:`data.schema_rules`)."""
    # Work on the few distinct check names, not on the (up to millions of) failure rows.
    names = {check: str(check) for check in cases["check"].unique()}
    cases = cases.assign(rule=cases["check"].map({check: _rule_name(name) for check, name in names.items()}))
    covered = {(name, rule.name) for name, column in rules.columns.items() for rule in column.rules}
    cases = cases[[key not in covered for key in zip(cases["column"], cases["rule"])]]
    coercions = [check for check, name in names.items() if name.startswith("coerce_dtype(")]
    dtypes = [check for check, name in names.items() if name.startswith("dtype(")]
    uncoercible = set(cases.loc[cases["check"].isin(coercions), "column"])
    # A failed coercion is also reported as a dtype failure of the same values; keep one of the two.
    cases = cases[~(cases["column"].isin(uncoercible) & cases["check"].isin(dtypes))]
    # Nulls in a non-nullable column are reported by not_nullable, not again as values that fail coercion.
    non_nullable = [name for name, column in schema.columns.items() if not column.nullable]
    cases = cases[~(cases["check"].isin(coercions) & cases["column"].isin(non_nullable) & cases["failure_case"].isna())]
    rows = df.index if df.index.is_unique else None
    failures = []
    for (context, column, rule), group in cases.groupby(["schema_context", "column", "rule"], sort=False,
                                                        dropna=False):
        column = None if pd.isna(column) else column
        if rule in ("required", "strict"):
            failures.extend(Failure(column=name, rule=rule, examples=[], count=0)
                            for name in dict.fromkeys(group["failure_case"]))
        elif context == "DataFrameSchema" and not pd.isna(group["check_number"].iloc[0]):
            failures.append(Failure(column=None, rule=rule, examples=[], count=1))
        elif column in rules.columns and not pd.isna(group["check_number"].iloc[0]):
            continue  # a check pandera skipped or errored in after the column's dtype coercion failed
        else:
            failures.append(_summarise(column, rule, group["failure_case"], group["index"], rows))
    return failures
