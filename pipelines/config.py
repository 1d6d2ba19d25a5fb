"""The one config root: ``kfloop.yaml`` plus ``--set`` overrides, its typed sections, and the pipeline parameters
they become. Every path (``kfloop train``, ``render-job``, ``run --local``, ``run --host``, the drift pipeline's
retraining) reads the job's shape through :func:`job_shape`, so a value set once is the value used."""
from __future__ import annotations

from typing import Any

from components.kfp_client import KfpSettings
from data.dvc_store import DataStoreConfig
from data.redaction import redact_text
from data.settings import SECTION_PARAMETERS, check_known_keys
from monitoring.drift_policy import DriftPolicy
from monitoring.quality_policy import QualityPolicy
from monitoring.trigger import TriggerPolicy
from training.config import SHAPE_PARAMETERS, ModelSpec, TrainingSection
from training.gate import PromotionPolicy
from training.launch.kubernetes import KubernetesSettings
from training.serving.settings import ServingSettings

SECTIONS: dict[str, type] = {
    "training": TrainingSection,
    "model": ModelSpec,
    "promotion": PromotionPolicy,
    "drift": DriftPolicy,
    "quality": QualityPolicy,
    "trigger": TriggerPolicy,
    "cluster": KubernetesSettings,
    "data_store": DataStoreConfig,
    "kfp": KfpSettings,
    "serving": ServingSettings,
}
"""Config section -> the typed config that validates it (its pipeline parameter, if any: ``SECTION_PARAMETERS``)."""

SHARED_KEYS: dict[str, str] = {
    "dataset_uri": "The training data: a Parquet or CSV file, local or in object storage (s3://, gs://, az://).",
    "current_uri": "The batch a drift check compares with the reference: Parquet or CSV, path or URI.",
    "current_logs_uri": "Or the rows the model served: KServe's inference logs under this folder or object prefix "
                        "(the requests of the last `drift.logs_since`); set `retrain_uri` too.",
    "reference_uri": "The data the batch is compared with; empty: the champion's training data.",
    "schema_uri": "The pandera schema YAML the data must pass (`kfloop infer-schema` writes one); empty: the "
                  "champion's schema, else one inferred from the data.",
    "target": "The column the model predicts; empty: the schema's target.",
    "task": "`classification` or `regression`; empty: the schema's.",
    "model_name": "The registered model in MLflow that the pipeline trains, checks or retrains.",
    "labelled_uri": "Rows whose labels arrived (features and target), for the quality check.",
    "labels_uri": "Labels that arrived separately (the join column and the target); empty: `labelled_uri` holds "
                  "them.",
    "id_column": "The column joining `labels_uri` to `labelled_uri` (`kfloop quality --join-column`).",
    "retrain_uri": "The data a retraining triggered by degraded quality or drift trains on; empty: the labelled "
                   "rows or the current batch (needed with separate labels or `current_logs_uri`).",
    "nnodes": "Nodes of the training job: local torchrun agents or pods.",
    "nproc_per_node": "Training processes per node (one per GPU on GPU nodes).",
    "backend": "Where training runs: `local` (torchrun here), `kubernetes` (PyTorchJob, TrainJob or RayJob) or "
               "`ray` (Ray Train on a Ray cluster).",
    "holdout_fraction": "Share of the data kept out of training (seeded split) to compare candidate and champion on.",
    "seed": "Seed of the holdout split.",
}
"""Parameters of some pipeline, each with its description; one kfloop.yaml serves them all, so each pipeline
ignores the others'."""

PINNED_KEYS: dict[str, str] = {
    "training_pipeline_version": "The training pipeline version (pipeline and version ids, host, namespace, "
                                 "service account) a drift or quality run on the KFP server starts when it "
                                 "retrains: `kfloop run --host` and `kfloop schedule` fill it in with the version "
                                 "of the same name; empty under kfp.local, whose retraining runs on this machine.",
}
"""Top-level keys the CLI fills in, settable by hand."""

SETTINGS_KEYS = {*SECTIONS, *SHARED_KEYS, *PINNED_KEYS}
"""Every top-level key of kfloop.yaml / ``--set``."""

TRAINING_KEYS = {"training", "model", "promotion", "cluster", "data_store", "drift", "serving", *SHAPE_PARAMETERS,
                 "holdout_fraction", "seed"}
"""Settings the drift and quality pipelines hand to the training runs they trigger (``drift``: its engine builds
the reference profile at registration)."""


def typed_config(section: str, values: dict[str, Any]) -> Any:
    """Build the typed config of ``section`` (it raises ValueError naming the fix)."""
    return SECTIONS[section].from_dict(values)


