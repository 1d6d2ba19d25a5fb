"""The MLflow model registry, kfloop's way: every candidate becomes a tagged version
(:mod:`training.registry.candidates` logs and registers it, and loads a version's predictor); only :func:`promote` (and
:func:`rollback`) move the ``champion`` alias, under a lock, after re-reading the champion and re-checking; each move
is appended to the champion history (:func:`champion_history`) as it happens.

MLflow is reached through ``mlflow.MlflowClient`` (tracking URI from ``MLFLOW_TRACKING_URI`` or
``mlflow.set_tracking_uri``); every function that only talks to the registry takes an optional ``client``.
Models are logged as models-from-code (:mod:`training.pyfunc_model`): nothing is pickled, and a version is only read
from a download verified against the manifest recorded at registration (:func:`download_verified`).
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from mlflow.protos.databricks_pb2 import (INVALID_PARAMETER_VALUE, RESOURCE_ALREADY_EXISTS, RESOURCE_DOES_NOT_EXIST,
                                          ErrorCode)
from mlflow.store.artifact.models_artifact_repo import REGISTERED_MODEL_META_FILE_NAME

from data.errors import EXIT_SERVICE, KfloopError, NotFoundError
from data.fileio import utc_iso
from data.redaction import redact, redact_text
from data.text import shorten
from data.profiles import PROFILE_ARTIFACT, ReferenceProfile
from training.model_files import FEATURES_FILE, MODEL_FILE, MODULE_FILE, MODULE_SHA256_KEY, WEIGHTS_FILE
from training.registry.manifest import (MANIFEST_SHA_TAG, MANIFEST_TAG, check_files, file_manifest, manifest_json,
                                        manifest_sha256)

CHAMPION_ALIAS = "champion"
MODEL_ARTIFACT = "model"
"""Name of the logged pyfunc model inside the run."""
SCHEMA_ARTIFACT = "schema.yaml"
EVALUATION_ARTIFACT = "evaluation.json"
LINEAGE_ARTIFACT = "lineage.json"
WEIGHTS_TAG = "weights_sha256"
"""Version tag (and ``kfloop.``-prefixed run tag) holding the sha256 of ``weights.safetensors``."""
MODULE_TAG = MODULE_SHA256_KEY
"""Version tag (and ``kfloop.``-prefixed run tag, and the pyfunc's ``model_config`` key) holding the sha256 of the
model module's copy (``model_module.py``): every load checks it before importing the module."""
DRIFT_REPORT_URI_TAG = "drift_report_uri"
"""Version tag of the champion's last drift report (set by monitoring's drift records)."""
QUALITY_REPORT_URI_TAG = "quality_report_uri"
"""Version tag of the champion's last quality report on labelled rows (set by monitoring's quality records)."""
HISTORY_TAG_PREFIX = "champion_move."
"""Registered-model tags ``champion_move.000001``, ...: the champion history, one JSON :class:`ChampionMove`
per move, written under the promotion lock right after the alias moved; never rewritten."""
MAX_TAG_CHARS = 5000
"""Model-version tag values are a VARCHAR(5000) in MLflow's SQL schema; longer text goes in descriptions."""
PYFUNC_MODEL_FILE = Path(__file__).parents[1] / "pyfunc_model.py"
CODE_MODEL_LOADER = "mlflow.pyfunc.loaders.code_model"
"""The pyfunc loader of a models-from-code model: the only kind kfloop logs."""


class DecisionLike(Protocol):
    """What :func:`promote`'s re-check returns (a :class:`training.gate.Decision` fits)."""

    blessed: bool
    reason: str


@dataclass(kw_only=True, slots=True)
class Lineage:
    """Where a candidate came from; recorded on its run and its registered version."""

    data_md5: str
    """DVC md5 of the training data file."""
    data_uri: str
    """Where the training data was read from (credentials removed: :func:`data.storage.record_uri`)."""
    holdout_sha256: str
    """sha256 of the holdout file both models were evaluated on."""
    git_commit: str
    """Commit of the code that trained the model."""
    pipeline_run_id: str
    """KFP run id (or the local run's id)."""
    seed: int
    """Training seed."""
    schema_yaml: str
    """The pandera schema (YAML) the data was validated against."""
    previous_champion: str | None = None
    """Champion version when the candidate was evaluated; ``None`` if there was none."""
    training_config: dict[str, Any] = field(default_factory=dict)
    """How the model was trained (:class:`training.config.TrainingConfig`), as a JSON-ready dict."""
    job_shape: dict[str, Any] = field(default_factory=dict)
    """The shape of the job that trained it (:class:`training.config.JobShape`: nodes, processes per node, backend,
    restarts, rendezvous timeout); empty on versions registered before it was recorded (their ``training_config``
    holds it)."""
    data_version: str = ""
    """The object store's version id or ETag of the training data; empty for a local file."""
    decision_threshold: float | None = None
    """Binary models: the decision threshold chosen on the validation split (``None``: most probable class)."""
    threshold_choice: dict[str, str] = field(default_factory=dict)
    """Binary models: what the threshold was chosen for and why (``setting``, ``metric``, ``reason``: e.g.
    ``threshold_metric: auto`` on a rare class took ``f1_macro``); empty for other targets."""
    holdout_fraction: float | None = None
    """Share of the data held out by the split (``None`` on versions registered before it was recorded)."""
    split_seed: int | None = None
    """Seed of the split (``None`` on versions registered before it was recorded)."""
    data_store: str = ""
    """The DVC remote registration kept the training data in (:mod:`data.dvc_store`); empty when the repo's DVC
    cache or one of its remotes holds it."""
    model_module: str = ""
    """The model plug-in's module as configured (a file path or a dotted name); its source is logged with the
    version (``model_dir/model_module.py``)."""
    model_module_sha256: str = ""
    """sha256 of that source, checked before every import of the version's module."""
    image: str = ""
    """The container image the training processes ran (the PyTorchJob's or TrainJob's on Kubernetes); empty when
    they ran outside an image (locally, outside a pipeline step)."""

    def __post_init__(self) -> None:
        for name, length in (("data_md5", 32), ("holdout_sha256", 64)):
            value = getattr(self, name)
            if len(value) != length or any(ch not in "0123456789abcdef" for ch in value):
                raise ValueError(f"{name}={value!r}: expected {length} lowercase hex digits "
                                 "(data.fileio.file_digest)")
        if not self.schema_yaml.strip():
            raise ValueError("schema_yaml is empty: pass the validated schema's to_yaml() text")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r}: use the integer seed training ran with")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    def tags(self) -> dict[str, str]:
        """The lineage as string tags (the schema, training config and job shape go in artifacts instead)."""
        return {"data_md5": self.data_md5, "data_uri": self.data_uri[:MAX_TAG_CHARS],
                **({"data_version": self.data_version} if self.data_version else {}),
                "holdout_sha256": self.holdout_sha256, "git_commit": self.git_commit,
                "pipeline_run_id": self.pipeline_run_id, "seed": str(self.seed),
                "previous_champion": self.previous_champion or "none",
                **({} if self.holdout_fraction is None else {"holdout_fraction": str(self.holdout_fraction)}),
                **({} if self.split_seed is None else {"split_seed": str(self.split_seed)}),
                **({"data_store": self.data_store[:MAX_TAG_CHARS]} if self.data_store else {}),
                **({"model_module": self.model_module[:MAX_TAG_CHARS]} if self.model_module else {}),
                **({"image": self.image[:MAX_TAG_CHARS]} if self.image else {}),
                **({"threshold_metric": self.threshold_choice["metric"],
                    "threshold_reason": self.threshold_choice["reason"][:MAX_TAG_CHARS]}
                   if self.threshold_choice else {})}


