"""The drift side under faults: a drift check that crashes leaves no verdict, no retrain and the previous state; a
damaged trigger state file stops the trigger; after a retrain the reference moves, so one shift triggers once."""
from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from data.generate import generate
from monitoring.steps.checks import drift_step
from monitoring.steps.trigger import trigger_step, trigger_store
from monitoring.trigger import TriggerStateError
from pipelines.cli.commands import main

REPO = Path(__file__).resolve().parents[1]
DEMO_SCHEMA = REPO / "data" / "schema.yaml"
MODEL = "drift-faults"
pytestmark = pytest.mark.chaos


def _run_drift(capsys, workdir: Path, current: Path, reference: Path | str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--workdir", str(workdir), "run", "drift", "--local", "--json", "--set", f"current_uri={current}",
                 "--set", f"reference_uri={reference}", "--set", f"schema_uri={DEMO_SCHEMA}",
                 "--set", f"model_name={MODEL}", "--set", "trigger.cooldown_seconds=0"])
    out, err = capsys.readouterr()
    return code, out, err


def _state(workdir: Path) -> dict:
    """Everything a drift check may change: the trigger state file and every MLflow run and model version."""
    client = mlflow.MlflowClient()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    trigger_file = workdir / "trigger" / f"{MODEL}.json"
    return {"trigger": trigger_file.read_bytes() if trigger_file.exists() else None,
            "runs": sorted((r.info.run_id, r.info.status) for r in runs),
            "versions": [v.version for v in client.search_model_versions()]}


def test_a_crashing_drift_check_leaves_no_verdict_no_retrain_and_the_previous_state(tmp_path, isolated_env,
                                                                                     capsys, demo_files):
    trigger_step(model_name=MODEL, data_md5="ea71e7", policy={}, start=lambda: "run-earlier")
    reference, stable = demo_files["train.parquet"], demo_files["batch_stable.parquet"]
    code, out, err = _run_drift(capsys, isolated_env.workdir, stable, reference)
    assert code == 0, err
    assert json.loads(out)["drifted"] is False
    before = _state(isolated_env.workdir)
    assert before["trigger"] is not None

    few = tmp_path / "few.parquet"
    pd.read_parquet(demo_files["batch_drifted.parquet"]).head(5).to_parquet(few, index=False)
    crashes = {"missing reference": (stable, tmp_path / "gone.parquet", "gone.parquet"),
               "too few rows": (few, reference, "5 rows, fewer than min_rows=30")}
    for case, (current, ref, words) in crashes.items():
        code, out, err = _run_drift(capsys, isolated_env.workdir, current, ref)
        error = json.loads(out)  # --json: the error as JSON on stdout, instead of a verdict
        assert code != 0 and words in error["error"] and error["exit_code"] == code, (case, out, err)
        assert "drifted" not in error, f"{case}: no verdict is printed (status unknown)"
        assert _state(isolated_env.workdir) == before, f"{case}: no retrain, nothing recorded, state kept"

    code, out, err = _run_drift(capsys, isolated_env.workdir, stable, reference)
    assert code == 0 and json.loads(out)["drifted"] is False, "the next check runs normally"


def test_an_evidently_level_error_is_a_failed_check_not_a_verdict(tmp_path, isolated_env, demo_files):
    current = pd.read_parquet(demo_files["batch_stable.parquet"]).astype({"age": object})
    current.loc[:, "age"] = "unknown"
    path = tmp_path / "texts.parquet"
    current.to_parquet(path, index=False)
    with pytest.raises(ValueError, match="numeric column 'age' in the current data holds non-numbers"):
        drift_step(current_uri=str(path), reference_uri=str(demo_files["train.parquet"]),
                   schema_uri=str(DEMO_SCHEMA), model_name=MODEL, policy={}, report_out="")
    assert mlflow.MlflowClient().get_experiment_by_name(f"{MODEL}-drift") is None, "no check was recorded"


# ---------------------------------------------------------------------------------------------- 24: state file

def _recorded_state() -> Path:
    store = trigger_store(MODEL)
    trigger_step(model_name=MODEL, data_md5="0a", policy={}, start=lambda: "run-1")
    return store.path


@pytest.mark.parametrize("damage", ["truncated", "empty", "zeroed", "not-an-object"])
def test_a_damaged_trigger_state_stops_the_trigger_and_says_why(tmp_path, isolated_env, damage):
    path = _recorded_state()
    whole = path.read_bytes()
    damaged = {"truncated": whole[: len(whole) // 2], "empty": b"", "zeroed": b"\0" * len(whole),
               "not-an-object": b'"models"'}[damage]
    path.write_bytes(damaged)
    started = []
    with pytest.raises(TriggerStateError, match=rf"trigger state file {path} is unusable: .*move it aside") as err:
        trigger_step(model_name=MODEL, data_md5="0b", policy={"cooldown_seconds": 0},
                     start=lambda: started.append(1) or "run-2")
    assert started == [], "no training run was started"
    assert path.read_bytes() == damaged, "the evidence is left as it was"
    assert err.value.problem


def test_every_cut_of_a_state_file_is_detected(tmp_path, isolated_env):
    path = _recorded_state()
    whole = path.read_bytes()
    store = trigger_store(MODEL)
    for cut in range(len(whole) - 2):  # a trailing newline or brace may be all that a complete file lacks
        path.write_bytes(whole[:cut])
        with pytest.raises(TriggerStateError):
            store.load()


# ------------------------------------------------------------------------------------- 25: reference moves on

def _champion_trained_on(data: Path, client: mlflow.MlflowClient, experiment_id: str) -> str:
    """A registered version whose lineage says it was trained on ``data``, made champion (what a promoted
    retrain leaves behind)."""
    run_id = client.create_run(experiment_id).info.run_id
    version = client.create_model_version(MODEL, source=f"runs:/{run_id}/model", run_id=run_id,
                                          tags={"data_uri": str(data)}).version
    client.set_registered_model_alias(MODEL, "champion", version)
    return str(version)


def test_after_a_retrain_the_reference_moves_so_the_same_shift_does_not_trigger_again(tmp_path, isolated_env):
    original, shifted, shifted_again = tmp_path / "original.parquet", tmp_path / "shifted.parquet", \
        tmp_path / "shifted-again.parquet"
    generate(1500, seed=1).to_parquet(original, index=False)
    generate(1500, seed=2, covariate_shift=1.0).to_parquet(shifted, index=False)
    generate(1500, seed=3, covariate_shift=1.0).to_parquet(shifted_again, index=False)
    client = mlflow.MlflowClient()
    experiment = client.create_experiment(MODEL, artifact_location=(tmp_path / "artifacts").as_uri())
    client.create_registered_model(MODEL)
    policy = {"include_predictions": False}

    def check(current: Path):
        return drift_step(current_uri=str(current), reference_uri="", schema_uri=str(DEMO_SCHEMA), model_name=MODEL,
                          policy=policy, report_out="")

    _champion_trained_on(original, client, experiment)
    first = check(shifted)
    assert first.drift.drifted is True
    assert first.reference_uri == str(original)

    _champion_trained_on(shifted, client, experiment)  # the retrain on the shifted data was promoted
    after = check(shifted_again)
    assert after.reference_uri == str(shifted)
    assert after.drift.drifted is False, after.drift.to_dict()
