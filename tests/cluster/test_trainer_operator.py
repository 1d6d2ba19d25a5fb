"""The test server's Kubeflow Trainer v2.3.0 (tests/cluster/trainer_operator.py), with hand-written TrainJobs (not
kfloop's renderer): its webhook's refusals, the pods and env its tables give, runtimePatches as strategic merges."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from cluster.kubernetes_cluster import CLAIM, status_of
from cluster.trainer_operator import (JOB_NAME_TOO_LONG, JOBSET_NAME_LABEL, POD_NAME_TOO_LONG, jobset_problems,
                                    runtime_patch_problems, strategic_merge)
from polling import wait_for

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"


def _trainjob(name: str, **spec) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec}}


def _create(cluster, body: dict) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                                                                  body)


@pytest.mark.parametrize("spec, message", [
    ({"trainer": {"env": [{"name": "PET_NNODES", "value": "4"}, {"name": "HOME", "value": "/tmp"},
                          {"name": "PET_MASTER_PORT", "value": "1"}]}},
     'spec.trainer.env: Invalid value: []v1.EnvVar{v1.EnvVar{Name:"PET_NNODES", Value:"4", '
     'ValueFrom:(*v1.EnvVarSource)(nil)}, v1.EnvVar{Name:"HOME", Value:"/tmp", ValueFrom:(*v1.EnvVarSource)(nil)}, '
     'v1.EnvVar{Name:"PET_MASTER_PORT", Value:"1", ValueFrom:(*v1.EnvVarSource)(nil)}}: must not have reserved envs, '
     "invalid envs configured: [PET_MASTER_PORT PET_NNODES]"),
    ({"runtimeRef": {"name": "torch-gone"}},
     'spec.RuntimeRef: Invalid value: v1alpha1.RuntimeRef{Name:"torch-gone", APIGroup:(*string)(0xc000100000), '
     'Kind:(*string)(0xc000100010)}: clustertrainingruntimes.trainer.kubeflow.org '
     '"torch-gone" not found: specified clusterTrainingRuntime must be created before the TrainJob is created'),
    ({"runtimeRef": {"name": "torch-distributed", "kind": "MPIRuntime"}},
     "unsupported runtime: MPIRuntime.trainer.kubeflow.org"),
    ({"runtimePatches": [{"manager": "kfloop", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [
            {"name": "node", "env": [{"name": "A", "value": "b"}]}]}}}}}]}}}}]},
     '[spec.runtimePatches.manager: Invalid value: "kfloop": must be a domain-prefixed path (such as "acme.io/foo"), '
     "spec.runtimePatches: Invalid value: must not have envs for the dataset-initializer, model-initializer, node "
     "containers]"),
])
def test_the_webhook_refuses_what_trainer_refuses(cluster, spec, message):
    from kubernetes import client

    with pytest.raises(client.ApiException) as refused:
        _create(cluster, _trainjob("refused", **spec))
    assert refused.value.status == 403 and status_of(refused.value)["reason"] == "Forbidden"
    assert status_of(refused.value)["message"] == (
        f'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: {message}')
    assert client.CustomObjectsApi(cluster.api()).list_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL)["items"] == []


def test_pods_get_the_torch_plugins_env_and_jobsets_names(cluster):
    """3 nodes on the installed torch-distributed runtime; numProcPerNode unset, 1.5 CPUs: ``auto`` gives 2."""
    from kubernetes import client

    out = cluster.shared / "env"
    out.mkdir()
    script = (f"import json, os, socket; open('{out}/' + os.environ['PET_NODE_RANK'], 'w').write(json.dumps("
              "{k: v for k, v in os.environ.items() if k.startswith(('PET_', 'JOB_'))}"
              " | {'host': socket.gethostname()}))")
    patch = {"manager": "test.example/patch", "trainingRuntimeSpec": {"template": {
        "metadata": {"annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "rack"}},
        "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
            "metadata": {"labels": {"team": "a"}},
            "spec": {"volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": CLAIM}}],
                     "containers": [{"name": "node", "volumeMounts": [
                         {"name": "shared", "mountPath": str(cluster.shared)}]}]}}}}}]}}}}
    _create(cluster, _trainjob("three", runtimePatches=[patch], trainer={
        "command": ["python", "-c", script], "numNodes": 3, "resourcesPerNode": {"requests": {"cpu": "1500m"}}}))

    def complete():
        job = client.CustomObjectsApi(cluster.api()).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                                                                  "three")
        return [c for c in job.get("status", {}).get("conditions", []) if c["type"] == "Complete"]

    (condition,) = wait_for("the TrainJob to complete", complete, timeout=60)
    assert (condition["reason"], condition["message"]) == ("AllJobsCompleted", "jobset completed successfully")
    pods = client.CoreV1Api(cluster.api()).list_namespaced_pod("default",
                                                              label_selector=f"{JOBSET_NAME_LABEL}=three").items
    by_index = {p.metadata.labels["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    assert sorted(by_index) == ["0", "1", "2"]
    for index, pod in by_index.items():
        assert pod.metadata.name.startswith(f"three-node-0-{index}-") and pod.metadata.labels["team"] == "a"
        assert pod.metadata.annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"] == "rack"
        (container,) = pod.spec.containers
        assert container.image == "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"  # the runtime's, kept
        seen = json.loads((out / index).read_text())
        port = seen.pop("PET_MASTER_PORT")
        assert seen == {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": index,
                        "PET_MASTER_ADDR": "three-node-0-0.three", "JOB_COMPLETION_INDEX": index,
                        "host": pod.metadata.name}
        assert port.isdigit()  # a free host port in place of 29500: pods share the host network


def test_runtime_patches_merge_like_a_strategic_merge_patch():
    runtime = {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
        "containers": [{"name": "node", "image": "img", "volumeMounts": [{"name": "a", "mountPath": "/a"}]}],
        "tolerations": [{"key": "old"}]}}}}}]}
    patch = {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
        "containers": [{"name": "node", "volumeMounts": [{"name": "b", "mountPath": "/b"}]}],
        "tolerations": [{"key": "new"}]}}}}}]}
    pod = strategic_merge(runtime, patch)["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"] == [{"name": "node", "image": "img", "volumeMounts": [
        {"name": "a", "mountPath": "/a"}, {"name": "b", "mountPath": "/b"}]}]
    assert pod["tolerations"] == [{"key": "new"}]  # no patch merge key: replaced


def test_the_trainer_emulation_reads_nothing_of_kfloop():
    tree = ast.parse((Path(__file__).parent / "trainer_operator.py").read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in modules if m.split(".")[0] in ("training", "pipelines", "components", "monitoring",
                                                          "data")}


@pytest.mark.parametrize("name, message", [
    ("a" * 64, "metadata.name must be no more than 63 characters"),
    ("0-test", "metadata.name must match RFC 1035 DNS label format"),
])
def test_the_crd_refuses_names_its_cel_rules_refuse(cluster, name, message):
    from kubernetes import client

    with pytest.raises(client.ApiException) as refused:
        _create(cluster, _trainjob(name))
    assert refused.value.status == 422
    assert status_of(refused.value)["message"] == (
        f'TrainJob.trainer.kubeflow.org "{name}" is invalid: <nil>: Invalid value: "object": {message}')


def _rjob(replicas: int, completions: int | None = None) -> dict:
    spec = {} if completions is None else {"completionMode": "Indexed", "completions": completions}
    return {"name": "rj", "replicas": replicas, "template": {"spec": spec}}


# jobset_webhook_test.go (v0.12.0) TestValidateCreate's name cases (the third ours: names within the limits): JobSet
# name, replicated jobs, JobSet's message
@pytest.mark.parametrize("name, rjobs, message", [
    ("a" * 62, [_rjob(101)], JOB_NAME_TOO_LONG),
    ("a" * 56, [_rjob(1, 1)], POD_NAME_TOO_LONG),
    ("a" * 10, [_rjob(101, 1000)], None),
])
def test_jobsets_name_checks_pass_jobsets_own_test_cases(name, rjobs, message):
    problems = jobset_problems(name, rjobs)
    assert [p.rsplit(": ", 1)[1] for p in problems] == ([message] if message else [])


def test_a_trainjob_whose_pod_names_would_pass_63_makes_no_pods(cluster):
    """50 characters pass the CRD and Trainer's webhook, but ``<name>-node-0-0-<5>`` is 65: JobSet's webhook refuses
    the JobSet, Trainer reports it as an event, and no pod is made."""
    from kubernetes import client

    name = "t" * 50
    _create(cluster, _trainjob(name, trainer={"command": ["true"]}))
    core = client.CoreV1Api(cluster.api())
    (event,) = wait_for("Trainer's event", lambda: [e for e in core.list_namespaced_event("default").items
                                                    if e.reason == "TrainJobResourcesCreationFailed"])
    assert event.type == "Warning" and event.message == (
        'TrainJob resources reconciliation failed: admission webhook "vjobset.kb.io" denied the request: '
        f'JobSet.jobset.x-k8s.io "{name}" is invalid: spec.replicatedJobs[0].name: Invalid value: "{name}-node-0": '
        "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters")
    assert core.list_namespaced_pod("default").items == []


def _patch(pod: dict | None = None, job: str = "node") -> dict:
    template = {"template": {"spec": {"template": {"spec": pod}}}} if pod is not None else {}
    return {"manager": "test.example/patch",
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{"name": job, **template}]}}}}


# TestValidate (pkg/runtime/framework/plugins/jobset/jobset_test.go, v2.3.0), its runtimePatches cases on create:
# the runtime's node job has the init container custom-init and the container node.
PATCH_VECTORS = {
    "runtimePatches contain invalid replicated job": (
        _patch(job="invalid"), "must not have replicated job that doesn't exist in the runtime job template"),
    "runtimePatches contain invalid initContainer": (
        _patch({"initContainers": [{"name": "invalid"}]}),
        "must not have initContainer that doesn't exist in the runtime job node"),
    "runtimePatches contain invalid container": (
        _patch({"containers": [{"name": "invalid"}]}),
        "must not have container that doesn't exist in the runtime job node"),
    "runtimePatches contain envs for reserved container": (
        _patch({"containers": [{"name": "node", "env": [{"name": "ENV_NAME", "value": "v"}]}]}),
        "must not have envs for the dataset-initializer, model-initializer, node containers"),
    "allow runtimePatches when creating a new trainJob": (_patch({"containers": [{"name": "node"}]}), None),
}


@pytest.mark.parametrize("case", list(PATCH_VECTORS))
def test_runtime_patches_pass_trainers_own_test_cases(case):
    patch, message = PATCH_VECTORS[case]
    runtime = {"spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
        "spec": {"initContainers": [{"name": "custom-init"}], "containers": [{"name": "node"}]}}}}}]}}}}
    assert runtime_patch_problems([patch], runtime) == (
        [f"spec.runtimePatches: Invalid value: {message}"] if message else [])
