"""The training pipeline end to end with kfp.local: first run promotes; every bad input fails loudly and
changes nothing in the registry."""
from __future__ import annotations

import json
import subprocess
import sys

import mlflow
import numpy as np
import pandas as pd
import pytest

from data.errors import EXIT_DATA_FILE, EXIT_FAILED
from data.fileio import file_digest
from pipelines.cli.commands import main

MODEL = "loop-test"
FAST = ["--set", "training.epochs=3"]


def run_cli(capsys, workdir, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--workdir", str(workdir), *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def champion_env(tmp_path_factory, demo_files):
    """A workdir whose model ``loop-test`` has champion v1, trained through the CLI."""
    from data.settings import load_environment

    with pytest.MonkeyPatch.context() as mp:
        for key in ("MLFLOW_TRACKING_URI", "KFLOOP_HOME", "KFLOOP_GIT_COMMIT"):
            mp.delenv(key, raising=False)
        workdir = tmp_path_factory.mktemp("loop") / "workdir"
        env = load_environment(workdir)
        for key, value in env.export().items():
            mp.setenv(key, value)
        config = workdir.parent / "kfloop.yaml"  # the job's shape in the training section (issue 13's bug)
        config.write_text("training: {nproc_per_node: 1}\n")
        code = main(["--workdir", str(workdir), "run", "training", "--local", "--json", "--config", str(config),
                     "--set", f"dataset_uri={demo_files['train.parquet']}", "--set", "target=churned", "--set",
                     f"model_name={MODEL}", *FAST])
        assert code == 0
        yield env


def _versions(name: str) -> list[str]:
    return sorted(str(v.version) for v in mlflow.MlflowClient().search_model_versions(f"name='{name}'"))


def _champion(name: str) -> str:
    return str(mlflow.MlflowClient().get_model_version_by_alias(name, "champion").version)


def test_first_run_infers_schema_promotes_and_records_lineage(champion_env, demo_files):
    client = mlflow.MlflowClient()
    assert _versions(MODEL) == ["1"] and _champion(MODEL) == "1"
    version = client.get_model_version(MODEL, "1")
    assert version.tags["decision"] == "promote"
    assert "floor" in version.tags["reason"] or "no champion" in version.tags["reason"]
    assert version.tags["data_md5"] == file_digest(demo_files["train.parquet"], "md5")
    assert version.tags["pipeline_run_id"] and version.tags["git_commit"]
    # the split is part of the lineage, so `kfloop reproduce` splits the same way instead of guessing
    assert (version.tags["holdout_fraction"], version.tags["split_seed"]) == ("0.2", "42")
    run = client.get_run(version.run_id)
    schema_text = mlflow.artifacts.load_text(f"runs:/{version.run_id}/schema.yaml")
    assert "churned" in schema_text
    epochs = client.get_metric_history(version.run_id, "val_loss")
    assert [m.step for m in epochs] == [1, 2, 3] or [m.step for m in epochs] == [0, 1, 2]
    assert run.data.params
    # kfloop.yaml's training.nproc_per_node is what trained (the pipeline parameter's default of 2 does not win)
    assert (run.data.params["nproc_per_node"], run.data.params["world_size"]) == ("1", "1")
    # the lineage keeps the two halves of the training settings apart: how the model trained, and the job's shape
    lineage = mlflow.artifacts.load_dict(f"runs:/{version.run_id}/lineage.json")
    assert (lineage["job_shape"]["nproc_per_node"], lineage["job_shape"]["backend"]) == (1, "local")
    assert lineage["training_config"]["epochs"] == 3 and "nproc_per_node" not in lineage["training_config"]


def test_champion_loads_with_pyfunc_and_predicts_raw_rows(champion_env, demo_files):
    raw = pd.read_parquet(demo_files["batch_stable.parquet"]).drop(columns=["churned"]).head(50)
    raw.loc[0, "region"] = None
    raw.loc[1, "total_charges"] = np.nan
    raw.loc[2, "plan"] = "never-seen-plan"
    out = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").predict(raw)
    assert len(out) == 50 and set(out["prediction"]) <= {0, 1}
    assert np.allclose(out[[c for c in out.columns if c.startswith("proba_")]].sum(axis=1), 1.0)


def _bad_inputs(tmp, train: pd.DataFrame, parquet_path) -> dict[str, tuple]:
    """name -> (file, expected exit code, words the error must contain)."""
    good = train.head(400).copy()
    cases = {}

    def csv(name, text):
        p = tmp / f"{name}.csv"
        p.write_text(text)
        return p

    def frame(name, df):
        p = tmp / f"{name}.parquet"
        df.to_parquet(p, index=False)
        return p

    header = ",".join(good.columns)
    cases["missing file"] = (tmp / "nope.parquet", EXIT_DATA_FILE, ["nope.parquet"])
    cases["empty file"] = (csv("empty", ""), EXIT_DATA_FILE, ["empty.csv", "empty"])
    cases["header only"] = (csv("header", header + "\n"), EXIT_DATA_FILE, ["header.csv"])
    truncated = tmp / "truncated.parquet"
    truncated.write_bytes(parquet_path.read_bytes()[:2000])
    cases["truncated parquet"] = (truncated, EXIT_DATA_FILE, ["truncated.parquet"])
    text = good.astype({"age": object})
    text.loc[3, "age"] = "forty"
    cases["text in numeric"] = (csv("text", text.to_csv(index=False)), EXIT_FAILED, ["age", "forty"])
    nulls = good.copy()
    nulls.loc[[1, 2], "contract"] = None
    cases["nulls not allowed"] = (frame("nulls", nulls), EXIT_FAILED, ["contract", "null"])
    out_of_range = good.copy()
    out_of_range.loc[4, "age"] = 400
    cases["out of range"] = (frame("range", out_of_range), EXIT_FAILED, ["age", "400"])
    unseen = good.copy()
    unseen.loc[5, "contract"] = "ten-year"
    cases["unseen category"] = (frame("unseen", unseen), EXIT_FAILED, ["contract", "ten-year"])
    cases["missing column"] = (frame("missing_col", good.drop(columns=["plan"])), EXIT_FAILED, ["plan"])
    cases["extra column"] = (frame("extra_col", good.assign(surprise=1)), EXIT_FAILED, ["surprise"])
    lines = good.to_csv(index=False).splitlines()
    lines[0] = lines[0].replace("plan", "region")
    cases["duplicate header"] = (csv("dupheader", "\n".join(lines) + "\n"), EXIT_DATA_FILE, ["region", "duplicate"])
    single = good.assign(churned=0)
    cases["single-class target"] = (frame("single", single), EXIT_FAILED, ["churned"])
    return cases


BAD = ["missing file", "empty file", "header only", "truncated parquet", "text in numeric", "nulls not allowed",
       "out of range", "unseen category", "missing column", "extra column", "duplicate header",
       "single-class target"]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_fails_clearly_and_registers_nothing(case, champion_env, demo_files, tmp_path, capsys):
    train = pd.read_parquet(demo_files["train.parquet"])
    path, expected_code, words = _bad_inputs(tmp_path, train, demo_files["train.parquet"])[case]
    code, _, err = run_cli(capsys, champion_env.workdir, "run", "training", "--local", "--set",
                           f"dataset_uri={path}", "--set", f"model_name={MODEL}", *FAST)
    assert code == expected_code, err
    for word in [str(path.name), *words]:
        assert word.lower() in err.lower(), (word, err)
    assert _versions(MODEL) == ["1"] and _champion(MODEL) == "1"


def test_users_own_multiclass_csv(tmp_path, isolated_env, capsys):
    rng = np.random.default_rng(7)
    n = 900
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    colour = rng.choice(["red", "green", "blue"], size=n)
    score = x1 + (colour == "red") * 1.5 - x2
    label = np.where(score > 0.8, "high", np.where(score < -0.8, "low", "mid"))
    df = pd.DataFrame({"x1": x1, "x2": x2, "colour": colour, "grade": label})
    df.loc[rng.choice(n, 40, replace=False), "x2"] = np.nan
    df.loc[rng.choice(n, 30, replace=False), "colour"] = None
    path = tmp_path / "mine.csv"
    df.to_csv(path, index=False)
    code, out, err = run_cli(capsys, isolated_env.workdir, "run", "training", "--local", "--json", "--set",
                             f"dataset_uri={path}", "--set", "target=grade", "--set", "model_name=mine",
                             "--set", "training.epochs=6")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["model_name"] == "mine" and summary["model_version"] == "1"
    assert summary["promoted"] is True and summary["champion_version"] == "1"
    assert summary["metrics"]["accuracy"] > 0.6 and summary["reason"]
    predicted = mlflow.pyfunc.load_model("models:/mine@champion").predict(df.drop(columns=["grade"]).head(20))
    assert set(predicted["prediction"]) <= {"high", "low", "mid"}


def test_champion_flags_rows_outside_its_training_schema(champion_env, demo_files):
    raw = pd.read_parquet(demo_files["batch_stable.parquet"]).drop(columns=["churned"]).head(20)
    raw = raw.reset_index(drop=True)
    raw.loc[3, ["region", "monthly_charges"]] = ["atlantis", 1e9]
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    out = model.predict(raw)
    flags = out["schema_violations"]
    assert flags[3].startswith("monthly_charges: 1e+09 above max ") and "region: unseen category 'atlantis'" in flags[3]
    assert (flags.drop(index=3) == "").all()
    with pytest.raises(ValueError, match=r"1 of 20 row\(s\) fall outside the model's training schema: row 3: "
                                         r"monthly_charges: 1e\+09 above max .*region: unseen category 'atlantis'"):
        model.predict(raw, params={"on_schema_violation": "error"})
    ignored = model.predict(raw, params={"on_schema_violation": "ignore"})
    assert "schema_violations" not in ignored.columns
    pd.testing.assert_frame_equal(ignored, out.drop(columns=["schema_violations"]))
    clean = model.predict(raw.drop(index=3), params={"on_schema_violation": "error"})
    assert len(clean) == 19


def test_violation_mode_is_a_signature_param_in_a_fresh_process(champion_env, demo_files, tmp_path):
    """``mlflow.pyfunc.load_model(...).predict(df, params=...)`` works where only the registry is known."""
    rows = pd.read_parquet(demo_files["batch_stable.parquet"]).drop(columns=["churned"]).head(5)
    rows.loc[rows.index[0], "region"] = "atlantis"
    rows.to_parquet(tmp_path / "rows.parquet")
    script = (
        "import sys, mlflow, pandas as pd\n"
        f"model = mlflow.pyfunc.load_model('models:/{MODEL}@champion')\n"
        "params = {p.name: p.default for p in model.metadata.get_params_schema().params}\n"
        "print('params', params)\n"
        "rows = pd.read_parquet(sys.argv[1])\n"
        "print('flags', list(model.predict(rows)['schema_violations']))\n"
        "try:\n"
        "    model.predict(rows, params={'on_schema_violation': 'error'})\n"
        "except ValueError as exc:\n"
        "    print('error', exc)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "rows.parquet")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "params {'on_schema_violation': 'flag'}" in done.stdout
    assert "flags [\"region: unseen category 'atlantis'\", '', '', '', '']" in done.stdout
    assert "error 1 of 5 row(s) fall outside the model's training schema: row" in done.stdout
