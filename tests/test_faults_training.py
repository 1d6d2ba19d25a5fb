"""Faults injected into real torchrun launches: a killed rank, a rank failing on every attempt, a node that never
joins the rendezvous, a rank that stalls before a collective, a resume on another world size, and a killed Worker
pod of a PyTorchJob on the Kubernetes test server.

Faults come from outside, as they do in production: the test finds the process by its environment in ``/proc``
and sends it SIGKILL or SIGSTOP, or breaks the disk path the job writes to. Nothing in kfloop knows it is tested.
"""
from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch
from kubernetes import client
from safetensors.torch import load_file

from polling import wait_for as _poll
from test_training import write_training_files
from training import checkpoints
from training.config import JobShape, TrainingConfig
from training.launch.kubernetes import KubernetesSettings, train_kubernetes
from training.launch.local import LaunchError, train_local
from training.launch.manifests import job_name_for
from training.model import WEIGHTS_FILE
from training.train import RESTARTS_TAG

pytestmark = pytest.mark.chaos

TINY = TrainingConfig(epochs=6, batch_size=64, model={"params": {"hidden": [16], "dropout": 0.1}})
ONE_NODE = JobShape(nnodes=1, nproc_per_node=2)
DEADLINE_S = 240


def wait_for(what: str, check):
    """Poll often: a fault must land while the run is still in the middle of what was waited for."""
    return _poll(what, check, timeout=DEADLINE_S, interval=0.005)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> SimpleNamespace:
    """12000 rows: about 80 optimizer steps per epoch and rank, so a fault lands mid-run."""
    return write_training_files(tmp_path_factory.mktemp("faults-data"), 12000, seed=3)


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _processes(marker: str, **env: str) -> list[int]:
    """Pids whose environment mentions ``marker`` (a test's own path) and holds every ``env`` pair."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            environ = _environ(int(entry.name))
            if any(marker in v for v in environ.values()) and all(environ.get(k) == v for k, v in env.items()):
                found.append(int(entry.name))
    return found


def _worker(log_dir: Path, local_rank: int, node: int = 0) -> int:
    """The pid of one training process of a launch writing to ``log_dir`` (workers inherit the agent's env)."""
    pids = wait_for(f"worker {local_rank} of node {node}", lambda: _processes(
        str(log_dir), PET_NODE_RANK=str(node), LOCAL_RANK=str(local_rank), TORCHELASTIC_RESTART_COUNT="0"))
    assert len(pids) == 1, pids
    return pids[0]


def _launch_in_thread(pool: ThreadPoolExecutor, files, root: Path, config: TrainingConfig, shape: JobShape = ONE_NODE,
                      **kwargs):
    return pool.submit(train_local, files.data, files.schema, model_dir=root / "model", checkpoint_dir=root / "ckpt",
                       config=config, shape=shape, log_dir=root / "logs", **kwargs)


def test_a_killed_rank_restarts_every_rank_and_resumes_to_the_planned_step(tmp_path, files):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("faults", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id

    ref = tmp_path / "ref"
    uninterrupted = train_local(files.data, files.schema, model_dir=ref / "model", checkpoint_dir=ref / "ckpt",
                                config=TINY, shape=ONE_NODE, log_dir=ref / "logs")
    final_step = checkpoints.committed_steps(ref / "ckpt")[-1]
    steps_per_epoch = final_step // TINY.epochs

    root = tmp_path / "chaos"
    with ThreadPoolExecutor(1) as pool:
        launch = _launch_in_thread(pool, files, root, TINY, replace(ONE_NODE, max_restarts=1), mlflow_run_id=run_id,
                                   mlflow_tracking_uri=uri)
        victim = _worker(root / "logs", local_rank=1)
        committed = wait_for("the first checkpoint", lambda: checkpoints.committed_steps(root / "ckpt"))
        os.kill(victim, signal.SIGKILL)
        result = launch.result(timeout=DEADLINE_S)
    assert committed[-1] < final_step, "the kill must land before the last epoch"

    log = (root / "logs" / "node-0.log").read_text()
    resumed_at = int(log.split("resuming from checkpoint step ")[1].split()[0])
    assert steps_per_epoch <= resumed_at < final_step and resumed_at % steps_per_epoch == 0
    attempts = sorted((root / "logs" / "torchrun" / "node-0").glob("*/attempt_*/*"))
    assert sorted(f"{p.parent.name}/{p.name}" for p in attempts) == [
        "attempt_0/0", "attempt_0/1", "attempt_1/0", "attempt_1/1"], "both ranks ran again"
    assert checkpoints.committed_steps(root / "ckpt")[-1] == final_step

    ours, theirs = load_file(result.model_dir / WEIGHTS_FILE), load_file(uninterrupted.model_dir / WEIGHTS_FILE)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs), "model, optimizer, scheduler, RNG, sampler resumed"
    assert result.metrics == uninterrupted.metrics

    runs = client.search_runs([experiment])
    assert [r.info.run_id for r in runs] == [run_id], "one MLflow run for all attempts"
    assert runs[0].data.tags[RESTARTS_TAG] == "1"
    history = client.get_metric_history(run_id, "val_accuracy")
    assert {m.step for m in history} == set(range(1, TINY.epochs + 1))


def test_a_rank_failing_on_every_attempt_fails_the_run_and_registers_nothing(tmp_path, isolated_env, capsys,
                                                                              demo_files):
    from data.errors import EXIT_FAILED
    from pipelines.cli.commands import main

    (isolated_env.workdir / "checkpoints").write_text("a file where rank 0 must create its checkpoint directory")
    capsys.readouterr()
    code = main(["--workdir", str(isolated_env.workdir), "run", "training", "--local", "--json",
                 "--set", f"dataset_uri={demo_files['train.parquet']}", "--set", "target=churned",
                 "--set", "model_name=always-fails", "--set", "training.epochs=2",
                 "--set", "training.max_restarts=1", "--set", "training.nproc_per_node=2"])
    err = capsys.readouterr().err
    assert code == EXIT_FAILED, err
    assert "training failed on rank 0 (node 0)" in err and "NotADirectoryError" in err, err

    client = mlflow.MlflowClient()
    [run] = client.search_runs([client.get_experiment_by_name("always-fails").experiment_id])
    assert run.info.status == "FAILED"
    logged = [a.path for a in client.list_artifacts(run.info.run_id, "training-failure")]
    assert "training-failure/node-0.error.json" in logged, logged
    error_file = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                                     artifact_path="training-failure/node-0.error.json",
                                                     dst_path=str(tmp_path / "dl"))
    assert "NotADirectoryError" in Path(error_file).read_text()
    attempts = {p.name for p in (isolated_env.workdir / "logs").glob("*/torchrun/node-0/*/attempt_*")}
    assert attempts == {"attempt_0", "attempt_1"}, "it failed on every attempt"
    assert client.search_registered_models() == [], "nothing registered, so no champion either"


