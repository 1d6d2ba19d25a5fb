"""Training on Ray from this machine: ``training.ray_train`` (Ray Train V2's ``TorchTrainer``) as a driver process
that joins ``training.ray_address`` or starts a local Ray for the run.

The driver runs in its own process group (with the local Ray's head processes it starts), its output copied to
``<log_dir>/ray-driver.log``; whatever of it still runs when :func:`train_ray` returns, raises or is interrupted is
killed, as :func:`training.launch.local.launch_local` does for torchrun agents.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from data.fileio import atomic_write_json
from data.storage import absolute
from training.config import JobShape, TrainingConfig
from training.launch.local import ERROR_TAIL_LINES, LaunchError, TrainResult
from training.model_files import MODEL_FILE

DRIVER_LOG = "ray-driver.log"
"""The driver's combined output (Ray's worker logs come through it: ``log_to_driver``)."""
FAILED_MARK = "ray_train: training failed:"
"""The line ``training.ray_train`` starts its error with."""


def train_ray(data: str | Path, schema: str | Path, *, model_dir: str | Path, checkpoint_dir: str | Path,
              config: TrainingConfig, shape: JobShape, log_dir: str | Path, mlflow_run_id: str | None = None,
              run_name: str = "kfloop-train") -> TrainResult:
    """Train ``config`` on ``shape.world_size`` Ray Train workers (one GPU each on a cluster with GPUs, see
    ``training.ray_train``; else ``config.threads_per_rank`` CPUs each), restarted up to ``shape.max_restarts``
    times from the newest checkpoint; Ray keeps the checkpoints under ``checkpoint_dir``.

    Raises:
        LaunchError: the driver exited non-zero; the message quotes Ray's error and names the log.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    config_file = atomic_write_json(log_dir / "config.json", config.to_dict())
    cmd = [sys.executable, "-m", "training.ray_train", "--data", absolute(data), "--schema", absolute(schema),
           "--model-dir", str(Path(model_dir).resolve()), "--checkpoint-dir", str(Path(checkpoint_dir).resolve()),
           "--config", str(config_file.resolve()), "--num-workers", str(shape.world_size),
           "--cpus-per-worker", str(config.threads_per_rank), "--max-failures", str(shape.max_restarts),
           "--name", run_name]
    if shape.ray_address:
        cmd += ["--address", shape.ray_address]
    if mlflow_run_id:
        cmd += ["--mlflow-run-id", mlflow_run_id]
    log = log_dir / DRIVER_LOG
    started = time.monotonic()
    with log.open("wb") as out:
        driver = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            code = driver.wait()
        finally:
            _kill_group(driver.pid)
    if code:
        raise LaunchError(node=0, rank=None, exit_code=code, error=_error(log), log=log)
    description = json.loads((Path(model_dir) / MODEL_FILE).read_text())
    return TrainResult(model_dir=Path(model_dir), metrics=description["metrics"],
                       world_size=description["world_size"], seconds=time.monotonic() - started)


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of the driver's process group (a local Ray's head processes after a crash)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _error(log: Path) -> str:
    """Ray's error from the driver's log: from ``FAILED_MARK`` on, else its last lines."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    marked = [i for i, line in enumerate(lines) if line.startswith(FAILED_MARK)]
    tail = lines[marked[-1]:] if marked else lines[-ERROR_TAIL_LINES:]
    return "\n".join(tail[:ERROR_TAIL_LINES * 3])
