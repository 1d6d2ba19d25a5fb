"""``/metrics`` of ``kfloop serve``: the records (the drift and quality checks' runs, the champion alias, the
trigger's decision counts) in the Prometheus text format, read from MLflow on each scrape and parsed here with
prometheus_client's own parser; auth by the metrics token (never the webhook's) unless opened for in-cluster
scraping."""
from __future__ import annotations

import http.client
import io
import json
import threading
import time

import mlflow
import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from quality_runs import record_quality_check

from monitoring import records
from monitoring.metrics import RecordsCollector, registered_models
from monitoring.quality import Baseline, check_quality
from monitoring.quality_policy import QualityPolicy
from monitoring.steps.checks import QualityStepResult, drift_step
from monitoring.trigger import RunInFlight, TriggerPolicy, maybe_trigger
from monitoring.trigger_registry import RegistryTriggerStore
from monitoring.webhook import AlertScope, AlertWebhook, WebhookAuth
from pipelines.operations.status import format_status, status
from training.registry.versions import CHAMPION_ALIAS, ensure_registered_model
from training.registry.experiments import ensure_experiment

from conftest import REPO

MODEL = "churn-metrics"
QUIET = "quiet-model"
TOKEN = "metrics-token-41c7"
POLICY = TriggerPolicy(cooldown_seconds=3600, window_seconds=86400)
T0 = 86400 * 20_000 + 600.0


def webhook(**auth) -> AlertWebhook:
    return AlertWebhook(auth=WebhookAuth(**{"token": "hook-token", "metrics_token": TOKEN, **auth}),
                        scope=AlertScope(), policy=POLICY,
                        start=lambda alert: pytest.fail(f"no run may start here ({alert})"),
                        store_for=RegistryTriggerStore, log=io.StringIO(),
                        metrics=RecordsCollector(models=registered_models, store_for=RegistryTriggerStore))


def scrape(hook: AlertWebhook, headers: dict, method: str = "GET") -> tuple[int, str, str]:
    server = hook.server(0, "127.0.0.1")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=60)
        conn.request(method, "/metrics", headers=headers)
        answer = conn.getresponse()
        body = answer.read().decode()
        conn.close()
        return answer.status, answer.getheader("Content-Type"), body
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def drift_check(demo_files, batch: str):
    return drift_step(current_uri=str(demo_files[batch]), reference_uri=str(demo_files["train.parquet"]),
                      schema_uri=str(REPO / "data" / "schema.yaml"), model_name=MODEL,
                      policy={"include_predictions": False}, report_out="")


@pytest.fixture
def recorded(isolated_env, demo_files):
    """Two registered models: MODEL with a champion, a drifted check, a degraded quality check and one trigger
    decision of each outcome; QUIET with nothing recorded."""
    client = mlflow.MlflowClient()
    for name in (MODEL, QUIET):
        ensure_registered_model(name)
    run = client.create_run(ensure_experiment("candidates", isolated_env))
    version = client.create_model_version(MODEL, source=f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)
    client.set_registered_model_alias(MODEL, CHAMPION_ALIAS, version.version)
    before = int(time.time())
    drifted = drift_check(demo_files, "batch_drifted.parquet")
    record_quality_check(MODEL, degraded=True, value=0.61, baseline=0.74)
    after = time.time()
    store = RegistryTriggerStore(MODEL)

    def busy() -> str:
        raise RunInFlight("training run r-7 is RUNNING")

    outcomes = [maybe_trigger(store, model=MODEL, data_hash=data, now=now, policy=POLICY, start=start).outcome
                for data, now, start in (("0a", T0, lambda: "run-1"), ("0a", T0 + 10, lambda: "run-2"),
                                         ("0b", T0 + 20, lambda: "run-3"), ("0c", T0 + 4000, busy))]
    assert outcomes == ["fired", "duplicate", "cooldown", "in_flight"]
    return {"drifted": drifted, "before": before, "after": after}