def test_a_node_that_never_joins_fails_the_rendezvous_in_time_and_leaves_no_process(tmp_path, files):
    shape = JobShape(nnodes=2, nproc_per_node=1, rdzv_timeout_seconds=5)
    with ThreadPoolExecutor(1) as pool:
        launch = _launch_in_thread(pool, files, tmp_path, TINY, shape)
        [late] = wait_for("node 1's agent", lambda: _processes(str(tmp_path / "logs"), PET_NODE_RANK="1"))
        os.kill(late, signal.SIGSTOP)  # a pod that never gets to run
        stopped = time.monotonic()
        with pytest.raises(LaunchError) as failed:
            launch.result(timeout=DEADLINE_S)
        took = time.monotonic() - stopped
    assert failed.value.node == 0 and "1/2 clients joined" in str(failed.value), failed.value
    assert took < shape.rdzv_timeout_seconds + 45, f"failed after {took:.0f} s"
    assert _processes(str(tmp_path / "logs")) == [], "no process of the launch is left"


def test_a_rank_stalled_before_a_collective_fails_the_job_within_the_timeout(tmp_path, files):
    config = replace(TINY, epochs=40, collective_timeout_seconds=5)
    with ThreadPoolExecutor(1) as pool:
        launch = _launch_in_thread(pool, files, tmp_path, config)
        stalled = _worker(tmp_path / "logs", local_rank=1)
        wait_for("the first checkpoint", lambda: checkpoints.committed_steps(tmp_path / "ckpt"))
        os.kill(stalled, signal.SIGSTOP)
        since = time.monotonic()
        with pytest.raises(LaunchError) as failed:
            launch.result(timeout=DEADLINE_S)
        took = time.monotonic() - since
    assert failed.value.rank == 0 and "timed out" in str(failed.value).lower(), failed.value
    assert took < config.collective_timeout_seconds + 60, f"failed after {took:.0f} s"
    assert not (tmp_path / "model" / "model.json").exists()
    assert _processes(str(tmp_path / "logs")) == [], "no process of the launch is left"


