"""The fault-injecting proxy in front of the test ``mlflow server``: it forwards unchanged what no fault matches
and answers matching requests as an overloaded (503) or killed (dropped connection) server would. The real
server itself is exercised by tests/test_registry_server.py."""
from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cluster.mlflow_server import Fault, FaultProxy


@pytest.fixture
def upstream():
    """An echo server: answers each request with its method, path, body and a custom header as JSON."""
    seen: list[str] = []

    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _echo(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            seen.append(f"{self.command} {self.path}")
            data = json.dumps({"method": self.command, "path": self.path, "body": body,
                               "token": self.headers.get("Authorization")}).encode()
            self.send_response(201)
            self.send_header("X-Upstream", "echo")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _echo

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def request(url: str, method: str, path: str, body: str = "") -> http.client.HTTPResponse:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(method, path, body=body or None, headers={"Authorization": "Bearer t"})
    return conn.getresponse()


def test_unmatched_requests_pass_through_unchanged(upstream):
    url, seen = upstream
    proxy = FaultProxy(upstream=url, faults=[Fault(path="/runs/create")]).start()
    try:
        resp = request(proxy.url, "POST", "/api/2.0/mlflow/experiments/create?x=1", '{"name": "e"}')
        assert resp.status == 201 and resp.getheader("X-Upstream") == "echo"
        assert json.loads(resp.read()) == {"method": "POST", "path": "/api/2.0/mlflow/experiments/create?x=1",
                                           "body": '{"name": "e"}', "token": "Bearer t"}
        assert request(proxy.url, "GET", "/api/2.0/mlflow/runs/create").status == 201  # a GET: method differs
    finally:
        proxy.stop()
    assert seen == ["POST /api/2.0/mlflow/experiments/create?x=1", "GET /api/2.0/mlflow/runs/create"]


def test_a_503_fault_answers_without_reaching_the_server_and_counts_hits(upstream):
    url, seen = upstream
    fault = Fault(path="/runs/create", action="503")
    proxy = FaultProxy(upstream=url, faults=[fault]).start()
    try:
        assert [request(proxy.url, "POST", "/api/2.0/mlflow/runs/create").status for _ in range(2)] == [503, 503]
    finally:
        proxy.stop()
    assert fault.hits == 2 and seen == []


def test_a_drop_fault_closes_the_connection_without_an_answer(upstream):
    url, seen = upstream
    fault = Fault(path="/registered-models/alias", action="drop")
    proxy = FaultProxy(upstream=url, faults=[fault]).start()
    try:
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            request(proxy.url, "POST", "/api/2.0/mlflow/registered-models/alias")
        fault.path = "/never-matches"
        assert request(proxy.url, "POST", "/api/2.0/mlflow/registered-models/alias").status == 201
    finally:
        proxy.stop()
    assert fault.hits == 1 and seen == ["POST /api/2.0/mlflow/registered-models/alias"]
