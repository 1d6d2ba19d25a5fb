"""`kfloop upload`, `run` and `schedule` through the real kfp.Client against the KFP API test server
(tests/cluster/kfp_server.py; its own tests are in tests/cluster/test_kfp_server.py)."""
from __future__ import annotations

import contextlib
import json
import subprocess
from http import HTTPStatus
from pathlib import Path

import pytest
from kfp_server_api import ApiException
from cluster.k8s_rbac import service_account_user
from cluster.kfp_multiuser import MultiUser
from cluster.kfp_server import KfpApiServer

from components import kfp_client
from data.errors import EXIT_DATA_FILE, EXIT_FAILED, EXIT_SERVICE, EXIT_SETTINGS, EXIT_USAGE
from pipelines.cli.commands import main

TOKEN = "kfp-test-token-7c1e"
COMMIT = "3f2a9c0d1e4b5a6978c0d1e2f3a4b5c6d7e8f901"
DRIFT_SETTINGS = ["--set", "current_uri=s3://bucket/batch.parquet"]
TRAINING_SETTINGS = ["--set", "dataset_uri=s3://bucket/train.parquet"]
PROFILE = "kfloop"
REPO = Path(__file__).resolve().parents[1]
"""The profile namespace of deploy/rbac.yaml and deploy/kubeflow-profile.yaml."""


@pytest.fixture(params=["standalone", "multi-user"])
def kfp(request, monkeypatch, tmp_path):
    """The KFP test server in each mode, with ``target`` (the flags that reach it), ``namespace`` and ``client_token``:
    standalone behind a token-checking proxy; multi-user with profile ``kfloop`` (deploy/), reached with ``--namespace
    kfloop`` and the token of a CI service account that is a contributor (``kubeflow-edit``) there."""
    monkeypatch.setenv("KFLOOP_HOME", str(tmp_path / "kfloop"))
    with kfp_server(monkeypatch, tmp_path, multi_user=request.param == "multi-user") as server:
        yield server


