"""The retraining chain as one (``make e2e`` runs it after building the image; see deploy/e2e.sh).

Every step a Pod of the KFP test server in multi-user mode (tests/cluster/kfp_executor.py with the cluster), created
through the Kubernetes test cluster as Argo's ``kubeflow/argo`` service account and admitted by its API server (RBAC,
the PodDefault webhook, Istio's injection, Pod Security ``restricted``, which KFP's executor security context passes
with the admin's non-root defaults, :data:`STEP_SECURITY`), run by the cluster's Docker kubelet
(tests/cluster/docker_kubelet.py) as a container of the commit's image (the platform spec's Secret env and claim,
the service account's token issued by the cluster, the command under Argo's emissary, tests/cluster/
argo_emissary.py); the pipeline root ``s3://`` :data:`BUCKET` ``/pipeline-root``, moved by the pods' launcher
(tests/cluster/kfp_launcher.py) with the namespace's ``mlpipeline-minio-artifact`` keys. Every training pod a
container of the same image on the same cluster, all in the profile namespace :data:`NAMESPACE` (the operator's init
container from deploy/operator-restricted-init.yaml, the shared claim root's and given to the training pods by their
``fsGroup``); data in a moto S3 server, a real ``mlflow server``. KFP authenticates as Kubeflow does
(tests/cluster/kfp_multiuser.py): CI (``kfloop upload``, ``run``, ``schedule``) through the gateway
(tests/cluster/kfp_gateway.py) with a GitHub OIDC token, deploy/github-oidc.yaml's contributor; the trigger step with
the token deploy/kubeflow-profile.yaml's PodDefault projects, ``kfloop serve`` with its account's, both by
TokenReview against the cluster; each allowed by the RoleBindings deploy/ ships.

Serving (``serving.rollout``): each training run's rollout step applies the new champion's InferenceService on the
cluster's KServe (tests/cluster/kserve_operator.py): its predictor pods are containers of the image on the Docker
kubelet, the model downloaded by KServe's storage initializer (:func:`~cluster.kserve_operator.
build_storage_initializer`) with deploy/serving.yaml's account, and their payload logger writes the served requests
to :data:`LOGS`, which the drift runs read (``current_logs_uri``).

The chain: ``kfloop upload``; a first training run, whose training step launches a 2-node PyTorchJob, promotes v1 (a
second ``kfloop run training`` meanwhile is refused: one is in flight), and whose rollout serves it; the stable
batch's rows go to the InferenceService as v2 requests; ``kfloop schedule drift`` fires every 5 s on the logged
requests: on the stable batch's it starts nothing; once the drifted batch's rows were served too, its trigger step
creates a training run through the KFP API, whose worker is killed mid-epoch and resumes from a checkpoint, and which
promotes v2 and rolls it out as a 20% canary, smoke-tested, then given all traffic; a fire meanwhile (the schedule's
policy has no cooldown) finds it in flight; the next schedule's fire, on a batch table, inside the cooldown, starts
nothing and ``kfloop serve``'s ``/metrics`` counts it; an alert posted to ``kfloop serve`` creates a training run,
cancelled once its job trains: its step pod is deleted, the emissary forwards the kubelet's SIGTERM to the step,
whose launcher deletes its job; a last training run promotes v3 with too little memory to serve it
(:data:`BAD_MEMORY`): its canary fails, the rollout step puts the traffic back on v2 and ``champion`` too, and the
run fails. ``e2e-summary.json`` at the repository root is deleted at the start and
rewritten after every check from what the Docker daemon, the cluster, the servers and MLflow hold (``passed`` true
only at the end; on a failure its ``error``); the last line printed sums it up.

    python tests/e2e_chain.py --image kfloop:SHA    (DOCKER_HOST names the daemon)
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import docker
import kfp
import pandas as pd
import requests
import s3fs
import yaml
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes import utils as kube_utils
from mlflow import MlflowClient

from data.generate import write_demo
from cluster.docker_kubelet import CONTAINER_LABEL, POD_LABEL, DockerRuntime, pod_records
from cluster.k8s_rbac import manifests, service_account_user
from cluster.k8s_server import K8sServer
from cluster.k8s_store import INFERENCESERVICES
from cluster.kfp_executor import MAIN, OBJECT_STORE_SECRET, KfpExecutor
from cluster.kfp_gateway import Gateway, JwtIssuer, jwt_rules
from cluster.kfp_multiuser import PROFILE_LABELS as PROFILE_CONTROLLER_LABELS, MultiUser
from cluster.kfp_server import FINAL_STATES, KfpApiServer
from cluster.kserve_operator import build_storage_initializer
from cluster.kubernetes_cluster import CLAIM
from cluster.mlflow_server import MlflowServer
from cluster.s3_server import S3Server
from cluster.server_process import free_port, start_server, stop_group
from monitoring.inference_logs import VERSION_COLUMN, read_inference_logs
from monitoring.trigger_configmap import ConfigMapTriggerStore
from pipelines.cli.commands import main as kfloop
from pipelines.operations.demo_serving import send_rows
from training.launch.cluster import CREDENTIAL_KEYS
from training.launch.kubernetes import JOB_KINDS
from training.launch.manifests import job_name_for
from training.registry.lock import NAMESPACE_ENV as LEASE_NAMESPACE_ENV
from training.registry.versions import champion_history, list_versions
from training.serving.rollout import GROUP as KSERVE_GROUP
from training.serving.rollout import PROMOTED, ROLLED_BACK
from training.serving.rollout import VERSION as KSERVE_VERSION

REPO = Path(__file__).resolve().parents[1]
SUMMARY = REPO / "e2e-summary.json"
BUCKET = "kfloop-e2e"
MODEL = "kfloop-e2e"
NAMESPACE = "kfloop"
"""The Kubeflow profile where KFP runs the steps and the steps run their jobs: deploy/'s namespace (its RoleBindings,
the PodDefault), the service account ``kfloop``."""
(POD_DEFAULT,) = [d for d in yaml.safe_load_all((REPO / "deploy" / "kubeflow-profile.yaml").read_text())
                  if d["kind"] == "PodDefault"]
"""The profile's ``access-ml-pipeline`` PodDefault: the only way a step pod (the trigger) gets its KFP token."""
GITHUB_OIDC = REPO / "deploy" / "github-oidc.yaml"
((GITHUB_RULE,),) = [d["spec"]["jwtRules"] for d in yaml.safe_load_all(GITHUB_OIDC.read_text())
                     if d["kind"] == "RequestAuthentication"]
