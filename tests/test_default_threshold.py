"""Issue 29 item 8 on a real public table: ``threshold_metric: auto`` (the default) picks the macro-F1 threshold for
a rare class, and the registered model's served labels beat the most probable class on rows no step ever saw; every
decision carries the linear baseline.

The table is the RAND Health Insurance Experiment extract bundled with statsmodels
(``statsmodels.datasets.randhie``, 20,190 person-years, public domain per statsmodels' ``COPYRIGHT``; statsmodels is
installed with Evidently): the target is its own ``hlthf`` column (self-rated health "fair", 7.7% of rows), the
features the visit, coinsurance, deductible, income, limitation and disease columns. ``hlthg``/``hlthp`` (the other
health ratings) are left out: they would give the answer away.
"""
from __future__ import annotations

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from sklearn.metrics import f1_score

from pipelines.cli import main

MODEL = "rand-hie-fair-health"
FEATURES = ["mdvis", "lncoins", "idp", "lpi", "fmde", "physlm", "disea"]


def rand_hie() -> pd.DataFrame:
    data = sm.datasets.randhie.load_pandas().data
    return data[FEATURES].assign(health=np.where(data["hlthf"] == 1, "fair", "other"))


@pytest.mark.timeout(900)  # one whole training pipeline run on a shared 2-core machine
def test_the_default_threshold_beats_argmax_on_fresh_rows_of_a_real_imbalanced_table(tmp_path, isolated_env,
                                                                                        capsys):
    table = rand_hie()
    assert len(table) >= 2000 and (table["health"] == "fair").mean() == pytest.approx(0.0773, abs=0.001)
    fresh = table.sample(frac=0.25, random_state=7)  # never given to the pipeline (training, validation, holdout)
    path = tmp_path / "rand_hie.parquet"
    table.drop(index=fresh.index).to_parquet(path, index=False)

    capsys.readouterr()
    code = main(["--workdir", str(isolated_env.workdir), "run", "training", "--local", "--json",
                 "--set", f"dataset_uri={path}", "--set", "target=health", "--set", f"model_name={MODEL}",
                 "--set", "training.epochs=4", "--set", "training.batch_size=512",
                 "--set", "promotion.bootstrap_samples=300"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    version = result["model_version"]

    client = mlflow.MlflowClient()
    run_id = client.get_model_version(MODEL, version).run_id
    lineage = mlflow.artifacts.load_dict(f"runs:/{run_id}/lineage.json")
    choice = lineage["threshold_choice"]
    assert lineage["training_config"]["threshold_metric"] == "auto"
    assert choice["setting"] == "auto" and choice["metric"] == "f1_macro", choice
    assert "auto: the rarer class is 7." in choice["reason"] and "macro F1" in choice["reason"]
    # the threshold is on the second class in sorted order, "other": "fair" is answered below it, far more often
    # than the most probable class would (0.5)
    assert 0.5 < lineage["decision_threshold"] < 1
    assert client.get_model_version(MODEL, version).tags["threshold_metric"] == "f1_macro"
    assert client.get_run(run_id).data.tags["kfloop.threshold_metric"] == "f1_macro"

    decision = mlflow.artifacts.load_dict(f"runs:/{run_id}/evaluation.json")
    assert decision["linear"]["kind"] == "logistic_regression" and decision["linear"]["gating"] is False
    assert set(decision["linear_metrics"]) == set(decision["baseline_metrics"])
    assert decision["linear_metrics"]["roc_auc"] > decision["baseline_metrics"]["roc_auc"] == 0.5
    assert "eval_linear_roc_auc" in client.get_run(run_id).data.metrics

    served = mlflow.pyfunc.load_model(f"models:/{MODEL}/{version}").predict(fresh[FEATURES])
    classes = ["fair", "other"]
    argmax = np.asarray(classes)[served[[f"proba_{c}" for c in classes]].to_numpy().argmax(axis=1)]
    default_f1 = f1_score(fresh["health"], served["prediction"], average="macro")
    argmax_f1 = f1_score(fresh["health"], argmax, average="macro")
    with capsys.disabled():
        print(f"\nRAND HIE hlthf, {len(fresh)} fresh rows: macro F1 default (auto) {default_f1:.3f} vs argmax "
              f"{argmax_f1:.3f}; holdout {decision['primary_metric']} challenger "
              f"{decision['challenger_metrics'][decision['primary_metric']]:.3f}, linear "
              f"{decision['linear_metrics'][decision['primary_metric']]:.3f}, trivial "
              f"{decision['baseline_metrics'][decision['primary_metric']]:.3f}")
    assert default_f1 > argmax_f1 + 0.02, (default_f1, argmax_f1)
