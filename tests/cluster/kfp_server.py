"""A Kubeflow Pipelines API server (v2beta1, as KFP 2.17 serves it) for tests: the endpoints ``kfp.Client`` uses.

It keeps pipelines, versions, experiments, runs and recurring runs in memory; answers with the real API's
status codes and ``googleRpcStatus`` bodies (400 InvalidArgument, 401 Unauthenticated, 404 NotFound, 409
AlreadyExists); checks every query parameter, and every JSON body against the swagger definitions in
``tests/cluster/specs/kfp_v2beta1.swagger.json`` (types, enums, no unknown fields); parses multipart uploads; and
filters lists with the ``filter`` JSON predicates. Run states are driven by the test (:meth:`set_run_state`,
or a per-run script of states that each GET advances), or by tests/cluster/kfp_executor.py, which executes the runs.
Every request is recorded (:attr:`requests`), and so is who created each run (:attr:`Store.created_by`); a
test may have the next requests answered with an error status (:meth:`answer_next`), as a gateway in front of a
restarting API server answers 502. Standalone (single-user) by default, where a namespace in a request
is ignored; ``multi_user=MultiUser()`` (tests/cluster/kfp_multiuser.py) checks callers and namespaces as multi-user
Kubeflow does (403 PermissionDenied).
"""
from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.parser import BytesParser
from email.policy import HTTP
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from cluster.loopback import Loopback

SWAGGER = json.loads((Path(__file__).parent / "specs" / "kfp_v2beta1.swagger.json").read_text())
API = "/apis/v2beta1"
GRPC = {HTTPStatus.BAD_REQUEST: 3, HTTPStatus.NOT_FOUND: 5, HTTPStatus.CONFLICT: 6, HTTPStatus.FORBIDDEN: 7,
        HTTPStatus.UNAUTHORIZED: 16, HTTPStatus.NOT_IMPLEMENTED: 12}
OPERATIONS = {1: "EQUALS", 2: "NOT_EQUALS", 3: "GREATER_THAN", 5: "GREATER_THAN_EQUALS", 6: "LESS_THAN",
              7: "LESS_THAN_EQUALS", 8: "IN", 9: "IS_SUBSTRING"}
FINAL_STATES = {"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"}


class ApiError(Exception):
    """Answered as ``{"error", "code", "message", "details"}`` with ``status``."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class Store:
    pipelines: dict[str, dict] = field(default_factory=dict)
    versions: dict[str, dict] = field(default_factory=dict)
    experiments: dict[str, dict] = field(default_factory=dict)
    runs: dict[str, dict] = field(default_factory=dict)
    recurring_runs: dict[str, dict] = field(default_factory=dict)
    created_by: dict[str, str] = field(default_factory=dict)
    """Run or recurring run id -> who created it: the user multi-user mode's authenticator resolved (a recurring
    run's fires: its creator); standalone KFP knows no caller, so nothing is recorded there."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def split_spec(struct: dict) -> tuple[dict, dict]:
    """The pipeline spec and the platform spec (``{}`` when none) of a version's or run's ``pipeline_spec``: the
    API holds a YAML of two documents as ``{"pipeline_spec": ..., "platform_spec": ...}``, one as the spec itself
    (the SDK sends a package so: ``kfp/client/client.py`` ``_PipelineDoc.to_dict``; an upload is stored the same
    way here)."""
    if "pipeline_spec" in struct and "root" not in struct:
        return struct["pipeline_spec"], struct.get("platform_spec") or {}
    return struct, {}


_VALUE_KINDS = {"NUMBER_DOUBLE": ("double or integer", "number"), "NUMBER_INTEGER": ("double or integer", "number"),
                "STRING": ("string", "string"), "BOOLEAN": ("bool", "bool"), "LIST": ("list", "list"),
                "STRUCT": ("struct", "struct")}
"""IR parameter type -> (the type upstream's message names, the ``structpb.Value`` kind it requires)."""


