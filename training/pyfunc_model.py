"""The MLflow pyfunc face of a kfloop model directory, logged as models-from-code (nothing pickled).

MLflow executes this file when the model is logged and again when it is loaded (``mlflow.pyfunc.load_model``);
``training.registry.candidates.log_candidate`` passes its path as ``python_model``, the model directory (the model
module's source included) as the ``model_dir`` artifact, that source's sha256 in the ``model_config`` and the
version's schema as the ``schema`` artifact. Serve registered versions with
:func:`training.registry.verified.load_verified`: it checks every file of the version (this one included) against the
registry before MLflow executes any of them; the sha256 check in :meth:`KfloopPyfunc.load_context` reads the same
``MLmodel`` and so catches a mismatched copy, not tampering. Do not import this module from other code: importing it
registers the model object.
"""
from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd

from data.schema_rules import RuleSet, apply_violation_mode, check_mode, check_rows
from data.validation import load_schema
from training.features import dictionary_encoded
from training.model import Predictor
from training.model_files import MODULE_SHA256_KEY, ModelCodeError

MODEL_DIR_ARTIFACT = "model_dir"
"""Key of the kfloop model directory in the logged model's ``artifacts``."""
SCHEMA_ARTIFACT = "schema"
"""Key of the version's pandera schema YAML in the logged model's ``artifacts`` (models logged before it carry
none and are served unchecked)."""


class KfloopPyfunc(mlflow.pyfunc.PythonModel):
    """Scores raw feature rows with :class:`training.model.Predictor` (the training preprocessing included)."""

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        """Load the model directory MLflow copied with the model (weights are safetensors, preprocessing JSON); its
        model module is imported only if its sha256 is the one logged in the ``model_config`` (a consistency check:
        tampering is :func:`training.registry.verified.load_verified`'s to refuse).

        Raises:
            training.model_files.ModelCodeError: the logged module copy was modified.
        """
        recorded = (context.model_config or {}).get(MODULE_SHA256_KEY)
        if not recorded:
            raise ModelCodeError(f"this model was logged without {MODULE_SHA256_KEY} in its model_config; its code "
                                 "cannot be verified, so it is not imported: log it with kfloop's log_candidate()")
        self.predictor = Predictor.load(context.artifacts[MODEL_DIR_ARTIFACT], module_sha256=recorded)
        schema = context.artifacts.get(SCHEMA_ARTIFACT)
        self.features = [*self.predictor.transform.numeric, *self.predictor.transform.categorical]
        self.schema_rules = RuleSet(load_schema(Path(schema)), self.features) if schema else None

    def predict(self, context: mlflow.pyfunc.PythonModelContext, model_input: pd.DataFrame,
                params: dict | None = None) -> pd.DataFrame:
        """``prediction`` (the model's decision threshold applied, else the most probable class) and
        ``proba_<class>`` per class, or for regression the numeric ``prediction`` alone, one row per input row, plus
        ``schema_violations`` (see :mod:`data.schema_rules`) as ``params["on_schema_violation"]`` asks: ``flag``
        (default), ``error`` or ``ignore``.

        Raises:
            ValueError: an unknown mode.
            data.schema_rules.SchemaViolationError: more rows than serving's ``max_rows``
                (:class:`data.schema_rules.ServingLimits`), checked before anything is scored; or ``error`` mode
                and a column or row outside the schema.

        Nulls and categories unseen in training are handled by the model's preprocessing, and so is a missing
        feature column (as nulls); the check flags it on every row (``error``: names it), and so a column the schema
        does not know, which the model ignores. The text feature columns are dictionary-encoded once
        (:func:`training.features.dictionary_encoded`), for the model and the check alike.
        """
        mode = check_mode(params)
        check_rows(len(model_input))
        model_input = dictionary_encoded(model_input, list(self.predictor.transform.categorical))
        missing = [name for name in self.features if name not in model_input.columns]
        rows = model_input.assign(**dict.fromkeys(missing)) if missing else model_input
        if self.predictor.task == "regression":
            out = pd.DataFrame({"prediction": self.predictor.predict_values(rows)}, index=model_input.index)
        else:
            proba = self.predictor.predict_proba(rows)
            out = pd.DataFrame({f"proba_{c}": proba[:, j] for j, c in enumerate(self.predictor.classes)},
                               index=model_input.index)
            out.insert(0, "prediction", self.predictor.labels(proba))
        if self.schema_rules is None:
            return out
        return apply_violation_mode(self.schema_rules, model_input, out, mode, required=self.features)


mlflow.models.set_model(KfloopPyfunc())
