"""`kfloop demo --json`, the whole loop as a user runs it: a real process, real DVC, kfp.local, torchrun,
MLflow, Evidently; then the commands its summary ends with, run as printed; and the checkout left as it was."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from data.settings import CODE_ROOT
from cluster.server_process import free_port, start_server, stop_group
from pipelines.operations.demo_loop import format_summary

pytestmark = pytest.mark.timeout(1800)  # the whole loop, then a retraining by `reproduce`, on a busy 2-core box


def _checkout_state() -> dict[str, str | None]:
    """What a run must not change: git's view of the checkout (untracked files too) and the DVC config files."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=CODE_ROOT,
                            capture_output=True, text=True, check=True).stdout
    configs = {name: (CODE_ROOT / ".dvc" / name) for name in ("config", "config.local")}
    return {"git status": status, **{name: p.read_text() if p.exists() else None for name, p in configs.items()}}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One ``kfloop demo --json --workdir W`` (the global flag after the command, as users type it), with the code's
    commit pinned the way images pin it, so the printed ``reproduce`` accepts this checkout."""
    workdir = tmp_path_factory.mktemp("demo")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=CODE_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    env = {**{k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KFLOOP_HOME")},
           "KFLOOP_GIT_COMMIT": head, "PYTHONPATH": str(CODE_ROOT)}
    before = _checkout_state()
    proc = subprocess.run([sys.executable, "-m", "pipelines", "demo", "--json", "--workdir", str(workdir)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"proc": proc, "summary": json.loads(proc.stdout), "env": env, "before": before, "workdir": workdir}


def test_demo_json_contract(demo):
    proc = demo["proc"]
    assert "[kfloop] == (a) first training" in proc.stderr and "[kfloop] step promote: success" in proc.stderr
    s = demo["summary"]
    assert s["workdir"] == str(demo["workdir"] / "demo")

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
        assert (model.predict(rows)["schema_violations"] == "").all() and len(rows) == 3
    finally:
        mlflow.set_tracking_uri(None)
    assert s["seconds"]["total"] > 0


def test_running_the_demo_leaves_the_checkout_unchanged(demo):
    """It used to point the repo's .dvc/config.local at the demo's temporary remote."""
    assert _checkout_state() == demo["before"]


def _kfloop(command: str, env: dict[str, str], cwd) -> str:
    argv = shlex.split(command)
    assert argv[0] == "kfloop"
    proc = subprocess.run([sys.executable, "-m", "pipelines", *argv[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, f"{command}: {proc.stderr[-3000:]}"
    return proc.stdout


def test_the_summary_ends_with_commands_that_work_as_printed(demo, tmp_path):
    """Status, history, report, reproduce and the MLflow UI, run as printed from another directory."""
    s = demo["summary"]
    printed = [line.strip() for line in format_summary(s).splitlines()[-5:]]
    assert printed == s["next_commands"]
    status, history, report, reproduce, ui = printed
    champion = s["drifted_batch"]["retrain"]["champion_version"]
    assert f"champion: v{champion} since" in _kfloop(status, demo["env"], tmp_path)
    assert "champion moves:" in _kfloop(history, demo["env"], tmp_path)
    page = _kfloop(report, demo["env"], tmp_path).strip()
    assert Path(page) == Path(shlex.split(report)[-1]) and "<html" in Path(page).read_text()[:2000].lower()
    assert _kfloop(reproduce, demo["env"], tmp_path).startswith("kfloop-demo v1: IDENTICAL")

    argv = shlex.split(ui)
    assert argv[:2] == ["mlflow", "ui"] and argv[-2:] == ["--port", "5000"]
    port = free_port()  # 5000 may be taken on a shared machine
    server = start_server([sys.executable, "-m", "mlflow", *argv[1:-1], str(port)],
                          health_url=f"http://127.0.0.1:{port}/health", log_path=tmp_path / "ui.log",
                          env={**demo["env"], "MLFLOW_ENABLE_TELEMETRY": "false"}, timeout_s=180)
    try:
        url = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/registered-models/get?name=kfloop-demo"
        with urllib.request.urlopen(url, timeout=60) as answer:
            model = json.load(answer)["registered_model"]
        assert model["name"] == "kfloop-demo"
        assert {a["alias"]: a["version"] for a in model["aliases"]}["champion"] == champion
    finally:
        stop_group(server)
