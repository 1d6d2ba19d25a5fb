"""The promotion lock as a Kubernetes Lease, over HTTP against the test API server with the real `kubernetes`
client: one holder at a time, a waiting promoter named the holder when it gives up, renewals keep a long hold,
a holder that stopped renewing is taken over, and the API server's compare-and-set (409) decides races."""
from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

from pathlib import Path

import pytest
from kubernetes import client, config

import yaml
from cluster.k8s_rbac import service_account_user
from cluster.k8s_server import K8sServer
from cluster.kubernetes_cluster import grant
from polling import wait_for

from training.registry.lock import LeaseLock, LockLost, LockTimeout, lease_name, promotion_lock

NAMESPACE = "ml"


@pytest.fixture
def server(tmp_path):
    with K8sServer(tmp_path / "k8s", namespace=NAMESPACE, operator=False) as server:
        yield server


@pytest.fixture
def kubeconfig(server, tmp_path):
    return server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def api(kubeconfig):
    return config.new_client_from_config(config_file=str(kubeconfig))


def _kfloop_role() -> dict:
    """deploy/rbac.yaml's Role ``kfloop``: what the promote step's service account is granted."""
    docs = yaml.safe_load_all((Path(__file__).resolve().parents[1] / "deploy" / "rbac.yaml").read_text())
    return next(d for d in docs if d and d["kind"] == "Role" and d["metadata"]["name"] == "kfloop")


def _without(role: dict, resource: str, verb: str) -> dict:
    rules = [{**rule, "verbs": [v for v in rule["verbs"] if not (resource in rule["resources"] and v == verb)]}
             for rule in role["rules"]]
    return {**role, "rules": rules}


@pytest.fixture
def runner_api(server, api, tmp_path):
    """The promote step's client: service account ``kfloop`` with deploy/rbac.yaml's Role ``kfloop``."""
    grant(api, NAMESPACE, "kfloop", _kfloop_role())
    path = server.write_kubeconfig(tmp_path / "runner", user=service_account_user(NAMESPACE, "kfloop"))
    return config.new_client_from_config(config_file=str(path))


def _lock(api, holder: str, **kw) -> LeaseLock:
    return LeaseLock(name="kfloop-promote-churn", namespace=NAMESPACE, api=api, holder=holder, poll_s=0.02, **kw)


def _lease(api) -> client.V1Lease:
    return client.CoordinationV1Api(api).read_namespaced_lease("kfloop-promote-churn", NAMESPACE)


def test_one_holder_at_a_time_and_the_waiter_names_the_holder(api):
    with _lock(api, "pod-a"):
        assert _lease(api).spec.holder_identity == "pod-a"
        with pytest.raises(LockTimeout, match="held by pod-a"):
            _lock(api, "pod-b", timeout_s=0.3).acquire()
    assert _lease(api).spec.holder_identity is None  # released
    with _lock(api, "pod-b"):
        lease = _lease(api)
        assert (lease.spec.holder_identity, lease.spec.lease_transitions) == ("pod-b", 1)


def test_renewals_keep_a_long_hold(api):
    with _lock(api, "pod-a", duration_s=1):
        first = _lease(api).spec.renew_time
        wait_for("a renewal", lambda: _lease(api).spec.renew_time > first, timeout=10)
        second = _lease(api).spec.renew_time
        wait_for("another renewal", lambda: _lease(api).spec.renew_time > second, timeout=10)
        with pytest.raises(LockTimeout, match="held by pod-a"):  # waits longer than the lease's duration
            _lock(api, "pod-b", timeout_s=2.5).acquire()
        assert _lease(api).spec.holder_identity == "pod-a"


@pytest.mark.chaos
def test_a_hold_taken_over_meanwhile_fails_loudly(api):
    lock = _lock(api, "pod-a", duration_s=1)
    with pytest.raises(LockLost, match="taken over by partitioned-peer"):
        with lock:
            lease = _lease(api)
            lease.spec.holder_identity = "partitioned-peer"
            lease.spec.acquire_time = lease.spec.renew_time = "2026-12-03T00:00:00.000000Z"
            client.CoordinationV1Api(api).replace_namespaced_lease(lease.metadata.name, NAMESPACE, lease)
            wait_for("the renewer to notice", lambda: lock.lost, timeout=10)
    assert _lease(api).spec.holder_identity == "partitioned-peer"  # not cleared: it is not ours


