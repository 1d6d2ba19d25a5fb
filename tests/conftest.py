"""Shared fixtures: demo data files and an isolated kfloop workdir (MLflow on SQLite inside it)."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Iterator, Mapping

import pytest

from polling import wait_for
from cluster.server_process import free_ports

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # as the tests' Ray heads (--disable-usage-stats); else Ray Data's driver
# starts a usage poller thread that logs a traceback every 10 s, and formatting one calls ast.parse, which races the
# tests' own ast.parse on Python 3.11 before 3.11.9 ("AST constructor recursion depth mismatch", CPython gh-106905)
os.environ.pop("CI", None)  # GitHub's runners set CI=true, under which `kfloop upload` refuses the default image;
# the tests of that refusal set it themselves

os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN"] = RAY_AUTH_TOKEN = secrets.token_hex(16)
"""The token of the Ray heads the tests start (:func:`ray_head`), set before anything imports Ray: Ray reads its
authentication settings when it is imported, so in-process drivers (Ray Data's drift engine) hold it too."""

REPO = Path(__file__).resolve().parents[1]

TIMINGS_ENV = "KFLOOP_TEST_TIMINGS"
"""A file to write the session's 30 slowest tests to (JSON; set by .ci/run for ci-timings.json)."""
_durations: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's time: setup, call and teardown (under xdist the controller sees every worker's reports)."""
    _durations[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the slowest tests where :data:`TIMINGS_ENV` says, once, from the controller (not from xdist workers)."""
    target = os.environ.get(TIMINGS_ENV)
    if not target or hasattr(session.config, "workerinput"):
        return
    slowest = sorted(_durations.items(), key=lambda item: item[1], reverse=True)[:30]
    Path(target).write_text(json.dumps([{"nodeid": node, "seconds": round(seconds, 2)} for node, seconds in slowest],
                                       indent=2) + "\n")


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
    from cluster.kfp_server import KfpApiServer

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
    from cluster.mlflow_server import MlflowServer

    server = MlflowServer(root=tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One real ``moto_server`` (S3 API) process on loopback, shared by the session; see tests/cluster/s3_server.py."""
    from cluster.s3_server import S3Server

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
def cluster(tmp_path, request, monkeypatch):
    """A Kubernetes API test server in operator mode with one shared volume (tests/cluster/kubernetes_cluster.py);
    parametrized indirectly with ``{"operator": False}``, a server that runs no job (a test plays the operator).
    This process is no pod of it: a job with no ``cluster.namespace`` goes in the kubeconfig's namespace."""
    from cluster.k8s_server import K8sServer
    from cluster.kubernetes_cluster import CLAIM, Cluster
    from training.launch.kube_client import NAMESPACE_FILE_ENV

    monkeypatch.setenv(NAMESPACE_FILE_ENV, str(tmp_path / "not-in-a-pod"))

    shared = tmp_path / "shared"
    shared.mkdir()
    server = K8sServer(tmp_path / "k8s", volumes={CLAIM: shared}, **getattr(request, "param", {}))
    with server:
        yield Cluster(server, server.write_kubeconfig(tmp_path / "kubeconfig"), shared)
    assert server.live_pids() == [], "a pod process outlived the test server"


@pytest.fixture
def step_cluster(tmp_path, monkeypatch):
    """The Kubernetes API a pipeline step's pod reaches (its kubeconfig in ``KUBECONFIG``, namespace ``ml``): where
    the drift run's trigger step keeps the trigger state."""
    from cluster.k8s_server import K8sServer
    from training.launch.kube_client import NAMESPACE_FILE_ENV

    monkeypatch.setenv(NAMESPACE_FILE_ENV, str(tmp_path / "not-in-a-pod"))  # the kubeconfig's namespace, `ml`
    with K8sServer(tmp_path / "k8s", namespace="ml", operator=False) as server:
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        yield server


@pytest.fixture(scope="module")
def ray_head():
    """A real Ray head on loopback with 2 CPUs (two training workers) and token authentication (Ray's default), in
    its own process group, stopped with the module; this process (and so every driver it starts) holds the token
    (:data:`RAY_AUTH_TOKEN`). A head that exits or never answers fails the fixture with its own output and the
    tails of its session's logs. Its workers take ports from the OS: Ray's default worker range (10002-19999) overlaps
    :func:`free_ports`'s, and ``ray start`` refuses a head port inside it."""
    with _ray_head("ray", os.environ) as address:
        yield address


@pytest.fixture(scope="module")
def ray_head_with_s3(s3_server):
    """:func:`ray_head` whose node holds the S3 server's ``AWS_*`` credentials in its environment, as a KubeRay pod
    holds them from its Secret (a Ray job's runtime env carries none)."""
    with _ray_head("ray-s3", {**os.environ, **s3_server.env()}) as address:
        yield address


@contextlib.contextmanager
def _ray_head(name: str, env: Mapping[str, str]) -> Iterator[str]:
    """A Ray head (see :func:`ray_head`) whose processes get ``env``; its address. Its temp dir is a new short one
    (``/tmp/<name>-XXXXXXXX``), removed after: Ray's sockets live there, an AF_UNIX path holds at most 107 bytes, and
    pytest's temp paths under xdist (``.../pytest-N/popen-gwN/...``) leave too few for Ray's session names."""
    temp = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    (port, client_port), ray = free_ports(2), str(Path(sys.executable).with_name("ray"))
    log = temp / "head.log"
    with log.open("wb") as out:
        head = subprocess.Popen([ray, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
                                 f"--ray-client-server-port={client_port}", "--min-worker-port=0",
                                 "--max-worker-port=0", "--num-cpus=2",
                                 "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
                                start_new_session=True, stdout=out, stderr=subprocess.STDOUT, env=dict(env))
    address = f"127.0.0.1:{port}"

    def answers() -> bool:
        if head.poll() is not None:
            raise AssertionError(f"the Ray head exited with {head.returncode}:\n{_ray_logs(log, temp)}")
        return subprocess.run([ray, "status", f"--address={address}"], capture_output=True).returncode == 0

    try:
        wait_for("the Ray head", answers, timeout=180, interval=1.0)
    except AssertionError as error:
        _stop(head)
        logs = _ray_logs(log, temp)
        shutil.rmtree(temp, ignore_errors=True)
        raise AssertionError(f"{error}\n{logs}") from None
    try:
        yield address
    finally:
        _stop(head)
        shutil.rmtree(temp, ignore_errors=True)


def _stop(head: subprocess.Popen) -> None:
    """Kill ``head``'s process group (its GCS, raylet and workers), if any of it is left."""
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    head.wait()


def _ray_logs(log: Path, temp: Path, lines: int = 30) -> str:
    """The last ``lines`` of ``ray start``'s output and of each log of the head's session (GCS, raylet, agents)."""
    parts = [log, *sorted((temp / "session_latest" / "logs").glob("*"))]
    return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
                      for p in parts if p.is_file() and p.stat().st_size)
