"""The KFP test executor with a cluster (tests/cluster/kfp_executor.py): each container task a Pod created through
the Kubernetes test server as Argo's workflow controller, admitted (RBAC, PodDefaults, Istio, Pod Security) and run
by its kubelet; artifacts through an ``s3://`` pipeline root on the S3 test server, moved by the pod's launcher."""
# kfp reads the components' annotations at definition time: no `from __future__ import annotations` here.

import json
from contextlib import contextmanager
from pathlib import Path

import kfp
import pytest
import s3fs
import yaml
from cluster.docker_kubelet import DockerRuntime
from cluster.k8s_server import K8sServer
from cluster.kfp_executor import (ACCESS_LABEL, OBJECT_STORE_SECRET, KfpExecutor, ProcessEngine,
                                  unemulated_fields)
from cluster.kfp_multiuser import PROFILE_LABELS
from cluster.kfp_server import KfpApiServer
from cluster.s3_server import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Server
from kfp import compiler, dsl
from kfp import kubernetes as kfp_k8s
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from polling import wait_for

from components import kfp_client

TOKEN = "kfp-step-pod-token-7c1e"
IMAGE = "python:3.11"
NAMESPACE = "kfloop"
BUCKET = "pipelines"
PROFILE_MANIFESTS = Path(__file__).resolve().parents[1] / "deploy" / "kubeflow-profile.yaml"
(POD_DEFAULT,) = [d for d in yaml.safe_load_all(PROFILE_MANIFESTS.read_text()) if d["kind"] == "PodDefault"]


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def token_of(tag: str, out: dsl.Output[dsl.Artifact]):
    import os

    path = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH")
    print(f"step {tag} in pod {os.environ['KFP_POD_NAME']}")
    with open(out.path, "w") as f:
        f.write(f"{tag} " + (open(path).read() if path else "-"))


@dsl.pipeline(name="labelled")
def labelled_pipeline():
    labelled = token_of(tag="with").set_caching_options(False).set_cpu_limit("1").set_memory_request("64M")
    kfp_k8s.add_pod_label(labelled, ACCESS_LABEL, "true")
    kfp_k8s.set_image_pull_secrets(labelled, ["registry-creds"])
    token_of(tag="without").set_caching_options(False)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def wait_long():
    import time

    time.sleep(600)


@dsl.pipeline(name="long")
def long_pipeline():
    wait_long().set_caching_options(False)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def clean_up_on_sigterm(marker: str):
    import signal
    import sys
    import time

    def stop(signum, _frame):
        with open(marker, "w") as f:
            f.write(f"cleaned up after signal {signum}")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    open(f"{marker}.ready", "w").close()
    time.sleep(600)


@dsl.pipeline(name="cleanup")
def cleanup_pipeline(marker: str):
    clean_up_on_sigterm(marker=marker).set_caching_options(False)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def produce(word: str, data: dsl.Output[dsl.Dataset]):
    with open(data.path, "w") as f:
        f.write(f"{word} through the object store")


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def consume(data: dsl.Input[dsl.Dataset]) -> str:
    with open(data.path) as f:
        return f.read().upper()


@dsl.pipeline(name="s3-artifacts")
def s3_pipeline(word: str):
    consume(data=produce(word=word).set_caching_options(False).outputs["data"]).set_caching_options(False)


def start(client, pipeline, tmp_path, **arguments) -> str:
    path = tmp_path / f"{pipeline.name}.yaml"
    compiler.Compiler().compile(pipeline, str(path))
    return client.create_run_from_pipeline_package(str(path), arguments=arguments, service_account="kfloop").run_id


def finish(client, run_id):
    return kfp_client.wait(client, run_id, poll_seconds=0.02, timeout_seconds=120)


def tasks(run) -> dict[str, object]:
    return {t.display_name: t for t in run.run_details.task_details}