@dataclass(kw_only=True, slots=True, frozen=True)
class VersionRecord:
    """What kfloop recorded on a registered version, read from its MLflow tags here and nowhere else."""

    version: str
    run_id: str | None
    decision: str | None
    """``promote``, ``reject`` or ``superseded``."""
    reason: str
    primary_metric: str | None
    """The metric the gate decided on."""
    data_md5: str | None
    data_uri: str | None
    holdout_sha256: str | None
    holdout_fraction: float | None
    split_seed: int | None
    git_commit: str | None
    pipeline_run_id: str | None
    weights_sha256: str | None
    previous_champion: str | None
    promoted_at: str | None
    drift_report_uri: str | None
    """Evidently's report of the last drift check of this version as champion."""
    quality_report_uri: str | None = None
    """Evidently's report of the last quality check of this version as champion on labelled rows."""
    model_module_sha256: str | None = None
    """sha256 of the model module's logged source."""

    @classmethod
    def of(cls, mv: Any) -> "VersionRecord":
        """The record of MLflow model version ``mv``."""
        tags = mv.tags or {}
        return cls(version=str(mv.version), run_id=mv.run_id or None, decision=tags.get("decision"),
                   reason=mv.description or tags.get("reason", ""), primary_metric=tags.get("primary_metric"),
                   data_md5=tags.get("data_md5"),
                   data_uri=tags.get("data_uri"), holdout_sha256=tags.get("holdout_sha256"),
                   holdout_fraction=float(tags["holdout_fraction"]) if "holdout_fraction" in tags else None,
                   split_seed=int(tags["split_seed"]) if "split_seed" in tags else None,
                   git_commit=tags.get("git_commit"), pipeline_run_id=tags.get("pipeline_run_id"),
                   weights_sha256=tags.get(WEIGHTS_TAG), previous_champion=_none(tags.get("previous_champion")),
                   promoted_at=tags.get("promoted_at"), drift_report_uri=tags.get(DRIFT_REPORT_URI_TAG),
                   quality_report_uri=tags.get(QUALITY_REPORT_URI_TAG),
                   model_module_sha256=tags.get(MODULE_TAG))


