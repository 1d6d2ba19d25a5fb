"""KubeRay v1.7.0's validation of RayJobs and RayClusters, ported from ``ray-operator/controllers/ray/utils/
validation.go`` (tag ``ray-operator/v1.7.0``) for the emulation in :mod:`cluster.kuberay_operator`: the same rules in
the same order, each failing with upstream's message. The objects are the API's JSON (camelCase dicts).

Ported: ``ValidateRayJobMetadata`` (validation.go:533), ``ValidateRayJobSpec`` (:543) with
``validateDeletionConfiguration`` (:752), ``validateDeletionRules`` (:797), ``validateDeletionCondition`` (:871),
``validateTTLConsistency`` (:892) and ``validateLegacyDeletionPolicies`` (:928), ``ValidateRayJobStatus`` (:526),
``ValidateRayClusterMetadata`` (:32), ``ValidateRayClusterSpec`` (:103) with ``validateRayGroupResources`` (:60),
``validateRayGroupLabels`` (:72), ``validateGcsFaultToleranceBackend`` (:333), ``validateWorkerGroupIdleTimeout``
(:1006) and ``validateWorkerGroupPriority`` (:1113); the helpers of ``utils/util.go`` they call
(``IsAutoscalingEnabled`` :751, ``IsAutoscalingV2Enabled`` :756, ``IsGCSFaultToleranceEnabled`` :765,
``IsAuthEnabled`` :796, ``IsK8sAuthEnabled`` :800), the name limits of ``utils/constant.go`` (:375-381), and from
k8s.io/apimachinery v0.36.0 (KubeRay's go.mod) ``IsDNS1035Label`` (``pkg/util/validation/validation.go``:232),
``IsLabelKey`` / ``IsLabelValue`` (``pkg/api/validate/content/kube.go``:43, :85) and ``version.ParseGeneric``
(``pkg/util/version/version.go``).

Feature gates are v1.7.0's defaults (``pkg/features/features.go``:106-116) unless a caller passes others. Not ported,
because their feature gates are off by default and :data:`FEATURE_GATES` keeps them off: the contents of
``networkPolicy`` (``validateNetworkPolicy``), ``tlsOptions`` (``validateTLSOptions``) and
``historyServerOptions`` (``validateCollectorOptions``); each is refused with upstream's feature-gate message.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

import yaml

MAX_RAYCLUSTER_NAME_LENGTH = 53
"""``MaxRayClusterNameLength`` (utils/constant.go:375): 63 - len("-serve-svc")."""
MAX_RAYJOB_NAME_LENGTH = MAX_RAYCLUSTER_NAME_LENGTH - 6
"""``MaxRayJobNameLength`` (utils/constant.go:381): the cluster's name is the RayJob's plus ``-`` and 5 random."""
FEATURE_GATES = {"RayJobDeletionPolicy": True, "GCSFaultToleranceEmbeddedStorage": False,
                 "RayClusterNetworkPolicy": False, "RayClusterMTLS": False, "RayClusterHistoryServer": False}
"""The gates these rules consult, at their v1.7.0 defaults (pkg/features/features.go:106-116)."""
CLUSTER_SELECTOR_KEY = "ray.io/cluster"
"""``RayJobClusterSelectorKey`` (utils/constant.go:85)."""
FT_ANNOTATION, EXTERNAL_STORAGE_NS_ANNOTATION = "ray.io/ft-enabled", "ray.io/external-storage-namespace"
"""``RayFTEnabledAnnotationKey``, ``RayExternalStorageNSAnnotationKey`` (utils/constant.go:59-60)."""
RAY_REDIS_ADDRESS, REDIS_PASSWORD, REDIS_USERNAME = "RAY_REDIS_ADDRESS", "REDIS_PASSWORD", "REDIS_USERNAME"
RAY_GCS_STORAGE, RAY_GCS_STORAGE_PATH = "RAY_GCS_STORAGE", "RAY_GCS_STORAGE_PATH"
KUBERAY_GEN_AUTOSCALER_START_CMD = "KUBERAY_GEN_AUTOSCALER_START_CMD"
RAY_ENABLE_AUTOSCALER_V2 = "RAY_enable_autoscaler_v2"
"""Env names of utils/constant.go (:142-144, :158, :191)."""
GCS_STORAGE_VOLUME, GCS_STORAGE_MOUNT_PATH = "ray-gcs-storage", "/ray/gcs-storage"
"""``GCSStorageVolumeName``, ``GCSStorageMountPath`` (utils/constant.go)."""
_DELETION_ORDER = ("DeleteWorkers", "DeleteCluster", "DeleteSelf")
"""``validateTTLConsistency``'s order: each TTL at least the one before."""

