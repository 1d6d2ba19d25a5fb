"""The Kubernetes test cluster's Docker kubelet (tests/cluster/docker_kubelet.py): a 2-node PyTorchJob of kfloop's
training, its pods containers of the image, as UID 1000 with a read-only root, training with DDP through the shared
claim. Needs a Docker daemon (``DOCKER_HOST``) holding the kfloop image named by ``KFLOOP_E2E_IMAGE`` (``make e2e``
builds it and runs this file); skipped otherwise."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import docker
import pytest
from e2e_image import IMAGE, needs_image
from cluster.docker_kubelet import POD_LABEL, DockerRuntime, pod_records
from cluster.k8s_server import K8sServer
from cluster.kubernetes_cluster import CLAIM, RESTRICTED_CONTAINER, Cluster, pytorchjob
from polling import wait_for

from training.launch.manifests import job_name_for

SCHEMA = Path(__file__).resolve().parents[1] / "data" / "schema.yaml"

pytestmark = needs_image

INIT_TEMPLATE = f"""
- name: init-pytorch
  image: {IMAGE}
  command: ['sh', '-c', 'err=1;for i in $(seq {{{{.MaxTries}}}}); do if getent hosts {{{{.MasterAddr}}}}; then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err']"""
"""The operator's ``--pytorch-init-container-template-file`` for this cluster: its own image (nothing is pulled)
and ``getent`` (the image has no nslookup)."""


BARE = "bare"
"""A claim as a provisioner leaves a block volume: root's, mode 0755."""


@pytest.fixture
def docker_cluster(tmp_path):
    shared, bare = tmp_path / "shared", tmp_path / "bare"
    for folder in (shared, bare):
        folder.mkdir()
        folder.chmod(0o755)
    os.chown(shared, 0, 1000)  # the launching step (UID/GID 1000, no fsGroup: KFP sets none) writes it first
    shared.chmod(0o775)
    runtime = DockerRuntime()
    server = K8sServer(tmp_path / "k8s", volumes={CLAIM: shared, BARE: bare}, runtime=runtime,
                       pytorch_init_container_template=INIT_TEMPLATE)
    with server:
        yield Cluster(server, server.write_kubeconfig(tmp_path / "kubeconfig"), shared)
    assert server.live_pids() == [], "a pod container outlived the test server"
    runtime.remove_all()


LAUNCH = """
import json, sys
from training.config import JobShape, TrainingConfig
from training.launch.kubernetes import KubernetesSettings, train_kubernetes
settings = KubernetesSettings.from_dict(json.loads(sys.argv[1]))
config = TrainingConfig.from_dict(json.loads(sys.argv[2]))
work = sys.argv[3]
result = train_kubernetes(f"{work}/train.parquet", f"{work}/schema.yaml", model_dir=f"{work}/model", config=config,
                          shape=JobShape(nnodes=2, nproc_per_node=1, backend="kubernetes"),
                          cluster=settings.cluster, policy=settings.launcher, pipeline_run_id=sys.argv[4],
                          log_dir=f"{work}/logs")
print("world_size", result.world_size)
"""
"""The training step's launch of a 2-node job, run in a container of the image as UID 1000 (as a KFP step pod is):
the files it stages on the claim are then its pods' user's, as in a cluster."""


def _launch(cluster: Cluster, work: Path, demo_files: dict, config: dict, run_id: str, kind: str) -> Any:
    """Start :data:`LAUNCH` of a job of ``kind`` in a container."""
    work.mkdir()
    work.chmod(0o777)
    for source, name in ((demo_files["train.parquet"], "train.parquet"), (SCHEMA, "schema.yaml"),
                         (cluster.kubeconfig, "kubeconfig")):
        shutil.copy(source, work / name)
        (work / name).chmod(0o644)
    settings = {**cluster.settings(), "image": IMAGE, "kind": kind}
    settings["launcher"]["kubeconfig"] = str(work / "kubeconfig")
    launcher = docker.from_env().containers.run(
        IMAGE, ["python", "-c", LAUNCH, json.dumps(settings), json.dumps(config), str(work), run_id], detach=True,
        user="1000:1000", read_only=True, tmpfs={"/tmp": "rw,exec"}, network_mode="host",
        volumes={str(work): {"bind": str(work), "mode": "rw"},
                 str(cluster.shared): {"bind": str(cluster.shared), "mode": "rw"}})
    return launcher


