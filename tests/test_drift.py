"""Drift checks on real Evidently reports over generated frames (numeric, bool, categorical, nulls)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from evidently.legacy.calculations import stattests
from evidently.legacy.calculations.stattests.registry import get_registered_stattest
from evidently.legacy.core import ColumnType

from monitoring.drift import ALL_NULL_METHOD, check_drift
from monitoring.drift_policy import DISTANCE_METHODS, P_VALUE_METHODS, ColumnDriftOverride, DriftPolicy, score_direction

NUMERIC = ["x", "items", "flag"]
CATEGORICAL = ["color"]
SMALL, LARGE = 600, 3000  # Evidently: <= 1000 reference rows -> p-value tests, more -> distances
FULL_REPORT = DriftPolicy(report="evidently_full")


def batch(n: int, seed: int, *, x_shift: float = 0.0, colors=(0.5, 0.3, 0.2), nulls: float = 0.05,
          prediction_yes: float | None = None) -> pd.DataFrame:
    """``x`` float with nulls, ``items`` small ints, ``flag`` bool, ``color`` strings with nulls."""
    rng = np.random.default_rng(seed)
    x = rng.normal(10 + x_shift, 2, n)
    x[rng.random(n) < nulls] = np.nan
    color = rng.choice(["red", "green", "blue"], n, p=colors).astype(object)
    color[rng.random(n) < nulls] = None
    frame = pd.DataFrame({"x": x, "items": rng.poisson(3, n), "flag": rng.random(n) < 0.3, "color": color,
                          "target": rng.choice(["a", "b"], n)})
    if prediction_yes is not None:
        frame["prediction"] = np.where(rng.random(n) < prediction_yes, "yes", "no").astype(object)
    return frame


def run(reference, current, policy=None, **kwargs):
    return check_drift(reference, current, numeric=NUMERIC, categorical=CATEGORICAL, policy=policy or DriftPolicy(),
                       **kwargs)


def assert_direction(result) -> None:
    """Evidently's flag follows the method's direction: p-values drift below, distances at or above the threshold."""
    for col in result.columns.values():
        if score_direction(col.method) == "p_value":
            assert col.drifted == (col.score < col.threshold), col
        else:
            assert col.drifted == (col.score >= col.threshold), col


@pytest.mark.parametrize(("rows", "methods"), [
    (SMALL, {"x": "ks", "items": "ks", "flag": "z", "color": "chisquare"}),
    (LARGE, {"x": "wasserstein", "items": "wasserstein", "flag": "jensenshannon", "color": "jensenshannon"}),
])
def test_same_distribution_does_not_drift(rows, methods):
    result = run(batch(rows, 1), batch(rows // 2, 2))

    assert {name: col.method for name, col in result.columns.items()} == methods
    assert not any(col.drifted for col in result.columns.values())
    assert (result.drifted, result.share_drifted_columns) == (False, 0.0)
    assert_direction(result)


@pytest.mark.parametrize(("rows", "direction"), [(SMALL, "p_value"), (LARGE, "distance")])
def test_shifted_numeric_and_categorical_columns_drift(rows, direction):
    result = run(batch(rows, 1), batch(rows // 2, 2, x_shift=1.5, colors=(0.2, 0.3, 0.5)))

    assert {name for name, col in result.columns.items() if col.drifted} == {"x", "color"}
    assert {score_direction(col.method) for col in result.columns.values()} == {direction}
    assert (result.drifted, result.share_drifted_columns) == (True, 0.5)
    assert_direction(result)
    x = result.columns["x"]
    assert x.score < x.threshold if direction == "p_value" else x.score >= x.threshold


def test_column_override_changes_method_threshold_and_verdict():
    reference, current = batch(LARGE, 1), batch(LARGE // 2, 2, x_shift=0.15)  # ~0.075 std: below the 0.1 default
    default = run(reference, current)
    policy = DriftPolicy.from_dict({"column_overrides": {"x": {"method": "wasserstein", "threshold": 0.02},
                                                         "color": {"method": "psi"}}})
    overridden = run(reference, current, policy)

    assert (default.columns["x"].method, default.columns["x"].threshold, default.columns["x"].drifted) == \
        ("wasserstein", 0.1, False)
    assert (overridden.columns["x"].method, overridden.columns["x"].threshold, overridden.columns["x"].drifted) == \
        ("wasserstein", 0.02, True)
    assert overridden.columns["x"].score == pytest.approx(default.columns["x"].score)
    assert (overridden.columns["color"].method, overridden.columns["color"].threshold) == ("psi", 0.1)
    assert overridden.columns["items"].method == "wasserstein"  # untouched columns keep Evidently's choice
    assert_direction(overridden)


def test_policy_method_applies_to_every_column():
    result = run(batch(SMALL, 1), batch(SMALL, 2, x_shift=1.5), DriftPolicy(method="psi", threshold=0.2))

    assert {(col.method, col.threshold) for col in result.columns.values()} == {("psi", 0.2)}
    assert [name for name, col in result.columns.items() if col.drifted] == ["x"]
    assert_direction(result)


@pytest.mark.parametrize(("drift_share", "drifted"), [(0.25, True), (0.26, False), (1.0, False)])
def test_dataset_drifts_when_share_of_drifted_columns_reaches_drift_share(drift_share, drifted):
    result = run(batch(SMALL, 1), batch(SMALL, 2, x_shift=1.5), DriftPolicy(drift_share=drift_share))

    assert [name for name, col in result.columns.items() if col.drifted] == ["x"]
    assert result.share_drifted_columns == 0.25
    assert result.drifted is drifted


def test_prediction_column_is_checked_as_categorical():
    reference, current = batch(SMALL, 1, prediction_yes=0.5), batch(SMALL, 2, prediction_yes=0.8)

    result = run(reference, current)
    without = run(reference, current, DriftPolicy(include_predictions=False))

    assert list(result.columns) == [*NUMERIC, *CATEGORICAL, "prediction"]
    assert (result.columns["prediction"].method, result.columns["prediction"].drifted) == ("z", True)
    assert result.share_drifted_columns == 0.2
    assert "prediction" not in without.columns
    with pytest.raises(ValueError, match="only the current data has a 'prediction' column"):
        run(batch(SMALL, 1), current)


def test_report_html_and_json_contract(tmp_path):
    path = tmp_path / "reports" / "drift.html"
    result = run(batch(SMALL, 1), batch(SMALL, 2, colors=(0.2, 0.3, 0.5)), FULL_REPORT, report_path=path)

    assert result.report_path == path
    text = path.read_text(encoding="utf-8")
    assert "Value Drift for column color" in text and "Value Drift for column items" in text
    payload = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert set(payload) == {"drifted", "share_drifted_columns", "columns", "report_path", "schema_violations", "reason"}
    assert payload["report_path"] == str(path)
    assert list(payload["columns"]) == [*NUMERIC, *CATEGORICAL]
    for name, col in payload["columns"].items():
        assert col == {"method": result.columns[name].method, "score": result.columns[name].score,
                       "threshold": result.columns[name].threshold, "drifted": result.columns[name].drifted,
                       "error": 0.0, "basis": "exact"}  # every value compared: no sketch error
    assert payload["columns"]["color"]["drifted"] is True
    assert payload["drifted"] is False and payload["share_drifted_columns"] == 0.25


def test_columns_without_values_are_reported_not_crashing(tmp_path):
    reference, current = batch(SMALL, 1), batch(SMALL, 2)
    current["x"] = np.nan
    reference["color"] = None
    current["color"] = pd.Series([None] * len(current), dtype="string")

    result = run(reference, current, FULL_REPORT, report_path=tmp_path / "r.html")

    x, color = result.columns["x"], result.columns["color"]
    assert (x.method, x.drifted, x.threshold) == (ALL_NULL_METHOD, True, None)
    assert x.score == pytest.approx(1 - reference["x"].isna().mean())
    assert (color.method, color.drifted, color.score) == (ALL_NULL_METHOD, False, 0.0)
    assert {result.columns[c].method for c in ("items", "flag")} <= P_VALUE_METHODS
    assert result.share_drifted_columns == 0.25
    assert "Value Drift for column items" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_no_column_with_values_on_both_sides_still_writes_a_report(tmp_path):
    current = batch(SMALL, 2)
    current[[*NUMERIC, *CATEGORICAL]] = None

    result = run(batch(SMALL, 1), current, FULL_REPORT, report_path=tmp_path / "r.html")

    assert {col.method for col in result.columns.values()} == {ALL_NULL_METHOD}
    assert (result.drifted, result.share_drifted_columns) == (True, 1.0)
    assert "No drift comparison" in (tmp_path / "r.html").read_text(encoding="utf-8")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"drift_share": 0}, r"drift_share=0: use a share in \(0, 1\]"),
    ({"method": "kolmogorov"}, "method='kolmogorov' is not an Evidently drift method.*'ks'"),
    ({"method": "perc_text_content_drift"}, "not an Evidently drift method for numeric or categorical"),
    ({"threshold": 0.1}, "threshold=0.1 is set without a method"),
    ({"method": "ks", "threshold": 1.5}, r"'ks' scores a p-value, so use a threshold in \(0, 1\)"),
    ({"method": "psi", "threshold": -1}, "threshold=-1: use a positive number"),
    ({"column_overrides": {"x": {"threshold": 0.2}}}, r"column_overrides\['x'\].threshold=0.2 is set without"),
    ({"column_overrides": {"x": {"method": "psi", "thresh": 0.2}}}, r"unknown keys \['thresh'\]"),
    ({"column_overrides": {"x": {}}}, "needs a method, a threshold or both"),
    ({"include_predictions": "yes"}, "include_predictions='yes'"),
])
def test_invalid_policy_states_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DriftPolicy.from_dict(kwargs)


def test_policy_accepts_dict_and_typed_overrides_alike():
    typed = DriftPolicy(method="psi", column_overrides={"x": ColumnDriftOverride(threshold=0.3)})
    plain = DriftPolicy.from_dict({"method": "psi", "column_overrides": {"x": {"threshold": 0.3}}})

    assert plain == typed
    assert (plain.method_for("x"), plain.threshold_for("x"), plain.threshold_for("color")) == ("psi", 0.3, None)
    with pytest.raises(ValueError, match=r"unknown drift key\(s\) \['share'\]"):
        DriftPolicy.from_dict({"share": 0.3})


@pytest.mark.parametrize(("change", "policy", "message"), [
    (lambda r, c: c.drop(columns="items"), DriftPolicy(), r"current data lacks feature columns \['items'\]"),
    (lambda r, c: c.assign(x="n/a"), DriftPolicy(), "numeric column 'x' in the current data holds non-numbers"),
    (lambda r, c: c.iloc[:0], DriftPolicy(), "the current data has no rows"),
    (None, DriftPolicy(method="ks"), "column 'color' is categorical but drift method 'ks' only applies to numeric"),
    (None, DriftPolicy(column_overrides={"colour": {"method": "psi"}}), r"column_overrides name \['colour'\]"),
])
def test_invalid_inputs_are_rejected_before_evidently_runs(change, policy, message):
    reference, current = batch(SMALL, 1), batch(SMALL, 2)
    if change is not None:
        current = change(reference, current)
    with pytest.raises(ValueError, match=message):
        run(reference, current, policy)


def test_feature_lists_must_not_repeat_or_shadow_prediction():
    frame = batch(SMALL, 1).assign(prediction="yes")
    with pytest.raises(ValueError, match=r"columns \['x'\] are listed more than once"):
        check_drift(frame, frame, numeric=["x"], categorical=["x"], policy=DriftPolicy())
    with pytest.raises(ValueError, match="a feature is named 'prediction'"):
        check_drift(frame, frame, numeric=[], categorical=["prediction"], policy=DriftPolicy())


def test_direction_table_matches_evidently_stattests():
    """Every numeric/categorical stattest Evidently ships is classified, and each moves the way it is classified:
    a p-value falls (drift below the threshold) and a distance rises (drift at or above it) when the sample shifts."""
    shipped = {obj.name for obj in vars(stattests).values() if isinstance(obj, stattests.StatTest)
               and {ColumnType.Numerical, ColumnType.Categorical} & set(obj.allowed_feature_types)}
    assert shipped == P_VALUE_METHODS | DISTANCE_METHODS
    assert not P_VALUE_METHODS & DISTANCE_METHODS

    rng = np.random.default_rng(0)
    numbers = pd.Series(rng.normal(0, 1, 300))
    same, shifted = pd.Series(rng.normal(0, 1, 300)), pd.Series(rng.normal(0.8, 1, 300))
    labels = pd.Series(rng.choice(["a", "b"], 300, p=[0.5, 0.5]))
    same_labels, shifted_labels = (pd.Series(rng.choice(["a", "b"], 300, p=p)) for p in ([0.5, 0.5], [0.8, 0.2]))
    for name in sorted(shipped):
        kind = _kind(name)
        reference, current_same, current_shifted = ((numbers, same, shifted) if kind == ColumnType.Numerical
                                                    else (labels, same_labels, shifted_labels))
        stattest = get_registered_stattest(name, kind)
        calm = stattest(reference, current_same, kind, None)
        moved = stattest(reference, current_shifted, kind, None)
        assert moved.drifted, name
        if score_direction(name) == "p_value":
            assert moved.drift_score < min(moved.actual_threshold, calm.drift_score), name
            assert calm.drifted == (calm.drift_score < calm.actual_threshold), name
        else:
            assert moved.drift_score >= moved.actual_threshold and moved.drift_score > calm.drift_score, name
            assert calm.drifted == (calm.drift_score >= calm.actual_threshold), name


def _kind(name: str) -> ColumnType:
    """Numerical where the stattest allows it, else Categorical."""
    try:
        get_registered_stattest(name, ColumnType.Numerical)
    except ValueError:
        return ColumnType.Categorical
    return ColumnType.Numerical
