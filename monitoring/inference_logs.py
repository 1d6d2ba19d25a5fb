"""Inference logs: KServe's payload-logger records, the one format behind ``serve-model --log-dir``, ``kfloop
serve``'s ``POST /inference-logs`` and the drift and quality checks' served rows.

Written from kserve v0.20.0's ``pkg/logger``. A request and its response are two records sharing one id
(``handler.go`` 142-152, 185-191: the caller's ``Ce-Id`` header, else a new UUID); the response is logged only when
the model answered HTTP 200 (``handler.go`` 183), and delivery is at most once and unordered (a work queue of
workers, ``worker.go`` 57-63). As a CloudEvent (binary mode, ``worker.go`` 122-152): ``ce-id``, ``ce-type``
(:data:`REQUEST_TYPE` or :data:`RESPONSE_TYPE`, ``worker.go`` 39-40), ``ce-source``, ``ce-time`` (when the request
arrived or the response came back), the extensions ``ce-inferenceservicename``, ``ce-namespace``, ``ce-component``,
``ce-endpoint`` (``default`` or ``canary``), ``ce-metadata`` and, when there are any, ``ce-annotations`` (a JSON
object as a string; the InferenceService annotations named by ``spec.predictor.logger.metadataAnnotations``,
``pkg/webhook/admission/pod/agent_injector.go`` 293-305), and the payload as the body. As a blob (``store.go``
165-208): key ``<prefix>/<namespace>/<isvc>/<component>/<path>/<id>-<request|response>.json``, empty parts left
out, the body the JSON marshaller's (``marshaller_json.go`` 67-73: one record an object, a batch an array) of
``LogRequest`` (``types.go`` 24-40): ``bytes`` the payload in standard base64 (Go's ``encoding/json`` for a
``[]byte``), ``reqType``, ``id``, ``contentType``, ``inferenceService``, ``namespace``, ``component``,
``endpoint``, ``metadata``, ``annotations`` and ``occurrenceTime`` (RFC 3339). The agent's default batches one
record per blob (``cmd/agent/main.go`` 313-322).

The reader turns a window of records into rows: each request's Open Inference Protocol v2 body (``inputs``, one
per column, ``parameters.content_type: pd``) decoded by its datatypes, the response's ``outputs`` (the prediction,
the schema check's flags) joined by id, the model version read from the annotations.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import posixpath
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pandas as pd
from cloudevents.http import CloudEvent, from_http

from data.errors import EXIT_DATA_FILE, KfloopError
from data.fileio import atomic_write_bytes, parquet_bytes
from data.redaction import redact
from data.schema_rules import MAX_VALUE_CHARS
from data.storage import filesystem, is_remote
from data.text import shorten
from training.serving import MODEL_NAME_ANNOTATION, MODEL_VERSION_ANNOTATION

REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"
KINDS = {REQUEST_TYPE: "request", RESPONSE_TYPE: "response"}
"""Each ``ce-type`` and the last part of its name, which ends the blob's key (``store.go`` 200-207)."""
EXTENSION = "json"
"""The blobs' extension: the JSON marshaller's (``marshaller_json.go`` 61)."""
ID_COLUMN, ROW_COLUMN, TIME_COLUMN, MODEL_COLUMN, VERSION_COLUMN, DATE_COLUMN = (
    "request_id", "row_id", "request_time", "model_name", "model_version", "date")
"""Columns the reader adds to each served row: ``ce-id``; ``<ce-id>/<row>`` (the row's 0-based position in its
request: delayed labels join on it, or on ``request_id`` when every request holds one row); the request's
``ce-time`` (UTC); the annotations' model and version; the request's UTC date (a partition of
:func:`write_partitioned`)."""
LOG_COLUMNS = (ID_COLUMN, ROW_COLUMN, TIME_COLUMN, MODEL_COLUMN, VERSION_COLUMN, DATE_COLUMN)
UNKNOWN_VERSION = "unknown"
"""The version of a request whose record has no :data:`MODEL_VERSION_ANNOTATION`."""
_DTYPES = {"BOOL": "bool", "BYTES": "str", "FP16": "float64", "FP32": "float64", "FP64": "float64",
           **{f"{p}INT{b}": "int64" for p in ("", "U") for b in (8, 16, 32, 64)}}
"""Open Inference Protocol v2 datatypes and the column type each decodes to."""
_SINCE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class InferenceLogError(KfloopError, ValueError):
    """A log record, request or response that cannot be read: the blob or event, the field and its value."""

    exit_code = EXIT_DATA_FILE

    def __init__(self, where: str, field_name: str, problem: str):
        super().__init__(f"{redact(where)}: {field_name}: {problem}")