def _finished(launcher) -> tuple[int, str]:
    code = launcher.wait(timeout=600)["StatusCode"]
    output = launcher.logs().decode()
    launcher.remove()
    return code, output


FAST = {"epochs": 2, "batch_size": 512, "model": {"params": {"hidden": [16]}}}


@pytest.mark.parametrize("kind, container_name, pods", [("pytorchjob", "pytorch", ("master-0", "worker-0")),
                                                         ("trainjob", "node", ("node-0-0-", "node-0-1-"))])
def test_a_job_trains_with_ddp_as_containers_of_the_image(kind, container_name, pods, docker_cluster, demo_files,
                                                          tmp_path):
    """A 2-node PyTorchJob (the operator's pods ``<job>-master-0``, ``<job>-worker-0``) or TrainJob (the Indexed
    Job's pods ``<job>-node-0-<i>-<suffix>``)."""
    work = tmp_path / "work"
    run_id = f"run-docker-{kind}"
    launcher = _launch(docker_cluster, work, demo_files, FAST, run_id, kind)
    code, output = _finished(launcher)

    assert code == 0 and "world_size 2" in output, output[-3000:]
    assert (work / "model" / "model.json").is_file()
    job = job_name_for(run_id)
    started = docker_cluster.server.runtime.started  # init containers (PyTorchJob's worker), the pods' containers
    names = sorted({c.labels[POD_LABEL] for c in started})
    assert len(names) == 2 and all(name.startswith(f"{job}-{pod}") for name, pod in zip(names, pods)), names
    for container in started:
        container.reload()
        attrs = container.attrs
        assert attrs["Config"]["Image"] == IMAGE and attrs["State"]["ExitCode"] == 0
        if container.labels["io.kubernetes.container.name"] == container_name:  # the job's securityContext
            assert attrs["Config"]["User"].split(":")[0] == "1000"
            assert attrs["HostConfig"]["ReadonlyRootfs"] is True and attrs["HostConfig"]["CapDrop"] == ["ALL"]
    records = pod_records(docker.from_env(), f"{job}-", container_name)
    assert [(r["name"], r["image"], r["exit_code"], r["restarts"]) for r in records] == [
        (name, IMAGE, 0, 0) for name in names]
    master_log = (work / "logs" / "master.log").read_text()  # what the launcher read from pods/log
    assert "epoch 2/2" in master_log, master_log[-2000:]


PROBE = """
import os, pathlib, sys, time
shared = pathlib.Path(sys.argv[1])
try:
    open("/probe", "w").close()
    root = "writable"
except OSError:
    root = "read-only"
shm = os.statvfs("/dev/shm")
print("uid", os.getuid(), "root", root, "shm", shm.f_blocks * shm.f_frsize, "secret", os.environ["TOKEN"],
      "pod", os.environ["POD"], flush=True)
(pathlib.Path("/scratch") / "x").write_text("emptyDir")
marker = shared / "started"
if not marker.exists():
    marker.write_text(os.environ["POD"])
    while True:
        time.sleep(0.05)
print("second start", flush=True)
"""
"""A pod's container: reports its user, root, /dev/shm size, a Secret and a field ref, writes to its emptyDir, and
on its first start waits (to be killed) after leaving a mark on the claim."""


