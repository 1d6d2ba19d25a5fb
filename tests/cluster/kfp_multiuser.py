"""Multi-user mode of the KFP API test server (tests/cluster/kfp_server.py), as KFP 2.x's API server behaves with
``MULTIUSER=true``: read from kubeflow/pipelines ``backend/src/apiserver`` (master, Dec 2026):

* Who calls (``resource/resource_manager.go`` ``IsAuthorized``): each authenticator in turn,
  ``auth/authenticator_http_headers.go`` (the ``kubeflow-userid`` header, ``KUBEFLOW_USERID_PREFIX`` stripped;
  Kubeflow's manifests set the prefix empty) and ``auth/authenticator_token_review.go`` (the bearer token by a
  TokenReview that must carry the audience ``pipelines.kubeflow.org``). Neither: 401 Unauthenticated "Failed to
  check authorization. User identity is empty in the request header".
* What they may do: a SubjectAccessReview ``{user, resourceAttributes: {namespace, verb, group
  pipelines.kubeflow.org, version v1beta1, resource, name}}``; not allowed: 403 PermissionDenied. It is answered
  here by the Kubernetes test server's RBAC authorizer (tests/cluster/k8s_rbac.py) over KFP's upstream ClusterRoles
  (``tests/cluster/specs/kfp-multi-user-view-edit-cluster-roles.yaml``) and the RoleBindings a Kubeflow profile makes
  (kubeflow/dashboard ``components/profile-controller/controllers/profile_controller.go``: the owner to
  ``kubeflow-admin``, the ``default-editor`` service account to ``kubeflow-edit``). Every review is recorded, with the operation it was made for.
* Pipelines (``server/pipeline_server.go`` ``canAccessPipeline``): anyone may read a shared pipeline (empty
  namespace); creating or changing one is reviewed in KFP's own namespace (``common.GetPodNamespace()``), where a
  profile's users have no rights; a namespaced pipeline is reviewed in its namespace. Versions take their
  pipeline's namespace (``canAccessPipelineVersion``).
* Experiments (``server/experiment_server.go`` ``canAccessExperiment``): an empty namespace is 400 "An experiment
  cannot have an empty namespace in multi-user mode".
* Runs (``server/run_server.go`` ``createRun``, ``listRuns``, ``canAccessRun``; ``TerminateRun`` reviews verb
  ``terminate``) and recurring runs
  (``server/job_server.go``, resource ``jobs``): the namespace is the experiment's; creating one without an
  experiment is 400 "Experiment id can not be empty in multi-user mode"
  (``resource_manager.go`` ``GetValidExperimentNamespacePair``); listing with neither namespace nor experiment is
  400.
* Single-user mode (``ReplaceNamespace``, in kfp_server.py itself): every namespace a request names is replaced by
  the empty one, so ``--namespace`` against a standalone KFP lands in the shared space.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable

import yaml

from cluster.istio_injection import NAMESPACE_LABEL as ISTIO_INJECTION
from cluster.k8s_rbac import Authorizer, Identities, User, service_account_user
from cluster.k8s_store import CLUSTER_ROLES, RBAC_GROUP, ROLE_BINDINGS, ROLES, ApiError as K8sApiError, Resource, Store
from cluster.kfp_server import ApiError

PROFILE_LABELS = {ISTIO_INJECTION: "enabled", "katib.kubeflow.org/metrics-collector-injection": "enabled",
                  "serving.kubeflow.org/inferenceservice": "enabled", "pipelines.kubeflow.org/enabled": "true",
                  "app.kubernetes.io/part-of": "kubeflow-profile"}
"""The labels the profile controller gives a profile's namespace (kubeflow/kubeflow v1.10.0 (90e987bf)
``components/profile-controller/controllers/profile_controller.go`` ``Reconcile`` l. 127-137: ``istio-injection``,
then ``setNamespaceLabels`` l. 754-773 with ``config/base/namespace-labels.yaml``'s, the same in kubeflow/manifests
v1.10.0 ``apps/profiles/upstream/base/namespace-labels.yaml``); the last one selects the namespace for the PodDefault
webhook (tests/cluster/pod_defaults.py ``NAMESPACE_SELECTOR``)."""
KFP_NAMESPACE = "kubeflow"
"""The namespace KFP's API server runs in (``common.GetPodNamespace()``): shared pipelines are reviewed there."""
USERID_HEADER = "kubeflow-userid"
TOKEN_AUDIENCE = "pipelines.kubeflow.org"
GROUP, VERSION = "pipelines.kubeflow.org", "v1beta1"
CLUSTER_ROLES_FILE = Path(__file__).parent / "specs" / "kfp-multi-user-view-edit-cluster-roles.yaml"
KUBEFLOW_ROLES = [  # kubeflow/manifests common/kubeflow-roles: the roles a profile binds, aggregating KFP's
    {"metadata": {"name": f"kubeflow-{role}"}, "rules": [], "aggregationRule": {"clusterRoleSelectors": [
        {"matchLabels": {f"rbac.authorization.kubeflow.org/aggregate-to-kubeflow-{agg}": "true"}} for agg in aggs]}}
    for role, aggs in (("admin", ("admin", "edit", "view")), ("edit", ("edit", "view")), ("view", ("view",)))]


