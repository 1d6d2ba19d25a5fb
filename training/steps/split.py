"""The split step: the seeded train/holdout split whose holdout sha256 pins the evaluation."""
from __future__ import annotations

from data.holdout import split_holdout, write_parquet
from data.settings import step_function
from data.tables import read_table
from training.progress import progress


@step_function
def split_step(*, dataset_uri: str, fraction: float, seed: int, train_out: str, holdout_out: str) -> str:
    """Split off the holdout; returns its sha256, which pins the evaluation."""
    train, holdout = split_holdout(read_table(dataset_uri), fraction=fraction, seed=seed)
    write_parquet(train, train_out)
    sha = write_parquet(holdout, holdout_out)
    progress(f"split: {len(train)} training rows, {len(holdout)} holdout rows (sha256 {sha[:12]})")
    return sha