def check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The one check of kfloop.yaml and ``--set``, whichever command reads them: every key known (a typo is refused
    with ``did you mean``, at the top level and in every section), every section a valid typed config, the job's
    shape set once. Returns ``settings`` unchanged.

    Raises:
        ValueError: an unknown key (the message lists the valid ones; ``launcher`` lives in ``cluster``), a section that is not a mapping, a value a
            typed config rejects, or the job's shape set twice.
    """
    if "launcher" in settings:
        raise ValueError("the launcher's settings live in the cluster section: --set cluster.launcher.KEY=VALUE, "
                         "or in kfloop.yaml 'cluster: {launcher: {KEY: VALUE}}' (not a top-level 'launcher')")
    check_known_keys(settings, SETTINGS_KEYS, where="setting")
    for key in SECTIONS:
        if key in settings and not isinstance(settings[key], dict):
            raise ValueError(f"'{key}' must be a mapping of settings, e.g. --set {key}.FIELD=VALUE")
    flat = resolved(settings)
    TrainingSection.from_dict(training_settings(flat))
    for key in SECTIONS.keys() & flat.keys():
        typed_config(key, flat[key])
    return settings


def job_shape(settings: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The job's shape (``nnodes``, ``nproc_per_node``, ``backend``) the settings ask for: each key from
    ``overrides`` (command-line flags; None: not given), else the top level or the ``training`` section, whichever
    sets it; keys set nowhere are left out (their default), except that a job on Kubernetes whose nodes get
    accelerators (``cluster.gpus_per_node`` or a MIG profile) runs one process per device. ``kfloop render-job``,
    ``kfloop train``, ``run`` and the retraining runs all resolve the shape here, so the dry run and the launch agree.

    Raises:
        ValueError: both places set a key, to different values; or an invalid ``cluster`` section.
    """
    training = settings.get("training") or {}
    shape = {}
    for key in SHAPE_PARAMETERS:
        if key in settings and key in training and settings[key] != training[key]:
            raise ValueError(f"{key} is set twice, to {settings[key]!r} and training.{key}={training[key]!r}: "
                             f"set it once (e.g. --set {key}={settings[key]!r})")
        if overrides.get(key) is not None:
            shape[key] = overrides[key]
        elif key in settings or key in training:
            shape[key] = settings[key] if key in settings else training[key]
    if "nproc_per_node" not in shape and shape.get("backend") == "kubernetes":
        devices = KubernetesSettings.from_dict(settings.get("cluster")).cluster.devices_per_node
        if devices:
            shape["nproc_per_node"] = devices
    return shape


def training_settings(settings: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """What :class:`TrainingSection` (the model's training config and the job's shape) is built from: the
    ``training`` section, the job's shape (:func:`job_shape`, ``overrides`` as there) and the top-level ``model``
    section.

    Raises:
        ValueError: ``training.model`` is set (the model is its own section), or the shape is set twice.
    """
    training = settings.get("training") or {}
    if "model" in training:
        raise ValueError("training.model: the model plug-in is its own top-level section; set model.module, "
                         "model.builder and model.params (e.g. --set model.params.hidden=[32])")
    return {**training, **job_shape(settings, **overrides), "model": settings.get("model") or {}}


def resolved(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with the job's shape in one place: the top-level keys (the pipeline parameters), out of the
    ``training`` section.

    Raises:
        ValueError: the shape is set twice (see :func:`job_shape`).
    """
    out = {**settings, **job_shape(settings)}
    if isinstance(settings.get("training"), dict):
        out["training"] = {k: v for k, v in settings["training"].items() if k not in SHAPE_PARAMETERS}
    return out


def pipeline_params(pipeline: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """Pick and validate the parameters ``pipeline`` declares from a settings dict.

    Top-level keys are pipeline parameters (``dataset_uri``, ``target``, ``nnodes``...); the sections
    ``training``, ``promotion``, ``drift``, ``quality``, ``trigger``, ``cluster``, ``data_store`` become dict
    parameters once their typed config accepts them. The job's shape may also be given in the ``training`` section;
    it becomes the top-level parameter either way.

    Raises:
        ValueError: settings :func:`check_settings` refuses, a missing required parameter, or a URI holding
            credentials.
    """
    declared = pipeline.component_spec.inputs or {}
    settings = resolved(check_settings(settings))
    params: dict[str, Any] = {}
    for key, value in settings.items():
        if key in SECTIONS:
            if SECTION_PARAMETERS.get(key) in declared:
                params[SECTION_PARAMETERS[key]] = value
        elif key in declared:
            params[key] = value
    if "training_params" in declared:  # the monitoring pipelines' retrain runs get the training settings
        params["training_params"] = {k: v for k, v in settings.items() if k in TRAINING_KEYS}
    with_credentials = [k for k, v in params.items() if isinstance(v, str) and redact_text(v) != v]
    if with_credentials:
        values = ", ".join(redact_text(params[k]) for k in with_credentials)
        raise ValueError(f"{with_credentials}: a credential in a run parameter ({values}); remove 'user:secret@', "
                         "presigned query parameters and tokens, and give credentials in the environment "
                         "(AWS_ACCESS_KEY_ID, ...)")
    missing = [k for k, spec in declared.items() if not spec.optional and k not in params]
    if missing:
        raise ValueError(f"missing required parameter(s) {missing}: pass them with --set KEY=VALUE")
    return params
