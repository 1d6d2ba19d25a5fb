"""KServe v0.20.0's rules for an InferenceService that the CRD schema does not carry (its validating webhook and
the controller's checks), ported from kserve at tag v0.20.0 with upstream's messages:

- ``pkg/apis/serving/v1beta1/inference_service_validation.go``: the name (``IsvcNameFmt``, lines 46 and 469-474),
  the standard predictor's ``name`` (``validatePredictor``, 268-300), exactly one implementation per component
  (157-165), the ``spec.canary`` rules (``validateCanarySpecs``, 183-266);
- ``pkg/apis/serving/v1beta1/component.go``: ``ComponentExtensionSpec.Validate`` (341-347): replicas (374-388),
  container concurrency (390-398), the logger's mode and its storage triple ``path``/``parameters``/``key``
  (``validateLogger``, 400-413), the exactly-one message (``ExactlyOneErrorFor``, 440-452, over the fields of
  ``PredictorSpec`` in ``predictor.go`` 32-79) and the implementations it counts (``GetImplementations``, 168-196);
- ``pkg/controller/v1beta1/inferenceservice/utils/utils.go`` ``ValidateStorageURI`` (411-442, prefixes at 48,
  Azure at 52-53), which the predictor reconciler applies (``components/predictor.go`` 300); a
  ClusterStorageContainer (its step 1) is not modelled: none is installed;
- ``ValidateUpdate`` (84-106): ``validateDeploymentMode`` (685-701) first, then the rules above; its deletion
  case (``DeletionTimestamp`` set: nothing checked) does not arise, the test server deleting at once;
  ``validatePredictorNameChange`` (a Standard-mode canary rule) is not ported;
- ``pkg/constants/constants.go`` ``ParseDeploymentMode`` (570-587): the legacy ``Serverless`` and ``RawDeployment``
  are ``Knative`` and ``Standard``, an empty mode ``DefaultDeployment`` (``Standard``, 566);
- ``canaryTrafficPercent``: the Knative reconciler turns it into traffic targets ``P`` and ``100 - P``
  (``reconcilers/knative/ksvc_reconciler.go`` 134-153), which Knative refuses outside 0-100.

:func:`validate` (create) and :func:`validate_update` answer like the webhook: the first rule broken, or None.
"""
from __future__ import annotations

import re
from typing import Any

ISVC_NAME_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
INVALID_NAME = ("the InferenceService \"{}\" is invalid: a InferenceService name must consist of lower case alphanumeric "
                "characters or '-', and must start with alphabetical character. (e.g. \"my-name\" or \"abc-123\", "
                "regex used for validation is '{}')")
PREDICTOR_FIELDS = ("Name", "SKLearn", "XGBoost", "Tensorflow", "PyTorch", "Triton", "ONNX", "HuggingFace", "PMML",
                    "LightGBM", "Paddle", "Model", "StorageUris", "StorageContainerName", "WorkerSpec", "PodSpec")
"""``PredictorSpec``'s fields but the last (``ComponentExtensionSpec``), as ``ExactlyOneErrorFor`` lists them."""
EXACTLY_ONE = f"exactly one of [{', '.join(PREDICTOR_FIELDS)}] must be specified in PredictorSpec"
IMPLEMENTATIONS = ("xgboost", "pytorch", "triton", "sklearn", "tensorflow", "onnx", "pmml", "lightgbm", "paddle",
                   "huggingface", "model")
INVALID_LOGGER_TYPE = "invalid logger type"
INVALID_LOGGER_STORAGE = "invalid logger storage configuration"
LOGGER_MODES = ("all", "request", "response")
MIN_REPLICAS_OVER_MAX = "'MinReplicas' cannot be greater than MaxReplicas"
MIN_REPLICAS_NEGATIVE = "'MinReplicas' cannot be less than 0"
MAX_REPLICAS_NEGATIVE = "'MaxReplicas' cannot be less than 0"
PARALLELISM_NEGATIVE = "parallelism cannot be less than 0"
STORAGE_PREFIXES = ("gs://", "s3://", "pvc://", "file://", "https://", "http://", "hdfs://", "webhdfs://", "oci://",
                    "oci+native://", "hf://")
