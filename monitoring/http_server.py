"""An ASGI app on uvicorn that slow or hostile clients cannot tie up: a connection cap, a deadline for a request's
headers (uvicorn has none: encode/uvicorn#157; a connection that trickles them would be held forever), a header
size cap, a keep-alive timeout and a bounded graceful shutdown. The body and per-request deadlines are the app's
(:class:`ServerLimits` holds them all). One JSON log line per server event, through ``log(event, **fields)``."""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from data.redaction import redact_text

Log = Callable[..., None]


@dataclass(kw_only=True, slots=True, frozen=True)
class ServerLimits:
    """How long and how much a client may take from ``kfloop serve``."""

    max_connections: int = 512
    """Open connections (and requests in progress) beyond which a request is answered 503 at once (uvicorn's
    ``limit_concurrency``)."""
    header_timeout_seconds: float = 10.0
    """A connection sends a request's headers within this many seconds of opening, or of its previous answer, or
    it is closed."""
    max_header_bytes: int = 16 * 1024
    """Request line and headers larger than this are refused with 400 (h11's ``max_incomplete_event_size``)."""
    body_timeout_seconds: float = 10.0
    """An accepted request's body arrives within this many seconds, or it is answered 408."""
    request_timeout_seconds: float = 30.0
    """The work of one request (MLflow, KFP) is done within this many seconds, or it is answered 504."""
    keep_alive_seconds: int = 5
    """An idle kept-alive connection is closed after this many seconds (uvicorn's ``timeout_keep_alive``)."""
    workers: int = 4
    """Threads doing the requests' blocking work (MLflow, KFP); ``/healthz`` fails when each is stuck past
    ``request_timeout_seconds``."""

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_header_bytes", "keep_alive_seconds", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: use a positive number")
        for name in ("header_timeout_seconds", "body_timeout_seconds", "request_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)}: use a positive number of seconds, e.g. 10")


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol that closes a connection whose request headers are not complete within
    ``header_timeout`` seconds of its opening or of its previous answer (``cycle``: the request in progress)."""

    def __init__(self, *args: Any, header_timeout: float, log: Log, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.header_timeout, self.log = header_timeout, log
        self.header_timer: asyncio.TimerHandle | None = None

    def arm_header_deadline(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        self.header_timer = self.loop.call_later(self.header_timeout, self.header_deadline_passed)

    def header_deadline_passed(self) -> None:
        waiting_for_headers = self.cycle is None or self.cycle.response_complete
        if waiting_for_headers and not self.transport.is_closing():
            self.log("timeout", stage="headers", seconds=self.header_timeout,
                     remote=self.client[0] if self.client else "")
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        super().connection_lost(exc)


class _LogLines(logging.Handler):
    """uvicorn's own messages (a malformed request, the connection cap reached) as JSON lines, redacted."""

    def __init__(self, log: Log):
        super().__init__(logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log("server", level=record.levelname.lower(), message=redact_text(record.getMessage()))


class HttpServer:
    """``app`` on uvicorn, listening on ``bind:port`` from construction (port 0: a free one, in
    ``server_address``); ``serve_forever()`` blocks until ``shutdown()`` (from another thread) or SIGINT/SIGTERM
    (the socketserver interface, so callers need not know uvicorn)."""

    def __init__(self, app: Any, *, port: int, bind: str, limits: ServerLimits, log: Log):
        self.log = log
        self.socket = socket.create_server((bind, port), family=socket.AF_INET6 if ":" in bind else socket.AF_INET)
        self.server_address = self.socket.getsockname()
        config = uvicorn.Config(
            app, http=partial(HeaderDeadlineProtocol, header_timeout=limits.header_timeout_seconds, log=log),
            loop="asyncio", lifespan="on", limit_concurrency=limits.max_connections,
            timeout_keep_alive=limits.keep_alive_seconds, h11_max_incomplete_event_size=limits.max_header_bytes,
            timeout_graceful_shutdown=int(limits.request_timeout_seconds) + 1, log_config=None, log_level="warning",
            access_log=False, server_header=False, proxy_headers=False)
        self.server = uvicorn.Server(config)
        self.serving, self.stopped = threading.Event(), threading.Event()

    def serve_forever(self) -> None:
        handler, logger = _LogLines(self.log), logging.getLogger("uvicorn.error")
        logger.addHandler(handler)
        self.serving.set()
        try:
            self.server.run(sockets=[self.socket])  # closes the socket when it stops
        finally:
            logger.removeHandler(handler)
            self.stopped.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait for it: no new connections, requests in progress finish (within their
        deadlines)."""
        self.server.should_exit = True
        if self.serving.is_set():
            self.stopped.wait()

    def server_close(self) -> None:
        """Close the listening socket (``serve_forever`` closes it too)."""
        self.socket.close()
