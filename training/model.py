"""The model directory every later step loads: safetensors weights, JSON preprocessing, the model module's
source (imported only after its sha256 is checked) and a JSON description; and the :class:`Predictor` that scores
raw rows with it. Nothing on this path unpickles."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from data.fileio import atomic_write_bytes, atomic_write_json
from training.config import ModelSpec
from training.features import FeatureTransform, encode_target
from training.model_code import ModelCode
from training.model_files import FEATURES_FILE, MODEL_FILE, MODULE_FILE, WEIGHTS_FILE, ModelCodeError
from training.threshold import predicted_index


def save_model_dir(model_dir: str | Path, *, model: torch.nn.Module, code: ModelCode, n_inputs: int,
                   n_outputs: int, transform: FeatureTransform, classes: list, target: str,
                   task: str = "classification", extra: dict[str, Any] | None = None) -> Path:
    """Write weights, preprocessing, a copy of the model module and the description; ``model.json`` goes last,
    so its presence means complete. ``classes`` is empty for regression (``extra`` then holds ``target_scale``)."""
    model_dir = Path(model_dir)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(model_dir / WEIGHTS_FILE, save(state))
    atomic_write_json(model_dir / FEATURES_FILE, transform.to_dict())
    atomic_write_bytes(model_dir / MODULE_FILE, code.source)
    desc = {"model": {**code.describe(), "n_inputs": n_inputs, "n_outputs": n_outputs}, "task": task,
            "classes": classes, "target": target, **(extra or {})}
    atomic_write_json(model_dir / MODEL_FILE, desc)
    return model_dir


class Predictor:
    """A trained model loaded from its directory; predicts from raw DataFrames."""

    def __init__(self, model: torch.nn.Module, transform: FeatureTransform, classes: list,
                 description: dict[str, Any]):
        self.model = model.eval()
        self.transform = transform
        self.classes = classes
        self.description = description
        self.task: str = description.get("task", "classification")
        """``classification`` (``classes`` holds the labels) or ``regression``."""
        self.threshold: float | None = description.get("decision_threshold")
        """Binary models: the positive class is predicted at or above this probability; ``None``: argmax."""

    @classmethod
    def load(cls, model_dir: str | Path, *, module_sha256: str | None = None) -> "Predictor":
        """Load a model directory written by :func:`save_model_dir`. Its module copy is imported only if its
        sha256 is the one ``model.json`` records and, when given, ``module_sha256`` (what the registry recorded).

        Raises:
            FileNotFoundError: the directory is incomplete (no ``model.json``).
            ModelCodeError: the module copy was modified (or ``model.json`` disagrees with ``module_sha256``),
                or it fails to import or build.
            ValueError: the weights file is not safetensors (e.g. a pickle); it is never unpickled.
        """
        model_dir = Path(model_dir)
        if not (model_dir / MODEL_FILE).is_file():
            raise FileNotFoundError(f"{model_dir}: not a complete kfloop model directory (no {MODEL_FILE})")
        desc = json.loads((model_dir / MODEL_FILE).read_text())
        recorded = desc["model"]
        if module_sha256 is not None and recorded["sha256"] != module_sha256:
            raise ModelCodeError(f"{model_dir / MODEL_FILE} records model module sha256 {recorded['sha256']}, but "
                                 f"{module_sha256} was registered; the model directory was modified after "
                                 "registration, so its code is not imported")
        spec = ModelSpec(module=recorded["module"], builder=recorded["builder"], params=recorded["params"])
        code = ModelCode.load(spec, path=model_dir / MODULE_FILE, expected_sha256=recorded["sha256"])
        model = code.build(recorded["n_inputs"], recorded["n_outputs"])
        try:
            weights = load_file(model_dir / WEIGHTS_FILE)
        except SafetensorError as exc:
            raise ValueError(f"{model_dir / WEIGHTS_FILE}: not a safetensors file ({exc}); kfloop never unpickles "
                             "weights: write them with save_model_dir") from None
        model.load_state_dict(weights)
        transform = FeatureTransform.from_dict(json.loads((model_dir / FEATURES_FILE).read_text()))
        return cls(model, transform, desc["classes"], desc)

    def outputs(self, df: pd.DataFrame) -> torch.Tensor:
        """The module's raw outputs for ``df``, float64, rows x ``n_outputs``."""
        with torch.inference_mode():
            return self.model(torch.from_numpy(self.transform.transform(df))).double()

    def predict_proba(self, df: pd.DataFrame) -> np.ndarray:
        """Class probabilities, rows x classes, float64 (classification)."""
        return torch.softmax(self.outputs(df), dim=1).numpy()

    def predict_values(self, df: pd.DataFrame) -> np.ndarray:
        """Predicted target values in the target's own units, float64 (regression: the standardised output
        scaled back with the training split's ``target_scale``)."""
        scale = self.description["target_scale"]
        return self.outputs(df)[:, 0].numpy() * scale["std"] + scale["mean"]

    def scored(self, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Labelled ``rows`` as :func:`training.gate.compute_metrics` takes them: class indices and probabilities,
        or (regression) true values and predicted values as one column.

        Raises:
            ValueError: the target column holds a label the model does not know.
        """
        truth = rows[self.description["target"]]
        if self.task == "regression":
            return truth.to_numpy(dtype="float64"), self.predict_values(rows)[:, None]
        return encode_target(truth, self.classes), self.predict_proba(rows)

    def labels(self, proba: np.ndarray) -> np.ndarray:
        """Predicted class label per row of ``proba``: the decision threshold applied (binary), else the most
        probable class."""
        return np.asarray(self.classes, dtype=object)[predicted_index(proba, self.threshold)]

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        """Predicted class label per row (see :meth:`labels`), or value per row for regression."""
        if self.task == "regression":
            return self.predict_values(df)
        return self.labels(self.predict_proba(df))
