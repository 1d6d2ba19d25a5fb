"""KubeRay v1.7.0's own validation tests, ported as vectors the emulation (cluster/kuberay_validation.py) must pass.

Each table below is one test function of ``ray-operator/controllers/ray/utils/validation_test.go`` at tag
``ray-operator/v1.7.0`` (the line of the function is in the table's name): the same inputs, as the API's JSON, and the
same expectation: the exact message where upstream compares it (``EqualError``), a part of it where upstream looks
for one (``Contains`` / ``ErrorContains``), any error where upstream only asks for one (``require.Error``: ``ERR``).
``None`` is upstream's ``NoError``. Upstream's helpers ``podTemplateSpec`` (:687) and ``createBasicRayClusterSpec``
(:2191) are :func:`pod` and :func:`basic`.
"""
from __future__ import annotations

import copy

import pytest

from cluster.kuberay_validation import (FEATURE_GATES, MAX_RAYCLUSTER_NAME_LENGTH, MAX_RAYJOB_NAME_LENGTH, Invalid,
                                      validate_raycluster_metadata, validate_raycluster_spec, validate_rayjob,
                                      validate_rayjob_metadata, validate_rayjob_spec, validate_rayjob_status)

ERR = object()
"""Upstream only requires an error."""
DNS1035 = ("[a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
           "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
           "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')]")
V2 = "RAY_enable_autoscaler_v2"
GEN_CMD = "KUBERAY_GEN_AUTOSCALER_START_CMD"


def pod(env: list[dict] | None = None, restart: str | None = None) -> dict:
    """``podTemplateSpec(envVars, restartPolicy)``: one container with ``env``."""
    spec: dict = {"containers": [{"env": env} if env else {}]}
    if restart:
        spec["restartPolicy"] = restart
    return {"spec": spec}


def basic() -> dict:
    """``createBasicRayClusterSpec``."""
    return {"headGroupSpec": {"template": pod()}}


def group(name: str = "worker-group", low: int | None = 0, high: int | None = 5, **extra) -> dict:
    body = {"groupName": name, "template": pod(extra.pop("env", None), extra.pop("restart", None)), **extra}
    body.update({k: v for k, v in (("minReplicas", low), ("maxReplicas", high)) if v is not None})
    return body


def head(env: list[dict] | None = None, restart: str | None = None, **extra) -> dict:
    return {"headGroupSpec": {"template": pod(env, restart), **extra}}


def env(name: str, value: str) -> list[dict]:
    return [{"name": name, "value": value}]


def check(run, expected, contains: bool = False) -> None:
    if expected is None:
        run()
        return
    with pytest.raises(Invalid) as caught:
        run()
    if expected is ERR:
        return
    if contains:
        assert expected in str(caught.value)
    else:
        assert str(caught.value) == expected


# ------------------------------------------------------------------------------------- metadata

def test_validate_raycluster_spec_names_505():
    check(lambda: validate_raycluster_metadata({"name": "a" * (MAX_RAYCLUSTER_NAME_LENGTH + 1)}),
          "RayCluster name should be no more than 53 characters")
    check(lambda: validate_raycluster_metadata({"name": "a" * MAX_RAYCLUSTER_NAME_LENGTH}), None)
    check(lambda: validate_raycluster_metadata({"name": "1" * MAX_RAYCLUSTER_NAME_LENGTH}),
          f"RayCluster name should be a valid DNS1035 label: {DNS1035}")


def test_validate_rayjob_metadata_2025():
    assert MAX_RAYJOB_NAME_LENGTH == 47
    check(lambda: validate_rayjob_metadata({"name": "j" * 48}), "RayJob name should be no more than 47 characters",
          contains=True)
    check(lambda: validate_rayjob_metadata({"name": "1" * 47}),
          f"RayJob name should be a valid DNS1035 label: {DNS1035}", contains=True)
    check(lambda: validate_rayjob_metadata({"name": "j" * 47}), None)


# ------------------------------------------------------------------------------------- ValidateRayClusterSpec

