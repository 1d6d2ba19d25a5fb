"""Data validation with pandera: read a data file, infer a schema from good data, validate and report every failure.

The schema is a pandera ``DataFrameSchema`` stored as YAML (:func:`schema_to_yaml`, :func:`load_schema`). It carries
``metadata: {kfloop: {target, task, id_columns}}``, which :func:`schema_roles` turns into the column roles that
training and drift checks use. Two table-level checks are registered with pandera when this module is imported, so
they survive the YAML round trip: ``kfloop_min_rows`` and ``kfloop_min_classes``.
"""
from __future__ import annotations

import csv
import io
import math
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import pandera.pandas as pa
import pyarrow
import pyarrow.parquet as pq
import yaml
from pandera.errors import SchemaDefinitionError, SchemaErrors
from pandera.extensions import register_check_method
from pandera.io import pandas_io
from pandera.io._flat_checks import COMPONENT_RESERVED_KEYS

from data import storage
from training.errors import EXIT_DATA_FILE, KfloopError
from training.fileio import file_digest
from data.schema_rules import RuleSet

META_KEY = "kfloop"
TASKS = ("classification", "regression")
MAX_EXAMPLES = 5
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
"""Cell starts that spreadsheets read as a formula (CSV injection)."""
PARQUET_MAGIC = b"PAR1"
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
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


class DataFileError(KfloopError):
    """A data or schema file that cannot be read as a table (missing, empty, truncated, wrong format, ...)."""

    exit_code = EXIT_DATA_FILE

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadLimits:
    """The most one data file may hold. Both are checked before the data is loaded, so memory stays bounded."""

    max_bytes: int = 2 << 30
    """File size in bytes (from the file system)."""
    max_rows: int = 20_000_000
    """Data rows: from the Parquet footer, or by reading at most ``max_rows + 1`` rows of a CSV."""

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: use an integer >= 1")


DEFAULT_LIMITS = ReadLimits()


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
    """Index labels of up to five failing rows."""

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
        return f"{text} at rows {self.rows}" if self.rows else text


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
        """The failures as CSV (file, column, rule, count, examples and rows ``;``-separated) for spreadsheets.

        A cell starting with ``=``, ``+``, ``-``, ``@``, tab or carriage return gets a leading ``'``, so a
        spreadsheet shows it as text instead of running it as a formula (CSV injection)."""
        out = io.StringIO()
        writer = csv.writer(out)  # RFC 4180: CRLF rows, so a CR or LF inside a cell gets quoted
        writer.writerow(["file", "column", "rule", "count", "examples", "rows"])
        for f in self.failures:
            row = [self.source, f.column or "", f.rule, f.count, "; ".join(map(str, f.examples)),
                   "; ".join(map(str, f.rows))]
            writer.writerow([_inert_cell(str(cell)) for cell in row])
        return out.getvalue()


def _inert_cell(text: str) -> str:
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


class ValidationError(KfloopError):
    """Raised by callers that treat a failed :class:`ValidationReport` as an error."""

    def __init__(self, report: ValidationReport):
        self.report = report
        super().__init__(report.format())


# ---------------------------------------------------------------------------------------------------- reading files

@dataclass(frozen=True, kw_only=True, slots=True)
class TableSource:
    """Where a table was read from, as lineage records it."""

    uri: str
    """The URI without credentials (:func:`data.storage.record_uri`)."""
    md5: str
    """md5 of the bytes read: the hash DVC records for the file."""
    version: str
    """The object store's version id or ETag; empty for a local file."""


def read_table_source(uri: str | Path, *, limits: ReadLimits = DEFAULT_LIMITS) -> tuple[pd.DataFrame, TableSource]:
    """:func:`read_table`, and what was read. An object in storage is streamed to a temp file (size checked first,
    md5 computed on the way) that is removed afterwards; errors name the URI without credentials.

    Raises:
        DataFileError: see :func:`read_table`; and for object storage, not found, no credentials, access denied
            or an unreachable endpoint.
    """
    if not storage.is_remote(uri):
        df = read_table(uri, limits=limits)
        return df, TableSource(uri=storage.record_uri(uri), md5=file_digest(uri, "md5"), version="")
    try:
        info = storage.stat(uri)
        if info.size > limits.max_bytes:
            raise _too_large(info.uri, info.size, limits)
        with tempfile.TemporaryDirectory(prefix="kfloop-read-") as tmp:
            local = Path(tmp) / (Path(urlsplit(str(uri)).path).name or "data")
            copy = storage.download(uri, local, max_bytes=limits.max_bytes)
            try:
                df = read_table(local, limits=limits)
            except DataFileError as exc:
                raise DataFileError(info.uri, exc.problem) from None
    except storage.StorageError as exc:
        raise DataFileError(exc.uri, exc.problem) from exc
    return df, TableSource(uri=copy.info.uri, md5=copy.md5, version=copy.info.version)