@contextmanager
def serving(tmp_path, **executor):
    """A cluster (namespace ``kfloop`` labelled as the profile controller labels a profile's, the profile's
    PodDefault), the KFP server and its executor (with ``executor``'s arguments); the admin's CoreV1Api and
    RbacAuthorizationV1Api."""
    with K8sServer(tmp_path / "k8s", namespace=NAMESPACE) as cluster, KfpApiServer(token=TOKEN) as server, \
            KfpExecutor(server, ProcessEngine(root=tmp_path / "pods"), pipeline_root=tmp_path / "root",
                        namespace=NAMESPACE, pod_defaults=[POD_DEFAULT], token=TOKEN, cluster=cluster, **executor):
        admin = kube_config.new_client_from_config(config_file=str(cluster.write_kubeconfig(tmp_path / "admin")))
        core = kube_client.CoreV1Api(admin)
        core.patch_namespace(NAMESPACE, {"metadata": {"labels": PROFILE_LABELS}})
        yield (cluster, kfp.Client(host=server.url, existing_token=TOKEN), core,
               kube_client.RbacAuthorizationV1Api(admin))


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with serving(tmp_path) as served:
        yield served


def test_a_step_is_a_pod_the_poddefault_admission_gives_its_token_only_when_labelled(served, tmp_path):
    cluster, client, core, _ = served
    run = finish(client, start(client, labelled_pipeline, tmp_path))

    assert run.state == "SUCCEEDED"
    outputs = sorted(p.read_text() for p in (tmp_path / "root").rglob("out"))
    assert outputs == ["with " + TOKEN, "without -"]
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(NAMESPACE).items}
    by_task = {name: pods[task.pod_name] for name, task in tasks(run).items()}
    with_token, without = by_task["token-of"], by_task["token-of-2"]
    assert with_token.metadata.labels[ACCESS_LABEL] == "true"
    assert "volume-kf-pipeline-token" in [v.name for v in with_token.spec.volumes]
    assert "volume-kf-pipeline-token" not in [v.name for v in without.spec.volumes]
    assert {p.spec.service_account_name for p in by_task.values()} == {"kfloop"}
    resources = with_token.spec.containers[0].resources
    assert (resources.limits, resources.requests) == ({"cpu": "1"}, {"memory": "64M"})
    assert [s.name for s in with_token.spec.image_pull_secrets] == ["registry-creds"]
    assert (without.spec.containers[0].resources, without.spec.image_pull_secrets) == (None, None)
    assert {p.status.container_statuses[0].state.terminated.exit_code for p in by_task.values()} == {0}
    log = core.read_namespaced_pod_log(with_token.metadata.name, NAMESPACE)
    assert f"step with in pod {with_token.metadata.name}" in log
    creations = [a for a in cluster.accesses if a.verb == "create" and a.resource == "pods"]
    assert {(a.user.name, a.namespace, a.allowed) for a in creations} == {
        ("system:serviceaccount:kubeflow:argo", NAMESPACE, True)}


