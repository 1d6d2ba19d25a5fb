"""A kfloop model module: a small MLP with SiLU activations and layer norm for a regression target.

kfloop calls ``build(n_inputs, n_outputs, **params)`` with its preprocessed features' width and, for regression,
``n_outputs == 1``; ``params`` come from ``model.params`` in kfloop.yaml (or ``--set model.params.width=64``).
The file is copied into every model version it trains and imported from that copy, so keep it self-contained:
import installed packages only.
"""
from __future__ import annotations

from torch import nn


def build(n_inputs: int, n_outputs: int, *, width: int = 32, depth: int = 2) -> nn.Module:
    """``depth`` hidden layers of ``width`` units, each Linear -> LayerNorm -> SiLU, then a linear head."""
    layers: list[nn.Module] = []
    size = n_inputs
    for _ in range(depth):
        layers += [nn.Linear(size, width), nn.LayerNorm(width), nn.SiLU()]
        size = width
    layers.append(nn.Linear(size, n_outputs))
    return nn.Sequential(*layers)
