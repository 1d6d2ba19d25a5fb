"""Steps behave as pods: UID 1000, HOME=/tmp, a working directory they cannot write. A step's workdir is a fresh
temp dir (or the pipeline workspace when one is mounted writable), and nothing is written anywhere else."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from kfp.dsl import constants

from data import settings
from data.settings import load_environment

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def step_env(tmp_path, monkeypatch):
    """A process that KFP started as a step: ``_KFP_RUNTIME``, no KFLOOP_HOME, cwd an empty dir, temp dirs in
    ``tmp_path/tmp``, no workspace mounted."""
    monkeypatch.setenv("_KFP_RUNTIME", "true")
    for key in ("KFLOOP_HOME", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "cwd").mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(settings, "KFP_WORKSPACE", tmp_path / "kfp-workspace")
    return tmp_path


def test_the_workspace_path_is_kfps():
    assert settings.KFP_WORKSPACE == Path(constants.WORKSPACE_MOUNT_PATH)


def test_a_step_works_in_a_fresh_temp_dir_that_the_processes_it_starts_share(step_env):
    env = load_environment()
    assert env.workdir.parent == step_env / "tmp" and env.workdir.name.startswith("kfloop-")
    assert env.tracking_uri == f"sqlite:///{env.workdir / 'mlflow.db'}"
    assert os.environ["KFLOOP_HOME"] == str(env.workdir)  # inherited by `kfloop run training` from a trigger
    assert load_environment().workdir == env.workdir
    assert list((step_env / "cwd").iterdir()) == []


def test_each_step_process_gets_its_own_temp_dir(step_env, monkeypatch):
    first = load_environment().workdir
    monkeypatch.delenv("KFLOOP_HOME")  # the next step is a new process
    assert load_environment().workdir != first


def test_a_step_uses_the_pipeline_workspace_when_one_is_mounted_writable(step_env):
    (step_env / "kfp-workspace").mkdir()
    assert load_environment().workdir == step_env / "kfp-workspace" / "kfloop"
    assert list((step_env / "tmp").iterdir()) == []


def test_kfloop_home_still_wins_in_a_step(step_env, monkeypatch):
    monkeypatch.setenv("KFLOOP_HOME", str(step_env / "home"))
    assert load_environment().workdir == step_env / "home"


def test_outside_a_step_the_workdir_is_dot_kfloop(step_env, monkeypatch):
    monkeypatch.delenv("_KFP_RUNTIME")
    assert load_environment().workdir == step_env / "cwd" / ".kfloop"


_FROZEN_AT_EXIT = """
import atexit, gc, sys
from data.settings import step_function
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))  # registered first: runs last
step_function(lambda: None)()
"""


@pytest.mark.parametrize("in_step", [True, False])
def test_a_step_process_skips_the_last_collection_at_exit_and_others_keep_it(step_env, in_step):
    """A step's process freezes what it holds once its atexit handlers start (:func:`data.settings.
    end_without_final_collection`), so the interpreter's shutdown does not collect every imported library's
    objects; a process that is no step (the CLI, a test, a server) is left as it is."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if not in_step:
        env.pop("_KFP_RUNTIME")
    out = subprocess.run([sys.executable, "-c", _FROZEN_AT_EXIT], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == f"frozen at exit: {in_step}"


_RUN_DRIFT = """
import sys
from kfp import local
from pipelines.drift import drift_pipeline

local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[1], raise_on_error=True)
drift_pipeline(current_uri=sys.argv[2], reference_uri=sys.argv[3], schema_uri=sys.argv[4], model_name="pods")
"""


@pytest.fixture
def pod_dirs(demo_files):
    """An unwritable working directory (mode 0555), a pipeline root, TMPDIR and copies of the demo data."""
    base = Path(tempfile.mkdtemp(prefix="kfloop-pod-"))
    dirs = {name: base / name for name in ("cwd", "pipeline-root", "tmp", "data")}
    for path in dirs.values():
        path.mkdir()
    for name in ("train.parquet", "batch_stable.parquet"):
        shutil.copy(demo_files[name], dirs["data"] / name)
    shutil.copy(REPO / "data" / "schema.yaml", dirs["data"] / "schema.yaml")
    dirs["cwd"].chmod(0o555)
    yield dirs
    shutil.rmtree(base)


def as_pod(argv: list[str], cwd: Path) -> list[str]:
    """``argv`` with ``cwd`` as its working directory, unwritable as in a pod. Root writes through file modes, so
    as root the directory becomes a read-only bind mount in a private mount namespace (a read-only root
    filesystem's error, EROFS); other users get mode 0555's EACCES."""
    if os.geteuid() != 0:
        return argv
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root without mount namespaces (unshare --mount): no way to make the working "
                    "directory unwritable; run the tests as a non-root user")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind -o ro "$0" "$0" && cd "$0" && exec "$@"', str(cwd), *argv]


def test_a_pipeline_step_runs_as_the_image_user_from_an_unwritable_working_directory(pod_dirs):
    """The drift pipeline under kfp.local, as a pod runs it: HOME=/tmp, cwd not writable, no KFLOOP_HOME: its step
    records the check in MLflow on SQLite in a fresh temp dir. (UID 1000 and a read-only root: `make e2e`.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("KFLOOP_HOME", "MLFLOW_TRACKING_URI")}
    env.update(HOME="/tmp", TMPDIR=str(pod_dirs["tmp"]), PYTHONPATH=str(REPO))
    data = pod_dirs["data"]
    argv = [sys.executable, "-c", _RUN_DRIFT, str(pod_dirs["pipeline-root"]), str(data / "batch_stable.parquet"),
            str(data / "train.parquet"), str(data / "schema.yaml")]
    out = subprocess.run(as_pod(argv, pod_dirs["cwd"]), cwd=pod_dirs["cwd"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "drift: " in out.stdout + out.stderr
    assert list(pod_dirs["cwd"].iterdir()) == []
    workdirs = [p for p in pod_dirs["tmp"].iterdir() if p.name.startswith("kfloop-")]
    assert len(workdirs) == 1 and (workdirs[0] / "mlflow.db").is_file()
