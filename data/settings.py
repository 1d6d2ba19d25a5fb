"""Where kfloop keeps its state, and the one place that reads the environment and ``kfloop.yaml``."""
from __future__ import annotations

import atexit
import difflib
import functools
import gc
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

from data.errors import ConfigFileError

T = TypeVar("T")

DEFAULT_MODEL_NAME = "kfloop-model"
DEFAULT_IMAGE = "ghcr.io/kfloop/kfloop:0.1.0"
"""The kfloop image (deploy/Dockerfile) of every pipeline step and training pod unless ``kfloop compile --image``
or ``cluster.image`` names another; pin a digest or a tag per release."""
IMAGE_ENV = "KFLOOP_IMAGE"
"""The image of this process: set on every compiled step (``pipelines/compile.py``) to the step's own image, so the
training job it launches runs the same one; on a CI runner, the image ``kfloop compile | upload`` puts in the steps."""
PULL_SECRETS_ENV = "KFLOOP_IMAGE_PULL_SECRETS"
"""Comma-separated image pull secrets of this step's pod (``kfloop compile --image-pull-secret``), passed on to the
training job it launches."""
TORCH_BUILD_ENV = "KFLOOP_TORCH_BUILD"
"""The torch build of the image this process runs in (``cpu``, ``cuda`` or ``rocm``): deploy/Dockerfile bakes it
from its ``VARIANT`` build argument, with the image label ``io.kfloop.torch-build``."""
JOB_NAMESPACE_ENV = "KFLOOP_JOB_NAMESPACE"
"""Namespace of the training jobs this step launches, set on every compiled step by ``kfloop compile|upload
--namespace``; the ``cluster.namespace`` setting wins over it, and without either a job goes in the step pod's own."""
CONFIG_FILE = "kfloop.yaml"
F = TypeVar("F", bound=Callable[..., Any])
CODE_ROOT = Path(__file__).resolve().parents[1]
"""The checkout the running code comes from: its commit is the lineage's ``git_commit``."""
KFP_WORKSPACE = Path("/kfp-workspace")
"""Where KFP mounts a pipeline's workspace volume in its steps (``kfp.dsl.constants.WORKSPACE_MOUNT_PATH``)."""
SECTION_PARAMETERS = {"training": "training_config", "model": "model_config", "promotion": "promotion_policy",
                      "drift": "drift_policy", "quality": "quality_policy", "trigger": "trigger_policy",
                      "cluster": "cluster_config", "data_store": "data_store_config", "serving": "serving_config"}
"""Each section of ``kfloop.yaml`` -> the pipeline's dict parameter that carries it."""


@dataclass(kw_only=True, slots=True)
class Environment:
    """The embedded defaults of one machine, or what the cluster's environment says."""

    workdir: Path
    """State root: ``--workdir``, else ``KFLOOP_HOME``, else ``./.kfloop``; in a pipeline step (a pod: read-only
    image, working directory not writable) the pipeline workspace if one is mounted writable, else a fresh temp
    dir."""
    tracking_uri: str
    """MLflow: ``MLFLOW_TRACKING_URI``, else SQLite under the workdir."""
    git_commit: str
    """Commit of the code that runs: ``KFLOOP_GIT_COMMIT`` (set in images), else ``git rev-parse HEAD``."""
    image: str = ""
    """``KFLOOP_IMAGE``: on a CI runner the step image of ``kfloop compile | upload`` without ``--image`` (the image CI
    built and pushed for this commit); in a step, the step's own image, the default of the training job's; empty:
    the default image."""
    image_pull_secrets: tuple[str, ...] = ()
    """``KFLOOP_IMAGE_PULL_SECRETS``: the step pod's image pull secrets, the training job's too."""
    ci: bool = False
    """``CI=true`` (GitHub Actions and most CI systems set it): ``kfloop upload`` then refuses the default image."""

    @property
    def artifact_root(self) -> Path:
        """Artifact location of experiments kfloop creates on a local (SQLite) tracking store."""
        return self.workdir / "mlartifacts"

    @property
    def pipeline_root(self) -> Path:
        """kfp.local's artifact root."""
        return self.workdir / "pipeline-root"

    def export(self) -> dict[str, str]:
        """The variables a step process needs to see the same environment."""
        return {"KFLOOP_HOME": str(self.workdir), "MLFLOW_TRACKING_URI": self.tracking_uri,
                "KFLOOP_GIT_COMMIT": self.git_commit}


