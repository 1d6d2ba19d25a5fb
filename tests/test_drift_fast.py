"""kfloop's drift check gives Evidently's own verdicts and scores (Evidently's report is the yardstick)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from monitoring.drift import ALL_NULL_METHOD, check_drift, evidently_drift, same_verdict
from monitoring.drift_policy import DriftPolicy

NUMERIC = ["normal", "skewed", "few_ints", "many_ints", "flag", "sparse"]
CATEGORICAL = ["city", "plan", "binary"]


def frame(n: int, seed: int, *, drift: bool) -> pd.DataFrame:
    """Every kind of column Evidently treats differently; ``drift`` moves some of them."""
    rng = np.random.default_rng(seed)
    shift = 0.6 if drift else 0.0
    normal = rng.normal(5 + shift, 2, n)
    normal[rng.random(n) < 0.1] = np.nan
    cities = ["oslo", "lima", "pune", "kiev"] + (["cork"] if drift else [])  # an unseen category when drifted
    city = rng.choice(cities, n).astype(object)
    city[rng.random(n) < 0.05] = None
    return pd.DataFrame({
        "normal": normal,
        "skewed": rng.lognormal(0, 1, n),
        "few_ints": rng.choice([0, 1, 2, 3], n, p=[0.1, 0.2, 0.3, 0.4] if drift else [0.4, 0.3, 0.2, 0.1]),
        "many_ints": rng.integers(0, 12, n),
        "flag": rng.random(n) < 0.3,
        "sparse": np.where(rng.random(n) < 0.9, np.nan, rng.normal(0, 1, n)),
        "city": city,
        "plan": rng.choice(["free", "pro", "team"], n, p=[0.6, 0.3, 0.1]),
        "binary": rng.choice(["yes", "no"], n, p=[0.2, 0.8] if drift else [0.5, 0.5]),
        "prediction": rng.choice(["a", "b", "c"], n).astype(object),
    })


def assert_same(reference: pd.DataFrame, current: pd.DataFrame, policy: DriftPolicy) -> dict:
    ours = check_drift(reference, current, numeric=NUMERIC, categorical=CATEGORICAL, policy=policy).columns
    theirs = evidently_drift(reference, current, numeric=NUMERIC, categorical=CATEGORICAL, policy=policy)

    assert list(ours) == list(theirs) == [*NUMERIC, *CATEGORICAL, "prediction"]
    differ = {name: (ours[name], theirs[name]) for name in ours if not same_verdict(ours[name], theirs[name])}
    assert not differ
    return ours


@pytest.mark.parametrize(("rows", "methods"), [
    (600, {"normal": "ks", "skewed": "ks", "few_ints": "chisquare", "many_ints": "ks", "flag": "z", "sparse": "ks",
           "city": "chisquare", "plan": "chisquare", "binary": "z", "prediction": "chisquare"}),
    (3000, {"normal": "wasserstein", "skewed": "wasserstein", "few_ints": "jensenshannon",
            "many_ints": "wasserstein", "flag": "jensenshannon", "sparse": "ks",  # 10% of 3000 rows: a small reference
            "city": "jensenshannon", "plan": "jensenshannon", "binary": "jensenshannon",
            "prediction": "jensenshannon"}),
])
def test_automatic_methods_match_evidently(rows, methods):
    """Small references get p-value tests, large ones distances; unseen categories and nulls included."""
    reference = frame(rows, 1, drift=False)
    current = pd.concat([frame(rows // 2, 2, drift=True).iloc[:, :4], frame(rows // 2, 3, drift=False).iloc[:, 4:]],
                        axis=1).assign(city=frame(rows // 2, 2, drift=True)["city"],
                                       binary=frame(rows // 2, 2, drift=True)["binary"])

    ours = assert_same(reference, current, DriftPolicy())

    assert {name: col.method for name, col in ours.items()} == methods
    assert {name for name, col in ours.items() if col.drifted} >= {"normal", "few_ints", "city", "binary"}
    assert not ours["plan"].drifted and not ours["prediction"].drifted


@pytest.mark.parametrize("policy", [
    DriftPolicy(method="psi", threshold=0.2),
    DriftPolicy(method="jensenshannon", threshold=0.05),  # continuous numbers: Evidently bins them (Sturges)
    DriftPolicy(column_overrides={"normal": {"method": "ks"}, "city": {"method": "TVD"},
                                  "skewed": {"method": "wasserstein", "threshold": 0.02}}),
])
def test_configured_methods_and_thresholds_match_evidently(policy):
    ours = assert_same(frame(2500, 1, drift=False), frame(2000, 2, drift=True), policy)

    assert any(col.drifted for col in ours.values()) and not all(col.drifted for col in ours.values())


def test_column_without_values_matches_evidently_path():
    reference, current = frame(1500, 1, drift=False), frame(1500, 2, drift=False)
    current["normal"] = np.nan

    ours = assert_same(reference, current, DriftPolicy())

    assert (ours["normal"].method, ours["normal"].drifted) == (ALL_NULL_METHOD, True)


def test_constant_columns_match_evidently():
    """Zero spread: Evidently's 0.001 floor on the norm, and a single category."""
    reference, current = frame(1500, 1, drift=False), frame(1500, 2, drift=False)
    reference["skewed"], current["skewed"] = 1.0, 1.0
    reference["plan"], current["plan"] = "pro", "pro"

    ours = assert_same(reference, current, DriftPolicy())

    assert (ours["plan"].method, ours["plan"].drifted) == ("jensenshannon", False)
    assert (ours["skewed"].method, ours["skewed"].drifted) == ("jensenshannon", False)
