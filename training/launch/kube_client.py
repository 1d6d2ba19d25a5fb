"""The `kubernetes` API client every Kubernetes caller shares (the launcher, the promotion lock's Lease), and the
namespace they work in."""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from kubernetes import client, config
from urllib3 import Retry

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""The pod's own namespace, as its service account's mount gives it."""
NAMESPACE_FILE_ENV = "KFLOOP_NAMESPACE_FILE"
"""Another path of that file (tests; as ``KF_PIPELINES_SA_TOKEN_PATH`` moves the token's)."""
REQUEST_TIMEOUT = (10, 30)
"""``_request_timeout`` of every API call that is no watch: seconds to connect, then to wait for the answer (the
client's default is to wait forever)."""


REQUEST_RETRIES = 2
"""Connection failures are retried this often; an answer that did not come in time never is (urllib3's default would
repeat a silent GET three times, each waiting its whole read deadline)."""


def watch_timeout(seconds: float) -> tuple[float, float]:
    """``_request_timeout`` of a watch the server ends after ``timeout_seconds=seconds``: the connect deadline of
    :data:`REQUEST_TIMEOUT`, and the read one on top of the watch's own length."""
    return REQUEST_TIMEOUT[0], seconds + REQUEST_TIMEOUT[1]


FOLLOW_TIMEOUT = (REQUEST_TIMEOUT[0], None)
"""``_request_timeout`` of a followed log: the connect deadline only (a quiet training process sends nothing for
long stretches; the follower stops it from outside)."""


def _kubeconfig_path(kubeconfig: str) -> str:
    """``kubeconfig``, else the first of ``$KUBECONFIG``, else ``~/.kube/config`` when present; "" for none."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    default = Path(config.KUBE_CONFIG_DEFAULT_LOCATION).expanduser()
    return path or (str(default) if default.is_file() else "")


def api_client(kubeconfig: str = "") -> client.ApiClient:
    """A `kubernetes` ApiClient from ``kubeconfig``, else ``$KUBECONFIG`` / ``~/.kube/config`` when present, else
    the in-cluster service account; its connection failures retried :data:`REQUEST_RETRIES` times (each call also
    takes a ``_request_timeout``: :data:`REQUEST_TIMEOUT`).

    Raises:
        kubernetes.config.ConfigException: no usable configuration.
    """
    path = _kubeconfig_path(kubeconfig)
    configuration = client.Configuration()
    if path:
        config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.retries = Retry(total=REQUEST_RETRIES, read=0, backoff_factor=0.5)
    return client.ApiClient(configuration)


def own_namespace(kubeconfig: str = "") -> str:
    """The namespace this process works in: in a pod its own (the service account's namespace file), else the
    namespace of the kubeconfig's current context (``kubeconfig`` as :func:`api_client` finds it), else ``default``.

    Raises:
        kubernetes.config.ConfigException: the kubeconfig cannot be read.
    """
    path = Path(os.environ.get(NAMESPACE_FILE_ENV) or NAMESPACE_FILE)
    if path.is_file():
        return path.read_text().strip()
    kubeconfig = _kubeconfig_path(kubeconfig)
    if not kubeconfig:
        return "default"
    _, current = config.list_kube_config_contexts(config_file=kubeconfig)
    return current["context"].get("namespace") or "default"


def model_object_name(prefix: str, model_name: str) -> str:
    """``<prefix>-<model>-<8 hex>``: a valid object name for any model name, distinct per model (``prefix`` of at
    most 15 characters)."""
    digest = hashlib.sha256(model_name.encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-")[:38].strip("-")
    return f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"
