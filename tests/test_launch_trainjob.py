"""TrainJobs (Kubeflow Trainer v2.3.0) through the Kubernetes launcher, against the test API server whose Trainer
emulation (tests/cluster/trainer_operator.py) follows Trainer's, JobSet's and the Job controller's source: a 2 x 2
TrainJob trains to a registered candidate with the env of Trainer's torch plugin, and failures, Kueue's suspend and
cancelling behave as for PyTorchJobs. Nothing here patches a client."""
from __future__ import annotations

import json
import re
import signal
import threading
from pathlib import Path

import pytest
import yaml

from cluster.kubernetes_cluster import Cluster
from cluster.trainer_operator import JOBSET_NAME_LABEL, RESERVED_ENV, torch_env
from polling import wait_for
from test_launch_kubernetes import FAST, kfloop_train_forever, register_candidate, train_2x2

from pipelines.cli.commands import main
from training.config import JobShape, TrainingConfig
from training.launch.kubernetes import JobRun, KubernetesSettings, LaunchPolicy
from training.launch.local import LaunchError
from training.launch.manifests import job_name_for, render, training_job_spec

def _settings(cluster: Cluster, **overrides) -> dict:
    return {**cluster.settings(), "kind": "trainjob", **overrides}


def _body(cluster: Cluster, name: str, command: list[str], *, nnodes: int = 2, **overrides) -> dict:
    """A rendered TrainJob whose nodes run ``command`` instead of training."""
    settings = KubernetesSettings.from_dict(_settings(cluster, **overrides)).cluster
    body = render(training_job_spec(TrainingConfig(), JobShape(nnodes=nnodes), settings, name=name), settings)
    body["spec"]["trainer"].update(command=command, args=[])
    return body


def _trainjobs(cluster: Cluster) -> list[dict]:
    from kubernetes import client

    return client.CustomObjectsApi(cluster.api()).list_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs")["items"]


def _pods(cluster: Cluster, name: str) -> list:
    from kubernetes import client

    return client.CoreV1Api(cluster.api()).list_namespaced_pod(
        "default", label_selector=f"{JOBSET_NAME_LABEL}={name}").items


def _policy(cluster: Cluster, **fields) -> LaunchPolicy:
    return LaunchPolicy(kubeconfig=str(cluster.kubeconfig), poll_seconds=0.5, **fields)


def test_a_2x2_trainjob_trains_to_a_registered_candidate_with_the_trainer_env(cluster, isolated_env, demo_files,
                                                                                tmp_path, capsys, monkeypatch):
    import mlflow
    from kubernetes import client

    # no cluster.image: the job runs the launching step's image (KFLOOP_IMAGE, set on every compiled step) and
    # pulls it with the step's pull secrets; the lineage records it (issue 32 item 2)
    commit_image = "ghcr.io/acme/kfloop:" + "c" * 40
    monkeypatch.setenv("KFLOOP_IMAGE", commit_image)
    monkeypatch.setenv("KFLOOP_IMAGE_PULL_SECRETS", "ghcr")
    settings = {k: v for k, v in _settings(cluster).items() if k != "image"}
    prepared, model_dir, result = train_2x2(cluster, isolated_env, demo_files, tmp_path, "tj-model", "run-tj-1",
                                            settings)
    description = json.loads((model_dir / "model.json").read_text())
    assert description["world_size"] == 4 and len(description["param_digests"]) == 4

    name = job_name_for("run-tj-1")
    (trainjob,) = _trainjobs(cluster)
    assert [c["type"] for c in trainjob["status"]["conditions"] if c["status"] == "True"] == ["Complete"]
    assert not {e["name"] for e in trainjob["spec"]["trainer"]["env"]} & set(RESERVED_ENV)
    pods = sorted(_pods(cluster, name), key=lambda p: p.metadata.name)
    assert [re.fullmatch(rf"{name}-node-0-(\d)-[a-z0-9]{{5}}", p.metadata.name)[1] for p in pods] == ["0", "1"]
    port = next(int(e.value) for e in pods[0].spec.containers[0].env if e.name == "PET_MASTER_PORT")
    expected = [client.ApiClient().sanitize_for_serialization(e) for e in
                torch_env(trainjob, 2, trainjob["spec"]["trainer"]["resourcesPerNode"], port)]
    for index, pod in enumerate(pods):
        (container,) = pod.spec.containers
        assert container.name == "node" and pod.status.phase == "Succeeded"
        assert container.image == commit_image and [s.name for s in pod.spec.image_pull_secrets] == ["ghcr"]
        given = [client.ApiClient().sanitize_for_serialization(e) for e in container.env if e.name in RESERVED_ENV]
        assert given == expected  # the torch plugin's table, node rank from the completion index
        assert pod.metadata.annotations["batch.kubernetes.io/job-completion-index"] == str(index)
        assert (pod.spec.hostname, pod.spec.subdomain) == (f"{name}-node-0-{index}", name)
    log = client.CoreV1Api(cluster.api()).read_namespaced_pod_log(pods[0].metadata.name, "default")
    assert "[rank 0]" in log and (isolated_env.workdir / "logs" / "run-tj-1" / "master.log").read_text() == log

    version = register_candidate(tmp_path, prepared, model_dir, result.run_id, "tj-model", "run-tj-1")
    registered = mlflow.MlflowClient().get_model_version("tj-model", version)
    assert registered.run_id == result.run_id and registered.tags["image"] == commit_image

    # the dry run is the launch: `kfloop render-job --kind trainjob` prints the very body the launcher POSTed
    (posted,) = [raw for method, path, raw in cluster.server.received if method == "POST"
                 and path.endswith("/trainjobs")]
    config = tmp_path / "kfloop.yaml"
    config.write_text(yaml.safe_dump({"training": {**FAST, "nnodes": 2, "nproc_per_node": 2},
                                      "cluster": settings}))
    capsys.readouterr()
    assert main(["render-job", "--kind", "trainjob", "--run-id", "run-tj-1", "--config", str(config)]) == 0
    assert capsys.readouterr().out == yaml.safe_dump(json.loads(posted), sort_keys=False)