UNSUPPORTED_STORAGE_URI = ("storageUri, must be one of: [{}] or match https://{{}}.blob.core.windows.net/{{}}/{{}} or be "
                           "an absolute or relative local path. StorageUri [{}] is not supported")
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
KNATIVE, STANDARD = "Knative", "Standard"
LEGACY_MODES = {"Serverless": KNATIVE, "RawDeployment": STANDARD}
"""``LegacyServerless`` and ``LegacyRawDeployment`` (constants.go 562-564) and what they are now."""
MODE_CHANGED = "update rejected: deploymentMode cannot be changed from '{}' to '{}'"


def validate(isvc: dict[str, Any]) -> str | None:
    """The first rule ``isvc`` (an InferenceService body) breaks, with upstream's message; None when it passes."""
    name = isvc.get("metadata", {}).get("name", "")
    if not re.fullmatch(ISVC_NAME_FMT, name):
        return INVALID_NAME.format(name, ISVC_NAME_FMT)
    spec = isvc.get("spec", {})
    predictor = spec.get("predictor", {})
    for key in IMPLEMENTATIONS:
        if (predictor.get(key) or {}).get("name"):
            return "the 'name' field is not allowed in standard predictor"
    for component in (predictor, spec.get("transformer"), spec.get("explainer")):
        if component is None:
            continue
        if component is predictor and len(implementations(predictor)) != 1:
            return EXACTLY_ONE
        error = extension_error(component) or storage_uri_error(storage_uri(component))
        if error:
            return error
    return canary_error(isvc) or traffic_error(predictor)


def validate_update(isvc: dict[str, Any], old: dict[str, Any]) -> str | None:
    """``ValidateUpdate`` of ``old`` (with its status) to ``isvc``."""
    return deployment_mode_error(isvc, old) or validate(isvc)


def deployment_mode_error(isvc: dict[str, Any], old: dict[str, Any]) -> str | None:
    """``validateDeploymentMode``: once the controller recorded ``status.deploymentMode``, an annotation naming
    another mode (legacy names compared as written) is refused; before that, anything goes."""
    recorded = (old.get("status") or {}).get("deploymentMode", "")
    if not recorded:
        return None
    recorded = parse_deployment_mode(recorded)
    annotations = isvc["metadata"].get("annotations") or {}
    if DEPLOYMENT_MODE in annotations and annotations[DEPLOYMENT_MODE] != recorded:
        return MODE_CHANGED.format(recorded, annotations[DEPLOYMENT_MODE])
    return None


def parse_deployment_mode(mode: str) -> str:
    """``ParseDeploymentMode``: ``Standard`` for an empty mode, legacy names as their successors, others as they
    are."""
    return LEGACY_MODES.get(mode, mode or STANDARD)


def implementations(predictor: dict[str, Any]) -> list[str]:
    """What ``GetImplementations`` counts: each framework spec set, plus the custom container (the one named
    ``kserve-container``, else the first) when ``containers`` is set."""
    found = [key for key in IMPLEMENTATIONS if predictor.get(key) is not None]
    containers = predictor.get("containers") or []
    found += ["containers" for c in containers if c.get("name") == "kserve-container"]
    if containers and not found:
        found.append("containers")
    return found


def storage_uri(component: dict[str, Any]) -> str | None:
    """The ``storageUri`` of the component's implementation."""
    for key in IMPLEMENTATIONS:
        if component.get(key) is not None:
            return component[key].get("storageUri")
    return None


def extension_error(component: dict[str, Any]) -> str | None:
    """``ComponentExtensionSpec.Validate``: container concurrency, replicas, logger."""
    concurrency = component.get("containerConcurrency")
    if concurrency is not None and concurrency < 0:
        return PARALLELISM_NEGATIVE
    low, high = component.get("minReplicas", 1), component.get("maxReplicas", 0)
    if low < 0:
        return MIN_REPLICAS_NEGATIVE
    if high < 0:
        return MAX_REPLICAS_NEGATIVE
    if low > high and high != 0:
        return MIN_REPLICAS_OVER_MAX
    return logger_error(component.get("logger"))


