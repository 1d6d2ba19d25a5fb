"""Authentication and RBAC authorisation of the Kubernetes API test server, as the API server's bearer-token
authenticator and RBAC authorizer (kubernetes ``plugin/pkg/auth/authorizer/rbac``) answer.

Every request must carry a bearer token the server issued (:meth:`Identities.issue`, written into a kubeconfig
by ``K8sServer.write_kubeconfig``): none or an unknown one is 401 Unauthorized. Every request is then allowed only
by a rule of a Role or ClusterRole bound to its user, one of its groups or its service account, through a
RoleBinding (in the request's namespace) or a ClusterRoleBinding: verbs, apiGroups, resources (``pods/log`` for
subresources, ``*``), resourceNames (only requests naming an object) and nonResourceURLs (discovery), each with
``*``; ClusterRoles with an ``aggregationRule`` hold the rules of the ClusterRoles their selectors match. Anything
else is 403 Forbidden with the API server's message. The server starts with the bootstrap policy a cluster has:
ClusterRole ``cluster-admin`` bound to group ``system:masters`` (the harness's admin), and ``system:discovery``
bound to ``system:authenticated``.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from cluster.k8s_store import (CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, RBAC_GROUP, ROLE_BINDINGS, ROLES, ApiError,
                             Resource, Store)
ADMIN = "kubernetes-admin"
MASTERS = "system:masters"

BOOTSTRAP = [
    (CLUSTER_ROLES, {"metadata": {"name": "cluster-admin"},
                     "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                               {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
    (CLUSTER_ROLE_BINDINGS, {"metadata": {"name": "cluster-admin"},
                             "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
                             "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": MASTERS}]}),
    (CLUSTER_ROLES, {"metadata": {"name": "system:discovery"},
                     "rules": [{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/version"],
                                "verbs": ["get"]}]}),
    (CLUSTER_ROLE_BINDINGS, {"metadata": {"name": "system:discovery"},
                             "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "system:discovery"},
                             "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group",
                                           "name": "system:authenticated"}]}),
]
"""The bootstrap roles and bindings of a cluster that this server needs (kubernetes
``plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go``)."""


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]


def service_account_user(namespace: str, name: str) -> User:
    """The user a service account's token authenticates as."""
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


ADMIN_USER = User(ADMIN, (MASTERS, "system:authenticated"))


@dataclass(frozen=True)
class Access:
    """One request's authorization attributes, as the API server resolves them before asking RBAC
    (kubernetes ``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`` ``NewRequestInfo``: the verb
    from the method, ``get``/``list``/``watch`` for GET by whether a name is given and ``?watch``; the subresource
    is the path segment after the name, e.g. ``pods/log``), with who made it and what RBAC answered."""

    user: User
    verb: str
    api_group: str
    resource: str
    """``pods``, or ``pods/log`` with the subresource; for a non-resource request (discovery) empty."""
    namespace: str
    name: str
    method: str
    path: str
    allowed: bool

    @property
    def rule(self) -> str:
        """The RBAC rule that would allow it, as a Role writes it."""
        if not self.resource:
            return f"{{nonResourceURLs: [{self.path}], verbs: [{self.verb}]}}"
        group = self.api_group or '""'
        return f"{{apiGroups: [{group}], resources: [{self.resource}], verbs: [{self.verb}]}}"


class Identities:
    """Bearer tokens the server issued, and who each one is."""

    def __init__(self) -> None:
        self._tokens: dict[str, User] = {}

    def issue(self, user: User) -> str:
        token = secrets.token_urlsafe(24)
        self._tokens[token] = user
        return token

    def authenticate(self, authorization: str) -> User:
        """The user of an ``Authorization: Bearer <token>`` header.

        Raises:
            ApiError: 401 Unauthorized without a token the server issued.
        """
        scheme, _, token = (authorization or "").partition(" ")
        user = self._tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user


def _matches(values: list[str], value: str) -> bool:
    return "*" in values or value in values


def _resource_matches(resources: list[str], resource: str) -> bool:
    if _matches(resources, resource):
        return True
    _, slash, sub = resource.partition("/")
    return bool(slash) and f"*/{sub}" in resources


def _path_matches(patterns: list[str], path: str) -> bool:
    return any(p == "*" or p == path or (p.endswith("*") and path.startswith(p[:-1])) for p in patterns)


def _subject_matches(subject: dict, user: User, namespace: str = "") -> bool:
    """Whether a binding's subject is ``user``; a ServiceAccount subject of a RoleBinding without a namespace is in
    the binding's ``namespace`` and matches the user by name alone, as a user named by a gateway's header does
    (kubernetes ``pkg/registry/rbac/validation/rule.go`` ``appliesToUser``: ``serviceaccount.MatchesUsername``)."""
    kind = subject.get("kind")
    if kind == "User":
        return subject.get("name") == user.name
    if kind == "Group":
        return subject.get("name") in user.groups
    if kind == "ServiceAccount":
        return user.name == service_account_user(subject.get("namespace") or namespace, subject.get("name", "")).name
    return False