@dataclass(frozen=True)
class AccessReview:
    """One SubjectAccessReview the API server made, and its answer."""

    user: str
    namespace: str
    verb: str
    resource: str
    name: str
    allowed: bool
    operation: str
    """The API call reviewed (its swagger operationId, e.g. ``RunService_CreateRun``)."""


@dataclass
class MultiUser:
    """``KfpApiServer(multi_user=MultiUser())``: authentication and authorisation as in the module docstring."""

    kfp_namespace: str = KFP_NAMESPACE
    reviews: list[AccessReview] = field(default_factory=list)
    """Every SubjectAccessReview, in order."""
    tokens: Identities = field(default_factory=Identities)
    """What a TokenReview asks: the Kubernetes test server's issued tokens (``K8sServer.identities``) when given,
    so a pod's projected token is one the cluster issued; else tokens of this server's own."""

    def __post_init__(self) -> None:
        self._operation = ""
        self._rbac = Store()
        self._audiences: dict[str, tuple[str, ...]] = {}
        roles = [d for d in yaml.safe_load_all(CLUSTER_ROLES_FILE.read_text()) if d]
        for role in [*roles, *KUBEFLOW_ROLES]:
            self._rbac.create(CLUSTER_ROLES, "", role)

    # -- what a Kubeflow install has ---------------------------------------------------------------------------
    def add_profile(self, namespace: str, owner: str) -> None:
        """A Kubeflow profile: ``owner`` is its admin, its ``default-editor`` service account an editor."""
        for name, role, subject in (
                ("namespaceAdmin", "kubeflow-admin", {"kind": "User", "apiGroup": RBAC_GROUP, "name": owner}),
                ("default-editor", "kubeflow-edit", {"kind": "ServiceAccount", "name": "default-editor",
                                                     "namespace": namespace})):
            self._rbac.create(ROLE_BINDINGS, namespace, {
                "metadata": {"name": name, "namespace": namespace},
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role}, "subjects": [subject]})

    def apply(self, manifest: Path, namespace: str = "") -> None:
        """``kubectl apply [-n namespace] -f manifest`` (e.g. deploy/kubeflow-profile.yaml): its Roles and
        RoleBindings, which are all the access reviews read."""
        for doc in yaml.safe_load_all(manifest.read_text()):
            if doc and doc["kind"] in ("Role", "RoleBinding"):
                self._rbac.create(ROLES if doc["kind"] == "Role" else ROLE_BINDINGS,
                                  doc["metadata"].get("namespace") or namespace, doc)

    def bind(self, namespace: str, user: User, role: str = "kubeflow-edit") -> None:
        """A contributor: ``user`` gets ``role`` in ``namespace`` (a RoleBinding)."""
        subject = ({"kind": "ServiceAccount", "name": user.name.rsplit(":", 1)[1],
                    "namespace": user.name.split(":")[2]} if user.name.startswith("system:serviceaccount:")
                   else {"kind": "User", "apiGroup": RBAC_GROUP, "name": user.name})
        self._rbac.create(ROLE_BINDINGS, namespace, {
            "metadata": {"name": f"{role}-{len(self.reviews)}-{abs(hash(user.name))}", "namespace": namespace},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role}, "subjects": [subject]})

    def service_account_token(self, namespace: str, name: str, *, audience: str = TOKEN_AUDIENCE) -> str:
        """A token of service account ``namespace/name`` with ``audience`` (a projected token)."""
        token = self.tokens.issue(service_account_user(namespace, name))
        self._audiences[token] = (audience,)
        return token

    # -- the API server's checks -------------------------------------------------------------------------------
    def identity(self, headers: dict[str, str]) -> User:
        """The caller: the ``kubeflow-userid`` header, else the bearer token's TokenReview.

        Raises:
            ApiError: 401 when neither names a user.
        """
        if headers.get(USERID_HEADER):
            return User(headers[USERID_HEADER], ("system:authenticated",))
        token = (headers.get("authorization") or "").removeprefix("Bearer ").strip()
        try:
            user = self.tokens.authenticate(f"Bearer {token}")
        except K8sApiError:
            user = None
        if user is None or TOKEN_AUDIENCE not in self._audiences.get(token, ()):
            raise ApiError(HTTPStatus.UNAUTHORIZED, "Failed to check authorization. User identity is empty in the "
                                                    "request header")
        return user

    def review(self, headers: dict[str, str], namespace: str, verb: str, resource: str, name: str = "") -> None:
        """``IsAuthorized``: a SubjectAccessReview of the caller.

        Raises:
            ApiError: 401 without an identity, 403 when RBAC does not allow it.
        """
        user = self.identity(headers)
        try:
            Authorizer(self._rbac).authorize(user, verb, Resource(GROUP, VERSION, resource, resource), None,
                                             namespace, name or None)
            allowed = True
        except K8sApiError:
            allowed = False
        self.reviews.append(AccessReview(user.name, namespace, verb, resource, name, allowed, self._operation))
        if not allowed:
            raise ApiError(HTTPStatus.FORBIDDEN, f"Unauthorized access: User '{user.name}' is not authorized with "
                                                 f"reason:  (request: namespace:{namespace!r} verb:{verb!r} "
                                                 f"group:{GROUP!r} resource:{resource!r} name:{name!r})")

    def authorize(self, server: Any, operation: str, path_params: dict[str, str], query: dict[str, str],
                  body: Any, headers: dict[str, str]) -> None:
        """Check ``operation`` (a swagger operationId) of ``server`` as KFP's API server does before serving it.

        Raises:
            ApiError: 400 for an empty namespace where one is required, 401, 403, or 404 for a missing parent.
        """
        check = _CHECKS.get(operation)
        self._operation = operation
        if check is not None:
            check(self, server.store, path_params, query, body or {}, headers)

    def _pipeline(self, headers: dict, namespace: str, verb: str, name: str = "") -> None:
        """``canAccessPipeline``: shared pipelines are readable by all, written only with rights in KFP's own
        namespace."""
        if not namespace:
            if verb in ("get", "list"):
                return
            namespace = self.kfp_namespace
        self.review(headers, namespace, verb, "pipelines", name)

    def _namespaced(self, headers: dict, namespace: str, verb: str, resource: str, what: str) -> None:
        if not namespace:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid input error: {what} cannot have an empty namespace in "
                                                   "multi-user mode")
        self.review(headers, namespace, verb, resource)


