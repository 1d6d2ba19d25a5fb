"""Bring your own model: a model module outside kfloop's packages trains through the training pipeline
(kfp.local, torchrun DDP), is registered and promoted, serves through ``mlflow.pyfunc.load_model`` in a fresh
process, is refused when its logged copy is tampered with, and reproduces exactly; the two examples (regression and
multi-class classification) run end to end."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from cli_run import cli

from data.settings import CODE_ROOT as REPO_ROOT
from monitoring.steps.checks import drift_step
from pipelines.cli.commands import main
from training.model_files import MODULE_FILE

EXAMPLES = REPO_ROOT / "examples"
MODEL = "byo-demo"
OWN_MODULE = '''
"""A team's model, kept outside kfloop: a bilinear feature mixer plus a linear skip."""
import torch
from torch import nn


class Mixer(nn.Module):
    def __init__(self, n_inputs, n_outputs, rank):
        super().__init__()
        self.left, self.right = nn.Linear(n_inputs, rank), nn.Linear(n_inputs, rank)
        self.head, self.skip = nn.Linear(rank, n_outputs), nn.Linear(n_inputs, n_outputs)

    def forward(self, x):
        return self.head(self.left(x) * torch.tanh(self.right(x))) + self.skip(x)


def make(n_inputs, n_outputs, *, rank=4):
    return Mixer(n_inputs, n_outputs, rank)
