"""``kfloop upload | run --host | schedule | serve``: compile, then talk to the KFP server through
:mod:`components.kfp_client`."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import mlflow

from components import kfp_client
from data.errors import KfloopError
from data.settings import DEFAULT_IMAGE, DEFAULT_MODEL_NAME, IMAGE_ENV, load_environment
from pipelines.alerts import alert_settings
from pipelines.compile import PIPELINES, compile_pipeline
from pipelines.config import pipeline_params
from pipelines.drift import PIPELINE_NAME as DRIFT_NAME
from pipelines.kubernetes_options import KubernetesOptions
from pipelines.local.runs import training_summary
from pipelines.quality import PIPELINE_NAME as QUALITY_NAME
from pipelines.training import PIPELINE_NAME as TRAINING_NAME

PIPELINE_NAMES = {"training": TRAINING_NAME, "drift": DRIFT_NAME, "quality": QUALITY_NAME}
DEFAULT_SCHEDULES = {"drift": "kfloop-drift-check", "quality": "kfloop-quality-check"}
"""The recurring run of each monitoring pipeline, by default ``<this>-<model_name>``: one per model."""
DIRTY = "-dirty"
"""The suffix of a commit (and an image tag) of a tree with uncommitted changes."""
_COMMIT = re.compile(r"[0-9a-f]{7,40}")
"""A git commit SHA, full or abbreviated, as in a version name or an image tag."""


def version_name(explicit: str | None = None) -> str:
    """``explicit``, else the git commit of the code (``KFLOOP_GIT_COMMIT`` in images).

    Raises:
        ValueError: the checkout has uncommitted changes (a commit name would then lie) or is not a git checkout.
    """
    if explicit:
        return explicit
    commit = load_environment().git_commit
    if commit == "unknown" or commit.endswith(DIRTY):
        raise ValueError(f"the code's git commit is {commit!r}: commit your changes (the version is named by the "
                         "commit) or pass --pipeline-version NAME")
    return commit


def image_tag(image: str) -> str:
    """The tag of an image reference (``registry:5000/kfloop:TAG@sha256:...`` -> ``TAG``; none: '')."""
    name = image.split("@", 1)[0]
    repository, sep, tag = name.rpartition(":")
    return tag if sep and "/" not in tag else ""


def step_image(version: str, explicit: str | None, *, require: bool = False) -> str | None:
    """The image every step of ``version`` runs: ``explicit`` (``--image``) as given, else ``KFLOOP_IMAGE``, else
    ``None`` (the default image).

    Raises:
        ValueError: ``KFLOOP_IMAGE`` is tagged with another commit than the one ``version`` is named by (the
            pipeline version of a commit must run the image built from that commit), or tagged ``-dirty`` (built
            from a tree with uncommitted changes, deploy/image-commit.sh: no commit names what it holds); or, with
            ``require`` or in CI (``CI=true``), the image is empty or the default one.
    """
    env = load_environment()
    image = explicit or env.image
    if (require or env.ci) and image in ("", DEFAULT_IMAGE):
        where = "--image is the default image" if explicit else (
            f"{IMAGE_ENV} is {'the default image' if image else 'empty or unset'}")
        raise ValueError(f"{where}, so version {version} would run {DEFAULT_IMAGE}, not the image built from its "
                         f"commit: set {IMAGE_ENV} to the image the CI workflow's image job pushed (compute the name "
                         "in the job that uses it: GitHub drops a job output that contains a secret's value, "
                         "leaving it empty) or pass --image REGISTRY/NAME:TAG")
    if explicit:
        return explicit
    tag = image_tag(image)
    if tag.endswith(DIRTY):
        raise ValueError(f"{IMAGE_ENV}={image} was built from a tree with uncommitted changes: commit them and "
                         "rebuild the image, or pass --image to upload this one knowingly")
    if _COMMIT.fullmatch(version) and _COMMIT.fullmatch(tag) and not (version.startswith(tag)
                                                                       or tag.startswith(version)):
        raise ValueError(f"{IMAGE_ENV}={image} is tagged for commit {tag}, but the pipeline version is named by "
                         f"commit {version}: build and push the image of {version} (the CI workflow's image job "
                         "does), or pass --image explicitly")
    return image or None


def upload_pipelines(host: str | None, *, version: str | None = None, namespace: str | None = None,
                     image: str | None = None, options: KubernetesOptions | None = None,
                     require_image: bool = False) -> list[dict[str, Any]]:
    """Compile every pipeline (``options`` as ``kfloop compile``; the image from :func:`step_image`) and upload them
    as version ``version`` (default: the commit), idempotently; ``code_source_url`` is set when the checkout is
    clean.

    Raises:
        ValueError: no usable version name (see :func:`version_name`), or ``KFLOOP_IMAGE`` is the image of another
            commit, or (``require_image`` or in CI) no image is named (see :func:`step_image`).
        kfp_server_api.ApiException: the server refused.
    """
    name = version_name(version)
    image = step_image(name, image, require=require_image)
    commit = load_environment().git_commit
    clean = commit != "unknown" and not commit.endswith(DIRTY)
    source = kfp_client.code_source_url(commit) if clean else ""
    client = kfp_client.connect(host)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, pipeline in PIPELINES.items():
            package = compile_pipeline(key, Path(tmp) / f"{key}.yaml", image=image, options=options)
            ref, created = kfp_client.upload(client, PIPELINE_NAMES[key], package, version_name=name,
                                             source_url=source, namespace=namespace,
                                             description=pipeline.component_spec.description or "")
            out.append({**ref.to_dict(), "pipeline": key, "created": created})
    return out


def remote_params(name: str, settings: dict[str, Any], client: Any, *, version: str,
                  namespace: str | None, service_account: str | None = None) -> dict[str, Any]:
    """The pipeline's parameters; a monitoring pipeline (drift, quality) also gets the training version of the same
    name pinned, which its trigger step starts in ``namespace`` as ``service_account`` through the in-cluster KFP
    service (``KF_PIPELINES_ENDPOINT`` of the step's pod, else ``kfp.host``).

    Raises:
        ValueError: bad settings.
        LookupError: (drift, quality) the training pipeline has no version ``version``.
    """
    params = pipeline_params(PIPELINES[name], settings)
    if "training_pipeline_version" in PIPELINES[name].component_spec.inputs:
        training = kfp_client.find_version(client, TRAINING_NAME, version, namespace)
        params["training_pipeline_version"] = {
            "pipeline_name": TRAINING_NAME, "pipeline_id": training.pipeline_id,
            "pipeline_version_id": training.pipeline_version_id, "version_name": version,
            "experiment": kfp_client.DEFAULT_EXPERIMENT, "namespace": namespace or "",
            "host": kfp_client.KfpSettings.from_dict(settings.get("kfp")).host,
            "service_account": service_account or kfp_client.DEFAULT_SERVICE_ACCOUNT}
    return params


def run_remote(name: str, settings: dict[str, Any], host: str, *, version: str | None = None,
               namespace: str | None = None, service_account: str | None = None, wait: bool = False,
               poll_seconds: float = 5.0) -> dict[str, Any]:
    """Start ``name`` on the KFP server as a run of its uploaded version, its pods (and, for drift, the training
    runs it triggers) running as ``service_account``; with ``wait``, follow it to the end.
    Returns the run's fields; a finished training run adds the contract fields (model version, promoted,
    champion, metrics, reason) from MLflow when the version it registered is found there.

    Raises:
        LookupError: the version is not uploaded.
        TrainingInFlight: (training) a training run of the pipeline is pending or running: none is started.
        RunFailed: the run ended in another state than SUCCEEDED (``wait`` only).
    """
    name_ = version_name(version)
    client = kfp_client.connect(host)
    ref = kfp_client.find_version(client, PIPELINE_NAMES[name], name_, namespace)
    params = remote_params(name, settings, client, version=name_, namespace=namespace,
                           service_account=service_account)
    if name == "training":  # refused while a training run is in flight, as the trigger's and the alert's are
        run = client.get_run(kfp_client.start_training(client, ref, params, namespace=namespace,
                                                       service_account=service_account,
                                                       display_name=kfp_client.run_name(ref)))
    else:
        run = kfp_client.create_run(client, ref, params, namespace=namespace, service_account=service_account)
    if wait:
        run = kfp_client.wait(client, run.run_id, poll_seconds=poll_seconds)
    summary = {"run_id": run.run_id, "state": run.state, "pipeline": name, "pipeline_id": ref.pipeline_id,
               "pipeline_version_id": ref.pipeline_version_id, "version": name_, "experiment_id": run.experiment_id,
               "url": f"{host.rstrip('/')}/#/runs/details/{run.run_id}"}
    if wait and run.state != "SUCCEEDED":
        raise RunFailed(summary)
    if wait and name == "training":
        summary.update(registered_result(settings.get("model_name", DEFAULT_MODEL_NAME), run.run_id))
    return summary


class RunFailed(KfloopError, RuntimeError):
    """A KFP run ended in another state than SUCCEEDED; ``summary`` is what ``--json`` prints."""
    def __init__(self, summary: dict[str, Any]):
        super().__init__(f"run {summary['run_id']} ended {summary['state']}: see {summary['url']}")
        self.summary = summary


def registered_result(model_name: str, run_id: str) -> dict[str, Any]:
    """The training contract fields of the version that KFP run ``run_id`` registered (its ``pipeline_run_id``
    tag), or ``{}`` when MLflow holds none (e.g. MLFLOW_TRACKING_URI is not the cluster's server)."""
    found = mlflow.MlflowClient().search_model_versions(
        f"name = '{model_name}' and tags.pipeline_run_id = '{run_id}'")
    return training_summary(model_name, str(found[0].version)) if found else {}


def schedule_check(pipeline: str, settings: dict[str, Any], host: str, *, cron: str | None, name: str | None = None,
                   action: str = "schedule", version: str | None = None, namespace: str | None = None,
                   service_account: str | None = None) -> dict[str, Any]:
    """Create or replace (``action="schedule"``), ``disable`` or ``delete`` the recurring run ``name`` (default:
    :data:`DEFAULT_SCHEDULES` and the model's name: one schedule per model, which a push re-points at its commit's
    version) of the monitoring ``pipeline`` (``drift`` or ``quality``); its runs, and the training runs they
    trigger, run as ``service_account``.

    Raises:
        ValueError: a missing or non-6-field cron.
        LookupError: the version is not uploaded, or no recurring run ``name`` to disable/delete.
    """
    name = name or f"{DEFAULT_SCHEDULES[pipeline]}-{settings.get('model_name') or DEFAULT_MODEL_NAME}"
    if action == "schedule":  # a bad cron is refused before the server is asked anything
        if not cron:
            raise ValueError("--cron is required to schedule, e.g. --cron '0 0 * * * *' (hourly; 6 fields)")
        kfp_client.check_cron(cron)
    client = kfp_client.connect(host)
    if action != "schedule":
        ids = kfp_client.set_schedule_enabled(client, name, enabled=False if action == "disable" else None,
                                              namespace=namespace)
        return {"name": name, "recurring_run_ids": ids, "action": action}
    name_ = version_name(version)
    ref = kfp_client.find_version(client, PIPELINE_NAMES[pipeline], name_, namespace)
    params = remote_params(pipeline, settings, client, version=name_, namespace=namespace,
                           service_account=service_account)
    rec_id, created = kfp_client.schedule(client, ref, params, name=name, cron=cron, namespace=namespace,
                                          service_account=service_account)
    return {"name": name, "recurring_run_id": rec_id, "created": created, "cron": " ".join(cron.split()),
            "version": name_, "action": action}


def alert_starter(settings: dict[str, Any], *, host: str | None, version: str | None = None,
                  namespace: str | None = None, service_account: str | None = None) -> Callable[[Any], str]:
    """For ``kfloop serve``: a ``start(alert)`` that starts a run of the training version ``version`` (default:
    the commit), as ``service_account``, on the alert's model and data (``dataset_uri`` of the alert, else of
    ``settings``). The version is looked up now, so a missing upload fails at startup.

    Raises:
        LookupError: the training pipeline has no such version.
    """
    client = kfp_client.connect(host, in_cluster_host=kfp_client.KfpSettings.from_dict(settings.get("kfp")).host)
    ref = kfp_client.find_version(client, TRAINING_NAME, version_name(version), namespace)

    def start(alert: Any) -> str:
        params = pipeline_params(PIPELINES["training"], alert_settings(settings, alert))
        return kfp_client.start_training(client, ref, params, namespace=namespace, service_account=service_account)

    return start
