"""Mergeable sketches of a table's columns (Apache DataSketches): what a reference profile stores of the training
data and what a drift check streams the current batch into, so both sides are summarised alike in memory that does
not grow with the rows.

Per numeric column: exact row, null and non-finite counts, min, max, mean and variance (Chan et al.'s parallel
merge), a KLL quantile sketch of the finite values (``SketchSettings.k``; every quantile within
:attr:`SketchSettings.rank_error` of its true rank, with 99% confidence), the distinct values with exact counts while
there are at most ``exact_values`` of them, and a seeded bottom-k sample (``sample_size`` values) for the stattests
that need raw values. Per categorical column: exact counts per category up to ``exact_values`` categories, then a
frequent-items sketch.

:func:`sketch_chunk` summarises one chunk (a pandas frame, a pyarrow Table or RecordBatch) and is pure: any engine
that maps chunks (one process reading Parquet row groups, Ray Data's ``map_batches``) calls it, and
:func:`merge_sketches` combines the partial results in any grouping. Serialised as JSON with each sketch's own
``serialize()`` bytes in base64 (no pickle)."""
from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from datasketches import frequent_items_error_type, frequent_strings_sketch, kll_doubles_sketch

from data.tables import non_numbers

SKETCH_FORMAT = 1
"""Version of the serialised layout; a reader refuses another."""
Kind = Literal["numeric", "categorical"]