@dataclass(kw_only=True, slots=True)
class ChampionInfo:
    """The version the ``champion`` alias points at."""

    version: str
    run_id: str | None
    """Run that logged it (``None`` if it was registered from outside a run)."""
    tags: dict[str, str]
    """Version tags (decision, reason, lineage, weights_sha256, ...)."""
    metrics: dict[str, float]
    """Latest metrics of its run."""
    record: VersionRecord
    """The tags as kfloop reads them."""


@dataclass(kw_only=True, slots=True)
class PromotionResult:
    """Outcome of :func:`promote`."""

    promoted: bool
    """Whether ``champion`` now points at the requested version."""
    champion_version: str | None
    """The champion after the call."""
    previous_champion: str | None
    """The champion before the call."""
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


class ForeignModelError(KfloopError, RuntimeError):
    """A model version kfloop did not log (foreign model code, or weights its run never recorded)."""


def registry_client(client: "mlflow.MlflowClient | None" = None) -> "mlflow.MlflowClient":
    return client or mlflow.MlflowClient()


def registered_model(model_name: str, *, client: "mlflow.MlflowClient | None" = None):
    """The registered model ``model_name`` (an ``mlflow.entities.model_registry.RegisteredModel``), or ``None``
    when there is none (a name MLflow refuses, such as ``a/b``, names none).

    Raises:
        mlflow.exceptions.MlflowException: MLflow could not be read.
    """
    try:
        return registry_client(client).get_registered_model(model_name)
    except MlflowException as e:
        if e.error_code in (ErrorCode.Name(RESOURCE_DOES_NOT_EXIST), ErrorCode.Name(INVALID_PARAMETER_VALUE)):
            return None
        raise


def model_version(model_name: str, ref: str | int, *, client: "mlflow.MlflowClient | None" = None):
    """Version ``ref`` of ``model_name`` (an ``mlflow.entities.model_registry.ModelVersion``): a version number, or
    an alias such as ``champion`` resolved to the version it names now.

    Raises:
        NotFoundError: the model has no such version or alias (the message says how to list them).
        mlflow.exceptions.MlflowException: MLflow could not be read.
    """
    ref = str(ref)
    client = registry_client(client)
    try:
        return client.get_model_version(model_name, ref) if ref.isdigit() else \
            client.get_model_version_by_alias(model_name, ref)
    except MlflowException as e:
        missing_alias = not ref.isdigit() and e.error_code == ErrorCode.Name(INVALID_PARAMETER_VALUE)
        if e.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST) or missing_alias:
            raise NotFoundError(f"model '{model_name}' has no {'version' if ref.isdigit() else 'alias'} {ref}: "
                                f"`kfloop history --model {model_name}` lists its versions") from None
        raise


def ensure_registered_model(model_name: str, *, client: "mlflow.MlflowClient | None" = None) -> None:
    """Create the registered model ``model_name`` unless it exists.

    Raises:
        mlflow.exceptions.MlflowException: MLflow refused the call.
    """
    try:
        registry_client(client).create_registered_model(model_name,
                                                description="kfloop candidates; alias 'champion' serves")
    except MlflowException as e:
        if e.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise


def get_champion(model_name: str, *, client: "mlflow.MlflowClient | None" = None) -> ChampionInfo | None:
    """The version ``champion`` points at, or ``None`` (no such registered model, or no alias yet).

    Raises:
        mlflow.exceptions.MlflowException: MLflow could not be read.
    """
    client = registry_client(client)
    registered = registered_model(model_name, client=client)
    version = registered.aliases.get(CHAMPION_ALIAS) if registered else None
    if version is None:
        return None
    mv = client.get_model_version(model_name, str(version))
    metrics = dict(client.get_run(mv.run_id).data.metrics) if mv.run_id else {}
    return ChampionInfo(version=str(mv.version), run_id=mv.run_id or None, tags=dict(mv.tags), metrics=metrics,
                        record=VersionRecord.of(mv))


