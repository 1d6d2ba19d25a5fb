"""Whether ``kfloop serve`` holds under load (issue 41): slow connections held open on loopback while authorised
alerts are still answered within their deadline, and what those answers take.

    .venv/bin/python benchmarks/webhook_load.py [--slow 300] [--alerts 200] [--out benchmarks/results/hardening.json]

The slow connections, a third of each kind: half-sent headers; unauthenticated POSTs that announce 65536 bytes
and send a few (the token is checked before the body is read: each must be answered 401 at once); authorised POSTs
that announce 65536 bytes and send a few (held until the body deadline). With them open, ``--alerts`` authorised
alerts are posted from 4 clients. The webhook runs in this process (uvicorn on a thread) on a temp workdir: MLflow on
SQLite, the trigger state in a file, a ``start`` that only counts, so the figures are the server's, not KFP's. The
result is the ``webhook`` key of the JSON file (other keys are kept: the hardening report has other parts).
"""
from __future__ import annotations

import argparse
import http.client
import io
import json
import secrets
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from data.fileio import atomic_write_json
from data.settings import activate, load_environment
from monitoring.http_server import HttpServer, ServerLimits
from monitoring.trigger import TriggerPolicy, TriggerStore
from monitoring.webhook import Alert, AlertScope, AlertWebhook, WebhookAuth
from training.registry.versions import ensure_registered_model

MODEL = "churn"
SLOW_KINDS = ("half-sent headers", "unauthenticated half-sent body", "authorised half-sent body")


