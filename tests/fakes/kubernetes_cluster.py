"""A Kubernetes API test server as a cluster a kfloop job can run on: its kubeconfig, a shared volume, the
``cluster`` settings that reach it, and rendered jobs for it (the ``cluster`` fixture in tests/conftest.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fakes.k8s_server import K8sServer

from training.config import TrainingConfig
from training.launch.kube_client import api_client
from training.launch.kubernetes import KubernetesSettings
from training.launch.manifests import render_pytorchjob, training_job_spec

CLAIM = "kfloop-shared"


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

    def api(self):
        return api_client(str(self.kubeconfig))

    def jobs(self) -> list[dict]:
        from kubernetes import client

        return client.CustomObjectsApi(self.api()).list_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs")["items"]

    def job_body(self, name: str, *, nnodes: int = 2, **cluster_overrides) -> dict:
        """A rendered PyTorchJob of ``training.train`` (no inputs staged: it never gets far)."""
        cluster_config = KubernetesSettings.from_dict({**self.settings(), **cluster_overrides}).cluster
        config = TrainingConfig(nnodes=nnodes, nproc_per_node=cluster_config.accelerator[1]
                                if cluster_config.accelerator else 1)
        return render_pytorchjob(training_job_spec(config, cluster_config, name=name), cluster_config)


def status_of(exc) -> dict:
    """The Status body of a `kubernetes` ApiException."""
    return json.loads(exc.body)
