"""The retrain trigger's part of a backend, picked by the backend's type (:mod:`training.launch.backends`): where
the trigger keeps its state (a file in the workdir on this machine, a ConfigMap on Kubernetes)
and how it starts a training run (under kfp.local on this machine, or as a run of the pinned training version on
the KFP server). Domain code cannot hold this role without training/ importing monitoring/."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml

from components.kfp_client import DEFAULT_EXPERIMENT, IN_CLUSTER_ENDPOINT, VersionRef, connect, start_training
from data.settings import SECTION_PARAMETERS
from monitoring.trigger import TriggerStore
from monitoring.trigger_configmap import ConfigMapTriggerStore
from monitoring.trigger_registry import RegistryTriggerStore
from training.launch.backends import Backend, KubernetesBackend
from training.launch.kube_client import api_client
from training.registry.lock import lease_namespace


def local_training_process(settings: dict[str, Any], config: Path, **popen: Any) -> subprocess.Popen:
    """``kfloop run training --local --json --config CONFIG`` in a fresh process (its kfp is the full SDK, not the
    step runtime), ``settings`` written to ``config`` first (it must outlive the process); ``popen`` as
    :class:`subprocess.Popen` takes it."""
    config.write_text(yaml.safe_dump(settings))
    env = {k: v for k, v in os.environ.items() if k != "_KFP_RUNTIME"}
    return subprocess.Popen([sys.executable, "-m", "pipelines", "run", "training", "--local", "--json",
                             "--config", str(config)], env=env, **popen)


def start_local_training(settings: dict[str, Any]) -> str:
    """Run :func:`local_training_process` to its end and return the version it registered. Its progress lines
    pass through to this step's log.

    Raises:
        RuntimeError: the training run failed; the message is its error output.
    """
    with tempfile.TemporaryDirectory() as tmp:
        proc = local_training_process(settings, Path(tmp) / "kfloop.yaml", stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate()
    sys.stdout.write(err)
    if proc.returncode != 0:
        raise RuntimeError(f"training run failed (exit {proc.returncode}): {err.strip().splitlines()[-2:]}")
    return json.loads(out)["model_version"]


def start_pinned_training(pinned: dict[str, Any], settings: dict[str, Any]) -> str:
    """From the drift pipeline's trigger step: start a run of the pinned training version (``pipeline_id``,
    ``pipeline_version_id``, ``version_name``, ``experiment``, ``namespace``, ``service_account``; ``host``: the
    KFP service unless the pod's ``KF_PIPELINES_ENDPOINT`` names another) with ``settings`` as its parameters;
    returns the run id.

    Raises:
        TrainingInFlight: a training run is already pending or running.
        ValueError: no training version is pinned (the drift pipeline was not run or scheduled with ``--host``).
    """
    if not pinned:
        raise ValueError("no training pipeline version is pinned for the retrain trigger on Kubernetes: run or "
                         "schedule the drift pipeline with `kfloop run|schedule drift --host URL`, which pins the "
                         "training version of the same commit")
    version = VersionRef(pipeline_name=pinned.get("pipeline_name", ""), pipeline_id=pinned["pipeline_id"],
                         pipeline_version_id=pinned["pipeline_version_id"],
                         version_name=pinned.get("version_name", ""))
    params = {SECTION_PARAMETERS.get(k, k): v for k, v in settings.items()}
    client = connect(None, in_cluster_host=pinned.get("host") or IN_CLUSTER_ENDPOINT)
    return start_training(client, version, params, experiment=pinned.get("experiment") or DEFAULT_EXPERIMENT,
                          namespace=pinned.get("namespace") or None,
                          service_account=pinned.get("service_account") or None)


def run_starter(backend: Backend, pinned: dict[str, Any], settings: dict[str, Any]) -> Callable[[], str]:
    """The trigger's ``start()`` on ``backend``: :func:`start_pinned_training` of ``pinned`` on Kubernetes,
    :func:`start_local_training` on this machine (local and Ray backends); either with ``settings`` as the run's settings."""
    if isinstance(backend, KubernetesBackend):
        return lambda: start_pinned_training(pinned, settings)
    return lambda: start_local_training(settings)


def trigger_store(backend: Backend, model_name: str, workdir: Path, *, cluster_api: bool = True) -> TriggerStore:
    """Where the retrain trigger of ``model_name`` keeps its cooldown and dedupe state on ``backend``: a file in
    ``workdir`` on this machine; on Kubernetes a ConfigMap changed by compare-and-swap in the namespace of the
    promotion Lease, reached through ``cluster.launcher.kubeconfig`` (shared by the webhook's and the trigger
    step's pods), or, for a process without the cluster's API (``cluster_api=False``: ``kfloop serve --host`` from
    outside the cluster), the registered model in MLflow."""
    if not isinstance(backend, KubernetesBackend):
        return TriggerStore.in_workdir(workdir, model_name)
    if not cluster_api:
        return RegistryTriggerStore(model_name)
    kubeconfig = backend.config.launcher.kubeconfig
    return ConfigMapTriggerStore(model_name, api=api_client(kubeconfig), namespace=lease_namespace(kubeconfig))
