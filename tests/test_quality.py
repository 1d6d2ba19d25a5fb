"""When labels arrive: ``kfloop quality`` and the quality pipeline on a champion trained by the real training
pipeline (kfp.local). Rows like the training data leave it fine; the same rows with flipped labels degrade it, and
the pipeline then retrains through the trigger; every check is an MLflow run linked from the champion; a bad file
exits 3 naming file and column and records nothing."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import mlflow
import pandas as pd
import pytest

from data.errors import EXIT_DATA_FILE
from monitoring.inference_logs import InferenceLogWriter
from monitoring.records import QUALITY_REPORT_ARTIFACT, quality_checks
from pipelines.cli.commands import main
from training.registry.versions import QUALITY_REPORT_URI_TAG
from training.serving.table import table_request

MODEL = "quality-test"
FAST = ["--set", "quality.bootstrap_samples=200"]
CONTRACT = {"degraded", "metric", "value", "baseline", "ci_low", "ci_high", "rows", "reason"}


def run_cli(capsys, workdir, *args: str) -> tuple[int, str, str]:
    """``kfloop --workdir WORKDIR ARGS...``: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(["--workdir", str(workdir), *args])
    return (code, *capsys.readouterr())


@pytest.fixture(scope="module")
def champion(tmp_path_factory, demo_files):
    """A workdir whose model ``quality-test`` has champion v1; the stable batch as labelled rows, and flipped."""
    from data.settings import load_environment
    from pipelines.local.runs import run_pipeline

    root = tmp_path_factory.mktemp("quality")
    with pytest.MonkeyPatch.context() as mp:
        for key in ("MLFLOW_TRACKING_URI", "KFLOOP_HOME", "KFLOOP_GIT_COMMIT"):
            mp.delenv(key, raising=False)
        env = load_environment(root / "workdir")
        for key, value in env.export().items():
            mp.setenv(key, value)
        trained = run_pipeline("training", {"dataset_uri": str(demo_files["train.parquet"]), "target": "churned",
                                            "model_name": MODEL, "training": {"epochs": 3, "nproc_per_node": 1}},
                               env=env, quiet=True)
        assert trained["promoted"] is True
        rows = pd.read_parquet(demo_files["batch_stable.parquet"])
        flipped = root / "flipped.parquet"
        rows.assign(churned=1 - rows["churned"]).to_parquet(flipped, index=False)
        yield {"env": env, "stable": demo_files["batch_stable.parquet"], "flipped": flipped}


def test_rows_like_the_training_data_are_fine_and_flipped_labels_degrade(champion, capsys):
    workdir = champion["env"].workdir
    code, out, err = run_cli(capsys, workdir, "quality", "--model", MODEL, "--data", str(champion["stable"]),
                             "--json", *FAST)
    assert code == 0, err
    fine = json.loads(out)
    assert CONTRACT <= set(fine) and fine["degraded"] is False and fine["rows"] == 2000
    client = mlflow.MlflowClient()
    recorded = client.get_run(client.get_model_version(MODEL, "1").run_id).data.metrics
    assert fine["metric"] == "accuracy" and fine["baseline"] == recorded["eval_challenger_accuracy"]
    assert fine["ci_low"] <= fine["value"] <= fine["ci_high"] and abs(fine["value"] - fine["baseline"]) < 0.05
    assert {s["column"] for s in fine["slices"]} == {"contract", "payment_method", "region", "plan"}

    code, out, err = run_cli(capsys, workdir, "quality", "--model", MODEL, "--data", str(champion["flipped"]),
                             "--json", *FAST)
    assert code == 0, err
    bad = json.loads(out)
    assert bad["degraded"] is True and bad["value"] < bad["baseline"] - 0.3
    assert f"accuracy {bad['value']:.3f} on 2000 labelled rows vs {bad['baseline']:.3f}" in bad["reason"]
    assert f"[{bad['ci_low']:.3f}, {bad['ci_high']:.3f}]" in bad["reason"]

    checks = quality_checks(MODEL)
    assert [c["degraded"] for c in checks] == [False, True]
    assert {k: checks[-1][k] for k in CONTRACT} == {k: bad[k] for k in CONTRACT}
    assert checks[-1]["champion_version"] == "1" and checks[-1]["at"] >= checks[0]["at"]
    run = client.get_run(checks[-1]["run_id"])
    assert run.data.tags["kfloop.degraded"] == "true" and run.data.tags["kfloop.champion_version"] == "1"
    assert run.data.metrics["degraded"] == 1.0 and run.data.metrics["quality_value"] == bad["value"]
    link = client.get_model_version(MODEL, "1").tags[QUALITY_REPORT_URI_TAG]
    assert link == f"{run.info.artifact_uri}/{QUALITY_REPORT_ARTIFACT}"
    page = mlflow.artifacts.load_text(link)
    assert "ROC AUC" in page and "Precision" in page and "DEGRADED" in page and bad["reason"][:40] in page


