"""The test server's KubeRay v1.7.0 (tests/cluster/kuberay_operator.py), with hand-written RayJobs and RayClusters (not
kfloop's renderer): the CRD's refusals, KubeRay's own validation, the pods and commands pod.go and job.go make, the
backoffLimit rule, suspension, `kubectl get`, and deletion taking the RayCluster, its pods and Secret along."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from kubernetes import client

from cluster.k8s_store import RAYCLUSTERS
from cluster.kubernetes_cluster import status_of
from cluster.kuberay_operator import (CLUSTER_LABEL, RayClusterController, check_backoff_limit, probe_failure,
                                    submit_command)
from polling import wait_for

ENTRYPOINT = "python -c 'print(42)'"


def _pod(container: str) -> dict:
    return {"spec": {"containers": [{"name": container, "image": "rayproject/ray:2.60.0",
                                     "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]}}


def _cluster_spec(workers: int = 1) -> dict:
    return {"authOptions": {"mode": "token"}, "rayVersion": "2.60.0",
            "headGroupSpec": {"rayStartParams": {"num-cpus": "0"}, "template": _pod("ray-head")},
            "workerGroupSpecs": [{"groupName": "small", "replicas": workers, "minReplicas": workers,
                                  "maxReplicas": workers, "rayStartParams": {}, "template": _pod("ray-worker")}]}


def _rayjob(name: str, **spec) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name},
            "spec": {"entrypoint": ENTRYPOINT, "shutdownAfterJobFinishes": True, "rayClusterSpec": _cluster_spec(),
                     **spec}}


def _api(cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster.api())


def _status(cluster, name: str) -> dict:
    return _api(cluster).get_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", name).get("status", {})


def _events(cluster, name: str) -> list[tuple[str, str, str]]:
    return [(e.type, e.reason, e.message) for e in client.CoreV1Api(cluster.api()).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}").items]


def test_the_crd_refuses_a_bad_rayjob(cluster):
    body = _rayjob("bad-replicas")
    body["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "2"
    with pytest.raises(client.ApiException) as refused:
        _api(cluster).create_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", body)
    assert refused.value.status == 422
    assert "spec.rayClusterSpec.workerGroupSpecs[0].replicas: Invalid value" in status_of(refused.value)["message"]
    assert _api(cluster).list_namespaced_custom_object("ray.io", "v1", "default", "rayjobs")["items"] == []


def test_what_kuberay_refuses_ends_validation_failed_with_its_event(cluster):
    _api(cluster).create_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", _rayjob(
        "suspended-forever", suspend=True, shutdownAfterJobFinishes=False))
    status = wait_for("ValidationFailed", lambda: (s := _status(cluster, "suspended-forever")).get(
        "jobDeploymentStatus") == "ValidationFailed" and s)
    message = ("The RayJob spec is invalid: a RayJob with shutdownAfterJobFinishes set to false is not allowed to be "
               "suspended")
    assert (status["reason"], status["message"]) == ("ValidationFailed", message)
    assert _events(cluster, "suspended-forever") == [
        ("Warning", "InvalidRayJobSpec", f"default/suspended-forever: {message}")]
    assert _api(cluster).list_namespaced_custom_object("ray.io", "v1", "default", "rayclusters")["items"] == []


def test_token_auth_without_ray_version_and_a_long_name_end_validation_failed(cluster):
    """KubeRay v1.7.0 refuses token auth without ``rayVersion`` (validation.go:285) and a RayJob name over 47
    characters (validation.go:534), before it makes anything."""
    body = _rayjob("no-ray-version")
    del body["spec"]["rayClusterSpec"]["rayVersion"]
    _api(cluster).create_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", body)
    long_name = "r" * 48
    _api(cluster).create_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", _rayjob(long_name))
    message = ("The RayJob spec is invalid: authOptions.mode is 'token' but RayVersion was not specified. Ray version "
               "2.52.0 or later is required")
    status = wait_for("ValidationFailed", lambda: (s := _status(cluster, "no-ray-version")).get(
        "jobDeploymentStatus") == "ValidationFailed" and s)
    assert (status["reason"], status["message"]) == ("ValidationFailed", message)
    assert _events(cluster, "no-ray-version") == [
        ("Warning", "InvalidRayJobSpec", f"default/no-ray-version: {message}")]
    status = wait_for("ValidationFailed", lambda: (s := _status(cluster, long_name)).get(
        "jobDeploymentStatus") == "ValidationFailed" and s)
    message = "The RayJob metadata is invalid: RayJob name should be no more than 47 characters"
    assert status["message"] == message
    assert _events(cluster, long_name) == [("Warning", "InvalidRayJobMetadata", f"default/{long_name}: {message}")]
    assert _api(cluster).list_namespaced_custom_object("ray.io", "v1", "default", "rayclusters")["items"] == []


def test_deletion_rules_take_the_cluster_at_the_end_and_the_rayjob_after_its_ttl(cluster):
    """rayjob_controller.go ``handleDeletionRules``: DeleteCluster at 0 s, DeleteSelf 2 s after the end."""
    api = _api(cluster)
    rules = [{"policy": policy, "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": ttl}}
             for policy, ttl in (("DeleteCluster", 0), ("DeleteSelf", 2))]
    api.create_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", _rayjob(
        "ruled", shutdownAfterJobFinishes=False, deletionStrategy={"deletionRules": rules}))
    status = wait_for("the Ray job to succeed", lambda: (s := _status(cluster, "ruled")).get(
        "jobDeploymentStatus") == "Complete" and s, timeout=180)
    assert status["jobStatus"] == "SUCCEEDED"
    wait_for("the RayJob to delete itself", lambda: api.list_namespaced_custom_object(
        "ray.io", "v1", "default", "rayjobs")["items"] == [], timeout=60)
    assert ("Normal", "DeletedRayCluster", f"Deleted cluster default/{status['rayClusterName']}") in _events(
        cluster, "ruled")
    assert api.list_namespaced_custom_object("ray.io", "v1", "default", "rayclusters")["items"] == []

    legacy = _rayjob("legacy", deletionStrategy={"onSuccess": {"policy": "DeleteCluster"},
                                                 "onFailure": {"policy": "DeleteCluster"}})
    with pytest.raises(client.ApiException) as refused:
        api.create_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", legacy)
    assert refused.value.status == 501 and "does not play spec.deletionStrategy.onSuccess/onFailure" in \
        status_of(refused.value)["message"]


def test_the_ray_pods_and_the_submitter_are_what_pod_go_and_job_go_make(cluster):
    body = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "raycluster-kuberay", "uid": "u1"},
            "spec": _cluster_spec()}
    controller = RayClusterController(cluster.server, "default", body)
    try:
        head = controller.build_pod(body, "head", body["spec"]["headGroupSpec"], "headgroup")
        worker = controller.build_pod(body, "worker", body["spec"]["workerGroupSpecs"][0], "small", 0)
    finally:
        controller.cleanup()
    fqdn, gcs = "raycluster-kuberay-head-svc.default.svc.cluster.local", controller.gcs_port
    assert head["metadata"]["name"].startswith("raycluster-kuberay-head-")
    assert worker["metadata"]["name"].startswith("raycluster-kuberay-small-worker-")
    assert head["metadata"]["labels"] == {
        "ray.io/is-ray-node": "yes", "ray.io/cluster": "raycluster-kuberay", "ray.io/node-type": "head",
        "ray.io/group": "headgroup", "ray.io/identifier": "raycluster-kuberay-head",
        "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator"}
    assert worker["metadata"]["labels"]["ray.io/worker-group-replica-index"] == "0"
    assert worker["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
    container = head["spec"]["containers"][0]
    assert container["command"] == ["/bin/bash", "-c", "--"]
    [args] = container["args"]
    assert args.startswith("ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; ray start --head  --block  ")
    assert " --memory=1073741824 " in args and " --num-cpus=0 " in args and f" --port={gcs} " in args
    env = {e["name"]: e for e in container["env"]}
    assert env["KUBERAY_GEN_RAY_START_CMD"]["value"] == args.split("; ", 1)[1]
    assert env["RAY_ADDRESS"]["value"] == f"127.0.0.1:{gcs}" and env["RAY_PORT"]["value"] == str(gcs)
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "raycluster-kuberay", "key": "auth_token"}
    assert env["RAY_USAGE_STATS_EXTRA_TAGS"]["value"] == "kuberay_version=v1.7.0;kuberay_crd=RayCluster"
    assert env["RAY_CLUSTER_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['ray.io/cluster']"
    worker_args = worker["spec"]["containers"][0]["args"][0]
    assert f" --address={fqdn}:{gcs} " in worker_args and " --num-cpus=2 " in worker_args
    [init] = worker["spec"]["initContainers"]
    assert init["name"] == "wait-gcs-ready" and f"ray health-check --address {fqdn}:{gcs}" in init["args"][0]
    assert {"name": "FQ_RAY_IP", "value": fqdn} in init["env"]

    rayjob = {"metadata": {"name": "job"}, "spec": {"entrypoint": " python train.py  "},
              "status": {"jobId": "job-x2k9q"}}
    assert submit_command(rayjob, "svc.default.svc.cluster.local:8265") == (
        'until python -c "import urllib.request; r=urllib.request.urlopen('
        "'http://svc.default.svc.cluster.local:8265/api/gcs_healthz', timeout=10); exit(0 if b'success' in r.read() "
        'else 1)" >/dev/null 2>&1 ; do echo "Waiting for Ray Dashboard GCS to become healthy at '
        'http://svc.default.svc.cluster.local:8265 ..." ; sleep 2 ; done ; if ! ray job status --address '
        "http://svc.default.svc.cluster.local:8265 job-x2k9q >/dev/null 2>&1 ; then ray job submit --address "
        "http://svc.default.svc.cluster.local:8265 --no-wait --submission-id job-x2k9q -- python train.py ; fi ; "
        "ray job logs --address http://svc.default.svc.cluster.local:8265 --follow job-x2k9q")


def test_the_probes_follow_ray_version_and_an_exec_probe_needs_wget_in_the_image(cluster):
    """common/pod.go ``initLivenessAndReadinessProbe``: HTTP ``/api/healthz`` on the agent's port from Ray 2.53 on,
    ``wget`` exec probes below it or without a rayVersion; kfloop's image has no wget."""
    spec = _cluster_spec()
    del spec["authOptions"], spec["rayVersion"]
    body = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "probes", "uid": "u2"}, "spec": spec}
    controller = RayClusterController(cluster.server, "default", body)
    try:
        head = controller.build_pod(body, "head", spec["headGroupSpec"], "headgroup")["spec"]["containers"][0]
        worker = controller.build_pod(body, "worker", spec["workerGroupSpecs"][0], "small")["spec"]["containers"][0]
        spec["rayVersion"] = "2.53.0"
        unified = controller.build_pod(body, "worker", spec["workerGroupSpecs"][0], "small")["spec"]["containers"][0]
    finally:
        controller.cleanup()
    agent = next(a for a in head["args"][0].split() if a.startswith("--dashboard-agent-listen-port=")).split("=")[1]
    [command] = head["readinessProbe"]["exec"]["command"][2:]
    assert command == (f"wget --tries 1 -T 2 -q -O- http://localhost:{agent}/api/local_raylet_healthz | grep success "
                       f"&& wget --tries 1 -T 10 -q -O- http://localhost:{controller.dashboard_port}/api/gcs_healthz "
                       "| grep success")
    assert head["livenessProbe"]["exec"] == head["readinessProbe"]["exec"]
    assert (head["readinessProbe"]["timeoutSeconds"], worker["readinessProbe"]["timeoutSeconds"]) == (5, 2)
    assert worker["readinessProbe"]["exec"]["command"][2].count("wget") == 1
    assert set(unified["readinessProbe"]["httpGet"]) == {"path", "port"}
    assert unified["readinessProbe"]["httpGet"]["path"] == "/api/healthz"
    assert (unified["livenessProbe"]["failureThreshold"], unified["readinessProbe"]["failureThreshold"]) == (120, 10)

    wget = {"exec": {"command": ["bash", "-c", "wget --tries 1 -T 1 -q -O- http://localhost:9/x | grep success"]},
            "timeoutSeconds": 2}
    assert probe_failure(wget, "ghcr.io/kfloop/kfloop:0.1.0") == "bash: line 1: wget: command not found"
    if shutil.which("wget"):  # KubeRay's own image has wget: the command really runs (nothing listens on port 9)
        assert probe_failure(wget, "rayproject/ray:2.60.0") == "exit code 1"
    assert "Connection refused" in probe_failure({"httpGet": {"path": "/api/healthz", "port": 9}, "timeoutSeconds": 2},
                                                 "ghcr.io/kfloop/kfloop:0.1.0")