@dataclass(frozen=True, kw_only=True, slots=True)
class LogRecord:
    """One logged request or response (KServe's ``LogRequest``, less the logger's own URL and TLS settings)."""

    id: str
    """``ce-id``: shared by a request and its response."""
    type: str
    """:data:`REQUEST_TYPE` or :data:`RESPONSE_TYPE`."""
    body: bytes
    """The payload as sent or answered."""
    time: datetime
    """``ce-time``: when the request arrived or the response came back (UTC)."""
    content_type: str = "application/json"
    inference_service: str = ""
    namespace: str = ""
    component: str = ""
    endpoint: str = ""
    annotations: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, list[str]] = field(default_factory=dict)
    """The request headers the logger was told to keep (``metadataHeaders``)."""

    def __post_init__(self) -> None:
        where = f"record {self.id!r}"
        if not self.id or "/" in self.id:
            raise InferenceLogError(where, "id", "use a non-empty id without '/' (it names the blob)")
        if self.type not in KINDS:
            raise InferenceLogError(where, "type", f"{self.type!r} is not one of {sorted(KINDS)}")
        if self.time.tzinfo is None:
            raise InferenceLogError(where, "time", f"{self.time.isoformat()} has no time zone; give UTC")

    @property
    def kind(self) -> str:
        """``request`` or ``response``."""
        return KINDS[self.type]

    def key(self, path: str = "") -> str:
        """The blob's key under the logger's URI: ``<namespace>/<isvc>/<component>/<path>/<id>-<kind>.json``
        without the empty parts (``store.go`` 165-208)."""
        parts = [p for p in (self.namespace, self.inference_service, self.component, path) if p]
        return posixpath.join(*parts, f"{self.id}-{self.kind}.{EXTENSION}")

    def blob(self) -> bytes:
        """The JSON blob KServe's marshaller writes for this record alone."""
        obj: dict[str, Any] = {"bytes": base64.b64encode(self.body).decode("ascii"),
                               "contentType": self.content_type, "reqType": self.type, "id": self.id,
                               "inferenceService": self.inference_service, "namespace": self.namespace,
                               "component": self.component, "endpoint": self.endpoint,
                               "metadata": self.metadata, "annotations": self.annotations,
                               "occurrenceTime": _rfc3339(self.time)}
        return json.dumps({k: v for k, v in obj.items() if v or k in ("bytes", "occurrenceTime")},
                          separators=(",", ":")).encode()  # compact, as Go writes it

    def cloudevent(self, source: str) -> CloudEvent:
        """This record as the logger's CloudEvent (send with ``cloudevents.conversion.to_binary``)."""
        attributes = {"id": self.id, "type": self.type, "source": source, "time": _rfc3339(self.time),
                      "datacontenttype": self.content_type, "inferenceservicename": self.inference_service,
                      "namespace": self.namespace, "component": self.component, "endpoint": self.endpoint,
                      "metadata": json.dumps(self.metadata)}
        if self.annotations:
            attributes["annotations"] = json.dumps(self.annotations)
        return CloudEvent(attributes, self.body)


def records_from_blob(data: bytes, where: str) -> list[LogRecord]:
    """The records of one blob (an object, or an array for a batch).

    Raises:
        InferenceLogError: not JSON, or a field missing or of the wrong type (named with its value).
    """
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InferenceLogError(where, "blob", f"not JSON ({exc})") from None
    items = parsed if isinstance(parsed, list) else [parsed]
    return [_record_from_blob(item, f"{where}[{i}]" if isinstance(parsed, list) else where)
            for i, item in enumerate(items)]


def _record_from_blob(obj: Any, where: str) -> LogRecord:
    if not isinstance(obj, dict):
        raise InferenceLogError(where, "record", f"{_shown(obj)} is not a JSON object")
    text = {name: _field(obj, name, str, where, "") for name in
            ("contentType", "inferenceService", "namespace", "component", "endpoint")}
    try:
        body = base64.b64decode(_field(obj, "bytes", str, where, ""), validate=True)
    except binascii.Error:
        raise InferenceLogError(where, "bytes", f"{_shown(obj['bytes'])} is not standard base64") from None
    annotations = _field(obj, "annotations", dict, where, {})
    return LogRecord(id=_field(obj, "id", str, where), type=_field(obj, "reqType", str, where), body=body,
                     time=_parse_time(_field(obj, "occurrenceTime", str, where), where, "occurrenceTime"),
                     content_type=text["contentType"] or "application/json",
                     inference_service=text["inferenceService"], namespace=text["namespace"],
                     component=text["component"], endpoint=text["endpoint"],
                     annotations={str(k): str(v) for k, v in annotations.items()},
                     metadata=_field(obj, "metadata", dict, where, {}))


