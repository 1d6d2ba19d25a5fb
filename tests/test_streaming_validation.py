"""Validation chunk by chunk (issue 17, item 3): the same report as one whole-table run, whatever the chunk size;
duplicate keys, row counts and classes counted over the whole file; global row numbers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.generate import generate
from data.tables import ReadLimits, iter_table, read_table
from data.validation import infer_schema, load_schema, validate

REPO = Path(__file__).resolve().parents[1]
DEMO_SCHEMA = REPO / "data" / "schema.yaml"


@pytest.fixture(scope="module")
def schema():
    return load_schema(DEMO_SCHEMA)


def _broken(n: int = 300) -> pd.DataFrame:
    """Demo rows with errors spread over the whole file: ranges, categories, nulls, types and ids."""
    df = generate(n, seed=5).astype({"age": "object", "region": "object"})
    df.loc[[3, 97, 250], "age"] = [150, 7, 230]
    df.loc[[10, 11, 299], "region"] = ["mars", "mars", "atlantis"]
    df.loc[180, "contract"] = None
    df.loc[[40, 260], "age"] = ["old", "young"]
    df.loc[[120, 290], "customer_id"] = df.loc[[5, 121], "customer_id"].to_numpy()
    return df


def _parquet(path: Path, df: pd.DataFrame, row_group_size: int) -> Path:
    pq.write_table(pa.Table.from_pandas(df.astype({"age": "string", "region": "string"}), preserve_index=False),
                   path, row_group_size=row_group_size)
    return path


def _summary(report):
    return [(f.column, f.rule, f.count, f.examples, f.rows) for f in report.failures]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_chunked_report_equals_whole_file(tmp_path, schema, fmt):
    df = _broken()
    path = (_parquet(tmp_path / "d.parquet", df, row_group_size=64) if fmt == "parquet"
            else tmp_path / "d.csv")
    if fmt == "csv":
        df.to_csv(path, index=False)
    whole = validate(read_table(path), schema)
    chunked = validate(path, schema, limits=ReadLimits(chunk_rows=37))
    assert len(list(iter_table(path, limits=ReadLimits(chunk_rows=37)))) >= 9  # 300 rows: errors in many chunks
    assert not whole.ok and _summary(chunked) == _summary(whole)
    assert chunked.n_rows == whole.n_rows == 300
    found = {(f.column, f.rule): f for f in chunked.failures}
    assert found[("age", "in_range(18, 100)")].rows == [3, 97, 250]  # global row numbers, not per chunk
    assert found[("age", "dtype('int64')")].rows == [40, 260]
    assert found[("contract", "not_nullable")].rows == [180]
    assert found[("customer_id", "unique")].rows == [5, 120, 121, 290]
    assert found[("customer_id", "unique")].count == 4
    # the same skew; the example values come from the first chunk showing it (a CSV chunk is typed on its own)
    assert [line.split(" (e.g.")[0] for line in chunked.schema_diff] == \
        [line.split(" (e.g.")[0] for line in whole.schema_diff] == ["~ 'age': schema int64, data holds text values"]


def test_duplicate_key_in_two_chunks(tmp_path, schema):
    df = generate(120, seed=8)
    df.loc[110, "customer_id"] = df.loc[2, "customer_id"]  # rows 2 and 110: chunks 0 and 2 of 50 rows
    path = _parquet(tmp_path / "d.parquet", df, row_group_size=50)
    report = validate(path, schema, limits=ReadLimits(chunk_rows=50))
    assert [(f.column, f.rule, f.count, f.examples, f.rows) for f in report.failures] == [
        ("customer_id", "unique", 2, [int(df.loc[2, "customer_id"])], [2, 110])]


def test_min_rows_and_min_classes_over_all_chunks(tmp_path):
    good = generate(200, seed=3)
    schema = infer_schema(good, target="churned", min_rows=60)
    small = good.iloc[:55].assign(churned=0)  # too few rows, one class: each only visible over all chunks
    path = _parquet(tmp_path / "small.parquet", small, row_group_size=10)
    report = validate(path, schema, limits=ReadLimits(chunk_rows=10))
    assert [(f.column, f.rule, f.examples) for f in report.failures] == [
        (None, "min_rows(60)", [55]), (None, "min_classes('churned', 2)", [0])]
    # 60 rows in six chunks of ten: each chunk alone is short, the file is not
    enough = good.iloc[:60]
    path = _parquet(tmp_path / "enough.parquet", enough, row_group_size=10)
    assert validate(path, schema, limits=ReadLimits(chunk_rows=10)).ok


def test_missing_column_reported_once(tmp_path, schema):
    df = generate(100, seed=4).drop(columns=["plan"])
    path = _parquet(tmp_path / "d.parquet", df, row_group_size=10)
    report = validate(path, schema, limits=ReadLimits(chunk_rows=10))
    assert [(f.column, f.rule) for f in report.failures] == [("plan", "required")]


def test_iter_table_numbers_rows_over_the_file(tmp_path):
    df = pd.DataFrame({"x": np.arange(25)})
    path = tmp_path / "x.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=7)
    chunks = list(iter_table(path, limits=ReadLimits(chunk_rows=5)))
    assert max(len(c) for c in chunks) <= 5
    joined = pd.concat(chunks)
    assert joined.index.tolist() == list(range(25)) and joined["x"].tolist() == list(range(25))


def test_chunk_rows_must_be_positive():
    with pytest.raises(ValueError, match="chunk_rows=0"):
        ReadLimits(chunk_rows=0)
