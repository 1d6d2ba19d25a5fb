"""Reading data files, inferring pandera schemas and reporting every validation failure, on real files."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from data.generate import generate
from data.tables import DataFileError, read_table
from data.validation import (
    Failure,
    ValidationError,
    ValidationReport,
    infer_schema,
    load_schema,
    schema_roles,
    schema_to_yaml,
    validate,
)

REPO = Path(__file__).resolve().parents[1]
DEMO_SCHEMA = REPO / "data" / "schema.yaml"


@pytest.fixture(scope="module")
def schema():
    return load_schema(DEMO_SCHEMA)


@pytest.fixture
def good() -> pd.DataFrame:
    return generate(200, seed=11)


def _csv(tmp_path: Path, df: pd.DataFrame, name: str = "data.csv") -> Path:
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path


def _parquet(tmp_path: Path, df: pd.DataFrame, name: str = "data.parquet") -> Path:
    path = tmp_path / name
    df.to_parquet(path, index=False)
    return path


def _by_rule(report: ValidationReport) -> dict[tuple[str | None, str], Failure]:
    found = {(f.column, f.rule): f for f in report.failures}
    assert len(found) == len(report.failures), "one Failure per (column, rule)"
    return found


# ------------------------------------------------------------------------------------------- file-level problems

def _data_file_error(path: Path) -> DataFileError:
    with pytest.raises(DataFileError) as info:
        read_table(path)
    assert info.value.path == str(path)
    assert str(info.value) == f"{path}: {info.value.problem}"
    return info.value


def test_missing_file(tmp_path):
    assert _data_file_error(tmp_path / "nope.parquet").problem == "file not found"


@pytest.mark.parametrize("name", ["empty.csv", "empty.parquet"])
def test_empty_file(tmp_path, name):
    (tmp_path / name).write_bytes(b"")
    assert "empty (0 bytes)" in _data_file_error(tmp_path / name).problem


def test_header_only_csv(tmp_path):
    (tmp_path / "h.csv").write_text("customer_id,age,churned\n")
    assert "no data rows" in _data_file_error(tmp_path / "h.csv").problem


def test_zero_row_parquet(tmp_path, good):
    path = _parquet(tmp_path, good.iloc[:0])
    assert "0 rows" in _data_file_error(path).problem


def test_truncated_parquet(tmp_path, good):
    path = _parquet(tmp_path, good)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "truncated Parquet" in _data_file_error(path).problem


def test_parquet_extension_on_other_content(tmp_path, good):
    path = tmp_path / "really.parquet"
    path.write_text(good.to_csv(index=False))
    assert "not a Parquet file" in _data_file_error(path).problem


def test_corrupt_parquet_body(tmp_path, good):
    path = _parquet(tmp_path, good)
    data = bytearray(path.read_bytes())
    data[4:len(data) - 8] = bytes(len(data) - 12)  # keep the magic bytes, zero the pages and footer
    path.write_bytes(bytes(data))
    assert "unreadable Parquet" in _data_file_error(path).problem


def test_undecodable_csv_names_the_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("name,city\nann,Paris\nbob,Zürich\n".encode("latin-1"))
    problem = _data_file_error(path).problem
    assert "not UTF-8" in problem and "line 3" in problem and "0xfc" in problem


def test_undecodable_csv_header(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("näme,city\nann,Paris\n".encode("latin-1"))
    assert "line 1" in _data_file_error(path).problem


def test_duplicate_header_csv(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("a,b,a,c\n1,2,3,4\n")
    assert "duplicate column names ['a']" in _data_file_error(path).problem


def test_duplicate_column_names_parquet(tmp_path):
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.table([pa.array([1, 2]), pa.array([3, 4]), pa.array([5, 6])], names=["a", "b", "a"]), path)
    assert "duplicate column names ['a']" in _data_file_error(path).problem


def test_read_table_reads_csv_and_parquet_alike(tmp_path, good):
    from_csv = read_table(_csv(tmp_path, good))
    from_parquet = read_table(_parquet(tmp_path, good))
    unknown = {"region": "?"}  # CSV reads a null string as NaN, Parquet as None
    pd.testing.assert_frame_equal(from_csv.fillna(unknown), good.fillna(unknown))
    pd.testing.assert_frame_equal(from_parquet, good)


def test_csv_with_utf8_bom_and_no_extension(tmp_path):
    path = tmp_path / "export"
    path.write_bytes("\ufeffid,name\n1,Zoë\n".encode("utf-8"))
    df = read_table(path)
    assert list(df.columns) == ["id", "name"] and df["name"].tolist() == ["Zoë"]


def test_validate_raises_data_file_error_for_a_bad_file(tmp_path, schema):
    (tmp_path / "x.csv").write_bytes(b"")
    with pytest.raises(DataFileError, match="empty"):
        validate(tmp_path / "x.csv", schema)


# ---------------------------------------------------------------------------------------------- data failures

def test_demo_data_validates_clean(demo_files, schema):
    assert list(demo_files) == ["train.parquet", "batch_stable.parquet", "batch_drifted.parquet"]
    for path in demo_files.values():
        report = validate(path, schema)
        assert report.ok, report.format()
        assert report.format() == ""


def test_text_in_numeric_column_reports_coercion_and_range(tmp_path, schema, good):
    df = good.astype({"age": object})
    df.loc[3, "age"] = "forty"
    df.loc[5, "age"] = "n/a?"
    df.loc[7, "age"] = 150
    df.loc[9, "age"] = 7
    report = validate(_csv(tmp_path, df), schema)
    found = _by_rule(report)
    dtype = found[("age", "dtype('int64')")]
    assert dtype.count == 2 and dtype.examples == ["forty", "n/a?"] and dtype.rows == [3, 5]
    in_range = found[("age", "in_range(18, 100)")]
    assert in_range.count == 2 and sorted(in_range.examples) == [7, 150] and in_range.rows == [7, 9]
    assert set(found) == {("age", "dtype('int64')"), ("age", "in_range(18, 100)")}


def test_nulls_where_not_allowed(tmp_path, schema, good):
    df = good.copy()
    df.loc[[4, 8], "contract"] = None
    df.loc[6, "monthly_charges"] = np.nan
    found = _by_rule(validate(_parquet(tmp_path, df), schema))
    assert set(found) == {("contract", "not_nullable"), ("monthly_charges", "not_nullable")}
    assert found[("contract", "not_nullable")].count == 2
    assert found[("contract", "not_nullable")].rows == [4, 8]
    assert found[("monthly_charges", "not_nullable")].rows == [6]


def test_blank_cells_in_an_int_column_are_reported_once(tmp_path, schema, good):
    df = good.astype({"age": object})
    df.loc[[2, 3], "age"] = None  # blank in the CSV: pandas reads the column as float with NaN
    found = _by_rule(validate(_csv(tmp_path, df), schema))
    assert set(found) == {("age", "not_nullable")}
    assert found[("age", "not_nullable")].rows == [2, 3]


def test_nullable_integers_infer_a_nullable_dtype(good):
    df = good.astype({"support_calls": "Int64"})
    df.loc[[0, 1], "support_calls"] = pd.NA
    schema = infer_schema(df, target="churned")
    assert str(schema.columns["support_calls"].dtype) == "Int64" and schema.columns["support_calls"].nullable
    assert validate(df, load_schema(schema_to_yaml(schema))).ok


def test_nulls_allowed_where_seen(tmp_path, schema, good):
    df = good.copy()
    df.loc[:50, "region"] = None
    df.loc[:50, "total_charges"] = np.nan
    assert validate(_parquet(tmp_path, df), schema).ok


def test_out_of_range(tmp_path, schema, good):
    df = good.copy()
    df.loc[[1, 2, 3], "monthly_charges"] = [-5.0, 250.5, -5.0]
    found = _by_rule(validate(_csv(tmp_path, df), schema))
    failure = found[("monthly_charges", "in_range(0.0, 200.0)")]
    assert failure.count == 3 and failure.examples == [-5.0, 250.5] and failure.rows == [1, 2, 3]
    assert len(found) == 1


def test_unseen_category(tmp_path, schema, good):
    df = good.copy()
    df.loc[10, "plan"] = "platinum"
    found = _by_rule(validate(_parquet(tmp_path, df), schema))
    [(key, failure)] = found.items()
    assert key == ("plan", "isin(['basic', 'premium', 'standard'])")
    assert failure.examples == ["platinum"] and failure.count == 1 and failure.rows == [10]


def test_missing_and_extra_columns(tmp_path, schema, good):
    df = good.drop(columns=["age"]).assign(notes="x")
    report = validate(_parquet(tmp_path, df), schema)
    found = _by_rule(report)
    assert set(found) == {("age", "required"), ("notes", "strict")}
    path = tmp_path / "data.parquet"
    assert f"{path}: column 'age' failed required: the column is missing" in report.format().splitlines()
    assert f"{path}: column 'notes' failed strict: the column is not in the schema" in report.format().splitlines()


def test_duplicate_ids(tmp_path, schema, good):
    df = good.copy()
    df.loc[20, "customer_id"] = df.loc[21, "customer_id"]
    found = _by_rule(validate(_csv(tmp_path, df), schema))
    failure = found[("customer_id", "unique")]
    assert failure.examples == [int(good.loc[21, "customer_id"])] and failure.count == 2 and failure.rows == [20, 21]
    assert len(found) == 1


def test_too_few_rows(tmp_path, schema, good):
    report = validate(_parquet(tmp_path, good.head(12)), schema)
    assert [(f.column, f.rule, f.examples) for f in report.failures] == [(None, "min_rows(50)", [12])]
    assert report.format() == f"{tmp_path / 'data.parquet'}: dataframe failed min_rows(50): observed [12]"


def test_single_class_target(tmp_path, schema, good):
    df = good.assign(churned=0)
    report = validate(_csv(tmp_path, df), schema)
    assert [(f.column, f.rule, f.examples) for f in report.failures] == [(None, "min_classes('churned', 2)", [0])]


def test_one_run_reports_every_failure(tmp_path, schema, good):
    df = good.drop(columns=["region"]).assign(extra=1).astype({"tenure_months": object, "churned": object})
    df.loc[0, "tenure_months"] = "ten"
    df.loc[1, "tenure_months"] = 500
    df.loc[2, "contract"] = None
    df.loc[3, "payment_method"] = "cash"
    df.loc[4, "customer_id"] = df.loc[5, "customer_id"]
    df.loc[6, "churned"] = 2
    df.loc[7, "support_calls"] = -1
    path = _csv(tmp_path, df)
    report = validate(path, schema)
    assert not report.ok and report.n_rows == 200
    assert set(_by_rule(report)) == {
        ("customer_id", "unique"),
        ("tenure_months", "dtype('int64')"),
        ("tenure_months", "in_range(0, 120)"),
        ("support_calls", "in_range(0, 30)"),
        ("contract", "not_nullable"),
        ("payment_method", "isin(['bank-transfer', 'credit-card', 'electronic-check', 'mailed-check'])"),
        ("region", "required"),
        ("churned", "isin([0, 1])"),
        ("extra", "strict"),
    }
    lines = report.format().splitlines()
    assert len(lines) == len(report.failures)
    value_line = re.compile(rf"^{re.escape(str(path))}: column '[a-z_]+' failed .+: \d+ value\(s\), e\.g\. \[.*\]")
    assert sum(bool(value_line.match(line)) for line in lines) == 7
    assert f"{path}: column 'payment_method' failed isin(['bank-transfer', 'credit-card', 'electronic-check', " \
           f"'mailed-check']): 1 value(s), e.g. ['cash'] at data rows [3] (counted from 0, header excluded)" in lines
    with pytest.raises(ValidationError) as info:
        raise ValidationError(report)
    assert info.value.report is report and str(info.value) == report.format()


def test_examples_are_limited_on_a_large_file(tmp_path, schema):
    df = generate(100_000, seed=2)
    df["age"] = np.arange(len(df)) + 1000
    report = validate(_parquet(tmp_path, df), schema)
    [failure] = report.failures
    assert failure.count == 100_000
    assert failure.examples == [1000, 1001, 1002, 1003, 1004] and failure.rows == [0, 1, 2, 3, 4]


def test_validate_accepts_a_dataframe_and_a_schema_path(good):
    report = validate(good.head(10), DEMO_SCHEMA)
    assert report.source == "<dataframe>" and [f.rule for f in report.failures] == ["min_rows(50)"]


# --------------------------------------------------------------------------------------------- schema inference

def test_infer_schema_from_demo_train(good):
    df = good.copy()
    df.loc[0, "tenure_months"] = 0
    schema = infer_schema(df, target="churned")
    assert schema.strict is True and schema.coerce is True
    assert list(schema.columns) == list(df.columns)
    assert schema.metadata == {"kfloop": {"target": "churned", "task": "classification", "id_columns": ["customer_id"]}}
    cols = schema.columns
    assert cols["customer_id"].unique and not cols["customer_id"].checks
    assert {name for name, col in cols.items() if col.nullable} == {"total_charges", "region"}
    assert all(col.required for col in cols.values())
    age = cols["age"].checks[0].statistics
    lo, hi = int(df["age"].min()), int(df["age"].max())
    assert isinstance(age["min_value"], int) and isinstance(age["max_value"], int)
    assert lo - 0.1 * (hi - lo) - 1 < age["min_value"] < lo and hi < age["max_value"] < hi + 0.1 * (hi - lo) + 1
    assert cols["tenure_months"].checks[0].statistics["min_value"] == 0  # non-negative data keeps a 0 floor
    assert cols["plan"].checks[0].statistics["allowed_values"] == ["basic", "premium", "standard"]
    assert cols["churned"].checks[0].statistics["allowed_values"] == [0, 1]
    assert [c.name for c in schema.checks] == ["kfloop_min_rows", "kfloop_min_classes"]
    assert validate(df, schema).ok


def test_infer_schema_regression_and_explicit_ids(good):
    schema = infer_schema(good, target="monthly_charges", task="regression", id_columns=[], min_rows=10)
    assert not schema.columns["customer_id"].unique
    assert schema.columns["monthly_charges"].checks[0].name == "in_range"
    assert [c.name for c in schema.checks] == ["kfloop_min_rows"]
    assert schema.checks[0].statistics == {"min_rows": 10}
    roles = schema_roles(schema)
    assert roles.target == "monthly_charges" and roles.task == "regression" and roles.ids == []
    assert "customer_id" in roles.numeric and "churned" in roles.numeric


@pytest.mark.parametrize(
    ("change", "kwargs", "message"),
    [
        (lambda df: df.assign(churned=1), {}, "single class"),
        (lambda df: df.assign(churned=df["churned"].where(df.index > 0)), {}, "1 null"),
        (lambda df: df, {"target": "nope"}, "target column 'nope' is not in the data"),
        (lambda df: df, {"task": "ranking"}, "task must be one of"),
        (lambda df: df.assign(when=pd.Timestamp("2024-01-01")), {}, "column 'when' has dtype datetime64"),
        (lambda df: df, {"id_columns": ["plan"]}, "id column 'plan' has duplicate values"),
        (lambda df: df, {"target": "plan", "task": "regression"}, "regression target 'plan' has dtype object"),
    ],
)
def test_infer_schema_rejects(good, change, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        infer_schema(change(good), **{"target": "churned", **kwargs})


def test_schema_yaml_round_trip_keeps_checks_and_metadata(tmp_path, good):
    schema = infer_schema(good, target="churned", min_rows=75)
    text = schema_to_yaml(schema)
    assert yaml.safe_load(text)["metadata"] == schema.metadata
    (tmp_path / "schema.yaml").write_text(text)
    loaded = load_schema(tmp_path / "schema.yaml")
    assert loaded == schema
    assert loaded.metadata == schema.metadata
    assert [(c.name, c.statistics) for c in loaded.checks] == [
        ("kfloop_min_rows", {"min_rows": 75}), ("kfloop_min_classes", {"column": "churned", "min_classes": 2})]
    assert load_schema(text) == schema and schema_to_yaml(loaded) == text
    # The table checks still work after the round trip.
    rules = [f.rule for f in validate(good.head(60).assign(churned=1), loaded).failures]
    assert rules == ["min_rows(75)", "min_classes('churned', 2)"]


def test_pandera_to_yaml_alone_drops_metadata(good):
    """Why schema_to_yaml exists: pandera's own to_yaml() loses schema-level metadata."""
    schema = infer_schema(good, target="churned")
    assert load_schema(schema.to_yaml()).metadata is None
    assert load_schema(schema_to_yaml(schema)).metadata == schema.metadata