def record_from_cloudevent(headers: dict[str, str], body: bytes, where: str) -> LogRecord:
    """The record a binary-mode CloudEvent carries (the logger's POST, ``worker.go`` 122-152).

    Raises:
        InferenceLogError: not a CloudEvent (no ``ce-specversion``/``ce-id``/...), or an attribute is malformed.
    """
    try:
        event = from_http(headers, body, data_unmarshaller=lambda data: data)
    except Exception as exc:  # the SDK's MissingRequiredFields, InvalidRequiredFields, ...
        raise InferenceLogError(where, "headers", f"not a binary-mode CloudEvent ({exc})") from None
    annotations = event.get("annotations") or "{}"
    try:
        parsed = json.loads(annotations)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise InferenceLogError(where, "ce-annotations", f"{_shown(annotations)} is not a JSON object")
    data = event.data or b""
    return LogRecord(id=event["id"], type=event["type"], body=data if isinstance(data, bytes) else data.encode(),
                     time=_parse_time(event.get("time") or "", where, "ce-time"),
                     content_type=headers.get("content-type", "application/json"),
                     inference_service=event.get("inferenceservicename") or "",
                     namespace=event.get("namespace") or "", component=event.get("component") or "",
                     endpoint=event.get("endpoint") or "", annotations={str(k): str(v) for k, v in parsed.items()})


class InferenceLogWriter:
    """Writes records where KServe's blob logger would, one JSON blob each, under ``root`` (a folder or an object
    URI, the logger's ``storage`` URI); local files atomically, objects in one PUT."""

    def __init__(self, root: str | os.PathLike, *, path: str = "", inference_service: str = "",
                 namespace: str = "", component: str = "predictor", endpoint: str = "default"):
        self.root = str(root).rstrip("/")
        self.fs, self._root_path = filesystem(self.root)
        self.path, self.inference_service, self.namespace = path, inference_service, namespace
        self.component, self.endpoint = component, endpoint

    def write(self, record: LogRecord) -> str:
        """Store ``record`` at its key; the URI written."""
        key = record.key(self.path)
        if is_remote(self.root):
            self.fs.pipe_file(posixpath.join(self._root_path, key), record.blob())
        else:
            atomic_write_bytes(os.path.join(self.root, key), record.blob())
        return f"{self.root}/{key}"

    def log(self, request_id: str | None, request_body: bytes | dict, response_body: bytes | dict | None, *,
            model: str, version: str | int, received: datetime | None = None,
            answered: datetime | None = None) -> str:
        """Log one served request and, unless ``response_body`` is None (the model did not answer 200), its
        response, tagged with ``model`` and ``version``; the id (``request_id``, else a new UUID).

        Raises:
            InferenceLogError: an id with '/' or a time without a time zone.
        """
        request_id = request_id or str(uuid.uuid4())
        now = datetime.now(timezone.utc)
        common = dict(id=request_id, inference_service=self.inference_service, namespace=self.namespace,
                      component=self.component, endpoint=self.endpoint,
                      annotations={MODEL_NAME_ANNOTATION: model, MODEL_VERSION_ANNOTATION: str(version)})
        self.write(LogRecord(type=REQUEST_TYPE, body=_payload(request_body), time=received or now, **common))
        if response_body is not None:
            self.write(LogRecord(type=RESPONSE_TYPE, body=_payload(response_body), time=answered or now, **common))
        return request_id


@dataclass(kw_only=True, slots=True)
class ServedRows:
    """A window of inference logs as rows: each request's inputs, its response's outputs (null without one) and
    :data:`LOG_COLUMNS`; the counts say what the window held."""

    rows: pd.DataFrame
    inputs: list[str]
    """The columns the requests sent (the rest: the responses' outputs and :data:`LOG_COLUMNS`)."""
    blobs: int
    requests: int
    responses: int
    request_only: int
    """Requests without a response (the model failed, or the response was dropped): kept, outputs null."""
    response_only: int
    """Responses without a request in the window: dropped."""
    duplicates: int
    """Records of an id and type seen before (a redelivery): dropped."""