@pytest.mark.chaos
def test_a_holder_that_stopped_renewing_is_taken_over(api):
    spec = client.V1LeaseSpec(holder_identity="killed-pod", lease_duration_seconds=1,
                              renew_time="2026-01-01T00:00:00.000000Z", acquire_time="2026-01-01T00:00:00.000000Z")
    client.CoordinationV1Api(api).create_namespaced_lease(NAMESPACE, client.V1Lease(
        metadata=client.V1ObjectMeta(name="kfloop-promote-churn"), spec=spec))
    with _lock(api, "pod-b", timeout_s=30):
        lease = _lease(api)
        assert (lease.spec.holder_identity, lease.spec.lease_transitions) == ("pod-b", 1)


@pytest.mark.chaos
def test_racing_promoters_never_overlap(api):
    inside, most, started, entered = [0], [0], [], []
    guard = threading.Lock()

    def promoter(i: int) -> None:
        started.append(i)
        with _lock(api, f"pod-{i}", timeout_s=60):
            with guard:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            entered.append(i)
            wait_for("every promoter to contend", lambda: len(started) == 4)
            with guard:
                inside[0] -= 1

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(promoter, range(4)))
    assert most[0] == 1 and sorted(entered) == [0, 1, 2, 3]
    assert _lease(api).spec.lease_transitions == 3


def test_promotion_lock_is_a_lease_or_a_file_lock_as_asked(api, kubeconfig, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("KFLOOP_LEASE_NAMESPACE", NAMESPACE)
    lock = promotion_lock("Churn model/v2", tmp_path, kind="lease", timeout_s=5)
    assert isinstance(lock, LeaseLock) and lock.name == lease_name("Churn model/v2")
    with lock:
        stored = client.CoordinationV1Api(api).read_namespaced_lease(lock.name, NAMESPACE)
        assert stored.spec.holder_identity == lock.holder
    assert not isinstance(promotion_lock("churn", tmp_path, kind="file"), LeaseLock)
    with pytest.raises(ValueError, match="'file' or 'lease'"):
        promotion_lock("churn", tmp_path, kind="etcd")


@pytest.mark.chaos
@pytest.mark.parametrize("fault", ["refused", "unreachable"])
def test_a_failed_release_after_the_promotion_leaves_the_lease_to_expire_with_a_warning(api, runner_api, capsys,
                                                                                      fault):
    with _lock(runner_api, "pod-a", duration_s=30):
        if fault == "refused":  # the grant is withdrawn meanwhile: RBAC answers 403 to the release
            client.RbacAuthorizationV1Api(api).replace_namespaced_role(
                "kfloop", NAMESPACE, {**_without(_kfloop_role(), "leases", "update"),
                                      "metadata": {"name": "kfloop", "namespace": NAMESPACE}})
        else:
            runner_api.configuration.refresh_api_key_hook = None  # it would reset the host from the kubeconfig
            runner_api.configuration.host = "http://127.0.0.1:9"  # the API server is gone (discard port: refused)
    assert "could not release Lease ml/kfloop-promote-churn" in capsys.readouterr().err
    if fault == "refused":
        assert _lease(api).spec.holder_identity == "pod-a"  # left to expire


def test_a_service_account_without_the_grant_is_told_how_to_get_it(server, api, tmp_path):
    grant(api, NAMESPACE, "kfloop", _without(_kfloop_role(), "leases", "create"))
    path = server.write_kubeconfig(tmp_path / "runner", user=service_account_user(NAMESPACE, "kfloop"))
    with pytest.raises(PermissionError, match="bind deploy/rbac.yaml's Role kfloop"):
        _lock(config.new_client_from_config(config_file=str(path)), "pod-a").acquire()


def test_lease_names_are_valid_and_distinct():
    names = [lease_name(m) for m in ("churn", "Churn", "churn model", "x" * 200, "--")]
    assert len(set(names)) == len(names)
    for name in names:
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
