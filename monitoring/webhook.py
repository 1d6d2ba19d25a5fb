"""The alert webhook: Prometheus Alertmanager (webhook payload version 4) or a plain ``{"model", "reason"}``
POSTed to ``/alerts`` starts retraining through the same trigger decision as the drift pipeline (dedupe,
cooldown, one run in flight), for registered models on data under the allowed prefixes only (403 otherwise).
Bearer token or HMAC-SHA256 auth for ``/alerts``, a read-only token of its own for ``/metrics`` (Prometheus text:
the records, see :mod:`monitoring.metrics`), a body size bound, 4xx with a reason, ``/healthz``, one JSON log line
per event (never a credential). Knows nothing about KFP: the caller passes ``start``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import sys
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping, TextIO

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from data.errors import KfloopError
from data.storage import StorageError, data_folder, redact, under_prefix
from monitoring.metrics import exposition
from monitoring.trigger import TriggerPolicy, TriggerStore, maybe_trigger
from training.registry.versions import get_champion, registered_model

TOKEN_ENV = "KFLOOP_WEBHOOK_TOKEN"
HMAC_ENV = "KFLOOP_WEBHOOK_HMAC_SECRET"
METRICS_TOKEN_ENV = "KFLOOP_METRICS_TOKEN"
SIGNATURE_HEADER = "X-Kfloop-Signature"
"""``sha256=<hex HMAC-SHA256 of the raw body>`` when HMAC auth is configured."""
MODEL_LABELS = ("model", "model_name")


@dataclass(kw_only=True, slots=True)
class WebhookAuth:
    """Who may post alerts (the webhook token or the HMAC signature; at least one must be set) and who may read
    ``/metrics`` (its own read token, which ``/alerts`` refuses, as ``/metrics`` refuses the webhook token)."""

    token: str = field(default="", repr=False)
    """Bearer token of ``/alerts`` (``Authorization: Bearer <token>``), from ``KFLOOP_WEBHOOK_TOKEN``."""
    hmac_secret: str = field(default="", repr=False)
    """HMAC-SHA256 key of the ``X-Kfloop-Signature`` header, from ``KFLOOP_WEBHOOK_HMAC_SECRET``."""
    metrics_token: str = field(default="", repr=False)
    """Bearer token of ``/metrics`` (Prometheus: ``authorization: {credentials_file: ...}``), from
    ``KFLOOP_METRICS_TOKEN``; read-only: it starts nothing."""
    open_metrics: bool = False
    """``/metrics`` answers without auth (in-cluster scraping where a NetworkPolicy limits who reaches the port)."""

    def __post_init__(self) -> None:
        if not self.token and not self.hmac_secret:
            raise ValueError(f"the webhook needs auth: set {TOKEN_ENV} (bearer token) or {HMAC_ENV} (HMAC-SHA256 "
                             "key), e.g. from a Kubernetes Secret")
        if self.metrics_token and self.metrics_token in (self.token, self.hmac_secret):
            raise ValueError(f"{METRICS_TOKEN_ENV} equals the webhook's token or HMAC key: give /metrics its own "
                             "token, so whoever scrapes metrics cannot start training")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, open_metrics: bool = False) -> WebhookAuth:
        """Read the tokens and HMAC key from ``environ`` (the only place they come from).

        Raises:
            ValueError: neither the webhook token nor the HMAC key is set, or the metrics token repeats one.
        """
        return cls(token=environ.get(TOKEN_ENV, ""), hmac_secret=environ.get(HMAC_ENV, ""),
                   metrics_token=environ.get(METRICS_TOKEN_ENV, ""), open_metrics=open_metrics)

    def check(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """None when the request may post alerts, else the reason."""
        if _bearer(headers, self.token):
            return None
        if self.hmac_secret:
            expected = "sha256=" + hmac.new(self.hmac_secret.encode(), body, hashlib.sha256).hexdigest()
            if hmac.compare_digest(headers.get(SIGNATURE_HEADER, "").encode(), expected.encode()):
                return None
        if _bearer(headers, self.metrics_token):
            return f"the metrics token ({METRICS_TOKEN_ENV}) only reads /metrics: post alerts with {TOKEN_ENV}"
        return "missing or invalid " + " / ".join(
            name for name, on in (("bearer token", self.token), (f"{SIGNATURE_HEADER} signature",
                                                                  self.hmac_secret)) if on)

    def check_metrics(self, headers: Mapping[str, str]) -> str | None:
        """None when the request may read ``/metrics``, else the reason."""
        if self.open_metrics or _bearer(headers, self.metrics_token):
            return None
        if not self.metrics_token:
            return (f"/metrics takes its own bearer token: set {METRICS_TOKEN_ENV}, or open /metrics for in-cluster "
                    "scraping (kfloop serve --open-metrics)")
        if _bearer(headers, self.token):
            return f"the webhook token ({TOKEN_ENV}) only posts alerts: scrape /metrics with {METRICS_TOKEN_ENV}"
        return "missing or invalid bearer token"


def _bearer(headers: Mapping[str, str], token: str) -> bool:
    """The request carries ``token`` (a configured one) as its bearer token."""
    return bool(token) and hmac.compare_digest(headers.get("Authorization", "").encode(), f"Bearer {token}".encode())


@dataclass(kw_only=True, slots=True, frozen=True)
class Alert:
    """One retrain request, from an Alertmanager alert or a plain payload."""

    model: str
    reason: str
    data_key: str
    """What the dedupe keys on: ``data_md5`` when given, else the alert's identity (fingerprint or labels)."""
    dataset_uri: str = ""
    """Data to retrain on, when the alert names it (annotation or field ``dataset_uri``)."""