GITHUB_ISSUER, (GITHUB_AUDIENCE,) = GITHUB_RULE["issuer"], GITHUB_RULE["audiences"]
((CI_USER,),) = [[s["name"] for s in d["subjects"]] for d in yaml.safe_load_all(GITHUB_OIDC.read_text())
                 if d["kind"] == "RoleBinding"]
"""CI's identity: the ``sub`` of a GitHub Actions OIDC token, which deploy/github-oidc.yaml makes a contributor of
the profile and which the gateway passes to KFP as ``kubeflow-userid``."""
OWNER = "kfloop-owner@example.com"
"""The profile's owner (its ``namespaceAdmin``)."""
SECRET = "kfloop-mlflow"
STEP_USER = "1000:1000"
"""The image's user (deploy/Dockerfile), which the admin's security defaults make every step pod's."""
STEP_SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000}
"""KFP's ``pipeline-install-config`` security defaults as the admin sets them for a restricted profile: the step
pods' main container runs as :data:`STEP_USER`, non-root."""
RESTRICTED_INIT = yaml.safe_load((REPO / "deploy" / "operator-restricted-init.yaml").read_text())["data"][
    "initContainer.yaml"]
"""The operator's ``--pytorch-init-container-template-file`` as deploy/ ships it for restricted namespaces (its
``--pytorch-init-container-image`` is the job's own image: nothing is pulled)."""
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
PROFILE_LABELS = {**PROFILE_CONTROLLER_LABELS, PSA_ENFORCE: "restricted"}
"""What a Kubeflow profile namespace carries: the profile controller's labels (Istio's sidecar injection, the
PodDefault webhook's selector) and the restricted Pod Security profile."""
(SERVING_ACCOUNT,) = [d for d in yaml.safe_load_all((REPO / "deploy" / "serving.yaml").read_text())
                      if d["kind"] == "ServiceAccount"]
"""deploy/serving.yaml's ``kfloop-serving``: the predictor pods' account, naming the Secret of the S3 keys."""
((SERVING_SECRET,),) = [[s["name"] for s in SERVING_ACCOUNT["secrets"]]]
LOGS = f"s3://{BUCKET}/inference"
"""``serving.log_uri``: where KServe's payload logger writes the served requests, and where the drift runs read
them (``current_logs_uri``)."""
CANARY_PERCENT = 20
BAD_MEMORY = "128Mi"
"""``serving.memory`` of the bad version's rollout: its predictor cannot load the model in it (OOM-killed), so its
canary never becomes ready and the rollout rolls it back."""
WAIT_S = 900
TRAINING = {"epochs": 30, "batch_size": 32}
"""Small batches, many epochs: the retrain on the drifted batch runs long enough (a few seconds of epochs, each one
checkpointed) for the kill to land after a checkpoint and before the last epoch."""


def say(message: str) -> None:
    print(f"e2e: {message}", flush=True)


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = WAIT_S, poll_s: float = 1) -> Any:
    """Poll ``check`` every ``poll_s`` until it returns something true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
    return found


def upload_demo_data(s3: S3Server, scratch: Path) -> tuple[s3fs.S3FileSystem, dict[str, str]]:
    """The demo's files and its schema, put in the bucket; returns the filesystem and {name: s3 URI}."""
    fs = s3fs.S3FileSystem(endpoint_url=s3.url, key=s3.env()["AWS_ACCESS_KEY_ID"],
                           secret=s3.env()["AWS_SECRET_ACCESS_KEY"])
    fs.mkdir(BUCKET)
    files = {**write_demo(scratch / "demo"), "schema.yaml": REPO / "data" / "schema.yaml"}
    for name, path in files.items():
        fs.put_file(str(path), f"{BUCKET}/data/{name}")
    return fs, {name: f"s3://{BUCKET}/data/{name}" for name in files}


def prepare_cluster(admin: kube_client.ApiClient, secret: dict[str, str], s3_endpoint: str) -> dict[str, str]:
    """As the admin (``admin``): :data:`NAMESPACE` labelled as a profile's (:data:`PROFILE_LABELS`),
    deploy/rbac.yaml and deploy/webhook.yaml's Role (the trigger state's ConfigMap) in it, the credentials Secret
    the steps and pods read, the object store's keys for KFP's launcher (``mlpipeline-minio-artifact``, which
    KFP's profile controller copies into a profile), and deploy/serving.yaml's account with its Secret made as the
    file says (the keys, the endpoint ``s3_endpoint`` in KServe's annotations). Returns the namespace's labels."""
    namespace = kube_client.CoreV1Api(admin).patch_namespace(NAMESPACE, {"metadata": {"labels": PROFILE_LABELS}})
    webhook = [d for d in manifests(REPO / "deploy" / "webhook.yaml") if d["kind"] in ("Role", "RoleBinding")]
    for doc in [*manifests(REPO / "deploy" / "rbac.yaml"), *webhook]:
        if doc["kind"] != "ServiceAccount":  # the test server authenticates service accounts by token alone
            kube_utils.create_from_dict(admin, doc, namespace=NAMESPACE)
    kube_utils.create_from_dict(admin, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in secret.items()}})
    kube_utils.create_from_dict(admin, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": OBJECT_STORE_SECRET, "namespace": NAMESPACE},
        "stringData": {"accesskey": secret["AWS_ACCESS_KEY_ID"], "secretkey": secret["AWS_SECRET_ACCESS_KEY"]}})
    kube_utils.create_from_dict(admin, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": SERVING_SECRET, "namespace": NAMESPACE,
            "annotations": {"serving.kserve.io/s3-endpoint": s3_endpoint.removeprefix("http://"),
                            "serving.kserve.io/s3-usehttps": "0"}},
        "stringData": {key: secret[key] for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}})
    kube_utils.create_from_dict(admin, SERVING_ACCOUNT, namespace=NAMESPACE)
    return namespace.metadata.labels


