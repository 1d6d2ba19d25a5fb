"""The retrain trigger under faults (issue 41): hostile input, an MLflow write that fails after the run started,
and a KFP API that never answers; each starts at most one run and holds up no other model."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from urllib3.exceptions import HTTPError

from components import kfp_client
from monitoring.trigger import RunNotRecorded, TriggerPolicy, maybe_trigger
from monitoring.trigger_registry import RegistryTriggerStore

POLICY = TriggerPolicy(cooldown_seconds=3600, window_seconds=86400)
T0 = 86400 * 20_000 + 600.0


def test_a_30000_character_data_md5_starts_no_run(isolated_env):
    store = RegistryTriggerStore("churn")
    started = []
    for attempt in range(3):
        with pytest.raises(ValueError, match="use the dataset's content hash, lowercase hex of at most 64"):
            maybe_trigger(store, model="churn", data_hash="a" * 30_000, now=T0 + attempt, policy=POLICY,
                          start=lambda: started.append(1) or "run")
    assert started == []


def test_an_mlflow_write_failing_after_the_start_lets_no_second_run_start(isolated_env):
    store = RegistryTriggerStore("churn")
    started = []

    def start() -> str:  # an id MLflow refuses to store (its tag values hold at most 100,000 characters)
        started.append("r" * 120_000 if not started else "run-2")
        return started[-1]

    with pytest.raises(RunNotRecorded, match="was started, but recording its id failed \\(MlflowException"):
        maybe_trigger(store, model="churn", data_hash="0a", now=T0, policy=POLICY, start=start)
    later = [maybe_trigger(store, model="churn", data_hash=data, now=T0 + 60, policy=POLICY, start=start)
             for data in ("0a", "0b")]

    assert len(started) == 1
    assert [d.outcome for d in later] == ["duplicate", "cooldown"]
    assert RegistryTriggerStore("churn").load()["models"]["churn"]["fired"][0]["pending"] is True


@pytest.fixture
def silent_kfp():
    """A KFP API that answers its health check (``kfp.Client()`` asks it) and nothing else: every other request is
    held without an answer until the test ends."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if not self.path.startswith("/apis/v2beta1/healthz"):
                release.wait(120)
                return
            body = json.dumps({"multi_user": False}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    release.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=30)


def test_a_kfp_api_that_never_answers_fails_within_its_deadline_and_blocks_no_other_model(isolated_env, silent_kfp):
    client = kfp_client.connect(silent_kfp, timeout_seconds=3)
    stuck_store, other_store = RegistryTriggerStore("churn"), RegistryTriggerStore("fraud")
    in_start = threading.Event()

    def start_on_silent_kfp() -> str:
        in_start.set()
        return kfp_client.start_training(client, kfp_client.VersionRef(
            pipeline_name="training", pipeline_id="p1", pipeline_version_id="v1", version_name="abc"), {})

    with ThreadPoolExecutor(1) as pool:
        began = time.monotonic()
        stuck = pool.submit(maybe_trigger, stuck_store, model="churn", data_hash="0a", now=T0, policy=POLICY,
                            start=start_on_silent_kfp)
        assert in_start.wait(60)
        other = maybe_trigger(other_store, model="fraud", data_hash="0b", now=T0, policy=POLICY, start=lambda: "run-f")
        assert not stuck.done(), "the other model's trigger finished while churn's KFP call was still waiting"
        with pytest.raises(HTTPError):
            stuck.result(timeout=60)
        took = time.monotonic() - began

    # 3 s per try, REQUEST_RETRIES retries with backoff: well under the minutes an unbounded call would hang
    assert took < 3 * (kfp_client.REQUEST_RETRIES + 1) + 10
    assert (other.fire, other.run_id) == (True, "run-f")
    assert stuck_store.load()["models"] == {}  # no run started: churn's pending record was taken back
    assert stuck_store.lock is RegistryTriggerStore("churn").lock is not other_store.lock
