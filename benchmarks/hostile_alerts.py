"""Hostile requests to ``kfloop serve``'s ``POST /alerts`` (issue 41): a corpus holding every reproduction of the
issue, and hypothesis strategies for fuzzed alert bodies. Each must be answered 4xx and start nothing; no answer or
log line may carry a planted secret. Used by ``benchmarks/hardening.py`` (the report) and
``tests/test_hostile_alerts.py`` (the same checks with bounded examples).

Every request is raw bytes for :func:`benchmarks.webhook_load.exchange`, built for a webhook whose registered model
is :data:`benchmarks.webhook_load.MODEL` and whose allowed data prefix is :data:`PREFIX`.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import string
from dataclasses import dataclass

from hypothesis import strategies as st

from benchmarks.webhook_load import MODEL

PREFIX = "s3://bucket/churn/"
"""The one folder alerts may train on (``trigger.allowed_data_prefixes``)."""
PLANTED_AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPLANTED0001"
"""Set as ``AWS_SECRET_ACCESS_KEY`` while the corpus runs."""
PLANTED_URI_PASSWORD = "S3CRETPW-planted-0002"
"""The password of the credentials some corpus URIs carry."""
PLANTED_SIGNATURE = "f00dfacePLANTEDsignature0003"
"""A presigned ``X-Amz-Signature`` some corpus URIs carry."""
PLANTED = (PLANTED_AWS_SECRET, PLANTED_URI_PASSWORD, PLANTED_SIGNATURE)
"""Secrets an answer or log line must never hold (with the webhook's token and HMAC key)."""


@dataclass(frozen=True, slots=True)
class Hostile:
    """One hostile request: what it tries, and its raw bytes."""

    name: str
    request: bytes


def request(body: bytes, headers: dict[str, str], *, length: bytes | None = None) -> bytes:
    """A raw ``POST /alerts`` of ``body`` with ``headers`` (``Content-Length`` is ``length``, default the body's)."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    return (b"POST /alerts HTTP/1.1\r\nHost: kfloop\r\nConnection: close\r\n" + head
            + b"Content-Length: " + (str(len(body)).encode() if length is None else length) + b"\r\n\r\n" + body)


def signed(body: bytes, secret: str, timestamp: int) -> dict[str, str]:
    """The HMAC headers of ``body`` signed with ``secret`` at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Kfloop-Timestamp": str(timestamp), "X-Kfloop-Signature": f"sha256={mac}"}


def plain(**fields: object) -> bytes:
    """A ``{"model", "reason", ...}`` alert body."""
    return json.dumps({"model": MODEL, "reason": "drift", **fields}).encode()


def alertmanager(labels: object, annotations: object) -> bytes:
    """An Alertmanager (v4) body of one firing alert."""
    return json.dumps({"version": "4", "status": "firing",
                       "alerts": [{"status": "firing", "labels": labels, "annotations": annotations}]}).encode()


HOSTILE_URIS = {
    "path traversal ..": f"{PREFIX}../hr/x.parquet",
    "dot segment": f"{PREFIX}./x.parquet",
    "empty segment //": f"{PREFIX}/x.parquet",
    "local file": "/etc/passwd",
    "relative traversal": "../../var/run/secrets/kubernetes.io/serviceaccount/token",
    "service-account token": "/var/run/secrets/kubernetes.io/serviceaccount/token",
    "http (cloud metadata)": "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "https": "https://evil.example/x.parquet",
    "ftp": "ftp://evil.example/x.parquet",
    ":: chain": f"simplecache::{PREFIX}x.parquet",
    "file://": "file:///etc/passwd",
    "memory://": "memory://x.parquet",
    "bucket root": "s3://bucket",
    "bucket root /": "s3://bucket/",
    "sibling folder": "s3://bucket/churn-evil/x.parquet",
    "other bucket": "s3://other-bucket/churn/x.parquet",
    "credentials in URI": f"s3://AKIAPLANTED:{PLANTED_URI_PASSWORD}@bucket/churn/x.parquet",
    "presigned query": f"{PREFIX}x.parquet?X-Amz-Credential=AKIA&X-Amz-Signature={PLANTED_SIGNATURE}",
    "fragment": f"{PREFIX}x.parquet#frag",
}
"""Data URIs that must be refused: outside the allow-list, not resolved, or carrying credentials."""


def corpus(token: str, hmac_secret: str, now: int) -> list[Hostile]:
    """Every reproduction of issue 41 against ``/alerts``, for a webhook with bearer ``token`` and HMAC key
    ``hmac_secret`` whose clock reads ``now``."""
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    valid = plain(data_md5="a" * 32)
    cases = [
        Hostile("no credentials", request(valid, {"Content-Type": "application/json"})),
        Hostile("wrong bearer token", request(valid, {"Authorization": "Bearer " + "0" * 32})),
        Hostile("bad HMAC signature", request(valid, {**signed(valid, "not-the-key", now)})),
        Hostile("HMAC without timestamp", request(valid, {"X-Kfloop-Signature": signed(valid, hmac_secret, now)[
            "X-Kfloop-Signature"]})),
        Hostile("replayed timestamp (1 h old)", request(valid, signed(valid, hmac_secret, now - 3600))),
        Hostile("timestamp 1 h ahead", request(valid, signed(valid, hmac_secret, now + 3600))),
        Hostile("signature of another body", request(plain(data_md5="b" * 32), signed(valid, hmac_secret, now))),
        Hostile("malformed JSON", request(b'{"model": ', auth)),
        Hostile("JSON array", request(b"[]", auth)),
        Hostile("JSON null", request(b"null", auth)),
        Hostile("deep nesting", request(b"[" * 50_000 + b"]" * 50_000, auth)),
        Hostile("not UTF-8", request(b'{"model": "\xff\xfe"}', auth)),
        Hostile("Content-Length \u00b2", request(b"{}", auth, length="\u00b2".encode())),
        Hostile("Content-Length negative", request(b"{}", auth, length=b"-1")),
        Hostile("body over the limit", request(b" " * (64 * 1024 + 1), auth)),
        Hostile("annotations not an object", request(alertmanager({"model": MODEL}, "drift"), auth)),
        Hostile("labels not an object", request(alertmanager([MODEL], {}), auth)),
        Hostile("alerts not a list", request(json.dumps({"version": "4", "alerts": {}}).encode(), auth)),
        Hostile("unknown field", request(plain(command="rm -rf /"), auth)),
        Hostile("oversized data_md5 (30,000 chars)", request(plain(data_md5="a" * 30_000), auth)),
        Hostile("data_md5 not hex", request(plain(data_md5="zz" * 16), auth)),
        Hostile("data_md5 upper case", request(plain(data_md5="A" * 32), auth)),
        Hostile("data_md5 not a string", request(plain(data_md5=12345), auth)),
        Hostile("empty model name", request(plain(model=""), auth)),
        Hostile("model name of 300 chars", request(plain(model="m" * 300), auth)),
        Hostile("model name with traversal", request(plain(model="../../etc/passwd"), auth)),
        Hostile("model name with newline", request(plain(model=f"{MODEL}\n"), auth)),
        Hostile("model name not a string", request(plain(model=123), auth)),
        Hostile("unregistered model", request(plain(model="not-registered"), auth)),
        Hostile("reason not a string", request(plain(reason={"$gt": ""}), auth)),
    ]
    cases += [Hostile(f"dataset_uri: {name}", request(plain(data_md5=f"{i:032x}", dataset_uri=uri), auth))
              for i, (name, uri) in enumerate(HOSTILE_URIS.items())]
    cases += [Hostile(f"annotation dataset_uri: {name}", request(alertmanager(
        {"model": MODEL}, {"dataset_uri": uri, "data_md5": f"{i + 100:032x}"}), auth))
        for i, (name, uri) in enumerate(HOSTILE_URIS.items())]
    return cases


# ------------------------------------------------------------------------------------------------------ fuzzing

_SEGMENT = st.text(string.ascii_letters + string.digits + "-_.%~", max_size=12)
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
JSON_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def hostile_uris() -> st.SearchStrategy[str]:
    """Data URIs that are never admissible under :data:`PREFIX`: a traversal, dot or empty segment, another scheme,
    bucket or folder, a local path, credentials, a query or a fragment (each drawn with fuzzed parts)."""
    traversal = st.lists(st.sampled_from(["..", ".", "", "churn", "x"]), min_size=1, max_size=5).filter(
        lambda segs: any(s in ("..", ".", "") for s in segs)).map(lambda segs: PREFIX + "/".join(segs) + "/x")
    foreign = st.tuples(st.sampled_from(["http://", "https://", "ftp://", "file://", "memory://", "sftp://",
                                         f"simplecache::{PREFIX}", "s3://other-bucket/churn/", "gs://bucket/churn/",
                                         "s3://bucket/churn-", "/", "../"]), _SEGMENT).map("".join)
    credentials = st.tuples(_SEGMENT.filter(bool), _SEGMENT).map(
        lambda up: f"s3://{up[0]}:{up[1]}@bucket/churn/x.parquet")
    query = st.tuples(st.sampled_from("?#"), st.text(string.ascii_letters + "=&%", min_size=1, max_size=30)).map(
        lambda q: f"{PREFIX}x.parquet{q[0]}{q[1]}")
    return st.one_of(traversal, foreign, credentials, query, st.sampled_from(sorted(HOSTILE_URIS.values())))


def answered_as_required(status: int, answer: bytes) -> str | None:
    """How the webhook answered a hostile body: ``4xx`` (refused), ``ignored`` (200 with no decision: an
    Alertmanager payload with no firing alert, which Alertmanager must see acknowledged or it resends it), else
    ``None`` (anything else fails the check)."""
    if 400 <= status < 500:
        return "4xx"
    if status == 200 and json.loads(answer) == {"decisions": []}:
        return "ignored"
    return None


def _could_start(payload: object) -> bool:
    """Whether ``payload`` names the registered model without hostile data (such an alert may rightly start)."""
    if not isinstance(payload, dict):
        return False
    alerts = payload.get("alerts") if isinstance(payload.get("alerts"), list) else [payload]
    for alert in alerts:
        labels = alert.get("labels", alert) if isinstance(alert, dict) else {}
        if isinstance(labels, dict) and MODEL in (labels.get("model"), labels.get("model_name")):
            return True
    return False


def fuzzed_bodies() -> st.SearchStrategy[bytes]:
    """Alert bodies no webhook may act on: plain and Alertmanager alerts for the registered model with hostile
    data (a fuzzed URI, md5 or reason), alerts for fuzzed model names, any JSON value, and arbitrary bytes."""
    md5 = st.text("0123456789abcdefABCDEF-xyz", max_size=80)
    ours = st.fixed_dictionaries({"model": st.just(MODEL), "reason": st.text(max_size=200) | JSON_VALUES,
                                  "dataset_uri": hostile_uris()}, optional={"data_md5": md5})
    theirs = st.fixed_dictionaries({"model": st.text(max_size=300) | JSON_VALUES, "reason": JSON_VALUES},
                                   optional={"data_md5": md5 | JSON_VALUES, "dataset_uri": st.text(max_size=60)})
    labels = st.dictionaries(st.sampled_from(["model", "model_name", "alertname", "severity"]) | st.text(max_size=10),
                             JSON_VALUES, max_size=4)
    manager = st.fixed_dictionaries({
        "version": st.sampled_from(["4", "3", 4]) | JSON_VALUES, "status": st.sampled_from(["firing", "resolved"]),
        "alerts": st.lists(st.fixed_dictionaries({"status": st.just("firing"), "labels": labels | JSON_VALUES,
                                                  "annotations": st.fixed_dictionaries({"dataset_uri": hostile_uris()})
                                                  | JSON_VALUES}), min_size=1, max_size=3) | JSON_VALUES})
    ours_manager = hostile_uris().map(lambda uri: {"version": "4", "alerts": [
        {"status": "firing", "labels": {"model": MODEL}, "annotations": {"dataset_uri": uri}}]})
    payloads = st.one_of(ours, ours_manager, *(s.filter(lambda p: not _could_start(p))
                                               for s in (theirs, manager, JSON_VALUES)))
    return payloads.map(lambda p: json.dumps(p).encode()) | st.binary(max_size=2048)