def test_resuming_four_ranks_checkpoint_on_two_ranks_works(tmp_path, files):
    ckpt = tmp_path / "ckpt"
    train_local(files.data, files.schema, model_dir=tmp_path / "m4", checkpoint_dir=ckpt,
                config=replace(TINY, epochs=2), shape=JobShape(nnodes=2, nproc_per_node=2), log_dir=tmp_path / "logs4")
    saved = checkpoints.committed_steps(ckpt)[-1]
    assert len(checkpoints.read_sidecar(ckpt, saved)["state"]["rng"]) == 4

    two = train_local(files.data, files.schema, model_dir=tmp_path / "m2", checkpoint_dir=ckpt,
                      config=replace(TINY, epochs=3), shape=ONE_NODE, log_dir=tmp_path / "logs2")
    log = (tmp_path / "logs2" / "node-0.log").read_text()
    assert f"resuming from checkpoint step {saved} (epoch 2)" in log
    assert "checkpoint has RNG states of 4 ranks, this run has 2: reseeding" in log
    assert "epoch 1/3" not in log and "epoch 3/3" in log
    assert two.world_size == 2 and json.loads((tmp_path / "m2" / "model.json").read_text())["world_size"] == 2
    assert checkpoints.committed_steps(ckpt)[-1] > saved


def _kill_pod(marker: str, pod: str) -> None:
    """SIGKILL every process of ``pod``, as a container kill does: its torchrun agent first (it would restart its
    workers), then the workers."""
    wait_for(f"the worker of {pod}", lambda: _processes(marker, HOSTNAME=pod, LOCAL_RANK="0"))
    for pid in sorted(_processes(marker, HOSTNAME=pod), key=lambda p: "LOCAL_RANK" in _environ(p)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_killed_worker_pod_is_recreated_and_the_job_resumes_from_its_checkpoint(tmp_path, files, cluster):
    """A container kill of the Worker pod mid-epoch: the operator recreates the pod (``restartPolicy: ExitCode``,
    exit code 137), the master's torchrun restarts its rank, and both ranks meet again well before the collective
    timeout although the new pod's torchrun counts its restarts from 0."""
    settings = KubernetesSettings.from_dict(cluster.settings())
    config = replace(TINY, collective_timeout_seconds=120)
    name = job_name_for("run-pod-kill")
    ckpt = cluster.shared / name / "checkpoints"
    with ThreadPoolExecutor(1) as pool:
        launch = pool.submit(train_kubernetes, files.data, files.schema, model_dir=tmp_path / "model", config=config,
                             shape=JobShape(nnodes=2, nproc_per_node=1, max_restarts=1, backend="kubernetes"),
                             cluster=settings.cluster, policy=settings.launcher, pipeline_run_id="run-pod-kill",
                             log_dir=tmp_path / "logs")
        committed = wait_for("the first checkpoint", lambda: checkpoints.committed_steps(ckpt))
        _kill_pod(str(tmp_path), f"{name}-worker-0")
        killed = time.monotonic()
        result = launch.result(timeout=DEADLINE_S)
    took = time.monotonic() - killed
    steps_per_epoch = committed[0]
    final_step = steps_per_epoch * config.epochs
    assert committed[-1] < final_step, "the kill must land before the last epoch"
    assert took < config.collective_timeout_seconds, f"the ranks met again only after {took:.0f} s"

    events = client.CoreV1Api(cluster.api()).list_namespaced_event("default").items
    created = [e.message for e in events if e.reason == "SuccessfulCreatePod"]
    assert sorted(created) == [f"Created pod: {name}-master-0"] + [f"Created pod: {name}-worker-0"] * 2
    assert [e.message for e in events if e.reason == "ExitedWithCode"] == [
        f"Pod: default.{name}-worker-0 exited with code 137"]

    log = (tmp_path / "logs" / "master.log").read_text()
    resumed_at = int(log.split("resuming from checkpoint step ")[1].split()[0])
    assert steps_per_epoch <= resumed_at < final_step and resumed_at % steps_per_epoch == 0
    assert log.count(f"epoch 1/{config.epochs} ") == 1, "epoch 1 ran once"
    assert checkpoints.committed_steps(ckpt)[-1] == final_step
    assert result.world_size == 2 and (tmp_path / "model" / "model.json").is_file()
