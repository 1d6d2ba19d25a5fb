"""Kubeflow's gateway in front of the multi-user KFP API test server (tests/cluster/kfp_multiuser.py): Istio's ingress
gateway with Kubeflow's RequestAuthentications and AuthorizationPolicies, and oauth2-proxy as its external
authorizer, as kubeflow/manifests (@ 009c8808, copied into tests/cluster/specs/) configures them:

* ``common/oauth2-proxy/components/istio-external-auth/authorizationpolicy.istio-ingressgateway-oauth2-proxy.yaml``:
  a request without an ``Authorization`` header is checked by oauth2-proxy (``base/oauth2_proxy.cfg``): its session
  cookie ``cookie_name`` is valid until ``cookie_expire`` after the login, and then oauth2-proxy sets
  ``Authorization: Bearer`` the session's Dex ID token (``set_authorization_header``); without a valid cookie a path
  under ``api_routes`` gets 401 (others a 302 to the sign-in page).
* The RequestAuthentications (``istio-m2m/requestauthentication.yaml``, ``m2m-token-issuer``, whose ``PATCH_ME``
  issuer is the cluster's service-account issuer; ``requestauthentication.dex-jwt.yaml``; and any given, e.g.
  deploy/github-oidc.yaml): a bearer JWT whose ``iss`` a rule names is verified as Envoy's ``jwt_authn`` filter does
  (the signature by the issuer's keys: 401 "Jwt verification fails"; ``exp``: "Jwt is expired"; ``nbf``: "Jwt not
  yet valid"; ``aud`` against the rule's ``audiences`` when it lists any: "Audiences in Jwt are not allowed", Envoy's
  ``jwt_authn`` status messages); a verified one sets each ``outputClaimToHeaders`` header
  from its claim (a claim the token lacks removes the header). A JWT whose issuer no rule names gets 401 "Jwt issuer
  is not configured", a bearer value that is no JWT 401 "Jwt is not in the form of Header.Payload.Signature":
  Istio's requirement is ``allow_missing``, which passes only a missing token (envoyproxy/envoy #15194,
  ``jwt_authn/verifier.cc``: ``JwtUnknownIssuer`` is no longer taken for ``JwtMissed``).
* ``authorizationpolicy.istio-ingressgateway-require-jwt.yaml``: a request without a verified JWT (no request
  principal, e.g. an ``Authorization`` header that is not ``Bearer``) is denied, 403 "RBAC: access denied".

The ``kubeflow-userid`` and ``kubeflow-groups`` headers a client sends never reach KFP: only a verified token's claims
set them. Tokens are signed by keys of :class:`JwtIssuer`\\ s the test cluster holds (RS256); time is ``now()``, so a
test moves a clock instead of sleeping.
"""
from __future__ import annotations

import http.client
import json
import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import yaml
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet, RSAKey

from cluster.loopback import Loopback

SPECS = Path(__file__).parent / "specs"
M2M_RULES = SPECS / "istio-m2m-requestauthentication.yaml"
DEX_RULES = SPECS / "istio-dex-jwt-requestauthentication.yaml"
OAUTH2_PROXY_CFG = SPECS / "oauth2_proxy.cfg"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
"""The test cluster's service-account token issuer (``--service-account-issuer``), patched into ``m2m-token-issuer``."""
LEGACY_ISSUER = "kubernetes/serviceaccount"
"""The issuer of legacy ``kubernetes.io/service-account-token`` Secret tokens (kubernetes
``pkg/serviceaccount/legacy.go`` ``LegacyIssuer``)."""
CLOCK_SKEW_SECONDS = 60
"""Envoy ``JwtProvider.clock_skew_seconds`` default: ``exp`` and ``nbf`` are checked with this much leeway."""
CLAIM_HEADERS = ("kubeflow-userid", "kubeflow-groups")
"""Headers only a verified token's claims may set."""
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class JwtIssuer:
    """An OIDC issuer of the test cluster: an RSA key and the JWTs it signs."""

    def __init__(self, issuer: str, now: Callable[[], float] = time.time):
        self.issuer, self.now = issuer, now
        self.key = RSAKey.generate_key(2048, parameters={"kid": uuid.uuid4().hex[:16], "use": "sig"})

    @property
    def keys(self) -> KeySet:
        """The issuer's JWKS (public keys)."""
        return KeySet([RSAKey.import_key(self.key.as_dict(private=False))])

    def token(self, claims: dict[str, Any], lifetime: timedelta | None = timedelta(hours=1)) -> str:
        """A signed JWT of ``claims`` with this ``iss`` (and ``iat``/``nbf``/``exp`` unless ``lifetime`` is None)."""
        now = int(self.now())
        times = {"iat": now, "nbf": now, "exp": now + int(lifetime.total_seconds())} if lifetime else {}
        return jwt.encode({"alg": "RS256", "kid": self.key.kid}, {"iss": self.issuer, **times, **claims}, self.key)