def holdout_metrics(client: Any, run_id: str, role: str = "challenger") -> dict[str, float]:
    """The holdout metrics of ``role`` (``challenger``, ``baseline``: the trivial model it had to beat, or
    ``linear``: the linear baseline fitted beside it), as the gate logged them on the run."""
    prefix = f"eval_{role}_"
    return {k.removeprefix(prefix): v for k, v in client.get_run(run_id).data.metrics.items() if k.startswith(prefix)}


def list_versions(model_name: str, *, client: Any = None) -> list[dict[str, Any]]:
    """Every version, oldest first: when it was created, decision, reason, primary metric, holdout metrics and
    the baseline's and the linear baseline's, lineage (MLflow run, pipeline run, data md5, git commit) and whether
    it is the champion now."""
    client = registry_client(client)
    champion = str(client.get_registered_model(model_name).aliases.get("champion"))
    versions = sorted(client.search_model_versions(f"name = '{model_name}'"), key=lambda v: int(v.version))
    records = [(mv, VersionRecord.of(mv)) for mv in versions]
    return [{"version": r.version,
             "created_at": None if mv.creation_timestamp is None else utc_iso(mv.creation_timestamp / 1000),
             "decision": r.decision, "reason": r.reason, "primary_metric": r.primary_metric,
             "metrics": holdout_metrics(client, r.run_id) if r.run_id else {},
             "baseline": holdout_metrics(client, r.run_id, "baseline") if r.run_id else {},
             "linear": holdout_metrics(client, r.run_id, "linear") if r.run_id else {},
             "run_id": mv.run_id, "pipeline_run_id": r.pipeline_run_id, "data_md5": r.data_md5,
             "git_commit": r.git_commit, "champion": r.version == champion}
            for mv, r in records]


def champion_schema(model_name: str, *, client: "mlflow.MlflowClient | None" = None) -> str | None:
    """The schema YAML recorded with the champion's run, or ``None`` when there is no champion.

    Raises:
        FileNotFoundError: the champion's run has no ``schema.yaml`` (it was not logged by kfloop).
    """
    client = registry_client(client)
    champion = get_champion(model_name, client=client)
    if champion is None:
        return None
    if champion.run_id is None or SCHEMA_ARTIFACT not in {a.path for a in client.list_artifacts(champion.run_id)}:
        raise FileNotFoundError(f"champion {model_name} v{champion.version} (run {champion.run_id}) has no "
                                f"{SCHEMA_ARTIFACT} artifact: register champions with log_candidate()")
    return mlflow.artifacts.load_text(f"runs:/{champion.run_id}/{SCHEMA_ARTIFACT}")


def champion_profile(model_name: str, *, client: "mlflow.MlflowClient | None" = None) -> ReferenceProfile | None:
    """The reference profile stored with the champion (:mod:`data.profiles`), or ``None`` when there is no
    champion or it was registered before kfloop stored profiles (drift checks then read its training data).

    Raises:
        ValueError: the stored profile is malformed or of another format version.
    """
    client = registry_client(client)
    champion = get_champion(model_name, client=client)
    if champion is None or champion.run_id is None:
        return None
    if PROFILE_ARTIFACT not in {a.path for a in client.list_artifacts(champion.run_id)}:
        return None
    return ReferenceProfile.from_json(mlflow.artifacts.load_text(f"runs:/{champion.run_id}/{PROFILE_ARTIFACT}"))


def logged_manifest(model_uri: str, *, client: "mlflow.MlflowClient | None" = None) -> str:
    """The manifest JSON (:func:`training.registry.manifest.manifest_json`) of the logged model ``model_uri``
    (``models:/<model_id>`` or ``runs:/...``), from a fresh download of all its stored files (a ``models:/`` URI is
    read at its artifact location: MLflow's download of that URI adds a ``registered_model_meta`` file of its own).

    Raises:
        ValueError: the manifest is too long for a tag.
        mlflow.exceptions.MlflowException: the model cannot be downloaded.
    """
    client = registry_client(client)
    if model_uri.startswith("models:/"):
        model_uri = client.get_logged_model(model_uri.removeprefix("models:/")).artifact_location
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp,
                                                    tracking_uri=client.tracking_uri)
        return manifest_json(file_manifest(local))


