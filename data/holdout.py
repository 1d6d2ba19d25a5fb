"""The train/holdout split: seeded, written deterministically, and pinned by the holdout file's sha256."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from data.fileio import atomic_write_bytes, file_digest, parquet_bytes

DEFAULT_HOLDOUT_FRACTION = 0.2
"""Share of the rows held out for the gate (the training pipeline's ``holdout_fraction``)."""
DEFAULT_SPLIT_SEED = 42
"""Seed of the split (the training pipeline's ``seed``)."""


def split_holdout(df: pd.DataFrame, *, fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seeded random split into (train, holdout) rows.

    Raises:
        ValueError: ``fraction`` is not in (0, 1) or leaves either side empty.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"holdout_fraction={fraction}: use a share in (0, 1), e.g. 0.2")
    n_holdout = int(round(len(df) * fraction))
    if n_holdout == 0 or n_holdout == len(df):
        raise ValueError(f"holdout_fraction={fraction} of {len(df)} rows leaves an empty side; use more rows")
    order = np.random.default_rng(seed).permutation(len(df))
    holdout = df.iloc[np.sort(order[:n_holdout])].reset_index(drop=True)
    train = df.iloc[np.sort(order[n_holdout:])].reset_index(drop=True)
    return train, holdout


def write_parquet(df: pd.DataFrame, path: str | Path) -> str:
    """Write ``df`` as Parquet atomically and return the file's sha256 (byte-stable for equal frames)."""
    atomic_write_bytes(path, parquet_bytes(df))
    return file_digest(path)


def verify_pinned(path: str | Path, sha256: str) -> None:
    """Check the holdout is the one the decision is pinned to.

    Raises:
        ValueError: the file's sha256 differs.
    """
    actual = file_digest(path)
    if actual != sha256:
        raise ValueError(f"{path}: holdout sha256 {actual} is not the pinned {sha256}; "
                         "challenger and champion must be scored on the same holdout")