def logger_error(logger: dict[str, Any] | None) -> str | None:
    """``validateLogger``: a mode of ``all``, ``request`` or ``response``; a storage with all of ``path``,
    ``parameters`` and ``key``."""
    if logger is None:
        return None
    if logger.get("mode") not in LOGGER_MODES:
        return INVALID_LOGGER_TYPE
    storage = logger.get("storage")
    if storage is not None and any(storage.get(key) is None for key in ("path", "parameters", "key")):
        return INVALID_LOGGER_STORAGE
    return None


def storage_uri_error(uri: str | None) -> str | None:
    """The controller's ``ValidateStorageURI`` with no ClusterStorageContainer: a local path (no ``scheme://``),
    an Azure blob URL or a supported prefix passes."""
    if uri is None or not re.search(r"\w+?://", uri):
        return None
    if "blob.core.windows.net" in uri:
        if re.search(r"https://(.+?).blob.core.windows.net/(.+)", uri):
            return None
    elif uri.startswith(STORAGE_PREFIXES):
        return None
    return UNSUPPORTED_STORAGE_URI.format(", ".join(STORAGE_PREFIXES), uri)


def canary_error(isvc: dict[str, Any]) -> str | None:
    """``validateCanarySpecs`` for ``spec.canary`` (v0.20, Standard mode only)."""
    canaries = isvc["spec"].get("canary") or []
    if not canaries:
        return None
    if isvc["metadata"].get("annotations", {}).get(DEPLOYMENT_MODE) != STANDARD:
        return "canary is only supported in Standard deployment mode"
    stable = isvc["spec"]["predictor"]
    if storage_uri(stable) is None and stable.get("model") is None:
        return "canary requires a stable predictor with a model (multi-model serving is not supported with canary)"
    names: set[str] = set()
    total = 0
    for i, canary in enumerate(canaries):
        predictor, name = canary.get("predictor", {}), canary.get("predictor", {}).get("name", "")
        if not name:
            return f"canary[{i}] predictor.name is required"
        if name in names:
            return f'canary predictor.name "{name}" is duplicated'
        names.add(name)
        if name == stable.get("name", ""):
            return f'canary predictor.name "{name}" conflicts with stable predictor name'
        percent = canary.get("trafficPercent", 0)
        if not 0 <= percent <= 100:
            return f'canary "{name}" trafficPercent must be between 0 and 100, got {percent}'
        total += percent
        if len(implementations(predictor)) != 1:
            return f'canary "{name}" predictor: {EXACTLY_ONE}'
        error = extension_error(predictor)
        if error:
            return f'canary "{name}" predictor: {error}'
        if predictor.get("workerSpec") is not None:
            return f'canary "{name}" must not set workerSpec (multi-node is not yet supported for canary)'
        for key in ("maxReplicas", "scaleTarget", "scaleMetric", "autoScaling"):
            if predictor.get(key):
                return f'canary "{name}" must not set {key} (canary uses fixed replicas)'
        low = predictor.get("minReplicas")
        if low is not None and low > stable.get("minReplicas", 1):
            return (f'canary "{name}" minReplicas ({low}) must not exceed stable predictor minReplicas '
                    f'({stable.get("minReplicas", 1)})')
    if total > 100:
        return f"sum of canary trafficPercent values ({total}) must be <= 100"
    return None


def traffic_error(predictor: dict[str, Any]) -> str | None:
    """``canaryTrafficPercent`` as Knative's traffic targets allow it."""
    percent = predictor.get("canaryTrafficPercent")
    if percent is not None and not 0 <= percent <= 100:
        return f"canaryTrafficPercent {percent}: traffic targets must be between 0 and 100 percent"
    return None
