"""The test cluster's KServe (tests/cluster/kserve_operator.py): kfloop's rendered InferenceService, created through
the API server, reconciled into predictor pods really running ``kfloop serve-model`` on the model the storage
initializer downloaded from the S3 test server; revisions, the canary split, promotion and rollback, the status
fields KServe reports, the deployment mode it records and then keeps, a failing predictor that never becomes ready,
a tampered download refused against the registered ``serving.kfloop.io/artifact-digest``, and the payload logger's
blobs read back by monitoring/inference_logs.py."""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import threading
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import mlflow
import pandas as pd
import pytest
from kserve.protocol.infer_type import InferResponse
from kubernetes import client
from polling import wait_for
from serving_versions import register_version, tracking

from cluster.k8s_store import INFERENCESERVICES, PODS
from cluster.kserve_operator import INITIALIZER, MODEL_MOUNT, REVISION_LABEL
from cluster.kubernetes_cluster import CLAIM, s3_service_account, status_of
from monitoring.inference_logs import REQUEST_TYPE, RESPONSE_TYPE, read_inference_logs, record_from_cloudevent
from training.launch.cluster import ClusterConfig
from training.registry.manifest import tree_digest
from training.registry.versions import verified_manifest
from training.serving import MODEL_VERSION_ANNOTATION
from training.serving.artifacts import VersionArtifacts
from training.serving.manifests import DEPLOYMENT_MODE, inference_service, serving_runtime
from training.serving.settings import ServingSettings
from training.serving.table import response_table, table_request

MODEL = "kserve-churn"
MODELS_BUCKET = "kserve-models"
SECRET, ACCOUNT = "kfloop-s3", "kfloop-serving"
READY_TIMEOUT_S = 180
GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
ECHO = """import http.server, sys
class Echo(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"""
"""A predictor answering each POST with its body: the logger's tests need no model."""
BROKEN = b"not: [an mlflow model"
"""The MLmodel of ``broken/``: its digest matches, its loading fails."""


@pytest.fixture(scope="module")
def model(mlflow_server, s3_server, tmp_path_factory):
    """A registered version's MLflow model folder (its logged model's files), uploaded to the S3 test server under
    ``v1/`` and ``v2/`` (two storage URIs of one model) and as ``broken/`` (an MLmodel that is no model); the folder,
    holdout rows and the digest ``render-serving`` annotates (from the registry's manifest)."""
    root = tmp_path_factory.mktemp("kserve-model")
    with tracking(mlflow_server.url, "kfloop-kserve-emulation") as experiment_id:
        version, rows = register_version(MODEL, experiment_id=experiment_id, root=root)
        location = mlflow.MlflowClient().get_model_version_download_uri(MODEL, version)
        folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(root / "model")))
        digest = tree_digest(verified_manifest(MODEL, version))
    env = s3_server.env()
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    s3.create_bucket(Bucket=MODELS_BUCKET)
    for path in folder.rglob("*"):
        if path.is_file():
            for prefix in ("v1", "v2"):
                s3.upload_file(str(path), MODELS_BUCKET, f"{prefix}/{path.relative_to(folder)}")
    s3.put_object(Bucket=MODELS_BUCKET, Key="broken/MLmodel", Body=BROKEN)
    return folder, rows, digest


@pytest.fixture
def kserve(cluster, s3_server, s3_bucket):
    """The cluster with kfloop's ServingRuntime, the S3 Secret and the service account naming it, and the
    CustomObjectsApi; inference logs go to ``s3://<s3_bucket>/inference``."""
    api = cluster.api()
    s3_service_account(api, s3_server.env(), ACCOUNT, SECRET)
    settings = ServingSettings(log_uri=f"s3://{s3_bucket}/inference", service_account=ACCOUNT)
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(GROUP, "v1alpha1", "default", "servingruntimes",
                                           serving_runtime(settings, ClusterConfig()))
    return cluster, custom, settings


def _isvc(settings: ServingSettings, uri: str, digest: str, version: str = "1", **kw) -> dict:
    artifacts = VersionArtifacts(model_name=MODEL, version=version, storage_uri=uri, digest=digest)
    return inference_service(artifacts, settings, ClusterConfig(), **kw)


