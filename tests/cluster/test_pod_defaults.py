"""The test cluster's PodDefault webhook (tests/cluster/pod_defaults.py) on upstream's own test cases:
kubeflow/kubeflow v1.10.0 (90e987bf87d3) ``components/admission-webhook/main_test.go``, every case ported under its
upstream name, then cases of ``main.go`` behaviour no upstream test covers (conflicts, exclusion, the API's refusal)
and of the webhook's ``namespaceSelector`` (kubeflow/manifests v1.10.0, which has no test of it).

``TestApplyPodDefaultsOnPod`` (l. 80-252) checks ``reflect.DeepEqual(test.in, test.out)`` inverted (it fails when the
pod equals ``out``); here the pod must equal ``out``, which is what ``applyPodDefaultsOnPod`` makes of it (upstream's
only differences are nil against empty Go slices, which JSON omits alike). Not ported: none; upstream has no test of
``filterPodDefaults``, ``mergeEnv``, ``mergeVolumes`` or ``mergeVolumeMounts``.
"""
from __future__ import annotations

import copy

import pytest
from cluster import pod_defaults
from cluster.k8s_server import K8sServer
from cluster.k8s_store import NAMESPACES, PODS, ApiError
from cluster.kfp_multiuser import PROFILE_LABELS

MARKER = "poddefault.admission.kubeflow.org/poddefault-"
"""The annotation ``applyPodDefaultsOnPod`` marks a pod with for a PodDefault with no name (upstream's test ones)."""


def _default(name: str = "", **spec) -> dict:
    return {"metadata": {"name": name} if name else {}, "spec": spec}


# TestMergeMapBad (main_test.go l. 12-28): existing, defaults.
MERGE_MAP_BAD = {"Conflicting annotation": ({"foo": "bar"}, {"foo": "buz"})}

# TestMergeMapGood (l. 30-73): existing, defaults, out.
MERGE_MAP_GOOD = {
    "Add annotation": ({"foo": "bar"}, {"baz": "bux"}, {"foo": "bar", "baz": "bux"}),
    "Add nothing": ({"foo": "bar"}, {}, {"foo": "bar"}),
    "Same k/v in annotations": ({"foo": "bar"}, {"foo": "bar"}, {"foo": "bar"}),
}

_OLD_TOLERATION = {"key": "oldToleration", "operator": "Exists", "effect": "NoSchedule"}
_NEW_TOLERATION = {"key": "newToleration", "operator": "Equal", "value": "foo", "effect": "NoSchedule"}
_INIT_CONTAINER = {"command": ["cmd1"], "args": ["arg1", "arg2"], "image": "nginx",
                   "name": "test initcontainer and sidecar"}

# TestApplyPodDefaultsOnPod (l. 80-252): in, podDefaults, out.
APPLY_ON_POD = {
    "Add Annotations": (
        {"metadata": {"annotations": {"foo": "bar"}}, "spec": {}},
        [_default(annotations={"baz": "bux"}, serviceAccountName="some-service-account",
                  automountServiceAccountToken=True)],
        {"metadata": {"annotations": {"foo": "bar", "baz": "bux", MARKER: ""}},
         "spec": {"serviceAccountName": "some-service-account", "automountServiceAccountToken": True}}),
    "Same k/v": (
        {"metadata": {"annotations": {"foo": "bar"}}, "spec": {}},
        [_default(annotations={"foo": "bar"})],
        {"metadata": {"annotations": {"foo": "bar", MARKER: ""}}, "spec": {}}),
    "Add tolerations": (
        {"metadata": {}, "spec": {"tolerations": [_OLD_TOLERATION]}},
        [_default(tolerations=[_NEW_TOLERATION])],
        {"metadata": {"annotations": {MARKER: ""}}, "spec": {"tolerations": [_OLD_TOLERATION, _NEW_TOLERATION]}}),
    "Add init containers": (
        {"metadata": {}, "spec": {"containers": []}},
        [_default(initContainers=[_INIT_CONTAINER])],
        {"metadata": {"annotations": {MARKER: ""}}, "spec": {"initContainers": [_INIT_CONTAINER]}}),
}

