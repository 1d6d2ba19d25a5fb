"""The Kubernetes API test server itself (tests/cluster/k8s_server.py), through the real `kubernetes` client and
`kubectl`: Status errors like the API server's, watches that resume and expire, server-side tables."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from cluster.k8s_server import JOB_NAME_LABEL
from cluster.k8s_validation import DNS1123_SUBDOMAIN_ERROR, claim_refusal
from cluster.kubernetes_cluster import PYTHON, pytorchjob, status_of
from polling import wait_for


def test_server_answers_404_409_422_like_the_api_server(cluster):
    from kubernetes import client

    custom = client.CustomObjectsApi(cluster.api())
    body = pytorchjob("api-check", [PYTHON, "-c", "import time; time.sleep(600)"])
    created = custom.create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", body)
    assert created["metadata"]["uid"] and int(created["metadata"]["resourceVersion"]) > 0

    with pytest.raises(client.ApiException) as conflict:
        custom.create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", body)
    assert conflict.value.status == 409
    assert status_of(conflict.value)["reason"] == "AlreadyExists"
    assert status_of(conflict.value)["message"] == 'pytorchjobs.kubeflow.org "api-check" already exists'

    with pytest.raises(client.ApiException) as missing:
        custom.get_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", "nope")
    assert missing.value.status == 404 and status_of(missing.value)["reason"] == "NotFound"

    invalid = json.loads(json.dumps(body))
    invalid["metadata"]["name"] = "invalid"
    invalid["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"
    invalid["spec"]["runPolicy"] = {"cleanupPolicy": "All"}
    with pytest.raises(client.ApiException) as rejected:
        custom.create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", invalid)
    status = status_of(rejected.value)
    assert rejected.value.status == 422 and status["reason"] == "Invalid"
    fields = {cause["field"] for cause in status["details"]["causes"]}
    assert fields == {"spec.pytorchReplicaSpecs.Master.replicas", "spec.runPolicy.cleanupPolicy"}
    assert 'unknown field "spec.runPolicy.cleanupPolicy"' in status["message"]
    assert [j["metadata"]["name"] for j in cluster.jobs()] == ["api-check"]

    patched = custom.patch_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", "api-check",
                                                    {"metadata": {"labels": {"team": "ml"}}})
    assert patched["metadata"]["labels"]["team"] == "ml"
    custom.delete_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", "api-check")
    wait_for("the job's pods to go with it", lambda: not client.CoreV1Api(cluster.api()).list_namespaced_pod(
        "default", label_selector=f"{JOB_NAME_LABEL}=api-check").items)
    assert cluster.jobs() == []


def test_watch_resumes_from_a_resource_version_and_expires_with_410(cluster):
    from kubernetes import client, watch

    custom = client.CustomObjectsApi(cluster.api())
    secrets = client.CoreV1Api(cluster.api())
    first = secrets.create_namespaced_secret("default", {"metadata": {"name": "one"}, "stringData": {"k": "v"}})
    secrets.create_namespaced_secret("default", {"metadata": {"name": "two"}, "stringData": {"k": "v"}})
    secrets.delete_namespaced_secret("one", "default")
    events = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        secrets.list_namespaced_secret, "default", resource_version=first.metadata.resource_version,
        timeout_seconds=1)]
    assert events == [("ADDED", "two"), ("DELETED", "one")]

    cluster.server.store.compact()
    with pytest.raises(client.ApiException) as expired:
        list(watch.Watch().stream(custom.list_namespaced_custom_object, "kubeflow.org", "v1", "default",
                                  "pytorchjobs", resource_version=first.metadata.resource_version, timeout_seconds=1))
    assert expired.value.status == 410


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_lists_the_jobs_of_the_test_server(cluster):
    from kubernetes import client

    client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", pytorchjob("seen-by-kubectl", ["true"], workers=0))
    out = subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "get", "pytorchjobs"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "STATE", "AGE"]
    assert row.split()[0] == "seen-by-kubectl"
    as_json = subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "get", "pytorchjob",
                              "seen-by-kubectl", "-o", "json"], capture_output=True, text=True, timeout=60)
    assert json.loads(as_json.stdout)["spec"]["nprocPerNode"] == "1", as_json.stderr


_GOOD_CLAIM = {"selector": {"matchExpressions": [{"key": "key2", "operator": "Exists"}]},
               "accessModes": ["ReadWriteOnce", "ReadOnlyMany"], "resources": {"requests": {"storage": "10G"}},
               "storageClassName": "valid", "volumeMode": "Filesystem"}
# kubernetes pkg/apis/core/validation/validation_test.go testValidatePVC's spec scenarios (commit b1ce15c54586):
# name, the spec, whether the API server refuses it (the metadata and feature-gated scenarios are not ported)
PVC_VECTORS = [
    ("good-claim", _GOOD_CLAIM, False),
    ("with-read-write-once-pod", {"accessModes": ["ReadWriteOncePod"], "resources": {"requests": {"storage": "10G"}}},
     False),
    ("with-read-write-once-pod-and-others", {"accessModes": ["ReadWriteOncePod", "ReadWriteMany"],
                                             "resources": {"requests": {"storage": "10G"}}}, True),
    ("invalid-claim-zero-capacity", {**_GOOD_CLAIM, "resources": {"requests": {"storage": "0G"}}}, True),
    ("invalid-label-selector", {**_GOOD_CLAIM, "selector": {"matchExpressions": [
        {"key": "key2", "operator": "InvalidOp", "values": ["value1", "value2"]}]}}, True),
    ("invalid-accessmode", {"accessModes": ["fakemode"], "resources": {"requests": {"storage": "10G"}}}, True),
    ("no-access-modes", {"resources": {"requests": {"storage": "10G"}}}, True),
    ("no-resource-requests", {"accessModes": ["ReadWriteOnce"]}, True),
    ("invalid-resource-requests", {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"memory": "10G"}}},
     True),
    ("negative-storage-request", {**_GOOD_CLAIM, "resources": {"requests": {"storage": "-10G"}}}, True),
    ("zero-storage-request", {**_GOOD_CLAIM, "resources": {"requests": {"storage": "0G"}}}, True),
    ("invalid-storage-class-name", {**_GOOD_CLAIM, "storageClassName": "-invalid-"}, True),
    ("invalid-volume-mode", {**_GOOD_CLAIM, "volumeMode": "fakeVolumeMode"}, True),
]


@pytest.mark.parametrize("name, spec, refused", PVC_VECTORS)
def test_claims_are_checked_as_the_api_servers_own_cases_say(name, spec, refused):
    assert (claim_refusal({"metadata": {"name": "foo"}, "spec": spec}) is not None) == refused, name


@pytest.mark.parametrize("spec, message", [
    ({"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}, None),
    ({"resources": {"requests": {"storage": "1Gi"}}},
     'PersistentVolumeClaim "claim" is invalid: spec.accessModes: Required value: at least 1 access mode is required'),
    ({"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "0G"}}, "storageClassName": "-x",
      "dataSource": {"kind": "PersistentVolumeClaim", "name": "pvc1"}},
     'PersistentVolumeClaim "claim" is invalid: [spec.resources[storage]: Invalid value: "0": must be greater than '
     'zero, spec.storageClassName: Invalid value: "-x": ' + DNS1123_SUBDOMAIN_ERROR + ', spec.dataSource: '
     'Forbidden: not emulated by the test cluster]'),
    ({"accessModes": ["ReadWriteOncePod", "ReadWriteMany", "Shared"]},
     'PersistentVolumeClaim "claim" is invalid: [spec.accessModes: Unsupported value: "Shared": supported values: '
     '"ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod", spec.accessModes: Forbidden: may not use '
     'ReadWriteOncePod with other access modes, spec.resources[storage]: Required value]'),
])
def test_claims_are_served_with_their_access_modes_and_refused_as_the_api_server_refuses_them(spec, message, cluster):
    from kubernetes import client

    from cluster.kubernetes_cluster import CLAIM

    core = client.CoreV1Api(cluster.api())
    assert core.read_namespaced_persistent_volume_claim(CLAIM, "default").status.access_modes == ["ReadWriteMany"]
    body = {"metadata": {"name": "claim"}, "spec": spec}
    if message is None:
        assert core.create_namespaced_persistent_volume_claim("default", body).spec.access_modes == ["ReadWriteMany"]
        return
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_persistent_volume_claim("default", body)
    assert refused.value.status == 422 and status_of(refused.value)["message"] == message
