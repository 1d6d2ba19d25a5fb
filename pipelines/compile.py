"""Compile both pipelines to deterministic KFP IR YAML."""
from __future__ import annotations

from pathlib import Path

import yaml
from kfp import compiler

from pipelines.drift import drift_pipeline
from pipelines.training import training_pipeline

PIPELINES = {"training": training_pipeline, "drift": drift_pipeline}


def compile_pipeline(name: str, path: Path, *, image: str | None = None) -> Path:
    """Compile one pipeline; ``image`` replaces every step's container image.

    Raises:
        KeyError: unknown pipeline name.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(PIPELINES[name], str(path))
    if image:
        spec = yaml.safe_load(path.read_text())
        for executor in spec["deploymentSpec"]["executors"].values():
            executor["container"]["image"] = image
        path.write_text(yaml.safe_dump(spec, sort_keys=True))
    return path


def compile_all(out: Path, *, image: str | None = None) -> list[Path]:
    """Write ``training.yaml`` and ``drift.yaml`` under ``out``."""
    return [compile_pipeline(name, out / f"{name}.yaml", image=image) for name in PIPELINES]
