"""RayJobs (KubeRay v1.7.0, ``cluster.kind: rayjob``) from the one job builder: what `kfloop render-job --kind rayjob`
prints validates against the real RayJob CRD, is sized from the job's shape, runs Ray Train's entry module with
arguments it accepts, keeps the restricted pod settings on every pod, and what a RayJob cannot express is refused."""
from __future__ import annotations

import copy
import importlib.metadata
import json
import random
import re
import shlex
import subprocess
import sys
import threading
import uuid

import pytest

from cluster.crd_schema import validate
from cluster.kuberay_validation import MAX_RAYJOB_NAME_LENGTH, validate_rayjob
from manifest_checks import render_cli, restricted_violations
from polling import wait_for
from test_training import write_training_files

from training.config import JobShape, TrainingConfig
from training.launch.cluster import KUEUE_QUEUE_LABEL, ClusterConfig
from training.launch.kubernetes import JobRun, KubernetesSettings, LaunchPolicy
from training.launch.local import LaunchError
from training.launch.jobspec import MAX_NAME_LENGTH
from training.launch.manifests import job_name_for, render, training_job_spec
from training.ray_train import parse_args, run_config, worker_env

TOLERATION = "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]"
COMBINATIONS = {
    "cpu-2": ["--kind", "rayjob", "--nnodes", "2", "--set", "cluster.cpu=4"],
    "gpu-2x8-kueue": ["--kind", "rayjob", "--nnodes", "2", "--gpus-per-node", "8", "--set", "cluster.cpu=16",
                      "--set", "cluster.kueue_queue=team-a",
                      "--set", "cluster.topology_required=cloud.provider.com/topology-rack",
                      "--set", "cluster.active_deadline_seconds=7200", "--set", f"cluster.tolerations={TOLERATION}",
                      "--set", "cluster.service_account_name=trainer", "--set", "cluster.image_pull_secrets=[creds]",
                      "--set", "cluster.secret_env={HF_TOKEN: hf/token}", "--set", "cluster.nccl_socket_ifname=eth0",
                      "--set", "cluster.node_selector={nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}",
                      "--set", "cluster.priority_class_name=training",
                      "--set", "cluster.ttl_seconds_after_finished=null",
                      "--set", "cluster.ray.head={cpu: '2', memory: 6Gi}"],
}
KFP_RUN_ID = "3f9b2c1e-8a7d-4e6f-9b0a-1c2d3e4f5a6b"


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict]:
    return {name: render_cli(argv) for name, argv in COMBINATIONS.items()}


def _cluster_spec(body: dict) -> tuple[dict, dict]:
    spec = body["spec"]["rayClusterSpec"]
    (workers,) = spec["workerGroupSpecs"]
    return spec["headGroupSpec"], workers


def _pod_specs(body: dict) -> dict[str, dict]:
    head, workers = _cluster_spec(body)
    return {"head": head["template"]["spec"], "worker": workers["template"]["spec"],
            "submitter": body["spec"]["submitterPodTemplate"]["spec"]}


@pytest.mark.parametrize("name", COMBINATIONS)
def test_rayjob_validates_against_the_kuberay_1_7_crd(rendered, name):
    body = rendered[name]
    assert (body["apiVersion"], body["kind"]) == ("ray.io/v1", "RayJob")
    assert validate(body) == [], name


def test_the_rayjob_validation_bites(rendered):
    broken = []
    body = copy.deepcopy(rendered["cpu-2"])
    _cluster_spec(body)[1]["replicas"] = "2"  # the CRD wants an integer
    broken.append(body)
    body = copy.deepcopy(rendered["cpu-2"])
    body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["gpus"] = 1  # unknown field
    broken.append(body)
    body = copy.deepcopy(rendered["cpu-2"])
    del body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]  # required
    broken.append(body)
    for body in broken:
        assert validate(body), body["spec"]


