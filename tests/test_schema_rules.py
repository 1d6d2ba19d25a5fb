"""One rule set for validation, serving and drift: ``kfloop validate``'s value failures and the served model's
``schema_violations`` come from the same rows the same way; a batch with unseen categories is drifted by itself."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pandera.pandas as pa
import pytest

from monitoring.drift import check_drift
from monitoring.drift_policy import DriftPolicy
from data.schema_rules import (SEE_FIRST_ROW, RuleSet, SchemaViolationError, ServingLimits,
                               apply_violation_mode)
from data.validation import load_schema, schema_roles, validate
from training.features import dictionary_encoded

SCHEMA = load_schema(Path(__file__).resolve().parents[1] / "data" / "schema.yaml")


@pytest.fixture
def stable(demo_files) -> pd.DataFrame:
    return pd.read_parquet(demo_files["batch_stable.parquet"])


def broken(stable: pd.DataFrame) -> pd.DataFrame:
    """Ten rows, six of them outside the schema in every way a row can be."""
    df = stable.head(10).astype({"age": object}).reset_index(drop=True)
    df.loc[1, ["region", "monthly_charges"]] = ["atlantis", 1e9]
    df.loc[2, "age"] = "forty"
    df.loc[3, "age"] = 30.5
    df.loc[4, "contract"] = None
    df.loc[5, "tenure_months"] = -3
    df.loc[6, ["region", "plan"]] = [None, "gold"]  # region is nullable: only plan fails
    return df


def test_the_row_from_the_issue_is_flagged_with_both_violations(stable):
    df = broken(stable)
    messages = RuleSet(SCHEMA).row_messages(df)
    assert messages[1] == "monthly_charges: 1e+09 above max 200.0; region: unseen category 'atlantis'"
    assert messages[2] == "age: 'forty' is not a whole number (int64)"
    assert messages[3] == "age: 30.5 is not a whole number (int64)"
    assert messages[4] == "contract: unexpected null"
    assert messages[5] == "tenure_months: -3 below min 0"
    assert messages[6] == "plan: unseen category 'gold'"
    assert list(messages[[0, 7, 8, 9]]) == ["", "", "", ""]


def test_dictionary_encoded_text_columns_are_flagged_and_refused_as_the_raw_ones(stable):
    """The served model checks its text features dictionary-encoded: the same rows, the same messages."""
    df = broken(stable)
    df["payment_method"] = df["payment_method"].map(np.str_)  # numpy strings are text too
    df = df.astype({"plan": object})
    df.loc[8, "plan"] = 7  # a number: plan stays as it is
    categorical = schema_roles(SCHEMA).categorical
    encoded = dictionary_encoded(df, categorical)
    assert {c for c in categorical if isinstance(encoded[c].dtype, pd.CategoricalDtype)} == \
        {"contract", "payment_method", "region"}
    rules = RuleSet(SCHEMA)
    assert rules.row_messages(encoded).tolist() == rules.row_messages(df).tolist()
    assert rules.row_messages(encoded)[8] == "plan: unseen category 7"
    scored = pd.DataFrame({"prediction": np.zeros(len(df), dtype=int)}, index=df.index)
    errors = []
    for rows in (df, encoded):
        with pytest.raises(SchemaViolationError) as raised:
            apply_violation_mode(rules, rows, scored, "error")
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and "row 1: monthly_charges: 1e+09 above max 200.0" in errors[0]


def test_equal_values_that_look_different_are_each_shown_as_they_are():
    schema = pa.DataFrameSchema({"x": pa.Column(float, pa.Check.gt(0)), "s": pa.Column(str, pa.Check.isin(["a"]))})
    df = pd.DataFrame({"x": [-0.0, 0.0, -0.0, 1.0], "s": np.array([1, True, 1.0, "a"], dtype=object)})
    assert RuleSet(schema).row_messages(df).tolist() == [
        "x: -0 below min 0; s: unseen category 1", "x: 0 below min 0; s: unseen category True",
        "x: -0 below min 0; s: unseen category 1.0", ""]


def test_validate_and_serving_flag_the_same_rows_for_the_same_rules(stable):
    df = broken(stable)
    flagged = {}
    for failed in RuleSet(SCHEMA).check(df):
        flagged[(failed.rule.column, failed.rule.name)] = failed.positions.tolist()
    report = validate(df, SCHEMA)
    reported = {(f.column, f.rule): f.rows for f in report.failures if f.column is not None}  # not min_rows
    assert reported == flagged
    assert set(flagged) >= {("region", "isin(['east', 'north', 'south', 'west'])"),
                            ("monthly_charges", "in_range(0.0, 200.0)"), ("age", "dtype('int64')"),
                            ("contract", "not_nullable"), ("tenure_months", "in_range(0, 120)")}
    rows_with_messages = set(np.flatnonzero(RuleSet(SCHEMA).row_messages(df) != ""))
    assert rows_with_messages == {row for rows in reported.values() for row in rows} == {1, 2, 3, 4, 5, 6}


def test_violation_modes(stable):
    df = broken(stable)
    rules = RuleSet(SCHEMA, schema_roles(SCHEMA).numeric + schema_roles(SCHEMA).categorical)
    scored = pd.DataFrame({"prediction": np.zeros(len(df), dtype=int)}, index=df.index)
    assert list(apply_violation_mode(rules, df, scored, "ignore").columns) == ["prediction"]
    flagged = apply_violation_mode(rules, df, scored, "flag")
    assert (flagged["schema_violations"] != "").sum() == 6
    with pytest.raises(SchemaViolationError, match=r"6 of 10 row\(s\).*row 1: monthly_charges: 1e\+09 above max "
                                                   r"200.0; region: unseen category 'atlantis'") as raised:
        apply_violation_mode(rules, df, scored, "error")
    assert "and 1 more" in str(raised.value) and "row 6" not in str(raised.value)
    clean = df.drop(index=range(1, 7))
    assert apply_violation_mode(rules, clean, scored.loc[clean.index], "error").equals(scored.loc[clean.index])
    with pytest.raises(ValueError, match=r"on_schema_violation='warn': use one of \['flag', 'error', 'ignore'\]"):
        apply_violation_mode(rules, df, scored, "warn")


def _drift(reference, current, policy, **kwargs):
    roles = schema_roles(SCHEMA)
    return check_drift(reference, current, numeric=roles.numeric, categorical=roles.categorical, policy=policy,
                       schema=SCHEMA, **kwargs)


def test_five_percent_unseen_categories_make_a_batch_drifted_by_themselves(demo_files, stable, tmp_path):
    reference = pd.read_parquet(demo_files["train.parquet"])
    current = stable.copy()
    atlantis = current.sample(frac=0.05, random_state=0).index
    current.loc[atlantis, "region"] = "atlantis"

    statistics_only = _drift(reference, current, DriftPolicy(max_schema_violation_share=None))
    assert not statistics_only.drifted
    result = _drift(reference, current, DriftPolicy(), report_path=tmp_path / "drift.html")
    assert result.drifted and result.share_drifted_columns == statistics_only.share_drifted_columns
    assert "column 'region': 5.0% (unseen_category 5.0%) of rows outside the schema" in result.reason
    assert result.schema_violations["region"]["unseen_category"] == pytest.approx(len(atlantis) / len(current))
    assert result.schema_violations["plan"]["share"] == 0.0
    payload = result.to_dict()
    assert payload["schema_violations"]["region"]["share"] == result.schema_violations["region"]["share"]
    page = (tmp_path / "drift.html").read_text(encoding="utf-8")
    assert 'id="kfloop-schema-violations"' in page and "<td>region</td><td>5.00%</td>" in page

    assert not _drift(reference, stable, DriftPolicy()).drifted  # the clean batch has no violations


def test_violation_share_policy_states_the_fix():
    with pytest.raises(ValueError, match=r"max_schema_violation_share=1.5: use a share in \[0, 1\)"):
        DriftPolicy(max_schema_violation_share=1.5)


def test_infinity_breaks_every_numeric_column_in_validation_serving_and_drift(demo_files, stable):
    df = stable.head(10).reset_index(drop=True)
    df.loc[1, "monthly_charges"] = np.inf  # a column with a range
    df.loc[2, "total_charges"] = -np.inf  # nullable, with a range
    df.loc[3, "score"] = np.inf  # no range at all
    df.loc[4, "age"] = -np.inf  # an integer column (the frame's int64 becomes float64)
    schema = load_schema(SCHEMA.to_yaml())
    schema.columns["score"] = pa.Column(float, nullable=True, name="score")
    df.loc[[0, 2, 5], "score"] = [0.5, np.nan, 1.5]

    messages = RuleSet(schema).row_messages(df)
    assert list(messages[:5]) == ["", "monthly_charges: inf is not a finite number",
                                  "total_charges: -inf is not a finite number", "score: inf is not a finite number",
                                  "age: -inf is not a finite number"]
    assert (messages[5:] == "").all()
    report = validate(df, schema)
    assert {(f.column, f.rule): f.rows for f in report.failures if f.column is not None} == {
        ("age", "finite"): [4], ("monthly_charges", "finite"): [1], ("total_charges", "finite"): [2],
        ("score", "finite"): [3]}
    shares = RuleSet(schema).shares(df)
    assert shares["score"]["out_of_range"] == shares["age"]["out_of_range"] == 0.1
    assert shares["score"]["wrong_type"] == 0.0


def served_rows(stable: pd.DataFrame) -> pd.DataFrame:
    return stable.drop(columns=["churned"]).head(4).reset_index(drop=True)


@pytest.fixture(scope="module")
def served_model_dir(tmp_path_factory, demo_files) -> Path:
    """The demo features' MLP (untrained: the check does not depend on the weights) saved as the pyfunc the
    registry logs, with the demo schema."""
    import mlflow
    import torch

    from training.config import ModelSpec
    from training.features import FeatureTransform, target_classes
    from training.model import Predictor, save_model_dir
    from training.model_code import ModelCode
    from training.registry.candidates import served_model

    root = tmp_path_factory.mktemp("served")
    train = pd.read_parquet(demo_files["train.parquet"])
    roles = schema_roles(SCHEMA)
    torch.manual_seed(0)
    transform = FeatureTransform.fit(train, numeric=roles.numeric, categorical=roles.categorical)
    classes = target_classes(train[roles.target])
    code = ModelCode.load(ModelSpec(params={"hidden": [8]}))
    model_dir = save_model_dir(root / "model_dir", model=code.build(transform.n_outputs, len(classes)), code=code,
                               n_inputs=transform.n_outputs, n_outputs=len(classes), transform=transform,
                               classes=classes, target=roles.target)
    mlflow.pyfunc.save_model(root / "pyfunc", **served_model(model_dir, Predictor.load(model_dir),
                                                             Path(__file__).resolve().parents[1] / "data" /
                                                             "schema.yaml"))
    return root / "pyfunc"


SERVE_CASES = '''
import json, sys
import numpy as np, pandas as pd, mlflow
model = mlflow.pyfunc.load_model(sys.argv[1])
rows = pd.read_parquet(sys.argv[2])
cases = {"unexpected": rows.assign(x=1), "missing": rows.drop(columns=["tenure_months"]),
         "infinite": rows.assign(monthly_charges=[0.5, np.inf, -np.inf, 20.0])}
out = {}
for case, frame in cases.items():
    for mode in ("flag", "error", "ignore"):
        try:
            scored = model.predict(frame, params={"on_schema_violation": mode})
            out[f"{case} {mode}"] = {"rows": len(scored), "columns": list(scored.columns),
                                    "flags": list(scored.get("schema_violations", []))}
        except Exception as exc:
            out[f"{case} {mode}"] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
'''


def test_the_served_model_flags_unexpected_and_missing_columns_and_infinity_in_a_fresh_process(
        served_model_dir, stable, tmp_path):
    import json
    import subprocess
    import sys

    served_rows(stable).to_parquet(tmp_path / "rows.parquet")
    done = subprocess.run([sys.executable, "-c", SERVE_CASES, str(served_model_dir), str(tmp_path / "rows.parquet")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])

    assert got["unexpected flag"]["flags"] == ["1 column problem(s): unexpected column 'x'", *[SEE_FIRST_ROW] * 3]
    assert got["unexpected error"]["error"].startswith("SchemaViolationError: the rows' columns differ from the "
                                                       "model's training schema: 1 column problem(s): unexpected "
                                                       "column 'x'; ")
    assert got["missing flag"]["rows"] == 4 and got["missing flag"]["flags"] == [
        "1 column problem(s): missing column 'tenure_months'", *[SEE_FIRST_ROW] * 3]
    assert "missing column 'tenure_months'" in got["missing error"]["error"]
    assert "Model is missing inputs" not in done.stdout
    for case in ("unexpected", "missing", "infinite"):
        assert got[f"{case} ignore"]["rows"] == 4 and "schema_violations" not in got[f"{case} ignore"]["columns"]
    assert got["infinite flag"]["flags"] == ["", "monthly_charges: inf is not a finite number",
                                             "monthly_charges: -inf is not a finite number", ""]
    assert got["infinite error"]["error"].startswith("SchemaViolationError: 2 of 4 row(s) fall outside")


def test_a_batch_with_200_unknown_columns_is_flagged_with_bounded_output(stable):
    """Issue 41: 20,000 rows with 200 unknown columns (5.3 MB in) gave 244 MB of violation text."""
    rows = stable.sample(20_000, replace=True, random_state=0).reset_index(drop=True)
    rows = pd.concat([rows, pd.DataFrame({f"extra_{i:03d}_{'x' * 12}": "y" * 10 for i in range(200)},
                                         index=rows.index)], axis=1)
    rows.loc[7, "region"] = "atlantis-" + "z" * 5000  # a long value, echoed cut
    features = schema_roles(SCHEMA).numeric + schema_roles(SCHEMA).categorical
    rules = RuleSet(SCHEMA, features)
    scored = pd.DataFrame({"prediction": np.zeros(len(rows), dtype=int)}, index=rows.index)

    flagged = apply_violation_mode(rules, rows, scored, "flag", required=features)["schema_violations"]

    assert sum(map(len, flagged)) < 1_000_000  # was 244 MB
    assert max(map(len, flagged)) <= ServingLimits().max_message_chars
    assert flagged[0].startswith("200 column problem(s): unexpected column 'extra_000_xxxxxxxxxxxx'")
    assert (flagged[1:] != "").all() and all(text.startswith(SEE_FIRST_ROW) for text in flagged[1:])
    assert "region: unseen category 'atlantis-zzzz" in flagged[7] and "z" * 100 not in flagged[7]
    with pytest.raises(SchemaViolationError, match=r"200 column problem\(s\): unexpected column") as raised:
        apply_violation_mode(rules, rows, scored, "error", required=features)
    assert len(str(raised.value)) < 600


def test_a_request_over_max_rows_is_refused_before_anything_else(stable):
    rules = RuleSet(SCHEMA)
    rows = stable.head(11)
    scored = pd.DataFrame({"prediction": np.zeros(len(rows), dtype=int)}, index=rows.index)
    limits = ServingLimits(max_rows=10)
    for mode in ("flag", "error", "ignore"):
        with pytest.raises(SchemaViolationError, match=r"11 rows in one request, over the serving limit "
                                                       r"max_rows=10: split the batch"):
            apply_violation_mode(rules, rows, scored, mode, limits=limits)
    assert apply_violation_mode(rules, rows.head(10), scored.head(10), "ignore", limits=limits).equals(
        scored.head(10))
    with pytest.raises(ValueError, match="serving max_message_chars=10: use a whole number of at least 80"):
        ServingLimits(max_message_chars=10)
