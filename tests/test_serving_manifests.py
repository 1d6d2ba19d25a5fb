"""``kfloop render-serving`` (issue 42 item 2): the manifests of a version registered in an MLflow whose artifact
store is a real S3 API server (moto), checked against KServe v0.20.0's CRDs, its webhook and controller rules
(tests/cluster/kserve_validation.py) and the Pod Security ``restricted`` profile."""
from __future__ import annotations

import json
from pathlib import Path

import boto3
import mlflow
import pytest
from serving_versions import register_version

from cluster import kserve_validation
from cluster.crd_schema import validate as validate_crd
from cluster.pod_security import violations
from pipelines.cli import main
from training.registry.versions import CHAMPION_ALIAS
from training.registry.manifest import MANIFEST_TAG, check_digest, file_manifest, tree_digest
from training.registry.versions import ForeignModelError
from training.serving import DIGEST_ANNOTATION, MODEL_VERSION_ANNOTATION
from training.serving.artifacts import object_storage_uri
from training.serving.manifests import DIGEST_VARIABLE

MODEL = "churn-served"
LOG_URI = "s3://kfloop-logs/inference"


@pytest.fixture
def registered(isolated_env, s3_bucket, tmp_path):
    """Version 1 of :data:`MODEL` (champion) logged to ``s3://<bucket>/mlartifacts``."""
    client = mlflow.MlflowClient()
    experiment = client.create_experiment("served", artifact_location=f"s3://{s3_bucket}/mlartifacts")
    version, _ = register_version(MODEL, experiment_id=experiment, root=tmp_path)
    client.set_registered_model_alias(MODEL, CHAMPION_ALIAS, version)
    return s3_bucket, version


def _storage_initializer(storage_uri: str, dst: Path) -> Path:
    """Every non-empty object under ``storage_uri`` into ``dst`` by its key relative to the prefix, as KServe
    v0.20.0's storage initializer downloads an ``s3://`` URI (``python/storage/kserve_storage/kserve_storage.py``
    ``_download_s3``, lines 533-544: keys ending in ``/`` and empty objects are skipped)."""
    bucket, _, prefix = storage_uri.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        for item in page.get("Contents", []):
            if item["Key"].endswith("/") or item["Size"] == 0:
                continue
            target = dst / item["Key"].removeprefix(prefix.rstrip("/") + "/")
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(target))
    return dst


def _render(capsys, *flags: str) -> tuple[int, list[dict] | dict]:
    code = main(["render-serving", "--model", MODEL, "--json", "--set", f"serving.log_uri={LOG_URI}", *flags])
    return code, json.loads(capsys.readouterr().out)


def _pod(runtime: dict, isvc: dict) -> dict:
    """The predictor pod KServe assembles: the runtime's containers and volumes under the predictor's pod fields."""
    predictor = isvc["spec"]["predictor"]
    return {"securityContext": predictor["securityContext"], "serviceAccountName": predictor["serviceAccountName"],
            "containers": runtime["spec"]["containers"], "volumes": runtime["spec"]["volumes"]}


def test_the_champion_renders_valid_manifests_pointing_at_its_s3_folder(registered, capsys, tmp_path):
    bucket, version = registered
    code, (runtime, isvc) = _render(capsys)
    assert code == 0
    for body in (runtime, isvc):
        assert validate_crd(body) == [], body["kind"]
    assert kserve_validation.validate(isvc) is None
    model = isvc["spec"]["predictor"]["model"]
    assert model["storageUri"].startswith(f"s3://{bucket}/mlartifacts/") and model["storageUri"].endswith("/artifacts")
    assert "models:/" not in json.dumps([runtime, isvc]) and "mlflow-artifacts:" not in json.dumps([runtime, isvc])
    annotations = isvc["metadata"]["annotations"]
    downloaded = _storage_initializer(model["storageUri"], tmp_path / "mnt-models")
    assert (downloaded / "MLmodel").is_file()
    assert annotations[MODEL_VERSION_ANNOTATION] == version
    assert annotations[DIGEST_ANNOTATION] == tree_digest(file_manifest(downloaded))  # the registry's = KServe's
    check_digest(downloaded, annotations[DIGEST_ANNOTATION])
    container = runtime["spec"]["containers"][0]
    assert container["args"][container["args"].index("--artifact-digest") + 1] == f"$({DIGEST_VARIABLE})"
    assert container["env"] == [{"name": DIGEST_VARIABLE, "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.annotations['{DIGEST_ANNOTATION}']"}}}]
    logger = isvc["spec"]["predictor"]["logger"]
    assert logger["mode"] == "all" and logger["url"] == LOG_URI and logger["storage"]["parameters"]["format"] == "json"
    assert violations("restricted", _pod(runtime, isvc)) == []
    assert isvc["spec"]["predictor"]["annotations"] == {"sidecar.istio.io/inject": "true"}
    assert "canaryTrafficPercent" not in isvc["spec"]["predictor"]


