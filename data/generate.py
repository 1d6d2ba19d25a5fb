"""Synthetic customer-churn data for the demo loop: a training set, a stable batch and a drifted batch.

Each row is a customer with numeric and categorical attributes; ``churned`` (0/1) is drawn from a logistic model with
interactions. ``covariate_shift`` moves the feature distributions, ``concept_shift`` changes how the features drive
churn, so a model trained on unshifted data loses accuracy on shifted data until it is retrained.

    python -m data.generate --out data/demo [--seed 0] [--rows 6000]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from data.fileio import atomic_write_bytes, parquet_bytes

TARGET = "churned"
ID_COLUMN = "customer_id"
CONTRACTS = ("month-to-month", "one-year", "two-year")
PAYMENT_METHODS = ("electronic-check", "mailed-check", "bank-transfer", "credit-card")
REGIONS = ("north", "south", "east", "west")
PLANS = ("basic", "standard", "premium")

# Category mixes without shift, and the direction a covariate shift of 1.0 moves them (each direction sums to 0).
_CONTRACT_MIX = (np.array([0.52, 0.27, 0.21]), np.array([0.10, -0.04, -0.06]))
_PAYMENT_MIX = (np.array([0.33, 0.20, 0.23, 0.24]), np.array([0.17, -0.10, -0.03, -0.04]))
_REGION_MIX = (np.array([0.30, 0.26, 0.24, 0.20]), np.array([-0.12, -0.08, 0.0, 0.20]))
_PLAN_MIX = (np.array([0.38, 0.40, 0.22]), np.array([-0.16, 0.0, 0.16]))
_PLAN_PRICE = np.array([32.0, 64.0, 96.0])
_MEAN_TENURE = np.array([11.0, 30.0, 48.0])  # months, by contract

# Churn logit coefficients, in the order of the terms built in _logit_terms. The second vector is the relationship
# after a concept shift of 1.0; coefficients interpolate linearly in concept_shift.
_COEF = np.array([-1.96, 1.5, -1.2, -1.0, 0.7, 0.5, 0.6, -0.25, 0.5, -0.3, -0.3])
_COEF_SHIFTED = np.array([-1.35, 0.3, -0.3, -0.2, -0.6, 0.9, -0.6, 0.6, -0.5, 0.3, 1.0])

NULL_SHARE_TOTAL_CHARGES = 0.05
NULL_SHARE_REGION = 0.03
TRAIN_ROWS = 6000
FIRST_ID = 100_000


def _draw(rng: np.random.Generator, n_rows: int, mix: tuple[np.ndarray, np.ndarray], shift: float) -> np.ndarray:
    """Category codes drawn from ``mix`` moved by ``shift`` along its shift direction."""
    probs = np.clip(mix[0] + shift * mix[1], 0.01, None)
    return rng.choice(len(probs), size=n_rows, p=probs / probs.sum())


def _logit_terms(contract, plan, payment, age, tenure, monthly, support) -> np.ndarray:
    """Design matrix (n_rows x terms) of the churn model, on fixed scales so shifted data stays comparable."""
    t = (tenure - 24.0) / 20.0
    m = (monthly - 64.0) / 25.0
    s = support - 1.5
    m2m = (contract == 0).astype(float)
    return np.column_stack([
        np.ones_like(t),
        m2m,
        (contract == 2).astype(float),
        t,
        m,
        s,
        (payment == 0).astype(float),
        (age - 44.0) / 13.0,
        m2m * m,
        s * t,
        (plan == 2).astype(float),
    ])


def generate(
    n_rows: int,
    *,
    seed: int,
    covariate_shift: float = 0.0,
    concept_shift: float = 0.0,
    first_id: int = FIRST_ID,
) -> pd.DataFrame:
    """One churn data set of ``n_rows`` customers with ids ``first_id, first_id + 1, ...``.

    ``covariate_shift`` (0 = none, 1 = the demo's drift) moves numeric means and category mixes;
    ``concept_shift`` (0 = none, 1 = largely reversed effects) changes the feature-to-churn relationship.
    The same arguments give the same frame.

    Raises:
        ValueError: ``n_rows`` < 1 or a shift outside [0, 2].
    """
    if n_rows < 1:
        raise ValueError(f"n_rows must be >= 1, got {n_rows}")
    for name, value in (("covariate_shift", covariate_shift), ("concept_shift", concept_shift)):
        if not 0.0 <= value <= 2.0:
            raise ValueError(f"{name} must be within [0, 2], got {value}")
    rng = np.random.default_rng(seed)
    contract = _draw(rng, n_rows, _CONTRACT_MIX, covariate_shift)
    payment = _draw(rng, n_rows, _PAYMENT_MIX, covariate_shift)
    region = _draw(rng, n_rows, _REGION_MIX, covariate_shift)
    plan = _draw(rng, n_rows, _PLAN_MIX, covariate_shift)

    age = np.clip(np.rint(rng.normal(44.0 + 7.0 * covariate_shift, 13.0, n_rows)), 18, 90).astype(np.int64)
    mean_tenure = _MEAN_TENURE[contract] * (1.0 - 0.15 * covariate_shift)
    tenure = np.clip(np.rint(rng.gamma(2.0, mean_tenure / 2.0)), 0, 72).astype(np.int64)
    monthly = _PLAN_PRICE[plan] + rng.normal(12.0 * covariate_shift, 9.0, n_rows)
    monthly = np.round(np.clip(monthly, 18.0, 150.0), 2)
    total = np.round(monthly * np.maximum(tenure, 1) * rng.uniform(0.92, 1.04, n_rows), 2)
    total[rng.random(n_rows) < NULL_SHARE_TOTAL_CHARGES] = np.nan
    support = rng.poisson(1.1 + 0.7 * (plan == 0) + 0.5 * covariate_shift).astype(np.int64)

    coef = (1.0 - concept_shift) * _COEF + concept_shift * _COEF_SHIFTED
    logit = _logit_terms(contract, plan, payment, age, tenure, monthly, support) @ coef
    churned = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)

    region_names = np.array(REGIONS, dtype=object)[region]
    region_names[rng.random(n_rows) < NULL_SHARE_REGION] = None
    return pd.DataFrame({
        ID_COLUMN: np.arange(first_id, first_id + n_rows, dtype=np.int64),
        "age": age,
        "tenure_months": tenure,
        "monthly_charges": monthly,
        "total_charges": total,
        "support_calls": support,
        "contract": np.array(CONTRACTS, dtype=object)[contract],
        "payment_method": np.array(PAYMENT_METHODS, dtype=object)[payment],
        "region": region_names,
        "plan": np.array(PLANS, dtype=object)[plan],
        TARGET: churned,
    })


def write_demo(out: str | Path, *, seed: int = 0, rows: int = TRAIN_ROWS) -> dict[str, Path]:
    """Write ``train.parquet`` (``rows``), ``batch_stable.parquet`` (``rows // 3``, no shift) and
    ``batch_drifted.parquet`` (``2 * rows // 3``, covariate and concept shift 1.0) into ``out``.

    Customer ids continue from file to file. Returns {file name: path}.

    Raises:
        ValueError: ``rows`` < 3.
    """
    if rows < 3:
        raise ValueError(f"rows must be >= 3 so every file gets rows, got {rows}")
    out = Path(out)
    specs = (
        ("train.parquet", rows, seed, 0.0),
        ("batch_stable.parquet", rows // 3, seed + 1, 0.0),
        ("batch_drifted.parquet", 2 * rows // 3, seed + 2, 1.0),
    )
    paths, first_id = {}, FIRST_ID
    for name, n_rows, file_seed, shift in specs:
        df = generate(n_rows, seed=file_seed, covariate_shift=shift, concept_shift=shift, first_id=first_id)
        paths[name] = atomic_write_bytes(out / name, parquet_bytes(df))
        first_id += n_rows
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m data.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the three Parquet files into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training set; batches use seed+1, seed+2")
    parser.add_argument("--rows", type=int, default=TRAIN_ROWS, help="training rows; batches get rows/3 and 2*rows/3")
    args = parser.parse_args(argv)
    try:
        paths = write_demo(args.out, seed=args.seed, rows=args.rows)
    except ValueError as exc:
        parser.error(str(exc))
    for path in paths.values():
        print(f"wrote {path}", file=sys.stderr)  # stdout stays free for callers' own output (kfloop demo --json)


if __name__ == "__main__":
    main()