def test_rayjob_is_sized_from_the_shape_and_runs_ray_train(rendered):
    for name, world, per_pod, gpus in (("cpu-2", 4, 2, 0), ("gpu-2x8-kueue", 16, 8, 8)):
        body = rendered[name]
        head, workers = _cluster_spec(body)
        assert (workers["replicas"], workers["minReplicas"], workers["maxReplicas"]) == (2, 2, 2)
        assert head["rayStartParams"] == {"num-cpus": "0"}  # no training worker on the head
        worker_resources = workers["template"]["spec"]["containers"][0]["resources"]
        assert worker_resources["limits"].get("nvidia.com/gpu", 0) == gpus
        assert "nvidia.com/gpu" not in head["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert "command" not in workers["template"]["spec"]["containers"][0]  # KubeRay writes `ray start`
        argv = shlex.split(body["spec"]["entrypoint"])
        assert argv[:3] == ["python", "-m", "training.ray_train"]
        args = parse_args(argv[3:])
        assert (args.num_workers, args.address) == (world, "auto")
        assert str(args.model_dir) == "/shared/kfloop-train/model"
        # Ray gets the pod's whole CPUs: one per GPU worker, or shared by the CPU workers
        assert workers["rayStartParams"] == {"num-cpus": "16" if gpus else "4"}
        assert args.cpus_per_worker == (1 if gpus else 4 // per_pod)
        spec = body["spec"]
        assert (spec["submissionMode"], spec["backoffLimit"]) == ("K8sJobMode", 3)
        assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}
        assert spec["rayClusterSpec"]["rayVersion"] == importlib.metadata.version("ray")  # the pin the image installs


def test_the_cluster_goes_at_the_end_and_the_rayjob_after_the_ttl(rendered):
    """``cluster.ttl_seconds_after_finished`` is KubeRay's DeleteSelf rule; the Ray cluster goes at the end either
    way; a Kueue-queued RayJob (suspended, so shutdownAfterJobFinishes) keeps only the cluster rule."""
    spec = rendered["cpu-2"]["spec"]
    assert spec["shutdownAfterJobFinishes"] is False and "ttlSecondsAfterFinished" not in spec
    rules = {(r["policy"], r["condition"].get("jobStatus") or r["condition"]["jobDeploymentStatus"],
              r["condition"]["ttlSeconds"]) for r in spec["deletionStrategy"]["deletionRules"]}
    ends = ("SUCCEEDED", "FAILED", "Failed")
    assert rules == {("DeleteCluster", end, 0) for end in ends} | {("DeleteSelf", end, 86400) for end in ends}
    kept = render_cli(["--kind", "rayjob", "--set", "cluster.cpu=4",
                       "--set", "cluster.ttl_seconds_after_finished=null"])
    assert {r["policy"] for r in kept["spec"]["deletionStrategy"]["deletionRules"]} == {"DeleteCluster"}
    queued = rendered["gpu-2x8-kueue"]["spec"]
    assert (queued["shutdownAfterJobFinishes"], queued["ttlSecondsAfterFinished"]) == (True, 0)
    assert "deletionStrategy" not in queued
    cluster = ClusterConfig(kind="rayjob", cpu="4", kueue_queue="team-a", ttl_seconds_after_finished=600)
    spec = training_job_spec(TrainingConfig(), JobShape(nnodes=2, nproc_per_node=2), cluster, name="kfloop-train")
    with pytest.raises(ValueError, match="ttl_seconds_after_finished=600 with kueue_queue: .* set "
                                         "ttl_seconds_after_finished: null"):
        render(spec, cluster)


def test_every_kfp_run_id_gives_a_rayjob_kuberay_accepts():
    """Names of KFP run ids (uuids) fit KubeRay's 47 characters, stay distinct, and the whole RayJob passes the
    ported KubeRay v1.7.0 validation (tests/cluster/kuberay_validation.py)."""
    rng = random.Random(7)
    ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(2000)]
    names = [job_name_for(i) for i in ids]
    assert len(set(names)) == len(ids)
    for name in names:
        assert len(name) <= MAX_RAYJOB_NAME_LENGTH and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
    body = render_cli(["--kind", "rayjob", "--run-id", KFP_RUN_ID, "--set", "cluster.cpu=4"])
    assert body["metadata"]["name"] == job_name_for(KFP_RUN_ID) and len(body["metadata"]["name"]) <= 47
    assert validate(body) == [] and validate_rayjob(body) == ("", "")
    assert MAX_NAME_LENGTH <= MAX_RAYJOB_NAME_LENGTH  # no job name kfloop accepts is one KubeRay refuses
    cluster = ClusterConfig(kind="rayjob", cpu="4")
    with pytest.raises(ValueError, match=f"at most {MAX_NAME_LENGTH} characters"):
        training_job_spec(TrainingConfig(), JobShape(nnodes=1, nproc_per_node=1), cluster,
                          name="k" * (MAX_NAME_LENGTH + 1))