def profile_users(cluster: K8sServer) -> MultiUser:
    """KFP's multi-user mode over the profile :data:`NAMESPACE`: its TokenReviews answered by the cluster (the
    tokens it issued), the RoleBindings a profile makes (its owner, ``default-editor``) and those deploy/ ships:
    kubeflow-profile.yaml's (the trigger's account starts runs), webhook.yaml's (``kfloop serve``'s) and
    github-oidc.yaml's (CI's GitHub identity)."""
    users = MultiUser(tokens=cluster.identities)
    users.add_profile(NAMESPACE, owner=OWNER)
    for manifest in ("kubeflow-profile.yaml", "webhook.yaml", "github-oidc.yaml"):
        users.apply(REPO / "deploy" / manifest, NAMESPACE)
    return users


def cli(*argv: str) -> dict:
    """``kfloop ARGV --json``; its JSON output. Fails with the CLI's error."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = kfloop([*argv, "--json"])
    text = out.getvalue()
    if code != 0:
        raise RuntimeError(f"kfloop {' '.join(argv)} exited {code}: {text}")
    return json.loads(text)


def runs_of(server: KfpApiServer, failed_ok: set[str] = frozenset(), **match: str) -> list[dict]:
    """The server's runs whose fields equal ``match``, oldest first.

    Raises:
        RuntimeError: a run of the server failed, other than those of ``failed_ok`` (the chain stops at the first
            failure, naming its error).
    """
    with server.lock:
        runs = sorted((dict(r) for r in server.store.runs.values()), key=lambda r: r["created_at"])
    for run in runs:
        if run["state"] == "FAILED" and run["run_id"] not in failed_ok:
            raise RuntimeError(f"run {run['run_id']} ({run['display_name']}) failed: {run.get('error')}")
    return [r for r in runs if all(r.get(k) == v for k, v in match.items())]


def trainings(server: KfpApiServer) -> list[str]:
    """The ids of the runs no schedule started, oldest first."""
    return [r["run_id"] for r in runs_of(server) if not r.get("recurring_run_id")]


def final(server: KfpApiServer, run_id: str, timeout_s: float = WAIT_S) -> dict:
    """The run once it has ended; fails naming its error when it did not succeed."""
    run = wait_until(f"run {run_id} to end", lambda: server.store.runs[run_id]["state"] in FINAL_STATES and
                     server.store.runs[run_id], timeout_s)
    if run["state"] != "SUCCEEDED":
        raise RuntimeError(f"run {run_id} ({run['display_name']}) ended {run['state']}: {run.get('error')}")
    return run


def task_records(client: docker.DockerClient, core: kube_client.CoreV1Api, run: dict) -> list[dict]:
    """Each task of ``run``: its step pod as the cluster holds it (:func:`task_pod`) beside its ``main`` container
    as the daemon holds it (the Docker kubelet's; skipped tasks had neither)."""
    records = []
    for task in run.get("run_details", {}).get("task_details", []):
        record = {"name": task["display_name"], "state": task["state"]}
        if "pod_name" in task:
            (container,) = pod_records(client, task["pod_name"], MAIN)
            record.update(pod=task_pod(core, task["pod_name"]), container_id=container["container_id"],
                          image=container["image"], user=container["user"], exit_code=container["exit_code"])
        records.append(record)
    return records


def trigger_state(api: Any) -> dict:
    """The model's trigger state as the registry keeps it on the cluster (ConfigMap ``kfloop-trigger-state``, which
    the trigger steps and ``kfloop serve`` write): ``fired`` (each with its run id), ``counts`` by outcome,
    ``last_check``; ``{}`` before the first decision."""
    return ConfigMapTriggerStore(MODEL, api=api, namespace=NAMESPACE).load()["models"].get(MODEL, {})


def task_pod(core: kube_client.CoreV1Api, name: str) -> dict:
    """Step pod ``name`` as the cluster holds it: its namespace and service account, the Pod Security level it was
    admitted under (its namespace's ``pod-security.kubernetes.io/enforce`` label); ``deleted`` when the cluster no
    longer has it (a terminated run's)."""
    try:
        pod = core.read_namespaced_pod(name, NAMESPACE)
    except kube_client.ApiException as err:
        if err.status != 404:
            raise
        return {"name": name, "deleted": True}
    labels = core.read_namespace(pod.metadata.namespace).metadata.labels or {}
    return {"name": name, "namespace": pod.metadata.namespace, "service_account": pod.spec.service_account_name,
            "pod_security": labels.get(PSA_ENFORCE)}


def step_pods(runs: list[dict], cancelled: str) -> dict:
    """What the runs' tasks say of their step pods (:func:`task_records`): every one in :data:`NAMESPACE` as service
    account ``kfloop``, admitted under the profile's Pod Security level; only the terminated run ``cancelled`` may
    have had its pods deleted. Returns ``step_pods`` for the summary.

    Raises:
        AssertionError: naming the pods that differ.
    """
    pods = [(run["id"], task["pod"]) for run in runs for task in run["tasks"] if "pod" in task]
    level = PROFILE_LABELS[PSA_ENFORCE]
    wrong = [pod for run_id, pod in pods if (run_id != cancelled if pod.get("deleted") else (
        pod["namespace"], pod["service_account"], pod["pod_security"]) != (NAMESPACE, "kfloop", level))]
    if wrong or not pods:
        raise AssertionError(f"expected every task a pod of {NAMESPACE} as kfloop admitted under Pod Security "
                             f"{level} (only {cancelled}'s deleted): {wrong or pods}")
    return {"count": len(pods), "namespace": NAMESPACE, "service_account": "kfloop", "pod_security": level,
            "deleted": [pod["name"] for _, pod in pods if pod.get("deleted")]}


def in_flight(api: kube_client.ApiClient, server: KfpApiServer, retrain: str) -> int:
    """How many fires found a training run in flight, per the trigger state.

    Raises:
        AssertionError: the retrain ``retrain`` ended before one did.
    """
    count = trigger_state(api).get("counts", {}).get("in_flight", 0)
    if not count and server.store.runs[retrain]["state"] in FINAL_STATES:
        raise AssertionError(f"the trigger's training run {retrain} ended before a fire found it in flight")
    return count


def cluster_job(custom: kube_client.CustomObjectsApi, name: str) -> dict | None:
    """Job ``name`` of :data:`NAMESPACE` as the cluster holds it (whichever kind the launcher made), or None."""
    for kind in JOB_KINDS.values():
        try:
            return custom.get_namespaced_custom_object(kind.group, kind.version, NAMESPACE, kind.plural, name)
        except kube_client.ApiException as err:
            if err.status != 404:
                raise
    return None


def kill_mid_epoch(client: docker.DockerClient, shared: Path, job: str) -> str:
    """Once ``job`` has written its first checkpoint, SIGKILL its worker pod's training container (a node lost
    mid-run); returns the container's id."""
    wait_until(f"a checkpoint of {job}", lambda: [p for p in shared.rglob("ckpt-*.safetensors") if job in str(p)],
               poll_s=0.1)
    (container,) = wait_until(f"{job}'s worker container", lambda: client.containers.list(filters={"label": [
        f"{POD_LABEL}={job}-worker-0", f"{CONTAINER_LABEL}=pytorch"]}))
    container.kill()
    return container.id


def alert_through_serve(root: Path, server: KfpApiServer, cluster: K8sServer, users: MultiUser, target: list[str],
                        commit: str) -> dict:
    """``kfloop serve`` on the server path, as its service account ``kfloop-webhook`` would in the cluster (its KFP
    token and kubeconfig that account's; the trigger state is the ConfigMap the drift runs' trigger steps wrote):
    ``/metrics`` (its own token) counts the drift run's cooldown; an Alertmanager alert posted to ``/alerts``
    creates a training run on the KFP server. Returns the run's ``run_id`` and the ``suppressed`` count scraped."""
    port = free_port()
    hook, scrape = "e2e-webhook-token", "e2e-metrics-token"
    kubeconfig = cluster.write_kubeconfig(root / "webhook-kubeconfig",
                                          user=service_account_user(NAMESPACE, "kfloop-webhook"))
    env = {**os.environ, "KFLOOP_WEBHOOK_TOKEN": hook, "KFLOOP_METRICS_TOKEN": scrape, "KFLOOP_BACKEND": "kubernetes",
           "KUBECONFIG": str(kubeconfig), LEASE_NAMESPACE_ENV: NAMESPACE,
           "KFP_TOKEN": users.service_account_token(NAMESPACE, "kfloop-webhook")}
    before = set(server.store.runs)
    serve = start_server([sys.executable, "-m", "pipelines", "serve", "--port", str(port), "--bind", "127.0.0.1",
                          *target, "--set", "trigger.cooldown_seconds=0"],  # the receiver's own policy: no cooldown
                         health_url=f"http://127.0.0.1:{port}/healthz", log_path=root / "serve.log", env=env,
                         timeout_s=240)
    try:
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {scrape}"},
                               timeout=60)
        metrics.raise_for_status()
        wanted = f'kfloop_trigger_suppressed_total{{model="{MODEL}",reason="cooldown"}} '
        (suppressed,) = [float(line.split()[-1]) for line in metrics.text.splitlines() if line.startswith(wanted)]
        if suppressed < 1:
            raise AssertionError(f"/metrics does not count the cooldown: {wanted}{suppressed}")
        body = {"version": "4", "status": "firing", "receiver": "kfloop", "alerts": [{
            "status": "firing", "labels": {"alertname": "KfloopQualityDegraded", "model": MODEL},
            "annotations": {"summary": "quality degraded (e2e)"}, "fingerprint": f"e2e-{commit[:12]}"}]}
        answer = requests.post(f"http://127.0.0.1:{port}/alerts", json=body,
                               headers={"Authorization": f"Bearer {hook}"}, timeout=120)
        if answer.status_code != 200:
            raise AssertionError(f"/alerts answered {answer.status_code}: {answer.text}")
    finally:
        stop_group(serve)
    (run,) = wait_until("the alert's run", lambda: [r for r in runs_of(server) if r["run_id"] not in before])
    say(f"an alert posted to kfloop serve created run {run['run_id']} on the KFP server; /metrics counted "
        f"{suppressed:.0f} cooldown suppression(s)")
    return {"run_id": run["run_id"], "suppressed": suppressed}


