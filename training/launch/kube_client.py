"""The `kubernetes` API client every Kubernetes caller shares (the launcher, the promotion lock's Lease)."""
from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config


def api_client(kubeconfig: str = "") -> client.ApiClient:
    """A `kubernetes` ApiClient from ``kubeconfig``, else ``$KUBECONFIG`` / ``~/.kube/config`` when present, else
    the in-cluster service account.

    Raises:
        kubernetes.config.ConfigException: no usable configuration.
    """
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if not path and Path(config.KUBE_CONFIG_DEFAULT_LOCATION).expanduser().is_file():
        path = str(Path(config.KUBE_CONFIG_DEFAULT_LOCATION).expanduser())
    if path:
        return config.new_client_from_config(config_file=path)
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)
