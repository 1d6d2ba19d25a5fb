"""Bad data beyond the basics: oversized files refused before loading, text encodings and line endings, CSV
exports of failures that a spreadsheet cannot execute, and schema skew reported as a diff."""
from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.errors import EXIT_FINDING
from data.generate import generate
from data.tables import DEFAULT_LIMITS, DataFileError, ReadLimits, read_table, sketching_chunks
from data.validation import load_schema, schema_diff, validate
from pipelines.cli.commands import main

REPO = Path(__file__).resolve().parents[1]
DEMO_SCHEMA = REPO / "data" / "schema.yaml"
pytestmark = pytest.mark.chaos


# ------------------------------------------------------------------------------------------- 19: oversized input

def _big_parquet(path: Path, rows: int) -> Path:
    """``rows`` x 4 int64 zeros: a few MB on disk, 32 bytes a row once loaded."""
    chunk = pa.table({f"c{i}": pa.array(np.zeros(500_000, dtype=np.int64)) for i in range(4)})
    with pq.ParquetWriter(path, chunk.schema) as writer:
        for _ in range(rows // 500_000):
            writer.write_table(chunk)
    return path


_PEAK = """
import resource, sys
import pyarrow as pa
from data.tables import DataFileError, ReadLimits, read_table
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    read_table(sys.argv[1], limits=ReadLimits(max_rows=int(sys.argv[2])))
    outcome = "loaded"
except DataFileError as exc:
    outcome = str(exc)
print(outcome)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
print(pa.default_memory_pool().max_memory() // (1 << 20))
"""


def test_too_many_parquet_rows_are_refused_from_the_footer_with_memory_bounded(tmp_path):
    path = _big_parquet(tmp_path / "big.parquet", rows=8_000_000)  # 256 MB once loaded
    assert path.stat().st_size < 40 << 20

    def peak(max_rows: int) -> tuple[str, int, int]:
        """Outcome, growth of the peak RSS (MiB) and Arrow's peak allocation (MiB) of one read in a fresh process."""
        done = subprocess.run([sys.executable, "-c", _PEAK, str(path), str(max_rows)], cwd=REPO,
                              capture_output=True, text=True, timeout=300, check=True)
        outcome, rss_mib, arrow_mib = done.stdout.strip().splitlines()
        return outcome, int(rss_mib), int(arrow_mib)

    refused, rss_mib, arrow_mib = peak(1_000_000)
    assert refused == f"{path}: more than 1000000 data rows, over the limit: split the data or raise " \
                      "ReadLimits.max_rows"
    assert rss_mib < 64 and arrow_mib < 16, f"refusing grew RSS by {rss_mib} MiB, Arrow allocated {arrow_mib} MiB"
    loaded, _, arrow_mib = peak(10_000_000)
    assert loaded == "loaded" and arrow_mib >= 200, "the same file loads when allowed, and that costs memory"


def test_profiles_and_drift_checks_read_a_table_over_the_whole_read_row_limit(tmp_path):
    """A profile and a drift check hold a chunk and the sketches, so the row cap of a whole read does not stop
    them (100M rows are checked this way in benchmarks/scale.py)."""
    path = _big_parquet(tmp_path / "big.parquet", rows=DEFAULT_LIMITS.max_rows + 500_000)
    with pytest.raises(DataFileError, match=f"more than {DEFAULT_LIMITS.max_rows} data rows"):
        read_table(path)
    with sketching_chunks(path, []) as (chunks, source):
        first = next(chunks)
    assert len(first) == DEFAULT_LIMITS.chunk_rows and source.size == path.stat().st_size


def test_too_many_csv_rows_are_refused_after_reading_at_most_the_limit(tmp_path):
    path = tmp_path / "rows.csv"
    generate(300, seed=1).to_csv(path, index=False)
    with pytest.raises(DataFileError, match=r"rows\.csv: more than 299 data rows, over the limit"):
        read_table(path, limits=ReadLimits(max_rows=299))
    assert len(read_table(path, limits=ReadLimits(max_rows=300))) == 300


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_file_over_the_byte_limit_is_refused_before_reading(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    df = generate(300, seed=1)
    df.to_csv(path, index=False) if suffix == ".csv" else df.to_parquet(path, index=False)
    size = path.stat().st_size
    with pytest.raises(DataFileError, match=rf"{size} bytes, over the limit of {size - 1}"):
        read_table(path, limits=ReadLimits(max_bytes=size - 1))
    assert len(read_table(path, limits=ReadLimits(max_bytes=size))) == 300


def test_limits_state_the_fix():
    with pytest.raises(ValueError, match="max_rows=0: use an integer >= 1"):
        ReadLimits(max_rows=0)


# ------------------------------------------------------------------------------ 20: encodings and line endings

def test_mixed_line_endings_and_a_bom_are_normalised_without_touching_categories(tmp_path):
    path = tmp_path / "mixed.csv"
    path.write_bytes(b"\xef\xbb\xbfage,plan\r\n30,basic\n31,pro\r\n32,plus\r33,basic\n")
    df = read_table(path)
    assert list(df.columns) == ["age", "plan"]
    assert df["plan"].tolist() == ["basic", "pro", "plus", "basic"]
    assert df["age"].tolist() == [30, 31, 32, 33]


def test_a_line_end_inside_quotes_stays_in_the_value_and_fails_validation(tmp_path):
    schema = load_schema(DEMO_SCHEMA)
    df = generate(200, seed=2)
    text = df.to_csv(index=False).replace(f",{df.loc[0, 'plan']},", f',"{df.loc[0, "plan"]}\r",', 1)
    path = tmp_path / "quoted.csv"
    path.write_bytes(text.encode())
    report = validate(path, schema)
    [failure] = [f for f in report.failures if f.column == "plan"]
    assert failure.examples == [f"{df.loc[0, 'plan']}\r"], "the value is reported as it is, never silently fixed"


@pytest.mark.parametrize("data, message", [
    ("age,plan\n30,basic\n".encode("utf-16"), r"UTF-16 text \(it starts with a UTF-16 byte order mark\); save "
                                              "the file as UTF-8"),
    (b"age,plan\n30,basic\n31,ba\x00sic\n", "NUL byte on line 3: not a text CSV file"),
    ("age,plan\n30,basic\n31,caf\u00e9\n".encode("latin-1"), r"not UTF-8 text: line 3 \(byte 0xe9 at position 7\)"),
], ids=["utf-16", "nul-byte", "latin-1"])
def test_undecodable_text_is_a_clear_error_never_mangled_values(tmp_path, data, message):
    path = tmp_path / "data.csv"
    path.write_bytes(data)
    with pytest.raises(DataFileError, match=rf"data\.csv: {message}"):
        read_table(path)


# --------------------------------------------------------------------------------- 21: CSV formula injection

@pytest.mark.parametrize("evil", ["=HYPERLINK(\"http://x\",\"y\")", "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)",
                                  "\t=1+1", "\r=1+1"], ids=["equals", "plus", "minus", "at", "tab", "cr"])
def test_failure_report_csv_neutralises_formula_cells(tmp_path, evil):
    df = generate(200, seed=3).astype({"plan": object})
    df.loc[4, "plan"] = evil
    df[evil] = 1  # a column name is the user's text too
    data = tmp_path / "data.parquet"
    df.to_parquet(data, index=False)
    out = tmp_path / "report.csv"
    assert main(["validate", "--data", str(data), "--schema", str(DEMO_SCHEMA), "--report-csv", str(out)]) \
        == EXIT_FINDING
    rows = list(csv.DictReader(io.StringIO(out.read_bytes().decode(), newline="")))
    [plan] = [r for r in rows if r["column"] == "plan"]
    assert plan["examples"] == "'" + evil and plan["data_rows_from_0"] == "4", plan
    assert [r["rule"] for r in rows if r["column"] == "'" + evil] == ["strict"]
    for row in rows:
        assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for cell in row.values()), row


def test_a_valid_file_writes_a_header_only_report(tmp_path):
    data = tmp_path / "data.csv"
    generate(200, seed=4).to_csv(data, index=False)
    out = tmp_path / "report.csv"
    assert main(["validate", "--data", str(data), "--schema", str(DEMO_SCHEMA), "--report-csv", str(out)]) == 0
    assert out.read_bytes() == b"file,column,rule,count,examples,data_rows_from_0\r\n"


# --------------------------------------------------------------------------------------------- 22: schema skew

def test_schema_skew_fails_with_a_diff_of_missing_extra_and_retyped_columns(tmp_path, capsys):
    schema = load_schema(DEMO_SCHEMA)  # the champion's schema
    df = generate(200, seed=5).drop(columns=["plan"]).assign(referrer="web")
    df["age"] = df["age"].map(lambda a: f"{a} years")
    path = tmp_path / "skewed.csv"
    df.to_csv(path, index=False)
    report = validate(path, schema)
    assert not report.ok
    assert report.schema_diff == [
        "- 'plan' (str): missing from the data",
        "+ 'referrer' (object): not in the schema",
        "~ 'age': schema int64, data holds text values (e.g. " + str(df["age"].head(3).tolist()) + ")",
    ]
    assert report.format_diff().splitlines() == [f"{path}: schema diff: {line}" for line in report.schema_diff]
    capsys.readouterr()
    assert main(["validate", "--data", str(path), "--schema", str(DEMO_SCHEMA)]) == EXIT_FINDING
    err = capsys.readouterr().err.splitlines()
    assert err[:3] == report.format_diff().splitlines() and err[3:] == report.format().splitlines()


def test_compatible_columns_are_no_skew():
    schema = load_schema(DEMO_SCHEMA)
    df = generate(200, seed=6)
    df["total_charges"] = df["total_charges"].astype(object)  # numbers in an object column still are numbers
    df.loc[0, "region"] = None
    assert schema_diff(schema, df) == []
    assert validate(df, schema).schema_diff == []