def cancel_mid_training(client: docker.DockerClient, server: KfpApiServer, kfp_api: kfp.Client,
                        custom: kube_client.CustomObjectsApi, run_id: str) -> dict:
    """Terminate run ``run_id`` (through the gateway, as CI would) once its job's master trains: the executor
    deletes the training step's pod, the kubelet's SIGTERM reaches the step through Argo's emissary, and the
    launcher deletes its job. Returns
    ``cancelled_run``: the run's and its training task's final states, the job and ``job_deleted`` as the cluster
    answers after the run ended."""
    job = job_name_for(run_id)
    kind = wait_until(f"{job} on the cluster", lambda: (cluster_job(custom, job) or {}).get("kind"))
    wait_until(f"{job}'s master to train", lambda: client.containers.list(filters={"label": [
        f"{POD_LABEL}={job}-master-0", f"{CONTAINER_LABEL}=pytorch"]}), poll_s=0.2)
    kfp_api.terminate_run(run_id)
    wait_until(f"run {run_id} to stop", lambda: server.store.runs[run_id]["state"] in FINAL_STATES)
    run = server.store.runs[run_id]
    tasks = {t["display_name"]: t["state"] for t in run["run_details"]["task_details"]}
    record = {"run_id": run_id, "state": run["state"], "training_task": tasks.get("launch-training"), "job": job,
              "kind": kind, "job_deleted": cluster_job(custom, job) is None}
    if (record["state"], record["training_task"], record["job_deleted"]) != ("CANCELED", "CANCELED", True):
        raise AssertionError(f"run {run_id} cancelled mid-training: expected it and its training task CANCELED and "
                             f"its job deleted by the launcher: {record}, tasks {tasks}")
    say(f"run {run_id} cancelled mid-training: its launcher deleted {kind} {job}")
    return record


