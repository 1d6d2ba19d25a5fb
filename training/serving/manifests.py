"""The KServe manifests of a registered version: a namespaced ServingRuntime running ``kfloop serve-model`` in the
kfloop image (the stock ``kserve-mlserver`` cannot load MLflow 3 models: docs/serving.md) and the
InferenceService whose predictor downloads the version from its ``s3://`` folder into ``/mnt/models``."""
from __future__ import annotations

import re
from typing import Any

from training.launch.cluster import ClusterConfig
from training.launch.manifests import ISTIO_INJECT
from training.serving import DIGEST_ANNOTATION, MODEL_NAME_ANNOTATION, MODEL_VERSION_ANNOTATION
from training.serving.artifacts import VersionArtifacts, resolve_version
from training.serving.load import ModelSource
from training.serving.settings import ServingSettings

KSERVE_VERSIONS = ("0.20", "0.16")
"""The KServe releases rendered for: 0.20 (its CRD is the one checked), 0.16 (Kubeflow 26.03's bundle)."""
RUNTIME = "kfloop"
"""Name of the ServingRuntime, and the model format it serves."""
MODEL_FORMAT = {"name": "kfloop-mlflow", "version": "3"}
"""MLflow 3 pyfunc models logged by kfloop (models-from-code)."""
MODEL_MOUNT = "/mnt/models"
"""Where KServe's storage initializer puts the model (``constants.DefaultModelLocalMountPath``)."""
HTTP_PORT = 8080
"""The port KServe routes to (``constants.InferenceServiceDefaultHttpPort``)."""
GRPC_PORT = 8081
"""The gRPC port of KServe's model servers (``kserve.constants.DEFAULT_GRPC_PORT``), named in the runtime's args."""
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
"""Annotation choosing Knative (revisions, ``canaryTrafficPercent``) or Standard mode."""
LOG_STORE_PATH = "payloads"
"""The logger's ``storage.path``: KServe's agent writes blobs under ``<log_uri>/<namespace>/<isvc>/<component>/
payloads/<ce-id>-<request|response>.json`` (pkg/logger/store.go ``getObjectPrefix``)."""
LABELS = {"app.kubernetes.io/name": "kfloop", "app.kubernetes.io/component": "serving"}
ISVC_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
"""KServe's ``IsvcNameFmt`` (pkg/apis/serving/v1beta1/inference_service_validation.go:46)."""
_TMP = "tmp"
DIGEST_VARIABLE = "KFLOOP_ARTIFACT_DIGEST"
"""The predictor container's variable holding the pod's :data:`DIGEST_ANNOTATION` (downward API; the
InferenceService's annotations are its pods'), expanded by Kubernetes into ``--artifact-digest $(...)``."""


def render_serving(source: ModelSource, serving: ServingSettings, cluster: ClusterConfig, *,
                   canary_percent: int | None = None, kserve: str = "0.20") -> list[dict[str, Any]]:
    """The ServingRuntime and InferenceService of ``source``'s version, resolved through the registry.

    Raises:
        ValueError: a model name KServe refuses as an InferenceService name, no ``serving.log_uri``, a canary
            outside 0-100, an unknown KServe release, or artifacts outside object storage.
        NotFoundError: no such version or alias.
    """
    _check(source.model_name, serving, canary_percent, kserve)
    artifacts = resolve_version(source.model_name, version=source.version, alias=source.alias,
                                artifacts_destination=serving.artifacts_destination)
    return [serving_runtime(serving, cluster),
            inference_service(artifacts, serving, cluster, canary_percent=canary_percent, kserve=kserve)]


def _check(model_name: str, serving: ServingSettings, canary_percent: int | None, kserve: str) -> None:
    if not ISVC_NAME.match(model_name) or len(model_name) > 63:
        raise ValueError(f"model {model_name!r} cannot name an InferenceService: KServe needs lower-case letters, "
                         "digits and '-', starting with a letter (at most 63): register the model under such a name")
    if not serving.log_uri:
        raise ValueError("serving.log_uri is not set: the predictor logs every request; set it to an s3:// prefix, "
                         "e.g. --set serving.log_uri=s3://kfloop-logs/inference")
    if canary_percent is not None and not 0 <= canary_percent <= 100:
        raise ValueError(f"--canary {canary_percent}: use a percentage from 0 (roll back) to 100")
    if kserve not in KSERVE_VERSIONS:
        raise ValueError(f"--kserve {kserve}: use one of {list(KSERVE_VERSIONS)}")