class ServiceAccountIssuer(JwtIssuer):
    """The cluster's service-account token signer: bound tokens (``kubectl create token``, projected volumes) and
    the legacy Secret tokens, signed by the same key as a real cluster signs both."""

    def __init__(self, now: Callable[[], float] = time.time):
        super().__init__(SERVICE_ACCOUNT_ISSUER, now)

    def bound_token(self, namespace: str, name: str, *, audiences: list[str], duration: timedelta) -> str:
        """``kubectl create token NAME -n NAMESPACE --audience ... --duration ...`` (kubernetes
        ``pkg/serviceaccount/claims.go`` ``Claims``)."""
        return self.token({"sub": f"system:serviceaccount:{namespace}:{name}", "aud": audiences,
                           "kubernetes.io": {"namespace": namespace, "serviceaccount": {
                               "name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}"))}}},
                          duration)

    def legacy_token(self, namespace: str, name: str) -> str:
        """The token of a ``kubernetes.io/service-account-token`` Secret (``pkg/serviceaccount/legacy.go``
        ``LegacyClaims``): issuer ``kubernetes/serviceaccount``, no audience, no expiry."""
        return jwt.encode({"alg": "RS256", "kid": self.key.kid}, {
            "iss": LEGACY_ISSUER, "sub": f"system:serviceaccount:{namespace}:{name}",
            "kubernetes.io/serviceaccount/namespace": namespace,
            "kubernetes.io/serviceaccount/secret.name": f"{name}-token",
            "kubernetes.io/serviceaccount/service-account.name": name,
            "kubernetes.io/serviceaccount/service-account.uid": str(uuid.uuid4())}, self.key)


def jwt_rules(*manifests: Path, issuer: str = SERVICE_ACCOUNT_ISSUER) -> list[dict]:
    """The ``jwtRules`` of the RequestAuthentications in ``manifests``, ``PATCH_ME`` replaced by ``issuer`` (the
    kustomize patch kubeflow/manifests asks for)."""
    return [{**rule, "issuer": issuer if rule["issuer"] == "PATCH_ME" else rule["issuer"]}
            for path in manifests for doc in yaml.safe_load_all(path.read_text())
            if doc and doc["kind"] == "RequestAuthentication" for rule in doc["spec"]["jwtRules"]]


def oauth2_proxy_settings(path: Path = OAUTH2_PROXY_CFG) -> dict[str, Any]:
    """``base/oauth2_proxy.cfg`` (TOML key = value lines) as a dict."""
    settings, key, value = {}, None, ""
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].rstrip()
        if key is not None:  # inside a multi-line list
            value += line
            if line.strip() == "]":
                settings[key], key = re.findall(r'"([^"]*)"', value), None
            continue
        if m := re.match(r"\s*(\w+)\s*=\s*(.*)", line):
            if m.group(2) == "[":
                key, value = m.group(1), ""
            else:
                settings[m.group(1)] = m.group(2).strip('"')
    return settings


