"""A table read by Ray Data in blocks on a Ray cluster (:mod:`data.ray_cluster`), a function of each chunk run
where the block lies, and the per-chunk results streamed back to the driver, which merges them. The functions given
are the single-process path's own per-chunk code (:func:`data.sketches.sketch_chunk` and what wraps it), so both
engines summarise chunks alike; only who reads the chunks and where they are summarised differs.

A chunk's sample seed (the single process numbers its chunks in file order) is a digest of the chunk's content,
as Ray Data does not number blocks: the same data and block boundaries give the same sketches."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow
import pyarrow.csv
import pyarrow.fs
import ray.data

from data import storage
from data.profiles import ReferenceProfile, profile_chunk, profile_of, profiled_kinds
from data.sketches import SketchSettings, merge_sketches, sketch_from_dict
from data.tables import DEFAULT_LIMITS, PARQUET_SUFFIXES, DataFileError, ReadLimits, table_format

PART_COLUMN = "part"
"""The column of the one-row frame each chunk's result travels in (JSON text: no pickle of sketches)."""

CSV_NULLS = [*pyarrow.csv.ConvertOptions().null_values, "<NA>", "None"]
"""What a CSV field means by a missing value, in text columns too: pandas' ``read_csv`` defaults (the local
engine's reader; ``STR_NA_VALUES`` in pandas/_libs/parsers.pyx), Arrow's defaults plus the two it lacks."""

ChunkFunction = Callable[[pd.DataFrame, int], dict[str, Any]]
"""A chunk and its seed -> a JSON-ready partial result."""


def read_dataset(uri: str | Path, *, text_columns: list[str] | None = None,
                 limits: ReadLimits = DEFAULT_LIMITS) -> ray.data.Dataset:
    """The Parquet or CSV table at ``uri`` (a local path, or object storage read with the credentials and endpoint
    in the environment, as :mod:`data.storage` reads it) as a Ray Dataset, ``text_columns`` typed as text.

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
