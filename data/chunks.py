"""A table read in chunks of rows (Parquet row group batches, CSV blocks), so memory stays bounded by the chunk,
not the file: reference profiles and drift checks stream through it."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pandas as pd
import pyarrow
import pyarrow.parquet as pq

from data import storage
from data.tables import DEFAULT_LIMITS, PARQUET_MAGIC, DataFileError, ReadLimits, TableSource, local_copy

CHUNK_ROWS = 262_144
"""Rows per chunk: a few tens of MiB for 20 columns."""


@contextmanager
def table_chunks(uri: str | Path, *, columns: list[str] | None = None, text_columns: list[str] | None = None,
                 chunk_rows: int = CHUNK_ROWS, limits: ReadLimits = DEFAULT_LIMITS
                 ) -> Iterator[tuple[Iterator[pd.DataFrame], TableSource]]:
    """The table at ``uri`` (local path or object storage, Parquet or UTF-8 CSV) as an iterator of DataFrames of
    at most ``chunk_rows`` rows holding ``columns`` (all when None), and what is read
    (:func:`data.tables.local_copy`: an object in storage is streamed to a temp file first, removed on exit).

    CSV chunks type ``text_columns`` as text, so a category's type does not change from one chunk to the next.

    Raises:
        DataFileError: the file is missing, empty, unreadable, or lacks one of ``columns``; storage errors as
            :func:`data.tables.read_table_source`.
    """
    with local_copy(uri, limits=limits) as (path, source):
        shown = source.uri if storage.is_remote(uri) else None
        yield _chunks(path, columns, text_columns, chunk_rows, shown=shown), source


def _chunks(path: Path, columns: list[str] | None, text_columns: list[str] | None, chunk_rows: int, *,
            shown: str | None = None) -> Iterator[pd.DataFrame]:
    shown = shown or str(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise DataFileError(shown, "file not found or empty: give a Parquet or CSV file")
    with path.open("rb") as f:
        parquet = f.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    try:
        if parquet:
            yield from _parquet_chunks(path, columns, chunk_rows, shown)
        else:
            dtype = {name: "string" for name in text_columns or []}
            with pd.read_csv(path, encoding="utf-8-sig", usecols=columns, dtype=dtype, chunksize=chunk_rows) as csv:
                yield from csv
    except (pyarrow.ArrowException, OSError, UnicodeDecodeError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as exc:
        raise DataFileError(shown, f"unreadable table: {exc}") from exc
    except ValueError as exc:  # pandas: usecols names a column the header lacks
        raise DataFileError(shown, f"{exc}; the file's columns must include {columns}") from exc


def _parquet_chunks(path: Path, columns: list[str] | None, chunk_rows: int, shown: str) -> Iterator[pd.DataFrame]:
    parquet = pq.ParquetFile(path)
    missing = [c for c in columns or [] if c not in parquet.schema_arrow.names]
    if missing:
        raise DataFileError(shown, f"lacks columns {missing}; its columns are {parquet.schema_arrow.names}")
    for batch in parquet.iter_batches(batch_size=chunk_rows, columns=columns):
        yield batch.to_pandas()