def test_a_pod_is_a_container_of_its_spec_and_a_killed_one_restarts_in_place(docker_cluster):
    from kubernetes import client

    api = docker_cluster.api()
    client.CoreV1Api(api).create_namespaced_secret("default", {"metadata": {"name": "probe"},
                                                               "stringData": {"token": "from-the-secret"}})
    body = pytorchjob("probe", ["python", "-c", PROBE, str(docker_cluster.shared)], workers=0)
    master = body["spec"]["pytorchReplicaSpecs"]["Master"]
    master["restartPolicy"] = "OnFailure"
    pod = master["template"]["spec"]
    container = pod["containers"][0]
    container.update(image=IMAGE, securityContext={**RESTRICTED_CONTAINER, "readOnlyRootFilesystem": True},
                     env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "probe", "key": "token"}}},
                          {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                     resources={"limits": {"cpu": "1", "memory": "512Mi"}},
                     volumeMounts=[{"name": "shared", "mountPath": str(docker_cluster.shared)},
                                   {"name": "shm", "mountPath": "/dev/shm"},
                                   {"name": "scratch", "mountPath": "/scratch"}])
    pod["volumes"] = [{"name": "shared", "persistentVolumeClaim": {"claimName": CLAIM}},
                      {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Mi"}},
                      {"name": "scratch", "emptyDir": {}}]
    client.CustomObjectsApi(api).create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", body)
    daemon = docker.from_env()
    wait_for("the first start's mark", (docker_cluster.shared / "started").exists, timeout=120)
    (first,) = daemon.containers.list(filters={"label": f"{POD_LABEL}=probe-master-0"})
    first.kill()  # the fault: SIGKILL from outside, as the OOM killer or a node would
    job = wait_for("the job to succeed", lambda: [c for c in docker_cluster.jobs()[0].get("status", {}).get(
        "conditions", []) if c["type"] in ("Succeeded", "Failed") and c["status"] == "True"], timeout=120)
    status = client.CoreV1Api(api).read_namespaced_pod("probe-master-0", "default").status
    log = client.CoreV1Api(api).read_namespaced_pod_log("probe-master-0", "default")

    assert job[0]["type"] == "Succeeded"
    (container_status,) = status.container_statuses
    assert container_status.restart_count == 1
    assert container_status.last_state.terminated.exit_code == 137
    assert container_status.last_state.terminated.container_id == f"docker://{first.id}"
    second = daemon.containers.get(container_status.state.terminated.container_id.removeprefix("docker://"))
    assert second.id != first.id and second.attrs["State"]["ExitCode"] == 0
    assert log.count("uid 1000 root read-only shm 33554432 secret from-the-secret pod probe-master-0") == 2
    assert "second start" in log
    assert second.attrs["HostConfig"]["Memory"] == 512 * 2**20 and second.attrs["HostConfig"]["NanoCpus"] == 10**9
    assert pod_records(daemon, "probe-") == [{"name": "probe-master-0", "container_id": second.id, "image": IMAGE,
                                              "user": "1000", "exit_code": 0, "restarts": 1}]


@pytest.mark.parametrize("fs_group", [None, 1000])
def test_a_non_root_pod_writes_a_root_owned_claim_only_with_an_fsgroup(fs_group, docker_cluster):
    """The kubelet gives the volume to the pod's fsGroup (group, setgid folders) and the container that group;
    without one, a root-owned volume is read-only to UID 1000."""
    from kubernetes import client

    body = pytorchjob(f"fsgroup-{fs_group or 'none'}", ["python", "-c", "open('/data/written', 'w').write('x')"],
                      workers=0)
    pod = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    if fs_group:
        pod["securityContext"]["fsGroup"] = fs_group
    pod["containers"][0].update(image=IMAGE, volumeMounts=[{"name": "data", "mountPath": "/data"}])
    pod["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": BARE}}]
    client.CustomObjectsApi(docker_cluster.api()).create_namespaced_custom_object("kubeflow.org", "v1", "default",
                                                                                  "pytorchjobs", body)
    (ended,) = wait_for("the job to end", lambda: [c["type"] for c in docker_cluster.jobs()[0].get(
        "status", {}).get("conditions", []) if c["type"] in ("Succeeded", "Failed") and c["status"] == "True"],
        timeout=120)
    log = client.CoreV1Api(docker_cluster.api()).read_namespaced_pod_log(f"{body['metadata']['name']}-master-0",
                                                                         "default")
    bare = docker_cluster.server.volumes[BARE]
    if fs_group:
        assert ended == "Succeeded", log
        assert (bare / "written").stat().st_gid == fs_group and bare.stat().st_mode & 0o2070 == 0o2070
    else:
        assert ended == "Failed" and "PermissionError" in log
        assert not (bare / "written").exists() and bare.stat().st_gid == 0
