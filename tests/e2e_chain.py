"""The retraining chain as one (``make e2e`` runs it after building the image; see deploy/e2e.sh).

Every step a container of the commit's image on the KFP test server (tests/cluster/kfp_executor.py's DockerEngine:
UID 1000, read-only root, the platform spec's Secret env and claim, the service account's token), every training
pod a container of the same image on the Kubernetes test cluster (tests/cluster/docker_kubelet.py) in a namespace
labelled as a Kubeflow profile's (Istio injection, Pod Security ``restricted``), the operator's init container from
deploy/operator-restricted-init.yaml, the shared claim root's and given to the pods by their ``fsGroup``; data in a
moto S3 server, a real ``mlflow server``. The chain: ``kfloop upload``; a first training run on the server, whose training
step launches a 2-node PyTorchJob, promotes v1; ``kfloop schedule drift`` fires every few seconds on the batch at
``current.parquet``: on the stable batch it starts nothing; on the drifted batch its trigger step (cluster backend,
projected token) creates a training run through the KFP API, which trains as a PyTorchJob and promotes v2; the next
fire, inside the cooldown, starts nothing and ``/metrics`` counts it. Writes ``e2e-summary.json`` at the repository
root from what the Docker daemon and the servers hold; its last line printed sums it up.

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
from pathlib import Path
from typing import Any, Callable

import docker
import kfp
import requests
import s3fs
import yaml
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes import utils as kube_utils

from data.generate import write_demo
from cluster.docker_kubelet import CONTAINER_LABEL, POD_LABEL, DockerRuntime, pod_records
from cluster.k8s_rbac import manifests, service_account_user
from cluster.k8s_server import K8sServer
from cluster.kfp_executor import DockerEngine, KfpExecutor
from cluster.kfp_server import FINAL_STATES, KfpApiServer
from cluster.kubernetes_cluster import CLAIM
from cluster.mlflow_server import MlflowServer
from cluster.s3_server import S3Server
from cluster.server_process import free_port, start_server, stop_group
from pipelines.cli.commands import main as kfloop
from training.launch.cluster import CREDENTIAL_KEYS
from training.launch.manifests import job_name_for
from training.registry.lock import NAMESPACE_ENV as LEASE_NAMESPACE_ENV
from training.registry.versions import list_versions

REPO = Path(__file__).resolve().parents[1]
SUMMARY = REPO / "e2e-summary.json"
BUCKET = "kfloop-e2e"
MODEL = "kfloop-e2e"
NAMESPACE = "kfloop"
"""Where KFP runs the steps and the steps run their jobs: deploy/rbac.yaml's namespace and service account."""
(POD_DEFAULT,) = [d for d in yaml.safe_load_all((REPO / "deploy" / "kubeflow-profile.yaml").read_text())
                  if d["kind"] == "PodDefault"]
"""The profile's ``access-ml-pipeline`` PodDefault: the only way a step pod (the trigger) gets its KFP token."""
TOKEN = "kfp-e2e-token"
"""The ``pipelines.kubeflow.org`` token the KFP test server accepts (projected into the step pods)."""
SECRET = "kfloop-mlflow"
STEP_USER = "1000:1000"
"""The image's user (deploy/Dockerfile)."""
RESTRICTED_INIT = yaml.safe_load((REPO / "deploy" / "operator-restricted-init.yaml").read_text())["data"][
    "initContainer.yaml"]
"""The operator's ``--pytorch-init-container-template-file`` as deploy/ ships it for restricted namespaces (its
``--pytorch-init-container-image`` is the job's own image: nothing is pulled)."""
PROFILE_LABELS = {"istio-injection": "enabled", "pod-security.kubernetes.io/enforce": "restricted"}
"""What a Kubeflow profile namespace carries: Istio's sidecar injection and the restricted Pod Security profile."""
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


def prepare_cluster(cluster: K8sServer, scratch: Path, secret: dict[str, str]) -> dict[str, str]:
    """As the admin: :data:`NAMESPACE` labelled as a profile's (:data:`PROFILE_LABELS`), deploy/rbac.yaml and
    deploy/webhook.yaml's Role (the trigger state's ConfigMap) in it, and the credentials Secret the steps and pods
    read. Returns the namespace's labels."""
    admin = kube_config.new_client_from_config(config_file=str(cluster.write_kubeconfig(scratch / "admin")))
    namespace = kube_client.CoreV1Api(admin).patch_namespace(NAMESPACE, {"metadata": {"labels": PROFILE_LABELS}})
    webhook = [d for d in manifests(REPO / "deploy" / "webhook.yaml") if d["kind"] in ("Role", "RoleBinding")]
    for doc in [*manifests(REPO / "deploy" / "rbac.yaml"), *webhook]:
        if doc["kind"] != "ServiceAccount":  # the test server authenticates service accounts by token alone
            kube_utils.create_from_dict(admin, doc, namespace=NAMESPACE)
    kube_utils.create_from_dict(admin, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in secret.items()}})
    return namespace.metadata.labels


