"""The alert loop with the real servers: Debian's ``prometheus`` scrapes ``kfloop serve``'s ``/metrics`` (with the
metrics read token, by ``deploy/prometheus``'s scrape job), the rules of ``deploy/prometheus`` fire after a drifted check, Debian's
``prometheus-alertmanager`` routes the alert by the ``deploy/prometheus`` route to ``kfloop serve``'s ``/alerts``,
and exactly one training run starts on the KFP API test server; the next alert inside the cooldown starts none.
Everything synchronises by polling the servers' HTTP APIs against a deadline."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from binaries import require_binary
from cluster.server_process import free_ports, start_server, stop_group
from polling import wait_for
from quality_runs import record_quality_check

from monitoring.steps.checks import drift_step
from training.registry.versions import ensure_registered_model

from conftest import REPO

DEPLOY = REPO / "deploy" / "prometheus"
RULES = DEPLOY / "kfloop-rules.yaml"
OPERATOR_RULE = DEPLOY / "kfloop-prometheusrule.yaml"
ROUTE = DEPLOY / "alertmanager.yaml"
SCRAPE = DEPLOY / "prometheus-scrape.yaml"
ALERTS = ("KfloopDriftDetected", "KfloopQualityDegraded")
"""The alerts that start retraining; KfloopDriftCheckStale goes to people."""
STALE = "KfloopDriftCheckStale"
MODEL = "churn-alerts"
HOOK_TOKEN = "alert-loop-token-3b9e"
METRICS_TOKEN = "alert-loop-metrics-token-7d21"


def test_the_rule_files_pass_promtool_and_say_the_same(tmp_path):
    promtool = require_binary("promtool", package="prometheus")
    operator_groups = tmp_path / "operator-groups.yaml"
    operator_groups.write_text(yaml.safe_dump(yaml.safe_load(OPERATOR_RULE.read_text())["spec"]))
    for path in (RULES, operator_groups):
        checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                                 timeout=120)
        assert checked.returncode == 0 and "SUCCESS: 3 rules found" in checked.stdout, checked.stdout + checked.stderr
    rules = yaml.safe_load(RULES.read_text())
    assert yaml.safe_load(operator_groups.read_text()) == rules
    assert [rule["alert"] for group in rules["groups"] for rule in group["rules"]] == [*ALERTS, STALE]


def test_the_stale_check_alert_fires_two_days_after_the_last_drift_check(tmp_path):
    promtool = require_binary("promtool", package="prometheus")
    day = 86400
    # promtool's clock starts at 0; a scrape a minute for three days: one model checked daily, one whose checks stop
    (tmp_path / "stale.yaml").write_text(yaml.safe_dump({
        "rule_files": [str(RULES)], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [
            {"series": 'kfloop_drift_check_timestamp_seconds{model="daily"}',
             "values": " ".join(f"{day * d}x1439" for d in range(3))},
            {"series": 'kfloop_drift_check_timestamp_seconds{model="stopped"}', "values": "0x4319"}],
            "alert_rule_test": [
                {"eval_time": "47h", "alertname": STALE, "exp_alerts": []},
                {"eval_time": "48h10m", "alertname": STALE, "exp_alerts": []},  # stale, but not yet for 15m
                {"eval_time": "48h20m", "alertname": STALE, "exp_alerts": [{
                    "exp_labels": {"model": "stopped", "severity": "warning"},
                    "exp_annotations": {"summary": "stopped: no drift check for 2d 0h 20m 0s: is the drift schedule "
                                                   "running? (kfloop schedule drift)"}}]}]}]}))
    checked = subprocess.run([promtool, "test", "rules", str(tmp_path / "stale.yaml")], capture_output=True,
                             text=True, timeout=120)
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


def test_the_scrape_job_passes_promtool_and_reads_the_metrics_token_from_a_secret(tmp_path):
    promtool = require_binary("promtool", package="prometheus")
    (job,) = yaml.safe_load(SCRAPE.read_text())["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and set(job["authorization"]) == {"credentials_file"}
    assert "kfloop-metrics" in job["authorization"]["credentials_file"], "the metrics Secret, never the webhook's"
    token = tmp_path / "token"
    token.write_text("t")
    job["authorization"]["credentials_file"] = str(token)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


def test_the_route_sends_kfloops_alerts_to_the_webhook_and_nothing_else():
    amtool = require_binary("amtool", package="prometheus-alertmanager")
    checked = subprocess.run([amtool, "check-config", str(ROUTE)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr
    receivers = {alert: subprocess.run([amtool, "config", "routes", "test", f"--config.file={ROUTE}",
                                        f"alertname={alert}", f"model={MODEL}"], capture_output=True, text=True,
                                       timeout=120).stdout.strip() for alert in (*ALERTS, STALE, "NodeDown")}
    assert receivers == {ALERTS[0]: "kfloop-retrain", ALERTS[1]: "kfloop-retrain", STALE: "default",
                         "NodeDown": "default"}
    (hook,) = next(r for r in yaml.safe_load(ROUTE.read_text())["receivers"] if r["name"] == "kfloop-retrain"
                   )["webhook_configs"]
    assert urllib.parse.urlsplit(hook["url"]).path == "/alerts" and "credentials_file" in hook["http_config"][
        "authorization"], "the bearer token comes from a mounted Secret, never inline"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def query(port: int, expr: str) -> float | None:
    """The value of ``expr`` in Prometheus (one series), or None while it has none."""
    result = get_json(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    series = result["data"]["result"]
    return float(series[0]["value"][1]) if series else None


def alertmanager_config(path: Path, *, hook_port: int, token_file: Path) -> Path:
    """``deploy/prometheus/alertmanager.yaml`` pointed at this test's ``kfloop serve``, with no waiting."""
    config = yaml.safe_load(ROUTE.read_text())
    (route,) = config["route"]["routes"]
    route.update(group_wait="0s", group_interval="1s", repeat_interval="1h")
    (hook,) = next(r for r in config["receivers"] if r["name"] == "kfloop-retrain")["webhook_configs"]
    hook["url"] = f"http://127.0.0.1:{hook_port}/alerts"
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    path.write_text(yaml.safe_dump(config))
    return path


