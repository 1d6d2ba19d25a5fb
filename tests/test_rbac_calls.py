"""Issue 32 item 4: every Kubernetes API call a step makes, recorded by the Kubernetes test server with its
authorization attributes (tests/cluster/k8s_server.py ``accesses``), and every KFP API call, recorded by the
multi-user KFP test server as the SubjectAccessReview KFP makes for it (tests/cluster/kfp_multiuser.py ``reviews``),
is allowed by the rules the service account the step runs as has: deploy/rbac.yaml (Kubernetes),
deploy/kubeflow-profile.yaml and deploy/webhook.yaml over KFP's upstream ClusterRoles (KFP). A verb missing from a
Role fails here, naming the step, the call and the rule, not in the cluster. docs/rbac.md's table is the
one these recorded calls make."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kubernetes import config, utils

from cluster.k8s_rbac import Access, Authorizer, manifests, policy, service_account_user
from cluster.k8s_server import K8sServer
from cluster.kfp_multiuser import CLUSTER_ROLES_FILE, GROUP, KUBEFLOW_ROLES, AccessReview
from cluster.kubernetes_cluster import CLAIM
from serving_versions import register_version, tracking
from test_kfp_upload_run import DRIFT_SETTINGS, PROFILE, kfp_server

from components import kfp_client
from components.run_starters import start_pinned_training
from monitoring.trigger import TriggerPolicy, maybe_trigger
from monitoring.trigger_configmap import ConfigMapTriggerStore
from monitoring.webhook import Alert
from pipelines.cli.commands import main
from pipelines.kfp_server.runs import alert_starter

from training.config import JobShape, TrainingConfig
from training.launch.cluster import ClusterConfig
from training.launch.kubernetes import JobRun, KubernetesSettings, LaunchPolicy
from training.launch.kube_client import NAMESPACE_FILE_ENV, api_client
from training.launch.local import LaunchError
from training.launch.manifests import render, training_job_spec
from training.registry.lock import NAMESPACE_ENV, promotion_lock
from training.registry.versions import get_champion, promote
from training.serving.rollout import RolloutFailed, rollout, serve_champion
from training.serving.settings import ServingSettings

REPO = Path(__file__).resolve().parents[1]
RBAC = REPO / "deploy" / "rbac.yaml"
WEBHOOK = REPO / "deploy" / "webhook.yaml"
KFP_GRANTS = [REPO / "deploy" / "kubeflow-profile.yaml", REPO / "deploy" / "webhook.yaml"]
"""What the steps' and the webhook's service accounts are granted on the KFP API in the profile."""
DOCS = REPO / "docs" / "rbac.md"
NAMESPACE = "kfloop"
"""deploy/rbac.yaml's namespace (the profile where the steps run)."""
SERVICE_ACCOUNT = service_account_user(NAMESPACE, "kfloop")
WEBHOOK_ACCOUNT = service_account_user(NAMESPACE, "kfloop-webhook")


def _webhook_rbac() -> list[dict]:
    """deploy/webhook.yaml's Role and RoleBindings, applied in the steps' namespace (``kubectl apply -n``)."""
    return [{**d, "metadata": {**d["metadata"], "namespace": NAMESPACE}} for d in manifests(WEBHOOK)
            if d["kind"] in ("Role", "RoleBinding")]


def _kfloop_kubeconfig(server: K8sServer, tmp: Path) -> Path:
    """deploy/rbac.yaml and deploy/webhook.yaml's Role applied to ``server`` by its admin; a kubeconfig of service
    account ``kfloop``."""
    admin = config.new_client_from_config(config_file=str(server.write_kubeconfig(tmp / "admin")))
    for doc in [*manifests(RBAC), *_webhook_rbac()]:
        if doc["kind"] != "ServiceAccount":  # the server authenticates service accounts by token alone
            utils.create_from_dict(admin, doc)
    return server.write_kubeconfig(tmp / "kfloop-sa", user=SERVICE_ACCOUNT)


def _trigger(kubeconfig: Path, model: str) -> None:
    """Two retrain decisions of ``model`` kept in its ConfigMap: the first creates it, the next replace it."""
    store = ConfigMapTriggerStore(model, api=config.new_client_from_config(config_file=str(kubeconfig)),
                                  namespace=NAMESPACE)
    for data in ("0a", "0b"):
        maybe_trigger(store, model=model, data_hash=data, now=1e9, policy=TriggerPolicy(), start=lambda: "run-1")


