"""KServe v0.20.0's own validation tests, ported as vectors the rules in cluster/kserve_validation.py must pass.

Tables name the upstream test function and file at tag v0.20.0. Upstream's ``makeTestInferenceService``
(``inference_service_validation_test.go`` :61) is :func:`base`: ``foo`` in ``default``, a TFServing predictor with
``storageUri: gs://testbucket/testmodel``. ``None`` is upstream's ``BeNil``/``Succeed``; ``ERR`` is upstream's
``ShouldNot(Succeed())`` (any error).

Not ported: ``TestDeploymentModeUpdate``'s deletion case and ``TestValidateUpdateDuringDeletion`` (the test server
deletes at once, so no update carries a ``deletionTimestamp``), ``TestValidatePredictorNameChange`` (not ported in
cluster/kserve_validation.py).
"""
from __future__ import annotations

import copy

import pytest

from cluster.kserve_validation import (DEPLOYMENT_MODE, EXACTLY_ONE, INVALID_LOGGER_STORAGE, INVALID_LOGGER_TYPE,
                                       MAX_REPLICAS_NEGATIVE, MIN_REPLICAS_NEGATIVE, MIN_REPLICAS_OVER_MAX,
                                       MODE_CHANGED, PARALLELISM_NEGATIVE, logger_error, parse_deployment_mode,
                                       storage_uri_error, validate, validate_update)

ERR = object()


def base(**predictor) -> dict:
    """``makeTestInferenceService()``, its predictor updated with ``predictor``."""
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "foo", "namespace": "default"},
            "spec": {"predictor": {"tensorflow": {"storageUri": "gs://testbucket/testmodel",
                                                  "runtimeVersion": "0.14.0"}}}}
    isvc["spec"]["predictor"].update(predictor)
    return isvc


def check(got: str | None, want) -> None:
    assert (got is not None) if want is ERR else got == want, got


# component_test.go TestComponentExtensionSpec_validateLogger (:134)
@pytest.mark.parametrize("logger, want", [
    ({"mode": "all"}, None),                                          # LoggerWithLogAllMode
    ({"mode": "request"}, None),                                      # LoggerWithLogRequestMode
    ({"mode": "response"}, None),                                     # LoggerWithLogResponseMode
    ({"mode": "all", "metadataHeaders": ["Foo", "Bar"]}, None),       # LoggerWithHeaderMetadata
    ({"mode": "InvalidMode"}, INVALID_LOGGER_TYPE),                   # InvalidLoggerMode
    (None, None),                                                     # LoggerIsNil
    ({"mode": "all", "storage": {}}, INVALID_LOGGER_STORAGE),         # StorageConfigNilValues
])
def test_validate_logger(logger, want):
    check(logger_error(logger), want)


def test_a_logger_without_mode_is_refused_by_the_webhook():
    """``Mode`` has no default in LoggerSpec: an empty mode is none of LogAll, LogRequest, LogResponse."""
    check(validate(base(logger={"url": "http://logger"})), INVALID_LOGGER_TYPE)


@pytest.mark.parametrize("storage", [{"path": "/logger", "parameters": {"type": "s3"}},
                                     {"path": "/logger", "key": "credentials"},
                                     {"parameters": {"type": "s3"}, "key": "credentials"}])
def test_the_logger_storage_triple_is_all_or_nothing(storage):
    """component.go :405-408: ``Path``, ``Parameters`` and ``StorageKey`` are each required once storage is set."""
    check(validate(base(logger={"mode": "all", "storage": storage})), INVALID_LOGGER_STORAGE)
    check(validate(base(logger={"mode": "all", "storage": {"path": "/logger", "parameters": {"type": "s3"},
                                                           "key": "credentials"}})), None)


# component_test.go TestComponentExtensionSpec_Validate (:31); inference_service_validation_test.go
# TestBadParallelismValues (:627), TestBadReplicaValues (:637)
@pytest.mark.parametrize("predictor, want", [
    ({"minReplicas": 3, "maxReplicas": 2}, MIN_REPLICAS_OVER_MAX),    # InvalidReplica
    ({"containerConcurrency": -1}, PARALLELISM_NEGATIVE),             # InvalidContainerConcurrency
    ({"minReplicas": -1}, MIN_REPLICAS_NEGATIVE),
    ({"maxReplicas": -1}, MAX_REPLICAS_NEGATIVE),
    ({"minReplicas": 2, "maxReplicas": 1}, MIN_REPLICAS_OVER_MAX),
])
def test_component_extension(predictor, want):
    check(validate(base(**predictor)), want)