def _get(custom, name: str = MODEL) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)


def _patch(custom, predictor: dict, metadata: dict | None = None) -> None:
    body = {"spec": {"predictor": predictor}, **({"metadata": metadata} if metadata else {})}
    custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, MODEL, body)


def _condition(isvc: dict, kind: str) -> dict:
    return next((c for c in (isvc.get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def _predictor(isvc: dict) -> dict:
    return ((isvc.get("status") or {}).get("components") or {}).get("predictor") or {}


def _wait_ready(custom, revision: str) -> dict:
    def ready():
        isvc = _get(custom)
        assert _condition(isvc, "PredictorReady").get("reason") != "RevisionFailed", _condition(isvc, "PredictorReady")
        return isvc if _condition(isvc, "Ready").get("status") == "True" and \
            _predictor(isvc).get("latestReadyRevision") == revision else None
    return wait_for(f"{MODEL} Ready at {revision}", ready, timeout=READY_TIMEOUT_S, interval=0.2)


def _infer(url: str, frame: pd.DataFrame, request_id: str = "") -> pd.DataFrame:
    body, _ = table_request(frame, MODEL).to_rest()
    request = urllib.request.Request(f"{url}/v2/models/{MODEL}/infer", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Ce-Id": request_id} if request_id else {})})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response_table(InferResponse.from_rest(json.loads(response.read())))


def _controller(cluster):
    return cluster.server.controller(INFERENCESERVICES, "default", MODEL)


def _routed(cluster) -> dict[str, int]:
    return dict(_controller(cluster).routed)


def _send(url: str, rows: pd.DataFrame, n: int) -> None:
    for i in range(n):
        _infer(url, rows.iloc[[i % len(rows)]])


def test_a_rendered_inferenceservice_is_downloaded_served_logged_and_reports_kserves_status(kserve, model,
                                                                                          s3_bucket):
    cluster, custom, settings = kserve
    folder, rows, digest = model
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                           _isvc(settings, f"s3://{MODELS_BUCKET}/v1", digest))
    first = f"{MODEL}-predictor-00001"
    isvc = _wait_ready(custom, first)

    predictor = _predictor(isvc)
    assert predictor["latestCreatedRevision"] == predictor["latestRolledoutRevision"] == first
    assert predictor["traffic"] == [{"revisionName": first, "latestRevision": True, "percent": 100}]
    assert isvc["status"]["url"] == predictor["url"] and predictor["url"].startswith("http://127.0.0.1:")
    assert {c["type"]: (c["status"], c.get("severity")) for c in isvc["status"]["conditions"]} == {
        "IngressReady": ("True", None), "LatestDeploymentReady": ("True", "Info"),
        "PredictorConfigurationReady": ("True", "Info"), "PredictorReady": ("True", None),
        "PredictorRouteReady": ("True", "Info"), "Ready": ("True", None), "RoutesReady": ("True", "Info"),
        "Stopped": ("False", "Info")}
    pod = cluster.server.store.list(PODS, "default", f"{REVISION_LABEL}={first}")[0][0]
    init = pod["spec"]["initContainers"][0]
    assert init["name"] == INITIALIZER and init["args"] == [f"s3://{MODELS_BUCKET}/v1", MODEL_MOUNT]
    assert {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {
        "name": SECRET, "key": "AWS_SECRET_ACCESS_KEY"}}} in init["env"]
    assert pod["spec"]["serviceAccountName"] == ACCOUNT

    served = _infer(isvc["status"]["url"], rows.head(3), request_id="req-1")
    expected = mlflow.pyfunc.load_model(str(folder)).predict(rows.head(3))
    pd.testing.assert_frame_equal(served, expected.reset_index(drop=True), check_dtype=False)

    keys = sorted(o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert keys == [f"inference/default/{MODEL}/predictor/payloads/req-1-{kind}.json"
                    for kind in ("request", "response")]
    logged = read_inference_logs(f"s3://{s3_bucket}/inference", since=timedelta(hours=1))
    assert (logged.requests, logged.responses) == (1, 1)
    assert list(logged.rows["request_id"]) == ["req-1"] * 3
    assert set(logged.rows["model_version"]) == {"1"}
    assert set(logged.inputs) == set(rows.columns)


def test_a_canary_takes_its_share_then_rolls_back_and_is_promoted(kserve, model):
    cluster, custom, settings = kserve
    _, rows, digest = model
    first, second = f"{MODEL}-predictor-00001", f"{MODEL}-predictor-00002"
    body = _isvc(settings, f"s3://{MODELS_BUCKET}/v1", digest)
    body["spec"]["predictor"]["canaryTrafficPercent"] = 25
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    url = _wait_ready(custom, first)["status"]["url"]
    # rolled out, the Knative Service's traffic splits it with itself: a new generation of the service, not of the isvc
    isvc = wait_for("the service's second generation", lambda: (i := _get(custom))["status"].get(
        "observedGeneration") == 2 and i)
    assert isvc["metadata"]["generation"] == 1

    _patch(custom, {"canaryTrafficPercent": 25, "model": {"storageUri": f"s3://{MODELS_BUCKET}/v2"}},
           {"annotations": {MODEL_VERSION_ANNOTATION: "2"}})
    isvc = _wait_ready(custom, second)
    predictor = _predictor(isvc)
    assert predictor["latestCreatedRevision"] == second and predictor["latestRolledoutRevision"] == first
    assert predictor["traffic"] == [{"revisionName": second, "latestRevision": True, "percent": 25},
                                    {"tag": "prev", "url": predictor["traffic"][1]["url"], "revisionName": first,
                                     "latestRevision": False, "percent": 75}]
    before = _routed(cluster)
    _send(url, rows, 100)
    after = _routed(cluster)
    assert {r: after.get(r, 0) - before.get(r, 0) for r in (first, second)} == {first: 75, second: 25}

    _patch(custom, {"canaryTrafficPercent": 0})  # roll back
    wait_for("the rollback's traffic", lambda: [t["percent"] for t in _predictor(_get(custom))["traffic"]] == [0, 100])
    assert _predictor(_get(custom))["latestRolledoutRevision"] == first
    before = _routed(cluster)
    _send(url, rows, 10)
    assert _routed(cluster).get(second, 0) == before.get(second, 0)

    _patch(custom, {"canaryTrafficPercent": None})  # promote
    isvc = wait_for("the promotion", lambda: (i := _get(custom)) and _predictor(i)["traffic"] == [
        {"revisionName": second, "latestRevision": True, "percent": 100}] and i)
    assert _predictor(isvc)["latestRolledoutRevision"] == second
    assert _predictor(isvc)["previousRolledoutRevision"] == first
    before = _routed(cluster)
    _send(url, rows, 5)
    assert _routed(cluster)[second] - before.get(second, 0) == 5
    wait_for("the old revision scaled to zero",
             lambda: not cluster.server.store.list(PODS, "default", f"{REVISION_LABEL}={first}")[0])


def test_the_deployment_mode_is_recorded_and_then_cannot_change(kserve, model):
    """``updateStatus`` records the mode kfloop's annotation chose; the webhook then refuses an update naming another
    (``validateDeploymentMode``) and admits one naming the same."""
    cluster, custom, settings = kserve
    body = _isvc(settings, f"s3://{MODELS_BUCKET}/v1", model[2])
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    recorded = wait_for("the recorded mode", lambda: (_get(custom).get("status") or {}).get("deploymentMode"))
    assert recorded == body["metadata"]["annotations"][DEPLOYMENT_MODE] == "Knative"
    with pytest.raises(client.ApiException) as refused:
        _patch(custom, {}, {"annotations": {DEPLOYMENT_MODE: "Standard"}})
    assert refused.value.status == 403
    assert status_of(refused.value)["message"] == (
        'admission webhook "inferenceservice.kserve-webhook-server.validator" denied the request: '
        "update rejected: deploymentMode cannot be changed from 'Knative' to 'Standard'")
    replaced = _get(custom)  # a PUT (replace) goes through the same webhook
    replaced["metadata"]["annotations"][DEPLOYMENT_MODE] = "RawDeployment"
    with pytest.raises(client.ApiException) as refused:
        custom.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, MODEL, replaced)
    assert status_of(refused.value)["message"].endswith("cannot be changed from 'Knative' to 'RawDeployment'")
    assert _get(custom)["metadata"]["annotations"][DEPLOYMENT_MODE] == "Knative"
    _patch(custom, {}, {"annotations": {DEPLOYMENT_MODE: "Knative", MODEL_VERSION_ANNOTATION: "2"}})
    assert _get(custom)["metadata"]["annotations"][MODEL_VERSION_ANNOTATION] == "2"
    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, MODEL)
    assert cluster.server.live_pids() == []


def _failed(custom) -> dict:
    return wait_for("the revision's failure", lambda: (c := _condition(_get(custom), "PredictorReady"))
                    and c["status"] == "False" and c, timeout=READY_TIMEOUT_S, interval=0.2)


def test_a_failing_predictor_never_becomes_ready(kserve, model):
    cluster, custom, settings = kserve
    digest = tree_digest({"MLmodel": hashlib.sha256(BROKEN).hexdigest()})  # the check passes, the loading fails
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                           _isvc(settings, f"s3://{MODELS_BUCKET}/broken", digest))
    failed = _failed(custom)
    assert failed["reason"] == "RevisionFailed" and f"{MODEL}-predictor-00001" in failed["message"]
    assert "its files have digest" not in failed["message"]
    assert "Container failed with:" in failed["message"]  # the log's tail (FallbackToLogsOnError)
    isvc = _get(custom)
    assert _condition(isvc, "Ready")["status"] == "False"
    assert "url" not in isvc["status"] and _predictor(isvc)["traffic"] == []
    assert "latestReadyRevision" not in _predictor(isvc)

    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, MODEL)  # its pods go with it
    assert cluster.server.store.list(PODS, "default", f"{REVISION_LABEL}={MODEL}-predictor-00001")[0] == []
    assert cluster.server.live_pids() == []