def test_ray_pods_of_an_image_without_wget_never_get_ready_below_ray_2_53(cluster):
    api = _api(cluster)
    spec = _cluster_spec()
    del spec["authOptions"], spec["rayVersion"]
    for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
        group["template"]["spec"]["containers"][0]["image"] = "ghcr.io/kfloop/kfloop:0.1.0"
    api.create_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "no-wget"}, "spec": spec})
    core = client.CoreV1Api(cluster.api())

    def probed() -> list | None:
        """The two Ray pods once both run and each has its Unhealthy Event (a loaded host may start them slowly)."""
        pods = core.list_namespaced_pod("default", label_selector=f"{CLUSTER_LABEL}=no-wget").items
        events = [e for e in core.list_namespaced_event("default").items if e.reason == "Unhealthy"]
        running = {p.metadata.name for p in pods if p.status.phase == "Running"}
        if len(pods) == len(running) == 2 and running <= {e.involved_object.name for e in events}:
            return events
        return None

    unhealthy = wait_for("both pods' readiness probes to fail", probed, timeout=240)
    assert {e.message for e in unhealthy} == {"Readiness probe failed: bash: line 1: wget: command not found"}
    status = api.get_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", "no-wget").get("status", {})
    assert status.get("state") != "ready" and status.get("readyWorkerReplicas") == 0