def test_demo_schema_file_is_canonical_and_has_roles(schema):
    assert schema_to_yaml(schema) == DEMO_SCHEMA.read_text()
    roles = schema_roles(schema)
    assert roles.target == "churned" and roles.task == "classification" and roles.ids == ["customer_id"]
    assert roles.numeric == ["age", "tenure_months", "monthly_charges", "total_charges", "support_calls"]
    assert roles.categorical == ["contract", "payment_method", "region", "plan"]


def test_load_schema_errors(tmp_path):
    with pytest.raises(DataFileError, match="schema file not found"):
        load_schema(tmp_path / "missing.yaml")
    with pytest.raises(DataFileError, match="schema file not found"):
        load_schema(str(tmp_path / "missing.yaml"))
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(DataFileError, match="not a pandera DataFrameSchema"):
        load_schema(tmp_path / "list.yaml")
    with pytest.raises(DataFileError, match="not valid YAML"):
        load_schema("schema_type: dataframe\ncolumns: [unclosed\n")
    with pytest.raises(DataFileError, match="invalid pandera schema: data type 'nonsense' not understood"):
        load_schema("schema_type: dataframe\ncolumns:\n  a:\n    dtype: nonsense\n")
    # pandera itself drops unknown keys silently: a misspelt check or option would vanish from the schema.
    with pytest.raises(DataFileError, match=re.escape("unknown schema key(s) ['strcit', 'columns.a.in_rnage']")):
        load_schema("schema_type: dataframe\nstrcit: true\ncolumns:\n  a:\n    dtype: int64\n    in_rnage: 3\n")


def test_schema_roles_needs_kfloop_metadata(good):
    schema = infer_schema(good, target="churned")
    plain = load_schema(schema.to_yaml())
    with pytest.raises(ValueError, match="metadata.kfloop"):
        schema_roles(plain)