def verified_manifest(model_name: str, version: str, *, client: "mlflow.MlflowClient | None" = None
                      ) -> dict[str, str]:
    """Version ``version``'s manifest (:mod:`training.registry.manifest`) as recorded at registration: its
    :data:`MANIFEST_TAG` tag, checked against the sha256 its run recorded when the model was logged.

    Raises:
        ForeignModelError: the version carries no manifest (not registered by
            :func:`training.registry.candidates.register_candidate`) or its manifest is not the one its run recorded.
    """
    client = registry_client(client)
    mv = client.get_model_version(model_name, str(version))
    label = f"{model_name} v{version}"
    recorded = mv.tags.get(MANIFEST_TAG)
    if not recorded:
        raise ForeignModelError(f"{label} has no {MANIFEST_TAG} tag; refusing to load a model whose files cannot be "
                                "verified (register versions with register_candidate())")
    run_sha = client.get_run(mv.run_id).data.tags.get(f"kfloop.{MANIFEST_SHA_TAG}") if mv.run_id else None
    if run_sha != manifest_sha256(recorded):
        raise ForeignModelError(f"{label}: its {MANIFEST_TAG} tag has sha256 {manifest_sha256(recorded)} but its run "
                                f"{mv.run_id} recorded {run_sha}; the version was re-tagged after registration or "
                                "log_candidate() did not log it")
    return json.loads(recorded)


def download_verified(model_name: str, version: str, dst: str | Path, *,
                      client: "mlflow.MlflowClient | None" = None) -> Path:
    """Download every file of version ``version``'s logged model under ``dst`` and check the copy against the
    manifest recorded at registration (:mod:`training.registry.manifest`) before anything of it is read: no file
    changed, missing or added, the manifest the one its run recorded when the model was logged, and its MLmodel
    pointing at kfloop's pyfunc model and nothing else. Nothing is imported or executed. One file is dropped from
    the copy unread: ``registered_model_meta`` (the model's name and version), which MLflow writes into a local
    artifact store whenever ``mlflow.pyfunc.load_model("models:/...")`` reads from it, and which no loader reads.

    Returns:
        The verified local copy of the logged model (its ``MLmodel`` at the top).

    Raises:
        ForeignModelError: the version carries no manifest (not registered by
            :func:`training.registry.candidates.register_candidate`), its manifest is not the one its run recorded,
            or its MLmodel points at other code; the download is removed.
        training.registry.manifest.TamperedModelError: a file differs from the manifest (named, with both hashes);
            the download is removed.
    """
    client = registry_client(client)
    manifest = verified_manifest(model_name, version, client=client)
    label = f"{model_name} v{version}"
    root = client.get_model_version_download_uri(model_name, str(version)).rstrip("/")
    target = Path(dst) / "model"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=root, dst_path=str(target),
                                                         tracking_uri=client.tracking_uri))
        if REGISTERED_MODEL_META_FILE_NAME not in manifest:  # MLflow's own note, written into a local store
            (local / REGISTERED_MODEL_META_FILE_NAME).unlink(missing_ok=True)
        check_files(local, manifest, label=f"{label} ({redact(root)})")
        flavor = Model.load(local / "MLmodel").flavors.get("python_function", {})
        code = flavor.get("model_code_path") or flavor.get("python_model") or flavor.get("loader_module")
        if (flavor.get("loader_module") != CODE_MODEL_LOADER or Path(str(code)).name != PYFUNC_MODEL_FILE.name
                or flavor.get("code")):
            raise ForeignModelError(f"{label} ({redact(root)}): its MLmodel points at code {code!r} (code paths "
                                    f"{flavor.get('code')}), not kfloop's {PYFUNC_MODEL_FILE.name}; refusing to load "
                                    "a version kfloop did not log")
    except BaseException:
        shutil.rmtree(target)
        raise
    return local