# k8s.io/apimachinery v0.36.0
_DNS1035_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1035_MSG = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
                "character, and end with an alphanumeric character")
_DNS1123_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_FMT = _DNS1123_FMT + "(\\." + _DNS1123_FMT + ")*"
_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
                  "must start and end with an alphanumeric character")
_KEY_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_KEY_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character")
_VALUE_FMT = f"({_KEY_FMT})?"
_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
              "start and end with an alphanumeric character")
_VERSION = re.compile(r"\s*v?([0-9]+(?:\.[0-9]+)*)(.*)", re.S)


class Invalid(Exception):
    """A rule of KubeRay's validation failed; the message is upstream's."""


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """``RegexError`` (apimachinery content/errors.go)."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    return f"{msg} (e.g. " + " or ".join(f"'{e}', " for e in examples) + f"regex used for validation is '{fmt}')"


def dns1035_label_errors(value: str) -> list[str]:
    """``validation.IsDNS1035Label``."""
    errs = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not re.fullmatch(_DNS1035_FMT, value):
        errs.append(_regex_error(_DNS1035_MSG, _DNS1035_FMT, "my-name", "abc-123"))
    return errs


def label_key_errors(value: str) -> list[str]:
    """``content.IsLabelKey`` (``validation.IsQualifiedName``)."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        return [f"a valid label key {_regex_error(_KEY_MSG, _KEY_FMT, 'MyName', 'my.name', '123-abc')} with an "
                "optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errs.append("prefix part must be no more than 253 bytes")
            if not re.fullmatch(_SUBDOMAIN_FMT, prefix):
                errs.append("prefix part " + _regex_error(_SUBDOMAIN_MSG, _SUBDOMAIN_FMT, "example.com"))
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 bytes")
    if not re.fullmatch(_KEY_FMT, name):
        errs.append("name part " + _regex_error(_KEY_MSG, _KEY_FMT, "MyName", "my.name", "123-abc"))
    return errs


