"""The Kubernetes launcher against the test API server (tests/cluster/k8s_server.py), over HTTP with the real
`kubernetes` client: rendered PyTorchJobs train in operator mode, failures surface as one LaunchError, retries
attach, cancelling deletes. Nothing here patches a client."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cluster.k8s_server import JOB_NAME_LABEL
from cluster.kubernetes_cluster import Cluster
from polling import wait_for

from pipelines.cli.commands import main
from training.config import JobShape, TrainingConfig
from training.launch.kubernetes import (JobRun, KubernetesSettings, LaunchPolicy, check_image_build,
                                        check_shared_claim, preflight, train_kubernetes)
from data.tables import DataFileError
from training.launch.local import LaunchError
from training.launch.manifests import job_name_for, render_pytorchjob, training_job_spec
from training.model_code import source_file

REPO = Path(__file__).resolve().parents[1]


def _job_body(cluster: Cluster, name: str, *, nnodes: int = 2, **cluster_overrides) -> dict:
    """A rendered PyTorchJob of ``training.train`` on ``cluster`` (no inputs staged: it never gets far)."""
    cluster_config = KubernetesSettings.from_dict({**cluster.settings(), **cluster_overrides}).cluster
    shape = JobShape(nnodes=nnodes, nproc_per_node=cluster_config.accelerator[1] if cluster_config.accelerator else 1)
    return render_pytorchjob(training_job_spec(TrainingConfig(), shape, cluster_config, name=name), cluster_config)


def test_docs_launcher_settings_are_valid():
    page = (REPO / "docs" / "kubernetes.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "  launcher:" in b]
    settings = KubernetesSettings.from_dict(yaml.safe_load(block)["cluster"])
    assert settings.launcher.preflight_min_busbw_gbps > 0
    with pytest.raises(ValueError, match="valid keys are"):
        KubernetesSettings.from_dict({"launcher": {"restart_limit": 3}})


def test_the_launcher_relists_when_its_watch_expires(cluster, tmp_path, capsys):
    import threading

    from kubernetes import client

    name, release = "expiring-watch", cluster.shared / "release"
    body = _job_body(cluster, name, nnodes=1)
    body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"] = [
        "python", "-c", f"import pathlib, time\nwhile not pathlib.Path('{release}').exists(): time.sleep(0.05)"]
    run = JobRun(cluster.api(), body, policy=LaunchPolicy(kubeconfig=str(cluster.kubeconfig), poll_seconds=0.5),
                 log_path=tmp_path / "master.log", timeout=60)
    outcome = {}
    launcher = threading.Thread(target=lambda: outcome.update(job=run.run()))
    launcher.start()
    try:
        wait_for("the master to run", lambda: cluster.jobs() and any(
            c["type"] == "Running" for c in cluster.jobs()[0].get("status", {}).get("conditions", [])))
        seen = len(cluster.server.requests)
        client.CoreV1Api(cluster.api()).create_namespaced_secret("default", {"metadata": {"name": "bump"}})
        cluster.server.store.compact()  # history up to after the launcher's resourceVersion is gone
        wait_for("the launcher to re-list", lambda: any(
            r.startswith(f"GET /apis/kubeflow.org/v1/namespaces/default/pytorchjobs/{name} ")
            for r in cluster.server.requests[seen:]))
    finally:
        release.touch()
        launcher.join(timeout=60)
    assert [c["type"] for c in outcome["job"]["status"]["conditions"] if c["status"] == "True"] == [
        "Created", "Succeeded"]
    assert "watch expired (410 Gone); re-listed" in capsys.readouterr().err


def test_a_job_past_the_launchers_deadline_is_deleted(cluster, tmp_path):
    body = _job_body(cluster, "too-slow", nnodes=1)
    body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"] = [
        "sleep", "600"]
    started = time.monotonic()
    with pytest.raises(LaunchError, match="not finished after the launcher's timeout of 1 s"):
        JobRun(cluster.api(), body, policy=LaunchPolicy(kubeconfig=str(cluster.kubeconfig), poll_seconds=0.5),
               log_path=tmp_path / "master.log", timeout=1).run()
    assert time.monotonic() - started >= 1
    assert cluster.jobs() == [] and cluster.server.live_pids() == []


def test_succeeded_counts_only_with_the_artifact_on_the_shared_volume(cluster, tmp_path):
    body = _job_body(cluster, "no-model", nnodes=1)
    body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"] = ["true"]
    with pytest.raises(LaunchError, match="Succeeded, but .*model.json is not on the shared volume"):
        JobRun(cluster.api(), body, policy=LaunchPolicy(kubeconfig=str(cluster.kubeconfig), poll_seconds=0.5),
               log_path=tmp_path / "master.log", timeout=60, artifact=cluster.shared / "no-model" / "model.json").run()


@pytest.mark.parametrize("secret_exists", [True, False])
def test_secret_key_refs_reach_the_container_or_block_it_clearly(secret_exists, cluster, tmp_path):
    from kubernetes import client

    if secret_exists:
        client.CoreV1Api(cluster.api()).create_namespaced_secret(
            "default", {"metadata": {"name": "s3-credentials"}, "stringData": {"secret-key": "planted-value"}})
    body = _job_body(cluster, "with-secret", nnodes=1,
                     secret_env={"AWS_SECRET_ACCESS_KEY": "s3-credentials/secret-key"})
    out = cluster.shared / "seen.txt"
    body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"] = [
        "python", "-c", f"import os, pathlib; pathlib.Path('{out}').write_text(os.environ['AWS_SECRET_ACCESS_KEY'])"]
    run = JobRun(cluster.api(), body, policy=LaunchPolicy(kubeconfig=str(cluster.kubeconfig), poll_seconds=0.5),
                 log_path=tmp_path / "master.log", timeout=60)
    if secret_exists:
        run.run()
        assert out.read_text() == "planted-value"
    else:
        with pytest.raises(LaunchError, match='CreateContainerConfigError: secret "s3-credentials" not found'):
            run.run()
        assert not out.exists() and cluster.jobs() == []


# ------------------------------------------------------------------------------------------------ training

def test_inputs_in_object_storage_are_staged_for_the_job(cluster, s3_bucket, demo_files, tmp_path):
    """`kfloop train --backend kubernetes --data s3://...`: the launcher streams the objects onto the shared volume;
    a missing object fails naming its URI before any job exists."""
    import boto3

    from training.launch.kubernetes import train_kubernetes

    s3 = boto3.client("s3")
    s3.upload_file(str(demo_files["train.parquet"]), s3_bucket, "in/train.parquet")
    s3.upload_file(str(REPO / "data" / "schema.yaml"), s3_bucket, "in/schema.yaml")
    settings = KubernetesSettings.from_dict(cluster.settings())
    config = TrainingConfig.from_dict({**FAST, "model": FAST_MODEL})
    common = dict(model_dir=tmp_path / "model", config=config, shape=JobShape(nproc_per_node=1, backend="kubernetes"),
                  cluster=settings.cluster, policy=settings.launcher, log_dir=tmp_path / "logs")
    with pytest.raises(DataFileError, match=f"s3://{s3_bucket}/in/missing.parquet: not found"):
        train_kubernetes(f"s3://{s3_bucket}/in/missing.parquet", f"s3://{s3_bucket}/in/schema.yaml",
                         pipeline_run_id="run-missing", **common)
    assert cluster.jobs() == []
    result = train_kubernetes(f"s3://{s3_bucket}/in/train.parquet", f"s3://{s3_bucket}/in/schema.yaml",
                              pipeline_run_id="run-s3", **common)
    staged = cluster.shared / job_name_for("run-s3")
    assert (staged / "data.parquet").read_bytes() == demo_files["train.parquet"].read_bytes()
    assert (staged / "schema.yaml").read_bytes() == (REPO / "data" / "schema.yaml").read_bytes()
    assert result.world_size == 1 and (tmp_path / "model" / "model.json").is_file()

def _prepared(tmp_path, demo_files, model_name: str):
    """validate -> split, as the pipeline runs them; returns (schema path, train path, holdout path, sha, md5 and
    path of the validated file)."""
    from training.steps.split import split_step
    from training.steps.validate import validate_step

    schema = str(tmp_path / "schema.yaml")
    validated = validate_step(dataset_uri=str(demo_files["train.parquet"]), schema_uri="", target="churned",
                              model_name=model_name, schema_out=schema)
    train, holdout = str(tmp_path / "train.parquet"), str(tmp_path / "holdout.parquet")
    sha = split_step(dataset_uri=str(demo_files["train.parquet"]), fraction=0.2, seed=42, train_out=train,
                     holdout_out=holdout)
    return schema, train, holdout, sha, validated.data_md5, str(demo_files["train.parquet"])


FAST = {"epochs": 2, "batch_size": 512}
FAST_MODEL = {"params": {"hidden": [16]}}


def train_2x2(cluster: Cluster, isolated_env, demo_files, tmp_path, model_name: str, run_id: str, settings: dict,
              model: dict = FAST_MODEL, nproc_per_node: int = 2):
    """The pipeline's train step of a job of 2 nodes x ``nproc_per_node`` of ``model`` on ``cluster`` with
    ``settings``, the ranks reaching MLflow through the credentials Secret; (the prepared data of :func:`_prepared`,
    the model dir, the step's result)."""
    from training.steps.train import train_step

    prepared = _prepared(tmp_path, demo_files, model_name)
    _credentials_secret(cluster, isolated_env.tracking_uri)
    model_dir = tmp_path / "model"
    result = train_step(train_path=prepared[1], schema_path=prepared[0], model_name=model_name, config=FAST,
                        model=model, nnodes=2, nproc_per_node=nproc_per_node, backend="kubernetes",
                        pipeline_run_id=run_id,
                        model_dir=str(model_dir), cluster=settings)
    return prepared, model_dir, result


def register_candidate(tmp_path, prepared: tuple, model_dir: Path, run_id: str, model_name: str,
                       pipeline_run_id: str) -> str:
    """Evaluate a trained model on the holdout of ``prepared`` (:func:`_prepared`) and register it; its version."""
    from training.steps.evaluate import evaluate_step
    from training.steps.register import register_step

    schema, train, holdout, sha, md5, dataset = prepared
    report = str(tmp_path / "report.json")
    evaluate_step(model_dir=str(model_dir), holdout_path=holdout, holdout_sha256=sha, model_name=model_name,
                  policy={}, report_out=report)
    return register_step(model_dir=str(model_dir), report_path=report, schema_path=schema, run_id=run_id,
                         model_name=model_name, dataset_uri=dataset, data_md5=md5, holdout_sha256=sha,
                         pipeline_run_id=pipeline_run_id, champion_version="", holdout_fraction=0.2, split_seed=42)


def _credentials_secret(cluster, tracking_uri: str) -> None:
    """The Secret the ranks reach MLflow through, as in a cluster: never a value copied into the job."""
    from kubernetes import client

    client.CoreV1Api(cluster.api()).create_namespaced_secret("default", {
        "metadata": {"name": "kfloop-mlflow"}, "stringData": {"MLFLOW_TRACKING_URI": tracking_uri}})


def test_rendered_pytorchjob_trains_to_a_registered_candidate_with_the_operators_env(
        cluster, isolated_env, demo_files, tmp_path, capsys):
    import mlflow
    from kubernetes import client

    team_module = tmp_path / "team" / "net.py"  # the team's own module file, outside the image: staged
    team_module.parent.mkdir()
    team_module.write_bytes(source_file("training.mlp").read_bytes())
    prepared, model_dir, result = train_2x2(cluster, isolated_env, demo_files, tmp_path, "k8s-model", "run-train-1",
                                            cluster.settings(), model={**FAST_MODEL, "module": str(team_module)})

    # the ranks formed one world of 2 pods x 2 processes through the operator's env, and each one's parameters
    # are in the model description rank 0 wrote
    description = json.loads((model_dir / "model.json").read_text())
    assert description["world_size"] == 4 and len(description["param_digests"]) == 4
    staged = Path(description["model"]["module"])  # the pods imported the copy on the shared volume
    assert staged.name == "model_module.py" and staged.parent.name == job_name_for("run-train-1")
    assert staged.read_bytes() == team_module.read_bytes() == (model_dir / "model_module.py").read_bytes()
    assert mlflow.MlflowClient().get_run(result.run_id).data.params["world_size"] == "4"

    name = job_name_for("run-train-1")
    core = client.CoreV1Api(cluster.api())

    def ended_pods():  # the job succeeds on its master's exit (Training Operator v1.9 pytorchjob_controller.go
        # UpdateJobStatus); a worker may still be exiting when the step returns
        listed = core.list_namespaced_pod("default", label_selector=f"{JOB_NAME_LABEL}={name}").items
        return {p.metadata.name: p for p in listed} if all(p.status.phase != "Running" for p in listed) else None

    pods = wait_for("the job's pods to end", ended_pods)
    assert set(pods) == {f"{name}-master-0", f"{name}-worker-0"}
    # the operator's env (Training Operator v1.9 envvar.go/master.go; tests/cluster/pytorchjob_contract.py), appended
    # after the job's own: the node rank, 2 replicas x nprocPerNode "2", no elastic policy
    port = next(e.value for e in pods[f"{name}-master-0"].spec.containers[0].env if e.name == "MASTER_PORT")
    for node, pod in enumerate((pods[f"{name}-master-0"], pods[f"{name}-worker-0"])):
        (container,) = pod.spec.containers
        appended = [(e.name, e.value) for e in container.env][-10:]
        assert appended == [("PYTHONUNBUFFERED", "1"), ("MASTER_PORT", port), ("PET_MASTER_PORT", port),
                            ("MASTER_ADDR", f"{name}-master-0"), ("PET_MASTER_ADDR", f"{name}-master-0"),
                            ("WORLD_SIZE", "4"), ("RANK", str(node)), ("PET_NODE_RANK", str(node)),
                            ("PET_NPROC_PER_NODE", "2"), ("PET_NNODES", "2")]
        assert pod.status.phase == "Succeeded"
    assert [c.name for c in pods[f"{name}-worker-0"].spec.init_containers] == ["init-pytorch"]
    job = client.CustomObjectsApi(cluster.api()).get_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", name)
    assert [c["type"] for c in job["status"]["conditions"] if c["status"] == "True"] == ["Created", "Succeeded"]
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    assert isolated_env.tracking_uri not in json.dumps(job)
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert refs["MLFLOW_TRACKING_URI"] == {"name": "kfloop-mlflow", "key": "MLFLOW_TRACKING_URI", "optional": True}
    master_log = core.read_namespaced_pod_log(f"{name}-master-0", "default")
    assert "[rank 0]" in master_log and "wrote" in master_log
    assert core.read_namespaced_pod_log(f"{name}-master-0", "default", tail_lines=2) == "".join(
        master_log.splitlines(keepends=True)[-2:])
    assert (isolated_env.workdir / "logs" / "run-train-1" / "master.log").read_text() == master_log  # the step's copy

    version = register_candidate(tmp_path, prepared, model_dir, result.run_id, "k8s-model", "run-train-1")
    registered = mlflow.MlflowClient().get_model_version("k8s-model", version)
    assert registered.run_id == result.run_id

    # the dry run is the launch: `kfloop render-job --run-id` prints the very body the launcher POSTed
    (posted,) = [raw for method, path, raw in cluster.server.received
                 if method == "POST" and path.endswith("/pytorchjobs")]
    config = tmp_path / "kfloop.yaml"
    config.write_text(yaml.safe_dump({"training": {**FAST, "nnodes": 2, "nproc_per_node": 2}, "model": FAST_MODEL,
                                      "cluster": cluster.settings()}))
    capsys.readouterr()
    assert main(["render-job", "--run-id", "run-train-1", "--config", str(config)]) == 0
    assert capsys.readouterr().out == yaml.safe_dump(json.loads(posted), sort_keys=False)


def test_a_failing_job_fails_the_step_with_the_masters_last_log_lines(cluster, isolated_env, demo_files, tmp_path):
    import mlflow

    from training.steps.train import train_step
    from data.tables import read_table
    from data.validation import infer_schema, schema_to_yaml

    schema = tmp_path / "schema.yaml"
    schema.write_text(schema_to_yaml(infer_schema(read_table(demo_files["train.parquet"]), target="churned",
                                                  id_columns=["customer_id"])))
    with pytest.raises(LaunchError) as failed:  # a model the builder refuses fails every rank
        train_step(train_path=str(demo_files["train.parquet"]), schema_path=str(schema), model_name="k8s-fail",
                   config=FAST, model={"params": {"hidden": [0]}}, nnodes=1, nproc_per_node=1, backend="kubernetes",
                   pipeline_run_id="run-fail", model_dir=str(tmp_path / "model"), cluster=cluster.settings())
    message = str(failed.value)
    name = job_name_for("run-fail")
    assert f"PyTorchJob default/{name}: PyTorchJobFailed" in message
    assert f"last log lines of {name}-master-0" in message
    assert "model.params.hidden=[0]: give one or more layer widths" in message  # the rank's own error, from its log
    runs = mlflow.search_runs(experiment_names=["k8s-fail"], output_format="list")
    assert [r.info.status for r in runs] == ["FAILED"]
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("restart_policy", ["ExitCode", "OnFailure"])
def test_a_pod_that_exits_137_forever_is_stopped_at_the_launchers_cap(restart_policy, cluster, tmp_path):
    """ExitCode: the operator recreates the pod (job Restarting); OnFailure: the kubelet restarts the container in
    place (restartCount, CrashLoopBackOff). Neither stops by itself for exit code 137."""
    name = f"kill-loop-{restart_policy.lower()}"
    cluster.server.killed_pods[f"{name}-worker-0"] = "Error"
    body = _job_body(cluster, name)
    body["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = restart_policy
    policy = LaunchPolicy(kubeconfig=str(cluster.kubeconfig), restart_cap=2, poll_seconds=0.5)
    with pytest.raises(LaunchError) as stopped:
        JobRun(cluster.api(), body, policy=policy, log_path=tmp_path / "master.log", timeout=120).run()
    message = str(stopped.value)
    assert "restarted 3 times, over the launcher's cap of 2" in message
    assert f"last log lines of {name}-worker-0" in message
    assert (stopped.value.node, stopped.value.node_exit_code) == (1, 137)
    assert cluster.jobs() == []  # the launcher deleted the job: the operator would have retried forever


@pytest.mark.parametrize("fault, expected", [
    ("unschedulable", ["Unschedulable for over 1 s", "Insufficient nvidia.com/gpu", "event FailedScheduling"]),
    ("image", ["ImagePullBackOff", 'Back-off pulling image "kfloop:missing"']),
    ("oom", ["was OOMKilled (exit code 137): raise cluster.memory"]),
])
def test_pod_problems_fail_with_one_clear_error_and_delete_the_job(fault, expected, cluster, tmp_path):
    name = f"problem-{fault}"
    overrides = {}
    if fault == "unschedulable":
        overrides = {"gpus_per_node": 8}  # the test node has no GPUs
    elif fault == "image":
        overrides = {"image": "kfloop:missing"}
        cluster.server.unpullable_images.add("kfloop:missing")
    else:
        cluster.server.killed_pods[f"{name}-master-0"] = "OOMKilled"
    policy = LaunchPolicy(kubeconfig=str(cluster.kubeconfig), unschedulable_timeout_seconds=1, poll_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(LaunchError) as failed:
        JobRun(cluster.api(), _job_body(cluster, name, **overrides), policy=policy, log_path=tmp_path / "m.log",
               timeout=120).run()
    for text in expected:
        assert text in str(failed.value)
    if fault == "unschedulable":
        assert time.monotonic() - started >= 1
    assert cluster.jobs() == []


def test_preflight_fails_fast_when_the_bandwidth_is_below_the_floor(cluster, tmp_path):
    settings = KubernetesSettings.from_dict({**cluster.settings(), "launcher": {
        "kubeconfig": str(cluster.kubeconfig), "poll_seconds": 0.5, "preflight_min_busbw_gbps": 1e6}})
    with pytest.raises(LaunchError) as failed:
        preflight(TrainingConfig(), JobShape(nnodes=1, nproc_per_node=2), settings.cluster, settings.launcher,
                  pipeline_run_id="run-preflight", log_dir=tmp_path)
    message = str(failed.value)
    assert f"PyTorchJob default/{job_name_for('run-preflight/preflight')}: PyTorchJobFailed" in message
    assert "preflight failed: all_reduce busbw" in message and "below" in message


# ------------------------------------------------------------------------------------------------ cancel and retry

_LAUNCH_STEP = """
import json, sys
from data.settings import activate, load_environment
from training.steps.train import train_step
args = json.loads(sys.argv[1])
activate(load_environment())
train_step(**args)
"""


def _launch_step(cluster: Cluster, args: dict, tmp_path: Path) -> subprocess.Popen:
    """The pipeline's launch step in its own process, as KFP runs it."""
    log = (tmp_path / "launch-step.log").open("ab")
    return subprocess.Popen([sys.executable, "-c", _LAUNCH_STEP, json.dumps(args)], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, env=os.environ.copy())


def kfloop_train_forever(settings: dict, demo_files, tmp_path: Path) -> subprocess.Popen:
    """`kfloop train --backend kubernetes` of a 1 x 1 job that would train for a long time, with ``settings`` as
    ``--set cluster.*``; its output goes to ``tmp_path/kfloop-train.log``."""
    schema, train, *_ = _prepared(tmp_path, demo_files, "k8s-cancel")
    overrides = [f"cluster.{key}={value}" for key, value in settings.items() if key != "launcher"]
    overrides += [f"cluster.launcher.{key}={value}" for key, value in settings["launcher"].items()]
    log = (tmp_path / "kfloop-train.log").open("wb")
    return subprocess.Popen([str(Path(sys.executable).parent / "kfloop"), "train", "--data", train, "--schema", schema,
                             "--backend", "kubernetes", "--nnodes", "1", "--nproc-per-node", "1",
                             "--set", "training.epochs=500", *[a for o in overrides for a in ("--set", o)]],
                            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)


def test_kfloop_train_on_kubernetes_deletes_its_job_when_cancelled(cluster, isolated_env, demo_files, tmp_path):
    from kubernetes import client

    step = kfloop_train_forever(cluster.settings(), demo_files, tmp_path)
    core = client.CoreV1Api(cluster.api())

    def master_running() -> str:
        jobs = cluster.jobs()
        if not jobs:
            return ""
        name = jobs[0]["metadata"]["name"]
        pods = core.list_namespaced_pod("default", label_selector=f"{JOB_NAME_LABEL}={name}").items
        return name if [p.status.phase for p in pods] == ["Running"] else ""

    name = wait_for("the job's master pod to run", master_running, timeout=120)
    step.send_signal(signal.SIGTERM)
    assert step.wait(timeout=60) != 0
    assert cluster.jobs() == []
    assert core.list_namespaced_pod("default", label_selector=f"{JOB_NAME_LABEL}={name}").items == []
    assert f"deleted PyTorchJob default/{name}" in (tmp_path / "kfloop-train.log").read_text()


def test_a_retried_launch_step_attaches_to_the_job_its_killed_attempt_created(cluster, isolated_env, demo_files,
                                                                               tmp_path):
    """Issue 7 item 5: kill the launch step right after it created the job, retry: one job, attached."""
    import mlflow

    from training.steps.train import train_step

    schema, train, *_ = _prepared(tmp_path, demo_files, "k8s-retry")
    _credentials_secret(cluster, isolated_env.tracking_uri)
    args = dict(train_path=train, schema_path=schema, model_name="k8s-retry", config={**FAST, "epochs": 1}, model=FAST_MODEL,
                nnodes=1, nproc_per_node=1, backend="kubernetes", pipeline_run_id="run-retry",
                model_dir=str(tmp_path / "model"), cluster=cluster.settings())
    step = _launch_step(cluster, args, tmp_path)
    wait_for("the job to be created", cluster.jobs, timeout=120)
    step.kill()
    step.wait(timeout=30)

    result = train_step(**args)
    creates = [r for r in cluster.server.requests if r.startswith("POST /apis/kubeflow.org/v1/")]
    assert [r.rsplit(" ", 1)[-1] for r in creates] == ["201", "409"]
    assert [j["metadata"]["name"] for j in cluster.jobs()] == [job_name_for("run-retry")]
    runs = mlflow.search_runs(experiment_names=["k8s-retry"], output_format="list")
    assert [(r.info.run_id, r.info.status) for r in runs] == [(result.run_id, "FINISHED")]
    assert json.loads((tmp_path / "model" / "model.json").read_text())["world_size"] == 1


# ------------------------------------------------------------------------------------------------ RBAC, Pod Security

def _deploy_roles() -> list[dict]:
    """deploy/rbac.yaml's Roles (kfloop's own and the upstream pipeline-runner rules)."""
    docs = yaml.safe_load_all((REPO / "deploy" / "rbac.yaml").read_text())
    return [d for d in docs if d and d["kind"] == "Role"]


def _as_service_account(cluster: Cluster, tmp_path: Path, roles: list[dict]) -> LaunchPolicy:
    """A launch policy whose kubeconfig is service account ``kfloop`` in ``default``, granted ``roles``."""
    from cluster.k8s_rbac import service_account_user
    from cluster.kubernetes_cluster import grant

    for role in roles:
        grant(cluster.api(), "default", "kfloop", role)
    kubeconfig = cluster.server.write_kubeconfig(tmp_path / "kfloop-sa", user=service_account_user("default", "kfloop"))
    return LaunchPolicy(kubeconfig=str(kubeconfig), poll_seconds=0.5)


def _quick(body: dict) -> dict:
    for rspec in body["spec"]["pytorchReplicaSpecs"].values():
        rspec["template"]["spec"]["containers"][0]["command"] = [sys.executable, "-c", "pass"]
    return body


def test_the_launcher_works_with_the_deployed_roles_and_a_missing_verb_is_403(cluster, tmp_path):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    policy = _as_service_account(cluster, tmp_path, _deploy_roles())
    job = JobRun(cluster.api(Path(policy.kubeconfig)), _quick(_job_body(cluster, "as-runner", nnodes=1)),
                 policy=policy, log_path=tmp_path / "m.log", timeout=120).run()
    assert [c["type"] for c in job["status"]["conditions"] if c["status"] == "True"] == ["Created", "Succeeded"]

    rbac = client.RbacAuthorizationV1Api(cluster.api())
    (kfloop,) = [r for r in _deploy_roles() if r["metadata"]["name"] == "kfloop"]
    for rule in kfloop["rules"]:  # the upstream pipeline-runner rules grant no events
        if "events" in rule["resources"]:
            rule["verbs"].remove("list")
    rbac.replace_namespaced_role("kfloop", "default", {**kfloop, "metadata": {"name": "kfloop",
                                                                              "namespace": "default"}})
    with pytest.raises(ApiException) as refused:
        JobRun(cluster.api(Path(policy.kubeconfig)), _quick(_job_body(cluster, "no-watch", nnodes=1)),
               policy=policy, log_path=tmp_path / "m2.log", timeout=120).run()
    assert refused.value.status == 403
    assert json.loads(refused.value.body)["message"] == (
        'events is forbidden: User "system:serviceaccount:default:kfloop" cannot list resource "events" in API group '
        '"" in the namespace "default"')
    assert [j["metadata"]["name"] for j in cluster.jobs()] == ["as-runner"]  # the launcher deleted its job


def test_a_gpu_job_runs_the_cuda_build_of_the_steps_image_and_gpus_on_a_cpu_build_are_refused(cluster, tmp_path,
                                                                                              monkeypatch):
    own = "registry.example.com/team/kfloop:abc123"
    monkeypatch.setenv("KFLOOP_IMAGE", own)  # a compiled step's own image, of the CPU build
    monkeypatch.setenv("KFLOOP_TORCH_BUILD", "cpu")
    settings = {k: v for k, v in cluster.settings().items() if k != "image"}

    def picked(**overrides) -> KubernetesSettings:
        return KubernetesSettings.from_dict({**settings, **overrides})

    assert picked().cluster.image == own
    assert picked(gpus_per_node=1).cluster.image == f"{own}-cuda"  # ci.yaml's tag of the commit's CUDA build
    check_image_build(picked(gpus_per_node=1).cluster)
    check_image_build(picked(gpus_per_node=1, image="elsewhere/trainer:1").cluster)  # a build not known here
    amd = picked(gpus_per_node=1, gpu_vendor="amd")
    assert amd.cluster.image == own  # no ROCm build is published: the step's image, refused below
    explicit = picked(gpus_per_node=1, image=own)
    for refused in (amd, explicit):
        with pytest.raises(ValueError) as error:
            train_kubernetes(tmp_path / "train.parquet", tmp_path / "schema.yaml", model_dir=tmp_path / "model",
                             config=TrainingConfig(), shape=JobShape(nnodes=1, nproc_per_node=1, backend="kubernetes"),
                             cluster=refused.cluster, policy=refused.launcher, pipeline_run_id="gpu-on-cpu",
                             log_dir=tmp_path / "logs")
        assert str(error.value).startswith(f"cluster.image {own} is torch's CPU build (io.kfloop.torch-build=cpu) "
                                           "but the job asks for GPUs")
        assert f"run its CUDA build {own}-cuda (io.kfloop.torch-build=cuda" in str(error.value)
    assert cluster.jobs() == []


def _claim_with_modes(cluster: Cluster, modes: list[str]) -> None:
    """As the admin: the shared claim replaced by one with ``modes`` (a bound claim's spec is immutable)."""
    from kubernetes import client

    from cluster.kubernetes_cluster import CLAIM

    core = client.CoreV1Api(cluster.api())
    core.delete_namespaced_persistent_volume_claim(CLAIM, "default")
    core.create_namespaced_persistent_volume_claim("default", {"metadata": {"name": CLAIM}, "spec": {
        "accessModes": modes, "resources": {"requests": {"storage": "1Gi"}}}})


def test_a_job_of_several_pods_on_a_claim_that_is_not_readwritemany_is_refused_before_anything_starts(cluster,
                                                                                                     tmp_path):
    _claim_with_modes(cluster, ["ReadWriteOnce"])
    settings = KubernetesSettings.from_dict(cluster.settings())
    with pytest.raises(ValueError) as refused:
        train_kubernetes(tmp_path / "train.parquet", tmp_path / "schema.yaml", model_dir=tmp_path / "model",
                         config=TrainingConfig(), shape=JobShape(nnodes=2, nproc_per_node=1, backend="kubernetes"),
                         cluster=settings.cluster, policy=settings.launcher, pipeline_run_id="rwo-run",
                         log_dir=tmp_path / "logs")
    assert str(refused.value).startswith("persistentvolumeclaim default/kfloop-shared has accessModes "
                                         "['ReadWriteOnce'], but the job's 2 pods mount it from several nodes")
    assert cluster.jobs() == [] and list(cluster.shared.iterdir()) == []  # nothing created, nothing staged


def test_a_claim_the_launcher_cannot_read_goes_unchecked_with_a_log_line(cluster, tmp_path, capsys):
    from cluster.kubernetes_cluster import CLAIM

    check_shared_claim(cluster.api(), "default", CLAIM, 2)  # the test cluster's claims are ReadWriteMany
    check_shared_claim(cluster.api(), "default", "elsewhere", 3)
    blind = _as_service_account(cluster, tmp_path, [{"metadata": {"name": "jobs-only"}, "rules": [
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["create"]}]}])
    _claim_with_modes(cluster, ["ReadWriteOnce"])
    check_shared_claim(cluster.api(Path(blind.kubeconfig)), "default", CLAIM, 2)
    check_shared_claim(cluster.api(), "default", CLAIM, 1)  # one pod: any mode will do
    assert capsys.readouterr().err.splitlines() == [
        "[kfloop] kubernetes: cannot read persistentvolumeclaim default/elsewhere (404 Not Found): its access modes are not "
        "checked; the job's 3 pods need it ReadWriteMany",
        f"[kfloop] kubernetes: cannot read persistentvolumeclaim default/{CLAIM} (403 Forbidden): its access modes are not "
        "checked; the job's 2 pods need it ReadWriteMany"]


@pytest.mark.parametrize("nnodes, rdma", [(1, False), (2, False), (1, True)])
def test_a_restricted_namespace_admits_kfloops_pods_and_the_launcher_names_what_it_refuses(
        nnodes, rdma, cluster, tmp_path):
    """kfloop's own pods meet the restricted profile; the operator's init-pytorch (Worker pods) and RDMA's IPC_LOCK
    do not, and the launcher says so at once instead of waiting out its timeout."""
    from kubernetes import client

    from cluster.pod_security import ENFORCE_LABEL

    client.CoreV1Api(cluster.api()).patch_namespace("default", {"metadata": {"labels": {
        ENFORCE_LABEL: "restricted"}}})
    overrides = {"gpus_per_node": 1, "rdma_resource": "rdma/rdma_shared_device_a"} if rdma else {}
    body = _quick(_job_body(cluster, f"restricted-{nnodes}-{rdma}".lower(), nnodes=nnodes, **overrides))
    run = JobRun(cluster.api(), body, policy=LaunchPolicy(kubeconfig=str(cluster.kubeconfig), poll_seconds=0.5),
                 log_path=tmp_path / "m.log", timeout=120)
    if nnodes == 1 and not rdma:
        run.run()
        return
    started = time.monotonic()
    with pytest.raises(LaunchError) as refused:
        run.run()
    message = str(refused.value)
    assert "the operator cannot create its pods: Error creating: pods" in message
    assert 'violates PodSecurity "restricted:latest"' in message
    if rdma:
        assert '"IPC_LOCK"' in message and "pod-security.kubernetes.io/enforce=privileged" in message
    else:
        assert '"init-pytorch"' in message and "--pytorch-init-container-template-file" in message
    assert time.monotonic() - started < 60 and cluster.jobs() == []


def test_with_the_deployed_init_template_workers_run_restricted_and_guaranteed(cluster, tmp_path):
    """deploy/operator-restricted-init.yaml, given to the operator, makes a 2-node job admissible in a restricted
    namespace, and with numa_aligned every pod Guaranteed QoS (the init container's requests equal its limits)."""
    from kubernetes import client

    from cluster.pod_security import ENFORCE_LABEL

    (config_map,) = [d for d in yaml.safe_load_all((REPO / "deploy" / "operator-restricted-init.yaml").read_text()) if d]
    cluster.server.pytorch_init_container_template = config_map["data"]["initContainer.yaml"]
    core = client.CoreV1Api(cluster.api())
    core.patch_namespace("default", {"metadata": {"labels": {ENFORCE_LABEL: "restricted"}}})
    with pytest.warns(UserWarning, match="deploy/operator-restricted-init.yaml"):
        body = _quick(_job_body(cluster, "restricted-numa", nnodes=2, numa_aligned=True))
    JobRun(cluster.api(), body, policy=LaunchPolicy(kubeconfig=str(cluster.kubeconfig), poll_seconds=0.5),
           log_path=tmp_path / "m.log", timeout=120).run()
    pods = core.list_namespaced_pod("default", label_selector=f"{JOB_NAME_LABEL}=restricted-numa").items
    assert {p.metadata.name: p.status.qos_class for p in pods} == {"restricted-numa-master-0": "Guaranteed",
                                                                   "restricted-numa-worker-0": "Guaranteed"}
    (worker,) = [p for p in pods if p.metadata.name.endswith("worker-0")]
    assert [c.name for c in worker.spec.init_containers] == ["init-pytorch"]


def test_an_elastic_job_meets_at_its_rendered_rendezvous_endpoint(cluster, tmp_path):
    """elasticPolicy's rdzvHost/rdzvPort reach torchrun as the operator's PET_RDZV_ENDPOINT (with PET_NNODES
    min:max): both nodes of a 2..3 elastic job rendezvous there and run one collective benchmark together."""
    from kubernetes import client

    from training.launch.jobspec import JobSpec

    settings = KubernetesSettings.from_dict({**cluster.settings(), "elastic_min_nodes": 2, "elastic_max_nodes": 3})
    spec = JobSpec(name="elastic-rdzv", nnodes=2, module="training.collectives", rdzv_timeout_seconds=60,
                   args=["--max-bytes", "1K", "--warmup", "0", "--iters", "1", "--ops", "all_reduce",
                         "--json", str(cluster.shared / "elastic.json")])
    body = render_pytorchjob(spec, settings.cluster)
    JobRun(cluster.api(), body, policy=settings.launcher, log_path=tmp_path / "m.log", timeout=180,
           artifact=cluster.shared / "elastic.json").run()
    assert json.loads((cluster.shared / "elastic.json").read_text())["world_size"] == 2
    pod = client.CoreV1Api(cluster.api()).read_namespaced_pod("elastic-rdzv-worker-0", "default")
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    port = next(p.container_port for p in pod.spec.containers[0].ports if p.name == "pytorchjob-port")
    assert (env["PET_RDZV_ENDPOINT"], env["PET_NNODES"]) == (f"elastic-rdzv-master-0:{port}", "2:3")
