"""Compiled IR YAML: deterministic, equal to the golden files, steps in the kfloop image with no pip install."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.compile import PIPELINES, compile_pipeline

GOLDEN = Path(__file__).resolve().parents[1] / "pipelines" / "compiled"
VOLATILE = ("sdkVersion",)


def _stable(path: Path) -> dict:
    spec = yaml.safe_load(path.read_text())
    for key in VOLATILE:
        spec.pop(key, None)
    return spec


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_compiled_yaml_matches_golden(name, tmp_path):
    out = compile_pipeline(name, tmp_path / f"{name}.yaml")
    assert _stable(out) == _stable(GOLDEN / f"{name}.yaml"), (
        f"compiled {name} pipeline changed: review and regenerate with `make compile`")


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_steps_run_in_the_image_without_installing_kfp(name, tmp_path):
    spec = _stable(compile_pipeline(name, tmp_path / "p.yaml", image="registry.example/kfloop:abc"))
    executors = spec["deploymentSpec"]["executors"]
    assert executors
    for executor in executors.values():
        container = executor["container"]
        assert container["image"] == "registry.example/kfloop:abc"
        assert "pip install" not in " ".join(container["command"])


def _conditions(spec: dict) -> list[str]:
    tasks = spec["root"]["dag"]["tasks"].values()
    return [t["triggerPolicy"]["condition"] for t in tasks if "triggerPolicy" in t]


def test_branches_are_dsl_if_on_step_outputs(tmp_path):
    training = _stable(compile_pipeline("training", tmp_path / "t.yaml"))
    drift = _stable(compile_pipeline("drift", tmp_path / "d.yaml"))
    assert _conditions(training) == ["inputs.parameter_values['pipelinechannel--evaluate-vs-champion-Output'] == true"]
    assert _conditions(drift) == ["inputs.parameter_values['pipelinechannel--check-drift-Output'] == true"]
