"""kfloop's built-in model, a plug-in module like any other (``model.module: training.mlp``, the default):
a feed-forward network from kfloop's preprocessed features to logits (classification) or one value (regression).

Self-contained on purpose: a copy of this file is logged with every version and imported from there on load.
"""
from __future__ import annotations

import torch


class MLP(torch.nn.Module):
    """Linear layers with ReLU (and optional dropout) between them."""

    def __init__(self, n_inputs: int, n_outputs: int, hidden: tuple[int, ...], dropout: float):
        super().__init__()
        layers: list[torch.nn.Module] = []
        width = n_inputs
        for h in hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            if dropout:
                layers.append(torch.nn.Dropout(dropout))
            width = h
        layers.append(torch.nn.Linear(width, n_outputs))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build(n_inputs: int, n_outputs: int, *, hidden: list[int] | tuple[int, ...] = (64, 32),
          dropout: float = 0.0) -> MLP:
    """The MLP with hidden layers of widths ``hidden`` and ``dropout`` after each (0 disables it).

    Raises:
        ValueError: no hidden layer, a width < 1, or a dropout outside [0, 1).
    """
    hidden = tuple(hidden)
    if not hidden or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden):
        raise ValueError(f"model.params.hidden={list(hidden)!r}: give one or more layer widths >= 1, e.g. [64, 32]")
    if not 0 <= dropout < 1:
        raise ValueError(f"model.params.dropout={dropout!r}: use a probability in [0, 1)")
    return MLP(n_inputs, n_outputs, hidden, dropout)
