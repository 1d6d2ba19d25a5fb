"""Drift verdicts from sketches against Evidently's on the full data: per table, the columns each calls drifted and
the largest score difference, with the error the sketch verdicts state.

    .venv/bin/python -m benchmarks.sketch_equality [--rows 1000000] [--out benchmarks/results/sketch_equality.json]

Tables (nothing downloaded): the demo's churn data (``data.generate``: training distribution vs the demo's drifted
batch), scikit-learn's bundled Wisconsin breast cancer table (569 rows; current batch 70% malignant tumours) and
statsmodels' bundled RAND Health Insurance Experiment table (20,190 rows; current batch 70% people with a physical
limitation), both resampled with replacement to ``--rows`` a side. Profiles use ``SketchSettings(exact_values=100)``
so every column with more than 100 distinct values is compared from its sketches, and the default settings.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import statsmodels.api as sm
from sklearn.datasets import load_breast_cancer

from data.fileio import atomic_write_json
from data.generate import generate
from data.profiles import build_profile
from data.sketches import SketchSettings
from monitoring.drift import ColumnDrift, check_drift_profile, evidently_drift
from monitoring.drift_policy import DriftPolicy

CHUNK_ROWS = 25_000
Table = tuple[pd.DataFrame, pd.DataFrame, list[str], list[str]]


def resample(frame: pd.DataFrame, subgroup: pd.Series, rows: int, *, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A reference of ``rows`` rows drawn from the whole table, and a current batch of ``rows`` rows in which the
    ``subgroup`` makes up 70% (a covariate shift)."""
    rng = np.random.default_rng(seed)
    reference = frame.iloc[rng.integers(0, len(frame), rows)].reset_index(drop=True)
    inside, outside = np.flatnonzero(subgroup.to_numpy()), np.flatnonzero(~subgroup.to_numpy())
    n_in = int(rows * 0.7)
    picked = np.concatenate([rng.choice(inside, n_in), rng.choice(outside, rows - n_in)])
    return reference, frame.iloc[rng.permutation(picked)].reset_index(drop=True)


def demo(rows: int) -> Table:
    """The demo's churn data: the training distribution against a covariate shift of 0.4."""
    reference = generate(rows, seed=11).drop(columns=["customer_id", "churned"])
    current = generate(rows, seed=12, covariate_shift=0.4).drop(columns=["customer_id", "churned"])
    numeric = [c for c in reference.columns if pd.api.types.is_numeric_dtype(reference[c])]
    return reference, current, numeric, [c for c in reference.columns if c not in numeric]


def breast_cancer(rows: int) -> Table:
    """scikit-learn's Wisconsin breast cancer table, its first 10 features; current: 70% malignant tumours."""
    data = load_breast_cancer(as_frame=True)
    frame = data.frame.iloc[:, :10]
    reference, current = resample(frame, data.frame["target"] == 0, rows, seed=1)
    return reference, current, list(frame.columns), []


def rand_health(rows: int) -> Table:
    """statsmodels' RAND Health Insurance Experiment table; current: 70% people with a physical limitation;
    ``idp`` (individual deductible plan) and two health ratings as categories."""
    frame = sm.datasets.randhie.load_pandas().data
    frame = frame.assign(**{c: frame[c].map({0.0: "no", 1.0: "yes"}) for c in ("idp", "hlthg", "hlthf")})
    reference, current = resample(frame, frame["physlm"] > 0.5, rows, seed=2)
    return reference, current, ["mdvis", "lncoins", "lpi", "fmde", "disea"], ["idp", "hlthg", "hlthf"]


TABLES: dict[str, Callable[[int], Table]] = {"demo": demo, "breast_cancer": breast_cancer, "rand_health": rand_health}


def chunks(frame: pd.DataFrame):
    return (frame.iloc[i:i + CHUNK_ROWS] for i in range(0, len(frame), CHUNK_ROWS))


def sketch_verdicts(table: Table, policy: DriftPolicy, settings: SketchSettings) -> dict[str, ColumnDrift]:
    """The verdicts of a check of the current batch against the reference's profile (both streamed in chunks)."""
    reference, current, numeric, categorical = table
    kinds = {c: "numeric" for c in numeric} | {c: "categorical" for c in categorical}
    profile = build_profile(chunks(reference), kinds, settings=settings)
    return check_drift_profile(profile, chunks(current), numeric=numeric, categorical=categorical,
                               policy=policy).columns


def comparison(ours: dict[str, ColumnDrift], theirs: dict[str, ColumnDrift]) -> dict:
    """Drifted columns of each, whether methods, thresholds and flags are equal, and the score differences."""
    gaps = {n: abs(ours[n].score - theirs[n].score) for n in theirs}
    return {"evidently_drifted": [n for n, c in theirs.items() if c.drifted],
            "sketch_drifted": [n for n, c in ours.items() if c.drifted],
            "verdicts_equal": all((ours[n].method, ours[n].threshold, ours[n].drifted)
                                  == (theirs[n].method, theirs[n].threshold, theirs[n].drifted) for n in theirs),
            "max_score_difference": max(gaps.values()),
            "max_stated_error": max(c.error for c in ours.values()),
            "within_stated_error": all(gaps[n] <= max(ours[n].error, 1e-6 * abs(theirs[n].score)) for n in theirs),
            "sketched_columns": sorted(n for n, c in ours.items() if c.basis == "sketch")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sketch_equality.json"))
    args = parser.parse_args(argv)
    results = []
    print(f"{'table':<15}{'settings':<10}{'equal':>6}{'max |diff|':>12}{'max error':>11}{'seconds':>9}  drifted")
    for name, build in TABLES.items():
        table = build(args.rows)
        start = time.perf_counter()
        theirs = evidently_drift(table[0], table[1], numeric=table[2], categorical=table[3], policy=DriftPolicy())
        evidently_seconds = time.perf_counter() - start
        for label, settings in (("default", SketchSettings()), ("sketched", SketchSettings(exact_values=100))):
            start = time.perf_counter()
            row = {"table": name, "rows": args.rows, "settings": label,
                   **comparison(sketch_verdicts(table, DriftPolicy(), settings), theirs),
                   "sketch_seconds": round(time.perf_counter() - start, 2),
                   "evidently_seconds": round(evidently_seconds, 2)}
            results.append(row)
            print(f"{name:<15}{label:<10}{str(row['verdicts_equal']):>6}{row['max_score_difference']:>12.2e}"
                  f"{row['max_stated_error']:>11.3f}{row['sketch_seconds']:>9.1f}  {', '.join(row['sketch_drifted'])}")
    atomic_write_json(args.out, {"rows": args.rows, "results": results})
    print(f"wrote {args.out}")
    return 0 if all(r["verdicts_equal"] and r["within_stated_error"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