def _job(shared: Path, kubeconfig: Path, name: str, kind: str, command: list[str]) -> dict:
    """The training step's rendered job of ``kind``, its container running ``command``."""
    settings = KubernetesSettings.from_dict({
        "image": "kfloop:test", "cpu": "1", "memory": "2Gi", "shm_size": "64Mi", "namespace": NAMESPACE,
        "kind": kind, "shared_volume_claim": CLAIM, "shared_mount_path": str(shared),
        "launcher": {"kubeconfig": str(kubeconfig), "poll_seconds": 0.5}})
    body = render(training_job_spec(TrainingConfig(), JobShape(nnodes=1, nproc_per_node=1), settings.cluster,
                                    name=name), settings.cluster)
    if kind == "pytorchjob":
        body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"] = command
    else:
        body["spec"]["trainer"].update(command=command, args=[])
    return body


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, list[Access]]:
    """Step -> the Kubernetes API calls it made as service account ``kfloop`` against a cluster holding
    deploy/rbac.yaml: the training step launching a PyTorchJob and a TrainJob (create, watch, pods, the master's
    log, events), cancelling one past its deadline (delete), and the promote step's Lease."""
    tmp = tmp_path_factory.mktemp("rbac-calls")
    shared = tmp / "shared"
    shared.mkdir()
    with K8sServer(tmp / "k8s", namespace=NAMESPACE, volumes={CLAIM: shared}) as server, \
            pytest.MonkeyPatch.context() as env:
        kubeconfig = _kfloop_kubeconfig(server, tmp)
        api = config.new_client_from_config(config_file=str(kubeconfig))
        launch = LaunchPolicy(kubeconfig=str(kubeconfig), poll_seconds=0.5)
        calls: dict[str, list[Access]] = {}

        def step(name: str, action) -> None:
            seen = len(server.accesses)
            action()
            calls.setdefault(name, []).extend(server.accesses[seen:])

        for kind in ("pytorchjob", "trainjob"):
            for attempt in ("launch", "retry"):  # a retried step attaches to the job its first attempt created
                step("train", lambda kind=kind, attempt=attempt: JobRun(
                    api, _job(shared, kubeconfig, f"rbac-{kind}", kind, [sys.executable, "-c", "print('trained')"]),
                    policy=launch, log_path=tmp / f"{kind}-{attempt}.log", timeout=120).run())

        def cancelled(kind: str) -> None:
            with pytest.raises(LaunchError, match="not finished after the launcher's timeout"):
                JobRun(api, _job(shared, kubeconfig, f"rbac-cancel-{kind}", kind, ["sleep", "600"]),
                       policy=launch, log_path=tmp / f"cancel-{kind}.log", timeout=1).run()
        for kind in ("pytorchjob", "trainjob"):
            step("train", lambda kind=kind: cancelled(kind))

        env.setenv(NAMESPACE_ENV, NAMESPACE)

        def promote() -> None:
            with promotion_lock("churn", tmp, kind="lease", kubeconfig=str(kubeconfig), timeout_s=10):
                pass
        step("promote", promote)
        step("trigger", lambda: _trigger(kubeconfig, "churn"))
        step("serve (alert)", lambda: _trigger(server.write_kubeconfig(tmp / "webhook-sa", user=WEBHOOK_ACCOUNT),
                                               "fraud"))
        assert server.live_pids() == []
    return calls


SERVED = "rbac-served"
"""The model the rollout cases roll out (in the session's MLflow server)."""