def read_table(path: str | Path, *, limits: ReadLimits = DEFAULT_LIMITS) -> pd.DataFrame:
    """Read a Parquet or CSV file (Parquet by its magic bytes or extension, otherwise UTF-8 CSV) from a local or
    mounted path or object storage (``s3://``, ``gs://``, ``az://``: :func:`read_table_source`).

    CSV normalisation: a UTF-8 byte order mark is dropped, and ``\\n``, ``\\r\\n`` and ``\\r`` line ends (mixed too)
    all end a row; a line end inside a quoted field stays part of the value.

    Raises:
        DataFileError: the file is missing, empty, larger than ``limits`` (checked before loading it), has a
            header but no rows, is a truncated or non-Parquet ``.parquet`` file, is not UTF-8 (UTF-16 included) or
            holds NUL bytes, has duplicate column names, or cannot be parsed.
    """
    if storage.is_remote(path):
        return read_table_source(path, limits=limits)[0]
    path = Path(path)
    if not path.exists():
        raise DataFileError(path, "file not found")
    if not path.is_file():
        raise DataFileError(path, "not a regular file: give a Parquet or CSV file")
    size = path.stat().st_size
    if size == 0:
        raise DataFileError(path, "file is empty (0 bytes)")
    if size > limits.max_bytes:
        raise _too_large(path, size, limits)
    with path.open("rb") as f:
        head = f.read(len(PARQUET_MAGIC))
        f.seek(max(size - len(PARQUET_MAGIC), 0))
        tail = f.read()
    if head == PARQUET_MAGIC:
        if size < 3 * len(PARQUET_MAGIC) or tail != PARQUET_MAGIC:
            raise DataFileError(path, "truncated Parquet file (the footer is missing): copy or write it again")
        return _read_parquet(path, limits)
    if path.suffix.lower() in PARQUET_SUFFIXES:
        raise DataFileError(path, f"not a Parquet file (it does not start with {PARQUET_MAGIC!r}) despite its "
                                  f"'{path.suffix}' extension")
    return _read_csv(path, limits)


def _too_large(path: str | Path, size: int, limits: ReadLimits) -> DataFileError:
    return DataFileError(path, f"{size} bytes, over the limit of {limits.max_bytes}: split the data or raise "
                               "ReadLimits.max_bytes")


def _too_many_rows(path: Path, limits: ReadLimits) -> DataFileError:
    return DataFileError(path, f"more than {limits.max_rows} data rows, over the limit: split the data or raise "
                               "ReadLimits.max_rows")


def _duplicates(names: list[str]) -> list[str]:
    return [name for name, n in Counter(names).items() if n > 1]


def _read_parquet(path: Path, limits: ReadLimits) -> pd.DataFrame:
    try:
        parquet = pq.ParquetFile(path)
        duplicated = _duplicates(parquet.schema_arrow.names)
        if duplicated:
            raise DataFileError(path, f"duplicate column names {duplicated}: every column needs a unique name")
        if parquet.metadata.num_rows == 0:
            raise DataFileError(path, "no data rows (the Parquet file has columns but 0 rows)")
        if parquet.metadata.num_rows > limits.max_rows:
            raise _too_many_rows(path, limits)
        return parquet.read().to_pandas()
    except (pyarrow.ArrowException, OSError) as exc:
        raise DataFileError(path, f"unreadable Parquet file: {exc}") from exc


def _first_non_utf8_line(path: Path) -> str:
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"line {number} (byte {line[exc.start]:#04x} at position {exc.start + 1})"
    raise AssertionError(f"{path} decoded as UTF-8 line by line but not as a whole")


def _first_line_with_nul(path: Path) -> int | None:
    """Number of the first line holding a NUL byte (the CSV parser would cut the value there), or None."""
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if b"\0" in line:
                return number
    return None