class LoadedWebhook:
    """A webhook serving on loopback with the bearer token ``token`` (and, when ``hmac_secret`` is given, HMAC
    signatures keyed by it); ``started`` lists the alerts it started runs for (``start(alert)``, when given, is called
    first); alerts may train on data under ``allowed_prefix``. Needs an activated kfloop environment (MLflow) and
    ``workdir`` for the trigger state."""

    def __init__(self, workdir: Path, limits: ServerLimits, start: Callable[[Alert], object] = lambda alert: None,
                 hmac_secret: str = "", allowed_prefix: str = "s3://bucket/"):
        ensure_registered_model(MODEL)
        self.token, self.started, self.log, self.on_start = secrets.token_hex(16), [], io.StringIO(), start
        self.webhook = AlertWebhook(
            auth=WebhookAuth(token=self.token, hmac_secret=hmac_secret),
            scope=AlertScope(allowed_data_prefixes=(allowed_prefix,),
                             default_dataset_uri=f"{allowed_prefix}current.parquet"),
            policy=TriggerPolicy(cooldown_seconds=3600), start=self._start,
            store_for=lambda model: TriggerStore.in_workdir(workdir, model), log=self.log)
        self.server: HttpServer = self.webhook.server(0, "127.0.0.1", limits)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _start(self, alert: Alert) -> str:
        self.on_start(alert)
        self.started.append(alert)
        return f"run-{len(self.started)}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def open_slow(port: int, kind: str, token: str) -> socket.socket:
    """A connection of ``kind`` (:data:`SLOW_KINDS`) left unfinished."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = b"POST /alerts HTTP/1.1\r\nHost: kfloop\r\n"
    if kind == SLOW_KINDS[0]:
        sock.sendall(head + b"Content-Le")
    else:
        auth = f"Authorization: Bearer {token}\r\n".encode() if kind == SLOW_KINDS[2] else b""
        sock.sendall(head + auth + b"Content-Type: application/json\r\nContent-Length: 65536\r\n\r\n{\"model\": ")
    return sock


def status_of(sock: socket.socket) -> int:
    """The status code of the answer on ``sock`` (blocking up to the socket's timeout); 0 when it was closed."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(1024)
        if not chunk:
            return 0
        data += chunk
    return int(data.split(b" ", 2)[1])


def held(sock: socket.socket) -> bool:
    """The server has neither answered nor closed ``sock`` (which is left non-blocking)."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)  # an answer, or b"" after a close
    except BlockingIOError:
        return True
    except ConnectionResetError:
        pass
    return False


def exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """Status and body of one raw HTTP request (0 when the server closed without answering)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return (int(head.split(b" ", 2)[1]) if head else 0), body


def post_alert(port: int, token: str, body: dict[str, Any]) -> tuple[int, float]:
    """Status and seconds of one authorised alert on a fresh connection."""
    began = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/alerts", body=json.dumps(body), headers={"Authorization": f"Bearer {token}",
                                                                      "Content-Type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        return answer.status, time.perf_counter() - began
    finally:
        conn.close()


def run_load(port: int, token: str, *, slow: int, alerts: int) -> dict[str, Any]:
    """Open ``slow`` slow connections, post ``alerts`` authorised alerts while they are open, and report."""
    slow_socks: dict[str, list[socket.socket]] = {kind: [] for kind in SLOW_KINDS}
    unauthenticated_seconds = []
    try:
        for i in range(slow):
            kind = SLOW_KINDS[i % 3]
            began = time.perf_counter()
            slow_socks[kind].append(open_slow(port, kind, token))
            if kind == SLOW_KINDS[1]:
                assert status_of(slow_socks[kind][-1]) == 401, "an unauthenticated POST was not refused at once"
                unauthenticated_seconds.append(time.perf_counter() - began)
        with ThreadPoolExecutor(4) as clients:
            answers = list(clients.map(lambda i: post_alert(port, token, {
                "model": MODEL, "reason": "load", "data_md5": f"{i:032x}"}), range(alerts)))
        still_held = sum(held(s) for kind in (SLOW_KINDS[0], SLOW_KINDS[2]) for s in slow_socks[kind])
    finally:
        for sock in (s for socks in slow_socks.values() for s in socks):
            sock.close()
    seconds = sorted(s for _, s in answers)
    cuts = statistics.quantiles(seconds, n=100, method="inclusive")
    return {"slow_connections": slow, "held_open": still_held,
            "unauthenticated_401": len(unauthenticated_seconds),
            "unauthenticated_401_max_seconds": round(max(unauthenticated_seconds, default=0.0), 4),
            "alerts": alerts, "alerts_answered": sum(status == 200 for status, _ in answers),
            "p50_seconds": round(cuts[49], 4), "p99_seconds": round(cuts[98], 4), "max_seconds": round(seconds[-1], 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=300, help="slow connections held open (default: %(default)s)")
    parser.add_argument("--alerts", type=int, default=200, help="authorised alerts posted (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/hardening.json"))
    args = parser.parse_args(argv)

    limits = ServerLimits(header_timeout_seconds=120, body_timeout_seconds=120)  # outlast the run: held throughout
    with tempfile.TemporaryDirectory() as tmp:
        activate(load_environment(Path(tmp) / "workdir"))
        hook = LoadedWebhook(Path(tmp) / "workdir", limits)
        try:
            result = run_load(hook.port, hook.token, slow=args.slow, alerts=args.alerts)
        finally:
            hook.close()
    result |= {"request_timeout_seconds": limits.request_timeout_seconds, "runs_started": len(hook.started),
               "within_deadline": result["alerts_answered"] == args.alerts
               and result["max_seconds"] < limits.request_timeout_seconds}
    print(f"{'slow open':>9} {'held':>5} {'401 at once':>11} {'alerts':>6} {'answered':>8} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'max ms':>7} {'runs':>4}")
    print(f"{result['slow_connections']:>9} {result['held_open']:>5} {result['unauthenticated_401']:>11} "
          f"{result['alerts']:>6} {result['alerts_answered']:>8} {result['p50_seconds'] * 1000:>7.1f} "
          f"{result['p99_seconds'] * 1000:>7.1f} {result['max_seconds'] * 1000:>7.1f} {result['runs_started']:>4}")
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    atomic_write_json(args.out, {**report, "webhook": result})
    print(f"wrote {args.out}")
    return 0 if result["within_deadline"] else 1


if __name__ == "__main__":
    sys.exit(main())
