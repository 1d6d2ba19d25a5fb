"""The test cluster's Istio sidecar injection (tests/cluster/istio_injection.py, from Istio 1.29.0's source): which pods
get the sidecar, and what a classic sidecar does to a job whose pods are not opted out: it never completes."""
from __future__ import annotations

import pytest
from cluster import istio_injection
from cluster.kubernetes_cluster import pytorchjob
from polling import wait_for

PROFILE = "kubeflow-user"
"""A namespace as Kubeflow's profile controller labels it."""

# TestInjectRequired (pkg/kube/inject/webhook_test.go) under the default policy (enabled, no selectors):
# pod labels, pod annotations, hostNetwork, whether the sidecar is injected.
INJECT_REQUIRED_VECTORS = {
    "no-policy": ({}, {}, False, True),
    "force-on-policy": ({}, {"sidecar.istio.io/inject": "true"}, False, True),
    "force-off-policy": ({}, {"sidecar.istio.io/inject": "false"}, False, False),
    "invalid-inject-value-yes": ({}, {"sidecar.istio.io/inject": "yes"}, False, True),
    "invalid-inject-value-random": ({"sidecar.istio.io/inject": "random"}, {}, False, True),
    "host-network": ({}, {}, True, False),
    # inject.go: the label is preferred over the annotation when both are present
    "label-over-annotation": ({"sidecar.istio.io/inject": "true"}, {"sidecar.istio.io/inject": "false"}, False, True),
}


@pytest.mark.parametrize("case", list(INJECT_REQUIRED_VECTORS))
def test_injection_follows_istios_own_test_cases(case):
    labels, annotations, host_network, want = INJECT_REQUIRED_VECTORS[case]
    pod = {"metadata": {"name": case, "labels": labels, "annotations": annotations},
           "spec": {"hostNetwork": host_network, "containers": []}}
    assert istio_injection.injection_required("test-namespace", {"istio-injection": "enabled"}, pod) is want


def test_only_a_namespace_labelled_for_injection_outside_the_ignored_ones_gets_sidecars():
    pod = {"metadata": {"name": "p"}, "spec": {"containers": []}}
    assert not istio_injection.injection_required("test-namespace", {}, pod)
    assert not istio_injection.injection_required("test-namespace", {"istio-injection": "disabled"}, pod)
    assert not istio_injection.injection_required("kube-system", {"istio-injection": "enabled"}, pod)


def _job(name: str, opt_out: bool) -> dict:
    body = pytorchjob(name, ["true"], workers=0, namespace=PROFILE)
    if opt_out:
        body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"] = {
            "annotations": {"sidecar.istio.io/inject": "false"}}
    return body


def test_a_job_without_the_opt_out_never_completes_in_an_injected_namespace(cluster):
    """The injected pod's ``pytorch`` container exits 0 but the pod stays Running (the sidecar runs on), so the
    PyTorchJob never succeeds; the same job with ``sidecar.istio.io/inject: "false"``, started after, succeeds."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    custom = client.CustomObjectsApi(cluster.api())
    core.create_namespace({"metadata": {"name": PROFILE, "labels": {"istio-injection": "enabled"}}})
    custom.create_namespaced_custom_object("kubeflow.org", "v1", PROFILE, "pytorchjobs", _job("injected", False))

    def app_exited():
        pod = core.read_namespaced_pod("injected-master-0", PROFILE)
        statuses = {s.name: s for s in pod.status.container_statuses or []}
        app = statuses.get("pytorch")
        return pod if app and app.state.terminated else None

    pod = wait_for("the injected pod's app container to exit", app_exited)
    assert [c.name for c in pod.spec.containers] == ["pytorch", "istio-proxy"]
    assert pod.metadata.annotations[istio_injection.STATUS]
    statuses = {s.name: s for s in pod.status.container_statuses}
    assert statuses["pytorch"].state.terminated.exit_code == 0 and statuses["istio-proxy"].state.running
    assert pod.status.phase == "Running"

    custom.create_namespaced_custom_object("kubeflow.org", "v1", PROFILE, "pytorchjobs", _job("opted-out", True))

    def conditions(name: str) -> list[str]:
        job = custom.get_namespaced_custom_object("kubeflow.org", "v1", PROFILE, "pytorchjobs", name)
        return [c["type"] for c in job.get("status", {}).get("conditions", []) if c["status"] == "True"]

    wait_for("the opted-out job to succeed", lambda: "Succeeded" in conditions("opted-out"))
    opted_out = core.read_namespaced_pod("opted-out-master-0", PROFILE)
    assert [c.name for c in opted_out.spec.containers] == ["pytorch"] and opted_out.status.phase == "Succeeded"
    assert "Succeeded" not in conditions("injected")
    assert core.read_namespaced_pod("injected-master-0", PROFILE).status.phase == "Running"
