"""The one chunk reader (data/tables.py): Parquet and CSV of the same data give the same frames, with columns
selected and text typed; every reader of chunks (validation, training input, profiles, drift) gets the same checks
and errors naming the file or the URI."""
from __future__ import annotations

import boto3
import numpy as np
import pandas as pd
import pytest

from data import storage
from data.fileio import file_digest
from data.tables import DataFileError, ReadLimits, iter_table, table_chunks

COLUMNS = ["id", "x", "color"]


def _frame(rows: int = 23) -> pd.DataFrame:
    """Ids, floats with a missing value, and categories that look like numbers in some chunks only."""
    color = np.where(np.arange(rows) < 12, np.arange(rows) % 3, np.array(["red", "blue", "7"])[np.arange(rows) % 3])
    return pd.DataFrame({"id": np.arange(rows), "x": np.where(np.arange(rows) == 4, np.nan, np.arange(rows) / 4),
                         "color": color.astype(str)})


def _write(frame: pd.DataFrame, path):
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False, row_group_size=10)
    return path


def test_parquet_and_csv_of_the_same_data_give_the_same_frames_with_columns_selected(tmp_path):
    frame = _frame()
    limits = ReadLimits(chunk_rows=5)
    read = {suffix: list(iter_table(_write(frame, tmp_path / f"data{suffix}"), columns=["color", "x"],
                                    text_columns=["color"], limits=limits))
            for suffix in (".parquet", ".csv")}
    assert [len(c) for c in read[".csv"]] == [len(c) for c in read[".parquet"]] == [5, 5, 5, 5, 3]
    for csv_chunk, parquet_chunk in zip(read[".csv"], read[".parquet"]):
        assert list(csv_chunk.columns) == list(parquet_chunk.columns) == ["color", "x"]
        assert csv_chunk["color"].map(type).eq(str).all()  # "0", "1", "7" stay text, as in the Parquet file
        pd.testing.assert_frame_equal(csv_chunk, parquet_chunk, check_dtype=False)
    pd.testing.assert_frame_equal(pd.concat(read[".csv"]), frame[["color", "x"]], check_dtype=False)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_a_missing_column_names_the_file_and_its_columns(tmp_path, suffix):
    path = _write(_frame(), tmp_path / f"data{suffix}")
    message = r"lacks columns \['size'\]; its columns are \['id', 'x', 'color'\]"
    with pytest.raises(DataFileError, match=message) as info:
        with table_chunks(path, columns=["x", "size"]) as (chunks, _):
            next(chunks)
    assert info.value.path == str(path)


def test_a_uri_is_resolved_once_into_the_object_the_readers_take(tmp_path):
    path = _write(_frame(), tmp_path / "data.csv")
    source = storage.resolve(str(path))
    assert (source.uri, source.size, source.version, source.remote) == (str(path), path.stat().st_size, "", False)
    with table_chunks(source, limits=ReadLimits(chunk_rows=10)) as (chunks, read):
        assert read is source and [len(c) for c in chunks] == [10, 10, 3]
    md5 = file_digest(path, "md5")
    assert source.md5 == md5
    path.write_text("id\n1\n")
    assert source.md5 == md5  # read once: the object keeps the digest of the bytes it saw
    with pytest.raises(storage.StorageError, match="file not found"):
        storage.resolve(str(tmp_path / "gone.csv"))


def test_chunks_of_an_object_in_storage_name_its_uri_not_the_temp_copy(s3_bucket, tmp_path):
    path = _write(_frame(), tmp_path / "data.parquet")
    boto3.client("s3").upload_file(str(path), s3_bucket, "batches/data.parquet")
    uri = f"s3://{s3_bucket}/batches/data.parquet"
    with table_chunks(uri, columns=["id"], limits=ReadLimits(chunk_rows=10)) as (chunks, source):
        assert [len(c) for c in chunks] == [10, 10, 3] and source.uri == uri
    with pytest.raises(DataFileError, match="lacks columns") as info:
        with table_chunks(uri, columns=["size"]) as (chunks, _):
            next(chunks)
    assert info.value.path == uri


@pytest.mark.parametrize("content, problem", [
    (b"a,a\n1,2\n", r"duplicate column names \['a'\]"),
    (b"a,b\n", r"no data rows \(header only\)"),
    (b"a,b\n1,\x002\n", "NUL byte on line 2"),
    (b"", r"file is empty \(0 bytes\)"),
])
def test_chunked_reads_refuse_what_validation_refuses(tmp_path, content, problem):
    path = tmp_path / "data.csv"
    path.write_bytes(content)
    with pytest.raises(DataFileError, match=problem) as info:
        with table_chunks(path, text_columns=["a"]) as (chunks, _):
            list(chunks)
    assert info.value.path == str(path)
