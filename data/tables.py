"""Reading data files as tables: whole (:func:`read_table`) or chunk by chunk in bounded memory (:func:`iter_table`
for a local file, :func:`table_chunks` for a local path or an object in storage), from a local or mounted path or
object storage (an object is streamed to a local temp file first: :func:`local_copy`); these take a URI or the
:class:`data.storage.Resolved` it was resolved to. Every problem is a :class:`DataFileError` naming the file and
saying the fix.
"""
from __future__ import annotations

import csv
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pandas as pd
import pyarrow
import pyarrow.parquet as pq

from data import storage
from data.errors import EXIT_DATA_FILE, KfloopError

PARQUET_MAGIC = b"PAR1"
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
OTHER_DELIMITERS = (";", "\t", "|")
"""Separators of CSV files written with other conventions (a comma-decimal locale's ``;``, TSV): a one-column header
holding one of them is refused, naming it, rather than read as one column."""


class DataFileError(KfloopError):
    """A data or schema file that cannot be read as a table (missing, empty, truncated, wrong format, ...)."""

    exit_code = EXIT_DATA_FILE

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadLimits:
    """How much of a data file is read: the most one file may hold (checked before the data is loaded), and the
    most rows held in memory at once when it is read in chunks (validation, the training input, profiles, drift)."""

    max_bytes: int = 2 << 30
    """File size in bytes (from the file system)."""
    max_rows: int = 20_000_000
    """Data rows: from the Parquet footer, or by reading at most ``max_rows + 1`` rows of a CSV."""
    chunk_rows: int = 100_000
    """Rows per chunk of a streamed read (:func:`iter_table`: validation, the training input, profiles and drift);
    memory grows with it, not with the file. Measured on 20 columns: 0.74 / 0.81 / 1.05 / 1.35 GiB peak for one
    training rank at 50k / 100k / 250k / 500k rows, with 100k as fast as larger chunks."""

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_rows", "chunk_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: use an integer >= 1")


DEFAULT_LIMITS = ReadLimits()
SKETCHING_LIMITS = ReadLimits(max_bytes=1 << 40, max_rows=1 << 40)
"""Limits of a read whose memory does not grow with the rows: a reference profile and a drift check hold a chunk and
the sketches (:mod:`data.sketches`), so no row or size cap protects memory there (1 TiB, 2^40 rows). The local engine
still copies an object in storage to local temp disk first; ``engine: ray`` reads it in place."""


