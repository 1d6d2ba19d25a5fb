"""The alert webhook: Prometheus Alertmanager (webhook payload version 4) or a plain ``{"model", "reason"}``
POSTed to ``/alerts`` starts retraining through the same trigger decision as the drift pipeline (dedupe,
cooldown, one run in flight), for registered models on data under the allowed prefixes only (403 otherwise).
KServe's payload-logger CloudEvents (binary mode) POSTed to ``/inference-logs`` are stored as the logger's blobs
(:mod:`monitoring.inference_logs`) when the server has a log store.
Bearer token or timestamped HMAC-SHA256 auth for both, checked before the body is read; a read-only token of
its own for ``/metrics`` (Prometheus text: the records, see :mod:`monitoring.metrics`); 4xx with a reason for any
bad request, a generic 500 with an error id that the log line carries; ``/healthz``; one JSON log line per event
(never a credential). An ASGI app on uvicorn (:mod:`monitoring.http_server`) with body and per-request deadlines.
Knows nothing about KFP: the caller passes ``start``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import re
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable, Mapping, TextIO

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from data.errors import KfloopError
from data.redaction import redact, redact_text
from data.storage import StorageError, data_folder, holds_credentials, under_prefix
from monitoring.http_server import HttpServer, ServerLimits
from monitoring.inference_logs import InferenceLogError, InferenceLogWriter, record_from_cloudevent
from monitoring.metrics import exposition
from monitoring.trigger import DATA_HASH, MAX_MODEL_CHARS, TriggerPolicy, TriggerStore, maybe_trigger
from training.registry.versions import get_champion, registered_model

TOKEN_ENV = "KFLOOP_WEBHOOK_TOKEN"
HMAC_ENV = "KFLOOP_WEBHOOK_HMAC_SECRET"
METRICS_TOKEN_ENV = "KFLOOP_METRICS_TOKEN"
SIGNATURE_HEADER = "X-Kfloop-Signature"
"""``sha256=<hex HMAC-SHA256 of "<timestamp>." followed by the raw body>`` when HMAC auth is configured."""
TIMESTAMP_HEADER = "X-Kfloop-Timestamp"
"""The Unix time in seconds at which a signed request was signed (an integer), covered by the signature."""
MODEL_LABELS = ("model", "model_name")
Answer = tuple[HTTPStatus, dict[str, Any] | bytes]
"""A status and a JSON body (bytes: the Prometheus text of ``/metrics``)."""


@dataclass(kw_only=True, slots=True)
class WebhookAuth:
    """Who may post alerts (the webhook token or the HMAC signature; at least one must be set) and who may read
    ``/metrics`` (its own read token, which ``/alerts`` refuses, as ``/metrics`` refuses the webhook token)."""

    token: str = field(default="", repr=False)
    """Bearer token of ``/alerts`` (``Authorization: Bearer <token>``), from ``KFLOOP_WEBHOOK_TOKEN``."""
    hmac_secret: str = field(default="", repr=False)
    """HMAC-SHA256 key of the ``X-Kfloop-Signature`` header, from ``KFLOOP_WEBHOOK_HMAC_SECRET``."""
    replay_window_seconds: int = 300
    """A signed request is refused when its ``X-Kfloop-Timestamp`` is further than this from the server's clock
    (a replay inside the window repeats an alert the trigger has already decided: a duplicate, nothing starts)."""
    metrics_token: str = field(default="", repr=False)
    """Bearer token of ``/metrics`` (Prometheus: ``authorization: {credentials_file: ...}``), from
    ``KFLOOP_METRICS_TOKEN``; read-only: it starts nothing."""
    open_metrics: bool = False
    """``/metrics`` answers without auth (in-cluster scraping where a NetworkPolicy limits who reaches the port)."""

    def __post_init__(self) -> None:
        if not self.token and not self.hmac_secret:
            raise ValueError(f"the webhook needs auth: set {TOKEN_ENV} (bearer token) or {HMAC_ENV} (HMAC-SHA256 "
                             "key), e.g. from a Kubernetes Secret")
        if self.replay_window_seconds < 1:
            raise ValueError(f"replay_window_seconds={self.replay_window_seconds}: use a positive number of seconds, "
                             "e.g. 300")
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

    def check(self, headers: Mapping[str, str], now: float) -> str | None:
        """Before the body is read (``headers`` named in lower case): None when the request carries the webhook
        token, or a signature dated within the replay window (:meth:`verify` then checks it against the body);
        else the reason."""
        if _bearer(headers, self.token):
            return None
        if self.hmac_secret and headers.get(SIGNATURE_HEADER.lower()):
            signed_at = headers.get(TIMESTAMP_HEADER.lower(), "")
            if not re.fullmatch(r"[0-9]{1,12}", signed_at):
                return f"{SIGNATURE_HEADER} needs {TIMESTAMP_HEADER}: the Unix time in seconds it was signed at"
            if abs(now - int(signed_at)) > self.replay_window_seconds:
                return (f"{TIMESTAMP_HEADER} is {abs(now - int(signed_at)):.0f} s from the server's clock, outside "
                        f"the replay window of {self.replay_window_seconds} s: sign each request as it is sent")
            return None
        if _bearer(headers, self.metrics_token):
            return f"the metrics token ({METRICS_TOKEN_ENV}) only reads /metrics: post alerts with {TOKEN_ENV}"
        return "missing or invalid " + " / ".join(
            name for name, on in (("bearer token", self.token), (f"{SIGNATURE_HEADER} signature",
                                                                  self.hmac_secret)) if on)

    def verify(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """After :meth:`check` passed and the body is read: None when the request carries the webhook token or its
        signature matches ``"<timestamp>." + body``, else the reason."""
        if _bearer(headers, self.token):
            return None
        signed = headers[TIMESTAMP_HEADER.lower()].encode() + b"." + body
        expected = "sha256=" + hmac.new(self.hmac_secret.encode(), signed, hashlib.sha256).hexdigest()
        if hmac.compare_digest(headers.get(SIGNATURE_HEADER.lower(), "").encode(), expected.encode()):
            return None
        return f"invalid {SIGNATURE_HEADER} signature (HMAC-SHA256 of \"<{TIMESTAMP_HEADER}>.<body>\")"

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
    return bool(token) and hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {token}".encode())


@dataclass(kw_only=True, slots=True, frozen=True)
class Alert:
    """One retrain request, from an Alertmanager alert or a plain payload."""

    model: str
    reason: str
    data_key: str
    """What the dedupe keys on: ``data_md5`` when given, else the alert's identity (fingerprint or labels)."""
    dataset_uri: str = ""
    """Data to retrain on, when the alert names it (annotation or field ``dataset_uri``)."""

    def __post_init__(self) -> None:
        if not 0 < len(self.model) <= MAX_MODEL_CHARS:
            raise BadPayload(f"model: use the registered model name (1 to {MAX_MODEL_CHARS} characters)")
        if not DATA_HASH.fullmatch(self.data_key):
            raise BadPayload("data_md5: use the dataset's content hash, lowercase hex of at most 64 characters (e.g. "
                             "its DVC md5)")