def test_canary_and_the_kubeflow_26_03_rendering(registered, capsys):
    _, version = registered
    code, (_, canary) = _render(capsys, "--version", version, "--canary", "20")
    assert code == 0 and canary["spec"]["predictor"]["canaryTrafficPercent"] == 20
    assert kserve_validation.validate(canary) is None and validate_crd(canary) == []
    code, (_, old) = _render(capsys, "--kserve", "0.16")
    assert code == 0 and "format" not in old["spec"]["predictor"]["logger"]["storage"]["parameters"]
    assert kserve_validation.validate(old) is None


@pytest.mark.parametrize("flags, words", [
    (["--canary", "101"], "--canary 101: use a percentage from 0"),
    (["--version", "9"], "has no version 9"),
    (["--set", "serving.log_uri=/var/log"], "serving.log_uri='/var/log': use an s3:// prefix"),
    (["--set", "serving.log_mode=some"], "serving.log_mode='some'"),
])
def test_bad_input_gets_a_clear_error(registered, capsys, flags, words):
    code, answer = _render(capsys, *flags)
    assert code != 0 and words in answer["error"], answer


def test_a_local_artifact_store_is_refused_with_the_fix(isolated_env, tmp_path, capsys):
    experiment = mlflow.MlflowClient().create_experiment("local", artifact_location=str(tmp_path / "mlartifacts"))
    register_version(MODEL, experiment_id=experiment, root=tmp_path)
    code, answer = _render(capsys, "--version", "1")
    assert code != 0 and "cannot download (it needs s3://)" in answer["error"]


def test_a_proxied_location_maps_onto_the_servers_artifacts_destination():
    assert object_storage_uri("mlflow-artifacts:/3/models/m-1/artifacts", "s3://store/mlartifacts/") == \
        "s3://store/mlartifacts/3/models/m-1/artifacts"
    with pytest.raises(ValueError, match="set serving.artifacts_destination"):
        object_storage_uri("mlflow-artifacts:/3/models/m-1/artifacts")


def test_the_digest_comes_from_the_verified_manifest_without_a_download(registered, capsys):
    bucket, version = registered
    boto3.client("s3").delete_object(Bucket=bucket, Key=_model_key(bucket, "MLmodel"))  # no download reads it
    code, (_, isvc) = _render(capsys)
    assert code == 0
    client = mlflow.MlflowClient()
    manifest = json.loads(client.get_model_version(MODEL, version).tags[MANIFEST_TAG])
    assert isvc["metadata"]["annotations"][DIGEST_ANNOTATION] == tree_digest(manifest)
    client.set_model_version_tag(MODEL, version, MANIFEST_TAG, json.dumps({**manifest, "extra": "0" * 64}))
    code, answer = _render(capsys)
    assert code == ForeignModelError.exit_code and f"its {MANIFEST_TAG} tag has sha256" in answer["error"], answer


def _model_key(bucket: str, name: str) -> str:
    """The S3 key of the registered model folder's file ``name``."""
    keys = [item["Key"] for page in boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for item in page.get("Contents", [])]
    return next(key for key in keys if key.endswith(f"/artifacts/{name}"))