'''


@pytest.fixture(scope="module")
def own_model(tmp_path_factory):
    """``byo-demo`` v1 trained from a module in a folder outside the repository, on the DVC-tracked demo data,
    with the code commit pinned the way images pin it (KFLOOP_GIT_COMMIT)."""
    from data.demo import DATA_DIR, ensure_demo_data

    root = tmp_path_factory.mktemp("byo")
    team = root / "team-code"
    team.mkdir()
    (team / "mixer.py").write_text(OWN_MODULE)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        workdir = root / "workdir"
        mp.setenv("KFLOOP_HOME", str(workdir))
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir / 'mlflow.db'}")
        mp.setenv("KFLOOP_GIT_COMMIT", head)
        mlflow.set_tracking_uri(None)  # MLflow reads MLFLOW_TRACKING_URI, which the later tests' fixtures set
        data = ensure_demo_data(root / "dvc-remote")
        config = team / "kfloop.yaml"  # the module path is relative to this file
        config.write_text("model: {module: mixer.py, builder: make, params: {rank: 4}}\n"
                          "training: {epochs: 2, nproc_per_node: 2, batch_size: 256, learning_rate: 0.02}\n"
                          "promotion: {bootstrap_samples: 200, required_confidence: 0.5}\n")
        code = main(["run", "training", "--local", "--json", "--config", str(config),
                     "--set", f"dataset_uri={data.train}", "--set", f"schema_uri={DATA_DIR / 'schema.yaml'}",
                     "--set", f"model_name={MODEL}", "--set", "model.params.rank=3"])
        assert code == 0
        yield {"root": root, "team": team, "data": data, "workdir": workdir}


def _predict_in_fresh_process(uri: str, rows: Path) -> subprocess.CompletedProcess:
    script = textwrap.dedent(f"""
        import mlflow, pandas as pd
        out = mlflow.pyfunc.load_model({uri!r}).predict(pd.read_parquet({str(rows)!r}))
        print(out.to_json(orient="records"))
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd="/", timeout=600)


def test_own_module_is_registered_promoted_and_serves_from_raw_rows_in_a_fresh_process(own_model):
    client = mlflow.MlflowClient()
    champion = client.get_model_version_by_alias(MODEL, "champion")
    source = (own_model["team"] / "mixer.py").read_bytes()
    tags = champion.tags
    assert str(champion.version) == "1" and tags["decision"] == "promote"
    assert tags["model_module"] == str(own_model["team"] / "mixer.py")
    assert tags["model_module_sha256"] == hashlib.sha256(source).hexdigest()
    lineage = mlflow.artifacts.load_dict(f"runs:/{champion.run_id}/lineage.json")
    assert lineage["training_config"]["model"] == {"module": str(own_model["team"] / "mixer.py"),
                                                   "builder": "make", "params": {"rank": 3}}
    rows = own_model["root"] / "raw.parquet"
    raw = pd.read_parquet(own_model["data"].stable).drop(columns=["churned"]).head(25)
    raw.loc[0, "region"] = None
    raw.to_parquet(rows)
    done = _predict_in_fresh_process(f"models:/{MODEL}@champion", rows)
    assert done.returncode == 0, done.stderr[-3000:]
    out = pd.DataFrame(json.loads(done.stdout.strip().splitlines()[-1]))
    assert len(out) == 25 and set(out["prediction"]) <= {0, 1}
    assert ((out["proba_0"] + out["proba_1"]) - 1).abs().max() < 1e-9


def test_reproduce_rebuilds_the_own_module_version_identically(own_model, capsys):
    (own_model["team"] / "mixer.py").write_text(OWN_MODULE + "\n# edited after training\n")  # the logged copy counts
    code, out, err = cli(capsys, "reproduce", MODEL, "1", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["identical"] is True and result["differing_tensors"] == []
    assert {"holdout_accuracy", "val_loss", "val_accuracy"} <= set(result["metrics"])
    assert all(m["recorded"] == m["reproduced"] for m in result["metrics"].values())


def test_a_tampered_logged_module_makes_the_load_fail(own_model):
    client = mlflow.MlflowClient()
    version = client.get_model_version(MODEL, "1")
    stored = list(Path(client.get_model_version_download_uri(MODEL, "1").removeprefix("file://")).rglob(MODULE_FILE))
    assert len(stored) == 1
    stored[0].write_text(stored[0].read_text().replace("torch.tanh", "torch.sigmoid"))
    done = _predict_in_fresh_process(f"models:/{MODEL}/1", own_model["root"] / "raw.parquet")
    assert done.returncode != 0
    assert "ModelCodeError" in done.stderr and "model module has sha256" in done.stderr
    assert f"but {version.tags['model_module_sha256']} was recorded" in done.stderr


@pytest.mark.parametrize("example", ["regression-diabetes", "multiclass-wine"])
def test_example_trains_through_the_pipeline_and_serves(example, tmp_path, isolated_env, capsys):
    project = EXAMPLES / example
    done = subprocess.run([sys.executable, str(project / "make_data.py"), str(tmp_path / "data.csv")],
                          capture_output=True, text=True, check=True)
    data = Path(done.stdout.strip())
    code, out, err = cli(capsys, "--workdir", str(isolated_env.workdir), "run", "training", "--local", "--json",
                         "--config", str(project / "kfloop.yaml"), "--set", f"dataset_uri={data}",
                         "--set", "training.epochs=12")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["promoted"] is True and summary["model_version"] == "1", summary
    frame = pd.read_csv(data)
    client = mlflow.MlflowClient()
    version = client.get_model_version(summary["model_name"], "1")
    figures = {a.path for a in client.list_artifacts(version.run_id, "figures")}
    model = mlflow.pyfunc.load_model(f"models:/{summary['model_name']}@champion")
    if example == "regression-diabetes":
        predicted = model.predict(frame.drop(columns=["progression"]))["prediction"]
        assert predicted.dtype == "float64" and predicted.between(0, 500).all()
        assert {"rmse", "mae", "r2"} <= set(summary["metrics"]) and summary["metrics"]["r2"] > 0.2
        assert summary["metrics"]["rmse"] < client.get_run(version.run_id).data.metrics["eval_baseline_rmse"]
        assert "figures/residuals.png" in figures
        shifted = tmp_path / "heavier.csv"  # a heavier population: higher predicted progression
        frame.assign(bmi=frame["bmi"] + 8).to_csv(shifted, index=False)
        checked = drift_step(current_uri=str(shifted), reference_uri="", schema_uri="",
                             model_name=summary["model_name"], policy={}, report_out="").drift
        assert checked.columns["prediction"].drifted and checked.columns["bmi"].drifted
        assert checked.columns["prediction"].method == checked.columns["bmi"].method  # numbers, not categories
        scrambled = tmp_path / "scrambled.csv"  # labels arrive, but no longer match the rows: rmse degrades
        frame.assign(progression=frame["progression"].sample(frac=1, random_state=0).to_numpy()).to_csv(
            scrambled, index=False)
        for labelled, degraded in ((data, False), (scrambled, True)):
            code, out, err = cli(capsys, "quality", "--model", summary["model_name"], "--data", str(labelled),
                                 "--config", str(project / "kfloop.yaml"), "--json")
            assert code == 0, err
            result = json.loads(out)
            assert result["metric"] == "rmse" and result["degraded"] is degraded, result["reason"]
        assert result["value"] > result["baseline"] and "rmse" in result["reason"]
    else:
        out = model.predict(frame.drop(columns=["cultivar"]))
        assert sorted(c for c in out.columns if c.startswith("proba_")) == [
            "proba_class_0", "proba_class_1", "proba_class_2"]
        assert (out["prediction"] == frame["cultivar"]).mean() > 0.8
        assert summary["metrics"]["f1_macro"] > 0.8 and "figures/per_class.png" in figures
