"""``kfloop serve`` under load and hostile input (issue 41 items 1 and 11), over real sockets on loopback: slow
connections are cut at their deadlines and cannot starve authorised alerts, the token is checked before a body is
read, malformed alerts answer 4xx (never 500), a 500 carries only an error id, ``/healthz`` fails while no alert
can be decided. The load driver is the benchmark's (``benchmarks/webhook_load.py``)."""
from __future__ import annotations

import json
import socket
import threading

import pytest
from polling import wait_for

from benchmarks.webhook_load import MODEL, LoadedWebhook, open_slow, post_alert, run_load, status_of
from benchmarks.webhook_load import exchange as raw
from monitoring.http_server import ServerLimits


def post(hook: LoadedWebhook, body: bytes, *, extra: bytes = b"", length: bytes | None = None) -> tuple[int, bytes]:
    return raw(hook.port, b"POST /alerts HTTP/1.1\r\nHost: kfloop\r\nConnection: close\r\n"
               + f"Authorization: Bearer {hook.token}\r\n".encode() + extra
               + b"Content-Length: " + (str(len(body)).encode() if length is None else length) + b"\r\n\r\n" + body)


def events(hook: LoadedWebhook, name: str) -> list[dict]:
    return [line for line in map(json.loads, hook.log.getvalue().splitlines()) if line["event"] == name]


@pytest.fixture
def served(isolated_env):
    """Start webhooks on this test's workdir; each is closed after the test."""
    hooks = []

    def serve(limits: ServerLimits = ServerLimits(), **kw) -> LoadedWebhook:
        hooks.append(LoadedWebhook(isolated_env.workdir, limits, **kw))
        return hooks[-1]

    yield serve
    for hook in hooks:
        hook.close()


def alertmanager(**alert) -> dict:
    return {"version": "4", "status": "firing", "alerts": [{"status": "firing", "labels": {"model": MODEL},
                                                            "annotations": {"summary": "drift"}, **alert}]}


def test_authorised_alerts_are_answered_while_300_slow_connections_are_open(served):
    limits = ServerLimits(header_timeout_seconds=60, body_timeout_seconds=60, request_timeout_seconds=5)
    hook = served(limits)

    result = run_load(hook.port, hook.token, slow=300, alerts=40)

    assert result["held_open"] == 200, result  # the half-sent headers and authorised half-sent bodies
    assert result["unauthenticated_401"] == 100 and result["unauthenticated_401_max_seconds"] < 2, result
    assert result["alerts_answered"] == 40 and result["max_seconds"] < limits.request_timeout_seconds, result
    assert len(hook.started) == 1  # 40 alerts inside one cooldown: one run
    assert post_alert(hook.port, "", {})[0] == 401 and raw(hook.port, b"GET /healthz HTTP/1.1\r\nHost: k\r\n"
                                                             b"Connection: close\r\n\r\n") == (200, b'{"status": "ok"}')


def test_an_unauthenticated_post_announcing_64k_is_refused_before_its_body(served):
    hook = served()
    with open_slow(hook.port, "unauthenticated half-sent body", hook.token) as sock:
        sock.settimeout(5)  # answered at once, not when a body that never comes has arrived
        assert status_of(sock) == 401
    with socket.create_connection(("127.0.0.1", hook.port), timeout=5) as sock:  # no 100 Continue before the token
        sock.sendall(b"POST /alerts HTTP/1.1\r\nHost: k\r\nExpect: 100-continue\r\nContent-Length: 65536\r\n\r\n")
        assert status_of(sock) == 401
    assert not hook.started


def test_slow_clients_are_cut_at_their_deadlines(served):
    hook = served(ServerLimits(header_timeout_seconds=0.5, body_timeout_seconds=0.5))
    headers = open_slow(hook.port, "half-sent headers", hook.token)
    body = open_slow(hook.port, "authorised half-sent body", hook.token)
    with headers, body:
        headers.settimeout(30)
        body.settimeout(30)
        assert status_of(headers) == 0  # closed without an answer: no request was read
        assert status_of(body) == 408
    assert [e["stage"] for e in events(hook, "timeout")] == ["headers"]
    assert [e["status"] for e in events(hook, "rejected")] == [408]
    assert post_alert(hook.port, hook.token, {"model": MODEL, "reason": "drift"})[0] == 200 and len(hook.started) == 1