class BadPayload(KfloopError, ValueError):
    """The body is not an alert payload; the message says what is wrong."""


def parse_body(body: bytes) -> list[Alert]:
    """The alerts of a request body (JSON, see :func:`parse_alerts`).

    Raises:
        BadPayload: not JSON (or nested too deeply to parse), or not an alert payload.
    """
    try:
        payload = json.loads(body)
    except RecursionError:
        raise BadPayload("the JSON is nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise BadPayload(f"not JSON: {err}") from None
    return parse_alerts(payload)


def parse_alerts(payload: Any) -> list[Alert]:
    """Firing alerts of an Alertmanager payload (version 4; resolved alerts are skipped), or the one plain
    ``{"model", "reason"[, "data_md5", "dataset_uri"]}`` request.

    Raises:
        BadPayload: neither form, a field of the wrong type, or an alert without a model label.
    """
    if not isinstance(payload, dict):
        raise BadPayload("expected a JSON object")
    if "alerts" in payload:
        if payload.get("version") != "4" or not isinstance(payload["alerts"], list):
            raise BadPayload('Alertmanager payloads must have "version": "4" and an "alerts" list')
        out = []
        for i, alert in enumerate(payload["alerts"]):
            if not isinstance(alert, dict):
                raise BadPayload(f"alerts[{i}]: expected an object")
            labels = _strings(alert.get("labels"), f"alerts[{i}].labels")
            notes = _strings(alert.get("annotations") or {}, f"alerts[{i}].annotations")
            if not isinstance(alert.get("fingerprint", ""), str):
                raise BadPayload(f"alerts[{i}].fingerprint: expected a string")
            if alert.get("status", payload.get("status")) != "firing":
                continue
            model = next((labels[k] for k in MODEL_LABELS if labels.get(k)), "")
            if not model:
                raise BadPayload(f"alerts[{i}]: no model label: add label 'model' (the registered model name) to "
                                 "the alerting rule")
            identity = alert.get("fingerprint") or json.dumps(labels, sort_keys=True)
            data_key = notes.get("data_md5") or "alert-" + hashlib.sha256(identity.encode()).hexdigest()[:16]
            reason = notes.get("summary") or notes.get("description") or labels.get("alertname", "alert")
            out.append(Alert(model=model, reason=reason, data_key=data_key,
                             dataset_uri=notes.get("dataset_uri", "")))
        return out
    model, reason = payload.get("model"), payload.get("reason")
    if not isinstance(model, str) or not model or not isinstance(reason, str) or not reason:
        raise BadPayload('expected an Alertmanager payload or {"model": NAME, "reason": TEXT} with non-empty strings')
    unknown = sorted(set(payload) - {"model", "reason", "data_md5", "dataset_uri"})
    if unknown:
        raise BadPayload(f"unknown field(s) {unknown}; allowed: model, reason, data_md5, dataset_uri")
    extra = _strings({k: payload[k] for k in ("data_md5", "dataset_uri") if k in payload}, "data_md5 / dataset_uri")
    data_key = extra.get("data_md5") or "alert-" + hashlib.sha256(f"{model}\n{reason}".encode()).hexdigest()[:16]
    return [Alert(model=model, reason=reason, data_key=data_key, dataset_uri=extra.get("dataset_uri", ""))]


def _strings(value: Any, where: str) -> dict[str, str]:
    """``value`` when it is an object of strings (as Alertmanager's labels and annotations are)."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise BadPayload(f"{where}: expected an object of strings")
    return value


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
            AlertRefused: the model is not registered, no data is named, the data lies outside the allowed
                prefixes (or, with none configured, the model has no champion whose lineage names its data), or its
                URI carries credentials.
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
        if holds_credentials(uri):
            raise AlertRefused(f"rule dataset_uri: {redact(uri)} carries credentials ('user:secret@'), which would "
                               "reach the run's parameters: name the data without them")
        return dataclasses.replace(alert, dataset_uri=uri)


class AlertWebhook:
    """What the server answers. ``start(alert)`` starts a training run and returns its id (raising
    :class:`monitoring.trigger.RunInFlight` when one is running); ``store_for(model)`` is the trigger state;
    ``metrics`` (e.g. a :class:`monitoring.metrics.RecordsCollector`) answers ``/metrics`` (None: no ``/metrics``);
    ``scope`` decides which alerts may start anything at all; ``inference_logs`` stores what ``/inference-logs``
    receives (None: no such route); ``clock`` is the time of trigger decisions and of signature timestamps."""

    def __init__(self, *, auth: WebhookAuth, scope: AlertScope, policy: TriggerPolicy, start: Callable[[Alert], str],
                 store_for: Callable[[str], TriggerStore], metrics: Collector | None = None,
                 inference_logs: InferenceLogWriter | None = None, max_body_bytes: int = 64 * 1024,
                 clock: Callable[[], float] = time.time, log: TextIO = sys.stderr):
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes={max_body_bytes}: use a positive byte count, e.g. 65536")
        self.auth, self.scope, self.policy, self.start = auth, scope, policy, start
        self.store_for, self.metrics, self.inference_logs = store_for, metrics, inference_logs
        self.max_body_bytes, self.clock, self.log = max_body_bytes, clock, log
        self._log_lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        """One structured log line."""
        line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, default=str) + "\n"
        with self._log_lock:
            self.log.write(line)
            self.log.flush()

    def screen(self, headers: Mapping[str, str]) -> Answer | None:
        """What a ``POST`` (``/alerts``, ``/inference-logs``) is answered before its body is read (auth, then its declared size), or None:
        read the body (at most ``max_body_bytes``) and call :meth:`alerts` or :meth:`inference_log`."""
        problem = self.auth.check(headers, self.clock())
        if problem:
            return HTTPStatus.UNAUTHORIZED, {"error": problem}
        length = headers.get("content-length")
        if length is None:
            return HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length is required"}
        digits = length.lstrip("0") or "0"  # h11 has refused any Content-Length but ASCII digits
        if len(digits) > len(str(self.max_body_bytes)) or int(digits) > self.max_body_bytes:
            return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {
                "error": f"body of {length} bytes exceeds the limit of {self.max_body_bytes}"}
        return None

    def alerts(self, headers: Mapping[str, str], body: bytes) -> Answer:
        """Answer a screened ``POST /alerts`` with its body: the decision on each alert (blocking: MLflow, KFP)."""
        problem = self.auth.verify(headers, body)
        if problem:
            return HTTPStatus.UNAUTHORIZED, {"error": problem}
        try:
            alerts = parse_body(body)
        except BadPayload as err:
            return HTTPStatus.BAD_REQUEST, {"error": f"bad payload: {err}"}
        try:  # every alert of the payload, before any starts: a refused one starts nothing
            alerts = [self.scope.admit(alert) for alert in alerts]
        except AlertRefused as err:
            return HTTPStatus.FORBIDDEN, {"error": str(err)}
        return HTTPStatus.OK, {"decisions": [self.decide(alert) for alert in alerts]}

    def inference_log(self, headers: Mapping[str, str], body: bytes) -> Answer:
        """Answer a screened ``POST /inference-logs``: store the logger's CloudEvent as its blob."""
        problem = self.auth.verify(headers, body)
        if problem:
            return HTTPStatus.UNAUTHORIZED, {"error": problem}
        assert self.inference_logs is not None
        try:
            record = record_from_cloudevent(dict(headers), body, "POST /inference-logs")
        except InferenceLogError as err:
            return HTTPStatus.BAD_REQUEST, {"error": str(err)}
        stored = self.inference_logs.write(record)
        self.emit("inference_log", id=record.id, kind=record.kind, stored=redact(stored))
        return HTTPStatus.OK, {"id": record.id, "kind": record.kind}

    def metrics_page(self, headers: Mapping[str, str]) -> Answer:
        """Answer ``GET /metrics`` (blocking: the records are read from MLflow)."""
        problem = self.auth.check_metrics(headers)
        if problem:
            return HTTPStatus.UNAUTHORIZED, {"error": problem}
        assert self.metrics is not None
        return HTTPStatus.OK, exposition(self.metrics)

    def decide(self, alert: Alert) -> dict[str, Any]:
        """Apply the trigger decision to one alert and start the run when it fires."""
        decision = maybe_trigger(self.store_for(alert.model), model=alert.model, data_hash=alert.data_key,
                                 now=self.clock(), policy=self.policy, start=lambda: self.start(alert))
        out = {"model": alert.model, "fire": decision.fire, "run_id": decision.run_id, "reason": decision.reason}
        self.emit("trigger", alert_reason=alert.reason, **out)
        return out

    def server(self, port: int, bind: str = "0.0.0.0", limits: ServerLimits = ServerLimits()) -> HttpServer:
        """The HTTP server on ``bind:port`` (port 0: any free port), listening; call ``serve_forever()``."""
        return HttpServer(WebhookApp(self, limits), port=port, bind=bind, limits=limits, log=self.emit)


class WebhookApp:
    """The ASGI app of ``webhook``: routes, reads a body within ``limits.body_timeout_seconds`` (408), does the
    blocking work on ``limits.workers`` threads within ``limits.request_timeout_seconds`` (504); ``/healthz``
    answers 503 while every worker is stuck past that deadline (the server cannot decide an alert)."""

    def __init__(self, webhook: AlertWebhook, limits: ServerLimits):
        self.webhook, self.limits = webhook, limits
        self.pool: ThreadPoolExecutor | None = None
        self._started: dict[int, float] = {}  # by worker thread: when its work in progress started (monotonic)
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        path = scope["path"]
        try:
            answer = await self.answer(scope["method"], path, headers, receive)
        except Exception as err:  # a failed start, an unusable state, MLflow down: the details in the log only
            error_id = uuid.uuid4().hex[:12]
            self.webhook.emit("error", error_id=error_id, path=path, error=redact_text(f"{type(err).__name__}: {err}"))
            answer = HTTPStatus.INTERNAL_SERVER_ERROR, {
                "error": f"internal error {error_id}: the server's log line with this error_id has the details",
                "error_id": error_id}
        if answer is None:  # the client left while sending its body
            return
        status, payload = answer
        if status >= 400:
            assert isinstance(payload, dict)
            self.webhook.emit("rejected", path=path, status=int(status), error=payload["error"],
                              remote=scope["client"][0] if scope.get("client") else "")
        text = isinstance(payload, bytes)
        data = payload if text else json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": int(status), "headers": [
            (b"content-type", (CONTENT_TYPE_LATEST if text else "application/json").encode()),
            (b"content-length", str(len(data)).encode()), *([(b"connection", b"close")] if status >= 400 else [])]})
        await send({"type": "http.response.body", "body": data})

    async def lifespan(self, receive: Callable, send: Callable) -> None:
        """The worker threads live as long as the server."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="kfloop-serve")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                assert self.pool is not None
                self.pool.shutdown(wait=False, cancel_futures=True)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def answer(self, method: str, path: str, headers: Mapping[str, str], receive: Callable) -> Answer | None:
        """The answer to one request; None when the client left before its body was read."""
        if method == "GET" and path == "/healthz":
            return self.health()
        if path == "/metrics" and self.webhook.metrics is not None:
            if method != "GET":
                return HTTPStatus.METHOD_NOT_ALLOWED, {"error": "GET /metrics"}
            return await self.blocking(lambda: self.webhook.metrics_page(headers))
        posts = {"/alerts": self.webhook.alerts}
        if self.webhook.inference_logs is not None:
            posts["/inference-logs"] = self.webhook.inference_log
        if path not in posts:
            return HTTPStatus.NOT_FOUND, {"error": f"no such path {path}; POST alerts to /alerts"}
        if method != "POST":
            return HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"POST to {path}"}
        early = self.webhook.screen(headers)
        if early is not None:
            return early
        try:
            async with asyncio.timeout(self.limits.body_timeout_seconds):
                body = await _read_body(receive)
        except TimeoutError:
            return HTTPStatus.REQUEST_TIMEOUT, {
                "error": f"the body did not arrive within {self.limits.body_timeout_seconds:g} s"}
        if body is None:
            return None
        return await self.blocking(lambda: posts[path](headers, body))

    async def blocking(self, work: Callable[[], Answer]) -> Answer:
        """``work()`` on a worker thread, within the request deadline."""
        assert self.pool is not None
        try:
            return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(self.pool, self._timed, work),
                                          self.limits.request_timeout_seconds)
        except TimeoutError:
            return HTTPStatus.GATEWAY_TIMEOUT, {
                "error": f"no answer within {self.limits.request_timeout_seconds:g} s (MLflow or the KFP API is slow); "
                         "the decision may still be made: see the log event 'trigger' before sending it again"}

    def _timed(self, work: Callable[[], Answer]) -> Answer:
        with self._lock:
            self._started[threading.get_ident()] = time.monotonic()
        try:
            return work()
        finally:
            with self._lock:
                del self._started[threading.get_ident()]

    def health(self) -> Answer:
        """200 while a worker can take an alert; 503 when every one is stuck past the request deadline."""
        now = time.monotonic()
        with self._lock:
            stuck = sum(now - started > self.limits.request_timeout_seconds for started in self._started.values())
        if stuck >= self.limits.workers:
            return HTTPStatus.SERVICE_UNAVAILABLE, {
                "error": f"all {stuck} workers have been busy for more than {self.limits.request_timeout_seconds:g} s "
                         "(MLflow or the KFP API does not answer): no alert can be decided"}
        return HTTPStatus.OK, {"status": "ok"}


async def _read_body(receive: Callable) -> bytes | None:
    """The request body (its size is bounded by the checked Content-Length, which h11 enforces); None when the
    client disconnected."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