@pytest.mark.parametrize(("status", "limit", "after"), [
    ({"jobDeploymentStatus": "Failed", "reason": "AppFailed"}, 1, ("Retrying", 1)),
    ({"jobDeploymentStatus": "Failed", "reason": "AppFailed", "failed": 1}, 1, ("Failed", 2)),
    ({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded"}, 3, ("Failed", 1)),
    ({"jobDeploymentStatus": "Failed", "reason": "AppFailed"}, None, ("Failed", 1)),
    ({"jobDeploymentStatus": "Running"}, 1, ("Running", 0)),
])
def test_a_failed_attempt_is_retried_under_the_backoff_limit(status, limit, after):
    check_backoff_limit({"backoffLimit": limit}, status)
    assert (status["jobDeploymentStatus"], status["failed"]) == after


def test_a_suspended_rayjob_waits_then_runs_and_its_deletion_takes_the_cluster_along(cluster):
    api, core = _api(cluster), client.CoreV1Api(cluster.api())
    api.create_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", _rayjob("queued", suspend=True))
    wait_for("Suspended", lambda: _status(cluster, "queued").get("jobDeploymentStatus") == "Suspended")
    assert api.list_namespaced_custom_object("ray.io", "v1", "default", "rayclusters")["items"] == []
    api.patch_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", "queued", {"spec": {"suspend": False}})
    status = wait_for("a RayCluster", lambda: (s := _status(cluster, "queued")).get("rayClusterName") and s)
    assert status["jobDeploymentStatus"] == "Initializing" and status["jobId"].startswith("queued-")
    ray_cluster = status["rayClusterName"]
    [made] = api.list_namespaced_custom_object("ray.io", "v1", "default", "rayclusters")["items"]
    assert made["metadata"]["name"] == ray_cluster and made["metadata"]["labels"] == {
        "ray.io/originated-from-cr-name": "queued", "ray.io/originated-from-crd": "RayJob",
        "ray.io/job-submission-mode": "K8sJobMode"}
    pods = wait_for("the head and the worker", lambda: len(items := core.list_namespaced_pod(
        "default", label_selector=f"{CLUSTER_LABEL}={ray_cluster}").items) == 2 and items)
    assert sorted(p.metadata.labels["ray.io/node-type"] for p in pods) == ["head", "worker"]
    assert core.read_namespaced_secret(ray_cluster, "default").data["auth_token"]
    if shutil.which("kubectl"):
        out = subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "get", "rayclusters"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert out.split("\n")[0].split()[:3] == ["NAME", "DESIRED", "WORKERS"] and ray_cluster in out

    # once the cluster is ready the controller creates the submitter Job (named after the RayJob) and its pod: wait
    # for that, so what the deletion takes along and the events it leaves are the same on every run
    wait_for("the submitter's pod", lambda: "SuccessfulCreate" in [r for _, r, _ in _events(cluster, "queued")],
             timeout=240)  # the Ray pods must be ready first: slow on a loaded host
    api.delete_namespaced_custom_object("ray.io", "v1", "default", "rayjobs", "queued")
    assert cluster.server.store.list(RAYCLUSTERS, "default")[0] == []
    assert core.list_namespaced_pod("default", label_selector=f"{CLUSTER_LABEL}={ray_cluster}").items == []
    assert [s.metadata.name for s in core.list_namespaced_secret("default").items] == []
    assert cluster.server.live_pids() == []
    assert sorted(r for _, r, _ in _events(cluster, "queued")) == ["CreatedRayCluster", "CreatedRayJobSubmitter",
                                                                    "SuccessfulCreate"]
