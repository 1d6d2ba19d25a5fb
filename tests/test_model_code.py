"""The model plug-in contract without training: finding, hashing and importing a module, its builder's errors,
the settings that name it, and the gate on a regression target."""
from __future__ import annotations

import hashlib
import math

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import mean_absolute_error, r2_score, root_mean_squared_error

from monitoring.drift import check_drift
from monitoring.drift_policy import DriftPolicy
from pipelines.cli.commands import build_parser
from pipelines.cli.options import settings
from pipelines.config import pipeline_params
from pipelines.training import training_pipeline
from training.config import ModelSpec, TrainingConfig, with_module_path
from training.gate import PromotionPolicy, evaluate, regression_metrics
from training.model_code import ModelCode, source_file
from training.model_files import ModelCodeError

MODULE = '''
import torch

def build(n_inputs, n_outputs, *, width=8):
    return torch.nn.Sequential(torch.nn.Linear(n_inputs, width), torch.nn.Linear(width, n_outputs))

def not_a_model(n_inputs, n_outputs):
    return "a string"

def loss(outputs, targets):
    return (outputs[:, 0] - targets).abs().mean()
'''


@pytest.fixture
def module_file(tmp_path):
    path = tmp_path / "team" / "net.py"
    path.parent.mkdir()
    path.write_text(MODULE)
    return path


def test_a_file_module_builds_with_its_params_and_brings_its_loss(module_file):
    code = ModelCode.load(ModelSpec(module=str(module_file), params={"width": 5}))
    model = code.build(3, 1)
    assert model[0].out_features == 5 and model(torch.zeros(4, 3)).shape == (4, 1)
    assert code.sha256 == hashlib.sha256(module_file.read_bytes()).hexdigest()
    assert float(code.loss(torch.ones(2, 1), torch.zeros(2))) == 1.0
    assert code.module.__name__ == f"kfloop_model_{code.sha256}"  # never under a name an installed package has
    assert ModelCode.load(ModelSpec()).loss is None  # the built-in MLP: kfloop's loss for the task


def test_a_dotted_module_is_found_by_its_file():
    code = ModelCode.load(ModelSpec(module="training.mlp", params={"hidden": [4], "dropout": 0.0}))
    assert code.path == source_file("training.mlp") and code.path.name == "mlp.py"
    assert [m.out_features for m in code.build(6, 3).modules() if isinstance(m, torch.nn.Linear)] == [4, 3]


@pytest.mark.parametrize("spec, message", [
    ({"module": "missing/net.py"}, r"model.module='missing/net.py': no such file"),
    ({"module": "no_such_team.models"}, "not an importable Python module"),
    ({"builder": "make"}, "defines no function 'make'"),
])
def test_a_module_that_cannot_serve_says_what_to_fix(spec, message, module_file):
    with pytest.raises(ModelCodeError, match=message):
        ModelCode.load(ModelSpec(**{"module": str(module_file), **spec}))


def test_builder_errors_name_the_call_and_the_fix(module_file):
    with pytest.raises(ModelCodeError, match=r"net.py:build\(3, 1, \*\*\{'depth': 2\}\) failed: .*fix model.params"):
        ModelCode.load(ModelSpec(module=str(module_file), params={"depth": 2})).build(3, 1)
    with pytest.raises(ModelCodeError, match="net.py:not_a_model returned a str, not a torch.nn.Module"):
        ModelCode.load(ModelSpec(module=str(module_file), builder="not_a_model")).build(3, 1)


def test_a_changed_module_is_refused_before_any_of_it_runs(module_file, tmp_path):
    recorded = hashlib.sha256(module_file.read_bytes()).hexdigest()
    marker = tmp_path / "ran"
    module_file.write_text(MODULE + f"\nopen({str(marker)!r}, 'w').close()\n")
    with pytest.raises(ModelCodeError, match=f"net.py: the model module has sha256 .*, but {recorded} was recorded"):
        ModelCode.load(ModelSpec(module=str(module_file)), expected_sha256=recorded)
    assert not marker.exists()


def test_model_spec_checks_its_fields():
    with pytest.raises(ValueError, match="model.builder='1x': give the name of a function"):
        ModelSpec(builder="1x")
    with pytest.raises(ValueError, match=r"unknown model key\(s\) \['modul'\]"):
        ModelSpec.from_dict({"modul": "x.py"})
    with pytest.raises(ValueError, match="model.params=.*use a mapping of keyword arguments"):
        ModelSpec(params=[1, 2])


def test_module_paths_are_relative_to_the_config_file_and_set_flows_to_the_pipeline(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "kfloop.yaml").write_text("model: {module: net.py, params: {width: 16}}\n")
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["run", "training", "--local", "--config", str(project / "kfloop.yaml"),
                                      "--set", "model.params.width=64", "--set", "dataset_uri=d.csv"])
    merged = settings(args)
    assert merged["model"] == {"module": str(project / "net.py"), "params": {"width": 64}}
    assert with_module_path({"model": {"module": "team.nets"}}, project)["model"]["module"] == "team.nets"
    params = pipeline_params(training_pipeline, {**merged, "task": "regression"})
    assert params["model_config"] == merged["model"] and params["task"] == "regression"
    with pytest.raises(ValueError, match="training.model: the model plug-in is its own top-level section"):
        pipeline_params(training_pipeline, {"dataset_uri": "d.csv", "training": {"model": {"module": "x.py"}}})
    assert TrainingConfig.from_dict({"model": merged["model"]}).model.params == {"width": 64}


