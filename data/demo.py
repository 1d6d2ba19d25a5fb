"""The demo data, produced by the DVC stage in ``data/dvc.yaml`` and pushed to a local remote."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from dvc.repo import Repo

DATA_DIR = Path(__file__).resolve().parent
REPO_ROOT = DATA_DIR.parent
DEMO_DIR = DATA_DIR / "demo"
FILES = ("train.parquet", "batch_stable.parquet", "batch_drifted.parquet")
REMOTE_NAME = "kfloop-local"


@dataclass(kw_only=True, slots=True)
class DemoData:
    """Paths of the three demo files and the md5 DVC recorded for each."""

    train: Path
    stable: Path
    drifted: Path
    md5: dict[str, str]
    remote: Path


def ensure_demo_data(remote_dir: Path) -> DemoData:
    """Reproduce the ``generate`` stage (a no-op when dvc.lock is up to date) and push the outputs to a DVC remote
    in ``remote_dir``, named for this call only: the checkout's DVC config is left as it is.

    Raises:
        FileNotFoundError: this checkout is not a DVC repo (no ``.dvc/`` beside ``data/``).
    """
    if not (REPO_ROOT / ".dvc").is_dir():
        raise FileNotFoundError(f"{REPO_ROOT}: not a DVC repository; run `dvc init` there or use a kfloop checkout")
    remote_dir.mkdir(parents=True, exist_ok=True)
    # the stage's `python` must be this interpreter, whether or not the venv is activated
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    # DVC logs "stage didn't change" on stdout; keep stdout for the demo's own output (e.g. --json)
    logging.getLogger("dvc").setLevel(logging.WARNING)
    remote = {"remote": {REMOTE_NAME: {"url": str(remote_dir.resolve())}}}
    with contextlib.redirect_stdout(sys.stderr), Repo(str(REPO_ROOT), config=remote) as repo:
        repo.reproduce(str(DATA_DIR / "dvc.yaml"))
        repo.push(remote=REMOTE_NAME)
    md5 = {Path(o["path"]).name: o["md5"] for o in _lock_outs()}
    paths = [DEMO_DIR / f for f in FILES]
    return DemoData(train=paths[0], stable=paths[1], drifted=paths[2], md5=md5, remote=remote_dir)


def _lock_outs() -> list[dict]:
    lock = yaml.safe_load((DATA_DIR / "dvc.lock").read_text())
    return lock["stages"]["generate"]["outs"]