def test_a_kept_alive_connection_has_the_header_deadline_again_for_its_next_request(served):
    hook = served(ServerLimits(header_timeout_seconds=0.5, keep_alive_seconds=60))
    with socket.create_connection(("127.0.0.1", hook.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: k\r\n\r\n")
        assert status_of(sock) == 200
        sock.sendall(b"POST /alerts HTTP/1.1\r\nHost: k\r\nContent-Le")  # uvicorn's keep-alive timer stops here
        rest = b""
        while chunk := sock.recv(65536):  # until the server closes it (the socket's timeout would fail the test)
            rest += chunk
    assert b"HTTP/1.1" not in rest and [e["stage"] for e in events(hook, "timeout")] == ["headers"]


def test_malformed_alerts_get_4xx_never_500_and_start_nothing(served):
    hook = served()
    nested = b'{"model": "churn", "reason": "x", "data_md5": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    corpus = {
        "Content-Length: \u00b2": (400, post(hook, b"{}", length="\u00b2".encode())),
        "Content-Length of 100 digits": (400, post(hook, b"{}", length=b"9" * 100)),  # h11 takes up to 20
        "Content-Length of 20 digits": (413, post(hook, b"{}", length=b"9" * 20)),
        "Content-Length negative": (400, post(hook, b"{}", length=b"-1")),
        "annotations not an object": (400, post(hook, json.dumps(alertmanager(annotations="x")).encode())),
        "annotations a list": (400, post(hook, json.dumps(alertmanager(annotations=["x"])).encode())),
        "labels null": (400, post(hook, json.dumps(alertmanager(labels=None)).encode())),
        "a label not a string": (400, post(hook, json.dumps(alertmanager(labels={"model": 5})).encode())),
        "fingerprint not a string": (400, post(hook, json.dumps(alertmanager(fingerprint=[1])).encode())),
        "alerts not a list": (400, post(hook, json.dumps({"version": "4", "alerts": {}}).encode())),
        "an alert not an object": (400, post(hook, json.dumps({"version": "4", "alerts": [7]}).encode())),
        "data_md5 a list": (400, post(hook, json.dumps({"model": MODEL, "reason": "x", "data_md5": ["a"]}).encode())),
        "model a number": (400, post(hook, json.dumps({"model": 1, "reason": "x"}).encode())),
        "data_md5 of 30,000 characters": (400, post(hook, json.dumps({"model": MODEL, "reason": "x",
                                                                      "data_md5": "a" * 30_000}).encode())),
        "data_md5 not hex": (400, post(hook, json.dumps({"model": MODEL, "reason": "x",
                                                         "data_md5": "../x"}).encode())),
        "a model name of 300 characters": (400, post(hook, json.dumps({"model": "m" * 300, "reason": "x"}).encode())),
        "deep nesting": (400, post(hook, nested)),
        "invalid JSON": (400, post(hook, b"{model: churn")),
        "not UTF-8": (400, post(hook, b'{"model": "\xff\xfe"}')),
        "an integer of 5000 digits": (400, post(hook, b'{"model": "churn", "reason": ' + b"9" * 5000 + b"}")),
        "a JSON array": (400, post(hook, b"[]")),
    }
    got = {case: status for case, (_, (status, _)) in corpus.items()}
    assert got == {case: want for case, (want, _) in corpus.items()}
    assert not hook.started and not events(hook, "error")
    assert b"nested too deeply" in corpus["deep nesting"][1][1]
    assert b"alerts[0].annotations: expected an object of strings" in corpus["annotations not an object"][1][1]


def test_a_500_answers_only_an_error_id_which_the_redacted_log_line_carries(served):
    def unreachable(alert):
        raise ConnectionError("KFP at https://alice:S3CRETPW@kfp.example/apis/v2beta1?token=abc did not answer")

    hook = served(start=unreachable)
    status, body = post(hook, json.dumps({"model": MODEL, "reason": "drift"}).encode())

    answer = json.loads(body)
    assert status == 500 and set(answer) == {"error", "error_id"} and answer["error_id"] in answer["error"]
    assert "S3CRETPW" not in body.decode() and "ConnectionError" not in body.decode() and "kfp" not in body.decode()
    (logged,) = events(hook, "error")
    assert logged["error_id"] == answer["error_id"]
    assert "https://***@kfp.example/apis/v2beta1 did not answer" in logged["error"]
    assert "S3CRETPW" not in hook.log.getvalue() and "token=abc" not in hook.log.getvalue()


def test_healthz_fails_while_every_worker_is_stuck_past_the_request_deadline(served):
    released = threading.Event()
    hook = served(ServerLimits(workers=1, request_timeout_seconds=0.5), start=lambda alert: released.wait(60))
    healthz = b"GET /healthz HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n"
    try:
        status, body = post(hook, json.dumps({"model": MODEL, "reason": "drift"}).encode())
        assert status == 504 and b"no answer within 0.5 s" in body
        wait_for("/healthz to fail", lambda: raw(hook.port, healthz)[0] == 503, timeout=30)
    finally:
        released.set()
    wait_for("/healthz to pass again", lambda: raw(hook.port, healthz)[0] == 200, timeout=30)
    assert [e["fire"] for e in wait_for("the late decision's log line", lambda: events(hook, "trigger"))] == [True]
    assert len(hook.started) == 1