def test_metrics_hold_the_last_checks_the_champion_and_the_trigger_counts(recorded, demo_files):
    status, content_type, text = scrape(webhook(), {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and content_type.startswith("text/plain; version=")
    got = samples(text)
    m = frozenset({("model", MODEL)})
    accuracy = frozenset({("model", MODEL), ("metric", "accuracy")})
    assert recorded["drifted"].drift.drifted
    assert got[("kfloop_drift_share_drifted_columns", m)] == pytest.approx(
        recorded["drifted"].drift.share_drifted_columns)
    assert got[("kfloop_drift_detected", m)] == 1.0
    assert got[("kfloop_quality_value", accuracy)] == 0.61 and got[("kfloop_quality_baseline", accuracy)] == 0.74
    assert got[("kfloop_quality_degraded", m)] == 1.0
    for check in ("drift", "quality"):
        assert recorded["before"] <= got[(f"kfloop_{check}_check_timestamp_seconds", m)] <= recorded["after"]
    assert got[("kfloop_champion_version", m)] == 1.0
    assert got[("kfloop_trigger_fired_total", m)] == 1.0
    for reason in ("duplicate", "cooldown", "in_flight"):
        assert got[("kfloop_trigger_suppressed_total", m | {("reason", reason)})] == 1.0, reason
    quiet = {name for name, labels in got if ("model", QUIET) in labels}
    assert quiet == {"kfloop_trigger_fired_total", "kfloop_trigger_suppressed_total"}, "nothing else recorded"
    assert got[("kfloop_trigger_fired_total", frozenset({("model", QUIET)}))] == 0.0

    drift_check(demo_files, "batch_stable.parquet")  # the last check is what the series show
    again = samples(scrape(webhook(), {"Authorization": f"Bearer {TOKEN}"})[2])
    assert again[("kfloop_drift_detected", m)] == 0.0
    assert again[("kfloop_drift_check_timestamp_seconds", m)] >= got[("kfloop_drift_check_timestamp_seconds", m)]


@pytest.mark.parametrize("auth, headers, status, words", [
    ({}, {}, 401, "bearer token"),
    ({}, {"Authorization": "Bearer wrong"}, 401, "bearer token"),
    ({"metrics_token": ""}, {"Authorization": f"Bearer {TOKEN}"}, 401, "--open-metrics"),
    ({}, {"Authorization": "Bearer hook-token"}, 401, "only posts alerts"),
    ({"open_metrics": True}, {}, 200, "kfloop_trigger_fired_total"),
])
def test_metrics_take_their_own_token_unless_opened(isolated_env, auth, headers, status, words):
    ensure_registered_model(QUIET)
    code, _, body = scrape(webhook(**auth), headers)
    assert code == status and words in body


def test_metrics_answer_get_only(isolated_env):
    status, _, body = scrape(webhook(), {"Authorization": f"Bearer {TOKEN}"}, method="POST")
    assert status == 405 and "GET /metrics" in json.loads(body)["error"]


def test_an_insufficient_labels_check_is_neither_degraded_nor_fine_in_metrics_and_status(isolated_env):
    """Issue 29 item 1: 50 labelled rows with one positive, recorded by the real recorder, read as
    ``insufficient_labels`` by ``/metrics`` and ``kfloop status`` alike."""
    ensure_registered_model(MODEL)
    y = np.zeros(50, dtype=int)
    y[0] = 1
    proba = np.tile([0.7, 0.3], (50, 1))
    result = check_quality(y_true=y, proba=proba, classes=[0, 1], threshold=None, rows=pd.DataFrame(index=range(50)),
                           baseline=Baseline(metric="roc_auc", value=0.9),
                           policy=QualityPolicy(slice_columns=[], bootstrap_samples=100))
    assert result.verdict == "insufficient_labels"
    records.record_quality_check(MODEL, QualityStepResult(quality=result, champion_version="1", data_md5="md5-q",
                                                          labelled_uri="batch.parquet", labels_uri="",
                                                          unlabelled_rows=0), report_path=None)
    got = samples(scrape(webhook(), {"Authorization": f"Bearer {TOKEN}"})[2])
    m = frozenset({("model", MODEL)})
    assert got[("kfloop_quality_insufficient_labels", m)] == 1.0 and got[("kfloop_quality_degraded", m)] == 0.0
    text = format_status(status(MODEL, env=isolated_env, trigger_policy={}))
    assert "last quality check:" in text and "INSUFFICIENT LABELS" in text and "had 1 of class '1'" in text
