"""Operating the loop against one real ``mlflow server`` process: status, history, rollback, reproduce, the pictures
each training run logs and the HTML report, on versions trained by the real training pipeline (kfp.local) from the
DVC-tracked demo data."""
from __future__ import annotations

import json
import re
import subprocess

import mlflow
import pytest
from cli_run import cli

from data.errors import EXIT_FAILED, EXIT_SETTINGS
from data.fileio import file_digest
from data.settings import CODE_ROOT as REPO_ROOT
from pipelines.cli.commands import main

MODEL = "operate-demo"
TINY = ["--set", "model.params.hidden=[8]", "--set", "training.nproc_per_node=2", "--set", "training.batch_size=256",
        "--set", "training.learning_rate=0.02",  # one epoch must already beat the majority class to be promoted
        "--set", "promotion.required_confidence=0.5", "--set", "promotion.bootstrap_samples=200",
        "--set", "promotion.max_slice_regression=0.3"]


@pytest.fixture(scope="module")
def demo(mlflow_server, tmp_path_factory):
    """Model ``operate-demo`` on the shared server: v1 (1 epoch) promoted, v2 (6 epochs) promoted over it, one
    drift check of the drifted batch and one quality check of the stable batch recorded, one fired trigger. The code
    commit is pinned the way images pin it (KFLOOP_GIT_COMMIT) to this checkout's HEAD."""
    from data.demo import DATA_DIR, ensure_demo_data
    from monitoring.steps.checks import drift_step, quality_step
    from monitoring.steps.trigger import trigger_step

    root = tmp_path_factory.mktemp("operate")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
        mp.setenv("KFLOOP_HOME", str(root / "workdir"))
        mp.setenv("KFLOOP_GIT_COMMIT", head)
        mlflow.set_tracking_uri(mlflow_server.url)
        data = ensure_demo_data(root / "dvc-remote")
        common = ["run", "training", "--local", "--json", "--set", f"dataset_uri={data.train}", "--set",
                  f"schema_uri={DATA_DIR / 'schema.yaml'}", "--set", f"model_name={MODEL}", *TINY]
        for epochs in (1, 6):
            assert main([*common, "--set", f"training.epochs={epochs}"]) == 0
        checked = drift_step(current_uri=str(data.drifted), reference_uri="", schema_uri="", model_name=MODEL,
                             policy={}, report_out=str(root / "drift.html"))
        trigger_step(model_name=MODEL, data_md5=checked.data_md5, policy={"cooldown_seconds": 3600},
                     start=lambda: "manual-run-7")
        quality = quality_step(labelled_uri=str(data.stable), labels_uri="", id_column="", model_name=MODEL,
                               policy={"bootstrap_samples": 200}, report_out="")
        yield {"root": root, "data": data, "head": head, "drift": checked, "quality": quality}
        mlflow.set_tracking_uri(None)


def test_the_demo_promoted_both_versions(demo):
    client = mlflow.MlflowClient()
    assert [client.get_model_version(MODEL, v).tags["decision"] for v in ("1", "2")] == ["promote", "promote"]
    assert client.get_model_version_by_alias(MODEL, "champion").version == "2"


def test_status_shows_champion_drift_trigger_and_runs(demo, capsys):
    code, out, _ = cli(capsys, "status", "--model", MODEL, "--json")
    assert code == 0
    s = json.loads(out)
    champion = s["champion"]
    assert champion["version"] == "2" and champion["how"] == "promote" and champion["by"].startswith("pipeline run")
    assert champion["data_md5"] == file_digest(demo["data"].train, "md5") == demo["data"].md5["train.parquet"]
    assert champion["git_commit"] == demo["head"] and 0.5 < champion["metrics"]["accuracy"] <= 1
    history = mlflow.MlflowClient().get_registered_model(MODEL).tags
    assert champion["since"] == json.loads(history["champion_move.000002"])["at"]
    drift = s["last_drift_check"]
    assert drift["drifted"] is True and drift["champion_version"] == "2"
    assert drift["drifted_columns"] == [c for c, v in demo["drift"].drift.columns.items() if v.drifted]
    assert s["trigger"]["in_cooldown"] is True and s["trigger"]["last_fired"]["run_id"] == "manual-run-7"
    quality, checked = s["last_quality_check"], demo["quality"].quality
    assert quality["champion_version"] == "2" and quality["rows"] == 2000 and quality["degraded"] is checked.degraded
    assert quality["value"] == checked.value and quality["baseline"] == champion["metrics"][checked.metric]
    assert champion["quality_report_uri"].endswith(f"{quality['run_id']}/artifacts/quality_report.html")
    recorded = {(part["column"], part["value"]) for part in quality["slices"] if part["baseline"] is not None}
    assert ("plan", "basic") in recorded, "v2's gate scored slices on the same metric: they are the baselines"
    assert [r["version"] for r in s["recent_runs"]] == ["2", "1"]

    code, out, _ = cli(capsys, "status", "--model", MODEL)
    assert code == 0 and "champion: v2 since" in out and "DRIFTED" in out and "in cooldown until" in out
    assert f"last quality check: {quality['at']} " in out


