"""Kubeflow's gateway in front of the multi-user KFP test server (tests/cluster/kfp_gateway.py), through the real
``kfp.Client``: which credentials reach KFP with an identity, and which the gateway refuses (issue 40 item 4)."""
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import kfp
import pytest
from cluster.k8s_rbac import service_account_user
from cluster.kfp_gateway import (DEX_RULES, M2M_RULES, Gateway, JwtIssuer, ServiceAccountIssuer, jwt_rules,
                                 oauth2_proxy_settings)
from cluster.kfp_multiuser import MultiUser
from cluster.kfp_server import KfpApiServer
from kfp_server_api.exceptions import ApiException

GITHUB_OIDC = Path(__file__).resolve().parents[2] / "deploy" / "github-oidc.yaml"
PROFILE = "kfloop"
GITHUB_SUB = "repo:OWNER/REPO:ref:refs/heads/main"


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A multi-user KFP with profile ``kfloop`` behind the gateway: the cluster's service-account issuer, Dex, and
    GitHub's issuer (deploy/github-oidc.yaml's rule and RoleBinding applied)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    clock = Clock()
    users = MultiUser()
    users.add_profile(PROFILE, owner="alice@example.com")
    users.bind(PROFILE, service_account_user(PROFILE, "kfloop-ci"))
    users.apply(GITHUB_OIDC)
    sa, dex = ServiceAccountIssuer(clock), JwtIssuer("http://dex.auth.svc.cluster.local:5556/dex", clock)
    github = JwtIssuer("https://token.actions.githubusercontent.com", clock)
    with KfpApiServer(multi_user=users) as server, Gateway(
            server.url, issuers=[sa, dex, github], rules=jwt_rules(M2M_RULES, DEX_RULES, GITHUB_OIDC),
            now=clock) as gateway:
        yield gateway, server, sa, dex, github, clock


def _experiments(gateway: Gateway, **credentials) -> list:
    return kfp.Client(host=gateway.url, **credentials).list_experiments(namespace=PROFILE).experiments or []


def _refused(gateway: Gateway, headers: dict[str, str]) -> tuple[int, str]:
    """The gateway's answer to a request it refuses (raw HTTP: ``kfp.Client()`` itself first asks healthz, which
    the gateway refuses alike, and retries that for 25 s before it raises)."""
    request = urllib.request.Request(f"{gateway.url}/apis/v2beta1/experiments?namespace={PROFILE}", headers=headers)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    return refused.value.code, refused.value.read().decode()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_legacy_service_account_token_is_refused_at_the_gateway(cluster):
    """Issuer ``kubernetes/serviceaccount`` is not the one m2m-token-issuer trusts (though the cluster's key signed
    it); an opaque bearer is no JWT; a non-Bearer header carries no principal: KFP never sees the request."""
    gateway, server, sa, *_ = cluster
    assert _refused(gateway, _bearer(sa.legacy_token(PROFILE, "kfloop-ci"))) == (401, "Jwt issuer is not configured")
    assert _refused(gateway, _bearer("opaque-token")) == (401, "Jwt is not in the form of Header.Payload.Signature")
    assert _refused(gateway, {"Authorization": "Basic a2Zsb29wOnB3"}) == (403, "RBAC: access denied")
    assert server.requests == []


def test_a_bound_service_account_token_is_accepted_and_its_sub_is_the_kfp_user(cluster):
    gateway, server, sa, *_ = cluster
    token = sa.bound_token(PROFILE, "kfloop-ci", audiences=["pipelines.kubeflow.org"], duration=timedelta(hours=1))
    assert _experiments(gateway, existing_token=token) == []
    (request,) = [r for r in server.requests if r.path.endswith("/experiments")]
    assert request.headers["kubeflow-userid"] == f"system:serviceaccount:{PROFILE}:kfloop-ci"
    assert [(r.user, r.verb, r.resource, r.allowed) for r in server.multi_user.reviews] == [
        (f"system:serviceaccount:{PROFILE}:kfloop-ci", "list", "experiments", True)]


def test_an_expired_or_foreign_signed_token_of_a_trusted_issuer_fails_verification(cluster):
    gateway, server, sa, _, github, clock = cluster
    token = sa.bound_token(PROFILE, "kfloop-ci", audiences=["pipelines.kubeflow.org"], duration=timedelta(minutes=10))
    client = kfp.Client(host=gateway.url, existing_token=token)
    seen = len(server.requests)
    clock.t += 11 * 60 + 60  # past exp and Envoy's 60 s clock skew
    with pytest.raises(ApiException) as expired:
        client.list_experiments(namespace=PROFILE)
    assert (expired.value.status, expired.value.body) == (401, "Jwt is expired")
    forged = JwtIssuer(github.issuer, clock).token({"sub": GITHUB_SUB, "aud": "kubeflow-pipelines"})
    assert _refused(gateway, _bearer(forged)) == (401, "Jwt verification fails")
    assert len(server.requests) == seen


def test_a_github_oidc_token_of_the_configured_audience_is_mapped_to_its_sub(cluster):
    gateway, server, _, _, github, _ = cluster
    assert _experiments(gateway, existing_token=github.token({"sub": GITHUB_SUB, "aud": "kubeflow-pipelines",
                                                               "repository": "OWNER/REPO"})) == []
    assert server.requests[-1].headers["kubeflow-userid"] == GITHUB_SUB
    assert server.multi_user.reviews[-1].allowed  # deploy/github-oidc.yaml's RoleBinding
    wrong = github.token({"sub": GITHUB_SUB, "aud": "https://github.com/OWNER"})  # GitHub's default audience
    assert _refused(gateway, _bearer(wrong)) == (401, "Audiences in Jwt are not allowed")


def test_a_kubeflow_userid_header_from_the_caller_never_reaches_kfp(cluster):
    gateway, server, _, _, github, _ = cluster
    client = kfp.Client(host=gateway.url, existing_token=github.token({"sub": GITHUB_SUB,
                                                                        "aud": "kubeflow-pipelines"}))
    client._experiment_api.api_client.set_default_header("kubeflow-userid", "alice@example.com")
    client.list_experiments(namespace=PROFILE)
    assert server.requests[-1].headers["kubeflow-userid"] == GITHUB_SUB
    # no Authorization: oauth2-proxy, no session cookie, an API route
    assert _refused(gateway, {"kubeflow-userid": "alice@example.com"}) == (401, "Unauthorized")


def test_a_session_cookie_works_until_oauth2_proxys_cookie_expire(cluster):
    gateway, server, _, dex, _, clock = cluster
    assert oauth2_proxy_settings()["cookie_expire"] == "24h"  # kubeflow/manifests' oauth2_proxy.cfg
    cookie = gateway.login(dex, "alice@example.com")
    client = kfp.Client(host=gateway.url, cookies=cookie)
    assert client.list_experiments(namespace=PROFILE).experiments is None
    assert server.requests[-1].headers["kubeflow-userid"] == "alice@example.com"  # dex-jwt: claim email
    clock.t += 24 * 3600
    with pytest.raises(ApiException) as expired:
        client.list_experiments(namespace=PROFILE)
    assert (expired.value.status, expired.value.body) == (401, "Unauthorized")