def _duration(text: str) -> timedelta:
    """A Go duration such as ``24h`` or ``30m``."""
    units = {"h": 3600, "m": 60, "s": 1}
    return timedelta(seconds=sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", text)))


@dataclass
class Gateway:
    """``with Gateway(kfp.url, issuers=[...]) as gw: kfp.Client(host=gw.url, existing_token=...)``."""

    upstream: str
    issuers: list[JwtIssuer]
    """The issuers whose keys the gateway trusts (Istio fetches them from each rule's ``jwksUri``)."""
    rules: list[dict] = field(default_factory=lambda: jwt_rules(M2M_RULES, DEX_RULES))
    oauth2_proxy: dict[str, Any] = field(default_factory=oauth2_proxy_settings)
    now: Callable[[], float] = time.time
    sessions: dict[str, tuple[str, float]] = field(default_factory=dict)
    """oauth2-proxy sessions: cookie value -> (the Dex ID token, login time)."""

    def __post_init__(self) -> None:
        self._keys = {i.issuer: i.keys for i in self.issuers}
        self._http = Loopback(self._handler())

    @property
    def url(self) -> str:
        return self._http.url

    def __enter__(self) -> Gateway:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._http.__exit__()

    def login(self, dex: JwtIssuer, email: str) -> str:
        """A finished Dex login through oauth2-proxy: the ``Cookie`` header value of its session."""
        cookie = secrets.token_urlsafe(24)
        self.sessions[cookie] = (dex.token({"sub": uuid.uuid4().hex, "email": email, "groups": []}), self.now())
        return f"{self.oauth2_proxy['cookie_name']}={cookie}"

    def admit(self, path: str, headers: dict[str, str]) -> dict[str, str]:
        """The headers KFP receives for a request, or the gateway's refusal.

        Raises:
            GatewayRefusal: 401 (oauth2-proxy, a JWT that fails verification) or 403 (no verified JWT).
        """
        headers = {k: v for k, v in headers.items() if k.lower() not in CLAIM_HEADERS}
        if "authorization" not in {k.lower() for k in headers}:
            headers["Authorization"] = f"Bearer {self._oauth2_proxy(path, headers)}"
        auth = next(v for k, v in headers.items() if k.lower() == "authorization")
        if not auth.startswith("Bearer "):  # fromHeaders: no JWT extracted, no request principal
            raise GatewayRefusal(HTTPStatus.FORBIDDEN, "RBAC: access denied")
        rule, claims = self._verify(auth.removeprefix("Bearer "))
        for output in rule.get("outputClaimToHeaders", []):
            if claims.get(output["claim"]) not in (None, "", []):
                value = claims[output["claim"]]
                headers[output["header"]] = ",".join(value) if isinstance(value, list) else str(value)
        return headers

    def _oauth2_proxy(self, path: str, headers: dict[str, str]) -> str:
        """The session's ID token for a valid cookie (``cookie_expire`` after login, ``cookie_refresh = 0``)."""
        name = self.oauth2_proxy["cookie_name"]
        cookies = dict(part.strip().split("=", 1) for k, v in headers.items() if k.lower() == "cookie"
                       for part in v.split(";") if "=" in part)
        session = self.sessions.get(cookies.get(name, ""))
        if session is not None and self.now() - session[1] < _duration(
                self.oauth2_proxy["cookie_expire"]).total_seconds():
            return session[0]
        if any(re.search(route, path) for route in self.oauth2_proxy["api_routes"]):
            raise GatewayRefusal(HTTPStatus.UNAUTHORIZED, "Unauthorized")
        raise GatewayRefusal(HTTPStatus.FOUND, "/oauth2/start")

    def _verify(self, token: str) -> tuple[dict, dict]:
        """(rule, claims) of a verified token.

        Raises:
            GatewayRefusal: 401 for a token that is no JWT, names no configured issuer, or fails its rule.
        """
        try:  # Envoy picks the provider by the unverified ``iss`` before it verifies anything
            issuer = json.loads(jws.extract_compact(token.encode()).payload).get("iss")
        except (JoseError, ValueError):
            raise GatewayRefusal(HTTPStatus.UNAUTHORIZED,
                                 "Jwt is not in the form of Header.Payload.Signature") from None
        rule = next((r for r in self.rules if r["issuer"] == issuer), None)
        if rule is None:
            raise GatewayRefusal(HTTPStatus.UNAUTHORIZED, "Jwt issuer is not configured")
        try:
            claims = jwt.decode(token, self._keys[issuer], algorithms=["RS256"]).claims
        except (JoseError, KeyError, ValueError):
            raise GatewayRefusal(HTTPStatus.UNAUTHORIZED, "Jwt verification fails") from None
        if "exp" in claims and claims["exp"] < self.now() - CLOCK_SKEW_SECONDS:
            raise GatewayRefusal(HTTPStatus.UNAUTHORIZED, "Jwt is expired")
        if "nbf" in claims and claims["nbf"] > self.now() + CLOCK_SKEW_SECONDS:
            raise GatewayRefusal(HTTPStatus.UNAUTHORIZED, "Jwt not yet valid")
        audiences = claims.get("aud") or []
        audiences = [audiences] if isinstance(audiences, str) else audiences
        if rule.get("audiences") and not set(rule["audiences"]) & set(audiences):
            raise GatewayRefusal(HTTPStatus.UNAUTHORIZED, "Audiences in Jwt are not allowed")
        return rule, claims

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _proxy(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    headers = gateway.admit(urlsplit(self.path).path, dict(self.headers.items()))
                except GatewayRefusal as refusal:
                    self.send_response(refusal.status)
                    if refusal.status == HTTPStatus.FOUND:
                        self.send_header("Location", refusal.message)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(refusal.message.encode())
                    return
                upstream = urlsplit(gateway.upstream)
                conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
                conn.request(self.command, self.path, body=body,
                             headers={k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS})
                response = conn.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_HEADERS:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _proxy

        return Handler


class GatewayRefusal(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(f"{status.value} {message}")
        self.status, self.message = status, message
