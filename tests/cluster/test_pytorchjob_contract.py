"""The test server's operator follows the Training Operator v1.9's source (tests/cluster/pytorchjob_contract.py), not
kfloop's code: the expected values below are read off the cited operator files, and the test cluster imports
nothing of kfloop."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from cluster import pytorchjob_contract as operator
from cluster.kubernetes_cluster import PYTHON, pytorchjob, status_of
from polling import wait_for

FAKES = Path(__file__).resolve().parent
KFLOOP_PACKAGES = {"training", "pipelines", "components", "monitoring", "data"}


def test_no_file_of_the_test_cluster_imports_kfloop():
    offenders = []
    for path in sorted(FAKES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in KFLOOP_PACKAGES]
    assert offenders == []


def _env(job: dict, rtype: str, index: int) -> dict[str, str]:
    return {e["name"]: e["value"] for e in operator.pod_env(operator.default_job(job), rtype, index)}


def test_env_of_a_master_worker_job_is_envvar_go_and_master_go():
    job = pytorchjob("churn", ["true"], workers=2, nproc_per_node="4")
    assert operator.pod_env(operator.default_job(job), "Worker", 1) == [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "MASTER_PORT", "value": "23456"}, {"name": "PET_MASTER_PORT", "value": "23456"},
        {"name": "MASTER_ADDR", "value": "churn-master-0"}, {"name": "PET_MASTER_ADDR", "value": "churn-master-0"},
        {"name": "WORLD_SIZE", "value": "12"}, {"name": "RANK", "value": "2"}, {"name": "PET_NODE_RANK", "value": "2"},
        {"name": "PET_NPROC_PER_NODE", "value": "4"}, {"name": "PET_NNODES", "value": "3"}]
    assert _env(job, "Master", 0)["RANK"] == "0"


def test_nproc_auto_counts_one_process_per_replica_in_world_size():
    job = pytorchjob("auto", ["true"], workers=1)
    del job["spec"]["nprocPerNode"]  # the defaulter sets "auto"
    env = _env(job, "Worker", 0)
    assert (env["PET_NPROC_PER_NODE"], env["WORLD_SIZE"]) == ("auto", "2")


def test_elastic_policy_sets_the_rendezvous_and_a_node_range():
    job = pytorchjob("elastic", ["true"], workers=3)
    job["spec"]["elasticPolicy"] = {"maxReplicas": 4, "maxRestarts": 2, "rdzvConf": [{"key": "timeout", "value": "9"}]}
    env = operator.pod_env(operator.default_job(job), "Worker", 0)
    names = [e["name"] for e in env]
    assert names[-5:] == ["PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_NNODES", "PET_MAX_RESTARTS", "PET_RDZV_CONF"]
    values = {e["name"]: e["value"] for e in env}
    # rdzvHost unset: worker-0 and the Worker's port; min defaults to max
    assert values["PET_RDZV_ENDPOINT"] == "elastic-worker-0:23456" and values["PET_NNODES"] == "4:4"
    assert (values["PET_RDZV_BACKEND"], values["PET_MAX_RESTARTS"], values["PET_RDZV_CONF"]) == ("c10d", "2",
                                                                                                 "timeout=9")


def test_without_a_master_there_is_no_master_env_and_no_init_container():
    job = pytorchjob("workers-only", ["true"], workers=2)
    del job["spec"]["pytorchReplicaSpecs"]["Master"]
    job = operator.default_job(job)
    assert _env(job, "Worker", 1) == {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": "1", "PET_NNODES": "2"}
    assert operator.init_containers(job, "Worker") == []


def test_pods_carry_the_operators_names_labels_and_init_container():
    job = operator.default_job(pytorchjob("named", ["true"], workers=1))
    worker = operator.pod_template(job, "Worker", 0)
    assert worker["metadata"]["name"] == "named-worker-0"
    assert worker["metadata"]["labels"] == {
        "training.kubeflow.org/operator-name": "pytorchjob-controller", "training.kubeflow.org/job-name": "named",
        "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"}
    (init,) = worker["spec"]["initContainers"]
    assert (init["name"], init["image"]) == ("init-pytorch", "alpine:3.10") and "securityContext" not in init
    assert "nslookup named-master-0" in init["command"][-1]
    master = operator.pod_template(job, "Master", 0)
    assert master["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"
    assert "initContainers" not in master["spec"]


_PRINT_ENV = "import json, os, pathlib; pathlib.Path({out!r}).joinpath(os.environ['HOSTNAME']).write_text(" \
             "json.dumps(dict(os.environ)))"


def test_every_container_of_a_replica_gets_the_env_and_a_declared_port_is_honoured(cluster):
    """The operator appends its env to every container (the job's own entries stay first); a declared
    ``pytorchjob-port`` other than the operator's default is the MASTER_PORT as written."""
    from kubernetes import client

    from cluster.server_process import free_port

    out = cluster.shared
    body = pytorchjob("every-container", [PYTHON, "-c", _PRINT_ENV.format(out=str(out))], workers=1, containers=2)
    port = free_port()
    for rspec in body["spec"]["pytorchReplicaSpecs"].values():
        rspec["template"]["spec"]["containers"][0]["ports"] = [{"name": "pytorchjob-port", "containerPort": port}]
    client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", body)
    wait_for("both pods to run their container", lambda: len(list(out.glob("every-container-*"))) == 2, timeout=60)
    core = client.CoreV1Api(cluster.api())
    worker = core.read_namespaced_pod("every-container-worker-0", "default")
    for container in worker.spec.containers:
        names = [e.name for e in container.env or []]
        assert names[-10:] == ["PYTHONUNBUFFERED", "MASTER_PORT", "PET_MASTER_PORT", "MASTER_ADDR", "PET_MASTER_ADDR",
                               "WORLD_SIZE", "RANK", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_NNODES"]
    assert [e.name for e in worker.spec.containers[0].env][0] == "OWN"
    seen = json.loads((out / "every-container-worker-0").read_text())
    assert (seen["MASTER_PORT"], seen["MASTER_ADDR"], seen["RANK"], seen["OWN"]) == (
        str(port), "every-container-master-0", "1", "kept")
    assert [s.name for s in worker.status.init_container_statuses] == ["init-pytorch"]
    assert worker.status.init_container_statuses[0].state.terminated.exit_code == 0  # it resolved the master


@pytest.mark.parametrize("declared", [False, True])
def test_the_operators_default_port_becomes_a_free_host_port(cluster, declared):
    from kubernetes import client

    body = pytorchjob(f"default-port-{declared}".lower(), ["true"], workers=0)
    if declared:
        body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["ports"] = [
            {"name": "pytorchjob-port", "containerPort": operator.DEFAULT_PORT}]
    client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", body)
    core = client.CoreV1Api(cluster.api())
    pod = wait_for("the master pod", lambda: core.list_namespaced_pod(
        "default", label_selector=f"training.kubeflow.org/job-name={body['metadata']['name']}").items)[0]
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    (port,) = [p.container_port for p in pod.spec.containers[0].ports if p.name == "pytorchjob-port"]
    assert env["MASTER_PORT"] == str(port) != str(operator.DEFAULT_PORT)


# ------------------------------------------------------------------------------------------------ the webhook

def _replica(replicas: int | None = 1, containers: list[dict] | None = None) -> dict:
    """A replica spec of pytorchjob_webhook_test.go (``replicas`` None: unset)."""
    spec = {"restartPolicy": "OnFailure", "template": {"spec": {"containers": containers if containers is not None
                                                                 else [{"name": "pytorch", "image": "img:1"}]}}}
    return spec if replicas is None else {"replicas": replicas, **spec}


_VALID = {"Master": _replica(), "Worker": _replica()}
_MASTER = "spec.pytorchReplicaSpecs[Master]"
_WORKER = "spec.pytorchReplicaSpecs[Worker]"

# TestValidateV1PyTorchJob (pkg/webhooks/pytorch/pytorchjob_webhook_test.go, v1.9.0): name, spec, old spec, the
# errors as "<field>: <type>" (upstream compares field and type, ignoring detail and value), the warnings.
WEBHOOK_VECTORS = {
    "valid PyTorchJob": ("test", {"runPolicy": {"managedBy": "kubeflow.org/training-operator"},
                                  "elasticPolicy": {"rdzvBackend": "c10d"}, "pytorchReplicaSpecs": _VALID},
                         None, [], []),
    "pytorchJob name does not meet DNS1035": ("0-test", {"pytorchReplicaSpecs": _VALID}, None,
                                              ["metadata.name: Invalid value"], []),
    "no containers": ("test", {"pytorchReplicaSpecs": {"Worker": _replica(None, [])}}, None,
                      [f"{_WORKER}.template.spec.containers: Required value"] * 2, []),
    "image is empty": ("test", {"pytorchReplicaSpecs": {"Worker": _replica(None, [{"name": "pytorch", "image": ""}])}},
                       None, [f"{_WORKER}.template.spec.containers[0].image: Required value"], []),
    "pytorchJob default container name doesn't present": (
        "test", {"pytorchReplicaSpecs": {"Worker": _replica(None, [{"name": "", "image": "img:1"}])}}, None,
        [f"{_WORKER}.template.spec.containers: Required value"], []),
    "the number of replicas in masterReplica is other than 1": (
        "test", {"pytorchReplicaSpecs": {"Master": _replica(2)}}, None, [f"{_MASTER}.replicas: Forbidden"], []),
    "Spec.ElasticPolicy.NProcPerNode are set": (
        "test", {"elasticPolicy": {"nProcPerNode": 1}, "pytorchReplicaSpecs": _VALID}, None, [],
        ["spec.elasticPolicy.nProcPerNode is deprecated, use spec.nprocPerNode instead"]),
    "Spec.NprocPerNode and Spec.ElasticPolicy.NProcPerNode are set": (
        "test", {"nprocPerNode": "1", "elasticPolicy": {"nProcPerNode": 1}, "pytorchReplicaSpecs": _VALID}, None,
        ["spec.elasticPolicy.nProcPerNode: Forbidden"],
        ["spec.elasticPolicy.nProcPerNode is deprecated, use spec.nprocPerNode instead"]),
    "attempt to set unsupported managedBy controller name gets rejected": (
        "test", {"runPolicy": {"managedBy": "other-job-controller"}, "pytorchReplicaSpecs": _VALID}, None,
        ["spec.runPolicy.managedBy: Unsupported value"], []),
    "attempt to update the managedBy field gets rejected": (
        "test", {"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue"}, "pytorchReplicaSpecs": _VALID},
        {"runPolicy": {"managedBy": "kubeflow.org/training-operator"}, "pytorchReplicaSpecs": _VALID},
        ["spec.runPolicy.managedBy: Invalid value"], []),
    "attempt to configure elasticPolicy when no worker is configured": (
        "test", {"elasticPolicy": {}, "pytorchReplicaSpecs": {"Master": _replica()}}, None,
        [f"{_WORKER}: Required value"], []),
    "attempt to configure worker with 0 replicas": (
        "test", {"elasticPolicy": {}, "pytorchReplicaSpecs": {"Worker": _replica(0)}}, None,
        [f"{_WORKER}.replicas: Forbidden"], []),
}


@pytest.mark.parametrize("case", list(WEBHOOK_VECTORS))
def test_the_webhook_passes_the_operators_own_test_cases(case):
    name, spec, old_spec, want_errors, want_warnings = WEBHOOK_VECTORS[case]
    old = None if old_spec is None else {"metadata": {"name": name}, "spec": old_spec}
    warnings, errors = operator.validate({"metadata": {"name": name}, "spec": spec}, old)
    assert [": ".join(e.split(": ")[:2]) for e in errors] == want_errors
    assert warnings == want_warnings


def test_the_cluster_refuses_what_the_webhook_refuses_in_upstreams_words(cluster):
    from kubernetes import client

    body = pytorchjob("0-test", ["true"], workers=1)
    body["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(client.ApiException) as refused:
        client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", body)
    assert refused.value.status == 403
    assert status_of(refused.value)["message"] == (
        'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied the request: ['
        'metadata.name: Invalid value: "0-test": should match: a DNS-1035 label must consist of lower case '
        "alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character "
        "(e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?'), "
        "spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1]")
    assert cluster.jobs() == []


def test_a_pod_name_too_long_for_its_service_is_a_failed_create_service_event(cluster):
    """A 60-character job name passes the webhook, but the API server refuses the services ``<job>-master-0`` and
    ``<job>-worker-0``: the operator's FailedCreateService events."""
    from kubernetes import client

    name = "j" * 60
    client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", pytorchjob(name, ["true"], workers=1))
    core = client.CoreV1Api(cluster.api())
    events = wait_for("both FailedCreateService events", lambda: (found := [
        e.message for e in core.list_namespaced_event("default").items if e.reason == "FailedCreateService"]) and
        len(found) == 2 and found)
    assert sorted(events) == [f'Error creating: Service "{service}" is invalid: metadata.name: Invalid value: '
                              f'"{service}": must be no more than 63 characters'
                              for service in (f"{name}-master-0", f"{name}-worker-0")]