def _kind(value: Any) -> str:
    """The ``structpb.Value`` kind a JSON value arrives as."""
    if isinstance(value, bool):
        return "bool"
    return {int: "number", float: "number", str: "string", list: "list", dict: "struct"}.get(type(value), "null")


def validate_job_inputs(spec: dict, params: dict[str, Any] | None) -> None:
    """kubeflow/pipelines ``backend/src/apiserver/template/v2_template.go`` ``validatePipelineJobInputs``: every
    root parameter without ``isOptional`` or a default is given, each given one has its declared type and, with
    ``literals``, one of them (``common/util/validate_literal.go``), and no other is given.

    Raises:
        ValueError: upstream's message.
    """
    declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    if params is None:
        if declared:
            raise ValueError("pipeline requiring input has no parameter(s) provided. Need parameter(s): "
                             + ", ".join(declared))
        return
    for name, param in declared.items():
        if name not in params:
            if not param.get("isOptional") and "defaultValue" not in param:
                raise ValueError(f"parameter {name} is not optional, yet has neither default value nor user "
                                 "provided value")
            continue
        kind = param.get("parameterType", "PARAMETER_TYPE_ENUM_UNSPECIFIED")
        if kind == "PARAMETER_TYPE_ENUM_UNSPECIFIED":
            raise ValueError(f"input parameter {name} has unspecified type")
        if kind == "TASK_FINAL_STATUS":
            raise ValueError(f"input parameter {name} requires type TASK_FINAL_STATUS, which is invalid for root "
                             "component")
        if kind not in _VALUE_KINDS:
            raise ValueError(f"input parameter {name} requires type unknown")
        wanted, value_kind = _VALUE_KINDS[kind]
        if _kind(params[name]) != value_kind:
            noun = "parameter value is not of number value type" if value_kind == "number" else \
                f"input parameter is not of {value_kind} value type"
            raise ValueError(f"input parameter {name} requires type {wanted}, but the {noun}")
        literals = param.get("literals") or []
        if literals and not any(_kind(lit) == _kind(params[name]) and lit == params[name] for lit in literals):
            raise ValueError(f"input parameter {json.dumps(name)} value {params[name]!r} does not match any of the "
                             f"allowed literal values: {literals}")
    extra = [name for name in params if name not in declared]
    if extra:
        raise ValueError(f"parameter(s) provided are not required by pipeline: {', '.join(extra)}")


def _resolve(schema: dict) -> dict:
    while "$ref" in schema:
        schema = SWAGGER["definitions"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def check_schema(value: Any, schema: dict, where: str) -> None:
    """Raise ApiError(400) where ``value`` does not fit the swagger ``schema`` (unknown fields included)."""
    schema = _resolve(schema)
    kind = schema.get("type", "object")
    if "enum" in schema:
        if value not in schema["enum"]:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"{where}: invalid value {value!r}, expected one of "
                                                   f"{schema['enum']}")
    elif kind == "object":
        if not isinstance(value, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"{where}: expected an object, got {value!r}")
        props = schema.get("properties")
        if props is None:  # free-form (pipeline_spec, parameters, tags)
            return
        for key, item in value.items():
            if key not in props:
                raise ApiError(HTTPStatus.BAD_REQUEST, f'{where}: unknown field "{key}"')
            check_schema(item, props[key], f"{where}.{key}")
    elif kind == "array":
        if not isinstance(value, list):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"{where}: expected an array")
        for i, item in enumerate(value):
            check_schema(item, schema.get("items", {}), f"{where}[{i}]")
    elif kind == "string":
        int64 = schema.get("format") in ("int64", "uint64")
        if not isinstance(value, str) and not (int64 and isinstance(value, int) and not isinstance(value, bool)):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"{where}: expected a string, got {value!r}")
        if int64 and isinstance(value, str) and not re.fullmatch(r"-?\d+", value):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"{where}: expected an int64, got {value!r}")
    elif kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"{where}: expected an integer, got {value!r}")
    elif kind == "boolean" and not isinstance(value, bool):
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{where}: expected a boolean, got {value!r}")


