"""kfloop's drift check against Evidently's plain ``DataDriftPreset`` report on the same frames: seconds, speed-up,
and whether every column's verdict (method, threshold, drifted, score to 1e-6) is the same.

    .venv/bin/python benchmarks/drift.py [--rows 10000 100000 1000000] [--out benchmarks/results/drift.json]

Each size has a reference and a current frame of that many rows x 20 columns (12 numeric, 8 categorical, with
nulls); 4 numeric and 3 categorical columns drift clearly, the rest do not. Goal (issue 6): >= 10x at 1M rows with
equal verdicts.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from data.fileio import atomic_write_json
from monitoring.drift import check_drift, evidently_drift, same_verdict
from monitoring.drift_policy import DriftPolicy

SPEEDUP_GOAL = 10.0
NUMERIC = [f"num_{i:02d}" for i in range(12)]
CATEGORICAL = [f"cat_{i:02d}" for i in range(8)]
DRIFTING = {"num_00", "num_03", "num_06", "num_09", "cat_00", "cat_03", "cat_06"}


def make_frame(rows: int, seed: int, *, drift: bool) -> pd.DataFrame:
    """20 columns: normal, lognormal, small-int and binary numbers; 3 to 12 categories; 2% nulls in some."""
    rng = np.random.default_rng(seed)
    columns: dict[str, np.ndarray] = {}
    for i, name in enumerate(NUMERIC):
        moved = drift and name in DRIFTING
        match i % 4:
            case 0:
                values = rng.normal(10 + (1.0 if moved else 0.0), 3, rows)
                values[rng.random(rows) < 0.02] = np.nan
            case 1:
                values = rng.lognormal(1.3 if moved else 1.0, 0.5, rows)
            case 2:
                values = rng.poisson(5 if moved else 4, rows).astype(float)
            case _:
                values = (rng.random(rows) < (0.6 if moved else 0.3)).astype(float)
        columns[name] = values
    for i, name in enumerate(CATEGORICAL):
        levels = np.array([f"v{j}" for j in range(3 + i)], dtype=object)
        weights = np.linspace(1, 2, len(levels))
        if drift and name in DRIFTING:
            weights = weights[::-1] ** 3
        values = rng.choice(levels, rows, p=weights / weights.sum())
        values[rng.random(rows) < 0.02] = None
        columns[name] = values
    return pd.DataFrame(columns)


def measure(rows: int) -> dict:
    """Both engines on one size; Evidently's report is the yardstick for the verdicts."""
    reference, current = make_frame(rows, 1, drift=False), make_frame(rows, 2, drift=True)
    policy = DriftPolicy()
    start = time.perf_counter()
    ours = check_drift(reference, current, numeric=NUMERIC, categorical=CATEGORICAL, policy=policy).columns
    kfloop_s = time.perf_counter() - start
    start = time.perf_counter()
    theirs = evidently_drift(reference, current, numeric=NUMERIC, categorical=CATEGORICAL, policy=policy)
    evidently_s = time.perf_counter() - start
    differ = sorted(name for name in ours if not same_verdict(ours[name], theirs[name]))
    return {"rows": rows, "columns": len(ours), "kfloop_s": round(kfloop_s, 3), "evidently_s": round(evidently_s, 3),
            "speedup": round(evidently_s / kfloop_s, 1), "verdicts_equal": not differ, "differing_columns": differ,
            "drifted_columns": sorted(name for name, col in ours.items() if col.drifted),
            "expected_drifted": sorted(DRIFTING),
            "methods": sorted({col.method for col in ours.values()})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/drift.json"))
    args = parser.parse_args(argv)

    print(f"{'rows':>9} {'kfloop s':>9} {'Evidently s':>12} {'speed-up':>9}  verdicts")
    sizes = []
    for rows in args.rows:
        size = measure(rows)
        sizes.append(size)
        print(f"{rows:>9} {size['kfloop_s']:>9.2f} {size['evidently_s']:>12.2f} {size['speedup']:>8.1f}x  "
              f"{'equal' if size['verdicts_equal'] else 'DIFFER: ' + ', '.join(size['differing_columns'])}")
    largest = max(sizes, key=lambda s: s["rows"])
    correct = all(s["verdicts_equal"] and s["drifted_columns"] == s["expected_drifted"] for s in sizes)
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "sizes": sizes,
              "largest_rows": largest["rows"], "speedup_at_largest": largest["speedup"],
              "speedup_goal": SPEEDUP_GOAL, "within_goal": largest["speedup"] >= SPEEDUP_GOAL,
              "verdicts_equal": all(s["verdicts_equal"] for s in sizes), "correct": correct}
    print(f"speed-up at {largest['rows']} rows: {largest['speedup']}x (goal >= {SPEEDUP_GOAL:.0f}x); "
          f"verdicts equal and as planted: {correct}")
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