CLUSTER_SPECS = {
    # TestValidateRayClusterSpecRedisPassword (:381)
    "redis-password/ft-and-rayStartParams": ({"gcsFaultToleranceOptions": {}, "headGroupSpec": {
        "rayStartParams": {"redis-password": "password"}, "template": pod()}}, ERR),
    "redis-password/ft-and-env": ({"gcsFaultToleranceOptions": {}, **head(env("REDIS_PASSWORD", "password"))}, ERR),
    "redis-password/in-options": ({"gcsFaultToleranceOptions": {"redisAddress": "redis:6379",
                                                                "redisPassword": {"value": "password"}},
                                   **head()}, None),
    # TestValidateRayClusterSpecRedisUsername (:441)
    "redis-username/rayStartParams": ({"headGroupSpec": {"rayStartParams": {"redis-username": "username"},
                                                         "template": pod()}},
                                      "cannot set redis username in rayStartParams or environment variables - use "
                                      "GcsFaultToleranceOptions.RedisUsername instead"),
    "redis-username/env": ({**head(env("REDIS_USERNAME", "username"))},
                           "cannot set redis username in rayStartParams or environment variables - use "
                           "GcsFaultToleranceOptions.RedisUsername instead"),
    "redis-username/in-options": ({"gcsFaultToleranceOptions": {"redisAddress": "redis:6379",
                                                                "redisUsername": {"value": "username"}},
                                   **head()}, None),
    # TestValidateRayClusterSpecEmptyContainers (:549)
    "empty/head": ({"headGroupSpec": {"template": {"spec": {"containers": []}}}},
                   "headGroupSpec should have at least one container"),
    "empty/worker": ({**basic(), "workerGroupSpecs": [{"template": {"spec": {"containers": []}}, "minReplicas": 0,
                                                       "maxReplicas": 5}]},
                     "workerGroupSpec should have at least one container"),
    "empty/valid": ({**basic(), "workerGroupSpecs": [group("")]}, None),
    # TestValidateRayClusterSpecSuspendingWorkerGroup (:615), with the gate on (the gate-off case is below)
    "suspend/without-autoscaler": ({**basic(), "workerGroupSpecs": [group("worker-group-1", suspend=True)]}, None),
    "suspend/with-autoscaler": ({**basic(), "enableInTreeAutoscaling": True,
                                 "workerGroupSpecs": [group("worker-group-1", suspend=True)]},
                                "worker group worker-group-1 cannot be suspended with Autoscaler enabled"),
    # TestValidateRayClusterSpecAutoscaler (:705)
    "autoscaler/suspended-group": ({"enableInTreeAutoscaling": True, **head(),
                                    "workerGroupSpecs": [group("worker-group-1", None, None, suspend=True)]},
                                   "worker group worker-group-1 cannot be suspended with Autoscaler enabled"),
    "autoscaler/v2-env-1-without-autoscaler": ({"enableInTreeAutoscaling": False, **head(env(V2, "1"))},
                                               f"environment variable {V2} cannot be set to '1' when "
                                               "enableInTreeAutoscaling is false. Please set enableInTreeAutoscaling: "
                                               "true to use autoscaler v2"),
    "autoscaler/v2-env-true-without-autoscaler": ({"enableInTreeAutoscaling": False, **head(env(V2, "true"))},
                                                  f"environment variable {V2} cannot be set to 'true' when "
                                                  "enableInTreeAutoscaling is false. Please set "
                                                  "enableInTreeAutoscaling: true to use autoscaler v2"),
    "autoscaler/version-and-env": ({"enableInTreeAutoscaling": True, "autoscalerOptions": {"version": "v2"},
                                    **head(env(V2, "true"))},
                                   f"both .spec.autoscalerOptions.version and head Pod env var {V2} are set, please "
                                   "only use the former"),
    "autoscaler/v2-head-restart-always": ({"enableInTreeAutoscaling": True, "autoscalerOptions": {"version": "v2"},
                                           **head(restart="Always")},
                                          "restartPolicy for head Pod should be Never or unset when using autoscaler "
                                          "V2"),
    "autoscaler/v1-worker-restart-always": ({"enableInTreeAutoscaling": True, "autoscalerOptions": {"version": "v1"},
                                             **head(), "workerGroupSpecs": [
                                                 group("worker-group-1", None, None, restart="Never"),
                                                 group("worker-group-2", None, None, restart="Always")]}, None),
    "autoscaler/v1-worker-restart-never": ({"enableInTreeAutoscaling": True, "autoscalerOptions": {"version": "v1"},
                                            **head(), "workerGroupSpecs": [
                                                group("worker-group-1", None, None),
                                                group("worker-group-2", None, None, restart="Never")]}, None),
    "autoscaler/v2-worker-restart-always": ({"enableInTreeAutoscaling": True, "autoscalerOptions": {"version": "v2"},
                                             **head(restart="Never"), "workerGroupSpecs": [
                                                 group("worker-group-1", None, None, restart="Never"),
                                                 group("worker-group-2", None, None, restart="Always")]},
                                            "restartPolicy for worker group worker-group-2 should be Never or unset "
                                            "when using autoscaler V2"),
    "autoscaler/valid": ({"enableInTreeAutoscaling": True, "autoscalerOptions": {"version": "v2"}, **head(),
                          "workerGroupSpecs": [group("worker-group-1", None, None),
                                               group("worker-group-2", None, None, restart="Never")]}, None),
    "autoscaler/gen-cmd-with-args": ({"enableInTreeAutoscaling": True, "autoscalerOptions": {
        "args": ["my-custom-autoscaler-cmd"],
        "env": env(GEN_CMD, "ray kuberay-autoscaler --cluster-name foo --cluster-namespace bar")}, **head()},
        f"autoscalerOptions.env must not contain {GEN_CMD}: it is managed by KubeRay and injected automatically into "
        "the autoscaler container"),
    "autoscaler/gen-cmd-without-args": ({"enableInTreeAutoscaling": True, "autoscalerOptions": {
        "env": env(GEN_CMD, "ray kuberay-autoscaler --cluster-name foo --cluster-namespace bar")}, **head()},
        f"autoscalerOptions.env must not contain {GEN_CMD}: it is managed by KubeRay and injected automatically into "
        "the autoscaler container"),
    # TestValidateRayClusterSpec_Resources (:932)
    "resources/head-both": ({"headGroupSpec": {"rayStartParams": {"num-cpus": "1"}, "resources": {"CPU": "1"},
                                               "template": pod()}, "workerGroupSpecs": [group()]},
                            "resource fields should not be set in both rayStartParams and Resources for Head group; "
                            "please use only one"),
    "resources/worker-both": ({**basic(), "workerGroupSpecs": [group(rayStartParams={"num-gpus": "1"},
                                                                     resources={"GPU": "1"})]},
                              "resource fields should not be set in both rayStartParams and Resources for worker-group "
                              "group; please use only one"),
    "resources/head-rayStartParams": ({"headGroupSpec": {"rayStartParams": {
        "num-cpus": "2", "memory": "4G", "resources": '{"TPU": "8"}'}, "template": pod()},
        "workerGroupSpecs": [group()]}, None),
    "resources/worker-resources": ({**basic(), "workerGroupSpecs": [group(resources={"CPU": "2", "memory": "4G",
                                                                                     "TPU": "8"})]}, None),
    # TestValidateRayClusterSpecRayVersionForAuth (:1104), TestValidateRayClusterSpec_Auth (:3321): further below
}