@pytest.fixture(scope="module")
def serving_recorded(tmp_path_factory, mlflow_server) -> dict[str, list[Access]]:
    """Step -> the Kubernetes API calls ``serving.rollout`` makes as service account ``kfloop``, in its pod's
    namespace, against a cluster holding deploy/rbac.yaml but no KServe operator (no revision ever becomes ready):
    the rollout step's canary of v2 rolled back after its timeout (traffic to 0, ``champion`` back to v1 through the
    promotion Lease), then ``kfloop rollback``'s InferenceService moved to v1 (:func:`serve_champion`, timing out
    too)."""
    tmp = tmp_path_factory.mktemp("rbac-serving")
    (tmp / "namespace").write_text(NAMESPACE)
    with K8sServer(tmp / "k8s", namespace=NAMESPACE, operator=False) as server, \
            pytest.MonkeyPatch.context() as env, tracking(mlflow_server.url, "rbac-serving") as experiment:
        env.setenv(NAMESPACE_FILE_ENV, str(tmp / "namespace"))  # the pod's service account namespace file
        kubeconfig = str(_kfloop_kubeconfig(server, tmp))
        settings = ServingSettings(log_uri="s3://kfloop-logs/inference", artifacts_destination="s3://kfloop-mlflow",
                                   rollout=True, rollout_timeout_seconds=1)
        versions = []
        for n in (1, 2):
            version, holdout = register_version(SERVED, experiment_id=experiment, root=tmp / f"v{n}")
            promote(SERVED, version, compared_against=versions[-1] if versions else None, recheck=None,
                    lock=promotion_lock(SERVED, tmp, kind="file"))
            versions.append(version)
        calls: dict[str, list[Access]] = {}

        def step(name: str, action) -> str:
            """Record ``action``'s calls as ``name``'s; the rollback's message."""
            seen = len(server.accesses)
            with pytest.raises(RolloutFailed, match="no ready new revision within 1 s") as failed:
                action(api_client(kubeconfig))
            calls[name] = server.accesses[seen:]
            return str(failed.value)

        rolled_back = step("rollout", lambda api: rollout(
            SERVED, versions[1], serving=settings, cluster=ClusterConfig(), holdout=holdout, api=api,
            lock=promotion_lock(SERVED, tmp, kind="lease", kubeconfig=kubeconfig, timeout_s=10)))
        assert f"champion back to v{versions[0]}" in rolled_back
        assert get_champion(SERVED).version == versions[0]
        step("rollback", lambda api: serve_champion(
            SERVED, versions[0], serving=settings, cluster=ClusterConfig(), api=api))
    return calls


def _kfp_call(review: AccessReview) -> Access:
    """A KFP call as the authorization attributes of the review KFP makes for it (kubeflow/pipelines
    ``backend/src/apiserver/server/*_server.go`` ``ResourceAttributes``: group ``pipelines.kubeflow.org``, a
    resource of ``backend/src/apiserver/common/const.go``, the verb, the namespace)."""
    _, _, namespace, name = review.user.split(":")
    return Access(service_account_user(namespace, name), review.verb, GROUP, review.resource, review.namespace,
                  review.name, "KFP", review.operation, review.allowed)


def _in_profile(docs: list[dict]) -> list[dict]:
    """Manifests applied in the profile namespace (``kubectl apply -n``): RoleBindings without one get it."""
    return [{**d, "metadata": {"namespace": PROFILE, **d["metadata"]}} if d["kind"] == "RoleBinding" else d
            for d in docs]


CI = service_account_user("ci", "kfloop-deployer")
"""The CI workflow's identity: a contributor (``kubeflow-edit``) of the profile, as the README has it made."""
CI_BINDING = {"kind": "RoleBinding", "metadata": {"name": "ci-contributor", "namespace": PROFILE},
              "roleRef": {"kind": "ClusterRole", "name": "kubeflow-edit"},
              "subjects": [{"kind": "ServiceAccount", "name": "kfloop-deployer", "namespace": "ci"}]}


def _kfp_policy(*grants: dict) -> Authorizer:
    """KFP's upstream ClusterRoles, Kubeflow's aggregating ones, and ``grants``."""
    return policy(*manifests(CLUSTER_ROLES_FILE), *({"kind": "ClusterRole", **r} for r in KUBEFLOW_ROLES), *grants)