def _operation(method: str, path: str) -> tuple[dict, dict[str, str]]:
    """The swagger operation for ``method path`` and its path parameters."""
    for template, ops in SWAGGER["paths"].items():
        names = re.findall(r"{([^}]+)}", template)
        pattern = re.sub(r"{[^}]+}", "([^/:]+)", re.escape(template).replace(r"\{", "{").replace(r"\}", "}"))
        m = re.fullmatch(pattern, path)
        if m and method.lower() in ops:
            return ops[method.lower()], dict(zip(names, m.groups()))
    raise ApiError(HTTPStatus.NOT_FOUND, f"no route for {method} {path}")


def _matches(obj: dict, predicate: dict) -> bool:
    op = predicate.get("operation")
    op = OPERATIONS.get(op, op)
    key = predicate.get("key")
    if key not in obj:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid input error: filter key {key!r} is not a field of the "
                                               f"resource")
    actual = obj.get(key)
    scalar = next((predicate[k] for k in ("string_value", "stringValue", "int_value", "intValue", "long_value",
                                          "longValue") if k in predicate), None)
    values = next((predicate[k]["values"] for k in ("string_values", "stringValues", "int_values", "intValues")
                   if k in predicate), None)
    if op == "EQUALS":
        return actual == scalar
    if op == "NOT_EQUALS":
        return actual != scalar
    if op == "IN":
        return actual in (values or [])
    if op == "IS_SUBSTRING":
        return isinstance(actual, str) and str(scalar) in actual
    raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid input error: filter operation {op!r} is not supported here")


def _filtered(items: list[dict], query: dict[str, str], plural: str) -> dict:
    if "filter" in query:
        try:
            spec = json.loads(query["filter"])
        except ValueError:
            raise ApiError(HTTPStatus.BAD_REQUEST, "Invalid input error: filter is not valid JSON") from None
        check_schema(_snake(spec), {"$ref": "#/definitions/v2beta1Filter"}, "filter")
        items = [o for o in items if all(_matches(o, p) for p in spec.get("predicates", []))]
    sort = query.get("sort_by", "created_at")
    key, _, order = sort.partition(" ")
    items = sorted(items, key=lambda o: str(o.get(key, "")), reverse=order == "desc")
    start = int(query.get("page_token") or 0)
    size = int(query.get("page_size") or 20)
    page = items[start:start + size]
    out: dict[str, Any] = {"total_size": len(items)}
    if page:
        out[plural] = page
    if start + size < len(items):
        out["next_page_token"] = str(start + size)
    return out


def _snake(filter_spec: Any) -> Any:
    """Proto JSON accepts camelCase field names and integer enums; normalise to the swagger's names."""
    if isinstance(filter_spec, dict):
        return {re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), k):
                (OPERATIONS.get(v, v) if k == "operation" else _snake(v)) for k, v in filter_spec.items()}
    if isinstance(filter_spec, list):
        return [_snake(v) for v in filter_spec]
    return filter_spec


def _replace_namespace(query: dict[str, str], body: Any) -> tuple[dict[str, str], Any]:
    """Single-user mode (``resource_manager.go`` ``ReplaceNamespace``): a request's namespace becomes the empty one."""
    query = {k: v for k, v in query.items() if k != "namespace"}
    return query, ({**body, "namespace": ""} if isinstance(body, dict) and "namespace" in body else body)