@contextmanager
def local_copy(uri: str | Path | storage.Resolved, *,
               limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[tuple[Path, storage.Resolved]]:
    """A local path holding the table at ``uri``, and what was read (its name, version and md5, the md5 read once
    on first use). A local file is used where it is; an object in storage is streamed to a temp file (size checked
    first, md5 computed on the way) removed on exit. A :class:`DataFileError` raised inside names the URI (without
    credentials), not the temp file.

    Raises:
        DataFileError: not found or not a file; for object storage also: too large, no credentials, access denied
            or an unreachable endpoint.
    """
    try:
        source = uri if isinstance(uri, storage.Resolved) else storage.resolve(uri)
        if not source.remote:
            yield Path(source.path), source
            return
        if source.size > limits.max_bytes:
            raise _too_large(source.uri, source.size, limits)
        with tempfile.TemporaryDirectory(prefix="kfloop-read-") as tmp:
            local = Path(tmp) / (Path(urlsplit(source.uri).path).name or "data")
            read = storage.download(source, local, max_bytes=limits.max_bytes)
            try:
                yield local, read
            except DataFileError as exc:
                if exc.path != str(local):
                    raise
                raise DataFileError(source.uri, exc.problem) from None
    except storage.StorageError as exc:
        raise DataFileError(exc.uri, exc.problem) from None  # the same (redacted) text, no library chain


def read_table_source(uri: str | Path | storage.Resolved, *,
                      limits: ReadLimits = DEFAULT_LIMITS) -> tuple[pd.DataFrame, storage.Resolved]:
    """:func:`read_table`, and what was read (:func:`local_copy`).

    Raises:
        DataFileError: see :func:`read_table` and :func:`local_copy`.
    """
    with local_copy(uri, limits=limits) as (path, source):
        return read_table(path, limits=limits), source


def read_table(path: str | Path, *, limits: ReadLimits = DEFAULT_LIMITS) -> pd.DataFrame:
    """Read a whole Parquet or CSV file (Parquet by its magic bytes or extension, otherwise UTF-8 CSV) from a local
    or mounted path or object storage (``s3://``, ``gs://``, ``az://``: :func:`read_table_source`).

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
    if table_format(path, limits) == "parquet":
        try:
            return _parquet_file(path, limits).read().to_pandas()
        except (pyarrow.ArrowException, OSError) as exc:
            raise DataFileError(path, f"unreadable Parquet file: {exc}") from exc
    frames = _csv_chunks(path, limits, chunk_rows=None)
    return next(frames)


def iter_table(path: str | Path, *, columns: list[str] | None = None, text_columns: list[str] | None = None,
               limits: ReadLimits = DEFAULT_LIMITS, categories: bool = False) -> Iterator[pd.DataFrame]:
    """The local file at ``path`` as frames of at most ``limits.chunk_rows`` rows holding ``columns`` (all when
    None, else these in this order), in file order, each indexed by its rows' 0-based positions in the whole file.
    Parquet is read row group by row group, batch by batch, CSV ``chunk_rows`` lines at a time, so memory holds one
    chunk (object storage: :func:`table_chunks`). CSV chunks type ``text_columns`` as text, so a category's type
    does not change from one chunk to the next. With ``categories``, Parquet's ``text_columns`` are read as Arrow
    dictionaries and come as pandas Categoricals: one string per distinct value, not per row (sketches count the
    codes, :mod:`data.sketches`).

    Raises:
        DataFileError: see :func:`read_table`; the file lacks one of ``columns`` (the message lists the file's
            columns); a CSV row that cannot be parsed is found when its chunk is read.
    """
    path = Path(path)
    if table_format(path, limits) == "csv":
        yield from _csv_chunks(path, limits, chunk_rows=limits.chunk_rows, columns=columns,
                               text_columns=text_columns)
        return
    parquet = _parquet_file(path, limits, read_dictionary=text_columns if categories else None)
    _check_columns(path, columns, parquet.schema_arrow.names)
    offset = 0
    try:  # one row group at a time: over the whole file, iter_batches reads ahead (1.2 GiB for 10M x 21 columns)
        batches = (batch for group in range(parquet.num_row_groups)
                   for batch in parquet.iter_batches(batch_size=limits.chunk_rows, row_groups=[group],
                                                     columns=columns))
        for batch in batches:
            frame = batch.to_pandas()
            frame.index = pd.RangeIndex(offset, offset + len(frame))
            offset += len(frame)
            yield frame
    except (pyarrow.ArrowException, OSError) as exc:
        raise DataFileError(path, f"unreadable Parquet file: {exc}") from exc


@contextmanager
def table_chunks(uri: str | Path | storage.Resolved, *, columns: list[str] | None = None,
                 text_columns: list[str] | None = None, limits: ReadLimits = DEFAULT_LIMITS,
                 categories: bool = False) -> Iterator[tuple[Iterator[pd.DataFrame], storage.Resolved]]:
    """The table at ``uri`` (local path or object storage) read by :func:`iter_table`, and what is read
    (:func:`local_copy`: an object in storage is streamed to a temp file first, removed on exit; errors name the
    URI). Iterate the chunks inside the ``with`` block.

    Raises:
        DataFileError: see :func:`iter_table` and :func:`local_copy`.
    """
    with local_copy(uri, limits=limits) as (path, source):
        yield iter_table(path, columns=columns, text_columns=text_columns, limits=limits,
                         categories=categories), source


@contextmanager
def sketching_chunks(uri: str | Path | storage.Resolved,
                     text_columns: list[str]) -> Iterator[tuple[Iterator[pd.DataFrame], storage.Resolved]]:
    """:func:`table_chunks` as profiles and drift checks read a table into sketches: ``text_columns`` as
    categories (Parquet dictionaries), under :data:`SKETCHING_LIMITS`."""
    with table_chunks(uri, text_columns=text_columns, categories=True, limits=SKETCHING_LIMITS) as read:
        yield read


def table_format(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> str:
    """``parquet`` (by its magic bytes) or ``csv`` for a local file that exists, is not empty and is within
    ``limits.max_bytes``.

    Raises:
        DataFileError: the file is missing, not a file, empty, too large, or a broken or mislabelled Parquet file.
    """
    if not path.exists():
        raise DataFileError(path, "file not found")
    if not path.is_file():
        raise DataFileError(path, "not a regular file: give a Parquet or CSV file")
    size = path.stat().st_size
    if size == 0:
        raise DataFileError(path, "file is empty (0 bytes)")
    if size > limits.max_bytes:
        raise _too_large(path, size, limits)
    try:
        with path.open("rb") as f:
            head = f.read(len(PARQUET_MAGIC))
            f.seek(max(size - len(PARQUET_MAGIC), 0))
            tail = f.read()
    except OSError as exc:
        raise DataFileError(path, f"cannot be read ({exc.strerror or exc}): check its permissions") from exc
    if head == PARQUET_MAGIC:
        if size < 3 * len(PARQUET_MAGIC) or tail != PARQUET_MAGIC:
            raise DataFileError(path, "truncated Parquet file (the footer is missing): copy or write it again")
        return "parquet"
    if path.suffix.lower() in PARQUET_SUFFIXES:
        raise DataFileError(path, f"not a Parquet file (it does not start with {PARQUET_MAGIC!r}) despite its "
                                  f"'{path.suffix}' extension")
    return "csv"


def non_numbers(values: pd.Series, limit: int = 3) -> list:
    """Up to ``limit`` distinct values of ``values`` that are not numbers (nulls aside): the examples of a column
    that should be numeric, so an error shows what broke it rather than the first rows, which may be fine."""
    present = values.dropna()
    return present[pd.to_numeric(present, errors="coerce").isna()].drop_duplicates().head(limit).tolist()


def _too_large(path: str | Path, size: int, limits: ReadLimits) -> DataFileError:
    return DataFileError(path, f"{size} bytes, over the limit of {limits.max_bytes}: split the data or raise "
                               "ReadLimits.max_bytes")


def _too_many_rows(path: Path, limits: ReadLimits) -> DataFileError:
    return DataFileError(path, f"more than {limits.max_rows} data rows, over the limit: split the data or raise "
                               "ReadLimits.max_rows")


def _duplicates(names: list[str]) -> list[str]:
    return [name for name, n in Counter(names).items() if n > 1]


def _check_columns(path: Path, columns: list[str] | None, names: list[str]) -> None:
    """Raise unless the file's column ``names`` include every one of ``columns``."""
    missing = [name for name in columns or [] if name not in names]
    if missing:
        raise DataFileError(path, f"lacks columns {missing}; its columns are {names}")


def _parquet_file(path: Path, limits: ReadLimits, read_dictionary: list[str] | None = None) -> pq.ParquetFile:
    """The opened Parquet file, its footer checked: unique column names, 1 to ``limits.max_rows`` rows."""
    try:
        parquet = pq.ParquetFile(path, read_dictionary=read_dictionary)
    except (pyarrow.ArrowException, OSError) as exc:
        raise DataFileError(path, f"unreadable Parquet file: {exc}") from exc
    duplicated = _duplicates(parquet.schema_arrow.names)
    if duplicated:
        raise DataFileError(path, f"duplicate column names {duplicated}: every column needs a unique name")
    if parquet.metadata.num_rows == 0:
        raise DataFileError(path, "no data rows (the Parquet file has columns but 0 rows)")
    if parquet.metadata.num_rows > limits.max_rows:
        raise _too_many_rows(path, limits)
    return parquet


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


def _csv_chunks(path: Path, limits: ReadLimits, *, chunk_rows: int | None, columns: list[str] | None = None,
                text_columns: list[str] | None = None) -> Iterator[pd.DataFrame]:
    """The CSV file as frames of ``chunk_rows`` rows (None: one frame) holding ``columns`` (all when None) with
    ``text_columns`` typed as text, checked as :func:`read_table` and :func:`iter_table` say."""
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
    other = [sep for sep in OTHER_DELIMITERS if len(names) == 1 and sep in names[0]]
    if other:
        raise DataFileError(path, f"one column named {names[0].strip()[:80]!r}: the file looks separated by "
                                  f"{other[0]!r}, but kfloop reads comma-separated CSV; save it with commas (e.g. "
                                  f"pandas.read_csv(path, sep={other[0]!r}).to_csv(path, index=False)) or as Parquet")
    duplicated = _duplicates([name for name in names if name])
    if duplicated:
        raise DataFileError(path, f"duplicate column names {duplicated} in the header: every column needs a unique "
                                  "name")
    _check_columns(path, columns, names)
    options = {"encoding": "utf-8-sig", "usecols": columns, "dtype": dict.fromkeys(text_columns or [], "string")}
    rows = 0
    try:
        if chunk_rows is None:
            chunks = iter([pd.read_csv(path, low_memory=False, nrows=limits.max_rows + 1, **options)])
        else:
            chunks = pd.read_csv(path, chunksize=chunk_rows, **options)
        for chunk in chunks:
            if chunk.empty:
                break
            rows += len(chunk)
            if rows > limits.max_rows:
                raise _too_many_rows(path, limits)
            yield chunk if columns is None else chunk[columns]  # in the order asked for, as Parquet gives them
    except UnicodeDecodeError:
        raise DataFileError(path, not_utf8.format(_first_non_utf8_line(path))) from None
    except pd.errors.EmptyDataError:
        raise DataFileError(path, "no header line: the file holds no columns") from None
    except pd.errors.ParserError as exc:
        raise DataFileError(path, f"malformed CSV: {exc}") from exc
    if rows == 0:
        raise DataFileError(path, "no data rows (header only)")
