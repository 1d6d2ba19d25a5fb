"""``drift.engine: ray``: a drift check whose data Ray Data reads and sketches on a Ray cluster (local or
``s3://``, Parquet or CSV, in blocks). Each block runs the single-process path's per-chunk code
(:func:`monitoring.drift.summarise_chunk`: the schema's rules, the champion's predictions and
:func:`data.sketches.sketch_chunk`; :func:`data.profiles.profile_chunk` for a reference given as a file); the
driver merges the partial summaries (:func:`data.sketches.merge_sketches`) and decides with the same code as the
local engine (:func:`monitoring.drift.check_drift_summarised`), so the verdicts are the local engine's."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import pandera.pandas as pa

from data.profiles import ReferenceProfile
from data.ray_blocks import dataset_columns, map_chunks, profile_dataset, read_dataset, ship_modules
from data.schema_rules import RuleSet
from data.sketches import SketchSettings
from data.tables import SKETCHING_LIMITS
from monitoring.drift import BatchSummary, DriftResult, Summarise, check_drift_summarised, summarise_chunk
from monitoring.drift_policy import DriftPolicy
from training.model_code import MODULE_PREFIX


def ship_model_code() -> None:
    """Let Ray carry the champion's model code to its workers by value: the module is imported from the model
    directory's source under a name no worker can import (:mod:`training.model_code`), so the ``predict`` handed to
    the blocks pickles its classes with it (cloudpickle's ``register_pickle_by_value``)."""
    ship_modules(MODULE_PREFIX)


class RayTable:
    """A table Ray Data reads (:func:`data.ray_blocks.read_dataset`): its columns, its profile, its drift."""

    def __init__(self, uri: str, *, text_columns: list[str] | None = None):
        self.uri = uri
        self.dataset = read_dataset(uri, text_columns=text_columns, limits=SKETCHING_LIMITS)
        self.columns = dataset_columns(self.dataset)

    def profile(self, kinds: dict[str, str], *, predict: Callable[[pd.DataFrame], np.ndarray] | None,
                prediction_kind: str, source: str) -> ReferenceProfile:
        """Its reference profile (:func:`data.ray_blocks.profile_dataset`, default sketch settings)."""
        ship_model_code()
        return profile_dataset(self.dataset, kinds, predict=predict, prediction_kind=prediction_kind,
                               settings=SketchSettings(), source=source)

    def summarise(self, settings: SketchSettings) -> Summarise:
        """The current batch's :class:`monitoring.drift.BatchSummary`, each chunk summarised on the cluster."""
        ship_model_code()

        def summarise(kinds: dict[str, str], rules: RuleSet | None,
                      predict: Callable[[pd.DataFrame], np.ndarray] | None) -> BatchSummary:
            def chunk_summary(chunk: pd.DataFrame, seed: int) -> dict:
                return summarise_chunk(chunk, kinds, settings=settings, chunk_index=seed, rules=rules,
                                       predict=predict).to_dict()

            return BatchSummary.merge(BatchSummary.from_dict(part, settings)
                                      for part in map_chunks(self.dataset, chunk_summary))

        return summarise

    def drift(self, profile: ReferenceProfile, *, numeric: list[str], categorical: list[str], policy: DriftPolicy,
              report_path: str | None, schema: pa.DataFrameSchema | None,
              predict: Callable[[pd.DataFrame], np.ndarray] | None) -> DriftResult:
        """:func:`monitoring.drift.check_drift_profile` of this table as the current batch."""
        return check_drift_summarised(profile, self.columns, self.summarise(profile.settings), numeric=numeric,
                                      categorical=categorical, policy=policy, report_path=report_path,
                                      schema=schema, predict=predict)