@dataclass(kw_only=True, slots=True, frozen=True)
class SketchSettings:
    """How precisely each column is summarised."""

    k: int = 2000
    """KLL sketch size: a larger ``k`` gives a smaller rank error (see :attr:`rank_error`) and a larger sketch
    (about 48 KB per column at 2000, whatever the rows)."""
    exact_values: int = 10_000
    """Most distinct values a column keeps exactly (value -> count); more and a numeric column relies on its KLL
    sketch, a categorical one on its frequent-items sketch."""
    frequent_lg_k: int = 12
    """log2 of the frequent-items sketch's map size (categorical columns with more than ``exact_values``
    categories): a count's error is at most :attr:`frequency_error` of the rows."""
    sample_size: int = 10_000
    """Values in the seeded bottom-k sample of each numeric column (for stattests that need raw values)."""
    seed: int = 0
    """Seed of the sample keys (the same data and chunking give the same sketches)."""

    def __post_init__(self) -> None:
        for name, low, high in (("k", 8, 65_535), ("exact_values", 100, 10_000_000), ("frequent_lg_k", 3, 26),
                                ("sample_size", 100, 10_000_000), ("seed", 0, 2**63)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name}={value!r}: use an integer in [{low}, {high}]")

    @property
    def rank_error(self) -> float:
        """Normalised rank error of every quantile and CDF value at once (99% confidence), as DataSketches states
        it for ``k``: 0.19% at 2000, 1.65% at 200."""
        return kll_doubles_sketch.get_normalized_rank_error(self.k, True)

    @property
    def frequency_error(self) -> float:
        """Largest error of a category's count from the frequent-items sketch, as a share of the rows."""
        return frequent_strings_sketch.get_epsilon_for_lg_size(self.frequent_lg_k)

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class NumericSketch:
    """One numeric column's summary (see the module docstring); ``+`` merges two."""

    kind: Kind = "numeric"

    def __init__(self, settings: SketchSettings):
        self.settings = settings
        self.rows = self.nulls = self.nonfinite = self.count = 0
        self.min, self.max, self.mean, self.m2 = math.inf, -math.inf, 0.0, 0.0
        self.kll = kll_doubles_sketch(settings.k)
        self.values: np.ndarray | None = np.empty(0, dtype="float64")
        """Distinct finite values, sorted; None once there are more than ``exact_values``."""
        self.counts: np.ndarray | None = np.empty(0, dtype="int64")
        self.sample, self.keys = np.empty(0, dtype="float64"), np.empty(0, dtype="float64")

    @property
    def exact(self) -> bool:
        """Whether every finite value is kept (as distinct values and counts)."""
        return self.values is not None

    @property
    def missing(self) -> int:
        """Rows without a finite value (nulls, NaN and infinities: the drift check ignores them all)."""
        return self.nulls + self.nonfinite

    @property
    def std(self) -> float:
        """Population standard deviation of the finite values (as ``np.std``)."""
        return math.sqrt(self.m2 / self.count) if self.count else math.nan

    @property
    def rank_error(self) -> float:
        """Rank error of this column's CDF and quantiles: 0 when exact, else the KLL sketch's."""
        return 0.0 if self.exact or not self.kll.is_estimation_mode() else self.settings.rank_error

    def update(self, column: np.ndarray, keys: np.ndarray) -> None:
        """Add a chunk: ``column`` float64 with NaN for nulls; ``keys`` (uniform in [0, 1)) pick the sample."""
        finite, infinite = np.isfinite(column), int(np.isinf(column).sum())
        values = column[finite]
        self.rows, self.nonfinite = self.rows + len(column), self.nonfinite + infinite
        self.nulls += len(column) - len(values) - infinite
        if not len(values):
            return
        self._add_moments(len(values), float(values.min()), float(values.max()), float(values.mean()),
                          float(np.square(values - values.mean()).sum()))
        self.kll.update(values)
        if self.values is not None:
            distinct, counts = np.unique(values, return_counts=True)
            self._add_counts(distinct, counts)
        self._add_sample(values, keys[finite])

    def _add_moments(self, n_b: int, low: float, high: float, mean_b: float, m2_b: float) -> None:
        """Chan, Golub and LeVeque's pairwise update of count, mean and sum of squared deviations."""
        n_a = self.count
        n = n_a + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta * delta * n_a * n_b / n
        self.count, self.min, self.max = n, min(self.min, low), max(self.max, high)

    def _add_counts(self, distinct: np.ndarray, counts: np.ndarray) -> None:
        values, counts = _merge_counts(self.values, self.counts, distinct, counts)
        if len(values) > self.settings.exact_values:
            self.values = self.counts = None
        else:
            self.values, self.counts = values, counts

    def _add_sample(self, values: np.ndarray, keys: np.ndarray) -> None:
        self.sample, self.keys = _bottom_k(np.concatenate([self.sample, values]), np.concatenate([self.keys, keys]),
                                           self.settings.sample_size)

    def __add__(self, other: NumericSketch) -> NumericSketch:
        out = NumericSketch(self.settings)
        for part in (self, other):
            out.rows, out.nulls, out.nonfinite = out.rows + part.rows, out.nulls + part.nulls, \
                out.nonfinite + part.nonfinite
            if part.count:
                out._add_moments(part.count, part.min, part.max, part.mean, part.m2)
            out.kll.merge(part.kll)
            if out.values is not None:
                if part.values is None:
                    out.values = out.counts = None
                else:
                    out._add_counts(part.values, part.counts)
            out._add_sample(part.sample, part.keys)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rows": self.rows, "nulls": self.nulls, "nonfinite": self.nonfinite,
                "count": self.count, "min": _finite_or_none(self.min), "max": _finite_or_none(self.max),
                "mean": self.mean, "m2": self.m2, "kll": _b64(self.kll.serialize()),
                "values": None if self.values is None else _b64(self.values.astype("<f8").tobytes()),
                "counts": None if self.counts is None else _b64(self.counts.astype("<i8").tobytes()),
                "sample": _b64(self.sample.astype("<f8").tobytes()), "keys": _b64(self.keys.astype("<f8").tobytes())}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], settings: SketchSettings) -> NumericSketch:
        out = cls(settings)
        out.rows, out.nulls, out.nonfinite, out.count = data["rows"], data["nulls"], data["nonfinite"], data["count"]
        out.min = math.inf if data["min"] is None else data["min"]
        out.max = -math.inf if data["max"] is None else data["max"]
        out.mean, out.m2 = data["mean"], data["m2"]
        out.kll = kll_doubles_sketch.deserialize(_unb64(data["kll"]))
        out.values = None if data["values"] is None else np.frombuffer(_unb64(data["values"]), "<f8").copy()
        out.counts = None if data["counts"] is None else np.frombuffer(_unb64(data["counts"]), "<i8").copy()
        out.sample = np.frombuffer(_unb64(data["sample"]), "<f8").copy()
        out.keys = np.frombuffer(_unb64(data["keys"]), "<f8").copy()
        return out


