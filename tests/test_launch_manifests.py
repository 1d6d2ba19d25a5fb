"""`kfloop render-job` renderings checked against the real CRD schemas, the restricted Pod Security profile, and
the invalid combinations ClusterConfig refuses (issue 4 items 1-2; issue 7 item 16)."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

import yaml
from cluster import pytorchjob_contract, trainer_operator
from cluster.crd_schema import validate
from cluster.k8s_validation import service_refusal
from manifest_checks import pods, render_cli, restricted_violations

from data.errors import EXIT_SETTINGS
from pipelines.cli.commands import main
from training.launch.cluster import ClusterConfig
from training.config import JobShape, TrainingConfig
from training.launch.jobspec import OPERATOR_ENV, JobSpec
from training.launch.manifests import job_name_for, render_pytorchjob, render_trainjob, training_job_spec

ISTIO_OPT_OUT = {"sidecar.istio.io/inject": "false"}
TOLERATION = "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]"
# name -> `kfloop render-job` arguments; each a combination a user would run.
COMBINATIONS = {
    "cpu": ["--nnodes", "2", "--nproc-per-node", "2"],
    "1x8-gpu": ["--nnodes", "1", "--gpus-per-node", "8", "--set", f"cluster.tolerations={TOLERATION}"],
    "2x8-gpu": ["--nnodes", "2", "--gpus-per-node", "8", "--set", "cluster.nccl_socket_ifname=eth0",
                "--set", "cluster.nccl_ib_hca=mlx5_0,mlx5_1", "--set", "cluster.nccl_debug=INFO",
                "--set", "cluster.secret_env={AWS_SECRET_ACCESS_KEY: s3-credentials/secret-key}",
                "--set", "cluster.image_pull_secrets=[registry-creds]",
                "--set", "cluster.service_account_name=trainer"],
    "amd-2x8": ["--nnodes", "2", "--gpus-per-node", "8", "--set", "cluster.gpu_vendor=amd"],
    "mig": ["--nnodes", "2", "--set", "cluster.mig_profile=1g.18gb", "--set", "cluster.mig_devices_per_node=2"],
    "time-sliced": ["--nnodes", "2", "--nproc-per-node", "1",
                    "--set", "cluster.shared_gpu_resource=nvidia.com/gpu.shared"],
    "elastic": ["--nnodes", "3", "--gpus-per-node", "4", "--set", "cluster.elastic_min_nodes=2",
                "--set", "cluster.elastic_max_nodes=4", "--set", "training.max_restarts=3"],
    "volcano": ["--nnodes", "4", "--gpus-per-node", "8", "--set", "cluster.gang_scheduler=volcano",
                "--set", "cluster.gang_queue=research", "--set", "cluster.priority_class_name=training-high",
                "--set", "cluster.gang_schedule_timeout_seconds=600"],
    "scheduler-plugins": ["--nnodes", "2", "--set", "cluster.gang_scheduler=scheduler-plugins"],
    "kueue": ["--nnodes", "2", "--gpus-per-node", "8", "--set", "cluster.kueue_queue=team-a"],
    "kueue-topology": ["--nnodes", "2", "--set", "cluster.kueue_queue=team-a",
                       "--set", "cluster.topology_required=cloud.provider.com/topology-rack"],
    "numa-aligned": ["--nnodes", "2", "--gpus-per-node", "8", "--set", "cluster.numa_aligned=true",
                     "--set", "cluster.cpu=32", "--set", "cluster.memory=256Gi", "--set", "cluster.shm_size=64Gi",
                     "--set", "cluster.node_selector={nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}",
                     "--set", "cluster.affinity={podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: "
                              "[{topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: "
                              "{app.kubernetes.io/name: kfloop}}}]}}"],
    "run-policy": ["--nnodes", "2", "--set", "cluster.clean_pod_policy=Running", "--set",
                   "cluster.active_deadline_seconds=7200", "--set", "cluster.backoff_limit=2", "--set",
                   "cluster.ttl_seconds_after_finished=600", "--set", "training.max_restarts=2"],
    "trainjob": ["--kind", "trainjob", "--nnodes", "2", "--gpus-per-node", "8", "--set", "cluster.kueue_queue=team-a",
                 "--set", "cluster.secret_env={MLFLOW_TRACKING_TOKEN: mlflow/token}"],
    "trainjob-cpu": ["--kind", "trainjob", "--nnodes", "1", "--nproc-per-node", "2"],
    "trainjob-1x1": ["--kind", "trainjob", "--nnodes", "1", "--nproc-per-node", "1"],
    "trainjob-2x2": ["--set", "cluster.kind=trainjob", "--nnodes", "2", "--nproc-per-node", "2",
                     "--set", "training.max_restarts=2", "--set", "cluster.active_deadline_seconds=7200"],
    "trainjob-topology": ["--kind", "trainjob", "--nnodes", "4", "--gpus-per-node", "8",
                          "--set", "cluster.kueue_queue=team-a",
                          "--set", "cluster.topology_required=cloud.provider.com/topology-rack",
                          "--set", "cluster.exclusive_topology=cloud.google.com/gke-nodepool",
                          "--set", f"cluster.tolerations={TOLERATION}", "--set", "cluster.image_pull_secrets=[creds]",
                          "--set", "cluster.service_account_name=trainer",
                          "--set", "cluster.node_selector={nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}",
                          "--set", "cluster.affinity={podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: "
                                   "[{topologyKey: kubernetes.io/hostname}]}}"],
    "trainjob-preferred": ["--kind", "trainjob", "--nnodes", "2", "--set", "cluster.kueue_queue=team-a",
                           "--set", "cluster.topology_preferred=cloud.provider.com/topology-block",
                           "--set", "cluster.trainjob_runtime=torch-team",
                           "--set", "cluster.trainjob_runtime_kind=TrainingRuntime"],
}
TRAINJOBS = [name for name, argv in COMBINATIONS.items() if "trainjob" in " ".join(argv)]
PYTORCHJOBS = [name for name in COMBINATIONS if name not in TRAINJOBS]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict]:
    """Every combination rendered once through the CLI (module scope: rendering is pure)."""
    return {name: render_cli(argv) for name, argv in COMBINATIONS.items()}


@pytest.mark.parametrize("name", COMBINATIONS)
def test_rendering_validates_against_the_real_crd(rendered, name):
    body = rendered[name]
    assert validate(body) == [], name


def test_the_validation_bites(rendered):
    """A body the API server would refuse fails here too, so the passing cases above mean something."""
    good = rendered["2x8-gpu"]
    broken = []
    body = copy.deepcopy(good)
    body["spec"]["nprocPerNode"] = 8  # the CRD wants a string
    broken.append(body)
    body = copy.deepcopy(good)
    body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["gpus"] = 8  # unknown field
    broken.append(body)
    body = copy.deepcopy(good)
    body["spec"]["runPolicy"]["backoffLimit"] = "three"
    broken.append(body)
    body = copy.deepcopy(rendered["trainjob"])
    del body["spec"]["runtimeRef"]
    broken.append(body)
    body = copy.deepcopy(rendered["trainjob"])
    body["spec"]["trainer"]["numNodes"] = "2"
    broken.append(body)
    for body in broken:
        assert validate(body), body["spec"]


def test_pytorchjob_shape_follows_the_operator_contract(rendered):
    one, two = rendered["1x8-gpu"], rendered["2x8-gpu"]
    assert one["apiVersion"] == "kubeflow.org/v1" and one["kind"] == "PyTorchJob"
    assert list(one["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    assert {k: v["replicas"] for k, v in two["spec"]["pytorchReplicaSpecs"].items()} == {"Master": 1, "Worker": 1}
    assert {k: v["replicas"] for k, v in rendered["volcano"]["spec"]["pytorchReplicaSpecs"].items()} == \
        {"Master": 1, "Worker": 3}
    for body in (one, two):
        assert body["spec"]["nprocPerNode"] == "8"
        for rtype, replica in body["spec"]["pytorchReplicaSpecs"].items():
            assert replica["restartPolicy"] == "ExitCode"
            (container,) = replica["template"]["spec"]["containers"]
            assert container["name"] == "pytorch"
            assert container["command"][:3] == ["python", "-m", "torch.distributed.run"]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 8


@pytest.mark.parametrize("name", PYTORCHJOBS)
def test_manifest_leaves_the_operator_env_to_the_operator(rendered, name):
    for pod in pods(rendered[name]).values():
        names = set(env_of(pod["containers"][0]))
        restarts_here = "elasticPolicy" not in rendered[name]["spec"] and "PET_MAX_RESTARTS" in names
        assert names & set(OPERATOR_ENV) == ({"PET_MAX_RESTARTS"} if restarts_here else set())


def test_gpu_jobs_get_nccl_watchdog_settings_and_cpu_jobs_none(rendered):
    env = env_of(pods(rendered["2x8-gpu"])["Worker"]["containers"][0])
    values = {k: v.get("value") for k, v in env.items()}
    assert values["TORCH_NCCL_ASYNC_ERROR_HANDLING"] in ("1", "2", "3")
    assert values["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(values["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert values["TORCH_FR_DUMP_TEMP_FILE"] == "/shared/kfloop-train/nccl_trace_rank_"  # kept past the pod
    assert values["NCCL_SOCKET_IFNAME"] == "eth0" and values["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert values["NCCL_DEBUG"] == "INFO"
    cpu_env = env_of(pods(rendered["cpu"])["Master"]["containers"][0])
    assert not [k for k in cpu_env if "NCCL" in k]


def test_secrets_are_references_never_values(rendered):
    (worker_env, trainjob_env) = (env_of(pods(rendered["2x8-gpu"])["Worker"]["containers"][0]),
                                  {e["name"]: e for e in rendered["trainjob"]["spec"]["trainer"]["env"]})
    assert worker_env["AWS_SECRET_ACCESS_KEY"] == {
        "name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": "secret-key"}}}
    assert trainjob_env["MLFLOW_TRACKING_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "mlflow", "key": "token"}
    pod = pods(rendered["2x8-gpu"])["Master"]
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}] and pod["serviceAccountName"] == "trainer"


def test_accelerator_resources(rendered):
    def limits(name):
        return pods(rendered[name])["Master"]["containers"][0]["resources"]["limits"]

    assert limits("amd-2x8")["amd.com/gpu"] == 8 and "nvidia.com/gpu" not in limits("amd-2x8")
    assert limits("mig")["nvidia.com/mig-1g.18gb"] == 2 and "nvidia.com/gpu" not in limits("mig")
    assert rendered["mig"]["spec"]["nprocPerNode"] == "2"
    assert limits("time-sliced")["nvidia.com/gpu.shared"] == 1
    assert not [k for k in limits("cpu") if "gpu" in k or "mig" in k]


def test_elastic_policy(rendered):
    body = rendered["elastic"]
    assert body["spec"]["elasticPolicy"] == {"rdzvBackend": "c10d", "rdzvHost": "kfloop-train-master-0",
                                             "rdzvPort": 23456, "minReplicas": 2, "maxReplicas": 4, "maxRestarts": 3}
    assert body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2


def test_gang_scheduling_and_kueue(rendered):
    volcano = rendered["volcano"]
    assert volcano["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 4, "queue": "research", "priorityClass": "training-high", "scheduleTimeoutSeconds": 600}
    assert {p["schedulerName"] for p in pods(volcano).values()} == {"volcano"}
    assert {p["priorityClassName"] for p in pods(volcano).values()} == {"training-high"}
    plugins = rendered["scheduler-plugins"]
    assert plugins["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2}
    assert pods(plugins)["Worker"]["schedulerName"] == "scheduler-plugins-scheduler"
    for name in ("kueue", "trainjob"):
        assert rendered[name]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "schedulingPolicy" not in rendered["kueue"]["spec"]["runPolicy"]
    assert "kueue.x-k8s.io/queue-name" not in rendered["cpu"]["metadata"]["labels"]


def test_numa_aligned_training_containers_have_requests_equal_to_limits(rendered):
    """The container kfloop renders; whether the pod is Guaranteed also depends on the operator's init container
    (tests/test_gpu_sharing.py, tests/test_launch_kubernetes.py)."""
    for pod in pods(rendered["numa-aligned"]).values():
        resources = pod["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 8}
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert "podAntiAffinity" in pod["affinity"]
    burstable = pods(rendered["cpu"])["Master"]["containers"][0]["resources"]
    assert "cpu" not in burstable["limits"]  # no CPU limit, so no CFS throttling, unless Guaranteed is asked for


def test_run_policy_and_restarts(rendered):
    body = rendered["run-policy"]
    assert body["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 600,
                                         "activeDeadlineSeconds": 7200, "backoffLimit": 2}
    assert "elasticPolicy" not in body["spec"]
    for pod in pods(body).values():  # the operator sets PET_MAX_RESTARTS only with an elasticPolicy
        assert env_of(pod["containers"][0])["PET_MAX_RESTARTS"]["value"] == "2"


def test_shm_and_shared_volume(rendered):
    for name in PYTORCHJOBS:
        pod = pods(rendered[name])["Master"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        assert volumes[mounts["/shared"]]["persistentVolumeClaim"] == {"claimName": "kfloop-shared"}
        command = pod["containers"][0]["command"]
        assert command[command.index("--checkpoint-dir") + 1] == "/shared/kfloop-train/checkpoints"
        assert command[command.index("--model-dir") + 1] == "/shared/kfloop-train/model"


def trainer_pod(body: dict) -> dict:
    """The pod template a TrainJob's runtimePatches entry sets on the runtime's trainer job."""
    (patch,) = body["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    return job["template"]["spec"]["template"]


def test_trainjob_follows_the_trainer_crd(rendered):
    body = rendered["trainjob"]
    assert body["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and body["kind"] == "TrainJob"
    trainer = body["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert trainer["command"] == ["python", "-m", "torch.distributed.run", "--rdzv-conf=timeout=60", "-m",
                                  "training.train"]
    assert trainer["args"][:2] == ["--data", "/shared/kfloop-train/data.parquet"]
    assert body["spec"]["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                          "kind": "ClusterTrainingRuntime"}
    assert body["spec"]["suspend"] is True  # Kueue admits it by clearing suspend
    assert rendered["trainjob-2x2"]["spec"]["activeDeadlineSeconds"] == 7200
    assert "suspend" not in rendered["trainjob-2x2"]["spec"]
    assert rendered["trainjob-preferred"]["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"


@pytest.mark.parametrize("name", TRAINJOBS)
def test_trainjob_sets_none_of_the_names_trainer_reserves(rendered, name):
    """Trainer's webhook rejects a TrainJob whose trainer.env sets a torchrun variable; runtimePatches may not set
    the node container's env at all."""
    env = {e["name"] for e in rendered[name]["spec"]["trainer"]["env"]}
    assert not env & {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
    assert "env" not in trainer_pod(rendered[name])["spec"]["containers"][0]
    assert ("PET_MAX_RESTARTS" in env) == (name == "trainjob-2x2")  # torchrun's restarts: no Trainer field for them


@pytest.mark.parametrize("name", TRAINJOBS)
def test_trainjob_pods_meet_the_restricted_profile_through_runtime_patches(rendered, name):
    template = trainer_pod(rendered[name])
    trainer = rendered[name]["spec"]["trainer"]
    pod = {**template["spec"], "containers": [{**template["spec"]["containers"][0], "image": trainer["image"]}]}
    assert restricted_violations(pod) == [], name
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "kfloop"


def test_trainjob_topology_and_pod_settings(rendered):
    body = rendered["trainjob-topology"]
    template = trainer_pod(body)
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-rack", **ISTIO_OPT_OUT}
    assert body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["metadata"] == {
        "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}}
    spec = template["spec"]
    assert spec["imagePullSecrets"] == [{"name": "creds"}] and spec["serviceAccountName"] == "trainer"
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu" and "podAntiAffinity" in spec["affinity"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {v["name"] for v in spec["volumes"]} == {"dshm", "tmp", "shared"}
    assert trainer_pod(rendered["trainjob-preferred"])["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-preferred-topology": "cloud.provider.com/topology-block", **ISTIO_OPT_OUT}
    assert rendered["kueue"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["annotations"] == \
        ISTIO_OPT_OUT
    for replica in rendered["kueue-topology"]["spec"]["pytorchReplicaSpecs"].values():  # Kueue TAS for PyTorchJobs
        assert replica["template"]["metadata"]["annotations"] == {
            "kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-rack", **ISTIO_OPT_OUT}


def test_config_file_and_set_overrides(tmp_path):
    config = tmp_path / "kfloop.yaml"
    config.write_text("cluster: {namespace: ml, image: 'registry.example.com/kfloop:1.2', gpus_per_node: 4}\n"
                      "training: {nnodes: 3}\n")
    body = render_cli(["--config", str(config), "--set", "cluster.namespace=ml-prod"])
    assert body["metadata"]["namespace"] == "ml-prod"
    assert body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2 and body["spec"]["nprocPerNode"] == "4"
    assert pods(body)["Master"]["containers"][0]["image"] == "registry.example.com/kfloop:1.2"


# ---------------------------------------------------------------------------------------- restricted Pod Security

@pytest.mark.parametrize("name", PYTORCHJOBS)
def test_every_rendered_pod_meets_the_restricted_profile(rendered, name):
    for rtype, pod in pods(rendered[name]).items():
        assert restricted_violations(pod) == [], (name, rtype)
        assert pod["automountServiceAccountToken"] is False  # training pods never call the API


REMOVALS = {
    "runAsNonRoot": lambda p: [p["securityContext"].pop("runAsNonRoot"),
                               p["containers"][0]["securityContext"].pop("runAsNonRoot")],
    "allowPrivilegeEscalation": lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
    "drop ALL": lambda p: p["containers"][0]["securityContext"]["capabilities"].update(drop=[]),
    "seccomp": lambda p: [p["securityContext"].pop("seccompProfile"),
                          p["containers"][0]["securityContext"].pop("seccompProfile")],
    "readOnlyRootFilesystem": lambda p: p["containers"][0]["securityContext"].update(readOnlyRootFilesystem=False),
    "tmp emptyDir": lambda p: p["containers"][0].update(
        volumeMounts=[m for m in p["containers"][0]["volumeMounts"] if m["mountPath"] != "/tmp"]),
    "root user": lambda p: p["containers"][0]["securityContext"].update(runAsUser=0),
    "hostPath": lambda p: p["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
    "privileged": lambda p: p["containers"][0]["securityContext"].update(privileged=True),
}


@pytest.mark.parametrize("protection", REMOVALS)
def test_the_restricted_check_notices_a_removed_protection(rendered, protection):
    pod = copy.deepcopy(pods(rendered["2x8-gpu"])["Worker"])
    REMOVALS[protection](pod)
    assert restricted_violations(pod)


# --------------------------------------------------------------------------------------------- invalid combinations

@pytest.mark.parametrize("cluster, fix", [
    ({"gpus_per_node": 8, "mig_profile": "1g.18gb"}, "not a mix"),
    ({"numa_aligned": True, "cpu": "3500m"}, "use an integer"),
    ({"mig_profile": "1g.18gb", "gpu_vendor": "amd"}, "gpu_vendor: nvidia"),
    ({"mig_profile": "18gb"}, "such as '1g.18gb'"),
    ({"nccl_async_error_handling": 0}, "use 3"),
    ({"gpus_per_node": 8, "nccl_ib_disable": True, "nccl_ib_hca": "mlx5_0"}, "drop one"),
    ({"nccl_socket_ifname": "eth0"}, "set gpus_per_node"),
    ({"elastic_min_nodes": 3, "elastic_max_nodes": 2}, "at least the minimum"),
    ({"elastic_max_nodes": 4}, "set elastic_min_nodes"),
    ({"gang_queue": "q"}, "set gang_scheduler"),
    ({"gang_scheduler": "scheduler-plugins", "gang_queue": "q"}, "gang_scheduler: volcano"),
    ({"gang_scheduler": "yunikorn"}, "use one of"),
    ({"gang_scheduler": "volcano", "kueue_queue": "team-a"}, "keep one"),
    ({"shm_size": "16Gi", "memory": "8Gi"}, "raise memory"),
    ({"secret_env": {"TOKEN": "hunter2"}}, "'<secret-name>/<key>'"),
    ({"clean_pod_policy": "Always"}, "use one of"),
    ({"run_as_user": 0}, "non-root UID"),
    ({"checkpoint_dir": "/tmp"}, "absolute path of its own"),
    ({"gpus": 8}, "valid keys are"),
])
def test_invalid_cluster_config_says_the_fix(cluster, fix):
    with pytest.raises(ValueError, match=re.escape(fix)):
        ClusterConfig.from_dict(cluster)


@pytest.mark.parametrize("spec, cluster, fix", [
    ({"nnodes": 1}, {"elastic_min_nodes": 1}, "set nnodes >= 2"),
    ({"nnodes": 5}, {"elastic_min_nodes": 2, "elastic_max_nodes": 4}, "within its bounds"),
    ({"nnodes": 2, "nproc_per_node": 2}, {"gpus_per_node": 8}, "set nproc_per_node=8"),
    ({"nnodes": 2, "nproc_per_node": 1}, {"mig_profile": "1g.18gb", "mig_devices_per_node": 2}, "nproc_per_node=2"),
    ({"nnodes": 2}, {"checkpoint_dir": "/checkpoints"}, "leave checkpoint_dir empty"),
    ({"nnodes": 2, "env": {"NCCL_DEBUG": "INFO"}}, {"gpus_per_node": 1}, "set each in one place"),
])
def test_spec_and_cluster_that_do_not_fit_say_the_fix(spec, cluster, fix):
    with pytest.raises(ValueError, match=re.escape(fix)):
        render_pytorchjob(JobSpec(**spec), ClusterConfig(**cluster))


@pytest.mark.parametrize("cluster", [{"gang_scheduler": "volcano"}, {"priority_class_name": "high"},
                                     {"elastic_min_nodes": 2}, {"image_pull_policy": "Always"},
                                     {"backoff_limit": 1}, {"scheduler_name": "volcano"}])
def test_trainjob_refuses_what_only_its_runtime_can_carry(cluster):
    with pytest.raises(ValueError, match="ClusterTrainingRuntime 'torch-distributed', or use kind pytorchjob"):
        render_trainjob(JobSpec(nnodes=2), ClusterConfig(kind="trainjob", **cluster))


@pytest.mark.parametrize("cluster, fix", [
    ({"kind": "mpijob"}, "use pytorchjob"),
    ({"exclusive_topology": "rack"}, "set kind: trainjob"),
    ({"topology_required": "rack"}, "set kueue_queue too"),
    ({"kueue_queue": "q", "topology_required": "rack", "topology_preferred": "zone"}, "keep one"),
    ({"trainjob_runtime_kind": "MPIRuntime"}, "use one of"),
])
def test_invalid_kind_and_topology_say_the_fix(cluster, fix):
    with pytest.raises(ValueError, match=re.escape(fix)):
        ClusterConfig.from_dict(cluster)


def test_training_job_needs_the_shared_volume():
    with pytest.raises(ValueError, match="set cluster.shared_volume_claim"):
        training_job_spec(TrainingConfig(), JobShape(), ClusterConfig(shared_volume_claim=""), name="kfloop-train")


def test_cli_reports_an_invalid_combination(capsys):
    assert main(["render-job", "--gpus-per-node", "8", "--set", "cluster.mig_profile=1g.18gb"]) == EXIT_SETTINGS
    err = capsys.readouterr().err
    assert "not a mix" in err and "apiVersion" not in err


# ------------------------------------------------------------------------------------------------------ job names

def test_job_name_for_is_deterministic_valid_and_distinct():
    ids = ["3f2a8b9c-1234-5678-9abc-def012345678", "Run_1", "run-1", "run.1", "x" * 300, "--", "RUN 1 / retry"]
    names = [job_name_for(i) for i in ids]
    assert names == [job_name_for(i) for i in ids]
    assert len(set(names)) == len(names)
    for name in names:
        assert len(name) <= 45 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
        JobSpec(name=name)  # the spec accepts it
    assert job_name_for("3f2a8b9c-1234").startswith("kfloop-3f2a8b9c-1234-")
    with pytest.raises(ValueError, match="run id"):
        job_name_for("")


KFP_RUN_IDS = ["3f9b2c1e-8a7d-4e6f-9b0a-1c2d3e4f5a6b", "Z" * 200, "run-" + "9" * 100]
"""A KFP run id (a UUID, 36 characters) and ids far longer than any kind's name budget."""


@pytest.mark.parametrize("run_id", KFP_RUN_IDS)
def test_pytorchjobs_for_any_run_id_pass_the_training_operators_webhook_and_service_names(run_id):
    body = render_cli(["--run-id", run_id, "--nnodes", "100"])
    assert validate(body) == []
    assert pytorchjob_contract.validate(body) == ([], [])
    name = body["metadata"]["name"]
    services = [pytorchjob_contract.replica_name(name, rtype, index) for rtype, index in (("Master", 0), ("Worker", 98))]
    assert [service_refusal(s) for s in services] == [None, None]


@pytest.mark.parametrize("run_id", KFP_RUN_IDS)
def test_trainjobs_for_any_run_id_pass_the_crd_and_jobsets_name_checks(run_id):
    body = render_cli(["--kind", "trainjob", "--run-id", run_id, "--nnodes", "1000"])
    assert validate(body) == []
    trainer_operator.check_name(body)  # raises on a refusal
    runtime = yaml.safe_load((trainer_operator.SPECS / trainer_operator.DEFAULT_RUNTIMES[0]).read_text())
    _, jobset, _, _ = trainer_operator.trainer_job(body, runtime, trainer_operator.TRAINER_PORT)
    assert trainer_operator.jobset_problems(body["metadata"]["name"], jobset["replicatedJobs"]) == []


@pytest.mark.parametrize("argv", [["--nnodes", "3"], ["--kind", "trainjob", "--nnodes", "3"]])
def test_every_training_pod_template_opts_out_of_istio_injection(argv):
    body = render_cli(argv)
    if body["kind"] == "PyTorchJob":
        templates = [r["template"] for r in body["spec"]["pytorchReplicaSpecs"].values()]
    else:
        (patch,) = body["spec"]["runtimePatches"]
        templates = [j["template"]["spec"]["template"]
                     for j in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
    assert len(templates) == (2 if body["kind"] == "PyTorchJob" else 1)
    assert all(t["metadata"]["annotations"].items() >= ISTIO_OPT_OUT.items() for t in templates)


def test_render_job_names_the_job_and_its_folder_after_the_run_id():
    body = render_cli(["--run-id", "3f2a8b9c-1234"])
    name = job_name_for("3f2a8b9c-1234")
    assert body["metadata"]["name"] == name and validate(body) == []
    master = pods(body)["Master"]["containers"][0]
    assert any(f"/shared/{name}/" in arg for arg in master["command"] + master.get("args", [])), master


def test_docs_cluster_example_is_a_valid_config(tmp_path):
    page = (Path(__file__).resolve().parents[1] / "docs" / "kubernetes.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if b.startswith("cluster:")]
    config = tmp_path / "kfloop.yaml"
    config.write_text(block)
    body = render_cli(["--config", str(config), "--nnodes", "2"])
    assert validate(body) == []
    assert body["spec"]["runPolicy"]["schedulingPolicy"]["queue"] == "research"


def test_cluster_config_round_trips_through_a_dict():
    config = ClusterConfig.from_dict({"gpus_per_node": 8, "cpu": 16,
                                      "tolerations": [{"key": "a", "operator": "Exists"}],
                                      "secret_env": {"TOKEN": "mlflow/token"}, "numa_aligned": True})
    assert config.cpu == "16"  # a YAML int becomes a quantity string
    assert ClusterConfig.from_dict(config.to_dict()) == config
    assert ClusterConfig.from_dict(None) == ClusterConfig()


def _job_images_and_pull_secrets(body: dict) -> tuple[set[str], list[set[str]]]:
    """The image(s) a rendered PyTorchJob or TrainJob runs, and the pull secrets of each of its pod specs."""
    if body["kind"] == "PyTorchJob":
        specs = list(pods(body).values())
        return {c["image"] for s in specs for c in s["containers"]}, [
            {p["name"] for p in s.get("imagePullSecrets", [])} for s in specs]
    (patch,) = body["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]["spec"]
    return {body["spec"]["trainer"]["image"]}, [{p["name"] for p in pod.get("imagePullSecrets", [])}]


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_the_job_runs_the_launching_steps_image_and_pull_secrets_unless_cluster_image_says_otherwise(
        kind, monkeypatch):
    """Issue 32 items 1-2: a compiled step carries its image (KFLOOP_IMAGE) and pull secrets
    (KFLOOP_IMAGE_PULL_SECRETS); the job it launches runs that image and pulls it with those secrets."""
    commit_image = "ghcr.io/acme/kfloop:" + "c" * 40
    monkeypatch.setenv("KFLOOP_IMAGE", commit_image)
    monkeypatch.setenv("KFLOOP_IMAGE_PULL_SECRETS", "ghcr")
    argv = ["--kind", kind, "--nnodes", "2", "--nproc-per-node", "1"]
    body = render_cli(argv)
    images, secrets = _job_images_and_pull_secrets(body)
    assert images == {commit_image} and all(s == {"ghcr"} for s in secrets)
    assert validate(body) == []

    body = render_cli([*argv, "--set", "cluster.image=registry.example/train:2", "--set",
                       "cluster.image_pull_secrets=[team-registry]"])
    images, secrets = _job_images_and_pull_secrets(body)
    assert images == {"registry.example/train:2"} and all(s == {"team-registry", "ghcr"} for s in secrets)

    monkeypatch.delenv("KFLOOP_IMAGE")
    monkeypatch.delenv("KFLOOP_IMAGE_PULL_SECRETS")
    images, secrets = _job_images_and_pull_secrets(render_cli(argv))
    assert images == {ClusterConfig().image} and all(not s for s in secrets)