# TestSetCommandAndArgs (l. 254-324): in, podDefaults, out.
_SET_COMMAND = [_default("test-pod-default", command=["cmd1"], args=["arg1", "arg2"])]
SET_COMMAND_AND_ARGS = {
    "Set command and args": ({}, _SET_COMMAND, {"command": ["cmd1"], "args": ["arg1", "arg2"]}),
    "Do not overwrite command and args in case they are already set": (
        {"command": ["cmd2"], "args": ["arg3", "arg4"]}, _SET_COMMAND, {"command": ["cmd2"], "args": ["arg3", "arg4"]}),
}


@pytest.mark.parametrize("case", list(MERGE_MAP_BAD))
def test_merge_map_bad(case):
    existing, defaults = MERGE_MAP_BAD[case]
    assert pod_defaults.merged_map(existing, [defaults])[1] != []


@pytest.mark.parametrize("case", list(MERGE_MAP_GOOD))
def test_merge_map_good(case):
    existing, defaults, out = MERGE_MAP_GOOD[case]
    assert pod_defaults.merged_map(existing, [defaults]) == (out, [])


@pytest.mark.parametrize("case", list(APPLY_ON_POD))
def test_apply_pod_defaults_on_pod(case):
    pod, defaults, out = APPLY_ON_POD[case]
    assert pod_defaults.applied(pod, defaults) == (out, [])


@pytest.mark.parametrize("case", list(SET_COMMAND_AND_ARGS))
def test_set_command_and_args(case):
    container, defaults, out = SET_COMMAND_AND_ARGS[case]
    pod_defaults.set_command_and_args(container, defaults)
    assert container == out


_MAIN = {"name": "main", "env": [{"name": "A", "value": "1"}], "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
_POD = {"metadata": {"name": "p", "labels": {"team": "a"}},
        "spec": {"containers": [_MAIN], "volumes": [{"name": "data", "emptyDir": {}}]}}

# main.go's merges (l. 170-475) on _POD: podDefaults, the conflicts safeToApplyPodDefaultsOnPod finds.
CONFLICTS = {
    "the pod's own env var, volume, mount and label": (
        [_default("same", env=_MAIN["env"], volumes=_POD["spec"]["volumes"], volumeMounts=_MAIN["volumeMounts"],
                  labels={"team": "a"})], []),
    "an env var of the pod's with another value": (
        [_default("env", env=[{"name": "A", "value": "2"}])],
        ["merging env for env has a conflict on name A: {'name': 'A', 'value': '2'} does not match "
         "{'name': 'A', 'value': '1'}"]),
    "a volume of the pod's name of another kind": (
        [_default("vol", volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}])],
        ["merging volumes for vol has a conflict on name data: {'name': 'data', 'persistentVolumeClaim': "
         "{'claimName': 'c'}} does not match {'name': 'data', 'emptyDir': {}}"]),
    "a mount at the pod's mount path under another name": (
        [_default("mnt", volumeMounts=[{"name": "other", "mountPath": "/data"}])],
        ["merging volumeMounts for mnt has a conflict on mountPath /data: {'name': 'other', 'mountPath': '/data'} "
         "does not match {'name': 'data', 'mountPath': '/data'}"]),
    "two PodDefaults' labels of one key": (
        [_default("one", labels={"tier": "x"}), _default("two", labels={"tier": "y"})],
        ["merging has conflict on tier: 'y' does not match 'x' in pod"]),
}


@pytest.mark.parametrize("case", list(CONFLICTS))
def test_a_poddefault_that_differs_from_the_pod_conflicts(case):
    defaults, conflicts = CONFLICTS[case]
    assert pod_defaults.applied(_POD, defaults)[1] == conflicts


def test_what_the_pod_already_has_is_not_added_again():
    defaults, _ = CONFLICTS["the pod's own env var, volume, mount and label"]
    pod, _ = pod_defaults.applied(_POD, defaults)
    assert (pod["spec"], pod["metadata"]["labels"]) == (_POD["spec"], _POD["metadata"]["labels"])


