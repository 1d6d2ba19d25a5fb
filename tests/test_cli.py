"""The CLI surface is pinned (a new flag is a deliberate change); schema and validate commands on real files."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from data.errors import EXIT_DATA_FILE, EXIT_FINDING, EXIT_SETTINGS, EXIT_USAGE
from pipelines.cli.commands import build_parser, main

REPO = Path(__file__).resolve().parents[1]
GLOBAL = ["--debug", "--workdir"]
"""Accepted before the command and after it, by every command."""
SURFACE = {
    "": ["--debug", "--version", "--workdir"],
    "bench": ["--max-bytes", "--nproc", "--nproc-per-node", "--out"],
    "compile": ["--config", "--credentials-secret", "--enable-caching", "--gpu-node-selector", "--gpu-toleration",
                "--gpus", "--image", "--image-pull-secret", "--json", "--namespace", "--out", "--set",
                "--shared-mount-path", "--shared-volume-claim"],
    "demo": ["--json", "--serve"],
    "drift": ["--config", "--current", "--current-logs", "--engine", "--fail-on-drift", "--json", "--model",
              "--model-name", "--ray-address", "--reference", "--report", "--schema", "--set", "--since"],
    "infer-schema": ["--data", "--id-column", "--json", "--key-column", "--target", "--task"],
    "quality": ["--config", "--current-logs", "--data", "--evidently-report", "--fail-on-degraded", "--id-column",
                "--join-column", "--json", "--labels", "--model", "--report", "--set", "--since"],
    "render-job": ["--config", "--gpus-per-node", "--json", "--kind", "--nnodes", "--nproc-per-node", "--run-id",
                   "--set"],
    "run": ["--config", "--host", "--json", "--local", "--model", "--namespace", "--pipeline-version",
            "--service-account", "--set", "--version", "--wait"],
    "schedule": ["--config", "--cron", "--delete", "--disable", "--host", "--json", "--model", "--name",
                 "--namespace", "--pipeline-version", "--service-account", "--set", "--version"],
    "serve": ["--bind", "--config", "--host", "--inference-logs", "--kfp-host", "--local", "--max-body-bytes",
              "--namespace", "--open-metrics", "--pipeline-version", "--port", "--service-account", "--set",
              "--version"],
    "upload": ["--config", "--credentials-secret", "--enable-caching", "--gpu-node-selector", "--gpu-toleration",
               "--gpus", "--host", "--image", "--image-pull-secret", "--json", "--namespace", "--pipeline-version",
               "--require-image", "--set", "--shared-mount-path", "--shared-volume-claim", "--version"],
    "train": ["--backend", "--config", "--data", "--json", "--model-dir", "--nnodes", "--nproc-per-node", "--schema",
              "--set"],
    "validate": ["--config", "--data", "--engine", "--json", "--ray-address", "--report-csv", "--schema", "--set"],
    "status": ["--config", "--json", "--model", "--set"],
    "history": ["--config", "--json", "--model", "--set"],
    "rollback": ["--config", "--json", "--model", "--reason", "--set", "--to"],
    "reproduce": ["--config", "--json", "--model", "--set"],
    "report": ["--config", "--json", "--model", "--out", "--set"],
    "serve-model": ["--alias", "--artifact-digest", "--config", "--grpc-port", "--log-dir", "--model", "--model-dir", "--port", "--set", "--version"],
    "render-serving": ["--alias", "--canary", "--config", "--json", "--kserve", "--model", "--set", "--version"],
}
"""Every flag of every command, hidden old spellings included (``--model-name``, ``--kfp-host``, ``--version`` of a
pipeline, ``--id-column``, ``--nproc``, quality's ``--report``: scripts keep working)."""


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
    assert code == EXIT_DATA_FILE
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
    assert main(["validate", "--data", str(bad_path), "--schema", str(schema)]) == EXIT_FINDING
    err = capsys.readouterr().err
    assert "bad.csv" in err and "age" in err and "-5" in err and "contract" in err and "lifetime" in err


@pytest.mark.parametrize("content", [None, b""])
def test_unreadable_file_gets_one_line_and_its_own_exit_code(tmp_path, content, capsys):
    path = tmp_path / "data.parquet"
    if content is not None:
        path.write_bytes(content)
    assert main(["validate", "--data", str(path), "--schema", str(REPO / "data" / "schema.yaml")]) == EXIT_DATA_FILE
    err = capsys.readouterr().err.strip().splitlines()
    assert str(path) in err[0] and len(err) <= 2 and "--debug" not in "".join(err)  # a user error: no traceback asked


def test_bad_setting_names_the_fix(capsys):
    assert main(["run", "training", "--local", "--set", "dataset_uri=x.csv", "--set", "training.epochs=0"]) \
        == EXIT_SETTINGS
    assert "epochs=0" in capsys.readouterr().err


def test_train_two_nodes_of_two_ranks_ends_with_identical_parameters(tmp_path, demo_files, capsys):
    model_dir = tmp_path / "model"
    code = main(["--workdir", str(tmp_path / "w"), "train", "--data", str(demo_files["train.parquet"]), "--schema",
                 str(REPO / "data" / "schema.yaml"), "--nnodes", "2", "--nproc-per-node", "2", "--model-dir",
                 str(model_dir), "--set", "training.epochs=2", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)  # stdout holds only the JSON; the ranks' lines went to stderr
    assert out["model_dir"] == str(model_dir) and out["metrics"]
    assert all(isinstance(value, float) for value in out["metrics"].values())
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


def test_drift_without_schema_or_target_compares_every_shared_column_but_ids(tmp_path, demo_files, capsys):
    args = ["--workdir", str(tmp_path / "w"), "drift", "--reference", str(demo_files["train.parquet"]), "--current",
            str(demo_files["batch_stable.parquet"])]
    code = main([*args, "--json"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 0, captured.err
    assert out["schema_source"] == ("none: every column the reference and the current data share but the ids "
                                    "(types from the reference, no target)")
    assert "comparing every column the reference and the current data share but the ids" in captured.err
    assert set(out["columns"]) == FEATURES | {"churned"}  # customer_id: an id, as infer-schema would call it
    assert out["id_columns"] == ["customer_id"] and out["drifted"] is False  # the stable batch: new ids only
    assert out["columns"]["churned"]["method"] == "jensenshannon"  # 0/1 as a number with 2 values
    assert main(args) == 0
    assert "not checked: id column(s) customer_id (identifiers are unique per row, so they always differ between " \
           "batches; named id or *_id and unique, as kfloop infer-schema finds ids)" in capsys.readouterr().out
    code = main([*args, "--set", "target=churned"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("drifted: False ")
    assert "\nschema: inferred from the reference (target 'churned', classification)\n" in out
    code = main([*args, "--set", "target=churn"])
    assert code == EXIT_SETTINGS and "target 'churn' is not a column of the reference" in capsys.readouterr().err


def test_drift_without_reference_names_what_is_missing(isolated_env, demo_files):
    from monitoring.steps.checks import drift_step

    check = dict(current_uri=str(demo_files["batch_stable.parquet"]), reference_uri="", schema_uri="", policy={},
                 report_out="")
    with pytest.raises(ValueError, match=r"^no reference data: no --model \(model_name\) whose champion's "
                                         r"training data to use; set reference_uri \(kfloop run drift: --set "
                                         r"reference_uri=FILE; kfloop drift: --reference FILE\)$"):
        drift_step(**check, model_name="")
    with pytest.raises(ValueError, match=r"^no reference data: model 'ghost' has no champion to take the training "
                                         r"data from; set reference_uri"):
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
    assert out["id_columns"] == ["customer_id"]
    assert report.stat().st_size > 0 and out["report_path"] == str(report)
    assert set(out["schema_violations"]) == set(out["columns"])  # the drifted demo batch stays inside the schema
    assert all(shares["share"] == 0.0 for shares in out["schema_violations"].values())
    assert out["reason"].startswith(f"{sum(c['drifted'] for c in out['columns'].values())} of 9 columns drifted")


HIDDEN_ALIASES = {("drift", "--model-name"), ("serve", "--kfp-host"), ("reproduce", "MODEL"),
                  ("infer-schema", "--id-column"), ("quality", "--id-column"), ("quality", "--report"),
                  ("bench", "--nproc"), ("run", "--version"), ("upload", "--version"), ("schedule", "--version"),
                  ("serve", "--version")}
"""Old spellings kept for scripts, left out of ``--help``."""


def test_every_flag_has_help_and_every_command_a_description():
    parser = build_parser()
    missing, hidden = [], set()
    for name, sub in {"": parser, **_subparsers(parser)}.items():
        if name and not sub.description:
            missing.append(f"kfloop {name}: no description")
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(choice.help for choice in action._choices_actions)  # the one-liners of `kfloop --help`
                continue
            label = action.option_strings[0] if action.option_strings else action.metavar or action.dest
            if action.help == argparse.SUPPRESS:
                hidden.add((name, label))
            elif not action.help:
                missing.append(f"kfloop {name} {label}: no help")
    assert missing == []
    assert hidden == HIDDEN_ALIASES


def test_old_spellings_are_hidden_aliases_of_the_one_name():
    parser = build_parser()
    for argv in (["drift", "--reference", "r", "--current", "c", "--model", "m"],
                 ["drift", "--reference", "r", "--current", "c", "--model-name", "m"]):
        assert parser.parse_args(argv).model == "m"
    assert parser.parse_args(["serve", "--host", "http://k"]).host == "http://k"
    assert parser.parse_args(["serve", "--kfp-host", "http://k"]).host == "http://k"
    new, old = parser.parse_args(["reproduce", "3", "--model", "m"]), parser.parse_args(["reproduce", "m", "3"])
    assert (new.model, new.legacy_model, new.version) == ("m", None, "3")
    assert (old.model, old.legacy_model, old.version) == (None, "m", "3")
    subparsers = _subparsers(parser)
    for command, alias in HIDDEN_ALIASES - {("reproduce", "MODEL")}:
        assert not re.search(re.escape(alias) + r"(?![\w-])", subparsers[command].format_help()), (command, alias)
    for command in ("quality", "run", "schedule", "status", "history", "rollback", "reproduce", "report", "drift"):
        assert "--model" in _flags(subparsers[command]), command
    for command in ("run", "upload", "schedule", "serve"):
        assert "--host" in _flags(subparsers[command]), command


def test_version_names_the_release_and_the_commit(capsys, monkeypatch):
    from pipelines.cli.commands import version_line

    monkeypatch.delenv("KFLOOP_GIT_COMMIT", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    line = capsys.readouterr().out.strip()
    assert line.startswith("kfloop 0.") and f"(commit {head}" in line, line
    monkeypatch.setenv("KFLOOP_GIT_COMMIT", "abc123")
    assert version_line(REPO).endswith("(commit abc123)")
    monkeypatch.delenv("KFLOOP_GIT_COMMIT")
    assert "commit unknown: " in version_line(REPO / "pipelines")  # not the top of a checkout: it cannot tell


@pytest.mark.parametrize("command", [
    ["status"], ["history"], ["report", "--out", "r.html"], ["rollback", "--reason", "r"], ["reproduce", "1"],
    ["train", "--data", "d.csv", "--schema", "s.yaml"], ["drift", "--reference", "r.csv", "--current", "c.csv"],
    ["quality", "--data", "d.csv"], ["run", "training", "--local"], ["render-job"], ["compile"],
    ["schedule", "drift", "--host", "http://127.0.0.1:1"], ["serve", "--port", "0"], ["serve-model", "--port", "0"],
    ["render-serving"]])
def test_every_command_refuses_an_unknown_setting(command, tmp_path, monkeypatch, capsys):
    """The one settings check: a typo in --set or kfloop.yaml is refused before anything runs, naming the keys."""
    monkeypatch.chdir(tmp_path)
    for setting, message in (("foo=bar", "unknown setting(s) ['foo']; valid keys are ['backend', 'cluster', "),
                             ("drift.nonsense=1", "unknown drift key(s) ['nonsense']; valid keys are "),
                             ("modle_name=x", "did you mean 'model_name'?"),
                             ("training.epoch=2", "did you mean 'epochs'?"),
                             ("cluster.launcher.timeout_second=5", "did you mean 'timeout_seconds'?"),
                             ("cluster.lancher.timeout_seconds=5", "did you mean 'launcher'?"),
                             ("launcher.timeout_seconds=5", "--set cluster.launcher.KEY=VALUE")):
        assert main([*command, "--set", setting]) == EXIT_SETTINGS, setting
        assert message in capsys.readouterr().err, setting
    (tmp_path / "kfloop.yaml").write_text("drift:\n  treshold: 0.1\n")
    assert main(command) == EXIT_SETTINGS
    assert "unknown drift key(s) ['treshold']" in capsys.readouterr().err
    assert not (tmp_path / ".kfloop" / "mlflow.db").exists()


def test_errors_are_json_under_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["status", "--json", "--set", "drift.nonsense=1"]) == EXIT_SETTINGS
    captured = capsys.readouterr()
    error = json.loads(captured.out)
    assert set(error) == {"error", "hint", "exit_code"} and error["exit_code"] == EXIT_SETTINGS
    assert error["hint"] is None  # a user error: the message says the fix, no --debug
    assert error["error"].startswith("unknown drift key(s) ['nonsense']")
    assert "error: unknown drift key(s) ['nonsense']" in captured.err, "the readable line stays on stderr"
    missing = tmp_path / "missing.parquet"
    assert main(["validate", "--json", "--data", str(missing), "--schema", str(REPO / "data" / "schema.yaml")]) \
        == EXIT_DATA_FILE
    error = json.loads(capsys.readouterr().out)
    assert error["exit_code"] == EXIT_DATA_FILE and str(missing) in error["error"]
    with pytest.raises(SystemExit) as exited:  # a usage error too, with argparse's exit code
        main(["validate", "--json", "--data", "x.csv"])
    assert exited.value.code == EXIT_USAGE
    error = json.loads(capsys.readouterr().out)
    assert error["exit_code"] == EXIT_USAGE and "--schema" in error["error"]


def test_read_only_commands_take_the_model_from_kfloop_yaml_and_create_nothing(tmp_path, monkeypatch, capfd):
    """A newcomer's first `kfloop status` in a project: the model of ./kfloop.yaml, no MLflow database made (MLflow
    would print its INFO lines making one: the process's stderr, read at the file descriptor, holds none)."""
    (tmp_path / "kfloop.yaml").write_text("model_name: churn-yaml\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("KFLOOP_HOME", raising=False)
    for command in (["status"], ["history"], ["report", "--out", "r.html"], ["status", "--set", "model_name=other"]):
        assert main(command) == EXIT_DATA_FILE
        out, err = capfd.readouterr()
        assert f"model '{'other' if '--set' in command else 'churn-yaml'}' is not registered" in err, command
        assert "INFO" not in err and out == "", command
    assert not (tmp_path / ".kfloop" / "mlflow.db").exists() and not (tmp_path / "r.html").exists()


def test_drift_says_it_once_with_ids_directions_and_an_exit_code(tmp_path, demo_files, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = ["--workdir", str(tmp_path / "w"), "drift", "--reference", str(demo_files["train.parquet"]),
            "--schema", str(REPO / "data" / "schema.yaml"), "--current"]
    assert main([*args, str(demo_files["batch_drifted.parquet"])]) == 0  # the check ran: exit 0 by default
    captured = capsys.readouterr()
    assert captured.out.count("drifted: True") == 1 and "drifted" not in captured.err
    assert "not checked: id column(s) customer_id (identifiers are unique per row" in captured.out
    lines = [line for line in captured.out.splitlines() if "score=" in line]
    assert len(lines) == len(FEATURES)
    assert all(line.rstrip().endswith(("DRIFT", "ok")) or "outside schema" in line for line in lines)
    assert all("(p-value, lower = drift)" in line or "(distance, higher = drift)" in line for line in lines)
    assert main([*args, str(demo_files["batch_drifted.parquet"]), "--fail-on-drift"]) == EXIT_FINDING
    assert main([*args, str(demo_files["batch_stable.parquet"]), "--fail-on-drift"]) == 0
    assert "drifted: False" in capsys.readouterr().out
    assert not (tmp_path / "w").exists()  # no model: no MLflow database, nothing written
    help_text = " ".join(_subparsers(build_parser())["drift"].format_help().split())
    assert "kfloop's summary page" in help_text and "Evidently's HTML report" not in help_text


def test_validation_numbers_rows_one_way_everywhere(tmp_path, capsys):
    """Data rows counted from 0, header excluded: the message, the CSV report and --json agree, and the row named
    is the one holding the bad value (line row+2 of the CSV file)."""
    data = tmp_path / "rows.csv"
    pd.DataFrame({"x": [1, 2, 3, -4, 5]}).to_csv(data, index=False)
    schema = tmp_path / "schema.yaml"
    schema.write_text("schema_type: dataframe\nversion: 0.35.0\ncolumns:\n  x:\n    dtype: int64\n    nullable: false\n"
                      "    checks:\n      greater_than_or_equal_to: 0\n")
    report = tmp_path / "failures.csv"
    assert main(["validate", "--data", str(data), "--schema", str(schema), "--report-csv", str(report)]) \
        == EXIT_FINDING
    assert "at data rows [3] (counted from 0, header excluded)" in capsys.readouterr().err
    assert data.read_text().splitlines()[3 + 1] == "-4"  # line 5 of the file: header, then data rows 0..3
    assert report.read_text().splitlines()[1].endswith(",3")
    assert main(["validate", "--json", "--data", str(data), "--schema", str(schema)]) == EXIT_FINDING
    out = json.loads(capsys.readouterr().out)
    assert out["row_numbers"] == "data rows counted from 0, header excluded"
    assert out["failures"][0]["rows"] == [3] and out["failures"][0]["examples"] == [-4]


def test_scripts_get_json_from_infer_schema_and_render_job(demo_files, capsys):
    assert main(["infer-schema", "--json", "--data", str(demo_files["train.parquet"]), "--target", "churned",
                 "--key-column", "customer_id"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target"] == "churned" and out["task"] == "classification" and out["id_columns"] == ["customer_id"]
    assert set(out["numeric"]) | set(out["categorical"]) == FEATURES and "churned:" in out["schema"]
    assert main(["render-job", "--json", "--nnodes", "3"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["kind"] == "PyTorchJob" and manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2


def _rendered_namespace(capsys, *overrides: str) -> str:
    assert main(["render-job", "--json", *[a for o in overrides for a in ("--set", o)]]) == 0
    return json.loads(capsys.readouterr().out)["metadata"]["namespace"]


def test_an_empty_namespace_is_the_pods_own_else_the_kubeconfigs_else_default(tmp_path, monkeypatch, capsys):
    import yaml

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KFLOOP_JOB_NAMESPACE", raising=False)
    own = tmp_path / "serviceaccount-namespace"
    monkeypatch.setenv("KFLOOP_NAMESPACE_FILE", str(own))
    assert _rendered_namespace(capsys) == "default"  # outside a pod, no kubeconfig
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:1"}}], "users": [{"name": "y", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "x", "user": "y", "namespace": "from-context"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert _rendered_namespace(capsys) == "from-context"
    own.write_text("kubeflow-user-example-com\n")  # in a pod: its service account's namespace
    assert _rendered_namespace(capsys) == "kubeflow-user-example-com"
    assert _rendered_namespace(capsys, "cluster.namespace=ml-training") == "ml-training"


def test_compile_namespace_reaches_every_step_and_the_settings_namespace_wins(tmp_path, monkeypatch, capsys):
    import yaml

    from training.launch.kubernetes import KubernetesSettings

    monkeypatch.chdir(tmp_path)
    assert main(["compile", "--out", str(tmp_path / "out"), "--namespace", "team-a"]) == 0
    spec = yaml.safe_load_all((tmp_path / "out" / "training.yaml").read_text()).__next__()
    envs = [{e["name"]: e["value"] for e in executor["container"].get("env", [])}
            for executor in spec["deploymentSpec"]["executors"].values()]
    assert envs and all(env.get("KFLOOP_JOB_NAMESPACE") == "team-a" for env in envs)
    monkeypatch.setenv("KFLOOP_JOB_NAMESPACE", "team-a")  # as in such a step
    assert KubernetesSettings.from_dict({}).cluster.namespace == "team-a"
    assert KubernetesSettings.from_dict({"namespace": "ml"}).cluster.namespace == "ml"
    assert main(["compile", "--out", str(tmp_path / "bad"), "--namespace", "Not_A_Namespace"]) == EXIT_SETTINGS
    assert "job_namespace='Not_A_Namespace'" in capsys.readouterr().err
