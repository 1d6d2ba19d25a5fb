"""The classifier, and the model directory every later step loads: safetensors weights, JSON preprocessing
and a JSON description. Nothing on this path unpickles."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from training.features import FeatureTransform
from training.fileio import atomic_write_bytes, atomic_write_json
from training.threshold import predicted_index

from training.model_files import FEATURES_FILE, MODEL_FILE, WEIGHTS_FILE


@dataclass(kw_only=True, slots=True)
class Architecture:
    """Shape of the MLP classifier."""

    n_inputs: int
    n_classes: int
    hidden: tuple[int, ...] = (64, 32)
    dropout: float = 0.0


class MLP(torch.nn.Module):
    """Feed-forward classifier returning logits."""

    def __init__(self, arch: Architecture):
        super().__init__()
        layers: list[torch.nn.Module] = []
        width = arch.n_inputs
        for h in arch.hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            if arch.dropout:
                layers.append(torch.nn.Dropout(arch.dropout))
            width = h
        layers.append(torch.nn.Linear(width, arch.n_classes))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def save_model_dir(model_dir: str | Path, *, model: MLP, arch: Architecture, transform: FeatureTransform,
                   classes: list, target: str, extra: dict[str, Any] | None = None) -> Path:
    """Write weights, preprocessing and description; ``model.json`` goes last, so its presence means complete."""
    model_dir = Path(model_dir)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(model_dir / WEIGHTS_FILE, save(state))
    atomic_write_json(model_dir / FEATURES_FILE, transform.to_dict())
    desc = {"architecture": {**asdict(arch), "hidden": list(arch.hidden)}, "classes": classes, "target": target,
            **(extra or {})}
    atomic_write_json(model_dir / MODEL_FILE, desc)
    return model_dir


class Predictor:
    """A trained model loaded from its directory; predicts from raw DataFrames."""

    def __init__(self, model: MLP, transform: FeatureTransform, classes: list, description: dict[str, Any]):
        self.model = model.eval()
        self.transform = transform
        self.classes = classes
        self.description = description
        self.threshold: float | None = description.get("decision_threshold")
        """Binary models: the positive class is predicted at or above this probability; ``None``: argmax."""

    @classmethod
    def load(cls, model_dir: str | Path) -> "Predictor":
        """Load a model directory written by :func:`save_model_dir`.

        Raises:
            FileNotFoundError: the directory is incomplete (no ``model.json``).
            ValueError: the weights file is not safetensors (e.g. a pickle); it is never unpickled.
        """
        model_dir = Path(model_dir)
        if not (model_dir / MODEL_FILE).is_file():
            raise FileNotFoundError(f"{model_dir}: not a complete kfloop model directory (no {MODEL_FILE})")
        desc = json.loads((model_dir / MODEL_FILE).read_text())
        arch = Architecture(**{**desc["architecture"], "hidden": tuple(desc["architecture"]["hidden"])})
        model = MLP(arch)
        try:
            weights = load_file(model_dir / WEIGHTS_FILE)
        except SafetensorError as exc:
            raise ValueError(f"{model_dir / WEIGHTS_FILE}: not a safetensors file ({exc}); kfloop never unpickles "
                             "weights: write them with save_model_dir") from None
        model.load_state_dict(weights)
        transform = FeatureTransform.from_dict(json.loads((model_dir / FEATURES_FILE).read_text()))
        return cls(model, transform, desc["classes"], desc)

    def predict_proba(self, df: pd.DataFrame) -> np.ndarray:
        """Class probabilities, rows x classes, float64."""
        with torch.inference_mode():
            logits = self.model(torch.from_numpy(self.transform.transform(df)))
            return torch.softmax(logits.double(), dim=1).numpy()

    def labels(self, proba: np.ndarray) -> np.ndarray:
        """Predicted class label per row of ``proba``: the decision threshold applied (binary), else the most
        probable class."""
        return np.asarray(self.classes, dtype=object)[predicted_index(proba, self.threshold)]

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        """Predicted class label per row (see :meth:`labels`)."""
        return self.labels(self.predict_proba(df))
