"""What the test API server refuses, as a cluster does: RBAC by the roles it holds (the upstream KFP roles in
tests/cluster/specs/), Pod Security admission in labelled namespaces, and Secrets stored as base64 ``data``."""
from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from cluster import pod_security
from cluster.k8s_rbac import User, service_account_user
from cluster.k8s_store import Resource
from cluster.kubernetes_cluster import PYTHON, grant, pytorchjob, status_of
from polling import wait_for

SPECS = Path(__file__).resolve().parent / "specs"


def _client(cluster, tmp_path, user: User):
    return cluster.api(cluster.server.write_kubeconfig(tmp_path / f"kubeconfig-{abs(hash(user))}", user=user))


def _pipeline_runner() -> dict:
    return yaml.safe_load((SPECS / "kfp-pipeline-runner-role.yaml").read_text())


def test_a_pipeline_runner_may_do_what_its_role_says_and_gets_403_for_the_rest(cluster, tmp_path):
    from kubernetes import client

    grant(cluster.api(), "default", "pipeline-runner", _pipeline_runner())
    runner = _client(cluster, tmp_path, service_account_user("default", "pipeline-runner"))
    custom, core = client.CustomObjectsApi(runner), client.CoreV1Api(runner)
    custom.create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs",
                                           pytorchjob("by-runner", ["true"], workers=0))  # kubeflow.org: '*'
    assert core.list_namespaced_pod("default").items is not None  # pods: '*'
    with pytest.raises(client.ApiException) as denied:
        core.list_namespaced_event("default")  # not in the upstream role
    assert denied.value.status == 403
    assert status_of(denied.value) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'events is forbidden: User "system:serviceaccount:default:pipeline-runner" cannot list resource '
                   '"events" in API group "" in the namespace "default"',
        "details": {"kind": "events"}}
    with pytest.raises(client.ApiException) as denied:
        core.list_namespaced_secret("default")  # secrets: get only
    assert denied.value.status == 403
    with pytest.raises(client.ApiException) as other_namespace:
        core.list_namespaced_pod("kube-system")  # a RoleBinding grants in its own namespace only
    assert 'in the namespace "kube-system"' in status_of(other_namespace.value)["message"]


def test_resource_names_limit_a_rule_to_named_objects_and_no_token_is_401(cluster, tmp_path):
    from kubernetes import client

    admin = client.CoreV1Api(cluster.api())
    for name in ("one", "two"):
        admin.create_namespaced_secret("default", {"metadata": {"name": name}, "stringData": {"k": name}})
    grant(cluster.api(), "default", "reader", {"metadata": {"name": "one-secret"}, "rules": [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["one"], "verbs": ["get", "list"]}]})
    reader = client.CoreV1Api(_client(cluster, tmp_path, service_account_user("default", "reader")))
    assert reader.read_namespaced_secret("one", "default").data == {"k": base64.b64encode(b"one").decode()}
    for call in (lambda: reader.read_namespaced_secret("two", "default"),
                 lambda: reader.list_namespaced_secret("default")):
        with pytest.raises(client.ApiException) as denied:
            call()
        assert denied.value.status == 403
    anonymous = cluster.server.write_kubeconfig(tmp_path / "anonymous")
    config = yaml.safe_load(anonymous.read_text())
    config["users"][0]["user"] = {}
    anonymous.write_text(yaml.safe_dump(config))
    with pytest.raises(client.ApiException) as unauthenticated:
        client.CoreV1Api(cluster.api(anonymous)).list_namespaced_pod("default")
    assert unauthenticated.value.status == 401 and status_of(unauthenticated.value)["reason"] == "Unauthorized"