def serving_runtime(serving: ServingSettings, cluster: ClusterConfig) -> dict[str, Any]:
    """The ServingRuntime running ``kfloop serve-model --model-dir /mnt/models`` as the restricted kfloop user,
    refusing to start unless the folder has its InferenceService's :data:`DIGEST_ANNOTATION`."""
    container = {
        "name": "kserve-container",
        "image": cluster.image,
        "imagePullPolicy": cluster.image_pull_policy,
        "command": ["kfloop"],
        "args": ["serve-model", "--model", "{{.Name}}", "--model-dir", MODEL_MOUNT,
                 "--artifact-digest", f"$({DIGEST_VARIABLE})", "--port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT)],
        "env": [{"name": DIGEST_VARIABLE,
                 "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{DIGEST_ANNOTATION}']"}}}],
        "ports": [{"containerPort": HTTP_PORT, "protocol": "TCP"}],
        "securityContext": {"runAsNonRoot": True, "runAsUser": cluster.run_as_user,
                            "runAsGroup": cluster.run_as_user, "allowPrivilegeEscalation": False,
                            "privileged": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": _TMP, "mountPath": "/tmp"}],
    }
    spec: dict[str, Any] = {
        "supportedModelFormats": [{**MODEL_FORMAT, "autoSelect": True}],
        "protocolVersions": ["v2"],
        "containers": [container],
        "volumes": [{"name": _TMP, "emptyDir": {}}],
    }
    if cluster.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in cluster.image_pull_secrets]
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime",
            "metadata": _metadata(RUNTIME, serving), "spec": spec}


def inference_service(artifacts: VersionArtifacts, serving: ServingSettings, cluster: ClusterConfig, *,
                      canary_percent: int | None = None, kserve: str = "0.20") -> dict[str, Any]:
    """The InferenceService of ``artifacts`` in Knative mode: the model downloaded from its ``s3://`` folder, the
    payload logger writing JSON blobs under ``serving.log_uri`` (``kserve`` 0.16 knows no format parameter: JSON
    only), Pod Security ``restricted``, and ``canaryTrafficPercent`` when ``canary_percent`` is given."""
    resources = {"cpu": serving.cpu, "memory": serving.memory}
    parameters = {"type": "s3", **({"format": "json"} if kserve != "0.16" else {})}
    predictor: dict[str, Any] = {
        "serviceAccountName": serving.service_account,
        "annotations": {ISTIO_INJECT: "true" if serving.istio_sidecar else "false"},
        "labels": dict(LABELS),
        "securityContext": {"runAsNonRoot": True, "runAsUser": cluster.run_as_user,
                            "runAsGroup": cluster.run_as_user, "fsGroup": cluster.run_as_user,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "model": {"modelFormat": dict(MODEL_FORMAT), "runtime": RUNTIME, "protocolVersion": "v2",
                  "storageUri": artifacts.storage_uri,
                  "resources": {"requests": dict(resources), "limits": dict(resources)}},
        "logger": {"mode": serving.log_mode, "url": serving.log_uri,
                   "metadataAnnotations": [MODEL_NAME_ANNOTATION, MODEL_VERSION_ANNOTATION, DIGEST_ANNOTATION],
                   "storage": {"path": LOG_STORE_PATH,
                               "parameters": parameters, "key": serving.log_storage_key,
                               "serviceAccountName": serving.service_account}},
    }
    if canary_percent is not None:
        predictor["canaryTrafficPercent"] = canary_percent
    metadata = _metadata(artifacts.model_name, serving)
    metadata["annotations"] = {DEPLOYMENT_MODE: "Knative", MODEL_NAME_ANNOTATION: artifacts.model_name,
                               MODEL_VERSION_ANNOTATION: artifacts.version, DIGEST_ANNOTATION: artifacts.digest}
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": metadata,
            "spec": {"predictor": predictor}}


def _metadata(name: str, serving: ServingSettings) -> dict[str, Any]:
    return {"name": name, **({"namespace": serving.namespace} if serving.namespace else {}), "labels": dict(LABELS)}
