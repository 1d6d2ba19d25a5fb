"""Local or cluster decided once, by the backend config's type: one backend object chooses the launcher and the
promotion lock (training/launch/backends.py), and by its type the step layer picks the trigger store
(components/run_starters.py); the Kubernetes one reaches the test API server over HTTP with the real `kubernetes`
client through its own kubeconfig."""
from __future__ import annotations

import json

import pytest
from filelock import FileLock
from kubernetes import client

from components.run_starters import trigger_store
from cluster.k8s_server import K8sServer
from monitoring.trigger import TriggerPolicy, TriggerStore, maybe_trigger
from monitoring.trigger_configmap import ConfigMapTriggerStore
from monitoring.trigger_registry import RegistryTriggerStore
from training.launch.backends import (KubernetesBackend, LocalBackend, LocalConfig, RayBackend, RayConfig,
                                      backend_for, backend_named, step_backend)
from training.launch.kube_client import api_client
from training.launch.kubernetes import KubernetesSettings
from training.registry.lock import LeaseLock, lease_name


def test_the_config_type_picks_the_backend():
    assert type(backend_for(LocalConfig())) is LocalBackend
    settings = KubernetesSettings.from_dict({"namespace": "ml"})
    backend = backend_for(settings)
    assert type(backend) is KubernetesBackend and backend.config is settings
    assert type(backend_named("local", {"namespace": "ignored-here"})) is LocalBackend
    assert backend_named("kubernetes", {"namespace": "ml"}).config.cluster.namespace == "ml"
    assert type(backend_named("ray")) is RayBackend and type(backend_for(RayConfig())) is RayBackend
    with pytest.raises(TypeError, match="dict is no backend config: use one of .*KubernetesSettings.*LocalConfig"):
        backend_for({"namespace": "ml"})
    with pytest.raises(ValueError, match=r"backend='slurm': use one of \('local', 'kubernetes', 'ray'\)"):
        backend_named("slurm")


def test_the_local_backend_keeps_its_lock_and_trigger_state_in_the_workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("KFP_POD_NAME", "in-a-pod")  # the backend decides, not the environment
    backend = backend_for(LocalConfig())
    lock = backend.promotion_lock("churn", tmp_path, timeout_s=1)
    assert isinstance(lock, FileLock) and lock.lock_file == str(tmp_path / "locks" / "churn.lock")
    store = trigger_store(backend, "churn", tmp_path)
    assert type(store) is TriggerStore and store.path == tmp_path / "trigger" / "churn.json"
    assert not backend.attaches_to_unfinished_run


def test_the_kubernetes_backend_takes_a_lease_through_its_own_kubeconfig(tmp_path, monkeypatch, isolated_env):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KFP_POD_NAME", raising=False)  # the backend decides, not the environment
    with K8sServer(tmp_path / "k8s", operator=False) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        backend = backend_for(KubernetesSettings.from_dict({"launcher": {"kubeconfig": str(kubeconfig)}}))
        lock = backend.promotion_lock("churn", tmp_path, timeout_s=5)
        assert isinstance(lock, LeaseLock) and lock.name == lease_name("churn")
        with lock:
            lease = client.CoordinationV1Api(api_client(str(kubeconfig))).read_namespaced_lease(lock.name, "default")
            assert lease.spec.holder_identity == lock.holder
        assert not (tmp_path / "locks").exists()
        store = trigger_store(backend, "churn", tmp_path)
        assert type(store) is ConfigMapTriggerStore and store.namespace == "default"
        maybe_trigger(store, model="churn", data_hash="0a", now=1e9, policy=TriggerPolicy(), start=lambda: "run-1")
        kept = client.CoreV1Api(api_client(str(kubeconfig))).read_namespaced_config_map(store.name, "default")
        assert json.loads(kept.data[store.key])["models"]["churn"]["fired"][0]["run_id"] == "run-1"
    outside = trigger_store(backend, "churn", tmp_path, cluster_api=False)  # kfloop serve --host from a laptop
    assert type(outside) is RegistryTriggerStore and outside.model_name == "churn"
    assert backend.attaches_to_unfinished_run


def test_a_step_runs_on_kubernetes_in_a_kfp_pod_unless_the_backend_override_says_otherwise(monkeypatch):
    monkeypatch.delenv("KFLOOP_BACKEND", raising=False)
    monkeypatch.delenv("KFP_POD_NAME", raising=False)
    assert type(step_backend()) is LocalBackend
    monkeypatch.setenv("KFP_POD_NAME", "training-abc-promote")
    assert type(step_backend()) is KubernetesBackend
    monkeypatch.setenv("KFLOOP_BACKEND", "local")
    assert type(step_backend()) is LocalBackend
    monkeypatch.delenv("KFP_POD_NAME")
    monkeypatch.setenv("KFLOOP_BACKEND", "kubernetes")
    assert type(step_backend()) is KubernetesBackend
    monkeypatch.setenv("KFLOOP_BACKEND", "etcd")
    with pytest.raises(ValueError, match="KFLOOP_BACKEND='etcd'.*local.*kubernetes"):
        step_backend()