"""A table read by Ray Data in blocks on a Ray cluster (:mod:`data.ray_cluster`), a function of each chunk run
where the block lies, and the per-chunk results streamed back to the driver, which merges them. The functions given
are the single-process path's own per-chunk code (:func:`data.sketches.sketch_chunk` and what wraps it), so both
engines summarise chunks alike; only who reads the chunks and where they are summarised differs.

A chunk's sample seed (the single process numbers its chunks in file order) is a digest of the chunk's content,
as Ray Data does not number blocks: the same data and block boundaries give the same sketches."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow
import pyarrow.csv
import pyarrow.fs
import numpy as np
import pandera.pandas as pa
import ray.cloudpickle
import ray.data

from data import storage
from data.profiles import ProfiledColumns, ReferenceProfile, profile_chunk, profile_of, profiled_kinds
from data.sketches import SketchSettings, merge_sketches, sketch_from_dict
from data.tables import DEFAULT_LIMITS, PARQUET_SUFFIXES, SKETCHING_LIMITS, DataFileError, ReadLimits, table_format
from data.validation import StreamedValidation, ValidationReport

PART_COLUMN = "part"
"""The column of the one-row frame each chunk's result travels in (JSON text: no pickle of sketches)."""

CSV_NULLS = [*pyarrow.csv.ConvertOptions().null_values, "<NA>", "None"]
"""What a CSV field means by a missing value, in text columns too: pandas' ``read_csv`` defaults (the local
engine's reader; ``STR_NA_VALUES`` in pandas/_libs/parsers.pyx), Arrow's defaults plus the two it lacks."""

ChunkFunction = Callable[[pd.DataFrame, int], dict[str, Any]]
"""A chunk and its seed -> a JSON-ready partial result."""


def read_dataset(uri: str | Path, *, text_columns: list[str] | None = None,
                 limits: ReadLimits = DEFAULT_LIMITS, csv_as_text: bool = False) -> ray.data.Dataset:
    """The Parquet or CSV table at ``uri`` (a local path, or object storage read with the credentials and endpoint
    in the environment, as :mod:`data.storage` reads it) as a Ray Dataset, ``text_columns`` typed as text. With
    ``csv_as_text`` every CSV column is text (Arrow types a column from the file's first block and fails on a later
    value that does not fit: validation must see such values; :func:`typed_like_read_csv` types each block).

    Raises:
        data.tables.DataFileError: the file is missing, empty, too large or a broken Parquet file.
    """
    try:
        source = storage.resolve(uri)
    except storage.StorageError as exc:
        raise DataFileError(exc.uri, exc.problem) from exc
    if source.remote:
        if source.size > limits.max_bytes:
            raise DataFileError(source.uri, f"{source.size} bytes, over the limit of {limits.max_bytes}")
        parquet = Path(source.path).suffix.lower() in PARQUET_SUFFIXES
        path, filesystem = source.path, pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(source.fs))
    else:
        parquet = table_format(Path(source.path), limits) == "parquet"
        path, filesystem = source.path, None
    if parquet:
        return ray.data.read_parquet(path, filesystem=filesystem)
    if csv_as_text:
        text_columns = dataset_columns(ray.data.read_csv(path, filesystem=filesystem))
    options = pyarrow.csv.ConvertOptions(column_types={name: pyarrow.string() for name in text_columns or []},
                                         null_values=CSV_NULLS, strings_can_be_null=True)
    return ray.data.read_csv(path, filesystem=filesystem, convert_options=options)


def dataset_columns(dataset: ray.data.Dataset) -> list[str]:
    return list(dataset.schema().names)


def map_chunks(dataset: ray.data.Dataset, function: ChunkFunction, *,
               limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[dict[str, Any]]:
    """``function`` of every chunk of at most ``limits.chunk_rows`` rows, run on the cluster; the results, in no
    particular order, as they arrive at the driver."""

    def run(chunk: pd.DataFrame) -> pd.DataFrame:
        seed = int(pd.util.hash_pandas_object(chunk, index=False).sum())
        return pd.DataFrame({PART_COLUMN: [json.dumps(function(chunk.reset_index(drop=True), seed),
                                                      allow_nan=False)]})

    parts = dataset.map_batches(run, batch_format="pandas", batch_size=limits.chunk_rows)
    for row in parts.iter_rows():
        yield json.loads(row[PART_COLUMN])


def profile_dataset(dataset: ray.data.Dataset, kinds: dict[str, str], *,
                    predict: Callable[[pd.DataFrame], Any] | None = None, prediction_kind: str = "categorical",
                    settings: SketchSettings = SketchSettings(), source: str = "",
                    limits: ReadLimits = DEFAULT_LIMITS) -> ReferenceProfile:
    """:func:`data.profiles.build_profile` of ``dataset`` on its Ray cluster: :func:`data.profiles.profile_chunk`
    per chunk there (``predict`` shipped to the workers), the sketches merged here.

    Raises:
        ValueError: as :func:`data.profiles.build_profile`.
    """
    kinds = profiled_kinds(kinds, predict, prediction_kind)

    def sketch(chunk: pd.DataFrame, seed: int) -> dict[str, Any]:
        sketches = profile_chunk(chunk, kinds, predict=predict, settings=settings, chunk_index=seed)
        return {name: column.to_dict() for name, column in sketches.items()}

    parts = ({name: sketch_from_dict(column, settings) for name, column in part.items()}
             for part in map_chunks(dataset, sketch, limits=limits))
    return profile_of(merge_sketches(parts), settings=settings, source=source)


def ship_modules(prefix: str) -> None:
    """Let Ray carry the imported modules named ``prefix…`` to its workers by value (cloudpickle's
    ``register_pickle_by_value``): modules no worker can import, such as a model's code imported from its
    directory (:mod:`training.model_code`)."""
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix):
            ray.cloudpickle.register_pickle_by_value(module)


