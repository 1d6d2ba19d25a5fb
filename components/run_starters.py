"""Start a local training run from inside a pipeline step (where kfp runs in its restricted runtime mode)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import yaml


def start_local_training(settings: dict[str, Any]) -> str:
    """Run ``kfloop run training --local --json`` in a fresh process (its kfp is the full SDK, not the step
    runtime) and return the version it registered. Its progress lines pass through to this step's log.

    Raises:
        RuntimeError: the training run failed; the message is its error output.
    """
    env = {k: v for k, v in os.environ.items() if k != "_KFP_RUNTIME"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:
        yaml.safe_dump(settings, config)
        config.flush()
        proc = subprocess.run([sys.executable, "-m", "pipelines", "run", "training", "--local", "--json",
                               "--config", config.name], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    sys.stdout.write(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"training run failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-2:]}")
    return json.loads(proc.stdout)["model_version"]
