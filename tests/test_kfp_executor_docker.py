"""The KFP test server's Docker engine (tests/cluster/kfp_executor.py): each task a container of the image the IR
names, as the image's user, read-only root, the token at its projected path. Needs a Docker daemon
(``DOCKER_HOST``) and an image holding python3 and kfp whose user is not root, named by ``KFLOOP_E2E_IMAGE``
(``make e2e``'s kfloop image is one); skipped otherwise."""
# kfp reads the components' annotations at definition time: no `from __future__ import annotations` here.
import docker
import kfp
from e2e_image import IMAGE, needs_image
from cluster.kfp_executor import ACCESS_LABEL, DockerEngine, KfpExecutor
from cluster.kfp_multiuser import PROFILE_LABELS
from cluster.kfp_server import KfpApiServer
from kfp import compiler, dsl
from kfp import kubernetes as kfp_k8s
from polling import wait_for
from test_kfp_executor import POD_DEFAULT

from components import kfp_client

TOKEN = "kfp-docker-token-0c4a"
pytestmark = needs_image


@dsl.component(base_image=IMAGE or "unset", install_kfp_package=False)
def who(out: dsl.Output[dsl.Artifact]) -> str:
    import os

    try:
        open("/probe", "w").close()
        root = "writable"
    except OSError:
        root = "read-only"
    token = open("/var/run/secrets/kubeflow/pipelines/token").read()
    namespace = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
    with open(out.path, "w") as f:
        f.write(f"{os.getuid()} {root} {os.environ['KFP_POD_NAME']} {token} {namespace}")
    return root


@dsl.component(base_image=IMAGE or "unset", install_kfp_package=False)
def read(data: dsl.Input[dsl.Artifact], root: str) -> str:
    return open(data.path).read() + " " + root


@dsl.pipeline(name="docker-pipeline")
def docker_pipeline():
    first = who().set_caching_options(False)
    kfp_k8s.add_pod_label(first, ACCESS_LABEL, "true")  # the PodDefault projects the token into this pod alone
    read(data=first.outputs["out"], root=first.outputs["Output"]).set_caching_options(False)


def test_each_task_is_a_container_of_its_image_as_its_user_with_a_read_only_root(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o777)  # the one folder the image's user shares with the host
    package = tmp_path / "p.yaml"
    compiler.Compiler().compile(docker_pipeline, str(package))
    with KfpApiServer(token=TOKEN) as server, KfpExecutor(server, DockerEngine(pipeline_root=root),
                                                          pipeline_root=root, namespace="kfloop",
                                                          namespace_labels=PROFILE_LABELS,
                                                          pod_defaults=[POD_DEFAULT], token=TOKEN):
        client = kfp.Client(host=server.url, existing_token=TOKEN)
        run_id = client.create_run_from_pipeline_package(str(package), arguments={}).run_id
        run = kfp_client.wait(client, run_id, poll_seconds=0.05, timeout_seconds=300)

    assert run.state == "SUCCEEDED", run.error
    pods = {t.display_name: t.pod_name for t in run.run_details.task_details}
    containers = {c.labels["kfloop.run_pod"]: c for c in docker.from_env().containers.list(
        all=True, filters={"label": "kfloop.run_pod"}) if c.labels["kfloop.run_pod"] in pods.values()}
    assert set(containers) == set(pods.values())
    for container in containers.values():
        assert container.attrs["State"]["ExitCode"] == 0 and container.attrs["Config"]["Image"] == IMAGE
        assert container.attrs["HostConfig"]["ReadonlyRootfs"] is True
        container.remove()
    (produced,) = [p for p in root.rglob("out") if p.is_file()]
    uid, ro, pod, token, namespace = produced.read_text().split()
    assert uid != "0" and ro == "read-only" and pod == pods["who"] and token == TOKEN and namespace == "kfloop"


@dsl.component(base_image=IMAGE or "unset", install_kfp_package=False)
def hang():
    import time

    while True:
        time.sleep(0.05)


@dsl.pipeline(name="hanging")
def hanging_pipeline():
    hang().set_caching_options(False)


def test_terminating_a_run_stops_its_step_with_sigterm(tmp_path, monkeypatch):
    """The step's command gets SIGTERM (its ``sh``, PID 1, would ignore it), as Argo's emissary forwards it: the
    container exits 143 (128 + SIGTERM) within the grace period, not 137 (SIGKILL)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o777)
    package = tmp_path / "p.yaml"
    compiler.Compiler().compile(hanging_pipeline, str(package))
    daemon = docker.from_env()
    with KfpApiServer() as server, KfpExecutor(server, DockerEngine(pipeline_root=root), pipeline_root=root):
        client = kfp.Client(host=server.url)
        run_id = client.create_run_from_pipeline_package(str(package), arguments={}).run_id
        (pod,) = wait_for("the task's pod", lambda: [t["pod_name"] for t in server.store.runs[run_id].get(
            "run_details", {}).get("task_details", []) if "pod_name" in t])
        wait_for("its container to run", lambda: daemon.containers.list(filters={"name": pod, "status": "running"}))
        client.terminate_run(run_id)
        run = kfp_client.wait(client, run_id, poll_seconds=0.05, timeout_seconds=120)

    container = daemon.containers.get(pod)
    assert run.state == "CANCELED" and container.status == "exited" and container.attrs["State"]["ExitCode"] == 143
    container.remove()