def parse_since(text: str) -> timedelta:
    """``24h``, ``30m``, ``7d``, ``90s`` as a window length.

    Raises:
        ValueError: another form, or zero.
    """
    match = _SINCE.match(str(text).strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"since={text!r}: use a positive whole number and a unit s, m, h or d, e.g. 24h")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def read_inference_logs(uri: str | os.PathLike, *, since: timedelta, now: datetime | None = None) -> ServedRows:
    """The requests logged under ``uri`` (a folder or object prefix, searched recursively) whose ``ce-time`` falls
    in the ``since`` before ``now`` (default: the current time), joined with their responses by id, in request
    time order. Blobs last written before the window are skipped unread.

    Raises:
        data.storage.StorageError: ``uri`` is refused or unreadable.
        InferenceLogError: a blob, request or response in the window cannot be read (named, with the field).
    """
    now = now or datetime.now(timezone.utc)
    start = now - since
    fs, root = filesystem(str(uri))
    found = fs.find(root, detail=True) if fs.exists(root) else {}
    paths = [p for p, info in found.items() if p.endswith((f"-request.{EXTENSION}", f"-response.{EXTENSION}"))
             and not _written_before(info, start)]
    blobs = fs.cat(paths) if paths else {}
    requests: dict[str, LogRecord] = {}
    responses: dict[str, LogRecord] = {}
    duplicates = 0
    shown = {path: f"{str(uri).rstrip('/')}/{posixpath.relpath(path, root)}" for path in paths}
    for path in sorted(paths):
        for record in records_from_blob(blobs[path], shown[path]):
            if not start <= record.time <= now:
                continue
            kept = requests if record.type == REQUEST_TYPE else responses
            if record.id in kept:
                duplicates += 1
                continue
            kept[record.id] = record
    served = [_served(request, responses.get(request.id)) for request in
              sorted(requests.values(), key=lambda r: (r.time, r.id))]
    rows = pd.concat([s for s, _ in served], ignore_index=True) if served else pd.DataFrame(columns=list(LOG_COLUMNS))
    inputs = list(dict.fromkeys(name for _, names in served for name in names))
    return ServedRows(rows=rows, inputs=inputs, blobs=len(paths), requests=len(requests), responses=len(responses),
                      request_only=sum(i not in responses for i in requests),
                      response_only=sum(i not in requests for i in responses), duplicates=duplicates)


def _served(request: LogRecord, response: LogRecord | None) -> tuple[pd.DataFrame, list[str]]:
    """One request's rows, its response's outputs beside them, and :data:`LOG_COLUMNS`; the input columns."""
    where = f"request {request.id!r}"
    rows = decode_table(request.body, "inputs", f"{where} ({request.time.isoformat()})")
    inputs = list(rows.columns)
    if response is not None:
        outputs = decode_table(response.body, "outputs", f"response {request.id!r}")
        if len(outputs) != len(rows):
            raise InferenceLogError(f"response {request.id!r}", "outputs",
                                    f"{len(outputs)} rows answer a request of {len(rows)}")
        clash = sorted(set(outputs.columns) & set(rows.columns))
        if clash:
            raise InferenceLogError(f"response {request.id!r}", "outputs", f"{clash} are also inputs' names")
        rows = pd.concat([rows, outputs], axis=1)
    at = pd.Timestamp(request.time).tz_convert("UTC")
    return rows.assign(**{ID_COLUMN: request.id, ROW_COLUMN: [f"{request.id}/{i}" for i in range(len(rows))],
                          TIME_COLUMN: at,
                          MODEL_COLUMN: request.annotations.get(MODEL_NAME_ANNOTATION, ""),
                          VERSION_COLUMN: request.annotations.get(MODEL_VERSION_ANNOTATION, UNKNOWN_VERSION),
                          DATE_COLUMN: at.strftime("%Y-%m-%d")}), inputs


