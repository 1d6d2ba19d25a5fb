"""Reference profiles: what a drift check needs of the champion's training data (and of the champion's predictions
on it), computed in one streaming pass at registration and stored with the version as JSON, so a drift check
reads only the current batch.

Per column: rows, nulls, and the non-null values either exactly, as distinct values with their counts (when there
are at most ``ProfileSettings.exact_values`` of them: categories, whole numbers, small tables), or, for a numeric
column with more distinct values, as a seeded uniform sample of ``sample_size`` values plus the exact mean and
standard deviation. Exact columns give every Evidently stattest exactly the full reference's verdict; sampled
columns give Wasserstein (Evidently's choice for large numeric references) with the exact normalisation and the
full reference size, within the sampling error (see :mod:`monitoring.drift`)."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

import numpy as np
import pandas as pd
import pandera.pandas as pa

from data.fileio import atomic_write_text
from data.tables import table_chunks
from data.validation import schema_roles

PROFILE_ARTIFACT = "reference_profile.json"
"""The profile's artifact name in the version's MLflow run."""
PROFILE_FORMAT = 1
"""Version of the JSON layout; a reader refuses another."""
PREDICTION_COLUMN = "prediction"
"""Column holding the champion's prediction (a class, or a number for regression), added to the data checked."""
QUANTILE_LEVELS = np.linspace(0, 1, 101)
"""Percentiles stored per numeric column (for reports)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ProfileSettings:
    """How much of each column a reference profile keeps."""

    exact_values: int = 100_000
    """Most distinct values a column keeps exactly (values and counts); a numeric column with more is sampled."""
    sample_size: int = 100_000
    """Values in the seeded uniform sample kept of a column with more than ``exact_values`` distinct values."""
    seed: int = 0
    """Seed of the sample (the same data and chunking give the same profile)."""

    def __post_init__(self) -> None:
        for name, low in (("exact_values", 1000), ("sample_size", 1000), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r}: use an integer >= {low}")


@dataclass(kw_only=True, slots=True, frozen=True)
class ColumnProfile:
    """One column of the reference, as the drift check needs it."""

    kind: Literal["numeric", "categorical"]
    rows: int
    """Rows of the reference (nulls included)."""
    nulls: int
    """Missing values (for numbers: NaN and non-finite)."""
    values: list[Any] | None
    """Distinct non-null values, sorted (numbers as floats, categories as text); None when sampled."""
    counts: list[int] | None
    """How often each of ``values`` occurs; None when sampled."""
    sample: list[Any] | None = None
    """A seeded uniform sample of the non-null values, when there are too many distinct ones to keep."""
    mean: float | None = None
    """Mean of the non-null values (numeric columns with values)."""
    std: float | None = None
    """Population standard deviation of the non-null values, as ``np.std``."""
    quantiles: list[float] | None = None
    """The non-null values' percentiles at :data:`QUANTILE_LEVELS` (from the sample when sampled)."""

    @property
    def exact(self) -> bool:
        """Whether every non-null value is kept (as values and counts)."""
        return self.values is not None

    @property
    def present(self) -> int:
        """Non-null values in the reference."""
        return self.rows - self.nulls

    def non_null(self) -> np.ndarray:
        """Every non-null value (sorted) when exact, else the sample: float64 for numbers, objects for categories."""
        dtype = "float64" if self.kind == "numeric" else object
        if self.exact:
            return np.repeat(np.asarray(self.values, dtype=dtype), np.asarray(self.counts, dtype="int64"))
        return np.asarray(self.sample, dtype=dtype)