def cli(*argv: str) -> dict:
    """``kfloop ARGV --json``; its JSON output. Fails with the CLI's error."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = kfloop([*argv, "--json"])
    text = out.getvalue()
    if code != 0:
        raise RuntimeError(f"kfloop {' '.join(argv)} exited {code}: {text}")
    return json.loads(text)


def runs_of(server: KfpApiServer, **match: str) -> list[dict]:
    """The server's runs whose fields equal ``match``, oldest first.

    Raises:
        RuntimeError: a run of the server failed (the chain stops at the first failure, naming its error).
    """
    with server.lock:
        runs = sorted((dict(r) for r in server.store.runs.values()), key=lambda r: r["created_at"])
    for run in runs:
        if run["state"] == "FAILED":
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


def task_records(client: docker.DockerClient, run: dict) -> list[dict]:
    """Each task of ``run`` as the daemon holds its container (skipped tasks had none)."""
    records = []
    for task in run.get("run_details", {}).get("task_details", []):
        record = {"name": task["display_name"], "state": task["state"]}
        if "pod_name" in task:
            attrs = client.containers.get(task["pod_name"]).attrs
            record.update(container_id=attrs["Id"], image=attrs["Config"]["Image"], user=attrs["Config"]["User"],
                          read_only=attrs["HostConfig"]["ReadonlyRootfs"], exit_code=attrs["State"]["ExitCode"])
        records.append(record)
    return records


def trigger_decisions(client: docker.DockerClient, runs: list[dict]) -> list[dict]:
    """The trigger step's decision in each drift run that reached it, as its container logged it
    (``trigger: fired, run ID: REASON`` or ``trigger: skipped: REASON``)."""
    decisions = []
    for run in runs:
        for task in run.get("run_details", {}).get("task_details", []):
            if task["display_name"] != "trigger-retraining" or "pod_name" not in task:
                continue
            log = client.containers.get(task["pod_name"]).logs().decode(errors="replace")
            (line,) = [line.split("trigger: ", 1)[1] for line in log.splitlines() if "] trigger: " in line]
            head, _, reason = line.partition(": ")
            fired = head.startswith("fired, run ")
            decisions.append({"drift_run": run["run_id"], "decision": "fired" if fired else reason.split(":")[0],
                              "reason": reason, "run_id": head.removeprefix("fired, run ") if fired else None})
    return decisions


def kill_mid_epoch(client: docker.DockerClient, shared: Path, job: str) -> str:
    """Once ``job`` has written its first checkpoint, SIGKILL its worker pod's training container (a node lost
    mid-run); returns the container's id."""
    wait_until(f"a checkpoint of {job}", lambda: [p for p in shared.rglob("ckpt-*.safetensors") if job in str(p)],
               poll_s=0.1)
    (container,) = wait_until(f"{job}'s worker container", lambda: client.containers.list(filters={"label": [
        f"{POD_LABEL}={job}-worker-0", f"{CONTAINER_LABEL}=pytorch"]}))
    container.kill()
    return container.id


def alert_through_serve(root: Path, server: KfpApiServer, cluster: K8sServer, target: list[str], commit: str) -> dict:
    """``kfloop serve`` on the server path, as its service account ``kfloop-webhook`` would in the cluster (the
    trigger state is the ConfigMap the drift run's trigger step wrote): ``/metrics`` (its own token) counts the drift
    run's cooldown; an
    Alertmanager alert posted to ``/alerts`` creates a training run on the KFP server, stopped once a task of it
    runs (its training is the trigger's). Returns the run's ``run_id`` and the ``suppressed`` count scraped."""
    port = free_port()
    hook, scrape = "e2e-webhook-token", "e2e-metrics-token"
    kubeconfig = cluster.write_kubeconfig(root / "webhook-kubeconfig",
                                          user=service_account_user(NAMESPACE, "kfloop-webhook"))
    env = {**os.environ, "KFLOOP_WEBHOOK_TOKEN": hook, "KFLOOP_METRICS_TOKEN": scrape, "KFLOOP_BACKEND": "kubernetes",
           "KUBECONFIG": str(kubeconfig), LEASE_NAMESPACE_ENV: NAMESPACE}
    before = {r["run_id"] for r in runs_of(server)}
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
    wait_until("a task of the alert's run to run", lambda: server.store.runs[run["run_id"]].get(
        "run_details", {}).get("task_details"))
    kfp.Client(host=server.url, existing_token=TOKEN).terminate_run(run["run_id"])
    wait_until("the alert's run to stop", lambda: server.store.runs[run["run_id"]]["state"] == "CANCELED")
    say(f"an alert posted to kfloop serve created run {run['run_id']} on the KFP server (stopped once running); "
        f"/metrics counted {suppressed:.0f} cooldown suppression(s)")
    return {"run_id": run["run_id"], "suppressed": suppressed}


