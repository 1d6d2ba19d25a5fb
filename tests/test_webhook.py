"""The alert webhook end to end: HTTP in, the trigger decision on state kept in MLflow, training runs started
through the real kfp.Client on the KFP API test server. The clock is injected; nothing sleeps."""
from __future__ import annotations

import hashlib
import hmac
import http.client
import io
import json
import threading
from datetime import datetime, timedelta, timezone

import pytest
from cloudevents.conversion import to_binary
from cluster.kfp_server import KfpApiServer

from data.errors import EXIT_SETTINGS
from monitoring.inference_logs import (KINDS, REQUEST_TYPE, RESPONSE_TYPE, InferenceLogWriter, LogRecord,
                                       read_inference_logs)
from monitoring.metrics import RecordsCollector, registered_models
from monitoring.trigger import TriggerPolicy
from monitoring.trigger_configmap import ConfigMapTriggerStore
from monitoring.trigger_registry import STATE_TAG, RegistryTriggerStore
from monitoring.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, AlertScope, AlertWebhook, WebhookAuth
from training.launch.kube_client import api_client
from training.registry.versions import ensure_registered_model
from training.serving import MODEL_VERSION_ANNOTATION
from components import kfp_client
from pipelines.kfp_server.runs import alert_starter

HOOK_TOKEN = "hook-token-5d2f"
HMAC_KEY = "hmac-key-88e1"
METRICS_TOKEN = "metrics-token-0c4a"
T0 = 86400 * 20_000 + 600.0
POLICY = TriggerPolicy(cooldown_seconds=3600, window_seconds=86400)
SETTINGS = {"dataset_uri": "s3://bucket/current.parquet", "training": {"epochs": 2}}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Hook:
    """A running webhook and what it logged."""

    def __init__(self, kfp: KfpApiServer, clock: Clock, *, prefixes: tuple[str, ...] | None = ("s3://bucket/",),
                 **kw):
        ensure_registered_model("churn")
        self.log = io.StringIO()
        self.webhook = AlertWebhook(auth=WebhookAuth(token=HOOK_TOKEN, hmac_secret=HMAC_KEY,
                                                     metrics_token=METRICS_TOKEN),
                                    scope=AlertScope(allowed_data_prefixes=prefixes,
                                                     default_dataset_uri=SETTINGS["dataset_uri"]), policy=POLICY,
                                    start=alert_starter(SETTINGS, host=kfp.url), store_for=RegistryTriggerStore,
                                    clock=clock, log=self.log, **kw)
        self.server = self.webhook.server(0, "127.0.0.1")
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def request(self, body: bytes, *, method: str = "POST", path: str = "/alerts",
                headers: dict | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.server_address[1], timeout=30)
        try:
            conn.request(method, path, body=body, headers={"Authorization": f"Bearer {HOOK_TOKEN}",
                                                          "Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def post(self, payload: dict, **kw) -> tuple[int, dict]:
        return self.request(json.dumps(payload).encode(), **kw)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def hook(kfp, clock):
    h = Hook(kfp, clock)
    yield h
    h.close()


def alertmanager(status: str = "firing", model: str = "churn", **annotations: str) -> dict:
    return {"version": "4", "groupKey": "{}:{alertname=\"FeatureDrift\"}", "status": status, "receiver": "kfloop",
            "groupLabels": {"alertname": "FeatureDrift"}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093", "truncatedAlerts": 0,
            "alerts": [{"status": status,
                        "labels": {"alertname": "FeatureDrift", "model": model, "severity": "warning"},
                        "annotations": {"summary": "PSI of tenure above 0.2", **annotations},
                        "startsAt": "2026-12-03T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                        "generatorURL": "http://prometheus/graph", "fingerprint": f"fp-{model}"}]}


def training_runs(kfp) -> list[dict]:
    return list(kfp.store.runs.values())


def test_ten_alerts_in_one_window_start_one_run(kfp, hook, clock):
    answers = []
    for i in range(10):
        clock.now = T0 + 60 * i
        answers.append(hook.post(alertmanager()))

    assert [status for status, _ in answers] == [200] * 10
    decisions = [body["decisions"][0] for _, body in answers]
    assert [d["fire"] for d in decisions] == [True] + [False] * 9
    assert all(d["reason"].startswith("duplicate:") for d in decisions[1:])
    (run,) = training_runs(kfp)
    assert decisions[0]["run_id"] == run["run_id"]
    assert run["runtime_config"]["parameters"] == {"dataset_uri": "s3://bucket/current.parquet",
                                                   "model_name": "churn", "training_config": {"epochs": 2}}
    assert kfp.store.pipelines[run["pipeline_version_reference"]["pipeline_id"]]["name"] == "kfloop-training"


def test_an_alert_while_a_training_run_is_in_flight_starts_none(kfp, hook, clock):
    client = kfp_client.connect(kfp.url)
    manual = kfp_client.create_run(client, kfp_client.find_version(client, "kfloop-training", "a" * 40),
                                   {"dataset_uri": "s3://bucket/manual.parquet"})
    kfp.set_run_state(manual.run_id, "RUNNING")

    status, body = hook.post({"model": "churn", "reason": "accuracy dropped"})

    assert status == 200
    assert body["decisions"][0]["fire"] is False and manual.run_id in body["decisions"][0]["reason"]
    assert [r["run_id"] for r in training_runs(kfp)] == [manual.run_id]

    kfp.set_run_state(manual.run_id, "SUCCEEDED")  # once it is done, the same alert may start one
    status, body = hook.post({"model": "churn", "reason": "accuracy dropped"})
    assert body["decisions"][0]["fire"] is True and len(training_runs(kfp)) == 2


def test_an_alert_after_the_cooldown_starts_one(kfp, hook, clock):
    first = hook.post({"model": "churn", "reason": "drift", "data_md5": "0a"})[1]["decisions"][0]
    kfp.set_run_state(first["run_id"], "SUCCEEDED")

    clock.now = T0 + 3599
    blocked = hook.post({"model": "churn", "reason": "drift", "data_md5": "0b"})[1]["decisions"][0]
    clock.now = T0 + 3600
    after = hook.post({"model": "churn", "reason": "drift", "data_md5": "0b"})[1]["decisions"][0]

    assert first["fire"] and not blocked["fire"] and blocked["reason"].startswith("cooldown:")
    assert after["fire"] and after["run_id"] != first["run_id"]
    assert [r["run_id"] for r in training_runs(kfp)] == [first["run_id"], after["run_id"]]


def test_the_trigger_state_outlives_the_webhook(kfp, hook, clock):
    import mlflow

    hook.post(alertmanager())
    hook.close()
    restarted = Hook(kfp, clock)  # a new pod: nothing in memory, nothing on its disk
    try:
        clock.now = T0 + 7200
        _, body = restarted.post(alertmanager())
    finally:
        restarted.close()
    assert body["decisions"][0]["reason"].startswith("duplicate:") and len(training_runs(kfp)) == 1
    state = json.loads(mlflow.MlflowClient().get_registered_model("churn").tags[STATE_TAG])
    assert [f["run_id"] for f in state["models"]["churn"]["fired"]] == [training_runs(kfp)[0]["run_id"]]


def test_resolved_alerts_start_nothing(kfp, hook):
    status, body = hook.post(alertmanager(status="resolved"))
    assert status == 200 and body == {"decisions": []} and not training_runs(kfp)


def signed(body: bytes, at: float, key: str = HMAC_KEY) -> dict[str, str]:
    """The headers of ``body`` signed at Unix time ``at`` (no bearer token)."""
    stamp = str(int(at))
    mac = hmac.new(key.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"Authorization": "", SIGNATURE_HEADER: f"sha256={mac}", TIMESTAMP_HEADER: stamp}


def test_hmac_signed_alerts_are_accepted_within_the_replay_window_only(kfp, hook, clock):
    body = json.dumps({"model": "churn", "reason": "drift"}).encode()
    status, answer = hook.request(body, headers=signed(body, T0 - 299))
    assert status == 200 and answer["decisions"][0]["fire"] is True

    refused = {
        "tampered body": hook.request(body + b" ", headers=signed(body, T0)),
        "other key": hook.request(body, headers=signed(body, T0, key="not-the-key")),
        "replayed after the window": hook.request(body, headers=signed(body, T0 - 301)),
        "dated in the future": hook.request(body, headers=signed(body, T0 + 301)),
        "no timestamp": hook.request(body, headers={**signed(body, T0), TIMESTAMP_HEADER: ""}),
        "timestamp not signed": hook.request(body, headers={**signed(body, T0), TIMESTAMP_HEADER: str(int(T0) + 1)}),
    }
    assert {case: status for case, (status, _) in refused.items()} == dict.fromkeys(refused, 401)
    assert "outside the replay window of 300 s" in refused["replayed after the window"][1]["error"]
    assert "needs X-Kfloop-Timestamp" in refused["no timestamp"][1]["error"]
    assert len(training_runs(kfp)) == 1


@pytest.mark.parametrize("case, status, reason", [
    ("bad token", 401, "bearer token"),
    ("no auth", 401, "invalid"),
    ("oversized", 413, "exceeds the limit of 2048"),
    ("not json", 400, "bad payload"),
    ("no model label", 400, "add label 'model'"),
    ("plain without reason", 400, '{"model": NAME, "reason": TEXT}'),
    ("old alertmanager version", 400, '"version": "4"'),
    ("unknown field", 400, "unknown field(s) ['modle']"),
])
def test_bad_requests_get_4xx_with_a_reason_and_start_nothing(kfp, clock, case, status, reason):
    hook = Hook(kfp, clock, max_body_bytes=2048)
    no_model = alertmanager()
    no_model["alerts"][0]["labels"].pop("model")
    old = alertmanager()
    old["version"] = "3"
    requests = {
        "bad token": (json.dumps({"model": "churn", "reason": "x"}).encode(), {"Authorization": "Bearer nope"}),
        "no auth": (json.dumps({"model": "churn", "reason": "x"}).encode(), {"Authorization": ""}),
        "oversized": (json.dumps({"model": "churn", "reason": "x" * 4096}).encode(), {}),
        "not json": (b"{model: churn", {}),
        "no model label": (json.dumps(no_model).encode(), {}),
        "plain without reason": (json.dumps({"model": "churn"}).encode(), {}),
        "old alertmanager version": (json.dumps(old).encode(), {}),
        "unknown field": (json.dumps({"model": "churn", "reason": "x", "modle": "y"}).encode(), {}),
    }
    body, headers = requests[case]
    try:
        got, answer = hook.request(body, headers=headers)
        assert (got, reason in answer["error"]) == (status, True), answer
        assert hook.request(b"", method="GET", path="/healthz") == (200, {"status": "ok"})
    finally:
        hook.close()
    assert not training_runs(kfp)
    lines = [json.loads(line) for line in hook.log.getvalue().splitlines()]
    assert [line["status"] for line in lines if line["event"] == "rejected"] == [status]
    assert HOOK_TOKEN not in hook.log.getvalue() and "nope" not in hook.log.getvalue()


def test_each_token_opens_its_own_door_only(kfp, clock):
    hook = Hook(kfp, clock, metrics=RecordsCollector(models=registered_models, store_for=RegistryTriggerStore))
    alert = json.dumps({"model": "churn", "reason": "drift"}).encode()
    try:
        refused = hook.request(alert, headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        scraped_with_hook_token = hook.request(b"", method="GET", path="/metrics",
                                               headers={"Authorization": f"Bearer {HOOK_TOKEN}"})
        conn = http.client.HTTPConnection("127.0.0.1", hook.server.server_address[1], timeout=30)
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        scraped = conn.getresponse()
        text = scraped.read().decode()
        conn.close()
    finally:
        hook.close()
    assert refused[0] == 401 and "only reads /metrics" in refused[1]["error"]
    assert scraped_with_hook_token[0] == 401 and "only posts alerts" in scraped_with_hook_token[1]["error"]
    assert scraped.status == 200 and 'kfloop_trigger_fired_total{model="churn"} 0.0' in text
    assert not training_runs(kfp)
    assert HOOK_TOKEN not in hook.log.getvalue() and METRICS_TOKEN not in hook.log.getvalue()


def test_one_token_for_both_doors_is_refused():
    with pytest.raises(ValueError, match="KFLOOP_METRICS_TOKEN equals"):
        WebhookAuth.from_env({"KFLOOP_WEBHOOK_TOKEN": "same", "KFLOOP_METRICS_TOKEN": "same"})


def champion_trained_on(model: str, data_uri: str) -> None:
    """``model`` registered with a champion whose lineage says it was trained on ``data_uri``."""
    import mlflow

    client = mlflow.MlflowClient()
    ensure_registered_model(model)
    version = client.create_model_version(model, source="s3://bucket/churn/model", tags={"data_uri": data_uri})
    client.set_registered_model_alias(model, "champion", version.version)


@pytest.mark.parametrize("prefixes, payload, rule", [
    (("s3://bucket/",), {"model": "never-registered"}, "rule registered_model: 'never-registered'"),
    (("s3://bucket/churn/",), {"dataset_uri": "s3://elsewhere/churn/x.parquet"}, "rule trigger.allowed_data_prefixes"),
    (("s3://bucket/churn",), {"dataset_uri": "s3://bucket/churn-evil/x.parquet"}, "not under ['s3://bucket/churn']"),
    (("s3://bucket/churn/",), {"dataset_uri": "s3://bucket/churn/../hr/x.parquet"}, "rule dataset_uri: "
     "s3://bucket/churn/../hr/x.parquet: rule uri.key"),
    (("s3://bucket/churn/",), {"dataset_uri": "http://alice:S3CRETPW@169.254.169.254/latest/meta-data"},
     "rule dataset_uri: http://169.254.169.254/latest/meta-data: rule uri.scheme: scheme 'http' is not read"),
    (("s3://bucket/churn/",), {"dataset_uri": "simplecache::s3://bucket/churn/x.parquet"}, "rule uri.chain"),
    (("s3://bucket/churn/",), {"dataset_uri": "s3://bucket/churn/x.parquet?X-Amz-Signature=abc123SIG"},
     "rule dataset_uri: s3://bucket/churn/x.parquet: rule uri.query"),
    (None, {"dataset_uri": "s3://bucket/other/x.parquet"}, "(unset: the folder of the champion's training data)"),
    (None, {"model": "no-champion"}, "has no champion whose lineage names its training data"),
])
def test_alerts_outside_their_scope_get_403_naming_the_rule_log_it_and_start_nothing(kfp, clock, prefixes, payload,
                                                                                    rule):
    champion_trained_on("churn", "s3://bucket/churn/train.parquet")
    ensure_registered_model("no-champion")
    hook = Hook(kfp, clock, prefixes=prefixes)
    try:
        status, answer = hook.post({"model": "churn", "reason": "drift", **payload})
    finally:
        hook.close()
    assert status == 403 and rule in answer["error"], answer
    assert not training_runs(kfp) and not RegistryTriggerStore("churn").load()["models"]
    (logged,) = [json.loads(line) for line in hook.log.getvalue().splitlines()]
    assert logged["event"] == "rejected" and logged["status"] == 403 and rule in logged["error"]
    assert not any(secret in hook.log.getvalue() + json.dumps(answer) for secret in ("S3CRETPW", "abc123SIG"))


@pytest.mark.parametrize("champion_data, dataset_uri", [
    ("/train.parquet", "/var/run/secrets/kubernetes.io/serviceaccount/token"),
    ("s3://bucket/train.parquet", "s3://bucket/hr/salaries.parquet"),
])
def test_a_champion_at_the_root_or_a_bucket_root_allows_nothing_by_default(kfp, clock, champion_data, dataset_uri):
    champion_trained_on("churn", champion_data)
    hook = Hook(kfp, clock, prefixes=None)
    try:
        status, answer = hook.post({"model": "churn", "reason": "drift", "dataset_uri": dataset_uri})
    finally:
        hook.close()
    assert status == 403 and "would allow every file there; set trigger.allowed_data_prefixes" in answer["error"]
    assert not training_runs(kfp) and not RegistryTriggerStore("churn").load()["models"]


def test_by_default_alerts_may_train_on_the_champions_data_folder(kfp, clock):
    champion_trained_on("churn", "s3://bucket/churn/2026-12/train.parquet")
    hook = Hook(kfp, clock, prefixes=None)
    try:
        named = hook.post({"model": "churn", "reason": "drift", "dataset_uri": "s3://bucket/churn/2026-12/new.parquet"})
        clock.now += 7200
        configured = hook.post(alertmanager())  # names no data: kfloop.yaml's s3://bucket/current.parquet
    finally:
        hook.close()
    assert named[0] == 200 and named[1]["decisions"][0]["fire"] is True
    assert configured[0] == 403 and "s3://bucket/current.parquet is not under ['s3://bucket/churn/2026-12']" in \
        configured[1]["error"]
    (run,) = training_runs(kfp)
    assert run["runtime_config"]["parameters"]["dataset_uri"] == "s3://bucket/churn/2026-12/new.parquet"


def test_the_webhook_refuses_to_start_without_auth():
    with pytest.raises(ValueError, match="KFLOOP_WEBHOOK_TOKEN"):
        WebhookAuth.from_env({})


def test_the_drift_pipelines_trigger_step_starts_the_pinned_training_version_once(kfp, step_cluster, tmp_path,
                                                                                   monkeypatch):
    from kfp.dsl import Artifact

    from components.monitoring import trigger_retraining

    monkeypatch.setenv("KFP_POD_NAME", "drift-abc-trigger-retraining")  # as in the step's pod: the Kubernetes backend

    client = kfp_client.connect(kfp.url)
    training = kfp_client.find_version(client, "kfloop-training", "a" * 40)
    pinned = {"pipeline_name": "kfloop-training", "pipeline_id": training.pipeline_id,
              "pipeline_version_id": training.pipeline_version_id, "version_name": "a" * 40,
              "experiment": "kfloop", "namespace": "", "host": kfp.url, "service_account": "kfloop"}
    drift_result = Artifact(uri=str(tmp_path / "result.json"), metadata={"data_md5": "d71f7ed"})

    def step() -> str:  # what the step's executor calls, as a fresh pod would (no state in the process)
        return trigger_retraining.python_func(model_name="churn", dataset_uri="s3://bucket/drifted.parquet",
                                              drift_result=drift_result, trigger_policy={"cooldown_seconds": 3600},
                                              training_params={"nnodes": 2}, training_pipeline_version=pinned)

    run_id = step()
    again = step()

    (run,) = training_runs(kfp)
    assert run_id == run["run_id"] and again == ""
    assert run["pipeline_version_reference"]["pipeline_version_id"] == training.pipeline_version_id
    assert run["service_account"] == "kfloop"  # the drift run's, pinned with the version
    assert run["runtime_config"]["parameters"] == {"dataset_uri": "s3://bucket/drifted.parquet",
                                                   "model_name": "churn", "nnodes": 2}
    state = ConfigMapTriggerStore("churn", api=api_client(), namespace="ml").load()  # the trigger's ConfigMap
    assert state["models"]["churn"]["fired"][0]["run_id"] == run_id

    with pytest.raises(ValueError, match="no training pipeline version is pinned.*--host"):
        trigger_retraining.python_func(model_name="churn", dataset_uri="s3://bucket/other.parquet",
                                       drift_result=Artifact(uri=str(tmp_path / "r.json"),
                                                             metadata={"data_md5": "07e4"}),
                                       trigger_policy={"cooldown_seconds": 0}, training_params={},
                                       training_pipeline_version={})
    assert len(training_runs(kfp)) == 1


def test_the_deploy_manifest_runs_serve_restricted_with_the_token_from_a_secret():
    from pathlib import Path

    import yaml

    from pipelines.cli.commands import build_parser

    docs = {d["kind"]: d for d in yaml.safe_load_all((Path(__file__).parents[1] / "deploy" / "webhook.yaml")
                                                     .read_text())}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "NetworkPolicy"}
    assert docs["Role"]["rules"] == [  # the trigger state, nothing else
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["kfloop-trigger-state"],
         "verbs": ["get", "update"]}]
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "serve" and container["ports"][0]["containerPort"] == args.port
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == \
        "RuntimeDefault"
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    env = {e["name"]: e for e in container["env"]}
    assert env["KFLOOP_WEBHOOK_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "kfloop-webhook"
    assert all("value" not in e for name, e in env.items() if name != "KFLOOP_HOME")
    assert container["readinessProbe"]["httpGet"]["path"] == container["livenessProbe"]["httpGet"]["path"] == \
        "/healthz"  # 503 while no alert can be decided: the pod is restarted
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == docs["Deployment"]["spec"]["selector"] and policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert [(peer["namespaceSelector"]["matchLabels"], peer["podSelector"]["matchLabels"]) for peer in rule["from"]] == [
        ({"kubernetes.io/metadata.name": "monitoring"}, {"app.kubernetes.io/name": "alertmanager"}),
        ({"kubernetes.io/metadata.name": "monitoring"}, {"app.kubernetes.io/name": "prometheus"})]
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
    token_dir = next(m for m in container["volumeMounts"] if m["name"] == "kfp-token")["mountPath"]
    assert f"{token_dir}/token" == kfp_client.SA_TOKEN_PATH


def test_kfloop_serve_answers_alerts_within_their_scope_and_logs_json_lines(kfp, monkeypatch):
    import os
    import queue
    import subprocess
    import sys
    import time

    ensure_registered_model("churn")
    monkeypatch.setenv("KFLOOP_WEBHOOK_TOKEN", HOOK_TOKEN)
    monkeypatch.setenv("KFLOOP_METRICS_TOKEN", METRICS_TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "pipelines", "serve", "--port", "0", "--bind", "127.0.0.1",
                             "--kfp-host", kfp.url, "--set", "dataset_uri=s3://bucket/current.parquet",
                             "--set", "trigger.allowed_data_prefixes=[s3://bucket/]"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=dict(os.environ),
                            start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    seen: list[str] = []
    answers = []
    try:
        deadline = time.monotonic() + 180
        port = None
        while port is None:
            assert proc.poll() is None, "".join(seen)
            try:
                seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                pytest.fail(f"kfloop serve did not start: {''.join(seen)}")
            if seen[-1].startswith("{") and json.loads(seen[-1])["event"] == "listening":
                port = json.loads(seen[-1])["port"]
        for method, path, body, token in (
                ("POST", "/alerts", {"model": "churn", "reason": "drift"}, HOOK_TOKEN),
                ("POST", "/alerts", {}, "wrong"),
                ("POST", "/alerts", {"model": "churn", "reason": "drift"}, METRICS_TOKEN),
                ("POST", "/alerts", {"model": "churn", "reason": "x", "dataset_uri": "s3://other/x.parquet"},
                 HOOK_TOKEN),
                ("GET", "/metrics", None, METRICS_TOKEN)):
            # a connection each: a refused token is answered before the body is read, and the server then closes the
            # connection (the unread body makes the close a reset that can cut a reused connection's next answer)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Authorization": f"Bearer {token}"})
            answer = conn.getresponse()
            answers.append((answer.status, answer.read().decode()))
            conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        reader.join(timeout=60)
    while not lines.empty():
        seen.append(lines.get())
    (run,) = training_runs(kfp)
    assert json.loads(answers[0][1])["decisions"][0]["run_id"] == run["run_id"]
    assert [status for status, _ in answers] == [200, 401, 401, 403, 200]
    assert "rule trigger.allowed_data_prefixes" in answers[3][1]
    assert 'kfloop_trigger_fired_total{model="churn"} 1.0' in answers[4][1]
    events = [json.loads(line) for line in seen if line.startswith("{")]
    assert [e["event"] for e in events] == ["listening", "trigger", "rejected", "rejected", "rejected"]
    assert [e["status"] for e in events[2:]] == [401, 401, 403]
    assert HOOK_TOKEN not in "".join(seen) and kfp.token not in "".join(seen) and METRICS_TOKEN not in "".join(seen)


def test_kfloop_serve_refuses_to_start_without_auth(monkeypatch, capsys, isolated_env):
    from pipelines.cli.commands import main

    monkeypatch.delenv("KFLOOP_WEBHOOK_TOKEN", raising=False)
    monkeypatch.delenv("KFLOOP_WEBHOOK_HMAC_SECRET", raising=False)
    assert main(["serve", "--port", "0"]) == EXIT_SETTINGS
    assert "KFLOOP_WEBHOOK_TOKEN" in capsys.readouterr().err


def test_kserve_logger_cloudevents_posted_to_inference_logs_are_stored_as_its_blobs(kfp, clock, tmp_path):
    """The logger's binary-mode CloudEvents (kserve pkg/logger/worker.go 122-152), authenticated like /alerts,
    stored through the writer of serve-model --log-dir: the reader reads them back as served rows."""
    hook = Hook(kfp, clock, inference_logs=InferenceLogWriter(tmp_path / "logs"))
    try:
        at = datetime.now(timezone.utc) - timedelta(minutes=1)
        request = {"parameters": {"content_type": "pd"},
                   "inputs": [{"name": "age", "shape": [2], "datatype": "INT64", "data": [30, 41]}]}
        response = {"outputs": [{"name": "prediction", "shape": [2], "datatype": "INT64", "data": [1, 0]}]}
        common = dict(id="req-1", time=at, inference_service="churn", namespace="ml", component="predictor",
                      endpoint="default", annotations={MODEL_VERSION_ANNOTATION: "7"})
        for kind, body in ((RESPONSE_TYPE, response), (REQUEST_TYPE, request)):
            record = LogRecord(type=kind, body=json.dumps(body).encode(), **common)
            headers, data = to_binary(record.cloudevent("http://churn-predictor.ml/"))
            status, answer = hook.request(data, path="/inference-logs", headers=headers)
            assert (status, answer) == (200, {"id": "req-1", "kind": KINDS[kind]})
        assert sorted(p.name for p in (tmp_path / "logs").rglob("*.json")) == ["req-1-request.json",
                                                                              "req-1-response.json"]
        served = read_inference_logs(tmp_path / "logs", since=timedelta(hours=1))
        assert list(served.rows["prediction"]) == [1, 0] and set(served.rows["model_version"]) == {"7"}

        status, answer = hook.request(data, path="/inference-logs", headers={**headers, "Authorization": "Bearer x"})
        assert status == 401
        status, answer = hook.request(b"{}", path="/inference-logs")
        assert status == 400 and "POST /inference-logs: headers: not a binary-mode CloudEvent" in answer["error"]
        assert len(list((tmp_path / "logs").rglob("*.json"))) == 2, "nothing stored for a refused event"
    finally:
        hook.close()
