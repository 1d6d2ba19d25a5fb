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
        """Fit on the training split only (one chunk of :class:`FeatureFit`).

        Raises:
            ValueError: a column is missing from ``df`` or there are no feature columns.
        """
        return FeatureFit(numeric=numeric, categorical=categorical).update(df.reset_index(drop=True)).result()

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
        rows = np.arange(len(df))
        for col, vocab in self.categorical.items():
            out[rows, j + vocabulary_codes(df[col], vocab) + 1] = 1.0  # -1 (null/unseen) -> slot 0
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


def vocabulary_codes(column: pd.Series, vocabulary: list[str]) -> np.ndarray:
    """Each value's position in ``vocabulary`` (values compared as text), -1 for a null or a value not in it. A
    pandas Categorical (a Parquet dictionary column) is looked up once per category, not once per row."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        lookup = pd.Index(vocabulary).get_indexer(column.cat.categories.astype("string"))
        codes = column.cat.codes.to_numpy()
        return np.where(codes >= 0, np.append(lookup, -1)[codes], -1)
    return pd.Categorical(column.astype("string"), categories=vocabulary).codes


def dictionary_encoded(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``df`` with each of ``columns`` that holds Python strings and nulls (object dtype) as a pandas Categorical of
    the same values: hashed once per row here, so :func:`vocabulary_codes` and the schema check
    (:mod:`data.schema_rules`) then work once per category. A column holding anything else (numbers, lists) stays as
    it is, so each consumer sees those values unchanged."""
    encoded = {}
    for name in columns:
        if name in df.columns and df[name].dtype == object:
            try:
                codes, categories = pd.factorize(df[name].to_numpy())
            except TypeError:  # an unhashable value
                continue
            if all(isinstance(value, str) for value in categories):
                encoded[name] = pd.Categorical.from_codes(codes, categories, validate=False)
    if not encoded:
        return df
    out = df.copy(deep=False)
    for name, values in encoded.items():
        out[name] = values
    return out


MEDIAN_SAMPLE = 100_000
"""Values per numeric column kept to estimate its median while fitting in one pass: the median is exact up to this
many non-null values, and within about 0.4% of a standard deviation (one standard error) beyond."""


class FeatureFit:
    """:meth:`FeatureTransform.fit` in one pass over chunks of the training rows, in memory bounded by
    :data:`MEDIAN_SAMPLE` per numeric column plus the categories.

    Means and variances are merged chunk by chunk (Chan et al.), so they are exact up to float rounding; the
    median comes from the values of the :data:`MEDIAN_SAMPLE` rows with the smallest hash of their row number, a
    sample that does not depend on how the rows are chunked. A chunk's index must hold its rows' numbers.
    """

    def __init__(self, *, numeric: list[str], categorical: list[str]):
        if not numeric and not categorical:
            raise ValueError("no feature columns: the schema must declare at least one non-target column")
        self.numeric, self.categorical = list(numeric), list(categorical)
        self._moments = {col: np.zeros(3) for col in numeric}  # non-null count, mean, sum of squared deviations
        self._nulls = dict.fromkeys(numeric, 0)
        self._sample = {col: (np.empty(0, dtype=np.uint64), np.empty(0)) for col in numeric}  # (keys, values)
        self._vocab: dict[str, set[str]] = {col: set() for col in categorical}

    def update(self, chunk: pd.DataFrame) -> "FeatureFit":
        """Add the rows of ``chunk``.

        Raises:
            ValueError: a feature column is missing from ``chunk``.
        """
        missing = [c for c in [*self.numeric, *self.categorical] if c not in chunk.columns]
        if missing:
            raise ValueError(f"feature columns {missing} are not in the data; columns are {list(chunk.columns)}")
        keys = pd.util.hash_array(chunk.index.to_numpy(dtype=np.uint64))
        for col in self.numeric:
            values = pd.to_numeric(chunk[col], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
            present = ~np.isnan(values)
            self._nulls[col] += int((~present).sum())
            values = values[present]
            if len(values):
                self._moments[col] = _merge_moments(self._moments[col], values)
                kept_keys, kept = self._sample[col]
                kept_keys, kept = np.concatenate([kept_keys, keys[present]]), np.concatenate([kept, values])
                if len(kept) > MEDIAN_SAMPLE:
                    smallest = np.argpartition(kept_keys, MEDIAN_SAMPLE - 1)[:MEDIAN_SAMPLE]
                    kept_keys, kept = kept_keys[smallest], kept[smallest]
                self._sample[col] = (kept_keys, kept)
        for col in self.categorical:
            self._vocab[col].update(chunk[col].dropna().astype(str).unique().tolist())
        return self

    def result(self) -> FeatureTransform:
        """The fitted transform: median fill, then mean and standard deviation of the filled values."""
        stats = {}
        for col in self.numeric:
            n, mean, m2 = self._moments[col]
            median = float(np.median(self._sample[col][1])) if n else 0.0
            nulls = self._nulls[col]
            total = n + nulls
            filled_mean = (n * mean + nulls * median) / total if total else 0.0
            filled_m2 = m2 + n * (mean - filled_mean) ** 2 + nulls * (median - filled_mean) ** 2
            std = float(np.sqrt(filled_m2 / total)) if total else 0.0
            stats[col] = NumericStats(median=median, mean=float(filled_mean), std=std if std > 0 else 1.0)
        return FeatureTransform(numeric=stats, categorical={col: sorted(self._vocab[col]) for col in self.categorical})


def _merge_moments(moments: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(count, mean, M2) of the values behind ``moments`` and ``values`` together."""
    n_a, mean_a, m2_a = moments
    n_b, mean_b = len(values), float(values.mean())
    m2_b = float(((values - mean_b) ** 2).sum())
    n = n_a + n_b
    delta = mean_b - mean_a
    return np.array([n, mean_a + delta * n_b / n, m2_a + m2_b + delta * delta * n_a * n_b / n])


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
