"""A kfloop model module: a residual MLP for a multi-class target, with its own loss (label smoothing).

kfloop calls ``build(n_inputs, n_outputs, **params)`` (``n_outputs`` = number of classes; the module returns
logits) and, when the module defines it, ``loss(outputs, targets)`` instead of plain cross entropy (``targets``
are class indices). The file is copied into every model version and imported from that copy: keep it
self-contained.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

LABEL_SMOOTHING = 0.05


class Residual(nn.Module):
    """``x + f(x)`` with ``f`` = LayerNorm -> Linear -> GELU -> Dropout."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.f = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x)


def build(n_inputs: int, n_outputs: int, *, width: int = 32, blocks: int = 2, dropout: float = 0.1) -> nn.Module:
    """An input projection, ``blocks`` residual blocks of ``width`` units and a linear head of ``n_outputs``
    logits."""
    return nn.Sequential(nn.Linear(n_inputs, width), *(Residual(width, dropout) for _ in range(blocks)),
                         nn.LayerNorm(width), nn.Linear(width, n_outputs))


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy with label smoothing: the three cultivars overlap a little, so no logit should grow
    without bound."""
    return F.cross_entropy(outputs, targets, label_smoothing=LABEL_SMOOTHING)
