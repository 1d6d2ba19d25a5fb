"""Reference profiles: what a drift check needs of the champion's training data (and of the champion's predictions
on it), built in one streaming pass at registration and stored with the version, so a drift check reads only the
current batch.

Per column a mergeable sketch (:mod:`data.sketches`): exact counts, nulls, moments, a KLL quantile sketch for
numbers, counts per category (a frequent-items sketch past ``exact_values`` categories). The current batch is
streamed into the same sketches and the two compared with Evidently's stattests (:mod:`monitoring.sketch_drift`).
Stored as JSON, each sketch as its own ``serialize()`` bytes in base64 (no pickle)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

import numpy as np
import pandas as pd
import pandera.pandas as pa

from data.fileio import atomic_write_text
from data.sketches import ColumnSketch, SketchSettings, sketch_chunk, sketch_from_dict, merge_sketches
from data.tables import non_numbers, sketching_chunks
from data.validation import schema_roles

PROFILE_ARTIFACT = "reference_profile.json"
"""The profile's artifact name in the version's MLflow run."""
PROFILE_FORMAT = 2
"""Version of the JSON layout; a reader refuses another."""
PREDICTION_COLUMN = "prediction"
"""Column holding the champion's prediction (a class, or a number for regression), added to the data checked."""


@dataclass(kw_only=True, slots=True)
class ReferenceProfile:
    """The profile of one reference table: its columns' sketches (features, then ``prediction``)."""

    rows: int
    columns: dict[str, ColumnSketch]
    settings: SketchSettings = field(default_factory=SketchSettings)
    source: str = ""
    """The profiled data's URI (credentials removed)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (floats written exactly: JSON numbers round-trip through ``repr``)."""
        return {"format": PROFILE_FORMAT, "rows": self.rows, "source": self.source,
                "settings": self.settings.to_dict(),
                "columns": {name: column.to_dict() for name, column in self.columns.items()}}

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
            settings = SketchSettings(**data["settings"])
            return cls(rows=data["rows"], source=data["source"], settings=settings,
                       columns={name: sketch_from_dict(column, settings)
                                for name, column in data["columns"].items()})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed reference profile: {exc!r}") from exc

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
                                 f"(e.g. {non_numbers(series)}): {err}") from err
            out[name] = np.where(np.isfinite(values), values, np.nan)
        else:
            out[name] = series.astype(object).where(series.notna(), None).to_numpy()
    return pd.DataFrame(out, index=pd.RangeIndex(len(frame)))


def build_profile(chunks: Iterable[pd.DataFrame], kinds: dict[str, str], *,
                  predict: Callable[[pd.DataFrame], np.ndarray] | None = None, prediction_kind: str = "categorical",
                  settings: SketchSettings = SketchSettings(), source: str = "") -> ReferenceProfile:
    """The profile of the table given as ``chunks`` (one pass; memory holds a chunk and the sketches): the
    columns in ``kinds`` (name -> ``numeric`` | ``categorical``) and, with ``predict``, the champion's predictions
    on each chunk as column ``prediction`` of ``prediction_kind``.

    Raises:
        ValueError: no rows, a chunk lacks a column, or a numeric column holds non-numbers.
    """
    kinds = profiled_kinds(kinds, predict, prediction_kind)
    parts = (profile_chunk(chunk, kinds, predict=predict, settings=settings, chunk_index=i)
             for i, chunk in enumerate(chunks))
    return profile_of(merge_sketches(parts), settings=settings, source=source)


def profiled_kinds(kinds: dict[str, str], predict: Callable[[pd.DataFrame], np.ndarray] | None,
                   prediction_kind: str) -> dict[str, str]:
    """The columns a profile sketches: ``kinds``, then ``prediction`` when the champion predicts."""
    return dict(kinds) | ({PREDICTION_COLUMN: prediction_kind} if predict is not None else {})


def profile_chunk(chunk: pd.DataFrame, kinds: dict[str, str], *,
                  predict: Callable[[pd.DataFrame], np.ndarray] | None, settings: SketchSettings,
                  chunk_index: int) -> dict[str, ColumnSketch]:
    """One chunk of the reference sketched (:func:`profiled_kinds`, the champion scoring it first): what every
    engine runs per chunk before merging."""
    return sketch_chunk(with_predictions(chunk, predict, kinds), kinds, settings=settings, chunk_index=chunk_index,
                        label="reference")


def profile_of(columns: dict[str, ColumnSketch], *, settings: SketchSettings, source: str) -> ReferenceProfile:
    """The profile of the merged sketches of every chunk.

    Raises:
        ValueError: no rows.
    """
    rows = next(iter(columns.values())).rows if columns else 0
    if rows == 0:
        raise ValueError("the reference data has no rows: profile a non-empty table")
    return ReferenceProfile(rows=rows, columns=columns, settings=settings, source=source)


def with_predictions(chunk: pd.DataFrame, predict: Callable[[pd.DataFrame], np.ndarray] | None,
                     kinds: dict[str, str]) -> pd.DataFrame:
    """``chunk`` with the champion's predictions as column ``prediction`` (when ``predict`` is given), after
    checking it has the feature columns in ``kinds``.

    Raises:
        ValueError: the chunk lacks a feature column.
    """
    if predict is None:
        return chunk
    missing = [name for name in kinds if name != PREDICTION_COLUMN and name not in chunk.columns]
    if missing:
        raise ValueError(f"the data lacks columns {missing}; its columns are {list(chunk.columns)}")
    return chunk.assign(**{PREDICTION_COLUMN: np.asarray(predict(chunk))})


def prediction_kind(task: str) -> Literal["numeric", "categorical"]:
    """How the champion's predictions are compared: numbers for ``regression``, classes otherwise."""
    return "numeric" if task == "regression" else "categorical"


def profile_table(uri: str | Path, schema: pa.DataFrameSchema, *,
                  predict: Callable[[pd.DataFrame], np.ndarray] | None = None,
                  settings: SketchSettings = SketchSettings()) -> ReferenceProfile:
    """The profile of the table at ``uri`` (local or object storage; read once, in chunks): the schema's feature
    columns and, with ``predict``, the predictions (of the kind the schema's task gives).

    Raises:
        data.tables.DataFileError: the file is unusable or lacks a feature column.
        ValueError: as :func:`build_profile`.
    """
    columns = ProfiledColumns.of(schema)
    with sketching_chunks(uri, columns.text) as (chunks, source):
        return build_profile(chunks, columns.kinds, predict=predict, prediction_kind=columns.prediction_kind,
                             settings=settings, source=source.uri)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfiledColumns:
    """What a schema's profile sketches, whichever engine reads the table."""

    kinds: dict[str, str]
    """Feature column -> ``numeric`` | ``categorical``."""
    text: list[str]
    """Columns read as text (the categorical ones)."""
    prediction_kind: Literal["numeric", "categorical"]

    @classmethod
    def of(cls, schema: pa.DataFrameSchema) -> ProfiledColumns:
        roles = schema_roles(schema)
        return cls(kinds={c: "numeric" for c in roles.numeric} | {c: "categorical" for c in roles.categorical},
                   text=list(roles.categorical), prediction_kind=prediction_kind(roles.task))