class CategoricalSketch:
    """One categorical column's summary: exact counts per category (as text) up to ``exact_values`` categories,
    then a frequent-items sketch of every row; ``+`` merges two."""

    kind: Kind = "categorical"

    def __init__(self, settings: SketchSettings):
        self.settings = settings
        self.rows = self.nulls = 0
        self.values: np.ndarray | None = np.empty(0, dtype=object)
        """Categories (text), sorted; None once there are more than ``exact_values`` (then ``frequent``)."""
        self.counts: np.ndarray | None = np.empty(0, dtype="int64")
        self.frequent: frequent_strings_sketch | None = None

    @property
    def exact(self) -> bool:
        return self.values is not None

    @property
    def missing(self) -> int:
        return self.nulls

    @property
    def count(self) -> int:
        return self.rows - self.nulls

    @property
    def count_error(self) -> float:
        """Largest error of one category's count, as a share of the non-null rows (0 when exact)."""
        return 0.0 if self.exact else self.settings.frequency_error

    def update_counts(self, rows: int, nulls: int, categories: np.ndarray, counts: np.ndarray) -> None:
        """Add a chunk already counted: ``categories`` (text, distinct) occur ``counts`` times in its ``rows``."""
        self.rows, self.nulls = self.rows + rows, self.nulls + nulls
        keep = counts > 0
        self._add_counts(categories[keep], counts[keep])

    def _add_counts(self, categories: np.ndarray, counts: np.ndarray) -> None:
        if self.values is not None:
            values, merged = _merge_counts(self.values, self.counts, categories, counts)
            if len(values) <= self.settings.exact_values:
                self.values, self.counts = values, merged
                return
            self.frequent = frequent_strings_sketch(self.settings.frequent_lg_k)
            categories, counts = values, merged
            self.values = self.counts = None
        for category, count in zip(categories.tolist(), counts.tolist()):
            self.frequent.update(category, count)

    def category_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Categories and their counts: exact, or the frequent-items sketch's estimates of the categories it can
        tell (at least ``frequency_error`` of the rows; every rarer one is left out)."""
        if self.exact:
            return self.values, self.counts
        items = self.frequent.get_frequent_items(frequent_items_error_type.NO_FALSE_NEGATIVES)
        items.sort()
        return (np.array([item[0] for item in items], dtype=object),
                np.array([item[1] for item in items], dtype="int64"))

    def __add__(self, other: CategoricalSketch) -> CategoricalSketch:
        out = CategoricalSketch(self.settings)
        for part in (self, other):
            out.rows, out.nulls = out.rows + part.rows, out.nulls + part.nulls
            if part.exact:
                out._add_counts(part.values, part.counts)
            elif out.exact:
                values, counts = out.values, out.counts
                out.values = out.counts = None
                out.frequent = frequent_strings_sketch.deserialize(part.frequent.serialize())
                out._add_counts(values, counts)
            else:
                out.frequent.merge(part.frequent)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rows": self.rows, "nulls": self.nulls,
                "values": None if self.values is None else self.values.tolist(),
                "counts": None if self.counts is None else self.counts.tolist(),
                "frequent": None if self.frequent is None else _b64(self.frequent.serialize())}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], settings: SketchSettings) -> CategoricalSketch:
        out = cls(settings)
        out.rows, out.nulls = data["rows"], data["nulls"]
        out.values = None if data["values"] is None else np.array(data["values"], dtype=object)
        out.counts = None if data["counts"] is None else np.array(data["counts"], dtype="int64")
        out.frequent = None if data["frequent"] is None else frequent_strings_sketch.deserialize(
            _unb64(data["frequent"]))
        return out


ColumnSketch = NumericSketch | CategoricalSketch
_CLASSES = {"numeric": NumericSketch, "categorical": CategoricalSketch}


def new_sketch(kind: Kind, settings: SketchSettings) -> ColumnSketch:
    return _CLASSES[kind](settings)


def sketch_chunk(chunk: pd.DataFrame | pa.Table | pa.RecordBatch, kinds: Mapping[str, Kind], *,
                 settings: SketchSettings, chunk_index: int, label: str = "") -> dict[str, ColumnSketch]:
    """The sketches of one chunk's columns in ``kinds`` (name -> ``numeric`` | ``categorical``): a pure function of
    the chunk, its index (which seeds its sample keys) and the settings, so chunks can be sketched anywhere and
    merged with :func:`merge_sketches` in any order. Categorical columns are counted on dictionary codes (an Arrow
    dictionary or pandas Categorical as given, else encoded here) and only the distinct categories become text.

    Raises:
        ValueError: the chunk lacks a column, or a numeric column holds non-numbers (named with ``label``).
    """
    names = list(chunk.column_names if isinstance(chunk, (pa.Table, pa.RecordBatch)) else chunk.columns)
    missing = [name for name in kinds if name not in names]
    if missing:
        raise ValueError(f"the {label or 'given'} data lacks columns {missing}; its columns are {names}")
    rows = chunk.num_rows if isinstance(chunk, (pa.Table, pa.RecordBatch)) else len(chunk)
    keys = np.random.default_rng([settings.seed, chunk_index]).random(rows)
    out: dict[str, ColumnSketch] = {}
    for name, kind in kinds.items():
        column = chunk.column(name) if isinstance(chunk, (pa.Table, pa.RecordBatch)) else chunk[name]
        sketch = new_sketch(kind, settings)
        if kind == "numeric":
            sketch.update(numbers(column, name, label), keys)
        else:
            sketch.update_counts(rows, *_category_counts(column))
        out[name] = sketch
    return out


def merge_sketches(parts: Iterable[Mapping[str, ColumnSketch]]) -> dict[str, ColumnSketch]:
    """The column-wise merge of partial sketches (as :func:`sketch_chunk` returns); empty input gives ``{}``."""
    merged: dict[str, ColumnSketch] = {}
    for part in parts:
        merged = dict(part) if not merged else {name: merged[name] + sketch for name, sketch in part.items()}
    return merged


def sketch_table(chunks: Iterable[pd.DataFrame | pa.Table | pa.RecordBatch], kinds: Mapping[str, Kind], *,
                 settings: SketchSettings, label: str = "") -> dict[str, ColumnSketch]:
    """:func:`sketch_chunk` of every chunk, merged as they come (memory holds one chunk and the sketches)."""
    return merge_sketches(sketch_chunk(chunk, kinds, settings=settings, chunk_index=i, label=label)
                          for i, chunk in enumerate(chunks))


def sketch_from_dict(data: Mapping[str, Any], settings: SketchSettings) -> ColumnSketch:
    """Read a column sketch's ``to_dict()`` form.

    Raises:
        ValueError: an unknown kind or missing keys.
    """
    try:
        return _CLASSES[data["kind"]].from_dict(data, settings)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"malformed column sketch: {exc!r}") from exc


def numbers(column: pd.Series | pa.Array | pa.ChunkedArray, name: str, label: str = "") -> np.ndarray:
    """A numeric column as float64 (bools as 0/1, nulls as NaN, infinities kept).

    Raises:
        ValueError: the column holds non-numbers.
    """
    try:
        if isinstance(column, (pa.Array, pa.ChunkedArray)):
            return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)
        return column.to_numpy(dtype="float64", na_value=np.nan)
    except (TypeError, ValueError, pa.ArrowException) as err:
        values = column.to_pandas() if isinstance(column, (pa.Array, pa.ChunkedArray)) else column
        raise ValueError(f"numeric column {name!r} in the {label or 'given'} data holds non-numbers "
                         f"(e.g. {non_numbers(values)}): {err}") from err


def as_text(values: np.ndarray | pd.Index) -> np.ndarray:
    """Categories as text (objects), so a profile's JSON, a CSV chunk and a Parquet dictionary name them alike."""
    return pd.Series(values, dtype=object).astype(str).to_numpy(dtype=object)


