"""Checkpoint writes under faults: a writer killed between write and rename, a disk that refuses the write, a
damaged newest checkpoint, checkpoints that no longer verify, and a checkpoint from another torch version.

The writer runs in a child process so that the kill and the file-size limit hit a real process."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training import checkpoints

pytestmark = pytest.mark.chaos
REPO = Path(__file__).resolve().parents[1]

_WRITER = """
import os, resource, signal, sys
import torch
from training import checkpoints

directory, step, fault = sys.argv[1], int(sys.argv[2]), sys.argv[3]
state = {{"model": {{"w": torch.arange({size}, dtype=torch.float32) + step}}, "step": step}}
if fault.startswith("kill-at-rename-"):
    renames, real_replace = [0], os.replace
    def replace_then_die(src, dst):
        renames[0] += 1
        if renames[0] == int(fault.rsplit("-", 1)[1]):
            os.kill(os.getpid(), signal.SIGKILL)  # after the temp file is written and fsynced, before its rename
        real_replace(src, dst)
    os.replace = replace_then_die
elif fault == "disk-full":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with an OSError instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
checkpoints.save(directory, step, state, keep=2)
"""


def _write(directory: Path, step: int, fault: str = "none", size: int = 4096) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _WRITER.format(size=size), str(directory), str(step), fault],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def _final_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("rename", [1, 2], ids=["before-tensors-rename", "before-sidecar-rename"])
def test_a_writer_killed_between_write_and_rename_loses_nothing(tmp_path, rename):
    assert _write(tmp_path, 10).returncode == 0
    killed = _write(tmp_path, 20, f"kill-at-rename-{rename}")
    assert killed.returncode == -9, killed.stderr

    assert checkpoints.latest_good(tmp_path) == 10
    assert torch.equal(checkpoints.load(tmp_path, 10)["model"]["w"], torch.arange(4096, dtype=torch.float32) + 10)
    temps = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert temps, "the kill left the temp file of the interrupted write"
    assert "ckpt-00000020.json" not in _final_names(tmp_path), "no commit marker for the interrupted checkpoint"
    if rename == 1:
        assert _final_names(tmp_path) == ["ckpt-00000010.json", "ckpt-00000010.safetensors"]

    assert _write(tmp_path, 30).returncode == 0
    assert _final_names(tmp_path) == ["ckpt-00000010.json", "ckpt-00000010.safetensors",
                                      "ckpt-00000030.json", "ckpt-00000030.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "the stale temp file was cleaned up"


def test_a_full_disk_fails_the_save_and_keeps_the_previous_checkpoint(tmp_path):
    assert _write(tmp_path, 10, size=16).returncode == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    full = _write(tmp_path, 20, "disk-full", size=64 * 1024)
    assert full.returncode != 0 and "File too large" in full.stderr, full.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before, "no partial or temp file left"
    assert checkpoints.latest_good(tmp_path) == 10


def _save(directory: Path, steps: list[int]) -> None:
    for step in steps:
        checkpoints.save(directory, step, {"model": {"w": torch.full((8,), float(step))}, "step": step}, keep=2)


@pytest.fixture
def single_process_training(tmp_path):
    """``python -m training.train`` in one process on 400 rows; returns run(epochs) -> CompletedProcess."""
    from test_training import make_frame
    from training.config import TrainingConfig
    from data.validation import infer_schema, schema_to_yaml

    df = make_frame(400, seed=1)
    df.to_parquet(tmp_path / "d.parquet", index=False)
    (tmp_path / "s.yaml").write_text(schema_to_yaml(infer_schema(df, target="label")))

    def run(epochs: int) -> subprocess.CompletedProcess:
        (tmp_path / "c.json").write_text(json.dumps(TrainingConfig(epochs=epochs).to_dict()))
        return subprocess.run([sys.executable, "-m", "training.train", "--data", str(tmp_path / "d.parquet"),
                               "--schema", str(tmp_path / "s.yaml"), "--model-dir", str(tmp_path / "model"),
                               "--checkpoint-dir", str(tmp_path / "ckpt"), "--config", str(tmp_path / "c.json")],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
    return run


def _truncate(directory: Path, step: int) -> None:
    path = checkpoints.tensors_path(directory, step)
    path.write_bytes(path.read_bytes()[:-3])


def test_a_corrupt_newest_checkpoint_resumes_from_the_previous_one_and_says_so(tmp_path, single_process_training):
    assert single_process_training(2).returncode == 0
    first, newest = checkpoints.committed_steps(tmp_path / "ckpt")
    _truncate(tmp_path / "ckpt", newest)
    resumed = single_process_training(3)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"skipping checkpoint step {newest}" in resumed.stderr and "falling back" in resumed.stderr
    assert f"resuming from checkpoint step {first} (epoch 1)" in resumed.stderr
    assert "epoch 1/3" not in resumed.stderr and "epoch 2/3" in resumed.stderr


def test_every_checkpoint_damaged_is_refused_not_a_silent_start_from_step_0(tmp_path, single_process_training):
    assert single_process_training(2).returncode == 0
    steps = checkpoints.committed_steps(tmp_path / "ckpt")
    for step in steps:
        _truncate(tmp_path / "ckpt", step)
    (tmp_path / "model" / "model.json").unlink()
    refused = single_process_training(3)
    assert refused.returncode != 0
    assert all(f"skipping checkpoint step {step}" in refused.stderr for step in steps)
    assert f"checkpoints {steps} exist but none verifies" in refused.stderr, refused.stderr[-2000:]
    assert "epoch 1/3" not in refused.stderr
    assert not (tmp_path / "model" / "model.json").exists()


@pytest.mark.parametrize("saved_by", ["2.12.0", "2.99.1+cu128", "3.0.0"])
def test_a_checkpoint_from_another_torch_minor_version_is_refused(tmp_path, saved_by):
    _save(tmp_path, [5, 6])
    sidecar = checkpoints.sidecar_path(tmp_path, 6)
    data = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**data, "torch_version": saved_by}))
    with pytest.raises(checkpoints.CheckpointVersionError,
                       match=rf"ckpt-00000006\.json was saved by torch {re.escape(saved_by)}, this is torch "):
        checkpoints.latest_good(tmp_path)
    with pytest.raises(checkpoints.CheckpointVersionError, match="start over with an empty checkpoint directory"):
        checkpoints.load(tmp_path, 6)


def test_a_checkpoint_from_another_patch_release_loads(tmp_path):
    _save(tmp_path, [5])
    sidecar = checkpoints.sidecar_path(tmp_path, 5)
    major, minor = torch.__version__.split(".")[:2]
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "torch_version": f"{major}.{minor}.99"}))
    assert checkpoints.latest_good(tmp_path) == 5
    assert checkpoints.load(tmp_path, 5)["step"] == 5