def test_pod_security_restricted_refuses_the_step_pod_and_fails_the_task_with_its_message(served, tmp_path):
    _, client, core, _ = served
    core.patch_namespace(NAMESPACE, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    run = finish(client, start(client, labelled_pipeline, tmp_path))

    assert run.state == "FAILED"
    failed = [t for t in tasks(run).values() if t.state == "FAILED"]
    assert failed
    for task in failed:
        assert task.error.message.startswith(
            f'pods "{task.pod_name}" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true '
            '(pod or container "main" must set securityContext.runAsNonRoot=true)')
    assert core.list_namespaced_pod(NAMESPACE).items == []


def test_the_admins_non_root_default_lets_a_step_pod_into_a_restricted_namespace(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with serving(tmp_path, security_defaults={"runAsNonRoot": True, "runAsUser": 1000}) as (_, client, core, _):
        core.patch_namespace(NAMESPACE, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
        run = finish(client, start(client, labelled_pipeline, tmp_path))
        contexts = [p.spec.containers[0].security_context for p in core.list_namespaced_pod(NAMESPACE).items]

    assert run.state == "SUCCEEDED"
    assert [(c.run_as_non_root, c.run_as_user, c.allow_privilege_escalation, c.capabilities.drop) for c in contexts] \
        == [(True, 1000, False, ["ALL"])] * 2


def test_rbac_denying_argo_create_pods_fails_the_task(served, tmp_path):
    cluster, client, core, rbac = served
    rbac.delete_cluster_role_binding("argo-binding")
    run = finish(client, start(client, labelled_pipeline, tmp_path))

    assert run.state == "FAILED"
    messages = {t.error.message for t in tasks(run).values() if t.state == "FAILED"}
    assert messages == {'pods is forbidden: User "system:serviceaccount:kubeflow:argo" cannot create resource "pods" '
                        f'in API group "" in the namespace "{NAMESPACE}"'}
    assert [a.allowed for a in cluster.accesses if a.verb == "create" and a.resource == "pods"][:1] == [False]
    assert core.list_namespaced_pod(NAMESPACE).items == []


def test_a_step_pod_outside_a_profile_namespace_gets_no_poddefault(served, tmp_path):
    """The webhook's ``namespaceSelector`` (tests/cluster/pod_defaults.py ``NAMESPACE_SELECTOR``): without the
    profile's ``app.kubernetes.io/part-of`` label the API server does not call it, so even the labelled step (the
    trigger, in kfloop's pipelines) gets no token."""
    _, client, core, _ = served
    core.patch_namespace(NAMESPACE, {"metadata": {"labels": {"app.kubernetes.io/part-of": None}}})
    run = finish(client, start(client, labelled_pipeline, tmp_path))

    assert run.state == "SUCCEEDED"
    assert sorted(p.read_text() for p in (tmp_path / "root").rglob("out")) == ["with -", "without -"]
    pods = core.list_namespaced_pod(NAMESPACE).items
    assert len(pods) == 2 and not [p for p in pods if "volume-kf-pipeline-token" in [v.name for v in p.spec.volumes]]


def test_a_step_pod_in_an_injected_namespace_ends_with_its_main_container(served, tmp_path):
    """A profile's namespace has Istio's injection: the sidecar keeps the pod Running; the node ends with the main
    container (Argo)."""
    _, client, core, _ = served
    run = finish(client, start(client, labelled_pipeline, tmp_path))

    assert run.state == "SUCCEEDED"
    for task in tasks(run).values():
        pod = core.read_namespaced_pod(task.pod_name, NAMESPACE)
        assert [c.name for c in pod.spec.containers] == ["main", "istio-proxy"]
        assert pod.status.phase == "Running"
        assert pod.status.container_statuses[0].state.terminated.exit_code == 0


def test_terminating_a_run_deletes_its_running_step_pod(served, tmp_path):
    cluster, client, core, _ = served
    run_id = start(client, long_pipeline, tmp_path)
    (pod,) = wait_for("the step pod running", lambda: [p for p in core.list_namespaced_pod(NAMESPACE).items
                                                       if p.status.phase == "Running"])
    client.terminate_run(run_id)

    assert finish(client, run_id).state == "CANCELED"
    assert core.list_namespaced_pod(NAMESPACE).items == []
    assert cluster.live_pids() == []
    task = tasks(client.get_run(run_id))["wait-long"]
    assert (task.state, task.pod_name, [c.pod_name for c in task.child_tasks]) == (
        "CANCELED", pod.metadata.name, [pod.metadata.name])


def test_a_deleted_step_pods_sigterm_reaches_its_command_through_the_emissary(served, tmp_path):
    """emissary.go: the command runs in a process group of its own, and the SIGTERM the kubelet sends the
    container's entry on the pod's deletion is forwarded to that group: the command's handler cleans up."""
    _, client, _, _ = served
    marker = tmp_path / "cleaned-up"
    run_id = start(client, cleanup_pipeline, tmp_path, marker=str(marker))
    wait_for("the step's SIGTERM handler", lambda: Path(f"{marker}.ready").exists())
    client.terminate_run(run_id)

    assert finish(client, run_id).state == "CANCELED"
    assert marker.read_text() == "cleaned up after signal 15"


def test_an_artifact_passes_between_two_tasks_through_an_s3_pipeline_root(tmp_path, monkeypatch):
    """launcher_v2.go: the producer's pod uploads its Dataset to the s3:// root, the consumer's downloads it to
    ``/s3/...`` before its command; the executor outputs, uploaded too, name the s3:// URI."""
    monkeypatch.setenv("HOME", str(tmp_path))
    s3 = S3Server(root=tmp_path).start()
    try:
        store = s3fs.S3FileSystem(key=ACCESS_KEY_ID, secret=SECRET_ACCESS_KEY, client_kwargs={"endpoint_url": s3.url})
        store.mkdir(BUCKET)
        with K8sServer(tmp_path / "k8s", namespace=NAMESPACE) as cluster, KfpApiServer(token=TOKEN) as server, \
                KfpExecutor(server, ProcessEngine(root=tmp_path / "pods"), pipeline_root=f"s3://{BUCKET}/root",
                            namespace=NAMESPACE, token=TOKEN, cluster=cluster, object_store=s3.url):
            admin = kube_config.new_client_from_config(config_file=str(cluster.write_kubeconfig(tmp_path / "admin")))
            kube_client.CoreV1Api(admin).create_namespaced_secret(NAMESPACE, {
                "metadata": {"name": OBJECT_STORE_SECRET},
                "stringData": {"accesskey": ACCESS_KEY_ID, "secretkey": SECRET_ACCESS_KEY}})
            client = kfp.Client(host=server.url, existing_token=TOKEN)
            run = finish(client, start(client, s3_pipeline, tmp_path, word="hello"))
        prefix = f"{BUCKET}/root/run-{run.run_id[:8]}"
        assert run.state == "SUCCEEDED", run.error
        assert store.cat(f"{prefix}/produce/data").decode() == "hello through the object store"
        produced = json.loads(store.cat(f"{prefix}/produce/executor_output.json"))
        assert produced["artifacts"]["data"]["artifacts"][0]["uri"] == f"s3://{prefix}/produce/data"
        consumed = json.loads(store.cat(f"{prefix}/consume/executor_output.json"))
        assert consumed["parameterValues"]["Output"] == "HELLO THROUGH THE OBJECT STORE"
        assert not (tmp_path / "root").exists()
    finally:
        s3.stop()


def test_resources_and_pull_secrets_are_applied_only_by_step_pods(tmp_path):
    path = tmp_path / "labelled.yaml"
    compiler.Compiler().compile(labelled_pipeline, str(path))
    spec, platform = yaml.safe_load_all(path.read_text())

    assert unemulated_fields(spec, platform) == [
        "deploymentSpec.executors.exec-token-of.container.resources",
        "platforms.kubernetes.deploymentSpec.executors.exec-token-of.imagePullSecret"]
    assert unemulated_fields(spec, platform, pods=True) == []


def test_the_executor_needs_a_runner_step_pods_for_an_object_store_root_and_a_process_kubelet_for_a_host_one(
        tmp_path):
    with KfpApiServer() as server, K8sServer(tmp_path / "k8s", runtime=DockerRuntime(client=None)) as containers:
        with pytest.raises(ValueError) as nothing_runs:
            KfpExecutor(server, None, pipeline_root=tmp_path / "root")
        with pytest.raises(ValueError) as no_pods:
            KfpExecutor(server, ProcessEngine(root=tmp_path), pipeline_root=f"s3://{BUCKET}/root",
                        object_store="http://127.0.0.1:1")
        with pytest.raises(ValueError) as hidden:
            KfpExecutor(server, ProcessEngine(root=tmp_path), pipeline_root=tmp_path / "root", cluster=containers)
        with pytest.raises(ValueError) as labelled:
            KfpExecutor(server, None, pipeline_root=f"s3://{BUCKET}/root", object_store="http://127.0.0.1:1",
                        cluster=containers, namespace_labels=PROFILE_LABELS)

    assert str(nothing_runs.value) == "KfpExecutor needs an engine or a cluster to run the steps"
    assert str(no_pods.value) == (f"pipeline root s3://{BUCKET}/root: an object-store root needs the cluster's step "
                                  "pods and the object store's endpoint (KfpExecutor(cluster=..., object_store=URL))")
    assert str(hidden.value) == (f"pipeline root {tmp_path / 'root'}: the cluster's kubelet runs containers, which "
                                 "cannot see a host folder; use an s3:// pipeline root")
    assert str(labelled.value) == ("namespace kubeflow: its labels are the cluster's namespace object's (patch it "
                                   "through the cluster's API)")