class KfpApiServer:
    """``with KfpApiServer(token="t") as kfp: kfp.Client(host=kfp.url, existing_token="t")``."""

    def __init__(self, *, token: str | None = None, multi_user: Any = None):
        self.token = token
        """Standalone mode: the bearer token an auth proxy in front of KFP would demand; None: no auth."""
        self.multi_user = multi_user
        """``cluster.kfp_multiuser.MultiUser``: KFP's multi-user mode (identity, SubjectAccessReview, namespaces)."""
        self.store = Store()
        self.requests: list[Request] = []
        self.state_scripts: dict[str, list[str]] = {}
        self.default_state_script: list[str] = []
        self.injected: list[HTTPStatus] = []
        self.on_run_created: Any = None
        """``callable(run)`` called for each new run: a test plays what the pipeline does in the cluster, or
        tests/cluster/kfp_executor.py executes it."""
        self.on_run_terminated: Any = None
        """``callable(run_id)`` called by ``TerminateRun`` after the run turned ``CANCELING``."""
        self.lock = threading.RLock()
        self._http = Loopback(self._handler())

    @property
    def url(self) -> str:
        return self._http.url

    def __enter__(self) -> KfpApiServer:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._http.__exit__()

    # -- test controls -------------------------------------------------------------------------------------------
    def set_run_state(self, run_id: str, state: str) -> None:
        """Move a run to ``state`` (as the Argo workflow behind it would)."""
        check_schema(state, {"$ref": "#/definitions/v2beta1RuntimeState"}, "state")
        with self.lock:
            run = self.store.runs[run_id]
            run["state"] = state
            run["state_history"].append({"update_time": _now(), "state": state})
            if state in FINAL_STATES:
                run["finished_at"] = _now()

    def script_states(self, states: list[str], run_id: str | None = None) -> None:
        """Each GET of the run (of every new run when ``run_id`` is None) first advances it to the next state."""
        with self.lock:
            if run_id is None:
                self.default_state_script = list(states)
            else:
                self.state_scripts[run_id] = list(states)

    def answer_next(self, status: HTTPStatus, count: int = 1) -> None:
        """The next ``count`` API requests (health checks aside) are answered ``status`` without reaching the API,
        as Istio's ingress gateway answers while KFP's API server restarts (502 "upstream connect error")."""
        with self.lock:
            self.injected.extend([status] * count)

    # -- handlers ------------------------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
               body: bytes) -> tuple[HTTPStatus, dict]:
        with self.lock:
            self.requests.append(Request(method, path, query, headers, body))
        if path == f"{API}/healthz":
            return HTTPStatus.OK, {"multi_user": self.multi_user is not None, "pipeline_store": "database"}
        with self.lock:
            injected = self.injected.pop(0) if self.injected else None
        if injected is not None:
            raise ApiError(injected, "upstream connect error or disconnect/reset before headers. reset reason: "
                                     "connection termination")
        if self.multi_user is None and self.token is not None \
                and headers.get("authorization") != f"Bearer {self.token}":
            raise ApiError(HTTPStatus.UNAUTHORIZED, "Failed to authenticate: missing or invalid bearer token")
        op, path_params = _operation(method, path)
        declared = {p["name"]: p for p in op.get("parameters", [])}
        for name in query:
            if name not in declared or declared[name]["in"] != "query":
                raise ApiError(HTTPStatus.BAD_REQUEST, f"unknown query parameter {name!r} for {op['operationId']}")
        payload = None
        body_param = next((p for p in declared.values() if p["in"] == "body"), None)
        if body_param is not None:
            try:
                payload = json.loads(body or b"null")
            except ValueError:
                raise ApiError(HTTPStatus.BAD_REQUEST, "request body is not valid JSON") from None
            check_schema(payload, body_param["schema"], body_param["name"])
        with self.lock:
            if self.multi_user is None:
                query, payload = _replace_namespace(query, payload)
            else:
                self.multi_user.authorize(self, op["operationId"], path_params, query, payload, headers)
            return getattr(self, f"_{op['operationId']}")(path_params=path_params, query=query, body=payload,
                                                          headers=headers, raw=body)

    def _upload_file(self, headers: dict[str, str], raw: bytes) -> dict:
        ctype = headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            raise ApiError(HTTPStatus.BAD_REQUEST, "Failed to read pipeline from file: expected multipart/form-data")
        msg = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {ctype}\r\n\r\n".encode() + raw)
        parts = {p.get_param("name", header="content-disposition"): p for p in msg.iter_parts()}
        if "uploadfile" not in parts:
            raise ApiError(HTTPStatus.BAD_REQUEST, "Failed to read pipeline from file: no uploadfile in the form")
        try:
            spec, *platform = yaml.safe_load_all(parts["uploadfile"].get_payload(decode=True))
        except yaml.YAMLError as err:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid input error: the file is not YAML ({err})") from None
        if not isinstance(spec, dict) or "pipelineInfo" not in spec or "root" not in spec:
            raise ApiError(HTTPStatus.BAD_REQUEST, "Invalid input error: the file is not a KFP v2 pipeline spec")
        return {"pipeline_spec": spec, "platform_spec": platform[0]} if platform else spec

    def _name_taken(self, items: dict[str, dict], name: str, **scope: str) -> bool:
        return any(o["name"] == name and all(o.get(k) == v for k, v in scope.items()) for o in items.values())

    def _UploadPipeline(self, *, query, headers, raw, **_):
        spec = self._upload_file(headers, raw)
        name = query.get("name") or query.get("display_name") or spec["pipelineInfo"]["name"]
        namespace = query.get("namespace", "")
        if self._name_taken(self.store.pipelines, name, namespace=namespace):
            raise ApiError(HTTPStatus.CONFLICT, f"Already exist error: Failed to create a pipeline and a pipeline "
                                                f"version. The pipeline already exists.: Pipeline {name} already "
                                                f"exists")
        pipeline = {"pipeline_id": str(uuid.uuid4()), "name": name, "display_name": query.get("display_name", name),
                    "description": query.get("description", ""), "created_at": _now(), "namespace": namespace}
        self.store.pipelines[pipeline["pipeline_id"]] = pipeline
        self._add_version(pipeline["pipeline_id"], name, query, spec)
        return HTTPStatus.OK, pipeline

    def _UploadPipelineVersion(self, *, query, headers, raw, **_):
        spec = self._upload_file(headers, raw)
        pipeline_id = query.get("pipelineid", "")
        if pipeline_id not in self.store.pipelines:
            raise ApiError(HTTPStatus.NOT_FOUND if pipeline_id else HTTPStatus.BAD_REQUEST,
                           f"Failed to create a pipeline version: pipeline {pipeline_id!r} not found")
        name = query.get("name") or query.get("display_name")
        if not name:
            raise ApiError(HTTPStatus.BAD_REQUEST, "Invalid input error: pipeline version name is empty")
        if self._name_taken(self.store.versions, name, pipeline_id=pipeline_id):
            raise ApiError(HTTPStatus.CONFLICT, f"Already exist error: Failed to create a pipeline version: "
                                                f"version {name} of pipeline {pipeline_id} already exists")
        return HTTPStatus.OK, self._add_version(pipeline_id, name, query, spec)

    def _add_version(self, pipeline_id: str, name: str, query: dict, spec: dict) -> dict:
        version = {"pipeline_id": pipeline_id, "pipeline_version_id": str(uuid.uuid4()), "name": name,
                   "display_name": query.get("display_name", name), "description": query.get("description", ""),
                   "created_at": _now(), "code_source_url": query.get("code_source_url", ""), "pipeline_spec": spec}
        if "tags" in query:
            version["tags"] = json.loads(query["tags"])
        self.store.versions[version["pipeline_version_id"]] = version
        return version

    def _PipelineService_ListPipelines(self, *, query, **_):
        items = [p for p in self.store.pipelines.values() if p["namespace"] == query.get("namespace", "")]
        return HTTPStatus.OK, _filtered(items, query, "pipelines")

    def _pipeline(self, pipeline_id: str) -> dict:
        if pipeline_id not in self.store.pipelines:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Pipeline {pipeline_id} not found")
        return self.store.pipelines[pipeline_id]

    def _PipelineService_GetPipeline(self, *, path_params, **_):
        return HTTPStatus.OK, self._pipeline(path_params["pipeline_id"])

    def _PipelineService_ListPipelineVersions(self, *, path_params, query, **_):
        self._pipeline(path_params["pipeline_id"])
        items = [v for v in self.store.versions.values() if v["pipeline_id"] == path_params["pipeline_id"]]
        return HTTPStatus.OK, _filtered(items, query, "pipeline_versions")

    def _version(self, pipeline_id: str, version_id: str) -> dict:
        version = self.store.versions.get(version_id)
        if version is None or version["pipeline_id"] != pipeline_id:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Pipeline version {version_id} of pipeline {pipeline_id} not found")
        return version

    def _PipelineService_GetPipelineVersion(self, *, path_params, **_):
        return HTTPStatus.OK, self._version(path_params["pipeline_id"], path_params["pipeline_version_id"])

    def _PipelineService_DeletePipelineVersion(self, *, path_params, **_):
        version = self._version(path_params["pipeline_id"], path_params["pipeline_version_id"])
        del self.store.versions[version["pipeline_version_id"]]
        return HTTPStatus.OK, {}

    def _ExperimentService_CreateExperiment(self, *, body, **_):
        name = body.get("display_name", "")
        if not name:
            raise ApiError(HTTPStatus.BAD_REQUEST, "Invalid input error: Experiment name is empty")
        namespace = body.get("namespace", "")
        if any(e["display_name"] == name and e["namespace"] == namespace for e in self.store.experiments.values()):
            raise ApiError(HTTPStatus.CONFLICT, f"Already exist error: Experiment {name} already exists")
        exp = {**body, "experiment_id": str(uuid.uuid4()), "created_at": _now(), "namespace": namespace,
               "storage_state": "AVAILABLE"}
        self.store.experiments[exp["experiment_id"]] = exp
        return HTTPStatus.OK, exp

    def _experiment(self, experiment_id: str) -> dict:
        if experiment_id not in self.store.experiments:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Experiment {experiment_id} not found")
        return self.store.experiments[experiment_id]

    def _ExperimentService_GetExperiment(self, *, path_params, **_):
        return HTTPStatus.OK, self._experiment(path_params["experiment_id"])

    def _ExperimentService_ListExperiments(self, *, query, **_):
        items = [e for e in self.store.experiments.values() if e["namespace"] == query.get("namespace", "")]
        return HTTPStatus.OK, _filtered(items, query, "experiments")

    def _reference(self, body: dict, what: str) -> None:
        """A run or recurring run must name an existing version (or carry an inline spec) and experiment."""
        if not body.get("display_name"):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid input error: {what} display_name is empty")
        ref = body.get("pipeline_version_reference")
        if ref is None and "pipeline_spec" not in body:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid input error: {what} has neither a pipeline version "
                                                   "reference nor a pipeline spec")
        if ref is not None:
            self._version(ref.get("pipeline_id", ""), ref.get("pipeline_version_id", ""))
        if body.get("experiment_id"):
            self._experiment(body["experiment_id"])
        stored = body.get("pipeline_spec") or self.store.versions[ref["pipeline_version_id"]]["pipeline_spec"]
        spec, _ = split_spec(stored)
        try:
            validate_job_inputs(spec, (body.get("runtime_config") or {}).get("parameters"))
        except ValueError as err:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid input error: {err}") from None

    def _RunService_CreateRun(self, *, body, headers, **_):
        self._reference(body, "run")
        return HTTPStatus.OK, self.add_run(body, created_by=self._caller(headers))

    def _caller(self, headers: dict[str, str]) -> str | None:
        """Who calls, as multi-user mode's authenticators resolve it; None standalone."""
        return None if self.multi_user is None else self.multi_user.identity(headers).name

    def add_run(self, body: dict, *, created_by: str | None = None) -> dict:
        """Store a new ``PENDING`` run of ``body`` (a checked request, or a recurring run's fire), recording its
        creator when known."""
        run = {**body, "run_id": str(uuid.uuid4()), "created_at": _now(), "scheduled_at": _now(),
               "state": "PENDING", "storage_state": "AVAILABLE",
               "state_history": [{"update_time": _now(), "state": "PENDING"}]}
        self.store.runs[run["run_id"]] = run
        if created_by is not None:
            self.store.created_by[run["run_id"]] = created_by
        if self.default_state_script:
            self.state_scripts[run["run_id"]] = list(self.default_state_script)
        if self.on_run_created is not None:
            self.on_run_created(run)
        return run

    def _RunService_TerminateRun(self, *, path_params, **_):
        """``resource_manager.go`` TerminateRun: a run not yet final turns ``CANCELING``; its pods are stopped."""
        run_id = path_params["run_id"]
        if run_id not in self.store.runs:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Run {run_id} not found")
        if self.store.runs[run_id]["state"] not in FINAL_STATES:
            self.set_run_state(run_id, "CANCELING")
            if self.on_run_terminated is not None:
                self.on_run_terminated(run_id)
        return HTTPStatus.OK, {}

    def _RunService_GetRun(self, *, path_params, **_):
        run_id = path_params["run_id"]
        if run_id not in self.store.runs:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Run {run_id} not found")
        if self.state_scripts.get(run_id):
            self.set_run_state(run_id, self.state_scripts[run_id].pop(0))
        return HTTPStatus.OK, self.store.runs[run_id]

    def _RunService_ListRuns(self, *, query, **_):
        items = [r for r in self.store.runs.values()
                 if not query.get("experiment_id") or r.get("experiment_id") == query["experiment_id"]]
        return HTTPStatus.OK, _filtered(items, query, "runs")

    def _RecurringRunService_CreateRecurringRun(self, *, body, headers, **_):
        self._reference(body, "recurring run")
        cron = ((body.get("trigger") or {}).get("cron_schedule") or {}).get("cron")
        if cron is not None and len(cron.split()) != 6:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid input error: invalid cron expression {cron!r}: "
                                                   "expected 6 fields (seconds first)")
        rec = {**body, "recurring_run_id": str(uuid.uuid4()), "created_at": _now(), "updated_at": _now(),
               "status": "ENABLED" if body.get("mode", "ENABLE") == "ENABLE" else "DISABLED"}
        self.store.recurring_runs[rec["recurring_run_id"]] = rec
        if (caller := self._caller(headers)) is not None:
            self.store.created_by[rec["recurring_run_id"]] = caller
        return HTTPStatus.OK, rec

    def _recurring(self, recurring_run_id: str) -> dict:
        if recurring_run_id not in self.store.recurring_runs:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Recurring run {recurring_run_id} not found")
        return self.store.recurring_runs[recurring_run_id]

    def _RecurringRunService_GetRecurringRun(self, *, path_params, **_):
        return HTTPStatus.OK, self._recurring(path_params["recurring_run_id"])

    def _RecurringRunService_ListRecurringRuns(self, *, query, **_):
        items = [r for r in self.store.recurring_runs.values()
                 if not query.get("experiment_id") or r.get("experiment_id") == query["experiment_id"]]
        return HTTPStatus.OK, _filtered(items, query, "recurringRuns")

    def _set_mode(self, recurring_run_id: str, mode: str) -> tuple[HTTPStatus, dict]:
        rec = self._recurring(recurring_run_id)
        rec.update(mode=mode, status="ENABLED" if mode == "ENABLE" else "DISABLED", updated_at=_now())
        return HTTPStatus.OK, {}

    def _RecurringRunService_EnableRecurringRun(self, *, path_params, **_):
        return self._set_mode(path_params["recurring_run_id"], "ENABLE")

    def _RecurringRunService_DisableRecurringRun(self, *, path_params, **_):
        return self._set_mode(path_params["recurring_run_id"], "DISABLE")

    def _RecurringRunService_DeleteRecurringRun(self, *, path_params, **_):
        self._recurring(path_params["recurring_run_id"])
        del self.store.recurring_runs[path_params["recurring_run_id"]]
        return HTTPStatus.OK, {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") and name[1:2].isupper():  # a swagger operation this server does not serve
            def unsupported(**_: Any) -> tuple[HTTPStatus, dict]:
                raise ApiError(HTTPStatus.NOT_IMPLEMENTED, f"{name[1:]} is not served by the test server")
            return unsupported
        raise AttributeError(name)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    status, payload = server.handle(self.command, url.path, query, headers, body)
                except ApiError as err:
                    status = err.status
                    payload = {"error": str(err), "code": GRPC.get(err.status, 2), "message": str(err),
                               "details": []}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
