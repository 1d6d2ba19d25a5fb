"""The CLI surface is pinned (a new flag is a deliberate change); schema and validate commands on real files."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipelines.cli.commands import build_parser, main
from training.errors import EXIT_DATA_FILE, EXIT_FAILED

REPO = Path(__file__).resolve().parents[1]
GLOBAL = ["--debug", "--workdir"]
"""Accepted before the command and after it, by every command."""
SURFACE = {
    "": GLOBAL,
    "bench": ["--max-bytes", "--nproc", "--out"],
    "compile": ["--config", "--credentials-secret", "--enable-caching", "--gpu-node-selector", "--gpu-toleration",
                "--gpus", "--image", "--out", "--set", "--shared-mount-path", "--shared-volume-claim"],
    "demo": ["--json"],
    "drift": ["--config", "--current", "--json", "--model-name", "--reference", "--report", "--schema", "--set"],
    "infer-schema": ["--data", "--id-column", "--target", "--task"],
    "quality": ["--config", "--data", "--id-column", "--json", "--labels", "--model", "--report", "--set"],
    "render-job": ["--config", "--gpus-per-node", "--kind", "--nnodes", "--nproc-per-node", "--run-id", "--set"],
    "run": ["--config", "--host", "--json", "--local", "--namespace", "--service-account", "--set", "--version",
            "--wait"],
    "schedule": ["--config", "--cron", "--delete", "--disable", "--host", "--name", "--namespace",
                 "--service-account", "--set", "--version"],
    "serve": ["--bind", "--config", "--kfp-host", "--max-body-bytes", "--namespace", "--open-metrics", "--port",
              "--service-account", "--set", "--version"],
    "upload": ["--config", "--credentials-secret", "--enable-caching", "--gpu-node-selector", "--gpu-toleration",
               "--gpus", "--host", "--image", "--json", "--namespace", "--set", "--shared-mount-path",
               "--shared-volume-claim", "--version"],
    "train": ["--backend", "--config", "--data", "--model-dir", "--nnodes", "--nproc-per-node", "--schema", "--set"],
    "validate": ["--data", "--report-csv", "--schema"],
    "status": ["--config", "--json", "--model", "--set"],
    "history": ["--json", "--model"],
    "rollback": ["--json", "--model", "--reason", "--to"],
    "reproduce": ["--config", "--json", "--set"],
    "report": ["--model", "--out"],
}


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_cli_surface_is_pinned():
    parser = build_parser()
    subparsers = _subparsers(parser)
    assert all(set(GLOBAL) <= set(_flags(p)) for p in subparsers.values())
    assert {"": _flags(parser), **{name: sorted(set(_flags(p)) - set(GLOBAL))
                                   for name, p in subparsers.items()}} == SURFACE


def test_global_flags_work_before_or_after_the_command():
    parser = build_parser()
    for argv in (["--workdir", "W", "--debug", "status"], ["status", "--workdir", "W", "--debug"],
                 ["--debug", "status", "--workdir", "W"]):
        args = parser.parse_args(argv)
        assert (args.workdir, args.debug) == ("W", True), argv
    args = parser.parse_args(["status"])
    assert (args.workdir, args.debug) == (None, False)
    assert parser.parse_args(["--workdir", "A", "demo", "--workdir", "B"]).workdir == "B"  # the nearer one wins


def test_global_flag_after_the_command_reaches_the_command(tmp_path, capsys):
    """``kfloop status --workdir W`` reads W's registry (a fresh one, which does not know the model)."""
    code = main(["status", "--model", "nobody", "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert code == EXIT_FAILED
    assert f"model 'nobody' is not registered in sqlite:///{tmp_path / 'w' / 'mlflow.db'}" in err


def test_python_dash_m_pipelines_is_the_cli():
    out = subprocess.run([sys.executable, "-m", "pipelines", "--help"], capture_output=True, text=True, check=True)
    assert "infer-schema" in out.stdout and "demo" in out.stdout


def test_infer_schema_then_validate(tmp_path, demo_files, capsys):
    assert main(["infer-schema", "--data", str(demo_files["train.parquet"]), "--target", "churned"]) == 0
    schema = tmp_path / "schema.yaml"
    schema.write_text(capsys.readouterr().out)
    assert main(["validate", "--data", str(demo_files["train.parquet"]), "--schema", str(schema)]) == 0

    bad = pd.read_parquet(demo_files["train.parquet"]).head(300)
    bad.loc[0, "age"] = -5
    bad.loc[1, "contract"] = "lifetime"
    bad_path = tmp_path / "bad.csv"
    bad.to_csv(bad_path, index=False)
    capsys.readouterr()
    assert main(["validate", "--data", str(bad_path), "--schema", str(schema)]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "bad.csv" in err and "age" in err and "-5" in err and "contract" in err and "lifetime" in err


@pytest.mark.parametrize("content", [None, b""])
def test_unreadable_file_gets_one_line_and_its_own_exit_code(tmp_path, content, capsys):
    path = tmp_path / "data.parquet"
    if content is not None:
        path.write_bytes(content)
    assert main(["validate", "--data", str(path), "--schema", str(REPO / "data" / "schema.yaml")]) == EXIT_DATA_FILE
    err = capsys.readouterr().err.strip().splitlines()
    assert str(path) in err[0] and len(err) == 2 and err[1].startswith("hint:")


def test_bad_setting_names_the_fix(capsys):
    assert main(["run", "training", "--local", "--set", "dataset_uri=x.csv", "--set", "training.epochs=0"]) == 1
    assert "epochs=0" in capsys.readouterr().err


def test_train_two_nodes_of_two_ranks_ends_with_identical_parameters(tmp_path, demo_files, capsys):
    model_dir = tmp_path / "model"
    code = main(["--workdir", str(tmp_path / "w"), "train", "--data", str(demo_files["train.parquet"]), "--schema",
                 str(REPO / "data" / "schema.yaml"), "--nnodes", "2", "--nproc-per-node", "2", "--model-dir",
                 str(model_dir), "--set", "training.epochs=2"])
    assert code == 0, capsys.readouterr().err
    assert f"model: {model_dir}" in capsys.readouterr().out
    description = json.loads((model_dir / "model.json").read_text())
    assert description["world_size"] == 4
    assert len(description["param_digests"]) == 4 and len(set(description["param_digests"])) == 1


FEATURES = {"age", "tenure_months", "monthly_charges", "total_charges", "support_calls", "contract",
            "payment_method", "region", "plan"}


def test_drift_without_schema_infers_it_from_the_reference_and_says_so(tmp_path, demo_files, capsys):
    """The current batch has no labels yet: the reference's one extra column is the target."""
    current = tmp_path / "unlabelled.parquet"
    pd.read_parquet(demo_files["batch_drifted.parquet"]).drop(columns=["churned"]).to_parquet(current)
    code = main(["--workdir", str(tmp_path / "w"), "drift", "--reference", str(demo_files["train.parquet"]),
                 "--current", str(current), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert out["schema_source"] == "inferred from the reference (target 'churned', classification)"
    assert "no schema given: inferred from the reference" in captured.err
    assert set(out["columns"]) == FEATURES and out["drifted"] is True  # customer_id is an id, churned the target


def test_drift_without_schema_or_target_compares_every_shared_column(tmp_path, demo_files, capsys):
    args = ["--workdir", str(tmp_path / "w"), "drift", "--reference", str(demo_files["train.parquet"]), "--current",
            str(demo_files["batch_stable.parquet"])]
    code = main([*args, "--json"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 0, captured.err
    assert out["schema_source"] == ("none: every column the reference and the current data share (types from the "
                                    "reference, no target)")
    assert "comparing every column the reference and the current data share" in captured.err
    assert set(out["columns"]) == FEATURES | {"customer_id", "churned"}
    assert out["columns"]["churned"]["method"] == "jensenshannon"  # 0/1 as a number with 2 values
    assert out["columns"]["customer_id"]["drifted"]  # ids of new customers: nothing excludes them without a schema
    code = main([*args, "--set", "target=churned"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("schema: inferred from the reference (target 'churned', classification)\n")
    assert "drifted: False" in out
    code = main([*args, "--set", "target=churn"])
    assert code == EXIT_FAILED and "target 'churn' is not a column of the reference" in capsys.readouterr().err


def test_drift_without_reference_names_what_is_missing(isolated_env, demo_files):
    from monitoring.steps import drift_step

    check = dict(current_uri=str(demo_files["batch_stable.parquet"]), reference_uri="", schema_uri="", policy={},
                 report_out="")
    with pytest.raises(ValueError, match=r"^no reference data: no --model-name \(model_name\) whose champion's "
                                         r"training data to use; pass --reference FILE \(reference_uri\)$"):
        drift_step(**check, model_name="")
    with pytest.raises(ValueError, match=r"^no reference data: model 'ghost' has no champion to take the training "
                                         r"data from; pass --reference FILE"):
        drift_step(**check, model_name="ghost")


def test_drift_json_contract(tmp_path, demo_files, capsys):
    report = tmp_path / "drift.html"
    code = main(["drift", "--reference", str(demo_files["train.parquet"]), "--current",
                 str(demo_files["batch_drifted.parquet"]), "--schema", str(REPO / "data" / "schema.yaml"),
                 "--report", str(report), "--json", "--set", "drift.drift_share=0.3"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["drifted"] is True and out["share_drifted_columns"] >= 0.3
    assert set(out["columns"]) == FEATURES and out["schema_source"] == str(REPO / "data" / "schema.yaml")
    for col in out["columns"].values():
        assert set(col) == {"method", "score", "threshold", "drifted", "error", "basis"}
    assert report.stat().st_size > 0 and out["report_path"] == str(report)
    assert set(out["schema_violations"]) == set(out["columns"])  # the drifted demo batch stays inside the schema
    assert all(shares["share"] == 0.0 for shares in out["schema_violations"].values())
    assert out["reason"].startswith(f"{sum(c['drifted'] for c in out['columns'].values())} of 9 columns drifted")