def test_a_failed_trainjob_fails_the_launch_with_the_failing_pods_log(cluster, tmp_path):
    """A TrainingRuntime of the namespace whose Job gives up at once: the pod of node 1 exits 3, the Job fails,
    JobSet's Failed condition reaches the TrainJob, and the launcher reports it (the job stays for inspection)."""
    from kubernetes import client

    runtime = yaml.safe_load((Path(__file__).parent / "cluster" / "specs" /
                              "trainer-v2.3.0-torch-distributed-runtime.yaml").read_text())
    runtime.update(kind="TrainingRuntime", metadata={"name": "torch-once"})
    job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    job["backoffLimit"] = 0
    job["template"]["spec"]["restartPolicy"] = "Never"
    client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "default", "trainingruntimes", runtime)
    body = _body(cluster, "fails-once", ["python", "-c", "import os, sys, time\nif os.environ['PET_NODE_RANK'] == '1':"
                                                         "\n    sys.exit('node 1 gives up')\ntime.sleep(600)"],
                 trainjob_runtime="torch-once", trainjob_runtime_kind="TrainingRuntime")
    with pytest.raises(LaunchError) as failed:
        JobRun(cluster.api(), body, policy=_policy(cluster), log_path=tmp_path / "master.log", timeout=120).run()
    message = str(failed.value)
    assert "TrainJob default/fails-once: FailedJobs: jobset failed due to one or more job failures" in message
    assert re.search(r"last log lines of fails-once-node-0-1-[a-z0-9]{5}:\n  \|   node 1 gives up", message)
    assert (failed.value.node, failed.value.node_exit_code) == (1, 1)
    assert [j["metadata"]["name"] for j in _trainjobs(cluster)] == ["fails-once"]  # ended by itself: kept
    assert cluster.server.live_pids() == []  # the failed Job's running pod was stopped


def test_a_node_that_keeps_failing_is_stopped_at_the_launchers_cap(cluster, tmp_path):
    """The runtime's pods restart in place (JobSet's OnFailure default) up to the Job's backoffLimit of 6: the
    launcher stops at its own cap and deletes the TrainJob."""
    body = _body(cluster, "crash-loop", ["python", "-c", "import os, sys, time\n"
                                         "if os.environ['PET_NODE_RANK'] == '1':\n    sys.exit(3)\ntime.sleep(600)"])
    with pytest.raises(LaunchError) as stopped:
        JobRun(cluster.api(), body, policy=_policy(cluster, restart_cap=2), log_path=tmp_path / "master.log",
               timeout=120).run()
    message = str(stopped.value)
    assert "TrainJob default/crash-loop: restarted 3 times, over the launcher's cap of 2 (the runtime's Job" in message
    assert (stopped.value.node, stopped.value.node_exit_code) == (1, 3)
    assert _trainjobs(cluster) == [] and _pods(cluster, "crash-loop") == []


def test_an_image_that_cannot_be_pulled_fails_at_once_and_deletes_the_trainjob(cluster, tmp_path):
    cluster.server.unpullable_images.add("kfloop:missing")
    body = _body(cluster, "no-image", ["true"], image="kfloop:missing")
    with pytest.raises(LaunchError) as failed:
        JobRun(cluster.api(), body, policy=_policy(cluster), log_path=tmp_path / "master.log", timeout=120).run()
    assert 'TrainJob default/no-image: pod no-image-node-0-' in str(failed.value)
    assert 'ImagePullBackOff: Back-off pulling image "kfloop:missing"' in str(failed.value)
    assert _trainjobs(cluster) == [] and _pods(cluster, "no-image") == []