@contextlib.contextmanager
def kfp_server(monkeypatch, tmp_path, *, multi_user: bool):
    """The ``kfp`` fixture's server (standalone, or multi-user with profile ``kfloop``) and its client settings."""
    monkeypatch.setenv(kfp_client.SA_TOKEN_PATH_ENV, str(tmp_path / "no-token-file"))
    monkeypatch.setenv("KFLOOP_GIT_COMMIT", COMMIT)
    monkeypatch.delenv("KFLOOP_IMAGE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client reads ~/.config/kfp/context.json
    users = None
    if multi_user:
        users = MultiUser()
        users.add_profile(PROFILE, owner="alice@example.com")
        users.bind(PROFILE, service_account_user("ci", "kfloop-deployer"))
    with KfpApiServer(token=TOKEN, multi_user=users) as server:
        server.namespace = PROFILE if users else None
        server.client_token = users.service_account_token("ci", "kfloop-deployer") if users else TOKEN
        server.target = ["--host", server.url, *(["--namespace", PROFILE] if users else [])]
        monkeypatch.setenv(kfp_client.TOKEN_ENV, server.client_token)
        yield server


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def upload(kfp, capsys) -> list[dict]:
    code, out, err = cli(capsys, "upload", *kfp.target, "--json")
    assert code == 0, err
    return json.loads(out)


def versions_named(kfp, name: str) -> list[dict]:
    return [v for v in kfp.store.versions.values() if v["name"] == name]


def test_upload_twice_gives_one_version_per_pipeline(kfp, capsys):
    first = upload(kfp, capsys)
    second = upload(kfp, capsys)

    assert [(u["pipeline"], u["created"]) for u in first] == [("training", True), ("drift", True), ("quality", True)]
    assert [(u["pipeline"], u["created"]) for u in second] == [("training", False), ("drift", False),
                                                               ("quality", False)]
    assert [u["pipeline_version_id"] for u in first] == [u["pipeline_version_id"] for u in second]
    assert sorted(p["name"] for p in kfp.store.pipelines.values()) == ["kfloop-drift", "kfloop-quality",
                                                                         "kfloop-training"]
    commit_versions = versions_named(kfp, COMMIT)
    assert len(commit_versions) == 3
    assert {v["pipeline_id"] for v in commit_versions} == {p["pipeline_id"] for p in kfp.store.pipelines.values()}
    uploads = [r for r in kfp.requests if r.path.endswith("/upload_version")]
    assert len(uploads) == 3 and all(r.query["name"] == COMMIT for r in uploads)


def test_upload_sets_code_source_url_from_the_remote_without_credentials(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for remote, expected in [("git@github.com:acme/churn.git", "https://github.com/acme/churn"),
                             ("https://ci:ghp_s3cret@github.com/acme/churn.git", "https://github.com/acme/churn")]:
        subprocess.run(["git", "-C", str(repo), "remote", "remove", "origin"], capture_output=True)
        subprocess.run(["git", "-C", str(repo), "remote", "add", "origin", remote], check=True)
        assert kfp_client.code_source_url(COMMIT, cwd=repo) == f"{expected}/tree/{COMMIT}"
    assert kfp_client.code_source_url(COMMIT, cwd=tmp_path) == ""  # not a checkout: no URL rather than a wrong one


def test_upload_sends_code_source_url_and_the_bearer_token(kfp, tmp_path):
    client = kfp_client.connect(kfp.url)
    package = tmp_path / "p.yaml"
    from pipelines.compile import compile_pipeline

    compile_pipeline("drift", package)
    ref, created = kfp_client.upload(client, "kfloop-drift", package, version_name="v1", namespace=kfp.namespace,
                                     source_url="https://github.com/acme/churn/tree/v1")
    assert created and ref.code_source_url == "https://github.com/acme/churn/tree/v1"
    assert kfp.store.versions[ref.pipeline_version_id]["code_source_url"] == ref.code_source_url
    assert {r.headers.get("authorization") for r in kfp.requests if r.path != "/apis/v2beta1/healthz"} == {
        f"Bearer {kfp.client_token}"}


def test_a_wrong_token_is_refused_and_never_printed(kfp, capsys, monkeypatch):
    monkeypatch.setenv(kfp_client.TOKEN_ENV, "wrong-token-91ab")
    code, out, err = cli(capsys, "upload", *kfp.target)
    assert code == EXIT_SERVICE and "401" in err
    assert "wrong-token-91ab" not in out + err and kfp.client_token not in out + err
    assert not kfp.store.pipelines


def test_a_dirty_checkout_needs_an_explicit_version(kfp, capsys, monkeypatch):
    monkeypatch.setenv("KFLOOP_GIT_COMMIT", COMMIT + "-dirty")
    code, _, err = cli(capsys, "upload", *kfp.target)
    assert code == EXIT_SETTINGS and "commit your changes" in err and "--pipeline-version" in err
    assert not kfp.store.pipelines
    code, out, err = cli(capsys, "upload", *kfp.target, "--version", "rc-1")
    assert code == 0, err
    assert len(versions_named(kfp, "rc-1")) == 3  # training, drift and quality


def _step_images(version: dict) -> set[str]:
    spec = version["pipeline_spec"]
    spec = spec.get("pipeline_spec", spec)  # a spec with a platform spec is wrapped
    return {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}


def test_a_commits_version_never_runs_the_image_of_another_commit(kfp, capsys, monkeypatch):
    other = "9" * 40
    monkeypatch.setenv("KFLOOP_IMAGE", f"ghcr.io/team/kfloop:{other}")
    code, _, err = cli(capsys, "upload", *kfp.target)
    assert code == EXIT_SETTINGS and f"tagged for commit {other}" in err and f"named by commit {COMMIT}" in err
    assert "--image" in err and not kfp.store.pipelines  # nothing uploaded

    monkeypatch.setenv("KFLOOP_IMAGE", f"registry.example:5000/team/kfloop:{COMMIT[:12]}")  # a short SHA tag fits
    assert upload(kfp, capsys)
    assert {img for v in versions_named(kfp, COMMIT) for img in _step_images(v)} == {
        f"registry.example:5000/team/kfloop:{COMMIT[:12]}"}

    monkeypatch.setenv("KFLOOP_IMAGE", f"ghcr.io/team/kfloop:{other}")
    code, _, err = cli(capsys, "upload", *kfp.target, "--version", "hotfix", "--image",
                       f"ghcr.io/team/kfloop:{other}")  # explicit: taken as given
    assert code == 0, err
    assert {img for v in versions_named(kfp, "hotfix") for img in _step_images(v)} == {f"ghcr.io/team/kfloop:{other}"}


def test_upload_compiles_with_caching_off_unless_enabled(kfp, capsys):
    def caching(version: dict) -> set[bool]:
        spec = version["pipeline_spec"]
        spec = spec.get("pipeline_spec", spec)
        return {t["cachingOptions"].get("enableCache", False) for t in spec["root"]["dag"]["tasks"].values()
                if "cachingOptions" in t}  # steps, not the dsl.If sub-DAG

    assert cli(capsys, "upload", *kfp.target, "--version", "plain")[0] == 0
    assert cli(capsys, "upload", *kfp.target, "--version", "cached", "--enable-caching")[0] == 0
    assert {c for v in versions_named(kfp, "plain") for c in caching(v)} == {False}
    assert {c for v in versions_named(kfp, "cached") for c in caching(v)} == {True}


@pytest.mark.parametrize("image, tag", [("ghcr.io/o/kfloop:abc1234", "abc1234"), ("localhost:5000/kfloop", ""),
                                        ("r:5000/k:v1@sha256:00ff", "v1"), ("kfloop", "")])
def test_image_tag(image, tag):
    from pipelines.kfp_server.runs import image_tag

    assert image_tag(image) == tag


def test_run_needs_the_version_uploaded_first(kfp, capsys):
    code, _, err = cli(capsys, "run", "training", *kfp.target, "--set", "dataset_uri=s3://b/train.parquet")
    assert code == EXIT_DATA_FILE and "kfloop upload --host" in err
    assert not kfp.store.runs


def _register_what_the_cluster_run_would(run: dict, artifact_root: str) -> None:
    """Play the training pipeline's register step: a candidate version tagged with the KFP run id."""
    import mlflow

    client = mlflow.MlflowClient()
    exp = client.create_experiment(f"kfloop-{run['run_id']}", artifact_location=artifact_root)
    mlflow_run = client.create_run(exp)
    client.log_metric(mlflow_run.info.run_id, "eval_challenger_auc", 0.81)
    client.set_terminated(mlflow_run.info.run_id)
    try:
        client.create_registered_model("churn")
    except mlflow.exceptions.MlflowException:
        pass
    client.create_model_version("churn", source=f"runs:/{mlflow_run.info.run_id}/model",
                                run_id=mlflow_run.info.run_id, description="below the champion on auc",
                                tags={"pipeline_run_id": run["run_id"], "decision": "reject"})


def test_run_wait_references_the_version_and_prints_the_contract(isolated_env, kfp, capsys):
    upload(kfp, capsys)
    kfp.on_run_created = lambda run: _register_what_the_cluster_run_would(run, str(isolated_env.artifact_root))
    kfp.script_states(["SUCCEEDED"])

    code, out, err = cli(capsys, "run", "training", *kfp.target, "--wait", "--json",
                         "--set", "dataset_uri=s3://b/train.parquet", "--set", "model_name=churn",
                         "--set", "training.epochs=3")

    assert code == 0, err
    summary = json.loads(out)
    (run,) = kfp.store.runs.values()
    training = next(v for v in versions_named(kfp, COMMIT) if kfp.store.pipelines[v["pipeline_id"]]["name"]
                    == "kfloop-training")
    assert "pipeline_spec" not in run
    assert run["pipeline_version_reference"] == {"pipeline_id": training["pipeline_id"],
                                                 "pipeline_version_id": training["pipeline_version_id"]}
    jobs_in_profile = {"cluster_config": {"namespace": kfp.namespace}} if kfp.namespace else {}  # --namespace
    assert run["runtime_config"]["parameters"] == {"dataset_uri": "s3://b/train.parquet", "model_name": "churn",
                                                   "training_config": {"epochs": 3}, **jobs_in_profile}
    assert kfp.store.experiments[run["experiment_id"]]["display_name"] == "kfloop"
    assert summary["run_id"] == run["run_id"] and summary["state"] == "SUCCEEDED"
    assert {k: summary[k] for k in ("model_name", "model_version", "promoted", "champion_version", "reason")} == {
        "model_name": "churn", "model_version": "1", "promoted": False, "champion_version": None,
        "reason": "below the champion on auc"}
    assert summary["metrics"] == {"auc": 0.81}
    assert "run " + run["run_id"] + ": SUCCEEDED" in err  # progress on stderr


def test_run_wait_exits_non_zero_on_a_failed_run(kfp, capsys):
    upload(kfp, capsys)
    kfp.script_states(["FAILED"])

    code, out, err = cli(capsys, "run", "drift", *kfp.target, "--wait", "--json", *DRIFT_SETTINGS)

    assert code == EXIT_FAILED
    summary = json.loads(out)
    assert summary["state"] == "FAILED" and summary["pipeline"] == "drift"
    assert f"run {summary['run_id']} ended FAILED" in err


def test_drift_runs_pin_the_training_version_of_the_same_commit(kfp, capsys):
    uploaded = {u["pipeline"]: u for u in upload(kfp, capsys)}
    code, out, err = cli(capsys, "run", "drift", *kfp.target, "--json", *DRIFT_SETTINGS)
    assert code == 0, err
    (run,) = kfp.store.runs.values()
    assert json.loads(out)["state"] == "PENDING"
    pinned = run["runtime_config"]["parameters"]["training_pipeline_version"]
    assert (pinned["pipeline_id"], pinned["pipeline_version_id"], pinned["version_name"]) == (
        uploaded["training"]["pipeline_id"], uploaded["training"]["pipeline_version_id"], COMMIT)


def test_runs_and_the_training_runs_they_trigger_use_the_service_account_given(kfp, capsys):
    upload(kfp, capsys)
    code, _, err = cli(capsys, "run", "drift", *kfp.target, *DRIFT_SETTINGS)
    assert code == 0, err
    code, _, err = cli(capsys, "run", "drift", *kfp.target, "--service-account", "kfloop-batch", *DRIFT_SETTINGS)
    assert code == 0, err
    default, given = sorted(kfp.store.runs.values(), key=lambda r: r["created_at"])
    assert default["service_account"] == "kfloop"  # deploy/rbac.yaml's, never KFP's pipeline-runner
    assert given["service_account"] == "kfloop-batch"
    assert given["runtime_config"]["parameters"]["training_pipeline_version"]["service_account"] == "kfloop-batch"

    code, _, err = cli(capsys, "run", "training", "--local", "--service-account", "kfloop")
    assert code == EXIT_USAGE and "use them with --host" in err  # a local run has no service account to use


def test_a_new_service_account_replaces_the_schedule(kfp, capsys):
    upload(kfp, capsys)
    assert schedule(kfp, capsys, "--cron", "0 0 * * * *")[0] == 0
    (first,) = kfp.store.recurring_runs.values()
    assert first["service_account"] == "kfloop"  # deploy/rbac.yaml's, never KFP's pipeline-runner (no Lease verbs)
    assert first["runtime_config"]["parameters"]["training_pipeline_version"]["service_account"] == "kfloop"
    assert schedule(kfp, capsys, "--cron", "0 0 * * * *", "--service-account", "kfloop-batch")[0] == 0
    (replaced,) = kfp.store.recurring_runs.values()
    assert replaced["service_account"] == "kfloop-batch"
    assert replaced["recurring_run_id"] != first["recurring_run_id"]
    code, out, _ = schedule(kfp, capsys, "--cron", "0 0 * * * *", "--service-account", "kfloop-batch")
    assert code == 0 and json.loads(out)["created"] is False


def test_wait_reports_each_state_change(kfp, capsys):
    upload(kfp, capsys)
    client = kfp_client.connect(kfp.url)
    ref = kfp_client.find_version(client, "kfloop-drift", COMMIT, kfp.namespace)
    run = kfp_client.create_run(client, ref, {"current_uri": "x.parquet"}, namespace=kfp.namespace)
    kfp.script_states(["PENDING", "RUNNING", "RUNNING", "SUCCEEDED"], run_id=run.run_id)

    final = kfp_client.wait(client, run.run_id, poll_seconds=0.01, timeout_seconds=60)

    assert final.state == "SUCCEEDED"
    lines = [line for line in capsys.readouterr().err.splitlines() if run.run_id in line]
    assert [line.rsplit(": ", 1)[1] for line in lines] == ["PENDING", "RUNNING", "SUCCEEDED"]


def schedule(kfp, capsys, *extra: str) -> tuple[int, str, str]:
    return cli(capsys, "schedule", "drift", *kfp.target, *extra, *DRIFT_SETTINGS)


def test_schedule_twice_gives_one_recurring_run_and_a_change_replaces_it(kfp, capsys):
    upload(kfp, capsys)
    code, out, err = schedule(kfp, capsys, "--cron", "0 0 * * * *")
    assert code == 0, err
    first = json.loads(out)
    code, out, _ = schedule(kfp, capsys, "--cron", "0  0 * * * *")
    assert code == 0 and json.loads(out)["recurring_run_id"] == first["recurring_run_id"]
    assert json.loads(out)["created"] is False

    (rec,) = kfp.store.recurring_runs.values()
    assert rec["max_concurrency"] in (1, "1") and rec["no_catchup"] is True and rec["mode"] == "ENABLE"
    assert rec["trigger"]["cron_schedule"]["cron"] == "0 0 * * * *"
    assert rec["display_name"] == "kfloop-drift-check-kfloop-model" and "pipeline_spec" not in rec

    code, out, _ = schedule(kfp, capsys, "--cron", "0 30 */6 * * *")
    (replaced,) = kfp.store.recurring_runs.values()
    assert code == 0 and replaced["recurring_run_id"] == json.loads(out)["recurring_run_id"] != rec["recurring_run_id"]
    assert replaced["trigger"]["cron_schedule"]["cron"] == "0 30 */6 * * *"

    code, _, _ = cli(capsys, "schedule", "drift", *kfp.target, "--disable")
    assert code == 0 and replaced["status"] == "DISABLED"
    code, _, _ = cli(capsys, "schedule", "drift", *kfp.target, "--delete")
    assert code == 0 and not kfp.store.recurring_runs
    code, _, err = cli(capsys, "schedule", "drift", *kfp.target, "--delete")
    assert code == EXIT_DATA_FILE and "no recurring run named 'kfloop-drift-check-kfloop-model'" in err


def test_quality_schedules_beside_drift_with_the_training_version_pinned(kfp, capsys):
    upload(kfp, capsys)
    assert schedule(kfp, capsys, "--cron", "0 0 * * * *")[0] == 0
    code, out, err = cli(capsys, "schedule", "quality", *kfp.target, "--cron", "0 0 6 * * *", "--set",
                         "labelled_uri=s3://bucket/labelled.parquet", "--set", "quality.max_drop=0.1")
    assert code == 0, err
    by_name = {r["display_name"]: r for r in kfp.store.recurring_runs.values()}
    assert sorted(by_name) == ["kfloop-drift-check-kfloop-model", "kfloop-quality-check-kfloop-model"]
    quality = by_name["kfloop-quality-check-kfloop-model"]
    (version,) = [v for v in versions_named(kfp, COMMIT) if v["pipeline_version_id"] ==
                  quality["pipeline_version_reference"]["pipeline_version_id"]]
    assert kfp.store.pipelines[version["pipeline_id"]]["name"] == "kfloop-quality"
    params = quality["runtime_config"]["parameters"]
    assert params["labelled_uri"] == "s3://bucket/labelled.parquet" and params["quality_policy"] == {"max_drop": 0.1}
    assert params["training_pipeline_version"]["pipeline_name"] == "kfloop-training"
    code, _, _ = cli(capsys, "schedule", "quality", *kfp.target, "--delete")
    assert code == 0
    assert [r["display_name"] for r in kfp.store.recurring_runs.values()] == ["kfloop-drift-check-kfloop-model"]


@pytest.mark.parametrize("cron, fix", [("*/15 * * * *", "use '0 */15 * * * *'"), ("0 0 * * *", "use '0 0 0 * * *'"),
                                       ("@hourly", "e.g. '0 0 * * * *'")])
def test_a_cron_without_six_fields_is_rejected_with_the_fix(kfp, capsys, cron, fix):
    upload(kfp, capsys)
    code, _, err = schedule(kfp, capsys, "--cron", cron)
    assert code == EXIT_SETTINGS and fix in err and "6" in err
    assert not kfp.store.recurring_runs
    assert not any(r.path.endswith("/recurringruns") and r.method == "POST" for r in kfp.requests)



@pytest.fixture
def executing_kfp(isolated_env, cluster, tmp_path, monkeypatch):
    """The standalone test server executing what it holds (tests/cluster/kfp_executor.py), each step a process given
    what the cluster gives a step pod: the registry's URI and the cluster's API (its kubeconfig standing in for the
    in-cluster service account), besides what KFP gives it."""
    from cluster.kfp_executor import KfpExecutor, ProcessEngine

    engine = ProcessEngine(root=tmp_path / "pods", env={"MLFLOW_TRACKING_URI": isolated_env.tracking_uri,
                                                        "KUBECONFIG": str(cluster.kubeconfig)})
    with kfp_server(monkeypatch, tmp_path, multi_user=False) as kfp, \
            KfpExecutor(kfp, engine, pipeline_root=tmp_path / "pipeline-root") as executor:
        yield executor


def test_the_server_executes_an_uploaded_training_run_that_registers_a_version(executing_kfp, demo_files, capsys):
    kfp = executing_kfp.server
    upload(kfp, capsys)

    code, out, err = cli(capsys, "run", "training", "--host", kfp.url, "--wait", "--json",
                         "--set", f"dataset_uri={demo_files['train.parquet']}", "--set", "target=churned",
                         "--set", "model_name=executed", "--set", "training.epochs=2",
                         "--set", "training.nproc_per_node=1")

    assert code == 0, err
    summary = json.loads(out)
    (run,) = kfp.store.runs.values()
    assert summary["state"] == run["state"] == "SUCCEEDED"
    states = {t["display_name"]: t["state"] for t in run["run_details"]["task_details"]}
    assert {k: v for k, v in states.items() if k != "condition-1"} == {
        "validate-data": "SUCCEEDED", "split-holdout": "SUCCEEDED", "launch-training": "SUCCEEDED",
        "evaluate-vs-champion": "SUCCEEDED", "register-candidate": "SUCCEEDED", "promote": "SUCCEEDED",
        "rollout": "SUCCEEDED"}, states  # serving.rollout is off: the rollout step does nothing
    assert summary["model_name"] == "executed" and summary["model_version"] == "1" and summary["promoted"] is True


def test_a_failing_step_fails_the_executed_run_with_its_error(executing_kfp, tmp_path, capsys):
    kfp = executing_kfp.server
    upload(kfp, capsys)
    missing = tmp_path / "no-such.parquet"

    code, out, err = cli(capsys, "run", "training", "--host", kfp.url, "--wait", "--json",
                         "--set", f"dataset_uri={missing}", "--set", "target=churned")

    assert code == EXIT_FAILED
    (run,) = kfp.store.runs.values()
    (failed,) = [t for t in run["run_details"]["task_details"] if t["state"] == "FAILED"]
    assert failed["display_name"] == "validate-data" and str(missing) in failed["error"]["message"]
    assert run["state"] == "FAILED" and "validate-data" in run["error"]["message"]
    assert [t["display_name"] for t in run["run_details"]["task_details"]] == ["validate-data"]


def test_a_dirty_image_is_refused_unless_named_with_image(kfp, capsys, monkeypatch):
    dirty = f"ghcr.io/team/kfloop:{COMMIT[:12]}-dirty"  # deploy/image-commit.sh's tag of an uncommitted tree
    monkeypatch.setenv("KFLOOP_IMAGE", dirty)
    code, _, err = cli(capsys, "upload", *kfp.target)
    assert code == EXIT_SETTINGS and "uncommitted changes" in err and "--image" in err
    assert not kfp.store.pipelines

    code, _, err = cli(capsys, "upload", *kfp.target, "--version", "wip", "--image", dirty)
    assert code == 0, err
    assert {img for v in versions_named(kfp, "wip") for img in _step_images(v)} == {dirty}


@pytest.mark.parametrize("how", ["ci", "flag"])
def test_upload_in_ci_or_with_require_image_refuses_an_empty_or_default_image(kfp, capsys, monkeypatch, how):
    """Issue 32 item 1: a masked (empty) KFLOOP_IMAGE must not silently upload a version running the default image."""
    from data.settings import DEFAULT_IMAGE

    extra = ["--require-image"] if how == "flag" else []
    if how == "ci":
        monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("KFLOOP_IMAGE", "")
    code, _, err = cli(capsys, "upload", *kfp.target, "--version", "masked", *extra)
    assert code == EXIT_SETTINGS and "KFLOOP_IMAGE is empty or unset" in err and "image job" in err and "--image" in err
    code, _, err = cli(capsys, "upload", *kfp.target, "--version", "masked", "--image", DEFAULT_IMAGE, *extra)
    assert code == EXIT_SETTINGS and "--image is the default image" in err
    assert not versions_named(kfp, "masked")
    monkeypatch.setenv("KFLOOP_IMAGE", "ghcr.io/acme/kfloop:" + COMMIT)
    code, _, err = cli(capsys, "upload", *kfp.target, "--version", "masked", *extra)
    assert code == 0, err
    assert {img for v in versions_named(kfp, "masked") for img in _step_images(v)} == {"ghcr.io/acme/kfloop:" + COMMIT}


def test_without_a_namespace_multi_user_kfp_refuses_a_shared_upload_and_a_run(kfp, capsys):
    """Issue 32 item 3: what `--namespace` is for; a standalone KFP has no namespaces and needs none."""
    host = ["--host", kfp.url]
    code, _, err = cli(capsys, "upload", *host, "--version", "shared")
    if kfp.namespace is None:
        assert code == 0, err
        return
    assert code == EXIT_SERVICE and "403" in err and not kfp.store.pipelines
    assert [(r.namespace, r.verb, r.resource, r.allowed) for r in kfp.multi_user.reviews] == [
        ("kubeflow", "create", "pipelines", False)]  # a shared pipeline is written in KFP's own namespace
    upload(kfp, capsys)
    code, _, err = cli(capsys, "run", "drift", *host, *DRIFT_SETTINGS)
    assert code == EXIT_DATA_FILE and not kfp.store.runs  # its pipelines are in the profile, which the run must name
    code, _, err = cli(capsys, "run", "drift", *kfp.target, *DRIFT_SETTINGS)
    assert code == 0, err
    (run,) = kfp.store.runs.values()
    assert kfp.store.experiments[run["experiment_id"]]["namespace"] == PROFILE


def test_the_trigger_step_reaches_kfp_from_kfp_host_with_its_projected_token_in_the_runs_namespace(
        isolated_env, kfp, step_cluster, capsys, monkeypatch, tmp_path):
    """Issue 32 items 3-5: in the drift run's pod the trigger step reaches KFP at ``kfp.host`` (never an address
    made from the profile namespace) with the pod's token file, and starts the training run in that namespace; in
    multi-user mode every KFP API call it makes is allowed by what deploy/kubeflow-profile.yaml grants the run's
    service account ``kfloop`` (deploy/rbac.yaml)."""
    from kfp.dsl import Artifact

    from components.monitoring import trigger_retraining

    upload(kfp, capsys)
    code, _, err = cli(capsys, "run", "drift", *kfp.target, *DRIFT_SETTINGS, "--set", f"kfp.host={kfp.url}")
    assert code == 0, err
    (drift,) = kfp.store.runs.values()
    pinned = drift["runtime_config"]["parameters"]["training_pipeline_version"]
    assert pinned["host"] == kfp.url and pinned["namespace"] == (kfp.namespace or "")

    # the step's pod: no KFP_TOKEN, the projected token file (profile's default-editor), KFP_POD_NAME
    token_file = tmp_path / "token"
    if kfp.multi_user:
        kfp.multi_user.apply(REPO / "deploy" / "kubeflow-profile.yaml")
        reviewed = len(kfp.multi_user.reviews)
    token_file.write_text(kfp.multi_user.service_account_token(PROFILE, pinned["service_account"])
                          if kfp.multi_user else kfp.client_token)
    monkeypatch.delenv(kfp_client.TOKEN_ENV)
    monkeypatch.delenv(kfp_client.ENDPOINT_ENV, raising=False)
    monkeypatch.setenv(kfp_client.SA_TOKEN_PATH_ENV, str(token_file))
    monkeypatch.setenv("KFP_POD_NAME", "drift-abc-trigger-retraining")
    run_id = trigger_retraining.python_func(
        model_name="churn", dataset_uri="s3://bucket/drifted.parquet",
        drift_result=Artifact(uri=str(tmp_path / "result.json"), metadata={"data_md5": "d71f7ed"}),
        trigger_policy={"cooldown_seconds": 3600}, training_params={}, training_pipeline_version=pinned)

    run = kfp.store.runs[run_id]
    assert run["pipeline_version_reference"]["pipeline_version_id"] == pinned["pipeline_version_id"]
    assert kfp.store.experiments[run["experiment_id"]]["namespace"] == (kfp.namespace or "")
    if kfp.multi_user:
        calls = {(r.user, r.namespace, r.verb, r.resource, r.allowed) for r in kfp.multi_user.reviews[reviewed:]}
        runner = "system:serviceaccount:kfloop:kfloop"
        assert calls == {(runner, PROFILE, "list", "experiments", True), (runner, PROFILE, "list", "runs", True),
                         (runner, PROFILE, "create", "runs", True)}


def test_a_pod_without_a_token_is_told_at_once_which_file_and_poddefault_it_lacks(kfp, monkeypatch, tmp_path):
    """Issue 40 item 1: a step in a profile without the ``access-ml-pipeline`` PodDefault has no token file; against
    a multi-user KFP (its healthz says so) ``connect()`` fails naming the path and the PodDefault instead of the
    server's bare "User identity is empty". A standalone KFP needs none."""
    for key in (kfp_client.TOKEN_ENV, kfp_client.COOKIES_ENV):
        monkeypatch.delenv(key, raising=False)
    missing = tmp_path / "no-token-file"
    if not kfp.multi_user:
        kfp.token = None  # the standalone server without its token proxy
        kfp_client.connect(kfp.url).list_experiments()
        return
    with pytest.raises(kfp_client.KfpCredentialsError) as refused:
        kfp_client.connect(kfp.url)
    assert str(refused.value) == (
        f"the KFP API at {kfp.url} is multi-user and this process has no credentials: no KFP_TOKEN, no KFP_COOKIES, "
        f"and no token file at {missing} (KF_PIPELINES_SA_TOKEN_PATH). In a pod the profile's `access-ml-pipeline` "
        "PodDefault (deploy/kubeflow-profile.yaml) mounts it into pods labelled access-ml-pipeline: \"true\" "
        "(kfloop compile labels the trigger step): apply it in the namespace")


def test_a_token_file_is_read_again_for_every_request(tmp_path, monkeypatch):
    """Issue 32 item 5: a projected token rotates (the kubelet rewrites the file); the next request sends the new
    one, so a long-lived process (`kfloop serve`) keeps working."""
    monkeypatch.delenv(kfp_client.TOKEN_ENV, raising=False)
    monkeypatch.delenv(kfp_client.COOKIES_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    token_file = tmp_path / "token"
    token_file.write_text("first-token")
    monkeypatch.setenv(kfp_client.SA_TOKEN_PATH_ENV, str(token_file))
    with KfpApiServer(token="first-token") as server:
        client = kfp_client.connect(server.url)
        client.list_experiments()
        server.token = "rotated-token"  # the old token expired
        token_file.write_text("rotated-token")
        client.list_experiments()
    assert [r.headers["authorization"] for r in server.requests if "experiments" in r.path] == [
        "Bearer first-token", "Bearer rotated-token"]


def test_standalone_kfp_needs_no_credentials_and_session_cookies_are_sent_as_given(tmp_path, monkeypatch):
    """Issue 32 item 5: no KFP_TOKEN for a standalone KFP; KFP_COOKIES for an install behind Dex/oauth2-proxy."""
    for key in (kfp_client.TOKEN_ENV, kfp_client.COOKIES_ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(kfp_client.SA_TOKEN_PATH_ENV, str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with KfpApiServer() as server:
        kfp_client.connect(server.url).list_experiments()
        monkeypatch.setenv(kfp_client.COOKIES_ENV, "oauth2_proxy_kubeflow=s3ss10n")
        kfp_client.connect(server.url).list_experiments()
    first, second = [r.headers for r in server.requests if "experiments" in r.path]
    assert "authorization" not in first and "cookie" not in first
    assert second["cookie"] == "oauth2_proxy_kubeflow=s3ss10n" and "authorization" not in second


def test_the_in_cluster_endpoint_is_kf_pipelines_endpoint_else_kfp_host_never_the_namespace(monkeypatch):
    monkeypatch.delenv(kfp_client.ENDPOINT_ENV, raising=False)
    assert kfp_client.endpoint(None) == kfp_client.IN_CLUSTER_ENDPOINT == (
        "http://ml-pipeline.kubeflow.svc.cluster.local:8888")
    assert kfp_client.endpoint(None, "http://ml-pipeline.kfp.svc:8888") == "http://ml-pipeline.kfp.svc:8888"
    monkeypatch.setenv(kfp_client.ENDPOINT_ENV, "https://kfp.example.com/pipeline")
    assert kfp_client.endpoint(None, "http://ml-pipeline.kfp.svc:8888") == "https://kfp.example.com/pipeline"
    assert kfp_client.endpoint("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    with pytest.raises(ValueError, match="kfp.host 'ml-pipeline:8888'"):
        kfp_client.KfpSettings.from_dict({"host": "ml-pipeline:8888"})
    monkeypatch.setenv(kfp_client.ENDPOINT_ENV, "ml-pipeline")
    with pytest.raises(ValueError, match="KF_PIPELINES_ENDPOINT 'ml-pipeline'"):
        kfp_client.endpoint(None)


def test_a_push_re_points_the_models_one_drift_schedule_at_its_version(kfp, capsys, monkeypatch):
    """Issue 32 item 6: each push to main schedules drift for its version; the model keeps one schedule, now
    starting its training version, while another model has its own."""
    upload(kfp, capsys)
    assert schedule(kfp, capsys, "--cron", "0 0 * * * *", "--set", "model_name=churn")[0] == 0
    assert schedule(kfp, capsys, "--cron", "0 0 * * * *", "--set", "model_name=fraud")[0] == 0
    later = "4" * 40
    monkeypatch.setenv("KFLOOP_GIT_COMMIT", later)
    upload(kfp, capsys)
    code, out, err = schedule(kfp, capsys, "--cron", "0 0 * * * *", "--set", "model_name=churn")
    assert code == 0 and json.loads(out)["created"] is True, err
    by_name = {r["display_name"]: r for r in kfp.store.recurring_runs.values()}
    assert sorted(by_name) == ["kfloop-drift-check-churn", "kfloop-drift-check-fraud"]
    pinned = {name: r["runtime_config"]["parameters"]["training_pipeline_version"]["version_name"]
              for name, r in by_name.items()}
    assert pinned == {"kfloop-drift-check-churn": later, "kfloop-drift-check-fraud": COMMIT}
    drift = {v["pipeline_version_id"]: v["name"] for v in kfp.store.versions.values()}
    assert drift[by_name["kfloop-drift-check-churn"]["pipeline_version_reference"]["pipeline_version_id"]] == later


def test_wait_asks_again_after_a_gateway_502_and_still_returns_a_failed_run(kfp, capsys):
    upload(kfp, capsys)
    client = kfp_client.connect(kfp.url)
    ref = kfp_client.find_version(client, "kfloop-drift", COMMIT, kfp.namespace)
    run = kfp_client.create_run(client, ref, {"current_uri": "x.parquet"}, namespace=kfp.namespace)
    kfp.script_states(["RUNNING", "FAILED"], run_id=run.run_id)
    kfp.answer_next(HTTPStatus.BAD_GATEWAY)

    final = kfp_client.wait(client, run.run_id, poll_seconds=0.01, timeout_seconds=60)

    assert final.state == "FAILED"
    assert f"run {run.run_id}: KFP answered 502 Bad Gateway; asking again (1/" in capsys.readouterr().err


def test_wait_gives_up_after_its_bound_of_transient_errors(kfp, capsys):
    upload(kfp, capsys)
    client = kfp_client.connect(kfp.url)
    ref = kfp_client.find_version(client, "kfloop-drift", COMMIT, kfp.namespace)
    run = kfp_client.create_run(client, ref, {"current_uri": "x.parquet"}, namespace=kfp.namespace)
    kfp.answer_next(HTTPStatus.SERVICE_UNAVAILABLE, kfp_client.WAIT_TRANSIENT_RETRIES + 1)

    with pytest.raises(ApiException) as failed:
        kfp_client.wait(client, run.run_id, poll_seconds=0.001, timeout_seconds=60)

    assert failed.value.status == 503 and kfp.injected == []


def test_wait_does_not_retry_a_refusal(kfp, capsys):
    upload(kfp, capsys)
    client = kfp_client.connect(kfp.url)

    with pytest.raises(ApiException) as failed:
        kfp_client.wait(client, "no-such-run", poll_seconds=0.01, timeout_seconds=60)

    assert failed.value.status == 404
    assert len([r for r in kfp.requests if r.path.endswith("/runs/no-such-run")]) == 1


def test_run_training_is_refused_while_a_training_run_is_in_flight(kfp, capsys):
    upload(kfp, capsys)
    code, out, err = cli(capsys, "run", "training", *kfp.target, "--json", *TRAINING_SETTINGS)
    assert code == 0, err
    first = json.loads(out)["run_id"]

    code, out, err = cli(capsys, "run", "training", *kfp.target, "--json", *TRAINING_SETTINGS)

    assert code != 0 and f"training run {first} is PENDING: not starting a second one" in err
    assert [r["run_id"] for r in kfp.store.runs.values()] == [first]
    kfp.set_run_state(first, "SUCCEEDED")
    code, out, err = cli(capsys, "run", "training", *kfp.target, "--json", *TRAINING_SETTINGS)
    assert code == 0 and json.loads(out)["run_id"] != first


def test_the_server_records_who_created_each_run(kfp, capsys):
    upload(kfp, capsys)
    code, out, err = cli(capsys, "run", "training", *kfp.target, "--json", *TRAINING_SETTINGS)
    assert code == 0, err
    run_id = json.loads(out)["run_id"]
    expected = {run_id: service_account_user("ci", "kfloop-deployer").name} if kfp.namespace else {}
    assert kfp.store.created_by == expected
    assert kfp.store.runs[run_id]["service_account"] == "kfloop"
