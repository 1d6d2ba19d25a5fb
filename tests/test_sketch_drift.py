"""Drift verdicts from sketches equal Evidently's on the full data: the same method, threshold and drifted flag per
column, each score within the verdict's stated error (exact columns to rounding), at 100k rows a side, on the demo
data and on two real tables bundled with installed packages, resampled with a real covariate shift (a subgroup
over-represented in the current batch; see ``benchmarks/sketch_equality.py``). Also: partial sketches of chunks
merge to the sketch of the whole, and a difference the sketch cannot resolve is never called drift."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from benchmarks.sketch_equality import TABLES, chunks
from data.profiles import build_profile
from data.sketches import NumericSketch, SketchSettings, merge_sketches, sketch_chunk, sketch_table
from monitoring.drift import ColumnDrift, check_drift_profile, compare_sketches, evidently_drift
from monitoring.drift_policy import DriftPolicy

ROWS = 100_000


@pytest.fixture(scope="module", params=sorted(TABLES))
def table(request):
    reference, current, numeric, categorical = TABLES[request.param](ROWS)
    evidently = evidently_drift(reference, current, numeric=numeric, categorical=categorical, policy=DriftPolicy())
    return reference, current, numeric, categorical, evidently


def assert_equal_verdicts(ours: dict[str, ColumnDrift], theirs: dict[str, ColumnDrift]) -> None:
    assert [n for n, c in ours.items() if c.drifted] == [n for n, c in theirs.items() if c.drifted]
    for name, verdict in theirs.items():
        mine = ours[name]
        assert (mine.method, mine.threshold, mine.drifted) == (verdict.method, verdict.threshold, verdict.drifted)
        tolerance = mine.error if mine.basis == "sketch" else 1e-6 * max(abs(verdict.score), 1e-9)
        assert abs(mine.score - verdict.score) <= tolerance, (name, mine, verdict)


@pytest.mark.parametrize("settings", [SketchSettings(), SketchSettings(exact_values=100)],
                         ids=["default", "sketched"])
def test_sketch_verdicts_equal_evidentlys_on_full_data(table, settings):
    reference, current, numeric, categorical, evidently = table
    kinds = {c: "numeric" for c in numeric} | {c: "categorical" for c in categorical}
    profile = build_profile(chunks(reference), kinds, settings=settings)
    result = check_drift_profile(profile, chunks(current), numeric=numeric, categorical=categorical,
                                 policy=DriftPolicy())
    assert_equal_verdicts(result.columns, evidently)
    assert any(c.drifted for c in evidently.values()) and not all(c.drifted for c in evidently.values())
    if settings.exact_values == 100:
        assert any(c.basis == "sketch" for c in result.columns.values())


NUMERIC_METHODS, CATEGORICAL_METHODS = ("psi", "jensenshannon", "kl_div", "ks"), ("psi", "kl_div", "chisquare")


def test_each_sketch_method_equals_evidentlys(table):
    """Every stattest computed from sketches, one per column in turn, in one Evidently report per table."""
    reference, current, numeric, categorical, _ = table
    overrides = {c: {"method": NUMERIC_METHODS[i % 4]} for i, c in enumerate(numeric)}
    overrides |= {c: {"method": CATEGORICAL_METHODS[i % 3]} for i, c in enumerate(categorical)}
    policy = DriftPolicy(column_overrides=overrides)
    evidently = evidently_drift(reference, current, numeric=numeric, categorical=categorical, policy=policy)
    kinds = {c: "numeric" for c in numeric} | {c: "categorical" for c in categorical}
    profile = build_profile(chunks(reference), kinds, settings=SketchSettings(exact_values=100))
    result = check_drift_profile(profile, chunks(current), numeric=numeric, categorical=categorical, policy=policy)
    assert_equal_verdicts(result.columns, evidently)
    assert {result.columns[c].method for c in numeric} == set(NUMERIC_METHODS)


def test_partial_sketches_merge_to_the_whole():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.lognormal(0, 1, 60_000), "c": rng.choice(list("abcdefg"), 60_000)})
    frame.loc[::97, "x"] = np.nan
    kinds = {"x": "numeric", "c": "categorical"}
    settings = SketchSettings(exact_values=100, sample_size=500)
    parts = [sketch_chunk(frame.iloc[i:i + 7000], kinds, settings=settings, chunk_index=i // 7000)
             for i in range(0, len(frame), 7000)]
    merged = merge_sketches([merge_sketches(parts[:4]), merge_sketches(parts[4:])])  # any grouping
    x = frame["x"].dropna().to_numpy()
    sketch = merged["x"]
    assert (sketch.rows, sketch.nulls, sketch.count, sketch.min, sketch.max) == (60_000, 619, len(x), x.min(), x.max())
    assert sketch.mean == pytest.approx(x.mean(), rel=1e-12) and sketch.std == pytest.approx(x.std(), rel=1e-9)
    assert len(sketch.sample) == 500 and set(sketch.sample) <= set(x)
    ranks = np.array([np.searchsorted(np.sort(x), q, "right") / len(x)
                      for q in sketch.kll.get_quantiles([0.01, 0.25, 0.5, 0.75, 0.99])])
    assert np.abs(ranks - [0.01, 0.25, 0.5, 0.75, 0.99]).max() <= sketch.rank_error
    counts = frame["c"].value_counts().sort_index()
    assert merged["c"].values.tolist() == counts.index.tolist() and merged["c"].counts.tolist() == counts.tolist()
    arrow = sketch_table([pa_table(frame)], kinds, settings=settings)  # Arrow chunk: counted on dictionary codes
    assert arrow["c"].counts.tolist() == counts.tolist() and arrow["x"].count == len(x)


def pa_table(frame: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(frame.assign(c=frame["c"].astype("category")), preserve_index=False)


def test_a_difference_within_the_sketch_error_is_not_called_drift():
    rng = np.random.default_rng(3)
    coarse = SketchSettings(k=8, exact_values=100)  # rank error about 60%: nothing but a huge shift is resolvable
    ref, cur = NumericSketch(coarse), NumericSketch(coarse)
    ref.update(rng.normal(0, 1, 50_000), rng.random(50_000))
    cur.update(rng.normal(0.5, 1, 50_000), rng.random(50_000))
    verdict = compare_sketches(ref, cur, method="wasserstein", threshold=0.1)
    assert verdict.basis == "sketch" and verdict.score >= 0.1 and verdict.error > verdict.score
    assert not verdict.drifted
    fine = SketchSettings(exact_values=100)
    ref, cur = NumericSketch(fine), NumericSketch(fine)
    ref.update(rng.normal(0, 1, 50_000), rng.random(50_000))
    cur.update(rng.normal(0.5, 1, 50_000), rng.random(50_000))
    verdict = compare_sketches(ref, cur, method="wasserstein", threshold=0.1)
    assert verdict.drifted and verdict.error < verdict.score - 0.1