def test_aggregated_cluster_roles_hold_the_rules_of_the_roles_they_select(cluster):
    """KFP's multi-user ``kubeflow-pipelines-edit`` aggregates ``aggregate-to-kubeflow-pipelines-edit`` and (through
    ``kubeflow-pipelines-view``) the view rules."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(cluster.api())
    for doc in yaml.safe_load_all((SPECS / "kfp-multi-user-view-edit-cluster-roles.yaml").read_text()):
        rbac.create_cluster_role(doc)
    rbac.create_namespaced_role_binding("default", {
        "metadata": {"name": "edit"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                  "name": "kubeflow-pipelines-edit"},
        "subjects": [{"kind": "User", "name": "alice@example.com"}]})
    alice = User("alice@example.com", ("system:authenticated",))
    runs = Resource("pipelines.kubeflow.org", "v1beta1", "runs", "Run")
    authorize = cluster.server.authorizer.authorize
    authorize(alice, "create", runs, None, "default", None)  # edit's own rule
    authorize(alice, "get", runs, None, "default", "run-1")  # view's rule, two aggregations down
    with pytest.raises(Exception, match='cannot update resource "runs" in API group "pipelines.kubeflow.org"'):
        authorize(alice, "update", runs, None, "default", "run-1")
    with pytest.raises(Exception, match="cannot create"):
        authorize(alice, "create", runs, None, "other", None)


def test_secret_string_data_is_stored_as_base64_data_and_bad_base64_is_400(cluster):
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    created = core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "data": {"a": "YQ=="},
                                                        "stringData": {"b": "bee", "a": "wins"}})
    assert created.string_data is None
    assert created.data == {"a": base64.b64encode(b"wins").decode(), "b": base64.b64encode(b"bee").decode()}
    with pytest.raises(client.ApiException) as bad:
        core.create_namespaced_secret("default", {"metadata": {"name": "bad"}, "data": {"a": "not base64!"}})
    assert bad.value.status == 400


# ------------------------------------------------------------------------------------------------ Pod Security

_RESTRICTED_OK = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                  "containers": [{"name": "pytorch", "securityContext": {
                      "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}


def test_pod_security_levels_follow_the_upstream_checks():
    assert pod_security.violations("restricted", _RESTRICTED_OK) == []
    ipc_lock = {**_RESTRICTED_OK, "containers": [{"name": "pytorch", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}}]}
    assert pod_security.violations("restricted", ipc_lock) == [
        'unrestricted capabilities (container "pytorch" must not include "IPC_LOCK" in '
        'securityContext.capabilities.add)']
    assert pod_security.violations("baseline", ipc_lock) == [
        'non-default capabilities (container "pytorch" must not include "IPC_LOCK" in '
        'securityContext.capabilities.add)']
    assert pod_security.violations("privileged", ipc_lock) == []
    bare = {"containers": [{"name": "a"}, {"name": "b"}], "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    assert pod_security.violations("baseline", bare) == ['hostPath volumes (volume "h")']
    assert pod_security.violations("restricted", bare) == [
        'allowPrivilegeEscalation != false (containers "a", "b" must set securityContext.allowPrivilegeEscalation='
        'false)',
        'unrestricted capabilities (containers "a", "b" must set securityContext.capabilities.drop=["ALL"])',
        'restricted volume types (volume "h" uses restricted volume type "hostPath")',
        'runAsNonRoot != true (pod or containers "a", "b" must set securityContext.runAsNonRoot=true)',
        'seccompProfile (pod or containers "a", "b" must set securityContext.seccompProfile.type to '
        '"RuntimeDefault" or "Localhost")']


def test_a_restricted_namespace_refuses_the_operators_init_container_and_the_job_says_why(cluster):
    """The v1 operator's ``init-pytorch`` (no securityContext) makes every Worker pod violate the restricted
    profile: the API refuses it and the operator records FailedCreatePod on the job; the Master pod is admitted."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    core.patch_namespace("default", {"metadata": {"labels": {pod_security.ENFORCE_LABEL: "restricted"}}})
    client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", pytorchjob("guarded", [PYTHON, "-c", "pass"], workers=1))

    def refused():
        return [e.message for e in core.list_namespaced_event(
            "default", field_selector="involvedObject.name=guarded").items if e.reason == "FailedCreatePod"]

    (message,) = wait_for("the operator's FailedCreatePod event", refused)
    assert message == (
        'Error creating: pods "guarded-worker-0" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "init-pytorch" must set securityContext.'
        'allowPrivilegeEscalation=false), unrestricted capabilities (container "init-pytorch" must set '
        'securityContext.capabilities.drop=["ALL"])')
    pods = [p.metadata.name for p in core.list_namespaced_pod("default").items]
    assert pods == ["guarded-master-0"]


def test_pods_get_the_qos_class_of_all_their_containers(cluster):
    """Requests equal to limits in the job's container: the Master is Guaranteed; the Worker is Burstable, because
    of the operator's init container (requests below limits)."""
    from kubernetes import client

    body = pytorchjob("qos", [PYTHON, "-c", "pass"], workers=1)
    for rspec in body["spec"]["pytorchReplicaSpecs"].values():
        rspec["template"]["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", body)
    core = client.CoreV1Api(cluster.api())
    pods = wait_for("both pods", lambda: (lambda items: items if len(items) == 2 else None)(
        core.list_namespaced_pod("default", label_selector="training.kubeflow.org/job-name=qos").items))
    assert {p.metadata.name: p.status.qos_class for p in pods} == {"qos-master-0": "Guaranteed",
                                                                   "qos-worker-0": "Burstable"}