def prometheus_config(path: Path, *, hook_port: int, alertmanager_port: int, token_file: Path) -> Path:
    """``deploy/prometheus/prometheus-scrape.yaml``'s job pointed at this test's ``kfloop serve`` with the metrics
    token, scraping every second; the deploy/ rules evaluated every second."""
    (job,) = yaml.safe_load(SCRAPE.read_text())["scrape_configs"]
    job.update(scrape_interval="1s", scrape_timeout="1s", static_configs=[{"targets": [f"127.0.0.1:{hook_port}"]}])
    job["authorization"]["credentials_file"] = str(token_file)
    path.write_text(yaml.safe_dump({
        "global": {"evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
        "scrape_configs": [job]}))
    return path


def test_a_drifted_check_starts_one_training_run_through_prometheus_and_alertmanager(kfp, demo_files, tmp_path):
    prometheus = require_binary("prometheus", package="prometheus")
    alertmanager = require_binary("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")
    ensure_registered_model(MODEL)
    token_file, metrics_token_file = tmp_path / "token", tmp_path / "metrics-token"
    for path, token in ((token_file, HOOK_TOKEN), (metrics_token_file, METRICS_TOKEN)):
        path.write_text(token)
        path.chmod(0o600)
    hook_port, alertmanager_port, prometheus_port = free_ports(3)
    env = {**os.environ, "KFLOOP_WEBHOOK_TOKEN": HOOK_TOKEN, "KFLOOP_METRICS_TOKEN": METRICS_TOKEN}
    processes = []
    try:
        processes.append(start_server(
            [sys.executable, "-m", "pipelines", "serve", "--port", str(hook_port), "--bind", "127.0.0.1",
             "--kfp-host", kfp.url, "--set", "dataset_uri=s3://bucket/current.parquet",
             "--set", "trigger.allowed_data_prefixes=[s3://bucket/]"],
            health_url=f"http://127.0.0.1:{hook_port}/healthz", log_path=tmp_path / "serve.log", env=env,
            timeout_s=240))
        routes = alertmanager_config(tmp_path / "am.yaml", hook_port=hook_port, token_file=token_file)
        processes.append(start_server(
            [alertmanager, f"--config.file={routes}",
             f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{alertmanager_port}",
             "--cluster.listen-address="],
            health_url=f"http://127.0.0.1:{alertmanager_port}/-/ready", log_path=tmp_path / "am.log", env=env,
            timeout_s=120))
        config = prometheus_config(tmp_path / "prometheus.yaml", hook_port=hook_port,
                                   alertmanager_port=alertmanager_port, token_file=metrics_token_file)
        processes.append(start_server(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"],
            health_url=f"http://127.0.0.1:{prometheus_port}/-/ready", log_path=tmp_path / "prometheus.log",
            env=env, timeout_s=120))
        wait_for("Prometheus scraping kfloop serve's /metrics with the metrics token",
                 lambda: query(prometheus_port, f'kfloop_trigger_fired_total{{model="{MODEL}"}}') == 0,
                 timeout=180, interval=0.5)
        assert not kfp.store.runs and query(prometheus_port, "ALERTS") is None

        drift_step(current_uri=str(demo_files["batch_drifted.parquet"]),
                   reference_uri=str(demo_files["train.parquet"]), schema_uri=str(REPO / "data" / "schema.yaml"),
                   model_name=MODEL, policy={}, report_out="")
        wait_for("the training run the drift alert starts", lambda: kfp.store.runs, timeout=180, interval=0.5)
        wait_for("the fire counted in /metrics, as Prometheus sees it",
                 lambda: query(prometheus_port, f'kfloop_trigger_fired_total{{model="{MODEL}"}}') == 1,
                 timeout=180, interval=0.5)
        firing = get_json(f"http://127.0.0.1:{prometheus_port}/api/v1/alerts")["data"]["alerts"]
        assert [(a["labels"]["alertname"], a["labels"]["model"], a["state"]) for a in firing] == [
            ("KfloopDriftDetected", MODEL, "firing")]

        record_quality_check(MODEL, degraded=True, value=0.55, baseline=0.74)  # a second alert, in the cooldown
        wait_for("the quality alert suppressed by the cooldown, as Prometheus sees it",
                 lambda: query(prometheus_port,
                               f'kfloop_trigger_suppressed_total{{model="{MODEL}",reason="cooldown"}}') == 1,
                 timeout=180, interval=0.5)
    finally:
        for process in reversed(processes):
            stop_group(process)
    (run,) = kfp.store.runs.values()
    assert run["runtime_config"]["parameters"] == {"dataset_uri": "s3://bucket/current.parquet", "model_name": MODEL}
    log = (tmp_path / "serve.log").read_text()
    decisions = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"trigger"' in line]
    assert [(d["fire"], d["run_id"], d["reason"].split(":")[0]) for d in decisions][1:] == [(False, None, "cooldown")]
    assert decisions[0]["fire"] and decisions[0]["run_id"] == run["run_id"]
    assert HOOK_TOKEN not in log and METRICS_TOKEN not in log