LABELS = {  # TestValidateRayClusterSpec_Labels (:1015), upstream compares with Contains
    "labels/head-rayStartParams": ({"headGroupSpec": {"rayStartParams": {"labels": "ray.io/node-group=worker-group-1"},
                                                      "template": pod()}, "workerGroupSpecs": [group()]},
                                   "rayStartParams['labels'] is not supported for Head group; please use the top-level "
                                   "Labels field instead"),
    "labels/worker-rayStartParams": ({**basic(), "workerGroupSpecs": [
        group(rayStartParams={"labels": "ray.io/node-group=worker-group-1"})]},
        "rayStartParams['labels'] is not supported for worker-group group; please use the top-level Labels field "
        "instead"),
    "labels/valid": ({"headGroupSpec": {"labels": {"ray.io/market-type": "on-demand"}, "template": pod()},
                      "workerGroupSpecs": [group(labels={"ray.io/accelerator-type": "TPU-V6E"})]}, None),
    "labels/bad-key": ({**basic(), "workerGroupSpecs": [group(labels={"invalid_key!": "value"})]},
                       "invalid label key for worker-group group: 'invalid_key!', error: name part must consist of "
                       "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                       "character"),
    "labels/bad-value": ({"headGroupSpec": {"labels": {"valid-key": "invalid/value"}, "template": pod()},
                         "workerGroupSpecs": [group()]},
                         "invalid label value for key 'valid-key' in Head group: 'invalid/value', error: a valid label "
                         "must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
                         "start and end with an alphanumeric character"),
}

REPLICAS = {  # TestValidateRayClusterSpec_WorkerGroupReplicaValidation (:3155), EqualError
    "replicas/min-above-max": ([group("worker-group-3", 5, 3)], False,
                               "worker group worker-group-3 has minReplicas 5 greater than maxReplicas 3"),
    "replicas/replicas-below-min": ([group("worker-group-3", 2, 5, replicas=1)], False, None),
    "replicas/min-nil": ([group("worker-group-3", None, 5)], False,
                         "worker group worker-group-3 must set both minReplicas and maxReplicas when autoscaling is "
                         "disabled"),
    "replicas/max-nil": ([group("worker-group-3", 1, None)], False,
                         "worker group worker-group-3 must set both minReplicas and maxReplicas when autoscaling is "
                         "disabled"),
    "replicas/both-nil": ([group("worker-group-3", None, None)], False,
                          "worker group worker-group-3 must set both minReplicas and maxReplicas when autoscaling is "
                          "disabled"),
    "replicas/min-negative": ([group("worker-group-3", -1, None)], True,
                              "worker group worker-group-3 has negative minReplicas -1"),
    "replicas/max-negative": ([group("worker-group-3", None, -1)], True,
                              "worker group worker-group-3 has negative maxReplicas -1"),
    "replicas/valid-autoscaling": ([group("worker-group-3", None, None)], True, None),
}

AUTH_VERSIONS = {  # TestValidateRayClusterSpecRayVersionForAuth (:1104), Contains
    "2.52.0": ("2.52.0", False, None),
    "2.52.0-k8s-auth": ("2.52.0", True, ERR),
    "2.55.0-k8s-auth": ("2.55.0", True, None),
    "3.0.0": ("3.0.0", False, None),
    "3.0.0-k8s-auth": ("3.0.0", True, None),
    "2.50.0": ("2.50.0", False, "authOptions.mode is 'token' but minimum Ray version is 2.52.0, got 2.50.0"),
    "invalid": ("invalid-version", False, "authOptions.mode is 'token' but RayVersion format is invalid: "
                                          "invalid-version, could not parse \"invalid-version\" as version"),
    "empty": ("", False, "authOptions.mode is 'token' but RayVersion was not specified. Ray version 2.52.0 or later "
                         "is required"),
}

AUTH_OPTIONS = {  # TestValidateRayClusterSpec_Auth (:3321), rayVersion 2.55.0, Contains
    "k8s-auth-and-secret": ({"mode": "token", "enableK8sTokenAuth": True, "secretName": "my-secret"},
                            "authOptions.enableK8sTokenAuth is enabled and authOptions.secretName is also set"),
    "k8s-auth": ({"mode": "token", "enableK8sTokenAuth": True}, None),
    "secret": ({"mode": "token", "secretName": "my-secret"}, None),
}


@pytest.mark.parametrize("case", CLUSTER_SPECS)
def test_validate_raycluster_spec(case):
    spec, expected = CLUSTER_SPECS[case]
    check(lambda: validate_raycluster_spec(copy.deepcopy(spec), {}), expected)


@pytest.mark.parametrize("case", LABELS)
def test_validate_raycluster_spec_labels_1015(case):
    spec, expected = LABELS[case]
    check(lambda: validate_raycluster_spec(copy.deepcopy(spec), None), expected, contains=True)


@pytest.mark.parametrize("case", REPLICAS)
def test_validate_raycluster_spec_worker_group_replicas_3155(case):
    groups, autoscaling, expected = REPLICAS[case]
    spec = {"enableInTreeAutoscaling": autoscaling, **head(), "workerGroupSpecs": copy.deepcopy(groups)}
    check(lambda: validate_raycluster_spec(spec, None), expected)


@pytest.mark.parametrize("case", AUTH_VERSIONS)
def test_validate_raycluster_spec_ray_version_for_auth_1104(case):
    version, k8s_auth, expected = AUTH_VERSIONS[case]
    spec = {"rayVersion": version, **head(), "authOptions": {"mode": "token", "enableK8sTokenAuth": k8s_auth}}
    check(lambda: validate_raycluster_spec(spec, None), expected, contains=True)


@pytest.mark.parametrize("case", AUTH_OPTIONS)
def test_validate_raycluster_spec_auth_3321(case):
    auth, expected = AUTH_OPTIONS[case]
    spec = {"rayVersion": "2.55.0", "authOptions": auth, **head(),
            "workerGroupSpecs": [group("worker-group", 1, 1)]}
    check(lambda: validate_raycluster_spec(spec, {}), expected, contains=True)


def test_validate_raycluster_spec_suspending_worker_group_gate_off_615():
    spec = {**basic(), "workerGroupSpecs": [group("worker-group-1", suspend=True)]}
    check(lambda: validate_raycluster_spec(spec, {}, {**FEATURE_GATES, "RayJobDeletionPolicy": False}),
          "worker group worker-group-1 can be suspended only when the RayJobDeletionPolicy feature gate is enabled")


# ------------------------------------------------------------------------------------- ValidateRayJobSpec

def _legacy(success: str | None, failure: str | None, **spec) -> dict:
    strategy = {key: ({"policy": policy} if policy else {}) for key, policy in (("onSuccess", success),
                                                                                  ("onFailure", failure))
                if policy is not False}
    return {"deletionStrategy": strategy, **spec}


def _rules(*rules: tuple[str, dict], **spec) -> dict:
    return {"deletionStrategy": {"deletionRules": [{"policy": p, "condition": c} for p, c in rules]}, **spec}


def _succeeded(ttl: int) -> dict:
    return {"jobStatus": "SUCCEEDED", "ttlSeconds": ttl}


AUTOSCALING = {"enableInTreeAutoscaling": True, **head()}
RAYJOB_SPECS = {
    # TestValidateRayJobSpec (:1236), require.Error / NoError
    "no-cluster": ({}, ERR),
    "suspend-without-shutdown": ({"suspend": True, "shutdownAfterJobFinishes": False}, ERR),
    "valid": ({"suspend": True, "shutdownAfterJobFinishes": True, "rayClusterSpec": basic()}, None),
    "selector-suspend": ({"suspend": True, "shutdownAfterJobFinishes": True, "clusterSelector": {"key": "value"}},
                         ERR),
    "runtime-env-not-yaml-map": ({"runtimeEnvYAML": "invalid_yaml_str", "rayClusterSpec": basic()}, ERR),
    "backoff-negative": ({"backoffLimit": -1, "rayClusterSpec": basic()}, ERR),
    "backoff-interactive": ({"backoffLimit": 1, "submissionMode": "InteractiveMode", "rayClusterSpec": basic()}, ERR),
    "backoff-0-interactive": ({"backoffLimit": 0, "submissionMode": "InteractiveMode", "rayClusterSpec": basic()},
                              None),
    "backoff-nil-interactive": ({"submissionMode": "InteractiveMode", "rayClusterSpec": basic()}, None),
    "ttl-without-shutdown": ({"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 5,
                              "rayClusterSpec": basic()}, ERR),
    "ttl-with-shutdown": ({"shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 5, "rayClusterSpec": basic()},
                          None),
    "ttl-negative": ({"shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": -5, "rayClusterSpec": basic()},
                     ERR),
    "sidecar": ({"submissionMode": "SidecarMode", "rayClusterSpec": basic()}, None),
    "sidecar-submitter-template": ({"submissionMode": "SidecarMode", "submitterPodTemplate": {"spec": {}}}, ERR),
    "sidecar-submitter-config": ({"submissionMode": "SidecarMode", "submitterConfig": {"backoffLimit": 1}}, ERR),
    "sidecar-head-restart": ({"submissionMode": "SidecarMode", "rayClusterSpec": head(restart="Always")}, ERR),
    "sidecar-selector": ({"submissionMode": "SidecarMode", "clusterSelector": {"ray.io/cluster": "ray-cluster"}}, ERR),
    "selector-without-cluster": ({"clusterSelector": {}}, ERR),
    "selector-empty-cluster": ({"clusterSelector": {"ray.io/cluster": ""}}, ERR),
    "selector-cluster": ({"clusterSelector": {"ray.io/cluster": "ray-cluster"}}, None),
    "selector-backoff": ({"clusterSelector": {"ray.io/cluster": "ray-cluster"}, "backoffLimit": 1}, ERR),
    "k8s-token-auth": ({"rayClusterSpec": {"authOptions": {"mode": "token", "enableK8sTokenAuth": True}}}, ERR),
    # TestValidateRayJobSpecWithFeatureGate (:1450), the RayJobDeletionPolicy gate on (v1.7.0's default)
    "legacy/selector-delete-cluster": (_legacy("DeleteCluster", "DeleteCluster", clusterSelector={"key": "value"}),
                                       ERR),
    "legacy/selector-delete-workers": (_legacy("DeleteWorkers", "DeleteWorkers", clusterSelector={"key": "value"}),
                                       ERR),
    "legacy/delete-workers-autoscaling": (_legacy("DeleteWorkers", "DeleteWorkers", rayClusterSpec=AUTOSCALING), ERR),
    "legacy/valid-delete-cluster": (_legacy("DeleteCluster", "DeleteCluster", shutdownAfterJobFinishes=True,
                                            rayClusterSpec=basic()), None),
    "legacy/valid-without": ({"shutdownAfterJobFinishes": True, "rayClusterSpec": basic()}, None),
    "legacy/shutdown-delete-none": (_legacy("DeleteNone", "DeleteNone", shutdownAfterJobFinishes=True,
                                            rayClusterSpec=basic()), ERR),
    "legacy/on-success-unset": (_legacy(False, "DeleteNone", shutdownAfterJobFinishes=True, rayClusterSpec=basic()),
                                ERR),
    "legacy/on-failure-unset": (_legacy("DeleteNone", False, shutdownAfterJobFinishes=True, rayClusterSpec=basic()),
                                ERR),
    "legacy/on-failure-policy-unset": (_legacy("DeleteNone", None, shutdownAfterJobFinishes=True,
                                               rayClusterSpec=basic()), ERR),
    "head-without-containers": ({"rayClusterSpec": {"headGroupSpec": {}}}, ERR),
    "rules/valid": (_rules(("DeleteSelf", _succeeded(10)), rayClusterSpec=basic()), None),
    "rules/with-shutdown": (_rules(("DeleteSelf", _succeeded(10)), shutdownAfterJobFinishes=True,
                                   rayClusterSpec=basic()), ERR),
    "rules/with-legacy": ({"deletionStrategy": {"onSuccess": {"policy": "DeleteCluster"}, "deletionRules": [
        {"policy": "DeleteSelf", "condition": _succeeded(10)}]}, "rayClusterSpec": basic()}, ERR),
    "rules/empty-strategy": ({"deletionStrategy": {}, "rayClusterSpec": basic()}, ERR),
    "rules/empty-rules": ({"deletionStrategy": {"deletionRules": []}, "rayClusterSpec": basic()}, ERR),
    "rules/duplicate": (_rules(("DeleteSelf", _succeeded(10)), ("DeleteSelf", _succeeded(20)), rayClusterSpec=basic()),
                        ERR),
    "rules/negative-ttl": (_rules(("DeleteSelf", _succeeded(-10)), rayClusterSpec=basic()), ERR),
    "rules/selector-delete-workers": (_rules(("DeleteWorkers", _succeeded(10)), clusterSelector={"key": "value"}), ERR),
    "rules/selector-delete-cluster": (_rules(("DeleteCluster", _succeeded(10)), clusterSelector={"key": "value"}), ERR),
    "rules/autoscaling-delete-workers": (_rules(("DeleteWorkers", _succeeded(10)), rayClusterSpec=AUTOSCALING), ERR),
    "rules/cluster-before-workers": (_rules(("DeleteWorkers", _succeeded(20)), ("DeleteCluster", _succeeded(10)),
                                            rayClusterSpec=basic()), ERR),
    "rules/self-before-cluster": (_rules(("DeleteCluster", _succeeded(20)), ("DeleteSelf", _succeeded(10)),
                                         rayClusterSpec=basic()), ERR),
    "rules/valid-complex": (_rules(("DeleteWorkers", _succeeded(10)), ("DeleteCluster", _succeeded(20)),
                                   ("DeleteSelf", _succeeded(30)),
                                   ("DeleteSelf", {"jobStatus": "FAILED", "ttlSeconds": 0}), rayClusterSpec=basic()),
                            None),
    "rules/valid-deployment-failed": (_rules(("DeleteCluster", {"jobDeploymentStatus": "Failed", "ttlSeconds": 10}),
                                             ("DeleteSelf", {"jobDeploymentStatus": "Failed", "ttlSeconds": 20}),
                                             rayClusterSpec=basic()), None),
    "rules/both-statuses": (_rules(("DeleteCluster", {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed",
                                                      "ttlSeconds": 10}), rayClusterSpec=basic()), ERR),
    "rules/no-status": (_rules(("DeleteCluster", {"ttlSeconds": 10}), rayClusterSpec=basic()), ERR),
    "rules/duplicate-deployment": (_rules(("DeleteCluster", {"jobDeploymentStatus": "Failed", "ttlSeconds": 10}),
                                          ("DeleteCluster", {"jobDeploymentStatus": "Failed", "ttlSeconds": 20}),
                                          rayClusterSpec=basic()), ERR),
    "rules/mixed": (_rules(("DeleteCluster", _succeeded(10)),
                           ("DeleteCluster", {"jobDeploymentStatus": "Failed", "ttlSeconds": 10}),
                           rayClusterSpec=basic()), None),
    "rules/deployment-cluster-before-workers": (_rules(
        ("DeleteWorkers", {"jobDeploymentStatus": "Failed", "ttlSeconds": 20}),
        ("DeleteCluster", {"jobDeploymentStatus": "Failed", "ttlSeconds": 10}), rayClusterSpec=basic()), ERR),
}


@pytest.mark.parametrize("case", RAYJOB_SPECS)
def test_validate_rayjob_spec(case):
    spec, expected = RAYJOB_SPECS[case]
    check(lambda: validate_rayjob_spec({"spec": copy.deepcopy(spec)}), expected)


@pytest.mark.parametrize("mode, status, fails", [("K8sJobMode", "Waiting", True), ("InteractiveMode", "Waiting", False),
                                                 ("HTTPMode", "Running", False)])
def test_validate_rayjob_status_1183(mode, status, fails):
    check(lambda: validate_rayjob_status({"spec": {"submissionMode": mode}, "status": {"jobDeploymentStatus": status}}),
          ERR if fails else None)


# ------------------------------------------------------------------------------------- the controller's order

def test_validate_rayjob_reports_the_first_failure_with_its_event_reason():
    """rayjob_controller.go ``validateRayJob`` (:464): metadata, then spec (wrapped in "The RayJob spec is
    invalid: "), then status."""
    cluster = {"authOptions": {"mode": "token"}, **head(), "workerGroupSpecs": [group()]}
    job = {"metadata": {"name": "j" * 48}, "spec": {"rayClusterSpec": cluster}}
    assert validate_rayjob(job) == ("InvalidRayJobMetadata", "The RayJob metadata is invalid: RayJob name should be "
                                                             "no more than 47 characters")
    job["metadata"]["name"] = "kfloop-run"
    assert validate_rayjob(job) == ("InvalidRayJobSpec", "The RayJob spec is invalid: authOptions.mode is 'token' but "
                                                         "RayVersion was not specified. Ray version 2.52.0 or later "
                                                         "is required")
    cluster["rayVersion"] = "2.60.0"
    job["status"] = {"jobDeploymentStatus": "Waiting"}
    assert validate_rayjob(job)[0] == "InvalidRayJobStatus"
    del job["status"]
    assert validate_rayjob(job) == ("", "")