def profile_table_on_ray(uri: str | Path, schema: pa.DataFrameSchema, *,
                         predict: Callable[[pd.DataFrame], Any] | None = None,
                         settings: SketchSettings = SketchSettings(),
                         limits: ReadLimits = SKETCHING_LIMITS) -> ReferenceProfile:
    """:func:`data.profiles.profile_table` with Ray Data reading the table on the joined cluster
    (:func:`profile_dataset`).

    Raises:
        data.tables.DataFileError: as :func:`read_dataset`.
        ValueError: as :func:`data.profiles.build_profile`.
    """
    columns = ProfiledColumns.of(schema)
    dataset = read_dataset(uri, text_columns=columns.text, limits=limits)
    return profile_dataset(dataset, columns.kinds, predict=predict, prediction_kind=columns.prediction_kind,
                           settings=settings, source=storage.resolve(uri).uri, limits=limits)


def validate_on_ray(uri: str | Path, schema: pa.DataFrameSchema, *,
                    limits: ReadLimits = DEFAULT_LIMITS) -> ValidationReport:
    """:func:`data.validation.validate` of the file at ``uri`` with Ray Data reading it on the joined cluster: each
    chunk checked there by :meth:`data.validation.StreamedValidation.check_chunk`, the results merged here in row
    order (each chunk's rows moved by the rows before it), so failures, counts, examples and rows are the single
    process's. Unique keys cannot be decided per block: the blocks send their keys' 64-bit hashes here, the driver
    finds the repeated ones, and a second pass over the blocks reports the rows that hold them.

    Raises:
        data.tables.DataFileError: as :func:`read_dataset`.
    """
    checker = StreamedValidation(schema)
    dataset = read_dataset(uri, limits=limits, csv_as_text=True)

    validation, offset = StreamedValidation(schema), 0
    for rows, part in map_chunk_objects(dataset, lambda chunk: checker.check_chunk(typed_like_read_csv(chunk)),
                                        limits=limits):
        validation.add(part, offset=offset)
        offset += rows
    repeated = validation.repeated()
    if repeated:
        offset = 0
        for rows, part in map_chunk_objects(dataset, lambda chunk: StreamedValidation.duplicate_failures(
                typed_like_read_csv(chunk), repeated), limits=limits):
            validation.add_failures(part, offset=offset)
            offset += rows
    return validation.report(storage.resolve(uri).uri if storage.is_remote(uri) else str(uri))


CSV_TRUE, CSV_FALSE = frozenset({"True", "TRUE", "true"}), frozenset({"False", "FALSE", "false"})
"""What pandas' CSV reader reads as booleans."""


def typed_like_read_csv(chunk: pd.DataFrame) -> pd.DataFrame:
    """A chunk of text columns typed as pandas' CSV reader types a chunk (numbers where every value is one,
    booleans, else text with NaN for missing); other columns as they are."""
    typed = {}
    for name in chunk.columns:
        series = chunk[name]
        if not (pd.api.types.is_object_dtype(series) or pd.api.types.is_string_dtype(series)):
            typed[name] = series
            continue
        series = series.astype(object).where(series.notna(), np.nan)
        values = set(series.dropna())
        if values and values <= CSV_TRUE | CSV_FALSE:
            series = series.map(lambda v: v in CSV_TRUE if isinstance(v, str) else v)
            typed[name] = series.astype(bool) if series.notna().all() else series
            continue
        try:
            typed[name] = pd.to_numeric(series)
        except (ValueError, TypeError):
            typed[name] = series
    return pd.DataFrame(typed, index=chunk.index)


def map_chunk_objects(dataset: ray.data.Dataset, function: Callable[[pd.DataFrame], Any], *,
                      limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[tuple[int, Any]]:
    """``(rows, function(chunk))`` of every chunk in the table's row order, the result any Python object: it
    travels in an object column, serialised by Ray itself as its task results are (the values failing a rule are
    any Python scalars, which JSON cannot carry)."""

    def run(chunk: pd.DataFrame) -> pd.DataFrame:
        carried = _Carried(function(chunk.reset_index(drop=True)))
        return pd.DataFrame({"rows": [len(chunk)], PART_COLUMN: pd.Series([carried], dtype=object)})

    parts = dataset.map_batches(run, batch_format="pandas", batch_size=limits.chunk_rows)
    parts.context.execution_options.preserve_order = True
    for row in parts.iter_rows():
        yield int(row["rows"]), row[PART_COLUMN].value


@dataclass(frozen=True, slots=True)
class _Carried:
    """A chunk's result as one opaque object: Arrow would turn a bare list or dict into its own types (an empty
    list into null)."""

    value: Any
