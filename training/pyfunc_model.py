"""The MLflow pyfunc face of a kfloop model directory, logged as models-from-code (nothing pickled).

MLflow executes this file when the model is logged and again when it is loaded (``mlflow.pyfunc.load_model``);
``training.registry.versions.log_candidate`` passes its path as ``python_model`` and the model directory as the
``model_dir`` artifact. Do not import this module from other code: importing it registers the model object.
"""
from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd

MODEL_DIR_ARTIFACT = "model_dir"
"""Key of the kfloop model directory in the logged model's ``artifacts``."""


class KfloopPyfunc(mlflow.pyfunc.PythonModel):
    """Scores raw feature rows with :class:`training.model.Predictor` (the training preprocessing included)."""

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        """Load the model directory MLflow copied with the model (weights are safetensors, preprocessing JSON)."""
        from training.model import Predictor

        self.predictor = Predictor.load(context.artifacts[MODEL_DIR_ARTIFACT])

    def predict(self, context: mlflow.pyfunc.PythonModelContext, model_input: pd.DataFrame,
                params: dict | None = None) -> pd.DataFrame:
        """``prediction`` (the most probable class) and ``proba_<class>`` per class, one row per input row.

        Nulls and categories unseen in training are handled by the model's preprocessing; extra columns are
        ignored.
        """
        proba = self.predictor.predict_proba(model_input)
        classes = self.predictor.classes
        out = pd.DataFrame({f"proba_{c}": proba[:, j] for j, c in enumerate(classes)}, index=model_input.index)
        out.insert(0, "prediction", np.asarray(classes, dtype=object)[proba.argmax(axis=1)])
        return out


mlflow.models.set_model(KfloopPyfunc())