def test_the_head_has_its_own_resources_and_no_gpu_node_selector(rendered):
    body = rendered["gpu-2x8-kueue"]
    head, workers = _cluster_spec(body)
    head_pod, worker_pod = head["template"]["spec"], workers["template"]["spec"]
    assert head_pod["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "6Gi"},
                                                      "limits": {"memory": "6Gi"}}
    assert "nodeSelector" not in head_pod and "nodeSelector" not in body["spec"]["submitterPodTemplate"]["spec"]
    assert worker_pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert worker_pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    with pytest.raises(ValueError, match="ray.head.memory='1Gi'"):
        ClusterConfig(kind="rayjob", shm_size="2Gi", ray={"head": {"memory": "1Gi"}})
    with pytest.raises(ValueError, match="cluster.ray.head.*unknown|valid keys"):
        ClusterConfig(kind="rayjob", ray={"head": {"gpus": 1}})


def test_a_storage_path_uri_reaches_ray_train_unchanged():
    body = render_cli(["--kind", "rayjob", "--set", "cluster.cpu=4",
                       "--set", "cluster.ray.storage_path=s3://ckpt/runs"])
    args = parse_args(shlex.split(body["spec"]["entrypoint"])[3:])
    assert args.storage_path == "s3://ckpt/runs"
    assert run_config(args, TrainingConfig()).storage_path == "s3://ckpt/runs"  # not Path(...).resolve()d
    args = parse_args(shlex.split(render_cli(["--kind", "rayjob", "--set", "cluster.cpu=4"])["spec"]["entrypoint"])[3:])
    assert run_config(args, TrainingConfig()).storage_path == "/shared/kfloop-train/checkpoints"
    with pytest.raises(ValueError, match="storage_path='ckpt': give a URI"):
        ClusterConfig(kind="rayjob", ray={"storage_path": "ckpt"})