def decode_table(body: bytes, tensors: str, where: str) -> pd.DataFrame:
    """An Open Inference Protocol v2 body's ``tensors`` (``inputs`` or ``outputs``) as columns, one per tensor of
    shape ``[n]`` or ``[n, 1]``, typed by its datatype (``BYTES`` text, ``INT*`` integers, ``FP*`` floats, ``BOOL``;
    JSON nulls stay null: an integer column with nulls becomes float, as Parquet reads it).

    Raises:
        InferenceLogError: not a v2 body, or a tensor's field is missing, of another shape or holds a value its
            datatype does not (named, with the value).
    """
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InferenceLogError(where, "body", f"not JSON ({exc})") from None
    items = obj.get(tensors) if isinstance(obj, dict) else None
    if not isinstance(items, list) or not items:
        raise InferenceLogError(where, tensors, f"{_shown(items)}: expected a non-empty list of tensors")
    columns = {}
    for i, tensor in enumerate(items):
        at = f"{tensors}[{i}]"
        if not isinstance(tensor, dict):
            raise InferenceLogError(where, at, f"{_shown(tensor)} is not a JSON object")
        name = _field(tensor, "name", str, where, at=at)
        shape, datatype = _field(tensor, "shape", list, where, at=at), _field(tensor, "datatype", str, where, at=at)
        data = _field(tensor, "data", list, where, at=at)
        if datatype not in _DTYPES:
            raise InferenceLogError(where, f"{at}.datatype", f"{datatype!r} is not one of {sorted(_DTYPES)}")
        if not (1 <= len(shape) <= 2 and shape[1:] in ([], [1]) and shape[0] == len(data)):
            raise InferenceLogError(where, f"{at}.shape", f"{shape} for {len(data)} values: send one column per "
                                                          "tensor, shape [rows] (parameters.content_type: pd)")
        if name in columns:
            raise InferenceLogError(where, f"{at}.name", f"{name!r} names two tensors")
        columns[name] = _column(data, _DTYPES[datatype], where, f"{at} ({name!r}, {datatype})")
    return pd.DataFrame(columns)


def _column(data: list, kind: str, where: str, at: str) -> pd.Series:
    nulls = [v is None for v in data]
    values = [v for v in data if v is not None]
    wrong = next((v for v in values if not _fits(v, kind)), None)
    if wrong is not None:
        raise InferenceLogError(where, f"{at}.data", f"{_shown(wrong)} is not a {kind} value")
    if kind == "str" or (kind == "bool" and any(nulls)):
        return pd.Series(data, dtype=object)
    if kind == "int64" and any(nulls):
        kind = "float64"
    return pd.Series([np.nan if v is None else v for v in data] if any(nulls) else data, dtype=kind)


def _fits(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int64":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def write_partitioned(rows: pd.DataFrame, out: str | os.PathLike) -> list[str]:
    """``rows`` as Parquet under ``out`` (a folder or object prefix), one file per :data:`DATE_COLUMN` and
    :data:`VERSION_COLUMN` (``date=<d>/model_version=<v>/part-<digest>.parquet``, hive-style; the file named by its
    content, so writing the same rows twice writes the same files): each file written whole (atomically locally,
    one PUT to a store). The URIs written.
    """
    out = str(out).rstrip("/")
    fs, root = filesystem(out)
    written = []
    for (day, version), part in rows.groupby([DATE_COLUMN, VERSION_COLUMN], sort=True):
        data = parquet_bytes(part.drop(columns=[DATE_COLUMN, VERSION_COLUMN]))
        key = f"{DATE_COLUMN}={day}/{VERSION_COLUMN}={version}/part-{hashlib.sha256(data).hexdigest()[:16]}.parquet"
        if is_remote(out):
            fs.pipe_file(posixpath.join(root, key), data)
        else:
            atomic_write_bytes(os.path.join(out, key), data)
        written.append(f"{out}/{key}")
    return written


def _payload(body: bytes | dict) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def _field(obj: dict, name: str, kind: type, where: str, default: Any = ..., *, at: str = "") -> Any:
    label = f"{at}.{name}" if at else name
    if name not in obj or obj[name] is None:
        if default is ...:
            raise InferenceLogError(where, label, "missing")
        return default
    if not isinstance(obj[name], kind):
        raise InferenceLogError(where, label, f"{_shown(obj[name])} is not a {kind.__name__}")
    return obj[name]


def _parse_time(text: str, where: str, name: str) -> datetime:
    """An RFC 3339 time (Go writes nanoseconds; kept to microseconds) in UTC."""
    try:
        at = pd.Timestamp(text)
    except ValueError:
        raise InferenceLogError(where, name, f"{text!r} is not an RFC 3339 time") from None
    if at.tzinfo is None:
        raise InferenceLogError(where, name, f"{text!r} has no time zone")
    return at.tz_convert("UTC").to_pydatetime(warn=False)


def _rfc3339(at: datetime) -> str:
    """``at`` in UTC as Go's ``time.RFC3339Nano`` writes it (``Z``, no trailing zeros in the fraction)."""
    text = at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return text + "Z"


def _written_before(info: dict, start: datetime) -> bool:
    """Whether a listed blob was last written (S3 ``LastModified``, a file's ``mtime``) before ``start``, so all it
    holds happened before; False when the store does not say."""
    at = info.get("LastModified") or info.get("mtime")
    if at is None:
        return False
    if not isinstance(at, datetime):
        at = datetime.fromtimestamp(float(at), tz=timezone.utc)
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)) < start


def _shown(value: Any) -> str:
    return shorten(repr(value), MAX_VALUE_CHARS)
