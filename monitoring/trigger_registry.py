"""The trigger state kept on the registered model in MLflow, for a decider that starts KFP runs from outside the
cluster (``kfloop serve --host URL`` on a machine without the Kubernetes API): it outlives the process. In a cluster
the state is a ConfigMap (:mod:`monitoring.trigger_configmap`), which has the compare-and-swap MLflow lacks."""
from __future__ import annotations

import json
from typing import Any

import mlflow

from data.redaction import redact
from monitoring.trigger import TriggerStore, model_lock
from training.registry.versions import ensure_registered_model, registered_model

STATE_TAG = "kfloop.trigger_state"
"""Registered-model tag holding the trigger document (MLflow allows 100,000 characters; the history is capped)."""


class RegistryTriggerStore(TriggerStore):
    """:class:`TriggerStore` whose document is the ``kfloop.trigger_state`` tag of registered model ``model_name``.

    MLflow has no compare-and-set, so ``lock`` (one per model, :func:`model_lock`) serialises deciders within a
    process only; the KFP path also refuses to start a training run while one is in flight.
    """

    def __init__(self, model_name: str, client: Any = None):
        self.model_name = model_name
        self.client = client or mlflow.MlflowClient()
        self.path = f"registered model {model_name!r} tag {STATE_TAG} at {redact(mlflow.get_tracking_uri())}"
        self.lock = model_lock(model_name)

    def _read(self) -> tuple[bytes | None, Any]:
        registered = registered_model(self.model_name, client=self.client)
        value = registered.tags.get(STATE_TAG) if registered else None
        return (None if value is None else value.encode()), None

    def _write(self, state: dict[str, Any], version: Any) -> None:
        ensure_registered_model(self.model_name, client=self.client)
        self.client.set_registered_model_tag(self.model_name, STATE_TAG, json.dumps(state, sort_keys=True))