def git_commit(cwd: Path = CODE_ROOT) -> str:
    """HEAD's sha of the code's checkout, with ``-dirty`` when tracked files changed; ``unknown`` when ``cwd`` is
    not the top of a git checkout (an installed package, even one inside another project's repository)."""
    try:
        top, sha = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=cwd, capture_output=True,
                                  text=True, check=True).stdout.split()
        if Path(top).resolve() != Path(cwd).resolve():  # installed inside another checkout (a venv in a repo)
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def _in_step() -> bool:
    """Whether this process is a pipeline step (KFP sets ``_KFP_RUNTIME`` in every step's process)."""
    return os.environ.get("_KFP_RUNTIME") == "true"


def _step_workdir() -> str:
    """A pipeline step's workdir, exported as ``KFLOOP_HOME`` so the step's later calls and the processes it
    starts share it: the pipeline workspace when mounted writable, else a fresh temp dir (``HOME`` is /tmp)."""
    if KFP_WORKSPACE.is_dir() and os.access(KFP_WORKSPACE, os.W_OK):
        workdir = str(KFP_WORKSPACE / "kfloop")
    else:
        workdir = tempfile.mkdtemp(prefix="kfloop-")
    os.environ["KFLOOP_HOME"] = workdir
    return workdir


def load_environment(workdir: str | os.PathLike | None = None, *, create: bool = True) -> Environment:
    """Resolve the workdir, MLflow URI and git commit (see :class:`Environment`). The workdir is created unless
    ``create`` is False (a read-only command); nothing is written anywhere else."""
    root = Path(workdir or os.environ.get("KFLOOP_HOME") or (_step_workdir() if _in_step() else ".kfloop")).resolve()
    if create:
        root.mkdir(parents=True, exist_ok=True)
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / 'mlflow.db'}"
    commit = os.environ.get("KFLOOP_GIT_COMMIT") or git_commit()
    image, secrets = own_image()
    return Environment(workdir=root, tracking_uri=uri, git_commit=commit, image=image, image_pull_secrets=secrets,
                       ci=os.environ.get("CI", "").lower() == "true")


def own_image() -> tuple[str, tuple[str, ...]]:
    """This process's image and its pull secrets (``KFLOOP_IMAGE``, ``KFLOOP_IMAGE_PULL_SECRETS``); empty when unset.
    Unlike :func:`load_environment` it creates nothing."""
    secrets = tuple(s for s in os.environ.get(PULL_SECRETS_ENV, "").split(",") if s)
    return os.environ.get(IMAGE_ENV, ""), secrets


def own_torch_build() -> str:
    """The torch build of this process's image (``KFLOOP_TORCH_BUILD``); empty outside a kfloop image."""
    return os.environ.get(TORCH_BUILD_ENV, "")


def own_job_namespace() -> str:
    """The training jobs' namespace the compiled step carries (``KFLOOP_JOB_NAMESPACE``); empty when unset."""
    return os.environ.get(JOB_NAMESPACE_ENV, "")


MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "30", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
                        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
"""Bounds on each MLflow REST call unless the user set them: 30 s per try and 3 retries with 1, 2, 4 s backoff
(MLflow's own defaults, 120 s and 7 retries, make one call to an MLflow that does not answer last many minutes)."""


def activate(env: Environment) -> None:
    """Make this process and every step it starts use ``env`` (MLflow client, artifact root, workdir), with
    MLflow's calls bounded (:data:`MLFLOW_HTTP_DEFAULTS`, unless set)."""
    os.environ.update(env.export())
    for name, value in MLFLOW_HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def step_function(fn: F) -> F:
    """Decorates a step function: in a pipeline step's process the environment is activated first, so MLflow and
    the workdir never fall back to the working directory, which a pod cannot write (MLflow's default store is
    ``./mlflow.db``), and the process ends without :func:`end_without_final_collection`'s last collection.
    Elsewhere the caller (the CLI, a test) has chosen the environment."""
    @functools.wraps(fn)
    def in_environment(*args: Any, **kwargs: Any) -> Any:
        if _in_step():
            activate(load_environment())
            end_without_final_collection()
        return fn(*args, **kwargs)
    return in_environment  # type: ignore[return-value]


