"""``kfloop serve`` on one machine (issue 28 item 8): without a KFP host outside a cluster it says so at start-up
and an accepted Alertmanager alert runs the training pipeline under kfp.local, through the same trigger decision
(dedupe, cooldown, one run in flight) and state as the cluster path. Real HTTP to a real ``kfloop serve`` process."""
from __future__ import annotations

import http.client
import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

HOOK_TOKEN = "serve-local-token-8d2f"
MODEL = "churn-local"


class Serve:
    """A ``kfloop serve`` process and its JSON log lines."""

    def __init__(self, *argv: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "pipelines", *argv], stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True, env=dict(os.environ),
                                     start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.events: list[dict] = []
        self.reader = threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stderr],
                                       daemon=True)
        self.reader.start()

    def event(self, name: str, timeout: float) -> dict:
        """The next log event called ``name`` (earlier ones are kept in ``events``)."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None or not self.lines.empty(), f"kfloop serve exited: {self.events}"
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {name!r} event within {timeout} s: {self.events}")
            if line.startswith("{"):
                self.events.append(json.loads(line))
                if self.events[-1]["event"] == name:
                    return self.events[-1]

    def post(self, port: int, payload: dict) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/alerts", body=json.dumps(payload), headers={"Authorization": f"Bearer {HOOK_TOKEN}"})
        response = conn.getresponse()
        body = json.loads(response.read())
        conn.close()
        assert response.status == 200, body
        (decision,) = body["decisions"]
        return decision

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)
        self.reader.join(timeout=60)


def alertmanager(fingerprint: str) -> dict:
    """An Alertmanager webhook payload (version 4) as deploy/prometheus's rule sends it."""
    return {"version": "4", "status": "firing", "receiver": "kfloop-retrain", "groupKey": "{}:{alertname=\"x\"}",
            "alerts": [{"status": "firing", "fingerprint": fingerprint,
                        "labels": {"alertname": "KfloopDriftDetected", "model": MODEL},
                        "annotations": {"summary": "drift on the latest batch"}}]}


def test_serve_without_a_kfp_host_trains_locally_once_per_alert(isolated_env, demo_files, monkeypatch):
    import mlflow

    monkeypatch.setenv("KFLOOP_WEBHOOK_TOKEN", HOOK_TOKEN)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # an alert only retrains a model registered in MLflow, on data under trigger.allowed_data_prefixes (no champion
    # yet, so no champion's data folder to default to)
    mlflow.MlflowClient().create_registered_model(MODEL)
    serve = Serve("--workdir", str(isolated_env.workdir), "serve", "--port", "0", "--bind", "127.0.0.1",
                  "--set", f"dataset_uri={demo_files['train.parquet']}", "--set", "target=churned",
                  "--set", "training.epochs=2", "--set", "training.nproc_per_node=1",
                  "--set", "trigger.cooldown_seconds=0",
                  "--set", f"trigger.allowed_data_prefixes=[{demo_files['train.parquet'].parent}]")
    try:
        listening = serve.event("listening", timeout=180)
        assert listening["mode"].startswith("local: accepted alerts run the training pipeline under kfp.local")
        assert "(no --host and not in a cluster)" in listening["mode"]
        port = listening["port"]

        first = serve.post(port, alertmanager("f1"))
        busy = serve.post(port, alertmanager("f2"))  # new data, but the first run is still going
        done = serve.event("run_finished", timeout=900)
        repeat = serve.post(port, alertmanager("f1"))  # the same alert again: deduplicated
    finally:
        serve.stop()

    assert first["fire"] is True and first["run_id"].startswith("local-")
    assert busy["fire"] is False and busy["reason"].startswith("in flight: ") and first["run_id"] in busy["reason"]
    assert done["run_id"] == first["run_id"] and done["exit_code"] == 0, open(done["log"]).read()[-3000:]
    summary = json.loads(open(done["summary"]).read())
    assert summary["model_name"] == MODEL and summary["model_version"] == "1" and summary["promoted"] is True
    assert repeat["fire"] is False and repeat["reason"].startswith("duplicate: ")
    (version,) = mlflow.MlflowClient().search_model_versions(f"name='{MODEL}'")
    assert str(version.version) == "1"
    state = json.loads((isolated_env.workdir / "trigger" / f"{MODEL}.json").read_text())  # the local trigger state
    assert first["run_id"] in json.dumps(state)
    assert HOOK_TOKEN not in json.dumps(serve.events)


def test_local_and_a_kfp_host_exclude_each_other(isolated_env, monkeypatch, capsys):
    from data.errors import EXIT_USAGE
    from pipelines.cli.commands import main

    monkeypatch.setenv("KFLOOP_WEBHOOK_TOKEN", HOOK_TOKEN)
    assert main(["serve", "--local", "--host", "http://127.0.0.1:1", "--port", "0"]) == EXIT_USAGE
    assert "drop them with --local" in capsys.readouterr().err