def retrain_tasks(summary: dict, run_id: str) -> list[dict]:
    (run,) = [r for r in summary["runs"] if r["id"] == run_id]
    return run["tasks"]


def check_trigger_run(client: docker.DockerClient, summary: dict, run_id: str, image: str) -> int:
    """The trigger's run as the chain requires it: every task a container of ``image`` as :data:`STEP_USER` with a
    read-only root that exited 0; its PyTorchJob's 2 pods containers of ``image`` that ended 0, one of them
    restarted once after the kill, the worker's init container the restricted template's (UID 1000), and the master
    resumed from a checkpoint past step 0 (returned).

    Raises:
        AssertionError: naming what differs.
    """
    tasks = retrain_tasks(summary, run_id)
    wrong = [t for t in tasks if (t.get("image"), t.get("user"), t.get("read_only"), t.get("exit_code")) !=
             (image, STEP_USER, True, 0)]
    if wrong or len(tasks) < 6:
        raise AssertionError(f"the trigger's run has tasks that are not containers of {image} as {STEP_USER} "
                             f"with a read-only root and exit 0: {wrong or tasks}")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="the kfloop image every step and training pod runs")
    args = parser.parse_args(argv)
    daemon = docker.from_env()
    commit = daemon.images.get(args.image).labels["GIT_COMMIT"]  # deploy/image-commit.sh's, via the build
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
        shared, pipeline_root = root / "shared", root / "pipeline-root"
        pipeline_root.mkdir()
        pipeline_root.chmod(0o777)  # the object store's stand-in, written by the steps' UID 1000
        shared.mkdir()
        os.chown(shared, 0, 1000)  # the claim as provisioned: root's, writable by the steps' group (KFP steps get
        shared.chmod(0o775)  # no fsGroup); the training pods' fsGroup gives it to their group, setgid
        secret = {"MLFLOW_TRACKING_URI": mlflow.url,
                  **{k: v for k, v in s3.env().items() if k in CREDENTIAL_KEYS}}
        os.environ.update(MLFLOW_TRACKING_URI=mlflow.url, KFP_TOKEN=TOKEN, KFLOOP_BACKEND="kubernetes", **s3.env())
        runtime = DockerRuntime()
        engine = DockerEngine(pipeline_root=pipeline_root, env={"HOME": "/tmp", "AWS_DEFAULT_REGION": "us-east-1",
                                                                "AWS_EC2_METADATA_DISABLED": "true"})
        with K8sServer(root / "k8s", namespace=NAMESPACE, volumes={CLAIM: shared}, runtime=runtime,
                       pytorch_init_container_template=RESTRICTED_INIT,
                       pytorch_init_container_image=args.image) as cluster, \
                KfpApiServer(token=TOKEN) as server, \
                KfpExecutor(server, engine, pipeline_root=pipeline_root, namespace=NAMESPACE,
                            default_service_account="kfloop", pod_defaults=[POD_DEFAULT], token=TOKEN,
                            cluster=cluster):
            labels = prepare_cluster(cluster, root, secret)
            say(f"namespace {NAMESPACE}: {labels}; the operator's init container from "
                "deploy/operator-restricted-init.yaml")
            settings = root / "kfloop.yaml"
            settings.write_text(yaml.safe_dump({
                "model_name": MODEL, "dataset_uri": uris["train.parquet"], "schema_uri": uris["schema.yaml"],
                "current_uri": current, "nnodes": 2, "nproc_per_node": 1, "backend": "kubernetes",
                "training": {"max_restarts": 1, **TRAINING}, "promotion": {"floor": 0.6},
                "trigger": {"cooldown_seconds": 3600}, "kfp": {"host": server.url},
                "cluster": {"image": args.image, "namespace": NAMESPACE, "cpu": "1", "memory": "2Gi",
                            "shm_size": "64Mi", "shared_volume_claim": CLAIM, "shared_mount_path": str(shared),
                            "credentials_secret": SECRET, "launcher": {"poll_seconds": 1}}}))
            target = ["--host", server.url, "--config", str(settings), "--pipeline-version", commit]  # the image's code
            cli("upload", *target, "--image", args.image)
            say(f"uploaded {len(server.store.pipelines)} pipelines, version {commit[:12]}")

            first = cli("run", "training", *target)
            final(server, first["run_id"])
            versions = list_versions(MODEL)
            if [v["champion"] for v in versions] != [True]:
                raise AssertionError(f"the first training run did not promote v1: {versions}")
            say(f"first training run {first['run_id']} promoted v1 ({time.monotonic() - started:.0f} s)")

            schedule = cli("schedule", "drift", *target, "--cron", "*/5 * * * * *")
            recurring = schedule["recurring_run_id"]
            stable = final(server, wait_until("a drift run", lambda: [
                r["run_id"] for r in runs_of(server, recurring_run_id=recurring)])[0])
            if trainings(server) != [first["run_id"]] or len(list_versions(MODEL)) != 1:
                raise AssertionError("a fire on the stable batch started something")
            say(f"drift run {stable['run_id']} on the stable batch started nothing")

            fs.copy(uris["batch_drifted.parquet"], current)
            retrain = {"run_id": wait_until("the trigger's training run", lambda: trainings(server)[1:])[0]}
            cli("schedule", "drift", *target, "--disable")
            killed = kill_mid_epoch(daemon, shared, job_name_for(retrain["run_id"]))
            say(f"killed the worker's container {killed[:12]} of the trigger's training job mid-run")
            final(server, retrain["run_id"])
            versions = list_versions(MODEL)
            champion = next(v["version"] for v in versions if v["champion"])
            if champion != "2":
                raise AssertionError(f"the trigger's training run did not promote v2: {versions}")
            say(f"the trigger's training run {retrain['run_id']} promoted v2 ({time.monotonic() - started:.0f} s)")

            fs.copy(uris["batch_stable.parquet"], current)  # the data moves again (v2 trained on the drifted batch)
            recurring = cli("schedule", "drift", *target, "--cron", "*/5 * * * * *")["recurring_run_id"]
            after = final(server, wait_until("a drift run after v2", lambda: [
                r["run_id"] for r in runs_of(server, recurring_run_id=recurring)])[0])
            cli("schedule", "drift", *target, "--disable")
            decisions = trigger_decisions(daemon, runs_of(server))
            fired = [d for d in decisions if d["decision"] == "fired"]  # fires while it trained: in_flight
            if len(fired) != 1 or decisions[-1]["decision"] != "cooldown" or \
                    trainings(server) != [first["run_id"], retrain["run_id"]]:
                raise AssertionError(f"expected one fire, then a cooldown that starts nothing: {decisions}")
            say(f"drift run {after['run_id']} found drift again inside the cooldown and started nothing")

            alert = alert_through_serve(root, server, cluster, target, commit)
            summary_runs = runs_of(server)

            summary = {"image": args.image, "commit": commit.removesuffix("-dirty"),
                       "dirty": commit.endswith("-dirty"), "runs": [], "jobs": [],
                       "trigger_decisions": [{k: d[k] for k in ("decision", "reason", "run_id")} for d in decisions],
                       "suppressed_in_metrics": alert["suppressed"], "champion_version": int(champion),
                       "namespace": {"name": NAMESPACE, "labels": labels}}
            for run in summary_runs:
                started_by = ("schedule" if run.get("recurring_run_id") else
                              "trigger" if run["run_id"] == retrain["run_id"] else
                              "alert" if run["run_id"] == alert["run_id"] else "upload")
                summary["runs"].append({"id": run["run_id"], "pipeline": run["display_name"], "state": run["state"],
                                        "started_by": started_by, "tasks": task_records(daemon, run)})
            for run_id in (first["run_id"], retrain["run_id"]):
                job = job_name_for(run_id)
                summary["jobs"].append({"kind": "PyTorchJob", "name": job, "pods": pod_records(daemon, f"{job}-"),
                                        "init_containers": pod_records(daemon, f"{job}-", "init-pytorch")})
            SUMMARY.write_text(json.dumps(summary, indent=2))
            resumed = check_trigger_run(daemon, summary, retrain["run_id"], args.image)
            say(f"ok in {time.monotonic() - started:.0f} s: {len(summary['runs'])} runs executed as containers on "
                f"the KFP test server (started by {sorted({r['started_by'] for r in summary['runs']})}); the "
                f"trigger's run: {len(retrain_tasks(summary, retrain['run_id']))} tasks as {STEP_USER} with a "
                f"read-only root, a PyTorchJob of 2 pods of {args.image} (the killed one restarted once, resumed "
                f"from checkpoint step {resumed}); champion v{champion}; then "
                f"{summary['trigger_decisions'][-1]['decision']}; the alert's run on the server; {SUMMARY.name}")
    except BaseException:
        print(f"e2e: failed; logs under {root}", file=sys.stderr)
        raise
    finally:
        if runtime is not None:
            runtime.remove_all()
        for container in docker.from_env().containers.list(all=True, filters={"label": "kfloop.run_pod"}):
            container.remove(force=True)
        if mlflow is not None:
            mlflow.stop()
        s3.stop()
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
