"""The rollout step: the champion the promote step just moved, rolled out on KServe when ``serving.rollout`` is set
(:func:`training.serving.rollout.rollout`); otherwise, or when nothing was promoted, it does nothing."""
from __future__ import annotations

from typing import Any

from data.settings import load_environment, step_function
from data.tables import read_table
from training.launch.backends import step_backend
from training.launch.kube_client import api_client
from training.launch.kubernetes import KubernetesSettings
from training.progress import progress
from training.serving.rollout import rollout
from training.serving.settings import ServingSettings

SKIPPED = "skipped"


@step_function
def rollout_step(*, model_name: str, version: str, promoted: bool, holdout_path: str, serving: dict[str, Any],
                 cluster: dict[str, Any]) -> str:
    """Roll ``version`` out if ``serving.rollout`` and it was promoted; the outcome (``promoted``, or ``skipped``).

    Raises:
        training.serving.rollout.RolloutFailed: the canary was rolled back (traffic and ``champion``).
    """
    settings = ServingSettings.from_dict(serving)
    if not (settings.rollout and promoted):
        progress(f"rollout: {model_name} v{version}: skipped ("
                 f"{'not promoted' if settings.rollout else 'serving.rollout is off'})")
        return SKIPPED
    kubernetes = KubernetesSettings.from_dict(cluster)
    result = rollout(model_name, version, serving=settings, cluster=kubernetes.cluster,
                     holdout=read_table(holdout_path), api=api_client(kubernetes.launcher.kubeconfig),
                     lock=step_backend().promotion_lock(model_name, load_environment().workdir))
    progress(f"rollout: {model_name} v{version}: {result.outcome} ({result.reason})")
    return result.outcome