def _found(items: dict[str, dict], key: str, what: str) -> dict:
    if key not in items:
        raise ApiError(HTTPStatus.NOT_FOUND, f"{what} {key} not found")
    return items[key]


def _experiment_namespace(store: Any, experiment_id: str, what: str) -> str:
    if not experiment_id:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid input error: Experiment id can not be empty in multi-user "
                                               f"mode ({what})")
    return _found(store.experiments, experiment_id, "Experiment")["namespace"]


def _list_namespace(store: Any, query: dict[str, str]) -> str:
    if query.get("experiment_id"):
        return _found(store.experiments, query["experiment_id"], "Experiment")["namespace"]
    return query.get("namespace", "")


_Check = Callable[[MultiUser, Any, dict, dict, dict, dict], None]
_CHECKS: dict[str, _Check] = {
    "UploadPipeline": lambda mu, st, pp, q, b, h: mu._pipeline(h, q.get("namespace", ""), "create",
                                                               q.get("name") or q.get("display_name", "")),
    "UploadPipelineVersion": lambda mu, st, pp, q, b, h: mu._pipeline(
        h, _found(st.pipelines, q.get("pipelineid", ""), "Pipeline")["namespace"], "create"),
    "PipelineService_ListPipelines": lambda mu, st, pp, q, b, h: mu._pipeline(h, q.get("namespace", ""), "list"),
    "PipelineService_GetPipeline": lambda mu, st, pp, q, b, h: mu._pipeline(
        h, _found(st.pipelines, pp["pipeline_id"], "Pipeline")["namespace"], "get"),
    "PipelineService_ListPipelineVersions": lambda mu, st, pp, q, b, h: mu._pipeline(
        h, _found(st.pipelines, pp["pipeline_id"], "Pipeline")["namespace"], "list"),
    "PipelineService_GetPipelineVersion": lambda mu, st, pp, q, b, h: mu._pipeline(
        h, _found(st.pipelines, pp["pipeline_id"], "Pipeline")["namespace"], "get"),
    "PipelineService_DeletePipelineVersion": lambda mu, st, pp, q, b, h: mu._pipeline(
        h, _found(st.pipelines, pp["pipeline_id"], "Pipeline")["namespace"], "delete"),
    "ExperimentService_CreateExperiment": lambda mu, st, pp, q, b, h: mu._namespaced(
        h, b.get("namespace", ""), "create", "experiments", "An experiment"),
    "ExperimentService_GetExperiment": lambda mu, st, pp, q, b, h: mu._namespaced(
        h, _found(st.experiments, pp["experiment_id"], "Experiment")["namespace"], "get", "experiments",
        "An experiment"),
    "ExperimentService_ListExperiments": lambda mu, st, pp, q, b, h: mu._namespaced(
        h, q.get("namespace", ""), "list", "experiments", "An experiment"),
    "RunService_CreateRun": lambda mu, st, pp, q, b, h: mu._namespaced(
        h, _experiment_namespace(st, b.get("experiment_id", ""), "run"), "create", "runs", "A run"),
    **{f"RunService_{op}Run": (lambda verb: lambda mu, st, pp, q, b, h: mu._namespaced(
        h, st.experiments.get(_found(st.runs, pp["run_id"], "Run").get("experiment_id", ""), {}).get(
            "namespace", ""), verb, "runs", "A run"))(verb) for op, verb in (("Get", "get"), ("Terminate", "terminate"))},
    "RunService_ListRuns": lambda mu, st, pp, q, b, h: mu._namespaced(
        h, _list_namespace(st, q), "list", "runs", "A run"),
    "RecurringRunService_CreateRecurringRun": lambda mu, st, pp, q, b, h: mu._namespaced(
        h, _experiment_namespace(st, b.get("experiment_id", ""), "recurring run"), "create", "jobs",
        "A recurring run"),
    "RecurringRunService_ListRecurringRuns": lambda mu, st, pp, q, b, h: mu._namespaced(
        h, _list_namespace(st, q), "list", "jobs", "A recurring run"),
    **{f"RecurringRunService_{op}RecurringRun": (lambda verb: lambda mu, st, pp, q, b, h: mu._namespaced(
        h, st.experiments.get(_found(st.recurring_runs, pp["recurring_run_id"], "Recurring run").get(
            "experiment_id", ""), {}).get("namespace", ""), verb, "jobs", "A recurring run"))(verb)
       for op, verb in (("Get", "get"), ("Enable", "enable"), ("Disable", "disable"), ("Delete", "delete"))},
}
"""operationId -> the check KFP's API server makes before serving it (see the module docstring)."""