def download_model_dir(model_name: str, version: str, dst: str | Path, *,
                       client: "mlflow.MlflowClient | None" = None) -> Path:
    """Version ``version``'s kfloop model directory (weights, features, model module, description) from a verified
    download under ``dst`` (:func:`download_verified`), for :meth:`training.model.Predictor.load` with the version's
    :data:`MODULE_TAG`; no code is run.

    Returns:
        The verified model directory.

    Raises:
        ForeignModelError, training.registry.manifest.TamperedModelError: as :func:`download_verified`.
        FileNotFoundError: the logged model holds no complete model directory.
    """
    local = download_verified(model_name, version, dst, client=client)
    artifacts = Model.load(local / "MLmodel").flavors["python_function"].get("artifacts", {})
    path = artifacts.get("model_dir", {}).get("path")
    model_dir = local / str(path)
    missing = [f for f in (WEIGHTS_FILE, FEATURES_FILE, MODULE_FILE, MODEL_FILE) if not (model_dir / f).is_file()]
    if path is None or missing:
        raise FileNotFoundError(f"{model_name} v{version}: the verified model {local} holds no complete kfloop model "
                                f"directory (lacks {missing}); log it with log_candidate()")
    return model_dir


def promote(model_name: str, version: str, *, compared_against: str | None,
            recheck: Callable[[ChampionInfo | None], DecisionLike], lock: AbstractContextManager,
            client: "mlflow.MlflowClient | None" = None) -> PromotionResult:
    """Point ``champion`` at ``version`` if it is still blessed: the one place the alias moves.

    Holding ``lock`` (:func:`training.registry.lock.promotion_lock`), re-read the champion. If it is not
    ``compared_against`` (the version the gate compared with; ``None`` or ``""`` for none),
    ``recheck(current_champion)`` decides again and the alias moves only if it is still blessed; otherwise the
    version is tagged ``decision=superseded`` with the reason. The alias moves first; then the move is appended
    to the champion history (:func:`champion_history`), the version gets ``promoted_at`` and
    ``previous_champion`` tags and the registered model ``champion_version``, ``champion_promoted_at`` and
    ``previous_champion``. A version that is already champion is reported as
    promoted; whatever of its move was not recorded (an earlier attempt failed after the alias moved) is.

    Raises:
        ValueError: ``version``'s decision tag is not ``promote`` (only blessed candidates may become champion).
        TimeoutError: ``lock`` was not acquired in its time (``filelock.Timeout``, ``LockTimeout``).
        training.registry.lock.LockLost: ``lock`` was lost before the alias moved (it did not move).
        RegistryUnavailableError: MLflow did not answer after its bounded retries (the alias still points at
            a valid version; run the step again).
        mlflow.exceptions.MlflowException: the version does not exist, or MLflow refused a call.
    """
    client = registry_client(client)
    version, compared_against = str(version), (str(compared_against) if compared_against else None)
    from training.registry.lock import ensure_held  # Kubernetes' client: only where an alias moves

    with lock, _unavailable_is_clear(client, model_name):
        mv = client.get_model_version(model_name, version)
        if mv.tags.get("decision") != "promote":
            raise ValueError(f"{model_name} v{version} has decision={mv.tags.get('decision')!r}; only a version "
                             "the gate blessed (decision=promote) can become champion")
        current = get_champion(model_name, client=client)
        previous = current.version if current else None
        if previous == version:
            history = champion_history(model_name, client=client)
            before = history[-1].previous if history and history[-1].version == version else (
                history[-1].version if history else _none(mv.tags.get("previous_champion")))
            move = _move_champion(client, model_name, version, previous=before, action="promote",
                                  reason=mv.tags.get("reason", ""),
                                  actor=f"pipeline run {mv.tags.get('pipeline_run_id', 'unknown')}")
            return PromotionResult(promoted=True, champion_version=version, previous_champion=move.previous,
                                   reason=f"v{version} is already the champion")
        reason = mv.tags.get("reason", "")
        if previous != compared_against:
            verdict = recheck(current)
            changed = f"champion changed from {_label(compared_against)} to {_label(previous)} since the gate ran"
            if not verdict.blessed:
                reason = f"superseded: {changed}; re-check: {verdict.reason}"
                client.set_model_version_tag(model_name, version, "decision", "superseded")
                client.set_model_version_tag(model_name, version, "reason", shorten(redact_text(reason), MAX_TAG_CHARS))
                return PromotionResult(promoted=False, champion_version=previous, previous_champion=previous,
                                       reason=reason)
            reason = f"{changed}; re-check: {verdict.reason}"
            client.set_model_version_tag(model_name, version, "recheck_reason",
                                         shorten(redact_text(reason), MAX_TAG_CHARS))
        ensure_held(lock)  # fenced: a lock lost since it was taken moves nothing
        client.set_registered_model_alias(model_name, CHAMPION_ALIAS, version)
        _move_champion(client, model_name, version, previous=previous, action="promote", reason=reason,
                       actor=f"pipeline run {mv.tags.get('pipeline_run_id', 'unknown')}")
    return PromotionResult(promoted=True, champion_version=version, previous_champion=previous, reason=reason)


