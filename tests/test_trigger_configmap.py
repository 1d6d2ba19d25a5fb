"""The trigger state as a ConfigMap, over HTTP against the test API server with the real `kubernetes` client: every
change a compare-and-swap on ``metadata.resourceVersion`` (a stale replace gets 409 Conflict, a second create 409
AlreadyExists, as from the real API server), so two pods deciding at once start exactly one run."""
from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from kubernetes import client, config

from cluster.k8s_rbac import service_account_user
from cluster.k8s_server import K8sServer
from cluster.kubernetes_cluster import grant
from test_registry_lock import _kfloop_role, _without

from monitoring.trigger import (CAS_TRIES, StateConflict, TriggerPolicy, TriggerStateContended, maybe_trigger)
from monitoring.trigger_configmap import ConfigMapTriggerStore

NAMESPACE = "ml"
POLICY = TriggerPolicy(cooldown_seconds=3600, window_seconds=86400)
T0 = 1_728_000_000.0


@pytest.fixture
def server(tmp_path):
    with K8sServer(tmp_path / "k8s", namespace=NAMESPACE, operator=False) as server:
        yield server


@pytest.fixture
def kubeconfig(server, tmp_path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig")


def _store(kubeconfig: Path) -> ConfigMapTriggerStore:
    return ConfigMapTriggerStore("churn", api=config.new_client_from_config(config_file=str(kubeconfig)),
                                 namespace=NAMESPACE)


def _config_map(kubeconfig: Path) -> client.V1ConfigMap:
    store = _store(kubeconfig)
    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig))).read_namespaced_config_map(
        store.name, NAMESPACE)


class RacingStore(ConfigMapTriggerStore):
    """A pod's store whose first read waits until the other pod has read too: both decide on the same state, so
    only the compare-and-swap can keep the second run from starting."""

    def __init__(self, kubeconfig: str, barrier):
        super().__init__("churn", api=config.new_client_from_config(config_file=kubeconfig), namespace=NAMESPACE)
        self.barrier, self.reads, self.conflicts = barrier, 0, 0

    def _read(self):
        read = super()._read()
        self.reads += 1
        if self.reads == 1:
            self.barrier.wait(timeout=60)
        return read

    def _write(self, state, version):
        try:
            super()._write(state, version)
        except StateConflict:
            self.conflicts += 1
            raise


def _pod(kubeconfig: str, out: str, index: int, data_hash: str, barrier) -> None:
    """One pod deciding an alert; writes its outcome and how many of its writes lost to ``out``."""
    store = RacingStore(kubeconfig, barrier)
    decision = maybe_trigger(store, model="churn", data_hash=data_hash, now=T0 + index, policy=POLICY,
                             start=lambda: f"run-{index}")
    Path(out).write_text(json.dumps({"outcome": decision.outcome, "run_id": decision.run_id,
                                     "conflicts": store.conflicts}))


@pytest.mark.parametrize("existing", [False, True], ids=["first-create", "replace"])
@pytest.mark.parametrize("same_data", [True, False], ids=["dedupe", "cooldown"])
def test_two_pods_deciding_at_once_start_exactly_one_run(kubeconfig, tmp_path, existing, same_data):
    if existing:  # a state another model's decisions left: the race is between two replaces, not two creates
        maybe_trigger(_store(kubeconfig), model="fraud", data_hash="0f", now=T0 - 10, policy=POLICY,
                      start=lambda: "run-fraud")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    outs = [tmp_path / f"pod-{i}.json" for i in range(2)]
    pods = [ctx.Process(target=_pod, args=(str(kubeconfig), str(outs[i]), i, "0a" if same_data else f"{i:x}",
                                           barrier)) for i in range(2)]
    for pod in pods:
        pod.start()
    for pod in pods:
        pod.join(timeout=120)

    assert [pod.exitcode for pod in pods] == [0, 0]
    results = [json.loads(out.read_text()) for out in outs]
    assert sorted(r["outcome"] for r in results) == sorted(["fired", "duplicate" if same_data else "cooldown"])
    assert sum(r["conflicts"] for r in results) >= 1  # the loser's write was refused, then it decided again
    (winner,) = [r for r in results if r["outcome"] == "fired"]
    state = json.loads(_config_map(kubeconfig).data[_store(kubeconfig).key])
    assert [(f["run_id"], f["pending"]) for f in state["models"]["churn"]["fired"]] == [(winner["run_id"], False)]
    assert sum(state["models"]["churn"]["counts"].values()) == 2


def test_a_replace_with_a_stale_resource_version_is_a_conflict_and_writes_nothing(kubeconfig):
    store = _store(kubeconfig)
    maybe_trigger(store, model="churn", data_hash="0a", now=T0, policy=POLICY, start=lambda: "run-1")
    _, stale = store._read()
    maybe_trigger(store, model="churn", data_hash="0b", now=T0 + 1, policy=POLICY, start=lambda: "run-2")
    before = _config_map(kubeconfig)

    with pytest.raises(StateConflict, match="the object has been modified"):
        store._write({"version": 1, "models": {}}, stale)
    with pytest.raises(StateConflict, match="already exists"):
        store._write({"version": 1, "models": {}}, None)

    after = _config_map(kubeconfig)
    assert (after.metadata.resource_version, after.data) == (before.metadata.resource_version, before.data)


class AlwaysBeaten(ConfigMapTriggerStore):
    """A store whose every write finds the ConfigMap changed since its read (another pod writes in between)."""

    def __init__(self, kubeconfig: Path, rival: ConfigMapTriggerStore):
        super().__init__("churn", api=config.new_client_from_config(config_file=str(kubeconfig)),
                         namespace=NAMESPACE)
        self.rival, self.tries = rival, 0

    def _read(self):
        read = super()._read()
        self.tries += 1
        maybe_trigger(self.rival, model="churn", data_hash="0b", now=T0 + self.tries, policy=POLICY,
                      start=lambda: "rival-run")
        return read


def test_a_store_beaten_on_every_try_gives_up_without_starting_a_run(kubeconfig):
    rival = _store(kubeconfig)
    rival.lock = type(rival.lock)()  # the rival is another pod: its own process lock
    store, started = AlwaysBeaten(kubeconfig, rival), []

    with pytest.raises(TriggerStateContended, match=f"changed under each of {CAS_TRIES} writes"):
        maybe_trigger(store, model="churn", data_hash="0a", now=T0, policy=POLICY,
                      start=lambda: started.append("run") or "run")

    assert started == [] and store.tries == CAS_TRIES


def test_a_service_account_without_the_grant_is_told_which(server, kubeconfig, tmp_path):
    admin = config.new_client_from_config(config_file=str(kubeconfig))
    grant(admin, NAMESPACE, "kfloop", _without(_kfloop_role(), "configmaps", "create"))
    path = server.write_kubeconfig(tmp_path / "runner", user=service_account_user(NAMESPACE, "kfloop"))

    with pytest.raises(PermissionError, match="needs get, create and update on ConfigMap kfloop-trigger-state in namespace ml"):
        maybe_trigger(_store(path), model="churn", data_hash="0a", now=T0, policy=POLICY, start=lambda: "run-1")