def retrain_tasks(summary: dict, run_id: str) -> list[dict]:
    (run,) = [r for r in summary["runs"] if r["id"] == run_id]
    return run["tasks"]


def check_trigger_run(client: docker.DockerClient, summary: dict, run_id: str, image: str) -> int:
    """The trigger's run as the chain requires it: every task a step pod whose ``main`` container, of ``image``, ran
    as :data:`STEP_USER` and exited 0; its PyTorchJob's 2 pods containers of ``image`` that ended 0, one of them
    restarted once after the kill, the worker's init container the restricted template's (UID 1000), and the master
    resumed from a checkpoint past step 0 (returned).

    Raises:
        AssertionError: naming what differs.
    """
    tasks = retrain_tasks(summary, run_id)
    wrong = [t for t in tasks if (t.get("image"), t.get("user"), t.get("exit_code")) != (image, STEP_USER, 0)]
    if wrong or len(tasks) < 6:
        raise AssertionError(f"the trigger's run has tasks that are not step pods of {image} as {STEP_USER} "
                             f"exiting 0: {wrong or tasks}")
    job = job_name_for(run_id)
    (record,) = [j for j in summary["jobs"] if j["name"] == job]
    pods, inits = record["pods"], record["init_containers"]
    if sorted(p["restarts"] for p in pods) != [0, 1] or {(p["image"], p["exit_code"]) for p in pods} != {(image, 0)}:
        raise AssertionError(f"{job}: expected 2 pods of {image} ending 0, one restarted once: {pods}")
    if [(p["name"], p["image"], p["user"].split(":")[0], p["exit_code"]) for p in inits] != [
            (f"{job}-worker-0", image, "1000", 0)]:
        raise AssertionError(f"{job}: expected the worker's init-pytorch from deploy/operator-restricted-init.yaml "
                             f"(UID 1000) to end 0: {inits}")
    (master,) = [c for c in client.containers.list(all=True, filters={"label": [
        f"{POD_LABEL}={job}-master-0", f"{CONTAINER_LABEL}=pytorch"]})]
    log = master.logs().decode(errors="replace")
    if "resuming from checkpoint step " not in log:
        raise AssertionError(f"{job}'s master did not resume from a checkpoint: {log[-2000:]}")
    step = int(log.split("resuming from checkpoint step ")[1].split()[0])
    if step <= 0:
        raise AssertionError(f"{job} resumed from step {step}, not from the checkpoint written before the kill")
    return step


def inference_service(custom: kube_client.CustomObjectsApi) -> dict:
    """The model's InferenceService (the rollout steps apply it in :data:`NAMESPACE`, named after the model)."""
    return custom.get_namespaced_custom_object(KSERVE_GROUP, KSERVE_VERSION, NAMESPACE, "inferenceservices", MODEL)


def traffic(custom: kube_client.CustomObjectsApi) -> list[tuple[str, int]]:
    """Its traffic split as KServe's status reports it: ``(revision, percent)`` per target."""
    predictor = inference_service(custom)["status"]["components"]["predictor"]
    return [(t["revisionName"], t["percent"]) for t in predictor["traffic"]]


def revision(n: int) -> str:
    """The predictor's ``n``-th revision (Knative's ``<ksvc>-0000N``)."""
    return f"{MODEL}-predictor-{n:05d}"


def served(custom: kube_client.CustomObjectsApi, batch: Path) -> dict:
    """The rows of ``batch`` sent as Open Inference Protocol v2 table requests to the InferenceService's URL (its
    route; each answered 200); what was sent."""
    url = f"{inference_service(custom)['status']['url']}/v2/models/{MODEL}"
    window = send_rows(url, MODEL, pd.read_parquet(batch))
    return {"url": url, "requests": window.requests, "rows": window.rows}


def logged() -> dict:
    """What the payload logger wrote under :data:`LOGS`, read back as the drift runs read it: requests, rows and the
    rows each version answered (``ce-annotations``)."""
    rows = read_inference_logs(LOGS, since=timedelta(hours=1))
    return {"requests": rows.requests, "rows": len(rows.rows),
            "rows_by_version": {str(k): int(n) for k, n in
                                rows.rows[VERSION_COLUMN].value_counts().sort_index().items()}}


def rollout_record(version: str) -> dict:
    """The rollout outcome the rollout step tagged on ``version``."""
    tags = MlflowClient().get_model_version(MODEL, version).tags
    return {"version": int(version), **{k: tags.get(k) for k in ("rollout", "rollout_revision", "rollout_reason")}}


def check_rollout(custom: kube_client.CustomObjectsApi, version: str, outcome: str,
                  split: list[tuple[str, int]]) -> dict:
    """``version``'s rollout as the chain requires it: tagged ``outcome``, the traffic ``split`` after it.

    Raises:
        AssertionError: naming what differs.
    """
    record, now = rollout_record(version), traffic(custom)
    if record["rollout"] != outcome or now != split:
        raise AssertionError(f"v{version}: expected its rollout {outcome} with traffic {split}: {record}, "
                             f"traffic {now}")
    return {**record, "traffic": now}