def test_regression_metrics_are_sklearns():
    rng = np.random.default_rng(0)
    y, pred = rng.normal(50, 10, 300), rng.normal(50, 10, 300)
    got = regression_metrics(y, pred)
    assert got["rmse"] == pytest.approx(root_mean_squared_error(y, pred))
    assert got["mae"] == pytest.approx(mean_absolute_error(y, pred))
    assert got["r2"] == pytest.approx(r2_score(y, pred))
    assert all(math.isnan(v) for v in regression_metrics(y, np.r_[pred[:-1], np.inf]).values())


def test_the_gate_on_a_regression_target_minds_that_lower_error_is_better():
    rng = np.random.default_rng(1)
    n = 400
    holdout = pd.DataFrame({"region": rng.choice(["n", "s"], n)})
    y = rng.normal(100, 20, n)
    good, worse = y + rng.normal(0, 5, n), y + rng.normal(0, 12, n)
    policy = PromotionPolicy(slice_columns=("region",), bootstrap_samples=300)
    first = evaluate(y_true=y, challenger_proba=worse[:, None], champion_proba=None, classes=[], holdout=holdout,
                     policy=policy, train_mean=101.0)
    assert first.blessed and first.primary_metric == "rmse" and "regression" in first.metric_reason
    assert first.baseline["kind"] == "training_mean" and first.baseline["predicts"] == 101.0
    assert first.baseline_metrics["rmse"] > first.challenger_metrics["rmse"] and first.per_class == []
    better = evaluate(y_true=y, challenger_proba=good[:, None], champion_proba=worse[:, None], classes=[],
                      holdout=holdout, policy=policy, train_mean=101.0)
    assert better.blessed and better.improvement > 0 and better.confidence == 1.0
    assert {s["value"] for s in better.slices} == {"n", "s"} and all(s["delta"] < 0 for s in better.slices)
    assert all(s["minority"] is None for s in better.slices)
    regressed = evaluate(y_true=y, challenger_proba=worse[:, None], champion_proba=good[:, None], classes=[],
                         holdout=holdout, policy=policy, train_mean=101.0)
    assert not regressed.blessed and "rmse" in regressed.reason and regressed.improvement < 0
    with pytest.raises(ValueError, match="'accuracy' is a classification metric; this is a regression target"):
        evaluate(y_true=y, challenger_proba=good[:, None], champion_proba=None, classes=[], holdout=holdout,
                 policy=PromotionPolicy(primary_metric="accuracy"))


def test_a_regression_champions_predictions_drift_as_numbers():
    rng = np.random.default_rng(2)
    reference = pd.DataFrame({"x": rng.normal(size=400), "prediction": rng.normal(100, 10, 400)})
    shifted = pd.DataFrame({"x": rng.normal(size=400), "prediction": rng.normal(130, 10, 400)})
    result = check_drift(reference, shifted, numeric=["x"], categorical=[], policy=DriftPolicy(),
                         prediction_kind="numeric")
    assert result.columns["prediction"].drifted and not result.columns["x"].drifted
    assert result.columns["prediction"].method == result.columns["x"].method  # a numeric test, as for features


@pytest.mark.parametrize("required_confidence", [0.0, 0.5, 0.9, 1.0])
def test_a_regression_candidate_worse_than_the_training_mean_is_rejected_whatever_the_confidence(
        required_confidence):
    """Issue 29 item 4: losing to the trivial model (predict the training mean) never promotes."""
    rng = np.random.default_rng(3)
    n = 300
    y = rng.normal(100, 10, n)
    noisy = y + rng.normal(0, 25, n)  # RMSE ~25 against the mean's ~10
    d = evaluate(y_true=y, challenger_proba=noisy[:, None], champion_proba=None, classes=[],
                 holdout=pd.DataFrame(index=range(n)), train_mean=100.0,
                 policy=PromotionPolicy(bootstrap_samples=200, required_confidence=required_confidence))
    baseline = next(c for c in d.checks if c["name"] == "baseline")
    assert not d.blessed and not baseline["passed"], d.reason
    assert d.challenger_metrics["rmse"] > d.baseline_metrics["rmse"] and "not beaten" in baseline["detail"]


def test_a_floor_in_target_units_is_accepted_and_applied_as_an_rmse_ceiling():
    """Issue 29 item 4: ``floor: 5`` for RMSE means RMSE <= 5 (target units), not a share in [0, 1]."""
    rng = np.random.default_rng(4)
    n = 300
    y = rng.normal(100, 20, n)
    pred = y + rng.normal(0, 4, n)  # RMSE ~4
    rmse = regression_metrics(y, pred)["rmse"]
    holdout = pd.DataFrame(index=range(n))
    for policy in (PromotionPolicy(floor=5.0, bootstrap_samples=200),
                   PromotionPolicy(primary_metric="rmse", floor=5.0, bootstrap_samples=200)):
        passed = evaluate(y_true=y, challenger_proba=pred[:, None], champion_proba=None, classes=[],
                          holdout=holdout, policy=policy, train_mean=100.0)
        assert passed.blessed and f"rmse {rmse:.3f} <= ceiling 5.000" in passed.reason, passed.reason
    tight = evaluate(y_true=y, challenger_proba=pred[:, None], champion_proba=None, classes=[], holdout=holdout,
                     policy=PromotionPolicy(floor=3.0, bootstrap_samples=200), train_mean=100.0)
    assert not tight.blessed and f"rmse {rmse:.3f} > ceiling 3.000" in tight.reason, tight.reason
    with pytest.raises(ValueError, match=r"rmse is an error metric \(>= 0, in the target units"):
        evaluate(y_true=y, challenger_proba=pred[:, None], champion_proba=None, classes=[], holdout=holdout,
                 policy=PromotionPolicy(floor=-1.0, bootstrap_samples=200), train_mean=100.0)
