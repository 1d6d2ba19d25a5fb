"""A real ``mlflow server`` process for tests, and a fault-injecting HTTP proxy in front of it.

The server runs in its own process group (it spawns workers) and is stopped as a group. The proxy forwards every
request to the server unchanged, except requests matching a rule: those get a 503 or a dropped connection,
which is what a client sees from an overloaded or killed server.
"""
from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cluster.server_process import free_port, start_server, stop_group

START_TIMEOUT_S = 120
"""``mlflow server`` needs 14-30 s to answer /health on an idle machine; the CI box is busy."""


@dataclass(kw_only=True)
class MlflowServer:
    """A running ``mlflow server`` on SQLite with proxied artifacts under ``root`` (or ``artifacts_destination``)."""

    root: Path
    artifacts_destination: str = ""
    """Where the server keeps artifacts, e.g. ``s3://bucket/mlartifacts``; default ``root/artifacts``."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the server process (e.g. the S3 endpoint and keys)."""
    url: str = ""
    process: subprocess.Popen | None = None

    def start(self) -> "MlflowServer":
        """Start the server and wait for /health.

        Raises:
            RuntimeError: it did not answer within START_TIMEOUT_S (its log is in the message).
        """
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = start_server(
            [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", self.artifacts_destination or str(self.root / "artifacts")],
            health_url=f"{self.url}/health", log_path=self.root / "server.log",
            env={**os.environ, **self.env, "MLFLOW_ENABLE_TELEMETRY": "false"}, timeout_s=START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        """Stop the server's whole process group."""
        stop_group(self.process)


@dataclass(kw_only=True)
class Fault:
    """Answer requests whose path contains ``path`` (and method ``method``) with ``action``."""

    path: str
    method: str = "POST"
    action: str = "503"
    """``503`` (Service Unavailable) or ``drop`` (close the connection without answering)."""
    hits: int = 0
    """How many requests this fault answered."""


@dataclass(kw_only=True)
class FaultProxy:
    """HTTP proxy to ``upstream`` injecting :class:`Fault`\\ s; ``url`` is what clients use."""

    upstream: str
    faults: list[Fault] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> "FaultProxy":
        """Listen on a port the OS picks and forward in a daemon thread."""
        proxy = self
        host, port = self.upstream.removeprefix("http://").split(":")

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                fault = next((f for f in proxy.faults if f.path in self.path and f.method == self.command), None)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if fault is not None:
                    fault.hits += 1
                    if fault.action == "drop":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers={**headers, "Host": f"{host}:{port}"})
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