def test_labels_arriving_separately_are_joined_on_the_id(champion, capsys, tmp_path):
    rows = pd.read_parquet(champion["stable"])
    rows.drop(columns=["churned"]).to_csv(tmp_path / "rows.csv", index=False)
    rows[["customer_id", "churned"]].head(1200).to_csv(tmp_path / "labels.csv", index=False)
    code, out, err = run_cli(capsys, champion["env"].workdir, "quality", "--model", MODEL, "--data",
                             str(tmp_path / "rows.csv"), "--labels", str(tmp_path / "labels.csv"), "--id-column",
                             "customer_id", "--json", *FAST)
    assert code == 0, err
    joined = json.loads(out)
    assert joined["rows"] == 1200 and joined["unlabelled_rows"] == 800 and joined["degraded"] is False
    assert joined["labels_uri"] == str(tmp_path / "labels.csv")


def test_labels_join_served_predictions_by_request_id_as_they_join_the_table(champion, capsys, tmp_path):
    """The served rows (requests of 20 rows logged as KServe does) with delayed labels keyed by row_id: the same
    verdict and figures as the table's rows with the same labels joined on customer_id."""
    rows = pd.read_parquet(champion["stable"])
    writer = InferenceLogWriter(tmp_path / "logs", namespace="ml", inference_service=MODEL)
    start = datetime.now(timezone.utc) - timedelta(hours=2)
    labels = []
    for i in range(0, len(rows), 20):
        part = rows.iloc[i:i + 20]
        rid = writer.log(None, table_request(part.drop(columns=["churned"]), MODEL).to_rest()[0], None, model=MODEL, version=1,
                         received=start + timedelta(seconds=i))
        labels += [{"row_id": f"{rid}/{j}", "customer_id": cid, "churned": y}
                   for j, (cid, y) in enumerate(zip(part["customer_id"], part["churned"]))]
    pd.DataFrame(labels[:1200]).to_csv(tmp_path / "labels.csv", index=False)
    rows.drop(columns=["churned"]).to_csv(tmp_path / "rows.csv", index=False)
    code, out, err = run_cli(capsys, champion["env"].workdir, "quality", "--model", MODEL, "--current-logs",
                             str(tmp_path / "logs"), "--since", "3h", "--labels", str(tmp_path / "labels.csv"),
                             "--join-column", "row_id", "--json", *FAST)
    assert code == 0, err
    served = json.loads(out)
    code, out, err = run_cli(capsys, champion["env"].workdir, "quality", "--model", MODEL, "--data",
                             str(tmp_path / "rows.csv"), "--labels", str(tmp_path / "labels.csv"), "--join-column",
                             "customer_id", "--json", *FAST)
    assert code == 0, err
    table = json.loads(out)
    assert served["rows"] == 1200 and served["unlabelled_rows"] == 800
    assert {k: served[k] for k in CONTRACT} == {k: table[k] for k in CONTRACT}
    assert served["labelled_uri"] == f"{tmp_path / 'logs'} (since 3h)"
    code, out, err = run_cli(capsys, champion["env"].workdir, "quality", "--model", MODEL, "--current-logs",
                             str(tmp_path / "logs"), "--labels", str(tmp_path / "labels.csv"), "--json", *FAST)
    assert code != 0 and "repeats ids" in err, "request_id (the default) is no row key for requests of 20 rows"