# inference_service_validation_test.go TestRejectMultipleModelSpecs (:584), TestModelSpecAndCustomOverridesIsValid
# (:607), TestRejectModelSpecMissing (:617), TestGoodName (:781), TestRejectBadNameStartWithNumber (:791),
# TestRejectBadNameIncludeDot (:801), TestInvalidNameInSKLearnPredictor (:36)
@pytest.mark.parametrize("change, want", [
    (lambda i: i["spec"]["predictor"].update(xgboost={}), EXACTLY_ONE),
    (lambda i: i["spec"]["predictor"].update(serviceAccountName="test"), None),
    (lambda i: i["spec"]["predictor"].pop("tensorflow"), EXACTLY_ONE),
    (lambda i: i["metadata"].update(name="abc-123"), None),
    (lambda i: i["metadata"].update(name="1abcde"), ERR),
    (lambda i: i["metadata"].update(name="abc.de"), ERR),
    (lambda i: i["spec"]["predictor"].update(tensorflow=None, sklearn={"name": "x", "storageUri": "gs://b/m"}),
     "the 'name' field is not allowed in standard predictor"),
])
def test_inference_service_rules(change, want):
    isvc = base()
    change(isvc)
    isvc["spec"]["predictor"] = {k: v for k, v in isvc["spec"]["predictor"].items() if v is not None}
    check(validate(isvc), want)


def test_a_custom_container_counts_as_the_one_implementation():
    """predictor.go :183-193 (TestCustomOK :715): containers alone are the implementation; beside a framework spec
    the one named kserve-container is a second."""
    custom = {"containers": [{"name": "kserve-container", "image": "kfloop"}]}
    check(validate({**base(), "spec": {"predictor": custom}}), None)
    check(validate(base(**custom)), EXACTLY_ONE)


# utils_test.go TestValidateStorageURIForDefaultStorageInitializer (:2165), TestValidateStorageURIForCustomPrefix
# (:2194)
@pytest.mark.parametrize("uri", ["https://kfserving.blob.core.windows.net/triton/simple_string/",
                                 "https://kfserving.blob.core.windows.net/triton/simple_string",
                                 "https://kfserving.blob.core.windows.net/triton/",
                                 "https://kfserving.blob.core.windows.net/triton",
                                 "https://raw.githubusercontent.com/someOrg/someRepo/model.tar.gz",
                                 "http://raw.githubusercontent.com/someOrg/someRepo/model.tar.gz",
                                 "hdfs://", "webhdfs://", "oci+native://ghcr.io/kserve/oci-native-test-fixture:v1",
                                 "some/relative/path", "/", "foo", ""])
def test_storage_uri_the_default_storage_initializer_takes(uri):
    check(storage_uri_error(uri), None)


def test_storage_uri_custom_prefix_is_refused():
    check(storage_uri_error("custom://custom.com/model"), ERR)


def test_mlflow_uris_pass_as_local_paths_and_so_kfloop_must_refuse_them_itself():
    """No ``scheme://`` in ``models:/m/1`` or ``mlflow-artifacts:/x``: the controller takes them for local paths
    (utils.go :427), and the storage initializer then finds nothing; render-serving never writes one."""
    assert storage_uri_error("models:/churn/3") is None
    assert storage_uri_error("mlflow-artifacts:/1/models/m-1/artifacts") is None


def _standard(canaries: list[dict] | None, **stable) -> dict:
    """TestValidateCanarySpecs' ``makeISVC``: Standard mode, an sklearn model predictor."""
    isvc = {"metadata": {"name": "foo", "namespace": "default",
                         "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "sklearn"}, "storageUri": "gs://b/m"},
                                   **stable}}}
    if canaries is not None:
        isvc["spec"]["canary"] = canaries
    return isvc


def _canary(name: str, traffic: int, **predictor) -> dict:
    return {"trafficPercent": traffic,
            "predictor": {"name": name, "model": {"modelFormat": {"name": "sklearn"}, "storageUri": "gs://b/m2"},
                          **predictor}}


# inference_service_validation_test.go TestValidateCanarySpecs (:2373)
@pytest.mark.parametrize("isvc, want", [
    (_standard(None), None),                                                             # No canaries
    (_standard([_canary("v2", 10)]), None),                                              # Single valid canary
    (_standard([_canary("v2", 25), _canary("v3", 25)]), None),                           # Multiple valid canaries
    (_standard([_canary("v2", 50), _canary("v3", 50)]), None),                           # Traffic sum = 100
    (_standard([_canary("v2", 0)]), None),                                               # dark launch
    ({**_standard([_canary("v2", 10)]), "metadata": {"name": "foo", "namespace": "default"}},
     "canary is only supported in Standard deployment mode"),                            # rejected in Knative mode
    (_standard([_canary("", 10)]), "canary[0] predictor.name is required"),
    (_standard([_canary("v2", 10), _canary("v2", 10)]), 'canary predictor.name "v2" is duplicated'),
    (_standard([_canary("v2", 10)], name="v2"), 'canary predictor.name "v2" conflicts with stable predictor name'),
    (_standard([_canary("v2", 101)]), 'canary "v2" trafficPercent must be between 0 and 100, got 101'),
    (_standard([_canary("v2", -1)]), 'canary "v2" trafficPercent must be between 0 and 100, got -1'),
    (_standard([_canary("v2", 60), _canary("v3", 50)]), "sum of canary trafficPercent values (110) must be <= 100"),
    (_standard([_canary("v2", 10, maxReplicas=3)]), 'canary "v2" must not set maxReplicas (canary uses fixed '
                                                    'replicas)'),
    (_standard([_canary("v2", 10, minReplicas=2)], minReplicas=2), None),              # minReplicas equal to stable
    (_standard([_canary("v2", 10, minReplicas=3)], minReplicas=2),
     'canary "v2" minReplicas (3) must not exceed stable predictor minReplicas (2)'),
    (_standard([_canary("v2", 10, minReplicas=1)]), None),                              # equal to default stable
    (_standard([_canary("v2", 10, minReplicas=2)]),
     'canary "v2" minReplicas (2) must not exceed stable predictor minReplicas (1)'),
    (_standard([_canary("v2", 10, workerSpec={})]),
     'canary "v2" must not set workerSpec (multi-node is not yet supported for canary)'),
])
def test_validate_canary_specs(isvc, want):
    check(validate(copy.deepcopy(isvc)), want)


