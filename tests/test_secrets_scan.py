"""Plant secret values in the environment, drive compile, upload, run, schedule, the webhook and a real training
run, then scan everything they left behind: compiled YAML, rendered training jobs, request bodies the KFP server
received, CLI output, webhook logs, MLflow params and tags. None may hold a secret value (or the hosts they guard)."""
from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pytest
from cluster.kfp_server import KfpApiServer

from components import kfp_client
from data.errors import EXIT_SERVICE
from pipelines.cli.commands import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def planted(monkeypatch, tmp_path) -> dict[str, str]:
    """Secret values in every variable a kfloop process may see."""
    values = {name: f"planted-{name.lower()}-{uuid.uuid4().hex}" for name in (
        "KFP_TOKEN", "KFLOOP_WEBHOOK_TOKEN", "KFLOOP_WEBHOOK_HMAC_SECRET", "KFLOOP_METRICS_TOKEN",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(kfp_client.SA_TOKEN_PATH_ENV, str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KFLOOP_HOME", str(tmp_path / "kfloop"))
    return values


def assert_clean(text: str, secrets: dict[str, str], where: str) -> None:
    leaked = sorted(name for name, value in secrets.items() if value in text)
    assert not leaked, f"{where} holds the value of {leaked}"


def test_compiled_yaml_holds_no_secret_value_host_or_token(planted, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.planted-host.example:5000")
    monkeypatch.setenv("KF_PIPELINES_ENDPOINT", "https://kfp.planted-host.example")
    assert main(["compile", "--out", str(tmp_path), "--credentials-secret", "team-mlflow"]) == 0
    out = capsys.readouterr()
    texts = {p.name: p.read_text() for p in sorted(tmp_path.glob("*.yaml"))}
    assert set(texts) == {"training.yaml", "drift.yaml", "quality.yaml"}
    for name, text in {**texts, **{str(p.relative_to(REPO)): p.read_text()
                                   for p in (REPO / "pipelines" / "compiled").glob("*.yaml")}}.items():
        assert_clean(text, planted, name)
        assert "planted-host" not in text and "Bearer" not in text, name
        assert "team-mlflow" in text or "kfloop-mlflow" in text  # the Secret goes in by name
    assert_clean(out.out + out.err, planted, "compile output")


def test_kfp_requests_and_cli_output_hold_no_secret(planted, monkeypatch, capsys):
    monkeypatch.setenv("KFLOOP_GIT_COMMIT", "c" * 40)
    with KfpApiServer(token=planted["KFP_TOKEN"]) as kfp:
        kfp.script_states(["FAILED"])
        outputs = []
        for argv in (["upload", "--host", kfp.url], ["upload", "--host", kfp.url, "--json"],
                     ["run", "training", "--host", kfp.url, "--set", "dataset_uri=s3://b/t.parquet", "--wait"],
                     ["run", "drift", "--host", kfp.url, "--json", "--set", "current_uri=s3://b/c.parquet"],
                     ["schedule", "drift", "--host", kfp.url, "--cron", "0 0 * * * *", "--set",
                      "current_uri=s3://b/c.parquet"],
                     ["--debug", "schedule", "drift", "--host", kfp.url, "--cron", "0 0 * * *"]):
            main(argv)
            out = capsys.readouterr()
            outputs.append(out.out + out.err)
        monkeypatch.setenv("KFP_TOKEN", "wrong")  # a refused request's error output and debug trace
        assert main(["--debug", "upload", "--host", kfp.url, "--pipeline-version", "x"]) == EXIT_SERVICE
        out = capsys.readouterr()
        outputs.append(out.out + out.err)
    assert kfp.store.runs and kfp.store.recurring_runs  # the commands did reach the server
    assert_clean("\n".join(outputs), planted, "CLI output")
    for request in kfp.requests:
        seen = request.body.decode("utf-8", "replace") + json.dumps(request.query) + request.path
        assert_clean(seen, planted, f"{request.method} {request.path} request")
        headers = {k: v for k, v in request.headers.items() if k != "authorization"}
        assert_clean(json.dumps(headers), planted, f"{request.method} {request.path} headers")


def test_webhook_logs_hold_no_secret(planted):
    from monitoring.trigger import TriggerPolicy
    from monitoring.webhook import AlertScope, AlertWebhook, WebhookAuth

    log = io.StringIO()
    hook = AlertWebhook(auth=WebhookAuth.from_env({k: planted[k] for k in ("KFLOOP_WEBHOOK_TOKEN",
                                                                         "KFLOOP_WEBHOOK_HMAC_SECRET",
                                                                         "KFLOOP_METRICS_TOKEN")}),
                        scope=AlertScope(), policy=TriggerPolicy(), start=lambda alert: pytest.fail("a refused alert started a run"),
                        store_for=lambda model: pytest.fail("a refused alert reached the trigger state"), log=log)
    assert planted["KFLOOP_WEBHOOK_TOKEN"] not in repr(hook.auth)
    assert planted["KFLOOP_METRICS_TOKEN"] not in repr(hook.auth)
    body = b'{"model": "m", "reason": "r"}'
    near_miss = {"Authorization": f"Bearer {planted['KFLOOP_WEBHOOK_TOKEN']}x", "Content-Length": str(len(body))}
    status, answer = hook.screen({name.lower(): value for name, value in near_miss.items()})  # before any body
    assert status == 401
    hook.emit("rejected", status=int(status), error=answer["error"])
    assert_clean(log.getvalue() + json.dumps(answer), planted, "webhook log and answer")


def test_mlflow_params_and_tags_of_a_training_run_hold_no_secret(planted, isolated_env, demo_files, tmp_path):
    import mlflow

    from training.steps.train import train_step

    train_step(train_path=str(demo_files["train.parquet"]), schema_path=str(REPO / "data" / "schema.yaml"),
               model_name="churn", config={"epochs": 1}, nnodes=1, nproc_per_node=1, backend="local",
               pipeline_run_id="kfp-run-1", model_dir=str(tmp_path / "model"))
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert runs and any(run.data.params for run in runs)
    for run in runs:
        assert_clean(json.dumps({"params": run.data.params, "tags": run.data.tags}), planted,
                     f"MLflow run {run.info.run_id}")


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_rendered_jobs_hold_references_to_the_credentials_secret_never_values(planted, monkeypatch, capsys, kind):
    """What the launcher submits (`kfloop render-job` is its dry run): every credential is a secretKeyRef."""
    import yaml

    from training.launch.cluster import CREDENTIAL_KEYS

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.planted-host.example:5000")
    assert main(["render-job", "--kind", kind, "--nnodes", "2", "--set", "cluster.namespace=kfloop"]) == 0
    out = capsys.readouterr()
    assert_clean(out.out + out.err, planted, f"rendered {kind}")
    assert "planted-host" not in out.out
    body = yaml.safe_load(out.out)
    containers = [c for spec in body["spec"].get("pytorchReplicaSpecs", {}).values()
                  for c in spec["template"]["spec"]["containers"]] or [body["spec"]["trainer"]]
    for container in containers:
        env = {e["name"]: e for e in container["env"]}
        assert {key: env[key]["valueFrom"]["secretKeyRef"] for key in CREDENTIAL_KEYS} == {
            key: {"name": "kfloop-mlflow", "key": key, "optional": True} for key in CREDENTIAL_KEYS}