@functools.cache
def end_without_final_collection() -> None:
    """At exit, freeze what the process holds (:func:`gc.freeze`) so the interpreter's shutdown skips its last
    cyclic collection over every imported library: about a second of CPU per step, training rank or ``kfloop``
    command with torch and MLflow loaded. For processes that end after their work: what they write is written (and
    closed) before."""
    atexit.register(gc.freeze)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs to a nested dict; values are YAML scalars (``3``, ``0.5``, ``true``, ``[64, 32]``).

    Raises:
        ValueError: a pair has no ``=`` or an empty key.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {pair!r}: expected key=value, e.g. --set training.epochs=5")
        node = out
        *parents, leaf = key.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(raw) if raw else ""
    return out


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base``."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config_file(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The optional ``kfloop.yaml`` (``path``, else ``./kfloop.yaml`` if present) as a dict.

    Raises:
        ConfigFileError: ``path`` does not exist, the file is not YAML (the message names its line and column) or
            not a mapping.
    """
    p = Path(path) if path else Path(CONFIG_FILE)
    if not p.exists():
        if path:
            raise ConfigFileError(f"{p}: config file not found; pass --config FILE of an existing kfloop.yaml, or "
                                  "drop --config to read ./kfloop.yaml when present")
        return {}
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigFileError(f"{p}{where}: not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{p}: expected a YAML mapping of settings (key: value lines), got "
                              f"{type(data).__name__}")
    return data


def from_struct(value: Any) -> Any:
    """Undo what a KFP ``dict`` parameter (a protobuf Struct) does to numbers: integral floats back to ints.

    Fields typed ``float`` accept ints, so this is safe for every typed config; lists and dicts are walked.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: from_struct(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_struct(v) for v in value]
    return value


def section_mapping(values: Mapping[str, Any] | None, section: str, known: Iterable[str]) -> Mapping[str, Any]:
    """``values`` (None: empty) once it is a mapping holding only ``known`` keys.

    Raises:
        ValueError: not a mapping, or an unknown key (the message lists the valid ones).
    """
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ValueError(f"'{section}' must be a mapping of settings, e.g. --set {section}.FIELD=VALUE")
    check_known_keys(values, known, where=f"{section} key")
    return values


def check_known_keys(values: Iterable[str], known: Iterable[str], *, where: str) -> None:
    """Refuse keys of ``values`` that are not ``known``, suggesting the closest valid ones (a typo is a mistake,
    never a silently ignored setting).

    Raises:
        ValueError: ``unknown <where>(s) [...]; valid keys are [...]``, with ``did you mean ...?``.
    """
    known = sorted(known)
    unknown = sorted(set(values) - set(known))
    if not unknown:
        return
    close = [match for key in unknown for match in difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)]
    guess = f"did you mean {' or '.join(map(repr, dict.fromkeys(close)))}?" if close else "did you mean one of them?"
    raise ValueError(f"unknown {where}(s) {unknown}; valid keys are {known}: {guess}")


def section_from_dict(cls: type[T], values: Mapping[str, Any] | None, section: str) -> T:
    """Build the typed config ``cls`` of the ``section`` of ``kfloop.yaml`` (or of a pipeline dict parameter) from
    a mapping; missing keys take their defaults. The one check every config section shares.

    Raises:
        ValueError: not a mapping, an unknown key (the message lists the valid ones), true/false for a field that
            is not a flag, or a value the config's own ``__post_init__`` rejects.
    """
    values = section_mapping(values, section, known := {f.name: str(f.type) for f in fields(cls)})
    for name, value in values.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        if "bool" not in known[name] and "Any" not in known[name] and any(isinstance(v, bool) for v in items):
            raise ValueError(f"{section}.{name}={value!r}: true/false is not a valid {known[name]} here")
    return cls(**values)


def check_ints(config: Any, names: tuple[str, ...], *, least: int) -> None:
    """Raise ValueError naming the first of ``names`` that is not an integer >= ``least`` (true/false refused)."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name}={value!r}: use an integer >= {least}")