def label_value_errors(value: str) -> list[str]:
    """``content.IsLabelValue`` (``validation.IsValidLabelValue``)."""
    errs = ["must be no more than 63 bytes"] if len(value) > 63 else []
    if not re.fullmatch(_VALUE_FMT, value):
        errs.append(_regex_error(_VALUE_MSG, _VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def parse_generic(text: str) -> tuple[int, ...]:
    """``version.ParseGeneric``: at least two numeric components, a leading ``v`` and any suffix allowed.

    Raises:
        ValueError: with apimachinery's message.
    """
    match = _VERSION.fullmatch(text)
    if not match:
        raise ValueError(f'could not parse "{text}" as version')
    components = match.group(1).split(".")
    if len(components) < 2:
        raise ValueError(f'illegal version string "{text}"')
    if components[0].startswith("0") and components[0] != "0":
        raise ValueError(f'illegal zero-prefixed version component "{components[0]}" in "{text}"')
    return tuple(int(c) for c in components)


def _less_than(version: tuple[int, ...], minimum: str) -> bool:
    """``Version.LessThan`` of two generic versions (missing components count as 0)."""
    low = parse_generic(minimum)
    width = max(len(version), len(low))
    return version + (0,) * (width - len(version)) < low + (0,) * (width - len(low))


def _go_list(errs: list[str]) -> str:
    """Go's ``%v`` of a ``[]string``."""
    return "[" + " ".join(errs) + "]"


def _env(container: dict) -> list[dict]:
    return container.get("env") or []


def _env_var(name: str, env: list[dict]) -> dict | None:
    """``EnvVarByName``."""
    return next((e for e in env if e.get("name") == name), None)


def _containers(group: dict) -> list[dict]:
    return ((group.get("template") or {}).get("spec") or {}).get("containers") or []


def _autoscaling(spec: dict | None) -> bool:
    """``IsAutoscalingEnabled``."""
    return bool(spec) and spec.get("enableInTreeAutoscaling") is True


def _autoscaling_v2(spec: dict | None) -> bool:
    """``IsAutoscalingV2Enabled``."""
    return bool(spec) and (spec.get("autoscalerOptions") or {}).get("version") == "v2"


def _k8s_auth(auth: dict | None) -> bool:
    """``IsK8sAuthEnabled``."""
    return bool(auth) and auth.get("enableK8sTokenAuth") is True


# ------------------------------------------------------------------------------------------------ RayCluster

def validate_raycluster_metadata(metadata: dict) -> None:
    """``ValidateRayClusterMetadata`` (validation.go:32)."""
    name = metadata.get("name", "")
    if len(name) > MAX_RAYCLUSTER_NAME_LENGTH:
        raise Invalid(f"RayCluster name should be no more than {MAX_RAYCLUSTER_NAME_LENGTH} characters")
    if errs := dns1035_label_errors(name):
        raise Invalid(f"RayCluster name should be a valid DNS1035 label: {_go_list(errs)}")


def _group_resources(group_name: str, params: dict, resources: dict) -> None:
    """``validateRayGroupResources`` (validation.go:60)."""
    if any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and resources:
        raise Invalid(f"resource fields should not be set in both rayStartParams and Resources for {group_name} "
                      "group; please use only one")


def _group_labels(group_name: str, params: dict, labels: dict) -> None:
    """``validateRayGroupLabels`` (validation.go:72)."""
    if "labels" in params:
        raise Invalid(f"rayStartParams['labels'] is not supported for {group_name} group; please use the top-level "
                      "Labels field instead")
    errs = []
    for key, value in labels.items():
        errs += [f"invalid label key for {group_name} group: '{key}', error: {e}" for e in label_key_errors(key)]
        errs += [f"invalid label value for key '{key}' in {group_name} group: '{value}', error: {e}"
                 for e in label_value_errors(value)]
    if errs:
        raise Invalid("; ".join(errs))


def _idle_timeout(group: dict, spec: dict) -> None:
    """``validateWorkerGroupIdleTimeout`` (validation.go:1006)."""
    timeout = group.get("idleTimeoutSeconds")
    if timeout is None:
        return
    name = group.get("groupName", "")
    if timeout < 0:
        raise Invalid(f"worker group {name}: idleTimeoutSeconds must be non-negative, got {timeout}")
    if _autoscaling_v2(spec) or _v2_env(spec):
        return
    raise Invalid(f"worker group {name}: idleTimeoutSeconds is set, but autoscaler v2 is not enabled. Please set "
                  f".spec.autoscalerOptions.version to 'v2' (or set {RAY_ENABLE_AUTOSCALER_V2} environment variable "
                  "to 'true' in the head pod if using KubeRay < 1.4.0)")


def _v2_env(spec: dict) -> bool:
    """The head's ``RAY_enable_autoscaler_v2`` is ``1`` or ``true``."""
    var = _env_var(RAY_ENABLE_AUTOSCALER_V2, _env(_containers(spec["headGroupSpec"])[0]))
    return var is not None and var.get("value") in ("1", "true")


def _priority(group: dict, spec: dict) -> None:
    """``validateWorkerGroupPriority`` (validation.go:1113)."""
    priority, name = group.get("priority"), group.get("groupName", "")
    if not priority:
        return
    ray_version = spec.get("rayVersion", "")
    if not ray_version:
        raise Invalid(f"worker group {name}: priority is set, but RayVersion was not specified. Ray version 2.56.0 or "
                      "later is required")
    try:
        version = parse_generic(ray_version)
    except ValueError as exc:
        raise Invalid(f"worker group {name}: priority is set, but RayVersion format is invalid: {ray_version}, "
                      f"{exc}") from None
    if _less_than(version, "2.56.0"):
        raise Invalid(f"worker group {name}: priority is set, but minimum Ray version is 2.56.0, got {ray_version}")
    if _autoscaling_v2(spec) or _v2_env(spec):
        return
    raise Invalid(f"worker group {name}: priority is set to {priority}, but autoscaler v2 is not enabled. Priority is "
                  "only supported with autoscaler v2 enabled")


def _gcs_ft_backend(options: dict, head: dict, volumes: list[dict], gates: Mapping[str, bool]) -> None:
    """``validateGcsFaultToleranceBackend`` (validation.go:333)."""
    if options.get("backend", "redis") != "rocksdb":
        if options.get("storage") is not None:
            raise Invalid("cannot set GcsFaultToleranceOptions.Storage when backend is 'redis' - it only applies to "
                          "the 'rocksdb' backend")
        return
    if not gates["GCSFaultToleranceEmbeddedStorage"]:
        raise Invalid("the embedded RocksDB GCS fault tolerance backend (GcsFaultToleranceOptions.Backend: 'rocksdb') "
                      "requires the GCSFaultToleranceEmbeddedStorage feature gate to be enabled")
    for key, field in (("redisAddress", "RedisAddress"), ("redisUsername", "RedisUsername"),
                       ("redisPassword", "RedisPassword"), ("externalStorageNamespace", "ExternalStorageNamespace")):
        if options.get(key):
            raise Invalid(f"cannot set GcsFaultToleranceOptions.{field} when backend is 'rocksdb'")
    storage = options.get("storage") or {}
    if storage.get("claimName") and (storage.get("size") is not None or storage.get("storageClassName") is not None
                                     or storage.get("accessModes")):
        raise Invalid("GcsFaultToleranceOptions.Storage.ClaimName is mutually exclusive with size, storageClassName, "
                      "and accessModes")
    if _env_var(RAY_GCS_STORAGE, _env(head)) or _env_var(RAY_GCS_STORAGE_PATH, _env(head)):
        raise Invalid(f"cannot set `{RAY_GCS_STORAGE}` or `{RAY_GCS_STORAGE_PATH}` env var in head Pod when the "
                      "embedded GCS FT backend is used - these are managed by KubeRay")
    if any(m.get("mountPath") == GCS_STORAGE_MOUNT_PATH or m.get("name") == GCS_STORAGE_VOLUME
           for m in head.get("volumeMounts") or []):
        raise Invalid(f'cannot set a volume mount named "{GCS_STORAGE_VOLUME}" or mounted at {GCS_STORAGE_MOUNT_PATH} '
                      "in the head container when the embedded GCS FT backend is used - it is managed by KubeRay")
    if any(v.get("name") == GCS_STORAGE_VOLUME for v in volumes):
        raise Invalid(f'cannot set a volume named "{GCS_STORAGE_VOLUME}" in the head Pod when the embedded GCS FT '
                      "backend is used - it is managed by KubeRay")


def validate_raycluster_spec(spec: dict, annotations: dict | None,
                             gates: Mapping[str, bool] = FEATURE_GATES) -> None:
    """``ValidateRayClusterSpec`` (validation.go:103)."""
    annotations = annotations or {}
    head_group = spec.get("headGroupSpec") or {}
    if not _containers(head_group):
        raise Invalid("headGroupSpec should have at least one container")
    _group_resources("Head", head_group.get("rayStartParams") or {}, head_group.get("resources") or {})
    _group_labels("Head", head_group.get("rayStartParams") or {}, head_group.get("labels") or {})
    autoscaling = _autoscaling(spec)
    workers = spec.get("workerGroupSpecs") or []
    for group in workers:
        name = group.get("groupName", "")
        if not _containers(group):
            raise Invalid("workerGroupSpec should have at least one container")
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (low is None or high is None):
            raise Invalid(f"worker group {name} must set both minReplicas and maxReplicas when autoscaling is disabled")
        if low is not None and low < 0:
            raise Invalid(f"worker group {name} has negative minReplicas {low}")
        if high is not None and high < 0:
            raise Invalid(f"worker group {name} has negative maxReplicas {high}")
        if low is not None and high is not None and low > high:
            raise Invalid(f"worker group {name} has minReplicas {low} greater than maxReplicas {high}")
        _group_resources(name, group.get("rayStartParams") or {}, group.get("resources") or {})
        _group_labels(name, group.get("rayStartParams") or {}, group.get("labels") or {})
        _idle_timeout(group, spec)
        _priority(group, spec)
    ft_options = spec.get("gcsFaultToleranceOptions")
    if annotations.get(FT_ANNOTATION, "") != "" and ft_options is not None:
        raise Invalid(f"{FT_ANNOTATION} annotation and GcsFaultToleranceOptions are both set. Please use only "
                      "GcsFaultToleranceOptions to configure GCS fault tolerance")
    head = _containers(head_group)[0]
    ft_enabled = annotations.get(FT_ANNOTATION, "").lower() == "true" or ft_options is not None
    if not ft_enabled and _env_var(RAY_REDIS_ADDRESS, _env(head)):
        raise Invalid(f"{RAY_REDIS_ADDRESS} is set which implicitly enables GCS fault tolerance, but "
                      "GcsFaultToleranceOptions is not set. Please set GcsFaultToleranceOptions to enable GCS fault "
                      "tolerance")
    if ft_options is not None:
        if (head_group.get("rayStartParams") or {}).get("redis-password"):
            raise Invalid("cannot set `redis-password` in rayStartParams when GcsFaultToleranceOptions is enabled - "
                          "use GcsFaultToleranceOptions.RedisPassword instead")
        if _env_var(REDIS_PASSWORD, _env(head)):
            raise Invalid("cannot set `REDIS_PASSWORD` env var in head Pod when GcsFaultToleranceOptions is enabled - "
                          "use GcsFaultToleranceOptions.RedisPassword instead")
        if _env_var(RAY_REDIS_ADDRESS, _env(head)):
            raise Invalid("cannot set `RAY_REDIS_ADDRESS` env var in head Pod when GcsFaultToleranceOptions is enabled"
                          " - use GcsFaultToleranceOptions.RedisAddress instead")
        if annotations.get(EXTERNAL_STORAGE_NS_ANNOTATION):
            raise Invalid("cannot set `ray.io/external-storage-namespace` annotation when GcsFaultToleranceOptions is "
                          "enabled - use GcsFaultToleranceOptions.ExternalStorageNamespace instead")
        _gcs_ft_backend(ft_options, head, (head_group.get("template") or {}).get("spec", {}).get("volumes") or [],
                        gates)
    if (head_group.get("rayStartParams") or {}).get("redis-username") or _env_var(REDIS_USERNAME, _env(head)):
        raise Invalid("cannot set redis username in rayStartParams or environment variables - use "
                      "GcsFaultToleranceOptions.RedisUsername instead")
    if not gates["RayJobDeletionPolicy"]:
        for group in workers:
            if group.get("suspend"):
                raise Invalid(f"worker group {group.get('groupName', '')} can be suspended only when the "
                              "RayJobDeletionPolicy feature gate is enabled")
    v2_env = _env_var(RAY_ENABLE_AUTOSCALER_V2, _env(head))
    if not autoscaling and v2_env is not None and v2_env.get("value") in ("1", "true"):
        raise Invalid(f"environment variable {RAY_ENABLE_AUTOSCALER_V2} cannot be set to '{v2_env['value']}' when "
                      "enableInTreeAutoscaling is false. Please set enableInTreeAutoscaling: true to use autoscaler v2")
    options = spec.get("autoscalerOptions")
    if autoscaling:
        for group in workers:
            if group.get("suspend"):
                raise Invalid(f"worker group {group.get('groupName', '')} cannot be suspended with Autoscaler enabled")
        if options is not None and options.get("version") is not None and v2_env is not None:
            raise Invalid(f"both .spec.autoscalerOptions.version and head Pod env var {RAY_ENABLE_AUTOSCALER_V2} are "
                          "set, please only use the former")
        if _autoscaling_v2(spec):
            if (head_group["template"]["spec"].get("restartPolicy") or "Never") != "Never":
                raise Invalid("restartPolicy for head Pod should be Never or unset when using autoscaler V2")
            for group in workers:
                if (group["template"]["spec"].get("restartPolicy") or "Never") != "Never":
                    raise Invalid(f"restartPolicy for worker group {group.get('groupName', '')} should be Never or "
                                  "unset when using autoscaler V2")
    if options is not None and options.get("idleTimeoutSeconds") is not None and options["idleTimeoutSeconds"] < 0:
        raise Invalid(f"autoscalerOptions.idleTimeoutSeconds must be non-negative, got {options['idleTimeoutSeconds']}")
    if options is not None and _env_var(KUBERAY_GEN_AUTOSCALER_START_CMD, options.get("env") or []):
        raise Invalid(f"autoscalerOptions.env must not contain {KUBERAY_GEN_AUTOSCALER_START_CMD}: it is managed by "
                      "KubeRay and injected automatically into the autoscaler container")
    if spec.get("historyServerOptions") is not None and not gates["RayClusterHistoryServer"]:
        raise Invalid("RayClusterHistoryServer feature gate is not enabled")
    _auth(spec)
    if spec.get("networkPolicy") is not None and not gates["RayClusterNetworkPolicy"]:
        raise Invalid("spec.networkPolicy requires the RayClusterNetworkPolicy feature gate to be enabled")
    if spec.get("tlsOptions") is not None and not gates["RayClusterMTLS"]:
        raise Invalid("spec.tlsOptions requires the RayClusterMTLS feature gate to be enabled")
    for key, gate in (("historyServerOptions", "RayClusterHistoryServer"), ("networkPolicy", "RayClusterNetworkPolicy"),
                      ("tlsOptions", "RayClusterMTLS")):
        if spec.get(key) is not None:
            raise NotImplementedError(f"the emulation does not port the rules of spec.{key} (feature gate {gate})")


def _auth(spec: dict) -> None:
    """The ``authOptions`` part of ``ValidateRayClusterSpec`` (validation.go:284-313)."""
    auth = spec.get("authOptions")
    if not (auth and auth.get("mode") == "token"):  # IsAuthEnabled
        if _k8s_auth(auth):
            raise Invalid("authOptions.enableK8sTokenAuth is enabled but authOptions.mode not set to 'token'")
        return
    ray_version = spec.get("rayVersion", "")
    if not ray_version:
        raise Invalid("authOptions.mode is 'token' but RayVersion was not specified. Ray version 2.52.0 or later is "
                      "required")
    try:
        version = parse_generic(ray_version)
    except ValueError as exc:
        raise Invalid(f"authOptions.mode is 'token' but RayVersion format is invalid: {ray_version}, {exc}") from None
    if _less_than(version, "2.52.0"):
        raise Invalid(f"authOptions.mode is 'token' but minimum Ray version is 2.52.0, got {ray_version}")
    if _k8s_auth(auth):
        if _less_than(version, "2.55.0"):
            raise Invalid(f"authOptions.enableK8sTokenAuth is enabled but minimum Ray version is 2.55.0, got "
                          f"{ray_version}")
        if auth.get("secretName"):
            raise Invalid("authOptions.enableK8sTokenAuth is enabled and authOptions.secretName is also set")


# ------------------------------------------------------------------------------------------------ RayJob

def validate_rayjob_metadata(metadata: dict) -> None:
    """``ValidateRayJobMetadata`` (validation.go:533)."""
    name = metadata.get("name", "")
    if len(name) > MAX_RAYJOB_NAME_LENGTH:
        raise Invalid(f"The RayJob metadata is invalid: RayJob name should be no more than {MAX_RAYJOB_NAME_LENGTH} "
                      "characters")
    if errs := dns1035_label_errors(name):
        raise Invalid(f"The RayJob metadata is invalid: RayJob name should be a valid DNS1035 label: {_go_list(errs)}")


def validate_rayjob_status(rayjob: dict) -> None:
    """``ValidateRayJobStatus`` (validation.go:526)."""
    if ((rayjob.get("status") or {}).get("jobDeploymentStatus") == "Waiting"
            and rayjob["spec"].get("submissionMode") != "InteractiveMode"):
        raise Invalid("The RayJob status is invalid: JobDeploymentStatus cannot be `Waiting` when SubmissionMode is "
                      "not InteractiveMode")


def validate_rayjob_spec(rayjob: dict, gates: Mapping[str, bool] = FEATURE_GATES) -> None:
    """``ValidateRayJobSpec`` (validation.go:543)."""
    spec = rayjob.get("spec") or {}
    invalid = "The RayJob spec is invalid: "
    if spec.get("suspend") and not spec.get("shutdownAfterJobFinishes"):
        raise Invalid(invalid + "a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended")
    if spec.get("ttlSecondsAfterFinished", 0) < 0:
        raise Invalid(invalid + "TTLSecondsAfterFinished must be a non-negative integer")
    _deletion_configuration(spec, gates)
    selector = spec.get("clusterSelector") or {}
    if spec.get("suspend") and selector:
        raise Invalid(invalid + "the ClusterSelector mode doesn't support the suspend operation")
    if spec.get("rayClusterSpec") is None and not selector:
        raise Invalid(invalid + "one of RayClusterSpec or ClusterSelector must be set")
    mode, backoff = spec.get("submissionMode", "K8sJobMode"), spec.get("backoffLimit")
    if selector:
        if not selector.get(CLUSTER_SELECTOR_KEY):
            raise Invalid("cluster name in ClusterSelector should not be empty")
        if mode == "SidecarMode":
            raise Invalid("ClusterSelector is not supported in SidecarMode")
        if backoff is not None and backoff > 0:
            raise Invalid(invalid + "BackoffLimit is incompatible with ClusterSelector mode")
    if mode == "InteractiveMode" and backoff is not None and backoff > 0:
        raise Invalid(invalid + "BackoffLimit is incompatible with InteractiveMode")
    if mode == "SidecarMode":
        if spec.get("submitterPodTemplate") is not None:
            raise Invalid("Currently, SidecarMode doesn't support SubmitterPodTemplate")
        if spec.get("submitterConfig") is not None:
            raise Invalid("Currently, SidecarMode doesn't support SubmitterConfig")
        head_pod = ((spec["rayClusterSpec"].get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
        if (head_pod.get("restartPolicy") or "Never") != "Never":
            raise Invalid("restartPolicy for head Pod should be Never or unset when using SidecarMode")
    cluster = spec.get("rayClusterSpec")
    if cluster is not None:
        if _k8s_auth(cluster.get("authOptions")):
            raise Invalid(invalid + "K8s token auth mode is currently not supported for RayJob")
        try:
            validate_raycluster_spec(cluster, (rayjob.get("metadata") or {}).get("annotations"), gates)
        except Invalid as exc:
            raise Invalid(invalid + str(exc)) from None
    runtime_env = spec.get("runtimeEnvYAML", "")
    try:
        parsed = yaml.safe_load(runtime_env)
    except yaml.YAMLError as exc:
        raise Invalid(f"failed to unmarshal RuntimeEnvYAML: {runtime_env}: {exc}") from None
    if parsed is not None and not isinstance(parsed, dict):
        # dashboardclient.UnmarshalRuntimeEnvYAML: sigs.k8s.io/yaml's wrapping of encoding/json's UnmarshalTypeError
        raise Invalid(f"failed to unmarshal RuntimeEnvYAML: {runtime_env}: error unmarshaling JSON: while decoding "
                      f"JSON: json: cannot unmarshal {_json_kind(parsed)} into Go value of type types.RuntimeEnvType")
    for key in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if spec.get(key) is not None and spec[key] <= 0:
            raise Invalid(invalid + f"{key} must be a positive integer")
    if backoff is not None and backoff < 0:
        raise Invalid(invalid + "backoffLimit must be a positive integer")


def _json_kind(value: object) -> str:
    return "array" if isinstance(value, list) else "bool" if isinstance(value, bool) else \
        "number" if isinstance(value, (int, float)) else "string"


def _deletion_configuration(spec: dict, gates: Mapping[str, bool]) -> None:
    """``validateDeletionConfiguration`` (validation.go:752)."""
    invalid = "The RayJob spec is invalid: "
    if not spec.get("shutdownAfterJobFinishes") and spec.get("ttlSecondsAfterFinished", 0) > 0:
        raise Invalid(invalid + "a RayJob with shutdownAfterJobFinishes set to false cannot have "
                                "TTLSecondsAfterFinished")
    strategy = spec.get("deletionStrategy")
    if strategy is None:
        return
    if not gates["RayJobDeletionPolicy"]:
        raise Invalid("RayJobDeletionPolicy feature gate must be enabled to use DeletionStrategy")
    legacy = strategy.get("onSuccess") is not None or strategy.get("onFailure") is not None
    rules = bool(strategy.get("deletionRules"))
    if rules and spec.get("shutdownAfterJobFinishes"):
        raise Invalid(invalid + "spec.shutdownAfterJobFinishes and spec.deletionStrategy.deletionRules are mutually "
                                "exclusive")
    if rules and legacy:
        raise Invalid(invalid + "Cannot use both legacy onSuccess/onFailure fields and deletionRules simultaneously")
    if legacy:
        _legacy_deletion(spec)
    elif rules:
        _deletion_rules(spec)
    else:
        raise Invalid(invalid + "DeletionStrategy requires either BOTH onSuccess and onFailure, OR the deletionRules "
                                "field (cannot be empty)")


def _deletion_rules(spec: dict) -> None:
    """``validateDeletionRules`` (validation.go:797); its errors joined by newlines, as ``errors.Join``."""
    selector = bool(spec.get("clusterSelector"))
    by_status: dict[tuple[str, str], dict[str, int]] = {}
    errs: list[str] = []
    for i, rule in enumerate(spec["deletionStrategy"]["deletionRules"]):
        condition, policy = rule.get("condition") or {}, rule.get("policy")
        problem = _deletion_condition(condition)
        if problem:
            errs.append(f"deletionRules[{i}]: {problem}")
            continue
        if selector and policy in ("DeleteCluster", "DeleteWorkers"):
            errs.append(f"deletionRules[{i}]: DeletionPolicyType '{policy}' not supported when ClusterSelector is set")
            continue
        if _autoscaling(spec.get("rayClusterSpec")) and policy == "DeleteWorkers":
            errs.append(f"deletionRules[{i}]: DeletionPolicyType 'DeleteWorkers' not supported with autoscaling "
                        "enabled")
            continue
        kind = "JobStatus" if condition.get("jobStatus") is not None else "JobDeploymentStatus"
        value = condition.get("jobStatus") if kind == "JobStatus" else condition.get("jobDeploymentStatus")
        ttls = by_status.setdefault((kind, value), {})
        if policy in ttls:
            errs.append(f"deletionRules[{i}]: duplicate rule for DeletionPolicyType '{policy}' and {kind} '{value}'")
            continue
        ttls[policy] = condition.get("ttlSeconds", 0)
    for (kind, value), ttls in by_status.items():
        previous: tuple[str, int] | None = None
        for policy in _DELETION_ORDER:
            if policy not in ttls:
                continue
            if previous and ttls[policy] < previous[1]:
                errs.append(f"for {kind} '{value}': {policy} TTL ({ttls[policy]}) must be >= {previous[0]} TTL "
                            f"({previous[1]})")
            previous = (policy, ttls[policy])
    if errs:
        raise Invalid("\n".join(errs))


def _deletion_condition(condition: dict) -> str:
    """``validateDeletionCondition`` (validation.go:871); "" when valid."""
    has_job, has_deployment = condition.get("jobStatus") is not None, condition.get("jobDeploymentStatus") is not None
    if has_job and has_deployment:
        return "cannot set both JobStatus and JobDeploymentStatus at the same time"
    if not has_job and not has_deployment:
        return "exactly one of JobStatus and JobDeploymentStatus must be set"
    if condition.get("ttlSeconds", 0) < 0:
        return "TTLSeconds must be non-negative"
    return ""


def _legacy_deletion(spec: dict) -> None:
    """``validateLegacyDeletionPolicies`` (validation.go:928)."""
    strategy = spec["deletionStrategy"]
    on_success, on_failure = strategy.get("onSuccess"), strategy.get("onFailure")
    if on_success is None or on_failure is None:
        raise Invalid("both DeletionStrategy.OnSuccess and DeletionStrategy.OnFailure must be set when using the "
                      "legacy deletion policy fields of DeletionStrategy")
    if on_success.get("policy") is None:
        raise Invalid("the DeletionPolicyType field of DeletionStrategy.OnSuccess cannot be unset when "
                      "DeletionStrategy is enabled")
    if on_failure.get("policy") is None:
        raise Invalid("the DeletionPolicyType field of DeletionStrategy.OnFailure cannot be unset when "
                      "DeletionStrategy is enabled")
    success, failure = on_success["policy"], on_failure["policy"]
    if spec.get("clusterSelector"):
        if success in ("DeleteCluster", "DeleteWorkers"):
            raise Invalid(f"the ClusterSelector mode doesn't support DeletionStrategy={success} on success")
        if failure in ("DeleteCluster", "DeleteWorkers"):
            raise Invalid(f"the ClusterSelector mode doesn't support DeletionStrategy={failure} on failure")
    if "DeleteWorkers" in (success, failure) and _autoscaling(spec.get("rayClusterSpec")):
        raise Invalid("DeletionStrategy=DeleteWorkers currently does not support RayCluster with autoscaling enabled")
    if spec.get("shutdownAfterJobFinishes") and "DeleteNone" in (success, failure):
        raise Invalid("The RayJob spec is invalid: shutdownAfterJobFinshes is set to 'true' while deletion policy is "
                      "'DeleteNone'")


def validate_rayjob(rayjob: dict, gates: Mapping[str, bool] = FEATURE_GATES) -> tuple[str, str]:
    """rayjob_controller.go ``validateRayJob`` (:464): metadata, spec, status in that order; the first failure's
    event reason (``InvalidRayJobMetadata``, ``InvalidRayJobSpec``, ``InvalidRayJobStatus``) and message, or
    ``("", "")``."""
    for reason, check in (("InvalidRayJobMetadata", lambda: validate_rayjob_metadata(rayjob.get("metadata") or {})),
                          ("InvalidRayJobSpec", lambda: validate_rayjob_spec(rayjob, gates)),
                          ("InvalidRayJobStatus", lambda: validate_rayjob_status(rayjob))):
        try:
            check()
        except Invalid as exc:
            return reason, str(exc)
    return "", ""