def rollback(model_name: str, *, to: str | None = None, reason: str, actor: str, lock: AbstractContextManager,
             client: "mlflow.MlflowClient | None" = None) -> PromotionResult:
    """Move ``champion`` back to ``to`` (default: the champion the current one replaced), under the same lock
    as :func:`promote`, after re-reading the champion and verifying the target (:func:`verify_version`). The
    move is recorded in the champion history with ``reason`` and ``actor``; the version left gets
    ``rolled_back_at`` and ``rollback_reason`` tags.

    Raises:
        ValueError: no champion, no previous champion recorded and no ``to``, ``to`` is the champion already,
            an empty reason, or a target that fails verification (not blessed, not ours, weights changed).
        TimeoutError: ``lock`` was not acquired in its time.
        training.registry.lock.LockLost: ``lock`` was lost before the alias moved (it did not move).
        RegistryUnavailableError: MLflow did not answer; the champion is unchanged or the move is repaired by
            running the same rollback again.
    """
    if not reason.strip():
        raise ValueError("a rollback needs a reason (--reason TEXT): it is recorded in the champion history")
    client = registry_client(client)
    from training.registry.lock import ensure_held  # Kubernetes' client: only where an alias moves

    with lock, _unavailable_is_clear(client, model_name):
        current = get_champion(model_name, client=client)
        if current is None:
            raise ValueError(f"{model_name} has no champion to roll back; promote a version first")
        target = str(to) if to else _replaced_by(model_name, current, client)
        if target is None:
            raise ValueError(f"{model_name} v{current.version} replaced no recorded champion; pass --to VERSION")
        if target == current.version:
            history = champion_history(model_name, client=client)
            if history and history[-1].version == target:
                raise ValueError(f"{model_name} v{target} is already the champion; pass another --to VERSION")
            # the alias moved but the earlier attempt failed before recording it: complete that move
            _move_champion(client, model_name, target, previous=history[-1].version if history else None,
                           action="rollback", reason=reason, actor=actor)
            return PromotionResult(promoted=True, champion_version=target,
                                   previous_champion=history[-1].version if history else None,
                                   reason=f"rollback: {reason}")
        verify_version(model_name, target, client=client)
        ensure_held(lock)
        client.set_registered_model_alias(model_name, CHAMPION_ALIAS, target)
        move = _move_champion(client, model_name, target, previous=current.version, action="rollback",
                              reason=reason, actor=actor)
        client.set_model_version_tag(model_name, current.version, "rolled_back_at", move.at)
        client.set_model_version_tag(model_name, current.version, "rollback_reason",
                                     shorten(redact_text(reason), MAX_TAG_CHARS))
    return PromotionResult(promoted=True, champion_version=target, previous_champion=current.version,
                           reason=f"rollback: {reason}")


def verify_version(model_name: str, version: str, *, client: "mlflow.MlflowClient | None" = None) -> None:
    """Check that ``version`` may serve: READY, blessed (``decision=promote``), logged by a run of the
    experiment its ``kfloop_experiment`` tag names, and every file of its download matches the manifest recorded at
    registration (:func:`download_verified`).

    Raises:
        ValueError: a check failed; the message names it.
        ForeignModelError, training.registry.manifest.TamperedModelError: the stored files changed after
            registration (:func:`download_verified`).
        mlflow.exceptions.MlflowException: the version does not exist.
    """
    client = registry_client(client)
    mv = client.get_model_version(model_name, str(version))
    label = f"{model_name} v{version}"
    if mv.status != "READY":
        raise ValueError(f"{label} is {mv.status}, not READY")
    if mv.tags.get("decision") != "promote":
        raise ValueError(f"{label} has decision={mv.tags.get('decision')!r}; only a version the gate blessed "
                         "(decision=promote) can serve as champion")
    recorded = mv.tags.get("kfloop_experiment")
    experiment = client.get_experiment_by_name(recorded) if recorded else None
    run = client.get_run(mv.run_id) if mv.run_id else None
    if experiment is None or run is None or run.info.experiment_id != experiment.experiment_id:
        raise ValueError(f"{label} was not logged by a run of kfloop experiment "
                         f"{mv.tags.get('kfloop_experiment')!r}; refusing a version registered from outside")
    if run.data.tags.get(f"kfloop.{WEIGHTS_TAG}") != mv.tags.get(WEIGHTS_TAG):
        raise ValueError(f"{label}: its {WEIGHTS_TAG} tag differs from run {mv.run_id}'s; the version was "
                         "re-tagged after registration")
    with tempfile.TemporaryDirectory() as tmp:
        download_verified(model_name, str(version), Path(tmp), client=client)