class BadPayload(KfloopError, ValueError):
    """The body is not an alert payload; the message says what is wrong."""


def parse_alerts(payload: Any) -> list[Alert]:
    """Firing alerts of an Alertmanager payload (version 4; resolved alerts are skipped), or the one plain
    ``{"model", "reason"[, "data_md5", "dataset_uri"]}`` request.

    Raises:
        BadPayload: neither form, or an alert without a model label.
    """
    if not isinstance(payload, dict):
        raise BadPayload("expected a JSON object")
    if "alerts" in payload:
        if payload.get("version") != "4" or not isinstance(payload["alerts"], list):
            raise BadPayload('Alertmanager payloads must have "version": "4" and an "alerts" list')
        out = []
        for i, alert in enumerate(payload["alerts"]):
            if not isinstance(alert, dict) or not isinstance(alert.get("labels"), dict):
                raise BadPayload(f"alerts[{i}]: expected an object with a labels object")
            if alert.get("status", payload.get("status")) != "firing":
                continue
            labels, notes = alert["labels"], alert.get("annotations") or {}
            model = next((labels[k] for k in MODEL_LABELS if labels.get(k)), "")
            if not isinstance(model, str) or not model:
                raise BadPayload(f"alerts[{i}]: no model label: add label 'model' (the registered model name) to "
                                 "the alerting rule")
            identity = alert.get("fingerprint") or json.dumps(labels, sort_keys=True)
            data_key = notes.get("data_md5") or "alert-" + hashlib.sha256(str(identity).encode()).hexdigest()[:16]
            reason = notes.get("summary") or notes.get("description") or labels.get("alertname", "alert")
            out.append(Alert(model=model, reason=str(reason), data_key=str(data_key),
                             dataset_uri=str(notes.get("dataset_uri", ""))))
        return out
    model, reason = payload.get("model"), payload.get("reason")
    if not isinstance(model, str) or not model or not isinstance(reason, str) or not reason:
        raise BadPayload('expected an Alertmanager payload or {"model": NAME, "reason": TEXT} with non-empty strings')
    unknown = sorted(set(payload) - {"model", "reason", "data_md5", "dataset_uri"})
    if unknown:
        raise BadPayload(f"unknown field(s) {unknown}; allowed: model, reason, data_md5, dataset_uri")
    data_key = payload.get("data_md5") or "alert-" + hashlib.sha256(f"{model}\n{reason}".encode()).hexdigest()[:16]
    return [Alert(model=model, reason=reason, data_key=str(data_key), dataset_uri=str(payload.get("dataset_uri", "")))]


