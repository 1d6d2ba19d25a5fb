"""What a script and a newcomer get back from ``kfloop``: one exit code per kind of outcome, read-only commands that
write nothing, errors that say what to do in a line or two, and old flag spellings that still work."""
from __future__ import annotations

import ast
import importlib
import json
import socket
from pathlib import Path

import pytest

from data.errors import (EXIT_CODES, EXIT_DATA_FILE, EXIT_FAILED, EXIT_FINDING, EXIT_SERVICE, EXIT_SETTINGS,
                         EXIT_USAGE, KfloopError)
from pipelines.cli.commands import build_parser, main
from pipelines.cli.options import as_kfloop_error

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("data", "training", "monitoring", "pipelines", "components")


def _modules_with_errors() -> list[str]:
    """Every module of ours that imports ``data.errors`` (where a :class:`KfloopError` subclass can be defined)."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            if any(isinstance(node, ast.ImportFrom) and node.module == "data.errors" for node in ast.walk(tree)):
                found.append(".".join(path.relative_to(REPO).with_suffix("").parts))
    return found


def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_subclasses(direct)}}


def test_every_kfloop_error_maps_to_one_code_of_the_table():
    modules = _modules_with_errors()
    assert "data.tables" in modules and "pipelines.kfp_server.runs" in modules
    for module in modules:
        importlib.import_module(module)
    errors = _subclasses(KfloopError)
    assert len(errors) >= 20  # every module's errors were found, not a few
    unmapped = {f"{e.__module__}.{e.__qualname__}: {e.exit_code}" for e in errors if e.exit_code not in EXIT_CODES}
    assert unmapped == set()
    assert all(e.exit_code != 0 for e in errors)
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES) and EXIT_USAGE == 2  # argparse's own


def test_a_finding_a_bad_setting_and_a_missing_file_exit_differently(tmp_path, demo_files, monkeypatch, capsys):
    """The issue's done-when: --fail-on-drift on drifted data vs an unknown setting; a missing --config file and a
    missing data file are the same kind."""
    monkeypatch.chdir(tmp_path)
    drift = ["drift", "--reference", str(demo_files["train.parquet"]), "--current",
             str(demo_files["batch_drifted.parquet"]), "--schema", str(REPO / "data" / "schema.yaml")]
    assert main([*drift, "--fail-on-drift"]) == EXIT_FINDING
    assert main([*drift, "--set", "drift.nonsense=1"]) == EXIT_SETTINGS
    capsys.readouterr()
    assert main([*drift, "--config", str(tmp_path / "nope.yaml"), "--json"]) == EXIT_DATA_FILE
    error = json.loads(capsys.readouterr().out)
    assert error["exit_code"] == EXIT_DATA_FILE and "nope.yaml: config file not found" in error["error"]
    missing = ["drift", "--reference", str(tmp_path / "gone.parquet"), "--current", str(tmp_path / "gone.parquet")]
    assert main(missing) == EXIT_DATA_FILE
    assert len({EXIT_FINDING, EXIT_SETTINGS, EXIT_DATA_FILE}) == 3


@pytest.mark.parametrize("command", [
    ["status"], ["history"], ["reproduce", "1"], ["drift", "--reference", "r.csv", "--current", "c.csv", "--model",
                                                  "churn"], ["quality", "--data", "f.csv"]])
def test_read_only_commands_leave_an_empty_folder_empty(command, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("KFLOOP_HOME", raising=False)
    assert main(command) == EXIT_DATA_FILE
    _, err = capfd.readouterr()
    assert "is not registered" in err and "INFO" not in err
    assert list(tmp_path.iterdir()) == []


def test_drift_model_none_means_no_model(tmp_path, demo_files, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("KFLOOP_HOME", raising=False)
    assert main(["drift", "--reference", str(demo_files["train.parquet"]), "--current",
                 str(demo_files["batch_stable.parquet"]), "--model", "none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["drifted"] is False
    assert list(tmp_path.iterdir()) == []  # no registry was opened


def test_user_errors_name_the_fix_and_only_bugs_suggest_debug():
    assert as_kfloop_error(KeyError("x")) is None  # a bug: EXIT_FAILED and the --debug hint
    assert as_kfloop_error(TypeError("x")) is None
    assert as_kfloop_error(ValueError("epochs=0: use an integer >= 1")).exit_code == EXIT_SETTINGS
    assert as_kfloop_error(FileNotFoundError(2, "No such file", "x.csv")).exit_code == EXIT_DATA_FILE
    assert as_kfloop_error(LookupError("no recurring run named 'r'")).exit_code == EXIT_DATA_FILE
    assert EXIT_FAILED not in {EXIT_SETTINGS, EXIT_DATA_FILE, EXIT_SERVICE}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_kfp_api_is_one_line_naming_the_host(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    host = f"http://127.0.0.1:{_closed_port()}"
    code = main(["schedule", "drift", "--host", host, "--cron", "0 0 * * * *", "--pipeline-version", "v1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_SERVICE
    assert err[0] == f"kfloop schedule: error: cannot reach {host} (Connection refused)", err
    assert len(err) == 2 and err[1].startswith("hint: check the URL") and "Max retries" not in err[1]


def test_schedule_checks_the_cron_before_connecting(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["schedule", "drift", "--host", f"http://127.0.0.1:{_closed_port()}", "--cron", "0 * * * *"])
    err = capsys.readouterr().err
    assert code == EXIT_SETTINGS and "KFP recurring runs take 6" in err and "cannot reach" not in err


def test_a_malformed_kfloop_yaml_names_the_file_line_and_column(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kfloop.yaml").write_text("model_name: churn\ndrift:\n  threshold: [0.1\nseed: 3\n")
    assert main(["render-job"]) == EXIT_DATA_FILE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kfloop render-job: error: kfloop.yaml:4:5: not valid YAML: "), err


def test_kfloop_alone_prints_help(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kfloop") and "infer-schema" in out


@pytest.mark.parametrize("old, new, argv, dest, value", [
    ("--version", "--pipeline-version", ["run", "training", "--local"], "pipeline_version", "v7"),
    ("--version", "--pipeline-version", ["upload", "--host", "h"], "pipeline_version", "v7"),
    ("--version", "--pipeline-version", ["schedule", "drift", "--host", "h"], "pipeline_version", "v7"),
    ("--version", "--pipeline-version", ["serve"], "pipeline_version", "v7"),
    ("--id-column", "--join-column", ["quality", "--data", "d.csv"], "join_column", "customer_id"),
    ("--report", "--evidently-report", ["quality", "--data", "d.csv"], "evidently_report", "q.html"),
    ("--nproc", "--nproc-per-node", ["bench", "collectives"], "nproc_per_node", 4)])
def test_a_renamed_flag_still_works_with_a_warning(old, new, argv, dest, value, capsys):
    parser = build_parser()
    assert getattr(parser.parse_args([*argv, new, str(value)]), dest) == value
    assert "deprecated" not in capsys.readouterr().err
    assert getattr(parser.parse_args([*argv, old, str(value)]), dest) == value
    assert f"{old} is deprecated and will be removed in the next release: use {new}" in capsys.readouterr().err


def test_key_columns_of_infer_schema_accumulate_under_either_spelling(capsys):
    args = build_parser().parse_args(["infer-schema", "--data", "d", "--target", "t", "--key-column", "a",
                                      "--id-column", "b"])
    assert args.key_columns == ["a", "b"] and "--id-column is deprecated" in capsys.readouterr().err


def test_validate_engine_does_not_follow_drift_engine():
    args = build_parser().parse_args(["validate", "--data", "d", "--schema", "s"])
    assert args.engine == "local"


def test_a_semicolon_csv_is_named_as_such_in_one_line(tmp_path, capsys):
    data = tmp_path / "semi.csv"
    data.write_text("age;plan\n34;basic\n51;pro\n")
    assert main(["validate", "--data", str(data), "--schema", str(REPO / "data" / "schema.yaml")]) == EXIT_DATA_FILE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one column named 'age;plan': the file looks separated by ';'" in err[0], err


def test_a_type_mismatch_shows_the_values_that_broke_it(tmp_path, demo_files, capsys):
    import pandas as pd

    frame = pd.read_parquet(demo_files["train.parquet"]).head(200).astype({"age": object})
    frame.loc[150, "age"] = "forty"
    data = tmp_path / "typed.csv"
    frame.to_csv(data, index=False)
    assert main(["validate", "--json", "--data", str(data), "--schema", str(REPO / "data" / "schema.yaml")]) \
        == EXIT_FINDING
    (diff,) = json.loads(capsys.readouterr().out)["schema_diff"]
    assert diff == "~ 'age': schema int64, data holds text values (e.g. ['forty'])"


def test_train_refuses_an_http_url_instead_of_reading_it_as_a_path(capsys):
    code = main(["train", "--data", "http://example.com/x.csv", "--schema", str(REPO / "data" / "schema.yaml")])
    err = capsys.readouterr().err
    assert code == EXIT_DATA_FILE and "rule uri.scheme: scheme 'http' is not read" in err, err
    assert "file not found" not in err


def test_reproducing_a_version_that_does_not_exist_says_how_to_list_them(tmp_path, monkeypatch, capsys):
    from training.registry.versions import ensure_registered_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    ensure_registered_model("churn")
    code = main(["reproduce", "7", "--model", "churn"])
    err = capsys.readouterr().err  # MLflow's own INFO lines (creating its tables) come first
    assert code == EXIT_DATA_FILE, err
    assert err.rstrip().endswith("kfloop reproduce: error: model 'churn' has no version 7: `kfloop history --model "
                                 "churn` lists its versions"), err
    assert "--debug" not in err and "MlflowException" not in err