def test_a_tampered_download_is_refused_against_the_registered_digest(kserve, model):
    cluster, custom, settings = kserve
    folder, _, digest = model
    shutil.copytree(folder, cluster.shared / "models" / "tampered")
    (cluster.shared / "models" / "tampered" / "extra.py").write_text("import os\n")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                           _isvc(settings, f"pvc://{CLAIM}/models/tampered", digest))
    failed = _failed(custom)
    assert failed["reason"] == "RevisionFailed" and f"{MODEL}-predictor-00001" in failed["message"]
    assert "its files have digest sha256:" in failed["message"] and digest in failed["message"], failed["message"]
    assert "latestReadyRevision" not in _predictor(_get(custom))


def test_a_model_on_a_claim_is_mounted_without_the_storage_initializer(kserve, model):
    cluster, custom, settings = kserve
    folder, rows, digest = model
    shutil.copytree(folder, cluster.shared / "models" / "v1")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                           _isvc(settings, f"pvc://{CLAIM}/models/v1", digest))
    isvc = _wait_ready(custom, f"{MODEL}-predictor-00001")
    pod = cluster.server.store.list(PODS, "default", f"{REVISION_LABEL}={MODEL}-predictor-00001")[0][0]
    assert "initContainers" not in pod["spec"]
    assert {"name": "kserve-pvc-source", "mountPath": MODEL_MOUNT, "subPath": "models/v1", "readOnly": False} in \
        pod["spec"]["containers"][0]["volumeMounts"]
    assert len(_infer(isvc["status"]["url"], rows.head(2))) == 2


