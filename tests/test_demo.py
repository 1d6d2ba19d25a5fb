"""`kfloop demo --json`, the whole loop as a user runs it: a real process, real DVC, kfp.local, torchrun,
MLflow, Evidently."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow
import pandas as pd


def test_demo_json_contract(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KFLOOP_HOME")}
    proc = subprocess.run([sys.executable, "-m", "pipelines", "--workdir", str(tmp_path), "demo", "--json"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[kfloop] == (a) first training" in proc.stderr and "[kfloop] step promote: success" in proc.stderr
    s = json.loads(proc.stdout)

    first = s["first_training"]
    assert first["model_version"] == "1" and first["promoted"] is True and first["champion_version"] == "1"
    assert first["metrics"]["accuracy"] > 0.7

    stable = s["stable_batch"]
    assert stable["drifted"] is False and stable["retrain"] is None
    assert stable["trigger"] is None  # the trigger step never ran
    assert set(stable["columns"]) >= {"age", "contract", "prediction"}

    drifted = s["drifted_batch"]
    assert drifted["drifted"] is True and drifted["share_drifted_columns"] >= 0.5
    assert drifted["trigger"]["fire"] is True
    retrain = drifted["retrain"]
    assert retrain["model_version"] == "2" and retrain["reason"]
    assert retrain["decision"] in ("promote", "reject")
    assert retrain["champion_version"] == ("2" if retrain["promoted"] else "1")

    versions = {v["version"]: v for v in s["versions"]}
    assert set(versions) == {"1", "2"}
    assert versions["1"]["data_md5"] == s["data_md5"]["train.parquet"]
    assert versions["2"]["data_md5"] == s["data_md5"]["batch_drifted.parquet"]

    prediction = s["champion_prediction"]
    assert prediction["rows"] == 5 and set(prediction["predictions"]) <= {0, 1}
    mlflow.set_tracking_uri(s["tracking_uri"])
    try:
        model = mlflow.pyfunc.load_model(prediction["model_uri"])
        rows = pd.read_parquet(drifted["reference_uri"]).head(3)
        assert len(model.predict(rows[model.metadata.get_input_schema().input_names()])) == 3
    finally:
        mlflow.set_tracking_uri(None)
    assert s["seconds"]["total"] > 0