@pytest.mark.parametrize("percent, ok", [(0, True), (20, True), (100, True), (-1, False), (101, False)])
def test_canary_traffic_percent_is_a_share_of_knative_traffic(percent, ok):
    """ksvc_reconciler.go :134-153: ``P`` to the latest revision and ``100 - P`` to the last rolled-out one."""
    assert (validate(base(canaryTrafficPercent=percent)) is None) is ok


# constants_test.go TestParseDeploymentMode (:25)
@pytest.mark.parametrize("mode, want", [
    pytest.param("", "Standard", id="Empty string returns default"),
    pytest.param("Standard", "Standard", id="Standard mode"),
    pytest.param("Knative", "Knative", id="Knative mode"),
    pytest.param("ModelMesh", "ModelMesh", id="ModelMesh mode"),
    pytest.param("RawDeployment", "Standard", id="Legacy RawDeployment normalizes to Standard"),
    pytest.param("Serverless", "Knative", id="Legacy Serverless normalizes to Knative"),
    pytest.param("UnknownMode", "UnknownMode", id="Unknown mode returns as-is"),
])
def test_parse_deployment_mode(mode, want):
    assert parse_deployment_mode(mode) == want


# inference_service_validation_test.go TestDeploymentModeUpdate (:1398): the status of the old object, the
# annotation of the update (None: no annotation), upstream's comment as the id
@pytest.mark.parametrize("recorded, annotation, want", [
    pytest.param("Knative", "Standard", MODE_CHANGED.format("Knative", "Standard"),
                 id="Annotation does not match status, update should be rejected"),
    pytest.param("Knative", "Knative", None, id="Annotation matches status, update is accepted"),
    pytest.param("RawDeployment", "Standard", None,
                 id='Legacy status "RawDeployment" should accept normalized annotation "Standard"'),
    pytest.param("Serverless", "Knative", None,
                 id='Legacy status "Serverless" should accept normalized annotation "Knative"'),
    pytest.param("RawDeployment", "Knative", MODE_CHANGED.format("Standard", "Knative"),
                 id='Legacy status "RawDeployment" with different mode "Knative" should still be rejected'),
    pytest.param("", "Knative", None,
                 id="Empty Status.DeploymentMode with a non-Standard annotation should be accepted"),
    pytest.param("", "Serverless", None,
                 id="Empty Status.DeploymentMode with a legacy Serverless annotation should also be accepted"),
    pytest.param("", "Standard", None,
                 id="Empty Status.DeploymentMode with a Standard annotation should also be accepted"),
    pytest.param("", None, None, id="Empty Status.DeploymentMode with no deploymentMode annotation should be accepted"),
])
def test_deployment_mode_update(recorded, annotation, want):
    old = {**base(), "status": {"deploymentMode": recorded}}
    updated = base()
    updated["metadata"]["annotations"] = {} if annotation is None else {DEPLOYMENT_MODE: annotation}
    check(validate_update(updated, old), want)


def test_a_recorded_mode_refuses_its_legacy_name_and_passes_no_annotation():
    """inference_service_validation.go :695-698: the annotation is compared as written, not parsed; an update
    without it keeps the recorded mode."""
    old = {**base(), "status": {"deploymentMode": "Knative"}}
    updated = base()
    updated["metadata"]["annotations"] = {DEPLOYMENT_MODE: "Serverless"}
    check(validate_update(updated, old), MODE_CHANGED.format("Knative", "Serverless"))
    check(validate_update(base(), old), None)


def test_the_update_rules_include_the_create_rules():
    """``ValidateUpdate`` ends in ``validateInferenceService`` (:105), as ``ValidateCreate`` does."""
    old = {**base(), "status": {"deploymentMode": "Knative"}}
    check(validate_update(base(minReplicas=-1), old), MIN_REPLICAS_NEGATIVE)