def test_a_sidecar_joins_the_containers_after_their_env_does():
    """``applyPodDefaultsOnPod`` l. 531-550: env and envFrom go into the pod's containers, then the sidecars join."""
    sidecar, env = {"name": "proxy", "image": "proxy"}, {"name": "B", "value": "2"}
    env_from = {"secretRef": {"name": "s"}}
    default = _default("side", sidecars=[sidecar], env=[env], envFrom=[env_from], imagePullSecrets=[{"name": "reg"}])
    pod, conflicts = pod_defaults.applied(_POD, [default])
    assert (pod["spec"]["containers"], pod["spec"]["imagePullSecrets"], conflicts) == (
        [{**_MAIN, "env": [*_MAIN["env"], env], "envFrom": [env_from]}, sidecar], [{"name": "reg"}], [])


@pytest.mark.parametrize("annotations, applied", [
    ({}, True),
    ({"poddefault.admission.kubeflow.org/exclude": "true"}, False),  # mutatePods l. 624-629
    ({"kubernetes.io/config.mirror": "hash"}, False),  # mutatePods l. 630-632
])
def test_an_excluded_or_mirror_pod_is_left_alone(annotations, applied):
    pod = {"metadata": {"name": "p", "annotations": annotations}, "spec": {"containers": [{"name": "main"}]}}
    default = {"metadata": {"name": "env", "namespace": "ns"}, "spec": {"env": [{"name": "B", "value": "2"}]}}
    pod_defaults.apply([default], "ns", pod)
    assert ("env" in pod["spec"]["containers"][0]) is applied


def _namespace(server: K8sServer, labels: dict[str, str]) -> str:
    """A namespace ``team`` of ``server`` labelled ``labels``, with a PodDefault (env ``A=2``) for pods of team a."""
    server.create(NAMESPACES, "", {"metadata": {"name": "team", "labels": labels}})
    server.pod_defaults.append({"metadata": {"name": "env", "namespace": "team"},
                                "spec": {"selector": {"matchLabels": {"team": "a"}},
                                         "env": [{"name": "A", "value": "2"}]}})
    return "team"


@pytest.mark.parametrize("labels, applied", [
    (PROFILE_LABELS, True),  # what the profile controller labels a profile's namespace with
    ({"app.kubernetes.io/part-of": "kubeflow-profile"}, True),  # the namespaceSelector's one label
    ({k: v for k, v in PROFILE_LABELS.items() if k != "app.kubernetes.io/part-of"}, False),
    ({}, False),
])
def test_the_api_server_calls_the_webhook_only_for_pods_of_a_namespace_its_selector_matches(tmp_path, labels,
                                                                                              applied):
    """mutating-webhook-configuration.yaml's ``namespaceSelector``: elsewhere a pod its PodDefault would conflict
    with is stored as it came."""
    with K8sServer(tmp_path, operator=False) as server:
        namespace = _namespace(server, labels)
        if applied:
            with pytest.raises(ApiError) as refused:
                server.create_pod(namespace, copy.deepcopy(_POD))
            assert refused.value.code == 400
        else:
            assert server.create_pod(namespace, copy.deepcopy(_POD))["spec"]["containers"][0] == _MAIN


def test_the_api_server_refuses_a_pod_its_poddefaults_conflict_with(tmp_path):
    """A refusing webhook's answer as the API server returns it (apiserver ``webhook/errors/statuserror.go``
    ``ToStatusErr``); the pod is not stored."""
    with K8sServer(tmp_path, operator=False) as server:
        namespace = _namespace(server, PROFILE_LABELS)
        with pytest.raises(ApiError) as refused:
            server.create_pod(namespace, copy.deepcopy(_POD))
        with pytest.raises(ApiError) as missing:
            server.store.get(PODS, namespace, "p")
    assert (refused.value.code, str(refused.value), missing.value.code) == (
        400, 'admission webhook "admission-webhook-deployment.kubeflow.org" denied the '
             "request: conflict occurred while applying poddefaults: env on pod: p err: merging env for env has a "
             "conflict on name A: {'name': 'A', 'value': '2'} does not match {'name': 'A', 'value': '1'}", 404)