def _read_csv(path: Path, limits: ReadLimits) -> pd.DataFrame:
    not_utf8 = "not UTF-8 text: {} cannot be decoded; save the file as UTF-8"
    with path.open("rb") as f:
        first_line = f.readline()
    if first_line.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DataFileError(path, "UTF-16 text (it starts with a UTF-16 byte order mark); save the file as UTF-8")
    nul_line = _first_line_with_nul(path)
    if nul_line is not None:
        raise DataFileError(path, f"NUL byte on line {nul_line}: not a text CSV file; remove the NUL bytes")
    try:
        header = first_line.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DataFileError(path, not_utf8.format(_first_non_utf8_line(path))) from None
    names = next(csv.reader([header]), [])
    duplicated = _duplicates([name for name in names if name])
    if duplicated:
        raise DataFileError(path, f"duplicate column names {duplicated} in the header: every column needs a unique "
                                  "name")
    try:
        df = pd.read_csv(path, encoding="utf-8-sig", low_memory=False, nrows=limits.max_rows + 1)
    except UnicodeDecodeError:
        raise DataFileError(path, not_utf8.format(_first_non_utf8_line(path))) from None
    except pd.errors.EmptyDataError:
        raise DataFileError(path, "no header line: the file holds no columns") from None
    except pd.errors.ParserError as exc:
        raise DataFileError(path, f"malformed CSV: {exc}") from exc
    if df.empty:
        raise DataFileError(path, "no data rows (header only)")
    if len(df) > limits.max_rows:
        raise _too_many_rows(path, limits)
    return df


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


def _detect_ids(df: pd.DataFrame, target: str) -> list[str]:
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
        id_columns = _detect_ids(df, target)
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


def _table_observation(schema: pa.DataFrameSchema, check_number: int, df: pd.DataFrame) -> list:
    check = schema.checks[check_number]
    if check.name == "kfloop_min_rows":
        return [len(df)]
    if check.name == "kfloop_min_classes":
        column = check.statistics["column"]
        return sorted({_python(v) for v in df[column].dropna().unique()}, key=repr)[:MAX_EXAMPLES]
    return []


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
            lines.append(f"~ '{name}': schema {column.dtype}, data holds {found} values "
                         f"(e.g. {df[name].dropna().head(3).tolist()})")
    return lines


def validate(df_or_path: pd.DataFrame | str | Path, schema: pa.DataFrameSchema | str | Path) -> ValidationReport:
    """Validate a table (or a Parquet/CSV file) against ``schema`` (or a schema YAML file/text) in one lazy run.

    Every failed rule is reported once with its failing-value count, up to five distinct example values and up to
    five row labels: missing and extra columns, dtype coercion (plus, for a numeric column, its other checks on the
    values that do parse), nulls, ranges, categories, duplicate ids and the table-level checks.

    Raises:
        DataFileError: the data or schema file cannot be read (see :func:`read_table`, :func:`load_schema`).
    """
    if not isinstance(schema, pa.DataFrameSchema):
        schema = load_schema(schema)
    if isinstance(df_or_path, pd.DataFrame):
        df, source = df_or_path, "<dataframe>"
    else:
        df, source = read_table(df_or_path), storage.redact(df_or_path)
    rules = RuleSet(schema, [name for name in schema.columns if name in df.columns])
    failures = [_summarise(f.rule.column, f.rule.name, f.values, f.values.index.to_series(), None)
                for f in rules.check(df)]
    try:
        with warnings.catch_warnings():  # pandera's own concat of failure cases; nothing the caller can act on
            warnings.filterwarnings("ignore", "The behavior of DataFrame concatenation", FutureWarning)
            schema.validate(df, lazy=True)
    except SchemaErrors as exc:
        failures += _failures(exc.failure_cases, schema, df, rules)
    order = {name: i for i, name in enumerate(schema.columns)}
    failures.sort(key=lambda f: (f.column is None, order.get(f.column, len(order)), f.rule != "required"))
    return ValidationReport(source=source, n_rows=len(df), failures=failures,
                            schema_diff=schema_diff(schema, df) if failures else [])


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
            number = int(group["check_number"].iloc[0])
            failures.append(Failure(column=None, rule=rule, examples=_table_observation(schema, number, df), count=1))
        elif column in rules.columns and not pd.isna(group["check_number"].iloc[0]):
            continue  # a check pandera skipped or errored in after the column's dtype coercion failed
        else:
            failures.append(_summarise(column, rule, group["failure_case"], group["index"], rows))
    return failures