class AlertRefused(KfloopError, PermissionError):
    """An alert asks for training the webhook may not start (403); the message names the rule."""


@dataclass(kw_only=True, slots=True)
class AlertScope:
    """What an alert may start training on: a model registered in MLflow, on data under ``allowed_data_prefixes``
    (``None``: the folder of that model's champion's training data, read from the champion's lineage)."""

    allowed_data_prefixes: tuple[str, ...] | None = None
    """``trigger.allowed_data_prefixes`` (:class:`monitoring.trigger.TriggerPolicy`)."""
    default_dataset_uri: str = ""
    """The data of an alert that names none (``dataset_uri`` in kfloop.yaml)."""

    def admit(self, alert: Alert) -> Alert:
        """``alert`` with its data filled in (its own ``dataset_uri``, else the default), when it may start training.

        Raises:
            AlertRefused: the model is not registered, no data is named, or the data lies outside the allowed
                prefixes (or, with none configured, the model has no champion whose lineage names its data).
            mlflow.exceptions.MlflowException: MLflow could not be read.
        """
        if registered_model(alert.model) is None:
            raise AlertRefused(f"rule registered_model: {alert.model!r} is not a registered model in MLflow; an "
                               "alert may only retrain a model kfloop registered (check the alert's model label)")
        uri = alert.dataset_uri or self.default_dataset_uri
        if not uri:
            raise AlertRefused(f"rule dataset_uri: the alert for {alert.model!r} names no dataset_uri and none is "
                               "configured: add annotation dataset_uri to the alert or set dataset_uri in kfloop.yaml")
        prefixes, source = self.allowed_data_prefixes, "trigger.allowed_data_prefixes"
        if prefixes is None:
            champion = get_champion(alert.model)
            if champion is None or not champion.record.data_uri:
                raise AlertRefused(f"rule trigger.allowed_data_prefixes: none is set and {alert.model!r} has no "
                                   "champion whose lineage names its training data: set trigger.allowed_data_prefixes "
                                   "to the folders alerts may train on")
            source += " (unset: the folder of the champion's training data)"
            try:
                prefixes = (data_folder(champion.record.data_uri),)
            except StorageError as err:
                raise AlertRefused(f"rule {source}: {err}") from None
        try:
            allowed = any(under_prefix(uri, prefix) for prefix in prefixes)
        except StorageError as err:
            raise AlertRefused(f"rule dataset_uri: {err}") from None
        if not allowed:
            raise AlertRefused(f"rule {source}: {redact(uri)} is not under {[redact(p) for p in prefixes]}; add "
                               "its folder to trigger.allowed_data_prefixes if alerts may train on it")
        return dataclasses.replace(alert, dataset_uri=uri)