@pytest.fixture(scope="module")
def kfp_recorded(tmp_path_factory) -> dict[str, list[Access]]:
    """Step -> the KFP API calls it made against multi-user KFP (profile ``kfloop``): CI's ``kfloop upload`` and
    ``kfloop schedule drift``, the drift run's trigger step starting the pinned training run with the pod's token
    (service account ``kfloop``), and ``kfloop serve`` starting one for an alert (service account
    ``kfloop-webhook``)."""
    tmp = tmp_path_factory.mktemp("rbac-kfp")
    with pytest.MonkeyPatch.context() as env, kfp_server(env, tmp, multi_user=True) as kfp:
        env.setenv("KFLOOP_HOME", str(tmp / "kfloop"))
        users, calls = kfp.multi_user, {}
        for grant in KFP_GRANTS:
            users.apply(grant, namespace=PROFILE)

        def step(name: str, action) -> None:
            seen = len(users.reviews)
            action()
            calls.setdefault(name, []).extend(_kfp_call(r) for r in users.reviews[seen:])

        step("upload (CI)", lambda: _ok(main(["upload", *kfp.target, "--json"])))
        step("schedule (CI)", lambda: _ok(main(["schedule", "drift", *kfp.target, "--cron", "0 0 * * * *",
                                                 "--set", f"kfp.host={kfp.url}", *DRIFT_SETTINGS])))
        (recurring,) = kfp.store.recurring_runs.values()
        pinned = recurring["runtime_config"]["parameters"]["training_pipeline_version"]
        token = tmp / "token"
        env.delenv(kfp_client.TOKEN_ENV)
        env.setenv(kfp_client.SA_TOKEN_PATH_ENV, str(token))
        token.write_text(users.service_account_token(PROFILE, pinned["service_account"]))
        started = []
        step("trigger", lambda: started.append(start_pinned_training(
            pinned, {"model_name": "churn", "dataset_uri": "s3://bucket/drifted.parquet"})))
        kfp.set_run_state(started[0], "SUCCEEDED")  # or the alert's run would wait for it to finish
        token.write_text(users.service_account_token(PROFILE, "kfloop-webhook"))
        step("serve (alert)", lambda: alert_starter({}, host=kfp.url, version=None, namespace=PROFILE)(
            Alert(model="churn", reason="drift", data_key="0d7f5e2c", dataset_uri="s3://bucket/drifted.parquet")))
    return calls


def _ok(code: int) -> None:
    assert code == 0


def _deployed() -> Authorizer:
    return policy(*manifests(RBAC), *_webhook_rbac())


def unallowed(calls: dict[str, list[Access]], rbac: Authorizer) -> list[str]:
    """What ``rbac`` would refuse: step, call, and the rule it lacks."""
    return [f"step {step}: {a.method} {a.path} as {a.user.name} needs the rule {a.rule} in namespace "
            f"{a.namespace!r}" for step, accesses in calls.items() for a in accesses if not rbac.allows_access(a)]


def test_every_call_each_step_makes_is_allowed_by_its_service_accounts_rules(recorded):
    made = {(step, a.verb, a.api_group, a.resource) for step, accesses in recorded.items() for a in accesses}
    # what each step must have done for the check to mean anything
    for group, jobs in (("kubeflow.org", "pytorchjobs"), ("trainer.kubeflow.org", "trainjobs")):
        assert {("train", verb, group, jobs) for verb in ("create", "get", "watch", "delete")} <= made
    assert {("train", "get", "", "pods/log"), ("train", "list", "", "events"),
            ("promote", "create", "coordination.k8s.io", "leases"),
            ("promote", "update", "coordination.k8s.io", "leases")} <= made
    assert {("trigger", verb, "", "configmaps") for verb in ("get", "create", "update")} <= made
    assert {("serve (alert)", verb, "", "configmaps") for verb in ("get", "update")} <= made  # the step's ConfigMap
    assert {a.user for step, accesses in recorded.items() for a in accesses if step != "serve (alert)"} == \
        {SERVICE_ACCOUNT}
    assert {a.user for a in recorded["serve (alert)"]} == {WEBHOOK_ACCOUNT}
    assert all(a.allowed for accesses in recorded.values() for a in accesses)  # what the server answered
    assert unallowed(recorded, _deployed()) == []  # and what deploy/rbac.yaml's rules allow


@pytest.mark.parametrize("resource, verb", [("leases", "update"), ("pods/log", "get"), ("pytorchjobs", "delete"),
                                            ("configmaps", "update"), ("servingruntimes", "create")])