@pytest.mark.timeout(600)
def test_ray_train_checkpoints_to_an_s3_storage_path(tmp_path, ray_head_with_s3, s3_bucket):
    """``--storage-path s3://...`` on a real Ray: Ray Train writes the checkpoints through pyarrow's S3 filesystem,
    which finds the S3 server and the keys in the ``AWS_*`` env of the driver and of the Ray node (as a pod gets them
    from its Secret), not in the job's runtime env."""
    import boto3

    files = write_training_files(tmp_path, 600, seed=4)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TrainingConfig(epochs=2, batch_size=64).to_dict()))
    done = subprocess.run([sys.executable, "-m", "training.ray_train", "--data", str(files.data), "--schema",
                           str(files.schema), "--model-dir", str(tmp_path / "model"), "--checkpoint-dir",
                           str(tmp_path / "unused"), "--config", str(config), "--num-workers", "1", "--address",
                           ray_head_with_s3, "--name", "s3-run", "--storage-path", f"s3://{s3_bucket}/checkpoints"],
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert any(k.startswith("checkpoints/s3-run/checkpoint_") for k in keys), keys
    assert not (tmp_path / "unused").exists()


def test_rayjob_carries_the_cluster_pod_settings_on_every_pod(rendered):
    body = rendered["gpu-2x8-kueue"]
    assert body["spec"]["suspend"] is True and body["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert body["spec"]["activeDeadlineSeconds"] == 7200
    for role, pod in _pod_specs(body).items():
        assert restricted_violations(pod) == [], role
        assert pod["serviceAccountName"] == "trainer" and pod["imagePullSecrets"] == [{"name": "creds"}]
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and pod["priorityClassName"] == "training"
    head, workers = _cluster_spec(body)
    assert body["spec"]["submitterPodTemplate"]["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    for group in (head, workers):
        pod = group["template"]
        assert pod["metadata"]["annotations"] == {"kueue.x-k8s.io/podset-required-topology":
                                                  "cloud.provider.com/topology-rack",
                                                  "sidecar.istio.io/inject": "false"}  # Istio's opt-out
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
        assert env["NCCL_SOCKET_IFNAME"]["value"] == "eth0" and "PET_MAX_RESTARTS" not in env
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/dev/shm", "/shared", "/tmp"}
    assert "suspend" not in rendered["cpu-2"]["spec"]


@pytest.mark.parametrize(("settings", "refusal"), [
    ({"clean_pod_policy": "All"}, "a RayJob cannot set clean_pod_policy"),
    ({"gang_scheduler": "volcano"}, "a RayJob cannot set gang_scheduler"),
    ({"cpu": "1"}, "nproc_per_node=2 Ray Train workers per pod"),
    ({"cpu": "1", "gpus_per_node": 2}, "nproc_per_node=2 Ray Train workers per pod"),
])
def test_what_a_rayjob_cannot_express_is_refused(settings, refusal):
    cluster = ClusterConfig(kind="rayjob", **settings)
    spec = training_job_spec(TrainingConfig(), JobShape(nnodes=2, nproc_per_node=2), cluster, name="kfloop-train")
    with pytest.raises(ValueError, match=refusal):
        render(spec, cluster)


# --------------------------------------------------------------------------- the launcher follows RayJob status
# The test plays KubeRay v1.7.0's RayJob controller: it writes the status transitions rayjob_controller.go makes
# (Initializing -> Running -> Complete/Failed, Failed with backoffLimit left -> Retrying, suspend -> Suspended)
# through the status subresource of the test API server, and the launcher follows them over its watch. The server's
# own KubeRay (tests/cluster/kuberay_operator.py, run end to end in tests/test_rayjob_cluster.py) is off meanwhile.

KUBERAY_OFF = pytest.mark.parametrize("cluster", [{"operator": False}], indirect=True, ids=["kuberay-off"])

def _rayjob(cluster, name: str, **overrides) -> dict:
    settings = KubernetesSettings.from_dict({**cluster.settings(), "kind": "rayjob", **overrides}).cluster
    return render(training_job_spec(TrainingConfig(), JobShape(nnodes=2, nproc_per_node=1), settings, name=name),
                  settings)


def _launch(cluster, body: dict, tmp_path, artifact=None, **policy) -> tuple[threading.Thread, dict]:
    """JobRun on ``body`` in a thread; the result dict gets ``job`` or ``error``."""
    result: dict = {}
    run = JobRun(cluster.api(), body, policy=LaunchPolicy(kubeconfig=str(cluster.kubeconfig), poll_seconds=0.5,
                                                          **policy),
                 log_path=tmp_path / "master.log", timeout=120, artifact=artifact)

    def target() -> None:
        try:
            result["job"] = run.run()
        except LaunchError as exc:
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def _kuberay_sets(cluster, name: str, *statuses: dict) -> None:
    """Write ``statuses`` in order as the RayJob's status, once the launcher has created it."""
    from kubernetes import client

    api = client.CustomObjectsApi(cluster.api())
    wait_for(f"RayJob {name}", lambda: any(j["metadata"]["name"] == name for j in api.list_namespaced_custom_object(
        "ray.io", "v1", "default", "rayjobs")["items"]))
    for status in statuses:
        api.patch_namespaced_custom_object_status("ray.io", "v1", "default", "rayjobs", name, {"status": status})


def _rayjobs(cluster) -> list[str]:
    from kubernetes import client

    return [j["metadata"]["name"] for j in client.CustomObjectsApi(cluster.api()).list_namespaced_custom_object(
        "ray.io", "v1", "default", "rayjobs")["items"]]


@KUBERAY_OFF
def test_a_failed_rayjob_fails_the_launch_with_kuberays_reason_and_is_kept(cluster, tmp_path):
    body = _rayjob(cluster, "ray-app-failed")
    thread, result = _launch(cluster, body, tmp_path)
    _kuberay_sets(cluster, "ray-app-failed", {"jobDeploymentStatus": "Initializing"},
                  {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "jobId": "ray-app-failed-x2k9q"},
                  {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
                   "message": "Job entrypoint command failed with exit code 1"})
    thread.join(60)
    error = str(result["error"])
    assert "RayJob default/ray-app-failed: Failed (Ray job FAILED): AppFailed: Job entrypoint command failed with " \
           "exit code 1" in error
    assert _rayjobs(cluster) == ["ray-app-failed"]  # ended by itself: kept for inspection (KubeRay's TTL cleans up)


@KUBERAY_OFF
def test_a_stopped_ray_job_is_no_success(cluster, tmp_path):
    body = _rayjob(cluster, "ray-stopped")
    thread, result = _launch(cluster, body, tmp_path)
    _kuberay_sets(cluster, "ray-stopped", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
                  {"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED", "message": "Job was intentionally stopped."})
    thread.join(60)
    assert "Complete (Ray job STOPPED): Job was intentionally stopped." in str(result["error"])


@KUBERAY_OFF
def test_rayjob_retries_count_against_the_restart_cap_and_the_job_is_deleted(cluster, tmp_path):
    body = _rayjob(cluster, "ray-retrying")
    thread, result = _launch(cluster, body, tmp_path, restart_cap=1)
    retry = {"jobDeploymentStatus": "Retrying", "jobStatus": "FAILED", "reason": "AppFailed", "message": "boom"}
    _kuberay_sets(cluster, "ray-retrying", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, retry,
                  {"jobDeploymentStatus": "Initializing", "jobStatus": "", "reason": "", "message": ""}, retry)
    thread.join(60)
    assert "restarted 2 times, over the launcher's cap of 1" in str(result["error"])
    assert _rayjobs(cluster) == []  # the launcher gave up: it deleted the RayJob (its Ray cluster goes with it)


@KUBERAY_OFF
def test_a_suspended_rayjob_waits_for_kueue_then_succeeds(cluster, tmp_path, capsys):
    body = _rayjob(cluster, "ray-queued", kueue_queue="team-a", ttl_seconds_after_finished=None)
    assert body["spec"]["suspend"] is True
    artifact = tmp_path / "model.json"
    thread, result = _launch(cluster, body, tmp_path, artifact=artifact)
    _kuberay_sets(cluster, "ray-queued", {"jobDeploymentStatus": "Suspended"})
    wait_for("the launcher to report the suspension", lambda: "suspended until Kueue" in capsys.readouterr().err)
    assert thread.is_alive()  # suspended: waiting, not failed
    artifact.write_text("{}")
    _kuberay_sets(cluster, "ray-queued", {"jobDeploymentStatus": "Initializing"},
                  {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
                  {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    thread.join(60)
    assert result["job"]["status"]["jobStatus"] == "SUCCEEDED" and _rayjobs(cluster) == ["ray-queued"]


def test_no_credential_travels_in_the_ray_jobs_runtime_env():
    """Ray keeps a job's runtime env with the job: the workers get where MLflow and the data are from it, and their
    credentials from their pods' secretKeyRef env (the manifest above) or their own environment."""
    environ = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value", "AWS_SESSION_TOKEN": "tok",
               "MLFLOW_TRACKING_PASSWORD": "pw-value", "AWS_ENDPOINT_URL": "http://minio:9000",
               "MLFLOW_TRACKING_URI": "http://mlflow:5000", "KFLOOP_HOME": "/shared/kfloop", "PATH": "/usr/bin"}
    assert worker_env(environ) == {"AWS_ENDPOINT_URL": "http://minio:9000", "MLFLOW_TRACKING_URI": "http://mlflow:5000",
                                   "KFLOOP_HOME": "/shared/kfloop"}
    assert "MLFLOW_TRACKING_URI" not in worker_env({"MLFLOW_TRACKING_URI": "http://alice:S3CRETPW@mlflow:5000"})