@dataclass(kw_only=True, slots=True, frozen=True)
class ReferenceProfile:
    """The profile of one reference table: its columns' profiles (features, then ``prediction``)."""

    rows: int
    columns: dict[str, ColumnProfile]
    settings: ProfileSettings = field(default_factory=ProfileSettings)
    source: str = ""
    """The profiled data's URI (credentials removed)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (floats written exactly: JSON numbers round-trip through ``repr``)."""
        return {"format": PROFILE_FORMAT, "rows": self.rows, "source": self.source,
                "settings": asdict(self.settings),
                "columns": {name: asdict(column) for name, column in self.columns.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReferenceProfile:
        """Read :meth:`to_dict`'s form.

        Raises:
            ValueError: another format version, or missing keys.
        """
        if data.get("format") != PROFILE_FORMAT:
            raise ValueError(f"reference profile format {data.get('format')!r} is not {PROFILE_FORMAT}: rebuild the "
                             "profile with this kfloop (kfloop registers one with every version)")
        try:
            return cls(rows=data["rows"], source=data["source"], settings=ProfileSettings(**data["settings"]),
                       columns={name: ColumnProfile(**column) for name, column in data["columns"].items()})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed reference profile: {exc}") from exc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> ReferenceProfile:
        return cls.from_dict(json.loads(text))

    def write(self, path: str | Path) -> Path:
        """Write the JSON atomically (never a half-written file)."""
        return atomic_write_text(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> ReferenceProfile:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def normalised_columns(frame: pd.DataFrame, kinds: dict[str, str], label: str) -> pd.DataFrame:
    """Numeric columns as float64 with NaN for missing and non-finite values (Evidently cannot take bools);
    categorical columns as objects with None for missing.

    Raises:
        ValueError: a numeric column holds non-numbers.
    """
    out = {}
    for name, kind in kinds.items():
        series = frame[name]
        if kind == "numeric":
            try:
                values = series.to_numpy(dtype="float64", na_value=np.nan)
            except (TypeError, ValueError) as err:
                raise ValueError(f"numeric column {name!r} in the {label} data holds non-numbers "
                                 f"(e.g. {series.dropna().head(3).tolist()}): {err}") from err
            out[name] = np.where(np.isfinite(values), values, np.nan)
        else:
            out[name] = series.astype(object).where(series.notna(), None).to_numpy()
    return pd.DataFrame(out, index=pd.RangeIndex(len(frame)))


def as_text(values: np.ndarray) -> np.ndarray:
    """Non-null categories as text (objects), so a profile's JSON and a CSV chunk name them alike."""
    return pd.Series(values, dtype=object).astype(str).to_numpy(dtype=object)


class _ColumnState:
    """One column's running profile: counts, exact distinct counts until there are too many, a bottom-k sample."""

    def __init__(self, kind: str, settings: ProfileSettings):
        self.kind, self.settings = kind, settings
        self.rows = self.nulls = 0
        self.counts: pd.Series | None = pd.Series(dtype="int64")
        self.sample, self.keys = np.empty(0, dtype="float64" if kind == "numeric" else object), np.empty(0)
        self.mean = self.m2 = 0.0

    def add(self, values: np.ndarray, keys: np.ndarray) -> None:
        present = ~pd.isna(values)
        self.rows += len(values)
        self.nulls += int(len(values) - present.sum())
        values, keys = values[present], keys[present]
        if not len(values):
            return
        if self.kind == "numeric":
            self._moments(values)
        else:
            values = as_text(values)
        if self.counts is not None:
            self.counts = self.counts.add(pd.Series(values).value_counts(), fill_value=0)
            if len(self.counts) > self.settings.exact_values:
                self.counts = None
        self.sample, self.keys = np.concatenate([self.sample, values]), np.concatenate([self.keys, keys])
        k = self.settings.sample_size
        if len(self.keys) > k:
            keep = np.argpartition(self.keys, k - 1)[:k]
            self.sample, self.keys = self.sample[keep], self.keys[keep]

    def _moments(self, values: np.ndarray) -> None:
        """Chan et al.'s merge of count, mean and sum of squared deviations."""
        n_a, n_b = self.rows - self.nulls - len(values), len(values)
        mean_b = float(values.mean())
        m2_b = float(np.square(values - mean_b).sum())
        delta, n = mean_b - self.mean, n_a + n_b
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta * delta * n_a * n_b / n

    def profile(self) -> ColumnProfile:
        numeric = self.kind == "numeric"
        values = counts = sample = None
        if self.counts is not None:
            ordered = self.counts.sort_index()
            values = [float(v) if numeric else str(v) for v in ordered.index]
            counts = [int(c) for c in ordered.to_numpy()]
        else:
            order = np.argsort(self.keys, kind="stable")
            sample = [float(v) if numeric else str(v) for v in self.sample[order]]
        column = ColumnProfile(kind=self.kind, rows=self.rows, nulls=self.nulls, values=values, counts=counts,
                               sample=sample)
        if not numeric or column.present == 0:
            return column
        kept = column.non_null()
        std = float(np.std(kept)) if column.exact else math.sqrt(self.m2 / column.present)
        mean = float(np.mean(kept)) if column.exact else self.mean
        quantiles = [float(q) for q in np.quantile(kept, QUANTILE_LEVELS)]
        return ColumnProfile(kind=self.kind, rows=self.rows, nulls=self.nulls, values=values, counts=counts,
                             sample=sample, mean=mean, std=std, quantiles=quantiles)


def build_profile(chunks: Iterable[pd.DataFrame], kinds: dict[str, str], *,
                  predict: Callable[[pd.DataFrame], np.ndarray] | None = None, prediction_kind: str = "categorical",
                  settings: ProfileSettings = ProfileSettings(), source: str = "") -> ReferenceProfile:
    """The profile of the table given as ``chunks`` (one pass; memory bounded by a chunk and the kept values):
    the columns in ``kinds`` (name -> ``numeric`` | ``categorical``) and, with ``predict``, the champion's
    predictions on each chunk as column ``prediction`` of ``prediction_kind``.

    Raises:
        ValueError: no rows, a chunk lacks a column, or a numeric column holds non-numbers.
    """
    kinds = dict(kinds) | ({PREDICTION_COLUMN: prediction_kind} if predict is not None else {})
    states = {name: _ColumnState(kind, settings) for name, kind in kinds.items()}
    rng = np.random.default_rng(settings.seed)
    rows = 0
    for chunk in chunks:
        missing = [name for name in kinds if name != PREDICTION_COLUMN and name not in chunk.columns]
        if missing:
            raise ValueError(f"the reference data lacks columns {missing}; its columns are {list(chunk.columns)}")
        if predict is not None:
            chunk = chunk.assign(**{PREDICTION_COLUMN: np.asarray(predict(chunk))})
        frame = normalised_columns(chunk, kinds, "reference")
        keys = rng.random(len(frame))
        for name, state in states.items():
            state.add(frame[name].to_numpy(), keys)
        rows += len(frame)
    if rows == 0:
        raise ValueError("the reference data has no rows: profile a non-empty table")
    return ReferenceProfile(rows=rows, columns={name: state.profile() for name, state in states.items()},
                            settings=settings, source=source)


def prediction_kind(task: str) -> Literal["numeric", "categorical"]:
    """How the champion's predictions are compared: numbers for ``regression``, classes otherwise."""
    return "numeric" if task == "regression" else "categorical"


def profile_table(uri: str | Path, schema: pa.DataFrameSchema, *,
                  predict: Callable[[pd.DataFrame], np.ndarray] | None = None,
                  settings: ProfileSettings = ProfileSettings()) -> ReferenceProfile:
    """The profile of the table at ``uri`` (local or object storage; read once, in chunks): the schema's feature
    columns and, with ``predict``, the predictions (of the kind the schema's task gives).

    Raises:
        data.tables.DataFileError: the file is unusable or lacks a feature column.
        ValueError: as :func:`build_profile`.
    """
    roles = schema_roles(schema)
    kinds = {c: "numeric" for c in roles.numeric} | {c: "categorical" for c in roles.categorical}
    with table_chunks(uri, text_columns=roles.categorical) as (chunks, source):
        return build_profile(chunks, kinds, predict=predict, prediction_kind=prediction_kind(roles.task),
                             settings=settings, source=source.uri)
