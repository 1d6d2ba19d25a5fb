"""The trigger state in a ConfigMap on Kubernetes, shared by every pod that decides (the webhook's, the drift
pipeline's trigger step): each change is a compare-and-swap, a replace carrying the ``metadata.resourceVersion``
read (or a create when there is none yet). The API server refuses a stale one with 409 Conflict (and a taken name
with 409 AlreadyExists); :meth:`monitoring.trigger.TriggerStore.update` then re-reads and decides again, so of two
pods racing only the one whose write succeeds starts a run. One ConfigMap, :data:`CONFIG_MAP`, holds every model's
document (a key each), so deploy/rbac.yaml and deploy/webhook.yaml grant get and update on that name only, and
create (which RBAC cannot limit to a name)."""
from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from monitoring.trigger import StateConflict, TriggerStore, model_lock
from training.launch.kube_client import REQUEST_TIMEOUT, model_object_name

CONFIG_MAP = "kfloop-trigger-state"
"""The ConfigMap of the trigger state (up to 1 MiB: each model's history is capped)."""


class ConfigMapTriggerStore(TriggerStore):
    """:class:`TriggerStore` whose document is key ``trigger-<model>-<hex>.json`` of ConfigMap :data:`CONFIG_MAP`
    in ``namespace``, reached through ``api`` (a ``kubernetes.client.ApiClient``)."""

    def __init__(self, model_name: str, *, api: Any, namespace: str):
        self.model_name, self.namespace, self.name = model_name, namespace, CONFIG_MAP
        self.key = f"{model_object_name('trigger', model_name)}.json"
        self.path = f"ConfigMap {namespace}/{self.name} key {self.key}"
        self.lock = model_lock(model_name)
        self._core = client.CoreV1Api(api)
        self._data: dict[str, str] = {}
        """The ConfigMap's data as last read: the other models' keys go back unchanged with this one's."""

    def _read(self) -> tuple[bytes | None, Any]:
        try:
            found = self._core.read_namespaced_config_map(self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                self._data = {}
                return None, None
            raise self._refused(err) from err
        self._data = dict(found.data or {})
        value = self._data.get(self.key)
        return (None if value is None else value.encode()), found.metadata.resource_version

    def _write(self, state: dict[str, Any], version: Any) -> None:
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=self.name, resource_version=version,
                                         labels={"app.kubernetes.io/name": "kfloop"}),
            data={**self._data, self.key: json.dumps(state, sort_keys=True)})
        try:
            if version is None:
                self._core.create_namespaced_config_map(self.namespace, body, _request_timeout=REQUEST_TIMEOUT)
            else:
                self._core.replace_namespaced_config_map(self.name, self.namespace, body,
                                                         _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 409:  # Conflict (stale resourceVersion) or AlreadyExists (another pod created it)
                raise StateConflict(f"{self.path}: {_status_message(err)}") from err
            raise self._refused(err) from err

    def _refused(self, err: ApiException) -> Exception:
        """A 403 as a PermissionError saying which grant is missing; any other refusal as it is."""
        if err.status != 403:
            return err
        return PermissionError(f"the retrain trigger keeps its state in {self.path} and needs get, create and "
                               f"update on ConfigMap {self.name} in namespace {self.namespace}: bind "
                               "deploy/rbac.yaml's Role kfloop (steps) or deploy/webhook.yaml's Role (kfloop serve) to "
                               f"this service account ({err.reason})")


def _status_message(err: ApiException) -> str:
    """The message of the API server's Status body in ``err`` (its HTTP reason when the body is none)."""
    try:
        return json.loads(err.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(err.reason)
