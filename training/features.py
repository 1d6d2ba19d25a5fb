"""The one preprocessing of kfloop: fitted on the training split, saved as JSON, applied in training,
evaluation and serving alike."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd


@dataclass(kw_only=True, slots=True)
class NumericStats:
    """What a numeric column needs at transform time."""

    median: float
    """Fills nulls (a missing-value indicator column records where it did)."""
    mean: float
    std: float
    """Scale after filling; 1.0 for a constant column."""


@dataclass(kw_only=True, slots=True)
class FeatureTransform:
    """Numeric columns: median fill, standardise, plus a null indicator. Categorical columns: one-hot over the
    training vocabulary, with slot 0 for null or a category never seen in training."""

    numeric: dict[str, NumericStats] = field(default_factory=dict)
    categorical: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def fit(cls, df: pd.DataFrame, *, numeric: list[str], categorical: list[str]) -> "FeatureTransform":
        """Fit on the training split only.

        Raises:
            ValueError: a column is missing from ``df`` or there are no feature columns.
        """
        missing = [c for c in [*numeric, *categorical] if c not in df.columns]
        if missing:
            raise ValueError(f"feature columns {missing} are not in the data; columns are {list(df.columns)}")
        if not numeric and not categorical:
            raise ValueError("no feature columns: the schema must declare at least one non-target column")
        stats = {}
        for col in numeric:
            values = pd.to_numeric(df[col], errors="coerce").astype("float64")
            median = float(values.median()) if values.notna().any() else 0.0
            filled = values.fillna(median)
            std = float(filled.std(ddof=0))
            stats[col] = NumericStats(median=median, mean=float(filled.mean()), std=std if std > 0 else 1.0)
        vocab = {col: sorted(df[col].dropna().astype(str).unique().tolist()) for col in categorical}
        return cls(numeric=stats, categorical=vocab)

    @property
    def n_outputs(self) -> int:
        """Width of the transformed matrix."""
        return 2 * len(self.numeric) + sum(len(v) + 1 for v in self.categorical.values())

    def transform(self, df: pd.DataFrame) -> np.ndarray:
        """Raw rows to a float32 matrix; extra columns are ignored.

        Raises:
            ValueError: a feature column is missing.
        """
        missing = [c for c in [*self.numeric, *self.categorical] if c not in df.columns]
        if missing:
            raise ValueError(f"feature columns {missing} are missing from the input")
        out = np.zeros((len(df), self.n_outputs), dtype=np.float32)
        j = 0
        for col, s in self.numeric.items():
            values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
            isnull = np.isnan(values)
            out[:, j] = (np.where(isnull, s.median, values) - s.mean) / s.std
            out[:, j + 1] = isnull
            j += 2
        for col, vocab in self.categorical.items():
            codes = pd.Categorical(df[col].astype("string"), categories=vocab).codes + 1  # -1 (null/unseen) -> 0
            out[np.arange(len(df)), j + codes] = 1.0
            j += len(vocab) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (see :meth:`from_dict`); columns are lists because their order is the matrix layout."""
        return {"numeric": [{"column": c, **asdict(s)} for c, s in self.numeric.items()],
                "categorical": [{"column": c, "vocabulary": v} for c, v in self.categorical.items()]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FeatureTransform":
        """Inverse of :meth:`to_dict`."""
        return cls(numeric={s["column"]: NumericStats(median=s["median"], mean=s["mean"], std=s["std"])
                            for s in d["numeric"]},
                   categorical={c["column"]: list(c["vocabulary"]) for c in d["categorical"]})


def target_classes(labels: pd.Series) -> list:
    """Sorted distinct labels as JSON-ready Python values.

    Raises:
        ValueError: fewer than two classes, or null labels.
    """
    if labels.isna().any():
        raise ValueError(f"target '{labels.name}' has {int(labels.isna().sum())} null label(s); drop or fill them")
    classes = sorted(labels.unique().tolist())
    if len(classes) < 2:
        raise ValueError(f"target '{labels.name}' has a single class {classes}: a classifier needs at least two")
    return [c.item() if isinstance(c, np.generic) else c for c in classes]


def encode_target(labels: pd.Series, classes: list) -> np.ndarray:
    """Labels to class indices (int64).

    Raises:
        ValueError: a label is not one of ``classes``.
    """
    index = {c: i for i, c in enumerate(classes)}
    codes = labels.map(index)
    if codes.isna().any():
        unknown = sorted(set(labels[codes.isna()].tolist()), key=str)[:5]
        raise ValueError(f"target '{labels.name}' has labels {unknown} the model does not know; classes are {classes}")
    return codes.to_numpy(dtype=np.int64)