def test_a_trainjob_for_kueue_waits_suspended_until_admitted(cluster, tmp_path, capsys):
    from kubernetes import client

    body = _body(cluster, "queued", ["python", "-c", "print('admitted and ran')"], nnodes=1, kueue_queue="team-a")
    assert body["spec"]["suspend"] is True
    run = JobRun(cluster.api(), body, policy=_policy(cluster), log_path=tmp_path / "master.log", timeout=120)
    outcome: dict = {}
    launcher = threading.Thread(target=lambda: outcome.update(job=run.run()))
    launcher.start()
    try:
        wait_for("the TrainJob to be suspended", lambda: _trainjobs(cluster) and any(
            c["type"] == "Suspended" and c["status"] == "True"
            for c in _trainjobs(cluster)[0].get("status", {}).get("conditions", [])), timeout=60)
        assert _pods(cluster, "queued") == []
        client.CustomObjectsApi(cluster.api()).patch_namespaced_custom_object(  # Kueue admits the workload
            "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", "queued", {"spec": {"suspend": False}})
    finally:
        launcher.join(timeout=120)
    conditions = {c["type"]: (c["status"], c["reason"]) for c in outcome["job"]["status"]["conditions"]}
    assert conditions == {"Suspended": ("False", "Resumed"), "Complete": ("True", "AllJobsCompleted")}
    assert "admitted and ran" in (tmp_path / "master.log").read_text()
    assert "is suspended until Kueue admits it" in capsys.readouterr().err


def test_kfloop_train_deletes_its_trainjob_when_cancelled(cluster, isolated_env, demo_files, tmp_path):
    step = kfloop_train_forever(_settings(cluster), demo_files, tmp_path)

    def running() -> str:
        jobs = _trainjobs(cluster)
        name = jobs[0]["metadata"]["name"] if jobs else ""
        return name if name and [p.status.phase for p in _pods(cluster, name)] == ["Running"] else ""

    name = wait_for("the TrainJob's pod to run", running, timeout=120)
    step.send_signal(signal.SIGTERM)
    assert step.wait(timeout=60) != 0
    assert _trainjobs(cluster) == [] and _pods(cluster, name) == []
    assert f"deleted TrainJob default/{name}" in (tmp_path / "kfloop-train.log").read_text()


@pytest.mark.parametrize("rdma", [False, True])
def test_a_restricted_namespace_admits_kfloops_trainjob_pods_and_the_launcher_names_what_it_refuses(
        rdma, cluster, tmp_path):
    """kfloop's runtimePatches make the runtime's pods meet the restricted profile; RDMA's IPC_LOCK does not, and
    the Job controller's FailedCreate event ends the launch at once instead of after the launcher's timeout."""
    from kubernetes import client

    from cluster.pod_security import ENFORCE_LABEL

    client.CoreV1Api(cluster.api()).patch_namespace("default", {"metadata": {"labels": {
        ENFORCE_LABEL: "restricted"}}})
    overrides = {"gpus_per_node": 2, "rdma_resource": "rdma/rdma_shared_device_a"} if rdma else {}
    run = JobRun(cluster.api(), _body(cluster, f"restricted-tj-{rdma}".lower(), ["true"], **overrides),
                 policy=_policy(cluster), log_path=tmp_path / "m.log", timeout=120)
    if not rdma:
        run.run()
        assert {p.status.phase for p in _pods(cluster, "restricted-tj-false")} == {"Succeeded"}
        return
    with pytest.raises(LaunchError) as refused:
        run.run()
    message = str(refused.value)
    assert "the operator cannot create its pods: Error creating: pods" in message
    assert 'violates PodSecurity "restricted:latest"' in message and '"IPC_LOCK"' in message
    assert "pod-security.kubernetes.io/enforce=privileged" in message and _trainjobs(cluster) == []


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
def test_kfloops_jobs_complete_in_a_profile_namespace_with_istio_injection_and_pod_security(kind, cluster, tmp_path):
    """A Kubeflow profile's namespace (``istio-injection: enabled``, Pod Security ``restricted``): kfloop's pods opt
    out of the sidecar, so none is injected and the job completes (tests/cluster/test_istio_injection.py shows a job
    without the opt-out never completing); the job goes in the launcher's namespace (cluster.namespace empty)."""
    from kubernetes import client

    from cluster.istio_injection import NAMESPACE_LABEL
    from cluster.pod_security import ENFORCE_LABEL

    client.CoreV1Api(cluster.api()).patch_namespace("default", {"metadata": {"labels": {
        ENFORCE_LABEL: "restricted", NAMESPACE_LABEL: "enabled"}}})
    name = f"profile-{kind}"
    if kind == "trainjob":
        body = _body(cluster, name, ["true"])
    else:  # one node: the operator's init-pytorch of Worker pods needs deploy/operator-restricted-init.yaml
        settings = KubernetesSettings.from_dict({**cluster.settings(), "kind": kind}).cluster
        body = render(training_job_spec(TrainingConfig(), JobShape(nnodes=1), settings, name=name), settings)
        body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"] = ["true"]
    assert "namespace" not in body["metadata"]
    job = JobRun(cluster.api(), body, policy=_policy(cluster), log_path=tmp_path / "m.log", timeout=120).run()
    assert job["metadata"]["namespace"] == "default"
    pods = client.CoreV1Api(cluster.api()).list_namespaced_pod("default").items
    assert pods and all(p.status.phase == "Succeeded" and [c.name for c in p.spec.containers] in (["node"], ["pytorch"])
                        for p in pods)