def bad_version(server: KfpApiServer, ci: list[str], custom: kube_client.CustomObjectsApi, good: str) -> dict:
    """A training run (CI's, through the gateway) whose new version is rolled out with :data:`BAD_MEMORY`: it is
    promoted, its canary's predictor is OOM-killed loading the model (its revision never ready), the rollout step sets
    the canary's traffic to 0, moves ``champion`` back to ``good`` and fails, and so does the run. Returns
    ``bad_rollout`` for the summary.

    Raises:
        AssertionError: naming what differs.
    """
    run_id = cli("run", "training", *ci, "--set", f"serving.memory={BAD_MEMORY}")["run_id"]
    run = wait_until(f"run {run_id} to end", lambda: server.store.runs[run_id]["state"] in FINAL_STATES and
                     server.store.runs[run_id])
    tasks = {t["display_name"]: t["state"] for t in run["run_details"]["task_details"]}
    versions = list_versions(MODEL)
    bad = str(max(int(v["version"]) for v in versions))
    champion = MlflowClient().get_model_version_by_alias(MODEL, "champion").version
    moves = [(m.action, m.version) for m in champion_history(MODEL)]
    failed = [name for name, state in tasks.items() if state == "FAILED"]
    if run["state"] != "FAILED" or failed != ["rollout"] or champion != good or \
            moves[-1] != ("rollback", good):
        raise AssertionError(f"run {run_id}: expected only its rollout step to fail and champion back on v{good}: "
                             f"{run['state']}, tasks {tasks}, champion v{champion}, moves {moves}")
    # the canary's ``latestRevision`` target resolves to the latest *ready* revision (Knative's route), still v2's
    record = check_rollout(custom, bad, ROLLED_BACK, [(revision(2), 0), (revision(2), 100)])
    if record["rollout_revision"] != revision(3):
        raise AssertionError(f"v{bad}: expected its failed revision {revision(3)} recorded: {record}")
    say(f"run {run_id} promoted v{bad}, whose canary failed: rolled back ({record['rollout_reason']})")
    return {"run_id": run_id, "state": run["state"], "failed_task": failed[0], "champion_version": int(champion),
            **record}


