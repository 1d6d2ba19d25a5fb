"""Issue 20 end to end: on a table with 3% positives the gate rejects a model no better than always answering the
majority class, and promotes one trained with ``class_weight: balanced`` (kfp.local, torchrun DDP with 2 ranks,
MLflow on SQLite)."""
from __future__ import annotations

import json

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipelines.cli import main

MODEL = "rare-events"


def rare_table(n: int = 4000, share: float = 0.03, seed: int = 3) -> pd.DataFrame:
    """Positives are the top ``share`` of a noisy score: the features rank them well, but almost no row is more
    likely positive than not, so a well-fit unweighted model still answers the majority class."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    channel = rng.choice(["web", "store", "phone"], size=n)
    latent = x1 + 0.5 * x2 + 0.4 * (channel == "web") + rng.normal(scale=1.5, size=n)
    label = np.where(latent >= np.quantile(latent, 1 - share), "default", "paid")
    return pd.DataFrame({"x1": x1, "x2": x2, "channel": channel, "status": label})


def run(capsys, workdir, path, *settings: str) -> dict:
    capsys.readouterr()
    code = main(["--workdir", str(workdir), "run", "training", "--local", "--json", "--set", f"dataset_uri={path}",
                 "--set", "target=status", "--set", f"model_name={MODEL}", *sum((["--set", s] for s in settings), [])])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def evaluation(version: str) -> dict:
    run_id = mlflow.MlflowClient().get_model_version(MODEL, version).run_id
    return mlflow.artifacts.load_dict(f"runs:/{run_id}/evaluation.json")


@pytest.mark.timeout(900)  # two whole training pipeline runs on a shared 2-core machine
def test_rare_target_rejects_a_majority_class_model_and_promotes_a_balanced_one(tmp_path, isolated_env, capsys):
    df = rare_table()
    assert (df["status"] == "default").mean() == pytest.approx(0.03)
    path = tmp_path / "loans.parquet"
    df.to_parquet(path, index=False)

    # the most probable class on purpose (issue 29 made ``auto`` the default): this model is the subject
    plain = run(capsys, isolated_env.workdir, path, "promotion.primary_metric=accuracy", "training.epochs=3",
                "training.threshold_metric=none")
    decision = evaluation(plain["model_version"])
    baseline = decision["baseline_metrics"]["accuracy"]
    with capsys.disabled():
        print(f"\nunweighted: {plain['reason']}")
    assert not plain["promoted"] and plain["champion_version"] is None
    assert baseline == pytest.approx((pd.read_parquet(path)["status"] == "paid").mean(), abs=0.02)
    assert decision["challenger_metrics"]["accuracy"] <= baseline + 0.005
    assert f"vs baseline {baseline:.3f} (always 'paid', training priors): not beaten" in plain["reason"]
    assert decision["metric_reason"] == "set in promotion.primary_metric"

    balanced = run(capsys, isolated_env.workdir, path, "training.class_weight=balanced",
                   "training.threshold_metric=f1_macro", "training.epochs=5")
    decision = evaluation(balanced["model_version"])
    assert balanced["promoted"] and balanced["champion_version"] == balanced["model_version"] == "2", \
        balanced["reason"]
    assert decision["primary_metric"] == "roc_auc" and "minority class is rare" in decision["metric_reason"]
    with capsys.disabled():
        print(f"balanced: {balanced['reason']} (baseline roc_auc {decision['baseline_metrics']['roc_auc']:.3f})")
    assert decision["baseline_metrics"]["roc_auc"] == 0.5
    assert decision["challenger_metrics"]["roc_auc"] > 0.7 and decision["baseline"]["confidence"] >= 0.9
    minority = next(r for r in decision["per_class"] if r["class"] == "default")
    assert minority["support"] > 0 and minority["challenger"]["recall"] > 0
    run_metrics = mlflow.MlflowClient().get_run(mlflow.MlflowClient().get_model_version(MODEL, "2").run_id).data.metrics
    assert run_metrics["eval_baseline_roc_auc"] == 0.5 and run_metrics["eval_confidence_vs_baseline"] >= 0.9

    # the threshold chosen on the validation split is stored with the model, recorded in lineage and applied by
    # the pyfunc's prediction; probabilities are untouched
    model_run = mlflow.MlflowClient().get_model_version(MODEL, "2").run_id
    lineage = mlflow.artifacts.load_dict(f"runs:/{model_run}/lineage.json")
    threshold = lineage["decision_threshold"]
    assert 0 < threshold < 1 and lineage["training_config"]["class_weight"] == "balanced"
    out = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").predict(df.drop(columns=["status"]))
    assert (out["prediction"] == np.where(out["proba_paid"] >= threshold, "paid", "default")).all()
    assert (out["prediction"] == "default").any() and (out["prediction"] == "paid").any()
    assert np.allclose(out["proba_default"] + out["proba_paid"], 1.0)

    capsys.readouterr()
    assert main(["--workdir", str(isolated_env.workdir), "history", "--model", MODEL]) == 0
    history = capsys.readouterr().out
    assert "roc_auc" in history and "vs 0.500" in history and f"vs {baseline:.3f}" in history