def _category_counts(column: pd.Series | pa.Array | pa.ChunkedArray) -> tuple[int, np.ndarray, np.ndarray]:
    """Nulls, distinct categories (text) and their counts, counted on dictionary codes."""
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.unify_dictionaries().combine_chunks() if encoded.num_chunks else pa.array(
                [], pa.dictionary(pa.int32(), pa.string()))
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        categories = encoded.dictionary.to_pandas()
    else:
        if isinstance(column.dtype, pd.CategoricalDtype):
            codes, categories = column.cat.codes.to_numpy(), column.cat.categories
        else:
            codes, categories = pd.factorize(column, use_na_sentinel=True)
    present = codes >= 0
    counts = np.bincount(codes[present], minlength=len(categories)).astype("int64")
    text = as_text(categories)
    if len(set(text)) < len(text):  # e.g. 1 and "1" in one column: count them as one category, as text
        text, inverse = np.unique(text, return_inverse=True)
        counts = np.bincount(inverse, weights=counts, minlength=len(text)).astype("int64")
    return int((~present).sum()), text, counts


def _merge_counts(values_a: np.ndarray, counts_a: np.ndarray, values_b: np.ndarray,
                  counts_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values (sorted) and summed counts of two value -> count tables."""
    if not len(values_a):
        order = np.argsort(values_b, kind="stable")
        return values_b[order], counts_b[order].astype("int64")
    values, inverse = np.unique(np.concatenate([values_a, values_b]), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate([counts_a, counts_b]), minlength=len(values))
    return values, counts.astype("int64")


def _bottom_k(values: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` values with the smallest keys (a uniform sample that merges: bottom-k of bottom-k's)."""
    if len(keys) <= k:
        return values, keys
    keep = np.argpartition(keys, k - 1)[:k]
    return values[keep], keys[keep]


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)