class AlertWebhook:
    """The HTTP server. ``start(alert)`` starts a training run and returns its id (raising
    :class:`monitoring.trigger.RunInFlight` when one is running); ``store_for(model)`` is the trigger state;
    ``metrics`` (e.g. a :class:`monitoring.metrics.RecordsCollector`) answers ``/metrics`` (None: no ``/metrics``);
    ``scope`` decides which alerts may start anything at all."""

    def __init__(self, *, auth: WebhookAuth, scope: AlertScope, policy: TriggerPolicy, start: Callable[[Alert], str],
                 store_for: Callable[[str], TriggerStore], metrics: Collector | None = None,
                 max_body_bytes: int = 64 * 1024, clock: Callable[[], float] = time.time, log: TextIO = sys.stderr):
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes={max_body_bytes}: use a positive byte count, e.g. 65536")
        self.auth, self.scope, self.policy, self.start = auth, scope, policy, start
        self.store_for, self.metrics = store_for, metrics
        self.max_body_bytes, self.clock, self.log = max_body_bytes, clock, log

    def emit(self, event: str, **fields: Any) -> None:
        """One structured log line."""
        self.log.write(json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, default=str) + "\n")
        self.log.flush()

    def handle(self, method: str, path: str, headers: Mapping[str, str], read_body: Callable[[int], bytes]
               ) -> tuple[HTTPStatus, dict[str, Any] | bytes]:
        """Answer one request: status and JSON body (bytes: the Prometheus text of ``/metrics``)."""
        if method == "GET" and path == "/healthz":
            return HTTPStatus.OK, {"status": "ok"}
        if path == "/metrics" and self.metrics is not None:
            if method != "GET":
                return HTTPStatus.METHOD_NOT_ALLOWED, {"error": "GET /metrics"}
            problem = self.auth.check_metrics(headers)
            if problem:
                return HTTPStatus.UNAUTHORIZED, {"error": problem}
            return HTTPStatus.OK, exposition(self.metrics)
        if path != "/alerts":
            return HTTPStatus.NOT_FOUND, {"error": f"no such path {path}; POST alerts to /alerts"}
        if method != "POST":
            return HTTPStatus.METHOD_NOT_ALLOWED, {"error": "POST alerts to /alerts"}
        length = headers.get("Content-Length")
        if length is None or not length.isdigit():
            return HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length is required"}
        if int(length) > self.max_body_bytes:
            return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {
                "error": f"body of {length} bytes exceeds the limit of {self.max_body_bytes}"}
        body = read_body(int(length))
        problem = self.auth.check(headers, body)
        if problem:
            return HTTPStatus.UNAUTHORIZED, {"error": problem}
        try:
            alerts = parse_alerts(json.loads(body))
        except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError and BadPayload are ValueErrors
            return HTTPStatus.BAD_REQUEST, {"error": f"bad payload: {err}"}
        try:  # every alert of the payload, before any starts: a refused one starts nothing
            alerts = [self.scope.admit(alert) for alert in alerts]
        except AlertRefused as err:
            return HTTPStatus.FORBIDDEN, {"error": str(err)}
        return HTTPStatus.OK, {"decisions": [self.decide(alert) for alert in alerts]}

    def decide(self, alert: Alert) -> dict[str, Any]:
        """Apply the trigger decision to one alert and start the run when it fires."""
        decision = maybe_trigger(self.store_for(alert.model), model=alert.model, data_hash=alert.data_key,
                                 now=self.clock(), policy=self.policy, start=lambda: self.start(alert))
        out = {"model": alert.model, "fire": decision.fire, "run_id": decision.run_id, "reason": decision.reason}
        self.emit("trigger", alert_reason=alert.reason, **out)
        return out

    def server(self, port: int, bind: str = "0.0.0.0") -> ThreadingHTTPServer:
        """A threaded HTTP server on ``bind:port`` (port 0: any free port); call ``serve_forever()``."""
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    status, payload = webhook.handle(self.command, path, self.headers, self.rfile.read)
                except Exception as err:  # a failed start or an unusable state: 500 with the reason, logged
                    webhook.emit("error", path=path, error=f"{type(err).__name__}: {err}")
                    status, payload = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(err).__name__}: {err}"}
                if status >= 400:
                    webhook.emit("rejected", path=path, status=int(status), error=payload.get("error"),
                                 remote=self.client_address[0])
                text = isinstance(payload, bytes)
                data = payload if text else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status >= 400:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *args: Any) -> None:  # the structured lines above replace the access log
                pass

        return ThreadingHTTPServer((bind, port), Handler)