def test_a_verb_missing_from_the_role_names_the_step_the_call_and_the_rule(recorded, serving_recorded, resource,
                                                                           verb):
    docs = [*manifests(RBAC), *_webhook_rbac()]
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "kfloop"]
    for rule in list(role["rules"]):
        if resource in rule["resources"] and verb in rule["verbs"]:  # the verb taken from that resource alone
            rule["resources"].remove(resource)
            role["rules"].append({**rule, "resources": [resource], "verbs": [v for v in rule["verbs"] if v != verb]})
    if resource != "leases":  # the upstream pipeline-runner rules, bound to the same account, grant these too
        docs = [d for d in docs if d["metadata"]["name"] != "kfloop-pipeline-runner"]
    refused = unallowed({**recorded, **serving_recorded}, policy(*docs))
    assert refused, f"deploy/rbac.yaml without {verb} {resource} still allows every call"
    steps = {"leases": {"promote", "rollout"}, "configmaps": {"trigger"}, "servingruntimes": {"rollout"}}.get(
        resource, {"train"})
    group = {"leases": "coordination.k8s.io", "pods/log": '""', "pytorchjobs": "kubeflow.org",
             "configmaps": '""', "servingruntimes": "serving.kserve.io"}[resource]
    assert {line.removeprefix("step ").split(": ")[0] for line in refused} == steps, refused
    assert all(f"as system:serviceaccount:{NAMESPACE}:kfloop needs the rule {{apiGroups: [{group}], resources: "
               f"[{resource}], verbs: [{verb}]}} in namespace 'kfloop'" in line for line in refused), refused


def _k8s_grants() -> dict[str, Authorizer]:
    """Each Role of deploy/rbac.yaml and deploy/webhook.yaml, with its bindings."""
    docs = [*manifests(RBAC), *_webhook_rbac()]
    return {f"Role `{r['metadata']['name']}`": policy(r, *[
        b for b in docs if b["kind"] == "RoleBinding" and b["roleRef"]["name"] == r["metadata"]["name"]])
        for r in docs if r["kind"] == "Role"}


def _kfp_grants() -> dict[str, Authorizer]:
    """Each RoleBinding of the profile to KFP's roles (deploy/ and CI's), with the roles."""
    docs = [*_in_profile(manifests(*KFP_GRANTS)), CI_BINDING]
    return {f"RoleBinding `{b['metadata']['name']}`": _kfp_policy(b, *(r for r in docs if r["kind"] == "Role"))
            for b in docs if b["kind"] == "RoleBinding"}


def _table(calls: dict[str, list[Access]], grants: dict[str, Authorizer]) -> str:
    """One row per step and kind of call: the service account, the call, and what of ``grants`` allows it."""
    rows = dict.fromkeys(
        f"| {step} | `{a.user.name.removeprefix('system:serviceaccount:')}` | {a.verb} | `{a.api_group or 'core'}` "
        f"| `{a.resource}` | {', '.join(name for name, rbac in grants.items() if rbac.allows_access(a))} |"
        for step, accesses in calls.items()
        for a in sorted(accesses, key=lambda a: (a.api_group, a.resource, a.verb)))
    return "\n".join(["| step | service account | verb | API group | resource | allowed by |",
                      "|---|---|---|---|---|---|", *rows])


def test_the_docs_tables_are_the_calls_the_steps_make(recorded, serving_recorded, kfp_recorded):
    text = DOCS.read_text()
    stale = [t for t in (_table({**recorded, **serving_recorded}, _k8s_grants()), _table(kfp_recorded, _kfp_grants()))
             if t not in text]
    assert not stale, "docs/rbac.md's tables are stale; they should be:\n\n" + "\n\n".join(stale)


def test_every_kfp_call_each_step_makes_is_allowed_by_its_service_accounts_rules(kfp_recorded):
    made = {(step, a.user.name, a.verb, a.resource) for step, accesses in kfp_recorded.items() for a in accesses}
    runner, webhook = (f"system:serviceaccount:{PROFILE}:{sa}" for sa in ("kfloop", "kfloop-webhook"))
    assert {("upload (CI)", CI.name, "create", "pipelines"), ("schedule (CI)", CI.name, "create", "jobs"),
            ("trigger", runner, "create", "runs"), ("serve (alert)", webhook, "create", "runs")} <= made
    assert all(a.allowed for accesses in kfp_recorded.values() for a in accesses)
    assert unallowed(kfp_recorded, _kfp_policy(*_in_profile(manifests(*KFP_GRANTS)), CI_BINDING)) == []