def test_history_lists_versions_and_when_each_was_champion(demo, capsys):
    code, out, _ = cli(capsys, "history", "--model", MODEL, "--json")
    assert code == 0
    h = json.loads(out)
    v1, v2 = h["versions"][:2]
    assert (v1["decision"], v2["decision"]) == ("promote", "promote")
    assert v2["reason"].startswith("promote: accuracy") and v2["metrics"]["accuracy"] > v1["metrics"]["accuracy"]
    assert v1["triggered_by"].startswith("manual or CI run")
    moves = h["champion_moves"]
    assert [(m["version"], m["previous"], m["action"]) for m in moves[:2]] == [("1", None, "promote"),
                                                                              ("2", "1", "promote")]
    assert v1["champion_periods"][0] == {"from": moves[0]["at"], "until": moves[1]["at"]}
    from training.registry.versions import champion_at, champion_history

    assert champion_at(champion_history(MODEL), moves[1]["at"]) == "2"
    code, out, _ = cli(capsys, "history", "--model", MODEL)
    assert code == 0 and "champion moves:" in out and "v2" in out


def test_rollback_is_one_command_and_recorded(demo, capsys):
    code, out, _ = cli(capsys, "rollback", "--model", MODEL, "--reason", "v2 misroutes premium customers")
    try:
        assert code == 0 and "champion v2 -> v1" in out
        assert mlflow.MlflowClient().get_model_version_by_alias(MODEL, "champion").version == "1"
        code, out, _ = cli(capsys, "status", "--model", MODEL, "--json")
        champion = json.loads(out)["champion"]
        assert (champion["version"], champion["how"]) == ("1", "rollback")
        assert champion["reason"] == "v2 misroutes premium customers"
        code, _, err = cli(capsys, "rollback", "--model", MODEL, "--to", "1", "--reason", "again")
        assert code == EXIT_SETTINGS and "v1 is already the champion; pass another --to VERSION" in err
        assert len(err.strip().splitlines()) == 1  # a user error: the fix is in the message, no --debug hint
    finally:
        assert main(["rollback", "--model", MODEL, "--to", "2", "--reason", "restore for the other tests"]) == 0


def test_each_training_run_logs_its_pictures(demo):
    client = mlflow.MlflowClient()
    figures = {}
    for version in ("1", "2"):
        run_id = client.get_model_version(MODEL, version).run_id
        figures[version] = {a.path for a in client.list_artifacts(run_id, "figures")}
        assert len(client.get_metric_history(run_id, "train_loss")) == (1 if version == "1" else 6)
    base = {"figures/confusion_matrix.png", "figures/roc_pr.png", "figures/training_curves.png"}
    assert figures["1"] == base  # no champion to compare against
    assert figures["2"] == base | {"figures/gate_vs_champion.png"}
    report = client.get_model_version(MODEL, "2").tags["drift_report_uri"]
    assert "<html" in mlflow.artifacts.load_text(report).lower()[:2000]


def test_reproduce_demo_version_gives_identical_metrics_and_weights(demo, capsys):
    code, out, _ = cli(capsys, "reproduce", MODEL, "1", "--json")
    result = json.loads(out)
    assert code == 0 and result["identical"] is True
    assert result["weights_sha256"]["reproduced"] == result["weights_sha256"]["recorded"]
    assert result["differing_tensors"] == [] and result["world_size"] == 2
    assert {"holdout_accuracy", "holdout_roc_auc", "val_loss", "val_accuracy"} <= set(result["metrics"])
    assert all(m["recorded"] == m["reproduced"] for m in result["metrics"].values())
    assert result["data_md5"] == demo["data"].md5["train.parquet"] and "DVC" in result["data_source"]


def test_reproduce_refuses_code_that_is_not_the_recorded_commit(demo, capsys, monkeypatch):
    monkeypatch.setenv("KFLOOP_GIT_COMMIT", "0" * 40)
    code, _, err = cli(capsys, "reproduce", MODEL, "1")
    error = err.strip().splitlines()[-1]
    assert code == EXIT_FAILED and error.startswith("kfloop reproduce: error:") and "--debug" not in err
    assert f"trained by commit {demo['head']}" in error and "git worktree add" in error


def test_report_page_has_every_chart(demo, tmp_path, capsys):
    from pipelines.operations.report import CHART_IDS

    out = tmp_path / "report.html"
    code, _, _ = cli(capsys, "report", "--model", MODEL, "--out", str(out))
    page = out.read_text()
    assert code == 0 and not re.search(r'(src|href)\s*=\s*"(https?:)?//', page)  # nothing from the network
    for chart in CHART_IDS:
        start = page.index(f'id="{chart}"')
        assert "<svg" in page[start:page.index("</figure>", start)], chart


def test_status_output_never_carries_tracking_credentials():
    from data.redaction import redact

    assert redact("https://bob:s3cret@mlflow.example.com:5000/x") == "https://mlflow.example.com:5000/x"
    assert redact("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"
    assert redact("sqlite:///relative.db") == "sqlite:///relative.db"