@dataclass(kw_only=True, slots=True)
class ChampionMove:
    """One move of ``champion``, recorded as it happens (registered-model tag ``champion_move.<seq>``)."""

    seq: int
    """1, 2, ... in the order of the moves."""
    at: str
    """When the alias moved (UTC, ISO 8601)."""
    version: str
    """The champion from then on."""
    previous: str | None
    """The champion before (``None``: there was none)."""
    action: str
    """``promote`` or ``rollback``."""
    reason: str
    """The gate's reason for a promotion, the operator's for a rollback."""
    actor: str
    """Who or what moved it: ``pipeline run <id>`` or the operator's user name."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def champion_history(model_name: str, *, client: "mlflow.MlflowClient | None" = None) -> list[ChampionMove]:
    """Every recorded move of ``champion``, oldest first (empty when the model does not exist).

    Raises:
        mlflow.exceptions.MlflowException: MLflow could not be read.
    """
    registered = registered_model(model_name, client=client)
    tags = registered.tags if registered else {}
    moves = [ChampionMove(**json.loads(v)) for k, v in tags.items() if k.startswith(HISTORY_TAG_PREFIX)]
    return sorted(moves, key=lambda m: m.seq)


def champion_at(history: list[ChampionMove], at: str) -> str | None:
    """The champion version at time ``at`` (ISO 8601 UTC, as :attr:`ChampionMove.at`) per ``history``."""
    when = datetime.fromisoformat(at)
    current = None
    for move in history:
        if datetime.fromisoformat(move.at) > when:
            break
        current = move.version
    return current


class RegistryUnavailableError(KfloopError, RuntimeError):
    """MLflow did not answer after its bounded retries; says what state the registry was left in."""

    exit_code = EXIT_SERVICE


def _move_champion(client: "mlflow.MlflowClient", model_name: str, version: str, *, previous: str | None,
                   action: str, reason: str, actor: str) -> ChampionMove:
    """After the alias moved to ``version``: append the move to the history, then tag the version and the
    registered model. Called again for the same move (a retry after a failure here) it only fills in what
    is missing."""
    history = champion_history(model_name, client=client)
    last = history[-1] if history else None
    if last is not None and last.version == version:
        move = last
    else:
        move = ChampionMove(seq=(last.seq if last else 0) + 1, previous=previous, version=version, action=action,
                            at=utc_iso(time.time()),
                            reason=reason[:MAX_TAG_CHARS // 2], actor=actor)
        client.set_registered_model_tag(model_name, f"{HISTORY_TAG_PREFIX}{move.seq:06d}",
                                        json.dumps(move.to_dict()))
    client.set_model_version_tag(model_name, version, "promoted_at", move.at)
    client.set_model_version_tag(model_name, version, "previous_champion", move.previous or "none")
    for key, value in {"champion_version": version, "champion_promoted_at": move.at,
                       "previous_champion": move.previous or "none"}.items():
        client.set_registered_model_tag(model_name, key, value)
    return move


def _replaced_by(model_name: str, current: ChampionInfo, client: "mlflow.MlflowClient") -> str | None:
    """The champion ``current`` replaced when it was last promoted (its ``previous_champion`` tag if the
    history predates it)."""
    promotions = [m for m in champion_history(model_name, client=client)
                  if m.version == current.version and m.action == "promote"]
    return promotions[-1].previous if promotions else _none(current.tags.get("previous_champion"))


@contextmanager
def _unavailable_is_clear(client: "mlflow.MlflowClient", model_name: str):
    """Turn MLflow's transport failure (after its own bounded retries) into one clear error."""
    try:
        yield
    except MlflowException as e:
        if "API request to" not in e.message:
            raise
        raise RegistryUnavailableError(
            f"MLflow at {redact(client.tracking_uri)} did not answer for {model_name} after "
            f"MLFLOW_HTTP_REQUEST_MAX_RETRIES retries ({redact_text(e.message.splitlines()[0])[:300]}). "
            "'champion' still points at a valid version (the old one, or the new one if only recording the move "
            "failed); run the same command again once MLflow is back: registration finds the version by run id and "
            "a move already made is recorded, not repeated"
        ) from e


def _none(value: str | None) -> str | None:
    return None if value in (None, "", "none") else value


def _label(version: str | None) -> str:
    return f"v{version}" if version else "no champion"