def test_without_the_profiles_binding_the_trigger_step_cannot_start_its_run(kfp_recorded):
    refused = unallowed({"trigger": kfp_recorded["trigger"]}, _kfp_policy(CI_BINDING))
    assert f"step trigger: KFP RunService_CreateRun as system:serviceaccount:{PROFILE}:kfloop needs the rule " \
           f"{{apiGroups: [{GROUP}], resources: [runs], verbs: [create]}} in namespace '{PROFILE}'" in refused


KFP_STEP_CALLS = [
    # (verb, group, resource, name, where in kubeflow/pipelines backend/src/v2 (master 7b70c7b, after 2.17))
    ("get", "", "pods", "drift-abc-system-container-impl-1", "driver/k8s.go publishDriverExecution"),
    ("get", "", "pods", "drift-abc-system-container-impl-1", "component/launcher_v2.go retryIndexFromPodAnnotation"),
    ("get", "", "configmaps", "kfp-launcher", "config/env.go FromConfigMap"),
    ("get", "", "secrets", "mlpipeline-minio-artifact", "objectstore/object_store.go (config/env.go's default)"),
    ("get", "argoproj.io", "workflows", "drift-abc", "cmd/driver/main.go getCurrentWorkflowMetadata"),
    ("create", "argoproj.io", "workflowtaskresults", "", "Argo's executor: the step's outputs"),
    ("patch", "argoproj.io", "workflowtaskresults", "drift-abc-1", "Argo's executor: the step's outputs"),
]
"""Every Kubernetes call KFP v2's driver and launcher make in a step pod, as the run's service account."""


def _step_access(verb: str, group: str, resource: str, name: str) -> Access:
    return Access(SERVICE_ACCOUNT, verb, group, resource, NAMESPACE, name, "GET", f"{group}/{resource}/{name}", True)


@pytest.mark.parametrize("verb, group, resource, name, where", KFP_STEP_CALLS)
def test_every_call_kfp_v2_makes_in_a_step_pod_is_allowed_by_the_step_role(verb, group, resource, name, where):
    step_role = _k8s_grants()["Role `kfloop-pipeline-runner`"]
    assert step_role.allows_access(_step_access(verb, group, resource, name)), where


@pytest.mark.parametrize("verb, resource, name", [
    ("create", "pods", ""), ("create", "pods/exec", "drift-abc-train"), ("delete", "pods", "drift-abc-train"),
    ("get", "secrets", "kfloop-ci-token"), ("list", "secrets", ""), ("get", "configmaps", "other"),
    ("create", "services", ""), ("create", "persistentvolumeclaims", ""),
])
def test_the_step_pods_service_account_can_do_nothing_else_a_step_needs_not(verb, resource, name):
    """No pod as another service account, no exec into others, no Secret but the artifact store's."""
    assert not _deployed().allows_access(_step_access(verb, "", resource, name))


def test_every_call_serving_rollout_makes_is_allowed_by_the_steps_role(serving_recorded):
    made = {(step, a.verb, a.api_group, a.resource) for step, accesses in serving_recorded.items() for a in accesses}
    kserve = [("serving.kserve.io", plural) for plural in ("servingruntimes", "inferenceservices")]
    assert {("rollout", verb, group, plural) for verb in ("get", "create") for group, plural in kserve} <= made
    assert ("rollout", "patch", "serving.kserve.io", "inferenceservices") in made  # its traffic back to 0
    assert {(step, "watch", "serving.kserve.io", "inferenceservices") for step in ("rollout", "rollback")} <= made
    assert {("rollout", verb, "coordination.k8s.io", "leases") for verb in ("get", "create", "update")} <= made
    assert {("rollback", verb, group, plural) for verb in ("get", "patch")
            for group, plural in kserve} <= made
    assert {(a.user, a.namespace) for accesses in serving_recorded.values() for a in accesses} == \
        {(SERVICE_ACCOUNT, NAMESPACE)}
    assert all(a.allowed for accesses in serving_recorded.values() for a in accesses)
    assert unallowed(serving_recorded, _deployed()) == []
