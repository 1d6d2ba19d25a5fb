"""A Kubernetes API test server as a cluster a kfloop job can run on: its kubeconfig, a shared volume, the
``cluster`` settings that reach it (the ``cluster`` fixture in tests/conftest.py), and hand-written PyTorchJobs for
testing the server itself."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from cluster.k8s_server import K8sServer

CLAIM = "kfloop-shared"
RESTRICTED_CONTAINER = {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
"""A container securityContext the restricted Pod Security profile admits."""


@dataclass
class Cluster:
    server: K8sServer
    kubeconfig: Path
    shared: Path

    def settings(self, **launcher) -> dict:
        """The ``cluster`` settings of a job on this server (CPU only, the shared claim at its host dir)."""
        return {"image": "kfloop:test", "cpu": "1", "memory": "2Gi", "shm_size": "64Mi",
                "shared_volume_claim": CLAIM, "shared_mount_path": str(self.shared),
                "launcher": {"kubeconfig": str(self.kubeconfig), "poll_seconds": 0.5, **launcher}}

    def api(self, kubeconfig: Path | None = None):
        """A `kubernetes` ApiClient of this cluster's kubeconfig (the admin's), or of ``kubeconfig``."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def jobs(self, namespace: str = "default") -> list[dict]:
        from kubernetes import client

        return client.CustomObjectsApi(self.api()).list_namespaced_custom_object(
            "kubeflow.org", "v1", namespace, "pytorchjobs")["items"]


def pytorchjob(name: str, command: list[str], *, workers: int = 1, namespace: str = "default",
               nproc_per_node: str = "1", containers: int = 1) -> dict:
    """A PyTorchJob as a user writes it: a Master and ``workers`` Workers running ``command`` in container
    ``pytorch`` (plus ``containers - 1`` sidecars), restricted securityContexts, no port (the operator's default)."""
    pod = {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
           "containers": [{"name": "pytorch", "image": "python:3.11", "command": command,
                           "env": [{"name": "OWN", "value": "kept"}], "securityContext": RESTRICTED_CONTAINER}]
           + [{"name": f"sidecar-{i}", "image": "busybox", "command": ["sleep", "1"],
               "securityContext": RESTRICTED_CONTAINER} for i in range(1, containers)]}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": {"spec": pod}}}
    if workers:
        replicas["Worker"] = {"replicas": workers, "restartPolicy": "Never", "template": {"spec": pod}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nprocPerNode": nproc_per_node, "pytorchReplicaSpecs": replicas}}


PYTHON = sys.executable
"""The interpreter of hand-written jobs' commands (the test image's python)."""


def grant(api, namespace: str, service_account: str, role: dict) -> None:
    """As the admin (``api``): create ``role`` (a Role's body; its namespace becomes ``namespace``) and a
    RoleBinding of it to ``service_account`` in ``namespace``."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api)
    name = role["metadata"]["name"]
    rbac.create_namespaced_role(namespace, {**role, "metadata": {**role["metadata"], "namespace": namespace}})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": f"{name}-{service_account}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]})


def s3_service_account(api, s3_env: dict[str, str], account: str, secret: str, namespace: str = "default") -> None:
    """As the admin (``api``): a Secret of the S3 test server's keys, annotated with its endpoint as KServe reads it
    (``serving.kserve.io/s3-endpoint``, ``s3-usehttps: "0"``), and service account ``account`` naming it (what
    KServe's storage initializer and payload logger take their credentials from)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_namespaced_secret(namespace, {
        "metadata": {"name": secret, "annotations": {
            "serving.kserve.io/s3-endpoint": s3_env["AWS_ENDPOINT_URL"].removeprefix("http://"),
            "serving.kserve.io/s3-usehttps": "0"}},
        "stringData": {key: s3_env[key] for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}, "secrets": [{"name": secret}]})


def status_of(exc) -> dict:
    """The Status body of a `kubernetes` ApiException."""
    return json.loads(exc.body)