def test_what_kserve_refuses_or_the_emulation_does_not_model_is_named(kserve):
    _, custom, settings = kserve
    body = _isvc(settings, f"s3://{MODELS_BUCKET}/v1", "sha256:" + "0" * 64)
    body["metadata"]["name"] = "1-churn"
    with pytest.raises(client.ApiException) as refused:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    assert refused.value.status == 403
    assert status_of(refused.value)["message"].startswith(
        'admission webhook "inferenceservice.kserve-webhook-server.validator" denied the request: '
        'the InferenceService "1-churn" is invalid')
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                           _isvc(settings, "gs://bucket/model", "sha256:" + "0" * 64))
    condition = wait_for("the refusal", lambda: _condition(_get(custom), "PredictorReady"))
    assert condition["reason"] == "NotEmulated" and "spec.predictor.model.storageUri='gs://bucket/model'" in \
        condition["message"]
    stopped = _isvc(settings, f"s3://{MODELS_BUCKET}/v1", "sha256:" + "0" * 64)
    stopped["metadata"]["name"] = "churn-stopped"
    stopped["metadata"]["annotations"]["serving.kserve.io/stop"] = "True"
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, stopped)
    condition = wait_for("the stop's refusal", lambda: _condition(_get(custom, "churn-stopped"), "PredictorReady"))
    assert condition["reason"] == "NotEmulated" and "serving.kserve.io/stop" in condition["message"]
    standard = _isvc(settings, f"s3://{MODELS_BUCKET}/v1", "sha256:" + "0" * 64)
    standard["metadata"]["name"] = "churn-standard"
    standard["metadata"]["annotations"][DEPLOYMENT_MODE] = "RawDeployment"
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, standard)
    condition = wait_for("Standard's refusal", lambda: _condition(_get(custom, "churn-standard"), "PredictorReady"))
    assert condition["reason"] == "NotEmulated" and "deployment mode Standard" in condition["message"]
    assert _get(custom, "churn-standard")["status"]["deploymentMode"] == "Standard"


