"""``backend: ray``: Ray Train V2's TorchTrainer around the training code, on a real local Ray cluster (a head started
with ``ray start`` for this module, joined through ``training.ray_address``): the same model as torchrun's, a killed
worker survived through ``FailureConfig`` and the checkpoint, a failing worker's error in our LaunchError.

Faults come from outside, as in test_faults_training.py: the test finds the Ray Train worker in ``/proc`` (its
process title and the ``KFLOOP_HOME`` the driver hands every worker) and sends it SIGKILL.
"""
from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch
from safetensors.torch import load_file

from pipelines.cli import main
from polling import wait_for
from test_faults_training import _environ
from test_training import write_training_files
from training.config import JobShape, TrainingConfig
from training.launch.backends import backend_named
from training.launch.local import LaunchError, train_local
from training.launch.ray import DRIVER_LOG
from training.model import WEIGHTS_FILE

TINY = TrainingConfig(epochs=4, batch_size=64, model={"params": {"hidden": [16], "dropout": 0.1}})
DEADLINE_S = 300


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> SimpleNamespace:
    """6000 rows: enough steps per epoch that a kill lands mid-run."""
    return write_training_files(tmp_path_factory.mktemp("ray-data"), 6000, seed=3)


def _launch(root: Path, files, shape: JobShape, config: TrainingConfig = TINY):
    return backend_named("ray").launch(config, shape, str(files.data), str(files.schema), model_dir=root / "model",
                                       checkpoint_dir=root / "ckpt", log_dir=root / "logs", run_name="ray-test")


def _reported(storage: Path) -> list[Path]:
    """The checkpoints Ray keeps for the run (folders ``checkpoint_<time>`` under its storage path)."""
    return sorted(p for p in (storage / "ray-test").glob("checkpoint_*") if p.is_dir())


def registered_checkpoints(run_dir: Path) -> list[str]:
    """Checkpoints Ray Train's controller has registered for the run whose folder under the storage path is
    ``run_dir`` (the ones a restarted group resumes from): its snapshot."""
    try:
        snapshot = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or being replaced
        return []
    return [r["checkpoint_dir_name"] for r in snapshot["checkpoint_results"]]


def _train_workers(marker: str) -> list[int]:
    """Pids of Ray Train workers whose environment carries ``marker`` (this test's KFLOOP_HOME)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                title = Path(f"/proc/{entry.name}/cmdline").read_bytes().decode(errors="replace")
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            if "RayTrainWorker" in title and _environ(int(entry.name)).get("KFLOOP_HOME") == marker:
                found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, files, ray_head) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("ray-run")
    shape = JobShape(nnodes=1, nproc_per_node=2, backend="ray", ray_address=ray_head)
    return SimpleNamespace(result=_launch(root, files, shape), root=root, shape=shape)


@pytest.mark.timeout(900)
def test_ray_train_trains_the_model_torchrun_trains(tmp_path, files, uninterrupted):
    torchrun = train_local(files.data, files.schema, model_dir=tmp_path / "model", checkpoint_dir=tmp_path / "ckpt",
                           config=TINY, shape=JobShape(nnodes=1, nproc_per_node=2), log_dir=tmp_path / "logs")
    ray_result = uninterrupted.result
    assert ray_result.world_size == torchrun.world_size == 2
    print(f"\nRay Train {ray_result.metrics}, torchrun {torchrun.metrics}")
    for name in ("val_accuracy", "val_loss"):
        assert ray_result.metrics[name] == pytest.approx(torchrun.metrics[name], abs=0.02), name
    log = (uninterrupted.root / "logs" / DRIVER_LOG).read_text()
    assert log.count("Started training worker group of size 2") == 1
    reported = _reported(uninterrupted.root / "ckpt")
    assert 1 <= len(reported) <= TINY.checkpoint_keep, "Ray keeps the newest checkpoints (CheckpointConfig)"


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_a_killed_ray_worker_restarts_the_group_from_the_checkpoint(tmp_path, files, uninterrupted, monkeypatch):
    marker = str(tmp_path / "home")
    monkeypatch.setenv("KFLOOP_HOME", marker)
    shape = replace(uninterrupted.shape, max_restarts=1)
    with ThreadPoolExecutor(1) as pool:
        launch = pool.submit(_launch, tmp_path, files, shape)
        victims = wait_for("two Ray Train workers", lambda: _train_workers(marker) if len(
            _train_workers(marker)) == 2 else None, timeout=DEADLINE_S, interval=0.05)
        wait_for("a checkpoint Ray registered", lambda: registered_checkpoints(tmp_path / "ckpt" / "ray-test"),
                 timeout=DEADLINE_S, interval=0.05)
        os.kill(victims[-1], signal.SIGKILL)
        result = launch.result(timeout=DEADLINE_S)
    log = (tmp_path / "logs" / DRIVER_LOG).read_text()
    assert "[FailurePolicy] RETRY" in log
    assert log.count("Started training worker group of size 2") == 2, "Ray started the group again"
    assert "resuming from checkpoint step" in log
    ours = load_file(result.model_dir / WEIGHTS_FILE)
    theirs = load_file(uninterrupted.result.model_dir / WEIGHTS_FILE)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs), "resumed exactly: the same model as without the kill"


@pytest.mark.timeout(600)
def test_a_failing_ray_worker_fails_the_launch_with_its_error(tmp_path, files, ray_head):
    broken = tmp_path / "broken_model.py"
    broken.write_text("def build(n_inputs, n_outputs, **params):\n    raise RuntimeError('no such layer: warp9')\n")
    config = replace(TINY, model={"module": str(broken)})
    shape = JobShape(nnodes=1, nproc_per_node=2, backend="ray", ray_address=ray_head)
    with pytest.raises(LaunchError) as failed:
        _launch(tmp_path, files, shape, config)
    assert "no such layer: warp9" in str(failed.value)
    assert str(tmp_path / "logs" / DRIVER_LOG) in str(failed.value)
    assert not (tmp_path / "model").exists(), "no model dir after a failure"


@pytest.mark.timeout(900)
def test_the_training_pipeline_trains_on_ray_and_records_it(isolated_env, demo_files, ray_head, capsys):
    capsys.readouterr()
    code = main(["--workdir", str(isolated_env.workdir), "run", "training", "--local", "--json",
                 "--set", f"dataset_uri={demo_files['train.parquet']}", "--set", "target=churned",
                 "--set", "model_name=on-ray", "--set", "backend=ray", "--set", f"training.ray_address={ray_head}",
                 "--set", "training.epochs=2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["model_version"] == "1" and result["promoted"], result["reason"]
    version = mlflow.MlflowClient().get_model_version("on-ray", "1")
    assert version.tags["decision"] == "promote"
    shape = mlflow.artifacts.load_dict(f"runs:/{version.run_id}/lineage.json")["job_shape"]
    assert (shape["backend"], shape["ray_address"], shape["nproc_per_node"]) == ("ray", ray_head, 2)