class Summary:
    """``e2e-summary.json`` as the chain goes: deleted at the start; rewritten whole (a rename: never half-written)
    after every check, with the checks passed so far in ``checks``; ``passed`` is false until every check passed;
    a failure writes its ``error``."""

    def __init__(self, path: Path):
        self.path = path
        path.unlink(missing_ok=True)
        self.data: dict[str, Any] = {"passed": False, "checks": []}

    def check(self, name: str, **fields: Any) -> None:
        self.data.update(fields)
        self.data["checks"].append(name)
        self._write()

    def fail(self, error: BaseException) -> None:
        self.data["error"] = f"{type(error).__name__}: {error}"
        self._write()

    def passed(self) -> None:
        self.data["passed"] = True
        self._write()

    def _write(self) -> None:
        partial = self.path.with_suffix(".json.partial")
        partial.write_text(json.dumps(self.data, indent=2))
        partial.replace(self.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="the kfloop image every step and training pod runs")
    args = parser.parse_args(argv)
    summary = Summary(SUMMARY)
    daemon = docker.from_env()
    image = daemon.images.get(args.image)
    commit = image.labels["GIT_COMMIT"]  # deploy/image-commit.sh's, via the build
    root = Path(tempfile.mkdtemp(prefix="kfloop-e2e-"))
    started = time.monotonic()
    s3 = S3Server(root=root).start()
    mlflow = runtime = None
    try:
        mlflow = MlflowServer(root=root, artifacts_destination=f"s3://{BUCKET}/mlflow", env=s3.env())
        fs, uris = upload_demo_data(s3, root)
        current = f"s3://{BUCKET}/data/current.parquet"
        fs.copy(uris["batch_stable.parquet"], current)
        mlflow.start()
        say(f"S3 {s3.url}, MLflow {mlflow.url} (artifacts s3://{BUCKET}/mlflow)")
        shared = root / "shared"
        shared.mkdir()
        os.chown(shared, 0, 1000)  # the claim as provisioned: root's, writable by the steps' group (KFP steps get
        shared.chmod(0o775)  # no fsGroup); the training pods' fsGroup gives it to their group, setgid
        secret = {"MLFLOW_TRACKING_URI": mlflow.url,
                  **{k: v for k, v in s3.env().items() if k in CREDENTIAL_KEYS}}
        github = JwtIssuer(GITHUB_ISSUER)
        ci_token = github.token({"sub": CI_USER, "aud": GITHUB_AUDIENCE})
        os.environ.update(MLFLOW_TRACKING_URI=mlflow.url, KFP_TOKEN=ci_token, KFLOOP_BACKEND="kubernetes",
                          **s3.env())
        runtime = DockerRuntime()
        build_storage_initializer(daemon, args.image)  # KServe's storage-initializer image, run on the Docker kubelet
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(K8sServer(
                root / "k8s", namespace=NAMESPACE, volumes={CLAIM: shared}, runtime=runtime,
                pytorch_init_container_template=RESTRICTED_INIT, pytorch_init_container_image=args.image))
            users = profile_users(cluster)
            server = stack.enter_context(KfpApiServer(multi_user=users))
            gateway = stack.enter_context(Gateway(server.url, issuers=[github], rules=jwt_rules(GITHUB_OIDC)))
            stack.enter_context(KfpExecutor(server, None, pipeline_root=f"s3://{BUCKET}/pipeline-root",
                                            object_store=s3.url, namespace=NAMESPACE,
                                            default_service_account="kfloop", pod_defaults=[POD_DEFAULT],
                                            cluster=cluster, security_defaults=STEP_SECURITY))
            admin = kube_config.new_client_from_config(config_file=str(cluster.write_kubeconfig(root / "admin")))
            core, custom = kube_client.CoreV1Api(admin), kube_client.CustomObjectsApi(admin)
            labels = prepare_cluster(admin, secret, s3.url)
            summary.check("cluster", image=args.image, image_id=image.id, commit=commit.removesuffix("-dirty"),
                          dirty=commit.endswith("-dirty"), multi_user=server.multi_user is not None,
                          namespace={"name": NAMESPACE, "labels": labels})
            say(f"namespace {NAMESPACE}: {labels}; KFP multi-user, CI through the gateway as {CI_USER}")
            settings = root / "kfloop.yaml"
            settings.write_text(yaml.safe_dump({
                "model_name": MODEL, "dataset_uri": uris["train.parquet"], "schema_uri": uris["schema.yaml"],
                "current_logs_uri": LOGS, "retrain_uri": current, "nnodes": 2, "nproc_per_node": 1,
                "backend": "kubernetes",
                "training": {"max_restarts": 1, **TRAINING}, "promotion": {"floor": 0.6},
                "trigger": {"cooldown_seconds": 3600}, "kfp": {"host": server.url},  # in the cluster: KFP itself
                "serving": {"rollout": True, "canary_percent": CANARY_PERCENT, "log_uri": LOGS,
                            "service_account": SERVING_ACCOUNT["metadata"]["name"], "namespace": NAMESPACE,
                            "artifacts_destination": f"s3://{BUCKET}/mlflow", "rollout_timeout_seconds": 300},
                "cluster": {"image": args.image, "namespace": NAMESPACE, "cpu": "1", "memory": "2Gi",
                            "shm_size": "64Mi", "shared_volume_claim": CLAIM, "shared_mount_path": str(shared),
                            "credentials_secret": SECRET, "launcher": {"poll_seconds": 1}}}))
            # CI: through the gateway, in the profile's namespace, the pipelines of the image's code
            target = ["--config", str(settings), "--namespace", NAMESPACE, "--pipeline-version", commit]
            ci = ["--host", gateway.url, *target]
            cli("upload", *ci, "--image", args.image)
            summary.check("upload", pipelines=len(server.store.pipelines))
            say(f"uploaded {len(server.store.pipelines)} pipelines, version {commit[:12]}, through the gateway")

            first = cli("run", "training", *ci)
            refused = kfloop(["run", "training", *ci, "--json"])
            if refused == 0 or trainings(server) != [first["run_id"]]:
                raise AssertionError(f"a second `kfloop run training` while {first['run_id']} is in flight "
                                     f"exited {refused} with runs {trainings(server)}")
            summary.check("ci_run_refused_in_flight", ci_run_refused_in_flight={"exit_code": refused,
                                                                                "in_flight": first["run_id"]})
            final(server, first["run_id"])
            versions = list_versions(MODEL)
            if [v["champion"] for v in versions] != [True]:
                raise AssertionError(f"the first training run did not promote v1: {versions}")
            summary.check("first_training", first_run=first["run_id"])
            say(f"first training run {first['run_id']} promoted v1; a second one meanwhile was refused "
                f"({time.monotonic() - started:.0f} s)")
            rollouts = [check_rollout(custom, "1", PROMOTED, [(revision(1), 100)])]
            sent = {"stable_batch": served(custom, root / "demo" / "batch_stable.parquet")}
            summary.check("served_v1", rollouts=rollouts, requests_sent=sent, logged=logged())
            say(f"its rollout served v1 on KServe ({revision(1)}); {sent['stable_batch']['requests']} requests of the "
                f"stable batch through {sent['stable_batch']['url']} logged to {LOGS}")

            # the schedule's own policy: no cooldown, one-second windows: a fire on the batch the retrain runs on
            # decides to retrain again, and the run in flight says no
            eager = ["--set", "trigger.cooldown_seconds=0", "--set", "trigger.window_seconds=1"]
            recurring = cli("schedule", "drift", *ci, "--cron", "*/5 * * * * *", *eager)["recurring_run_id"]
            stable = final(server, wait_until("a drift run", lambda: [
                r["run_id"] for r in runs_of(server, recurring_run_id=recurring)])[0])
            if trainings(server) != [first["run_id"]] or len(list_versions(MODEL)) != 1:
                raise AssertionError("a fire on the stable batch started something")
            summary.check("stable_batch", stable_drift_run=stable["run_id"])
            say(f"drift run {stable['run_id']} on the stable batch started nothing")

            fs.copy(uris["batch_drifted.parquet"], current)  # what a retraining trains on (retrain_uri)
            sent["drifted_batch"] = served(custom, root / "demo" / "batch_drifted.parquet")
            say(f"{sent['drifted_batch']['requests']} requests of the drifted batch served by v1 and logged")
            (fired,) = wait_until("the trigger's training run", lambda: [
                f for f in trigger_state(admin).get("fired", []) if f["run_id"]])
            retrain = fired["run_id"]
            killed = kill_mid_epoch(daemon, shared, job_name_for(retrain))
            say(f"killed the worker's container {killed[:12]} of the trigger's training job mid-run")
            wait_until("a fire while the retrain is in flight", lambda: in_flight(admin, server, retrain))
            cli("schedule", "drift", *ci, "--disable")
            summary.check("in_flight", retrain_run=retrain)
            final(server, retrain)
            champion = MlflowClient().get_model_version_by_alias(MODEL, "champion").version
            if champion != "2":
                raise AssertionError(f"the trigger's training run did not promote v2: {list_versions(MODEL)}")
            rollouts.append(check_rollout(custom, "2", PROMOTED, [(revision(2), 100)]))
            isvc = cluster.controller(INFERENCESERVICES, NAMESPACE, MODEL)
            canary = [(revision(2), CANARY_PERCENT, "latest"), (revision(1), 100 - CANARY_PERCENT, "prev")]
            if canary not in isvc.traffic_history:
                raise AssertionError(f"v2 never had {CANARY_PERCENT}% as a canary: {isvc.traffic_history}")
            summary.check("retrain", champion_version=int(champion), rollouts=rollouts, logged=logged())
            say(f"the trigger's training run {retrain} promoted v2, rolled out as a {CANARY_PERCENT}% canary then "
                f"given all traffic ({time.monotonic() - started:.0f} s)")
            sent["after_v2"] = served(custom, root / "demo" / "batch_stable.parquet")

            # the data moves again (v2 trained on the drifted batch): a batch checked as a table this time
            fs.copy(uris["batch_stable.parquet"], current)
            recurring = cli("schedule", "drift", *ci, "--cron", "*/5 * * * * *", "--set", f"current_uri={current}",
                            "--set", "current_logs_uri=")["recurring_run_id"]
            after = final(server, wait_until("a drift run after v2", lambda: [
                r["run_id"] for r in runs_of(server, recurring_run_id=recurring)])[0])
            cli("schedule", "drift", *ci, "--disable")
            state = trigger_state(admin)
            decisions = {"counts": state["counts"], "last_check": state["last_check"],
                         "fired": [{k: f[k] for k in ("run_id", "data_hash", "at")} for f in state["fired"]]}
            held = [f["run_id"] for f in decisions["fired"] if f["run_id"] in server.store.runs]
            if held != [retrain] or len(decisions["fired"]) != 1 or not state["counts"].get("in_flight") or \
                    not state["last_check"]["reason"].startswith("cooldown") or \
                    trainings(server) != [first["run_id"], retrain]:
                raise AssertionError(f"expected one fire (the retrain), fires in flight, then a cooldown that "
                                     f"starts nothing: {decisions}")
            summary.check("cooldown", trigger_decisions=decisions)
            say(f"drift run {after['run_id']} found drift again inside the cooldown and started nothing")

            alert = alert_through_serve(root, server, cluster, users, ["--host", server.url, *target], commit)
            summary.check("alert", suppressed_in_metrics=alert["suppressed"], alert_run=alert["run_id"])
            cancelled = cancel_mid_training(daemon, server, kfp.Client(host=gateway.url, existing_token=ci_token),
                                            custom, alert["run_id"])
            summary.check("cancelled_run", cancelled_run=cancelled)
            bad = bad_version(server, ci, custom, good=champion)
            rollouts.append({k: v for k, v in bad.items() if k in ("version", "rollout", "rollout_revision",
                                                                    "rollout_reason", "traffic")})
            summary.check("bad_version", bad_rollout=bad, rollouts=rollouts,
                          serving={"revisions": isvc.traffic_history, "routed": isvc.routed,
                                   "requests_sent": sent, "logged": logged()})

            runs = [{"id": run["run_id"], "pipeline": run["display_name"], "state": run["state"],
                     "recurring_run_id": run.get("recurring_run_id"),
                     "created_by": server.store.created_by.get(run["run_id"]),
                     "service_account": run.get("service_account"),
                     "tasks": task_records(daemon, core, run)}
                    for run in runs_of(server, failed_ok={bad["run_id"]})]
            creators = {r["id"]: r["created_by"] for r in runs}
            trigger_sa = service_account_user(NAMESPACE, "kfloop").name
            expected = {first["run_id"]: CI_USER, bad["run_id"]: CI_USER, retrain: trigger_sa,
                        alert["run_id"]: service_account_user(NAMESPACE, "kfloop-webhook").name}
            wrong = {k: creators.get(k) for k, v in expected.items() if creators.get(k) != v}
            wrong.update({r["id"]: r["created_by"] for r in runs if r["recurring_run_id"] and r["created_by"] != CI_USER})
            if wrong or {r["service_account"] for r in runs} != {"kfloop"}:
                raise AssertionError(f"runs created by others than expected ({expected}, the schedule's {CI_USER}) "
                                     f"or not as service account kfloop: {wrong}, {runs}")
            jobs = [{"kind": cluster_job(custom, job_name_for(run_id))["kind"], "name": job_name_for(run_id),
                     "pods": pod_records(daemon, f"{job_name_for(run_id)}-"),
                     "init_containers": pod_records(daemon, f"{job_name_for(run_id)}-", "init-pytorch")}
                    for run_id in (first["run_id"], retrain)]
            summary.check("runs", runs=runs, jobs=jobs, step_pods=step_pods(runs, alert["run_id"]))
            resumed = check_trigger_run(daemon, summary.data, retrain, args.image)
            summary.check("trigger_run", resumed_from_step=resumed)
            summary.passed()
            say(f"ok in {time.monotonic() - started:.0f} s: {len(runs)} runs on the multi-user KFP test server, "
                f"{summary.data['step_pods']['count']} step pods admitted in {NAMESPACE} under Pod Security "
                f"{summary.data['step_pods']['pod_security']}; the trigger's run: "
                f"{len(retrain_tasks(summary.data, retrain))} tasks as {STEP_USER}, a PyTorchJob of 2 pods of "
                f"{args.image} (the killed one restarted once, resumed from checkpoint step {resumed}); fires in "
                f"flight {decisions['counts']['in_flight']}; champion v{champion}; then cooldown; the alert's run "
                f"cancelled mid-training, its job deleted; served on KServe: v1, v2 as a {CANARY_PERCENT}% canary "
                f"promoted, v{bad['version']} rolled back; {summary.data['serving']['logged']['requests']} "
                f"requests logged and read back; {SUMMARY.name}")
    except BaseException as err:
        summary.fail(err)
        print(f"e2e: failed; logs under {root}", file=sys.stderr)
        raise
    finally:
        if runtime is not None:
            runtime.remove_all()
        if mlflow is not None:
            mlflow.stop()
        s3.stop()
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