class Authorizer:
    """RBAC over the roles and bindings in a store (see the module docstring)."""

    def __init__(self, store: Store):
        self.store = store

    def _cluster_role_rules(self, name: str, seen: frozenset[str] = frozenset()) -> list[dict]:
        try:
            role = self.store.get(CLUSTER_ROLES, "", name)
        except ApiError:
            return []
        rules = list(role.get("rules") or [])
        for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors", []):
            wanted = ",".join(f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items())
            for other in self.store.list(CLUSTER_ROLES, None, wanted)[0]:
                other_name = other["metadata"]["name"]
                if other_name != name and other_name not in seen:
                    rules += self._cluster_role_rules(other_name, seen | {name})
        return rules

    def _rules(self, user: User, namespace: str | None) -> list[dict]:
        rules = []
        for binding in self.store.list(CLUSTER_ROLE_BINDINGS, None)[0]:
            if any(_subject_matches(s, user) for s in binding.get("subjects") or []):
                rules += self._cluster_role_rules(binding["roleRef"]["name"])
        if namespace:
            for binding in self.store.list(ROLE_BINDINGS, namespace)[0]:
                if not any(_subject_matches(s, user, namespace) for s in binding.get("subjects") or []):
                    continue
                ref = binding["roleRef"]
                if ref["kind"] == "ClusterRole":
                    rules += self._cluster_role_rules(ref["name"])
                else:
                    try:
                        rules += self.store.get(ROLES, namespace, ref["name"]).get("rules") or []
                    except ApiError:
                        pass
        return rules

    def allows(self, user: User, verb: str, group: str, what: str, namespace: str | None,
               name: str | None) -> bool:
        """Whether a bound rule allows ``verb`` on ``what`` (``pods`` or ``pods/log``) of API group ``group`` in
        ``namespace`` (None: cluster scope) (kubernetes ``plugin/pkg/auth/authorizer/rbac/rbac.go``
        ``RuleAllows``)."""
        for rule in self._rules(user, namespace):
            if "nonResourceURLs" in rule and "resources" not in rule:
                continue
            if _matches(rule.get("verbs") or [], verb) and _matches(rule.get("apiGroups") or [], group) \
                    and _resource_matches(rule.get("resources") or [], what) \
                    and (not rule.get("resourceNames") or (name and name in rule["resourceNames"])):
                return True
        return False

    def allows_access(self, access: Access) -> bool:
        """Whether these roles and bindings allow a recorded request."""
        if not access.resource:
            return self.allows_path(access.user, access.verb, access.path)
        return self.allows(access.user, access.verb, access.api_group, access.resource, access.namespace or None,
                           access.name or None)

    def authorize(self, user: User, verb: str, resource: Resource, subresource: str | None,
                  namespace: str | None, name: str | None) -> None:
        """Allow a resource request, or raise the API server's 403 (:meth:`refusal`).

        Raises:
            ApiError: 403 Forbidden when no bound rule allows it.
        """
        refusal = self.refusal(user, verb, resource, subresource, namespace, name)
        if refusal is not None:
            raise refusal

    def refusal(self, user: User, verb: str, resource: Resource, subresource: str | None,
                namespace: str | None, name: str | None) -> ApiError | None:
        """The API server's 403 Forbidden for a resource request no bound rule allows; None when one does."""
        what = f"{resource.plural}/{subresource}" if subresource else resource.plural
        if self.allows(user, verb, resource.group, what, namespace if resource.namespaced else None, name):
            return None
        target = f'{resource.qualified} "{name}"' if name else resource.qualified
        scope = f'in the namespace "{namespace}"' if resource.namespaced and namespace else "at the cluster scope"
        details = {"kind": resource.plural, **({"group": resource.group} if resource.group else {}),
                   **({"name": name} if name else {})}
        return ApiError(403, "Forbidden", f'{target} is forbidden: User "{user.name}" cannot {verb} resource '
                                          f'"{what}" in API group "{resource.group}" {scope}', details)

    def allows_path(self, user: User, verb: str, path: str) -> bool:
        """Whether a bound rule allows ``verb`` on the non-resource URL ``path``."""
        return any(_matches(rule.get("verbs") or [], verb) and _path_matches(rule.get("nonResourceURLs") or [], path)
                   for rule in self._rules(user, None))

    def authorize_path(self, user: User, verb: str, path: str) -> None:
        """Allow a non-resource request (discovery), or raise the API server's 403.

        Raises:
            ApiError: 403 Forbidden when no bound rule allows it.
        """
        if not self.allows_path(user, verb, path):
            raise ApiError(403, "Forbidden", f'forbidden: User "{user.name}" cannot {verb} path "{path}"')


_KINDS = {"Role": ROLES, "ClusterRole": CLUSTER_ROLES, "RoleBinding": ROLE_BINDINGS,
          "ClusterRoleBinding": CLUSTER_ROLE_BINDINGS}


def policy(*documents: dict) -> Authorizer:
    """RBAC over these manifests' Roles, ClusterRoles and their bindings (other kinds are skipped), as a cluster
    holds them once applied."""
    store = Store()
    for doc in documents:
        if doc and doc.get("kind") in _KINDS:
            resource = _KINDS[doc["kind"]]
            store.create(resource, doc["metadata"].get("namespace", "") if resource.namespaced else "", doc)
    return Authorizer(store)


def manifests(*paths: Path) -> list[dict]:
    """The documents of YAML manifest files."""
    return [doc for path in paths for doc in yaml.safe_load_all(Path(path).read_text()) if doc]