def test_a_bad_file_exits_3_naming_file_and_column_and_records_nothing(champion, capsys, tmp_path):
    before = len(quality_checks(MODEL))
    rows = pd.read_parquet(champion["stable"])
    no_target = tmp_path / "no_target.parquet"
    rows.drop(columns=["churned"]).to_parquet(no_target, index=False)
    bad_age = tmp_path / "bad_age.csv"
    rows.assign(age=rows["age"].where(rows.index != 3, 400)).to_csv(bad_age, index=False)
    labels = tmp_path / "labels.csv"
    pd.DataFrame({"customer_id": [rows["customer_id"].iloc[0], -17], "churned": [0, 1]}).to_csv(labels, index=False)
    cases = {
        (str(no_target),): f"{no_target}: column 'churned' failed required: the column is missing",
        (str(bad_age),): f"{bad_age}: column 'age' failed in_range(",  # the inferred range, then the value:
        (str(no_target), "--labels", str(labels), "--id-column", "customer_id"):
            f"{labels}: 1 label(s) for 'customer_id' values not in {no_target}, e.g. [-17]",
        (str(tmp_path / "gone.parquet"),): f"{tmp_path / 'gone.parquet'}: file not found",
    }
    for (data, *extra), message in cases.items():
        code, out, err = run_cli(capsys, champion["env"].workdir, "quality", "--model", MODEL, "--data", data,
                                 *extra, "--json")
        assert code == EXIT_DATA_FILE and message in err, (data, err)
        error = json.loads(out)  # --json: the error, never a verdict
        assert set(error) == {"error", "hint", "exit_code"} and error["exit_code"] == EXIT_DATA_FILE
        assert message in error["error"]
    assert "1 value(s), e.g. [400] at data rows [3]" in run_cli(capsys, champion["env"].workdir, "quality", "--model", MODEL,
                                                            "--data", str(bad_age))[2]
    assert len(quality_checks(MODEL)) == before


def test_the_pipeline_retrains_when_degraded_and_status_and_report_show_the_check(champion, capsys, tmp_path):
    workdir = champion["env"].workdir
    run = ["run", "quality", "--local", "--json", "--set", f"model_name={MODEL}", "--set", "trigger.cooldown_seconds=0",
           "--set", "training.epochs=1", "--set", "training.nproc_per_node=1", *FAST]
    code, out, err = run_cli(capsys, workdir, *run, "--set", f"labelled_uri={champion['stable']}")
    assert code == 0, err
    fine = json.loads(out)
    assert fine["degraded"] is False and fine["trigger"] is None and fine["retrain"] is None

    code, out, err = run_cli(capsys, workdir, *run, "--set", f"labelled_uri={champion['flipped']}")
    assert code == 0, err
    bad = json.loads(out)
    assert bad["degraded"] is True and bad["trigger"]["fire"] is True
    assert bad["retrain"]["model_version"] == bad["trigger"]["run_id"] == "2"
    lineage = mlflow.MlflowClient().get_model_version(MODEL, "2").tags
    assert lineage["data_uri"] == str(champion["flipped"]), "the retraining trained on the labelled rows"

    code, out, err = run_cli(capsys, workdir, "status", "--model", MODEL, "--json")
    last = json.loads(out)["last_quality_check"]
    assert code == 0 and last["degraded"] is True and last["run_id"] == quality_checks(MODEL)[-1]["run_id"]
    code, out, _ = run_cli(capsys, workdir, "status", "--model", MODEL)
    assert f"last quality check: {last['at']} DEGRADED (accuracy {last['value']:.4f}" in out

    code, _, err = run_cli(capsys, workdir, "report", "--model", MODEL, "--out", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    chart = page[page.index('id="quality-over-time"'):]
    assert code == 0 and "<svg" in chart[:chart.index("</figure>")]
    assert "DEGRADED" in page[page.index('id="last-quality-check"'):]
