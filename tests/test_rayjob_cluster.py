"""``cluster.kind: rayjob`` end to end: kfloop's launcher creates a RayJob on the Kubernetes test server with the
real `kubernetes` client, the server plays KubeRay v1.7.0 (tests/cluster/kuberay_operator.py) and its pods really run
Ray (``ray start`` on the head and two workers, ``ray job submit`` in the submitter): the job of a KFP run id passes
KubeRay's validation, its pods pass their readiness probes, and it trains the model; a
deleted worker pod is replaced and Ray Train resumes from its checkpoint, and a failing entrypoint ends Failed with
KubeRay's reason in kfloop's error."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
from kubernetes import client

from cluster.kuberay_operator import CLUSTER_LABEL, NODE_TYPE_LABEL
from polling import wait_for
from test_launch_kubernetes import register_candidate, train_2x2
from test_ray_train import registered_checkpoints
from test_training import write_training_files
from training.config import JobShape, TrainingConfig
from training.launch.kubernetes import KubernetesSettings, train_kubernetes
from training.launch.local import LaunchError
from training.launch.jobspec import MAX_NAME_LENGTH
from training.launch.manifests import job_name_for

TINY = TrainingConfig(epochs=3, batch_size=64, model={"params": {"hidden": [16], "dropout": 0.1}})
SHAPE = JobShape(nnodes=2, nproc_per_node=1, backend="kubernetes")
DEADLINE_S = 400
KFP_RUN_ID = "3f9b2c1e-8a7d-4e6f-9b0a-1c2d3e4f5a6b"
"""A KFP run id (a uuid): the job's name is 47 characters, KubeRay's most."""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> SimpleNamespace:
    """4000 rows: a few dozen steps per epoch and worker, so a pod deletion lands mid-run."""
    return write_training_files(tmp_path_factory.mktemp("rayjob-data"), 4000, seed=5)


def _train(cluster, files, tmp_path: Path, run_id: str, config: TrainingConfig = TINY, shape: JobShape = SHAPE,
           **settings_overrides):
    settings = KubernetesSettings.from_dict({**cluster.settings(), "kind": "rayjob", **settings_overrides})
    return train_kubernetes(files.data, files.schema, model_dir=tmp_path / "model", config=config, shape=shape,
                            cluster=settings.cluster, policy=settings.launcher, pipeline_run_id=run_id,
                            log_dir=tmp_path / "logs")


def _rayjob(cluster, name: str) -> dict:
    return client.CustomObjectsApi(cluster.api()).get_namespaced_custom_object("ray.io", "v1", "default", "rayjobs",
                                                                                name)


def _events(cluster, kind: str) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in client.CoreV1Api(cluster.api()).list_namespaced_event("default").items
            if e.involved_object.kind == kind]


def _pod_logs(cluster, pattern: str) -> list[str]:
    """The logs the kubelet kept of the pods whose name matches ``pattern`` (the pods themselves may be gone)."""
    return [p.read_text(errors="replace") for p in sorted(cluster.server.workdir.rglob(f"{pattern}.log"))]


@pytest.mark.timeout(DEADLINE_S)
def test_a_rayjob_of_two_workers_trains_to_a_registered_candidate_on_real_ray(cluster, isolated_env, demo_files,
                                                                              tmp_path):
    name = job_name_for(KFP_RUN_ID)
    assert len(name) == MAX_NAME_LENGTH  # a KFP run id is long: the name is at the limit every kind takes
    prepared, model_dir, result = train_2x2(cluster, isolated_env, demo_files, tmp_path, "ray-model", KFP_RUN_ID,
                                            {**cluster.settings(), "kind": "rayjob"}, nproc_per_node=1)
    assert json.loads((model_dir / "model.json").read_text())["world_size"] == 2
    version = register_candidate(tmp_path, prepared, model_dir, result.run_id, "ray-model", KFP_RUN_ID)
    assert mlflow.MlflowClient().get_model_version("ray-model", version).run_id == result.run_id

    status = _rayjob(cluster, name)["status"]
    assert (status["jobDeploymentStatus"], status["jobStatus"], status["succeeded"]) == ("Complete", "SUCCEEDED", 1)
    ray_cluster = status["rayClusterName"]
    assert ray_cluster.startswith(f"{name}-") and status["jobId"].startswith(f"{name}-")
    events = _events(cluster, "RayJob")
    assert not [e for e in events if e[0].startswith("Invalid")], events  # KubeRay's validation passed
    assert ("CreatedRayCluster", f"Created RayCluster default/{ray_cluster}") in events
    assert ("CreatedRayJobSubmitter", f"Created Kubernetes Job default/{name}") in events
    wait_for("KubeRay to delete the finished job's RayCluster (its DeleteCluster rule)", lambda: (
        "DeletedRayCluster", f"Deleted cluster default/{ray_cluster}") in _events(cluster, "RayJob"), timeout=60)
    created = sorted(reason for reason, _ in _events(cluster, "RayCluster"))
    assert created == ["CreatedHeadPod", "CreatedWorkerPod", "CreatedWorkerPod"]

    core = client.CoreV1Api(cluster.api())
    assert core.list_namespaced_pod("default", label_selector=f"{CLUSTER_LABEL}={ray_cluster}").items == []
    assert client.CustomObjectsApi(cluster.api()).list_namespaced_custom_object(
        "ray.io", "v1", "default", "rayclusters")["items"] == []
    [submitter] = core.list_namespaced_pod("default", label_selector=f"job-name={name}").items
    assert submitter.status.phase == "Succeeded"
    command = submitter.spec.containers[0].args[0]
    assert f"ray job submit --address http://{ray_cluster}-head-svc.default.svc.cluster.local:" in command
    assert f"--submission-id {status['jobId']} -- python -m training.ray_train" in command
    log = core.read_namespaced_pod_log(submitter.metadata.name, "default")
    assert f"Job '{status['jobId']}' succeeded" in log and "Started training worker group of size 2" in log

    prefix = ray_cluster[:50]  # PodName keeps 50 characters of a pod's prefix (the cluster's name has 53)
    [head_log] = _pod_logs(cluster, f"{prefix}-head-*")
    worker_logs = _pod_logs(cluster, f"{prefix}-worker-*[0-9a-f]")
    assert "Ray runtime started" in head_log and len(worker_logs) == 2
    assert all("Ray runtime started" in log for log in worker_logs)


@pytest.mark.chaos
@pytest.mark.timeout(DEADLINE_S)
def test_a_deleted_worker_pod_is_replaced_and_ray_train_resumes_from_its_checkpoint(cluster, files, tmp_path):
    name = job_name_for("run-rayjob-kill")
    run_dir = cluster.shared / name / "checkpoints" / name  # Ray Train's storage_path / the run's name
    config = replace(TINY, epochs=20)  # the deletion (SIGTERM, SIGKILL 5 s later) lands well before the end
    core = client.CoreV1Api(cluster.api())
    with ThreadPoolExecutor(1) as pool:
        launch = pool.submit(_train, cluster, files, tmp_path, "run-rayjob-kill", config,
                             replace(SHAPE, max_restarts=1))
        wait_for("a checkpoint Ray Train registered", lambda: registered_checkpoints(run_dir), timeout=DEADLINE_S,
                 interval=0.02)
        ray_cluster = _rayjob(cluster, name)["status"]["rayClusterName"]
        victim = core.list_namespaced_pod("default", label_selector=f"{CLUSTER_LABEL}={ray_cluster},"
                                                                    f"{NODE_TYPE_LABEL}=worker").items[0]
        core.delete_namespaced_pod(victim.metadata.name, "default")
        result = launch.result(timeout=DEADLINE_S)
    assert result.world_size == 2
    status = _rayjob(cluster, name)["status"]
    assert (status["jobDeploymentStatus"], status["jobStatus"]) == ("Complete", "SUCCEEDED")
    workers = [m for r, m in _events(cluster, "RayCluster") if r == "CreatedWorkerPod"]
    assert len(workers) == 3 and f"Created worker Pod default/{victim.metadata.name}" in workers, "one replacement"
    log = (tmp_path / "logs" / "master.log").read_text()
    assert log.count("Started training worker group of size 2") == 2, "Ray Train started the group again"
    resumed_at = int(log.split("resuming from checkpoint step ")[1].split()[0])
    steps_per_epoch = int(log.split(f"epoch 1/{config.epochs} step ")[1].split()[0])
    assert steps_per_epoch <= resumed_at < steps_per_epoch * config.epochs and resumed_at % steps_per_epoch == 0


@pytest.mark.timeout(DEADLINE_S)
def test_a_failing_entrypoint_fails_the_rayjob_with_kuberays_reason(cluster, files, tmp_path):
    name = job_name_for("run-rayjob-bad")
    bad = SimpleNamespace(data=tmp_path / "empty.parquet", schema=files.schema)
    bad.data.write_bytes(b"not parquet")
    with pytest.raises(LaunchError) as failed:
        _train(cluster, bad, tmp_path, "run-rayjob-bad", replace(TINY, epochs=1), backoff_limit=0)
    status = _rayjob(cluster, name)["status"]
    assert (status["jobDeploymentStatus"], status["jobStatus"], status["reason"]) == ("Failed", "FAILED", "AppFailed")
    assert status["message"].startswith("Job entrypoint command failed with exit code 1")
    error = str(failed.value)
    assert f"RayJob default/{name}: Failed (Ray job FAILED): AppFailed: Job entrypoint command failed" in error
