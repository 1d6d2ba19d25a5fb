"""The Kubernetes test cluster's Docker kubelet (tests/fakes/docker_kubelet.py): a 2-node PyTorchJob of kfloop's
training, its pods containers of the image, as UID 1000 with a read-only root, training with DDP through the shared
claim. Needs a Docker daemon (``DOCKER_HOST``) holding the kfloop image named by ``KFLOOP_E2E_IMAGE`` (``make e2e``
builds it and runs this file); skipped otherwise."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import docker
import pytest
from fakes.docker_kubelet import POD_LABEL, DockerRuntime
from fakes.k8s_server import K8sServer
from fakes.kubernetes_cluster import CLAIM, Cluster

from training.launch.manifests import job_name_for

IMAGE = os.environ.get("KFLOOP_E2E_IMAGE", "")
SCHEMA = Path(__file__).resolve().parents[1] / "data" / "schema.yaml"


def _docker_image() -> str:
    if not IMAGE:
        return "KFLOOP_E2E_IMAGE names no image"
    try:
        docker.from_env().images.get(IMAGE)
    except docker.errors.DockerException as err:
        return f"no Docker daemon or no image {IMAGE}: {err}"
    return ""


pytestmark = pytest.mark.skipif(bool(_docker_image()), reason=_docker_image() or "ok")

INIT_TEMPLATE = f"""
- name: init-pytorch
  image: {IMAGE}
  command: ['sh', '-c', 'err=1;for i in $(seq {{{{.MaxTries}}}}); do if getent hosts {{{{.MasterAddr}}}}; then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err']"""
"""The operator's ``--pytorch-init-container-template-file`` for this cluster: its own image (nothing is pulled)
and ``getent`` (the image has no nslookup)."""


@pytest.fixture
def docker_cluster(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # the claim's folder, written by the pods' UID 1000
    runtime = DockerRuntime()
    server = K8sServer(tmp_path / "k8s", volumes={CLAIM: shared}, runtime=runtime,
                       pytorch_init_container_template=INIT_TEMPLATE)
    with server:
        yield Cluster(server, server.write_kubeconfig(tmp_path / "kubeconfig"), shared)
    assert server.live_pids() == [], "a pod container outlived the test server"


LAUNCH = """
import sys
from training.config import JobShape, TrainingConfig
from training.launch.kubernetes import KubernetesSettings, train_kubernetes
settings = KubernetesSettings.from_dict(json.loads(sys.argv[1]))
config = TrainingConfig.from_dict({"epochs": 2, "batch_size": 512, "model": {"params": {"hidden": [16]}}})
work = sys.argv[2]
result = train_kubernetes(f"{work}/train.parquet", f"{work}/schema.yaml", model_dir=f"{work}/model", config=config,
                          shape=JobShape(nnodes=2, nproc_per_node=1, backend="kubernetes"), cluster=settings.cluster,
                          policy=settings.launcher, pipeline_run_id="run-docker", log_dir=f"{work}/logs")
print("world_size", result.world_size)
"""
"""The training step's launch, run in a container of the image as UID 1000 (as a KFP step pod is): the files it
stages on the claim are then its pods' user's, as in a cluster."""


def test_a_pytorchjob_trains_with_ddp_as_containers_of_the_image(docker_cluster, demo_files, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    shutil.copy(demo_files["train.parquet"], work / "train.parquet")
    shutil.copy(SCHEMA, work / "schema.yaml")
    for name in ("train.parquet", "schema.yaml"):
        (work / name).chmod(0o644)
    docker_cluster.kubeconfig.rename(work / "kubeconfig")
    (work / "kubeconfig").chmod(0o644)
    settings = {**docker_cluster.settings(), "image": IMAGE}
    settings["launcher"]["kubeconfig"] = str(work / "kubeconfig")
    daemon = docker.from_env()
    before = {c.id for c in daemon.containers.list(all=True)}
    launcher = daemon.containers.run(
        IMAGE, ["python", "-c", "import json\n" + LAUNCH, json.dumps(settings), str(work)], detach=True,
        user="1000:1000", read_only=True, tmpfs={"/tmp": "rw,exec"}, network_mode="host",
        volumes={str(work): {"bind": str(work), "mode": "rw"},
                 str(docker_cluster.shared): {"bind": str(docker_cluster.shared), "mode": "rw"}})
    code = launcher.wait(timeout=600)["StatusCode"]
    output = launcher.logs().decode()
    launcher.remove()

    assert code == 0 and "world_size 2" in output, output[-3000:]
    assert (work / "model" / "model.json").is_file()
    job = job_name_for("run-docker")
    containers = [c for c in daemon.containers.list(all=True, filters={"label": POD_LABEL})
                  if c.labels[POD_LABEL].startswith(f"{job}-") and c.id not in before]
    pods = {c.labels[POD_LABEL] for c in containers if c.labels["io.kubernetes.container.name"] == "pytorch"}
    assert pods == {f"{job}-master-0", f"{job}-worker-0"}
    for container in containers:
        attrs = container.attrs
        assert attrs["Config"]["Image"] == IMAGE and attrs["State"]["ExitCode"] == 0
        container.remove()
    (master,) = [c for c in containers if c.labels[POD_LABEL] == f"{job}-master-0"]
    assert master.attrs["Config"]["User"].split(":")[0] == "1000"
    assert master.attrs["HostConfig"]["ReadonlyRootfs"] is True and master.attrs["HostConfig"]["CapDrop"] == ["ALL"]
    master_log = (work / "logs" / "master.log").read_text()  # what the launcher read from pods/log
    assert master_log.strip(), "the launcher read nothing from pods/log"
