"""Shared fixtures: demo data files and an isolated kfloop workdir (MLflow on SQLite inside it)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
os.environ.pop("CI", None)  # GitHub's runners set CI=true, under which `kfloop upload` refuses the default image;
# the tests of that refusal set it themselves

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def demo_files(tmp_path_factory) -> dict[str, Path]:
    """The demo's train / stable / drifted files, generated once per session (same bytes as the DVC stage)."""
    from data.generate import write_demo

    return write_demo(tmp_path_factory.mktemp("demo-data"))


@pytest.fixture
def isolated_env(tmp_path, monkeypatch):
    """A fresh workdir with its own MLflow database; the environment variables are restored afterwards."""
    from data.settings import activate, load_environment

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for key in ("KFLOOP_HOME", "KFLOOP_GIT_COMMIT"):
        monkeypatch.delenv(key, raising=False)
    env = load_environment(tmp_path / "workdir")
    for key, value in env.export().items():
        monkeypatch.setenv(key, value)
    activate(env)
    return env


@pytest.fixture
def kfp(isolated_env, monkeypatch, tmp_path):
    """The KFP API test server holding this commit's pipelines; ``kfp.Client`` reaches it with its ``token``."""
    from fakes.kfp_server import KfpApiServer

    from components import kfp_client
    from pipelines.kfp_server.runs import upload_pipelines

    token = "kfp-token-for-webhook-tests"
    monkeypatch.setenv(kfp_client.TOKEN_ENV, token)
    monkeypatch.setenv(kfp_client.SA_TOKEN_PATH_ENV, str(tmp_path / "none"))
    monkeypatch.setenv("KFLOOP_GIT_COMMIT", "a" * 40)
    monkeypatch.setenv("HOME", str(tmp_path))
    with KfpApiServer(token=token) as server:
        upload_pipelines(server.url)
        yield server


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real ``mlflow server`` process (SQLite, proxied artifacts) shared by the session; its URL in ``.url``."""
    from fakes.mlflow_server import MlflowServer

    server = MlflowServer(root=tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One real ``moto_server`` (S3 API) process on loopback, shared by the session; see tests/fakes/s3_server.py."""
    from fakes.s3_server import S3Server

    server = S3Server(root=tmp_path_factory.mktemp("s3-server")).start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch, request) -> str:
    """A fresh bucket on the session's S3 server, with the standard AWS environment pointing at it; its name."""
    import boto3

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    name = "kfloop-" + "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[:50].strip("-")
    boto3.client("s3").create_bucket(Bucket=name)
    return name


@pytest.fixture
def cluster(tmp_path):
    """A Kubernetes API test server in operator mode with one shared volume (tests/fakes/kubernetes_cluster.py)."""
    from fakes.k8s_server import K8sServer
    from fakes.kubernetes_cluster import CLAIM, Cluster

    shared = tmp_path / "shared"
    shared.mkdir()
    server = K8sServer(tmp_path / "k8s", volumes={CLAIM: shared})
    with server:
        yield Cluster(server, server.write_kubeconfig(tmp_path / "kubeconfig"), shared)
    assert server.live_pids() == [], "a pod process outlived the test server"
