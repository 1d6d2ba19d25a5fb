"""Every client kfloop uses has a deadline (issue 41 item 4): against a server that accepts connections and never
answers (a raw socket listener on loopback), the KFP client's construction, a Kubernetes API call, an S3 read and an
MLflow call each fail within their deadline with a clear error, instead of hanging."""
from __future__ import annotations

import socket
import threading
import time

import mlflow
import pytest
import urllib3
import yaml

from components import kfp_client
from data import storage
from data.settings import MLFLOW_HTTP_DEFAULTS
from monitoring.trigger_configmap import ConfigMapTriggerStore
from training.config import JobShape, TrainingConfig
from training.launch.kube_client import REQUEST_TIMEOUT, api_client
from training.launch.kubernetes import KubernetesSettings
from training.launch.manifests import render, training_job_spec


@pytest.fixture
def silent():
    """``http://127.0.0.1:PORT`` of a listener that accepts every connection and never answers; how many it took."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", held
    stop.set()
    thread.join(timeout=10)
    for conn in held:
        conn.close()
    listener.close()


def _within(seconds: float, call, error: type[BaseException], match: str) -> float:
    began = time.monotonic()
    with pytest.raises(error, match=match):
        call()
    took = time.monotonic() - began
    assert took < seconds, f"took {took:.1f} s"
    return took


def test_the_kfp_client_is_not_made_when_the_api_does_not_answer_its_health_check(silent):
    url, held = silent
    took = _within(2 + 5, lambda: kfp_client.connect(url, timeout_seconds=2), kfp_client.KfpUnreachable,
                   f"the KFP API at {url} did not answer its health check within 2 s")
    assert took >= 2 and len(held) == 1  # one try, no retry of an unanswered read


def test_a_kubernetes_call_gives_up_after_its_read_deadline_once(silent, tmp_path):
    url, held = silent
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "silent",
        "clusters": [{"name": "silent", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "u", "namespace": "ml"}}]}))
    store = ConfigMapTriggerStore("churn", api=api_client(str(kubeconfig)), namespace="ml")

    took = _within(2 * REQUEST_TIMEOUT[1], store.load, urllib3.exceptions.MaxRetryError, "Read timed out")
    assert took >= REQUEST_TIMEOUT[1] and len(held) == 1  # the read deadline, waited once: never retried


def test_an_s3_read_gives_up_after_its_deadline_and_attempts(silent, monkeypatch):
    url, held = silent
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEY0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(storage, "S3_READ_TIMEOUT", 1)  # kfloop's own setting, shorter

    attempts = storage.S3_ATTEMPTS * storage.S3_RETRIES
    _within(2 * attempts * 1 + 10, lambda: storage.resolve("s3://bucket/data/train.parquet"), storage.StorageError,
            f"s3://bucket/data/train.parquet: the endpoint {url} did not answer within 1 s \\(2 attempts\\)")
    assert attempts <= len(held) <= 2 * attempts  # s3fs's info() may ask twice (the object, then its prefix)


def test_an_mlflow_call_gives_up_after_its_deadline(silent, monkeypatch):
    url, _ = silent
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")  # as MLFLOW_HTTP_DEFAULTS sets it, shorter
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    _within(2 + 8, lambda: mlflow.MlflowClient(tracking_uri=url).search_experiments(), mlflow.MlflowException,
            "Read timed out")


def test_training_pods_get_the_mlflow_bounds_the_steps_have(tmp_path):
    settings = KubernetesSettings.from_dict({"image": "kfloop:test", "cpu": "1", "memory": "4Gi"})
    body = render(training_job_spec(TrainingConfig(), JobShape(nnodes=1, nproc_per_node=1), settings.cluster,
                                    name="bounded"), settings.cluster)
    (container,) = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {k: env.get(k) for k in MLFLOW_HTTP_DEFAULTS} == MLFLOW_HTTP_DEFAULTS
