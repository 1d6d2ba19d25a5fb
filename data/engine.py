"""Who reads and summarises a table: this process chunk by chunk (``local``), or Ray Data on a Ray cluster block by
block (``ray``, :mod:`data.ray_blocks`). The setting's one home is the ``drift`` section (``drift.engine``,
``drift.ray_address``): it serves drift checks, the reference profile built at registration and validation alike."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

ENGINES = ("local", "ray")
"""Who reads and sketches the data (``drift.engine``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DataEngine:
    """The engine and the Ray cluster of ``engine: ray`` (empty address: a local Ray started for the command)."""

    engine: Literal["local", "ray"] = "local"
    ray_address: str = ""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r}: use one of {list(ENGINES)}")
        if not isinstance(self.ray_address, str):
            raise ValueError(f"ray_address={self.ray_address!r}: use a Ray address such as ray://head:10001, or "
                             "an empty string for a local Ray")
        if self.ray_address and self.engine != "ray":
            raise ValueError(f"ray_address={self.ray_address!r} is set but engine={self.engine!r}: set engine: ray "
                             "to use the cluster, or drop ray_address")

    @classmethod
    def of_policy(cls, policy: Mapping[str, Any] | None) -> DataEngine:
        """The engine of a ``drift`` section (its other keys are the drift check's own).

        Raises:
            ValueError: an unknown engine, or a ``ray_address`` without ``engine: ray``.
        """
        policy = policy or {}
        return cls(engine=policy.get("engine", "local"), ray_address=policy.get("ray_address", ""))