@pytest.fixture
def events():
    """A CloudEvents sink on loopback: its URL and the (headers, body) of each POST it received."""
    received: list[tuple[dict[str, str], bytes]] = []

    class Sink(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002
            pass

        def do_POST(self):
            received.append((dict(self.headers.items()), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/events", received
    server.shutdown()
    server.server_close()


def test_the_logger_sends_cloudevents_of_the_modes_requests_or_responses(cluster, events):
    url, received = events
    custom = client.CustomObjectsApi(cluster.api())
    custom.create_namespaced_custom_object(GROUP, "v1alpha1", "default", "servingruntimes", {
        "apiVersion": f"{GROUP}/v1alpha1", "kind": "ServingRuntime", "metadata": {"name": "echo"},
        "spec": {"supportedModelFormats": [{"name": "echo"}], "protocolVersions": ["v2"],
                 "containers": [{"name": "kserve-container", "image": "python:3.11",
                                 "command": [sys.executable, "-c", ECHO], "args": ["8080"],
                                 "ports": [{"containerPort": 8080}]}]}})
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
        "metadata": {"name": MODEL, "annotations": {MODEL_VERSION_ANNOTATION: "7"}},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "echo"}, "runtime": "echo",
                                         "storageUri": f"pvc://{CLAIM}/echo"},
                               "logger": {"mode": "request", "url": url,
                                          "metadataAnnotations": [MODEL_VERSION_ANNOTATION]}}}})
    isvc = _wait_ready(custom, f"{MODEL}-predictor-00001")

    def post(request_id: str) -> bytes:
        request = urllib.request.Request(isvc["status"]["url"] + "/v2/models/m/infer", data=b'{"inputs": []}',
                                         headers={"Content-Type": "application/json", "Ce-Id": request_id})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()

    assert post("ev-1") == b'{"inputs": []}'
    records = [record_from_cloudevent(h, b, "sink") for h, b in received]
    assert [(r.id, r.type, r.body) for r in records] == [("ev-1", REQUEST_TYPE, b'{"inputs": []}')]
    assert records[0].annotations == {MODEL_VERSION_ANNOTATION: "7"}
    assert (records[0].inference_service, records[0].component) == (MODEL, "predictor")

    _patch(custom, {"logger": {"mode": "response"}})  # a logger change is a new revision
    isvc = _wait_ready(custom, f"{MODEL}-predictor-00002")
    del received[:]
    post("ev-2")
    assert [(r.id, r.type) for r in (record_from_cloudevent(h, b, "sink") for h, b in received)] == [
        ("ev-2", RESPONSE_TYPE)]
