"""One rule set for validation, serving and drift: ``kfloop validate``'s value failures and the served model's
``schema_violations`` come from the same rows the same way; a batch with unseen categories is drifted by itself."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from monitoring.drift import DriftPolicy, check_drift
from data.schema_rules import RuleSet, SchemaViolationError, apply_violation_mode
from data.validation import load_schema, schema_roles, validate

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
